"""The flow model against the compiled tables, shared by the model's tests: the model's paths compared with
the table interpreter's walks (``compare``) over one host pair per ordered leaf pair (``leaf_pairs``) and one
source port per entropy pattern (``every_pattern``); and the case of weighted switches beside a half-rate
uplink (``half_rate_uplink``, ``permutation_step``)."""
from __future__ import annotations

from hpnlab.fabric.model import flow as model
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph

PRESETS = ["mini-hpn", "mini-spine-leaf", "mini-rail", "mini-cross-campus", "fat-tree-4"]


def fabric_links(g) -> list[tuple[str, str, int]]:
    return [(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] != "host"]


def leaf_pairs(g) -> list[tuple]:
    """(src host, dst host, plane, src leaf, dst leaf, src rail, dst rail): one host pair per
    ordered leaf pair of each plane (a leaf to itself too), on different hosts. Routes are per
    destination leaf, so every other host pair under the same two leaves matches the same
    routes; the healthy test walks every host pair."""
    ports: dict[str, list[tuple[str, int, int]]] = {}
    for h in graph.hosts(g):
        for p in graph.host_ports(g, h):
            ports.setdefault(p["leaf"], []).append((h, p["plane"], p["rail"]))
    out = []
    for a, pa in ports.items():
        for b, pb in ports.items():
            x = pa[0]
            y = next((y for y in pb if y[0] != x[0]), None)
            if y is not None and x[1] == y[1]:
                out.append((x[0], y[0], x[1], a, b, x[2], y[2]))
    return out


def compare(g, failed: set, pairs, sports: list[int], converged: bool = True) -> int:
    """How many (pair, source port) walks the model's paths equal the interpreter's for (an
    assertion fails on the first that differs). ``converged=False``: the detour phase, the
    HEALTHY tables with the failed links dead (their fast-failover groups and bounced detours)."""
    failures = compiler.Failures.of(failed)
    tables = FabricTables(g, compiler.compile_fabric(g, failures if converged else None), failures)
    net = model.Network(g, failed)
    fwd = model.Forwarding(g, net.port_link, net.fwd.head, failed, sports=sports, converged=converged)
    checked = 0
    for src, dst, plane, sleaf, dleaf, srail, drail in pairs:
        for sport in sports:
            walk = tables.send(src, dst, plane, sport=sport, src_rail=srail, dst_rail=drail)
            path = fwd.leaf_path(sleaf, dleaf, sport)
            if walk.result != "delivered":
                assert path is None, (failed, src, dst, plane, sport, walk.where, path)
            else:
                # the interpreter's hops: (switch, in port, out port); all but the last leave a switch
                links = [net.link_at(sw, out) for sw, _in, out in walk.hops[:-1]]
                assert path == links, (failed, src, dst, plane, sport, walk.hops, path)
            checked += 1
    return checked


def every_pattern(g) -> list[int]:
    """One source port per bit pattern of every switch's entropy table (the interpreter's)."""
    tables = FabricTables(g, compiler.compile_fabric(g))
    return tables.entropy_ports()


def permutation_step(g, net):
    """A permutation of mini-hpn's 16 ranks (random placement) in which p0l0's two senders across
    leaves use source-port patterns that the weighted sets re-deal: with 16 ranks few patterns are
    in use, and which ones (the ranks' high bits, ``routing.entropy.first_high``) decides whether
    a re-dealt pattern carries any of them (seed 1's do; seeds 2 and 4, for instance, do not)."""
    job = model.make_job(g, None, "random", 1)
    (step,) = model.steps("permutation", job, 1 << 20, max_steps=1, seed=1, rails=g.graph["scenario"].rails)
    return job, step


def half_rate_uplink(g, leaf: str, spine: str) -> None:
    for u, v, _k, d in g.edges(leaf, keys=True, data=True):
        if {u, v} == {leaf, spine}:
            d["rate_gbps"] /= 2
