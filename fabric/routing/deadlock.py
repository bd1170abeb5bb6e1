"""Deadlock freedom under priority flow control: no cyclic buffer dependency in the compiled tables,
healthy and under every single failure (pure).

With PFC a switch's ingress queue (switch, ingress port, lossless priority) that fills pauses the
transmitter upstream; packets held there wait for the egress port they go out of, which may itself
be paused by the next switch's ingress queue. So a packet that goes from ingress queue A of one
switch into ingress queue B of the next makes A depend on B (A cannot drain while B pauses it). A
cycle of such dependencies can hold every queue on it paused forever: a PFC deadlock. Valley-free
(up-down) routing has none; fast-failover detours, which bounce packets down and up again, can close
one (Tagger, Hu et al., SIGCOMM 2017). Tagger's remedy: a bounced packet moves to another lossless
priority, so its dependencies form a graph of their own.

What is proved, per state of the tables: the dependency graph built from the packets the tables
forward -- every entropy branch of UDP packets between every pair of leaves of each plane (one live
host port per leaf stands for its hosts: hosts under one leaf differ only in the port they start
from, a queue nothing upstream of it depends on, and in the last hop, to a host, which never
pauses) -- has no cycle. A dependency's priority is the lossless priority the packet is in on that
link: with a bounce priority (``bounce=True``), packets carrying the detours' marks (``compiler``:
``BOUNCE_MAC``, ``DEEP_MAC``) are in priority 1, everything else in priority 0.

States: healthy; and for each single link and switch failure F, the union of the healthy tables (what
is in flight when F happens), the healthy tables with F (local protection: the fast-failover groups
detour before the controller knows) and the tables compiled for F (converged). A cycle in the union
is reported with the packet walks that made it. Exhaustive over every failure on fabrics of up to
``EXHAUSTIVE_LINKS`` links; beyond, one failure per symmetry class (``proofs.failure_classes``), which
the detour buckets' port order makes a strong hint rather than a proof (said in the result).

    proof = prove(g)                   # DeadlockProof: .ok, .states, .cycles, .seconds
    proof = prove(g, bounce=True)      # with bounced detours in a lossless priority of their own
    needs_bounce_priority(g)           # True when a cycle exists without that priority (cached per graph)
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import networkx as nx

from hpnlab.fabric.routing import compiler, proofs
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph as fgraph

#: fabrics with at most this many links are proved over every single failure
EXHAUSTIVE_LINKS = 2_000
#: the most pair walks (representative pairs x table states, :func:`work`) a proof takes on by default:
#: every preset one machine can emulate is far below (mini-hpn: 2,904; small-hpn, too large to emulate: 34,160)
MAX_WORK = 50_000
#: the Ethernet sources of detoured packets (the compiler's marks)
MARKS = frozenset({compiler.BOUNCE_MAC, compiler.DEEP_MAC})

Queue = tuple[str, int, int]            # (switch, ingress port, lossless priority)


@dataclass
class StateProof:
    """One state: healthy, or a failure (its three table states together)."""
    name: str
    edges: int
    walks: int
    cycle: list[Queue] = field(default_factory=list)      # one cycle found (empty: none)
    witness: list[str] = field(default_factory=list)      # walks that make its edges

    @property
    def ok(self) -> bool:
        return not self.cycle


@dataclass
class DeadlockProof:
    bounce: bool
    exhaustive: bool
    states: list[StateProof]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.states)

    @property
    def cycles(self) -> list[StateProof]:
        return [s for s in self.states if not s.ok]


def priority_of(mark: str | None, bounce: bool) -> int:
    return 1 if bounce and mark in MARKS else 0


def marks_along(net: FabricTables, pkt: dict, hops: list[tuple]) -> list[str | None]:
    """The Ethernet source a walked packet arrives with at each hop (the marks are set by the switches'
    set-fields, in tables or group buckets)."""
    out: list[str | None] = []
    p = dict(pkt)
    for sw, in_port, _out in hops:
        out.append(p.get("eth_src"))
        _port, changes = net._pipeline(sw, dict(p, in_port=in_port))
        if changes:
            p = dict(p, **dict(changes))
    return out


def representatives(net: FabricTables, plane: int) -> list[tuple[str, int]]:
    """(host, rail) of one live host port per leaf of ``plane``."""
    seen: dict[str, tuple[str, int]] = {}
    for h in fgraph.hosts(net.g):
        for p in fgraph.host_ports(net.g, h):
            if p["plane"] == plane and p["leaf"] not in seen and net.live(h, plane, p["rail"]):
                seen[p["leaf"]] = (h, p["rail"])
    return list(seen.values())


def dependencies(net: FabricTables, bounce: bool, edges: dict[tuple[Queue, Queue], str] | None = None
                 ) -> tuple[dict[tuple[Queue, Queue], str], int]:
    """The buffer dependencies of every entropy branch between representative host ports of every plane
    (module docstring): {(queue, queue it waits for): a walk that makes it}, and the walks taken."""
    edges = {} if edges is None else edges
    walks = 0
    planes = sorted({p["plane"] for h in fgraph.hosts(net.g) for p in fgraph.host_ports(net.g, h)})
    for plane in planes:
        reps = representatives(net, plane)
        for src, src_rail in reps:
            for dst, dst_rail in reps:
                if dst == src:
                    continue
                for sport, _fixed, walk in net.send_branches(src, dst, plane, src_rail=src_rail, dst_rail=dst_rail):
                    walks += 1
                    if len(walk.hops) < 2:
                        continue
                    _intf, pkt = net.packet(src, dst, plane, src_rail=src_rail, dst_rail=dst_rail, sport=sport)
                    marks = marks_along(net, pkt, walk.hops)
                    queues = [(sw, inp, priority_of(m, bounce)) for (sw, inp, _o), m in zip(walk.hops, marks,
                                                                                             strict=True)]
                    bounced = " (bounced)" if any(m in MARKS for m in marks) else ""
                    for a, b in itertools.pairwise(queues):
                        edges.setdefault((a, b), f"{src}->{dst} plane {plane} sport {sport:#x}{bounced}: "
                                                 + " ".join(f"{sw}:{i}" for sw, i, _ in walk.hops))
    return edges, walks


def _find_cycle(edges: dict[tuple[Queue, Queue], str]) -> list[Queue]:
    g = nx.DiGraph(list(edges))
    try:
        cyc = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return []
    return [u for u, _v in cyc]


def _state(name: str, edges: dict[tuple[Queue, Queue], str], walks: int) -> StateProof:
    cyc = _find_cycle(edges)
    witness = []
    if cyc:
        for a, b in zip(cyc, cyc[1:] + cyc[:1], strict=True):
            witness.append(edges.get((a, b), ""))
    return StateProof(name, len(edges), walks, cyc, witness)


def failures_to_prove(g: nx.MultiGraph, exhaustive: bool | None = None) -> tuple[list[proofs.Failure], bool]:
    """Every single link and switch failure (exhaustive), or one per symmetry class."""
    lids = proofs.all_links(g)
    if exhaustive is None:
        exhaustive = len(lids) <= EXHAUSTIVE_LINKS
    if exhaustive:
        out = [proofs.link_failure(g, lid) for lid in lids]
        out += [proofs.switch_failure(n) for n in fgraph.switches(g)]
        return out, True
    return [c.representative for c in proofs.failure_classes(g, keep_members=False)], False


def work(g: nx.MultiGraph) -> int:
    """The pair walks a proof takes (each walks every entropy branch of one representative pair): per
    plane the representatives squared, times the table states (healthy, and two per failure)."""
    leaves: dict[int, set[str]] = {}
    for h in fgraph.hosts(g):
        for p in fgraph.host_ports(g, h):
            leaves.setdefault(p["plane"], set()).add(p["leaf"])
    pairs = sum(len(v) * (len(v) - 1) for v in leaves.values())
    failures, _ = failures_to_prove(g)
    return pairs * (1 + 2 * len(failures))


def prove(g: nx.MultiGraph, *, bounce: bool = False, exhaustive: bool | None = None,
          failures: Iterable[proofs.Failure] | None = None,
          compile_states: Callable[[compiler.Failures | None], dict] | None = None) -> DeadlockProof:
    """The proof (module docstring). ``failures``: these instead of every single one;
    ``compile_states(failures or None)``: the compiler (default ``compiler.compile_fabric``)."""
    t0 = time.perf_counter()
    compile_states = compile_states or (lambda fl: compiler.compile_fabric(g, fl) if fl else compiler.compile_fabric(g))
    healthy_states = compile_states(None)
    net = FabricTables(g, healthy_states)
    healthy, walks = dependencies(net, bounce)
    out = [_state("healthy", healthy, walks)]
    if failures is None:
        todo, exhaustive = failures_to_prove(g, exhaustive)
    else:
        todo, exhaustive = list(failures), bool(exhaustive)
    for f in todo:
        edges = dict(healthy)
        net.reload(healthy_states, f.failures)              # local protection: healthy tables, F live
        _, w1 = dependencies(net, bounce, edges)
        net.reload(compile_states(f.failures), f.failures)  # converged
        _, w2 = dependencies(net, bounce, edges)
        out.append(_state(f.name, edges, w1 + w2))
    return DeadlockProof(bounce, exhaustive, out, time.perf_counter() - t0)


def needs_bounce_priority(g: nx.MultiGraph) -> bool:
    """Does any state have a cyclic buffer dependency with one lossless priority? (cached on the graph)"""
    cache = g.graph.setdefault("_deadlock", {})
    if "needs_bounce" not in cache:
        cache["needs_bounce"] = not prove(g, bounce=False).ok
    return bool(cache["needs_bounce"])


def summary(proof: DeadlockProof) -> str:
    bad = proof.cycles
    how = "every single failure" if proof.exhaustive else "one failure per symmetry class"
    prio = "bounced detours in a priority of their own" if proof.bounce else "one lossless priority"
    if not bad:
        return f"no cyclic buffer dependency, healthy and {how} ({prio}; {proof.seconds:.1f} s)"
    first = bad[0]
    loop = " -> ".join(f"{sw}:{port}/p{prio_}" for sw, port, prio_ in first.cycle)
    return (f"{len(bad)} of {len(proof.states)} states have a cyclic buffer dependency ({prio}); "
            f"e.g. {first.name}: {loop}")
