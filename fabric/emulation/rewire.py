"""Wiring the emulation differently from the scenario, on purpose (pure: graph in, graph out).

The controller is given the scenario; Mininet is given the *physical* graph made here, so tests
can show what the controller does with a fabric that is not cabled as planned, or whose switches
carry datapath ids and port numbers of their own (as real switches do):

``Rewire(swap=[(("p0l0", "p0s0"), ("p0l1", "p0s1"))])``
    the two cables are swapped at their second ends: p0l0's port to p0s0 now reaches p0s1's port
    that was p0l1's, and p0l1's port to p0s1 reaches p0s0's port that was p0l0's.
``Rewire(drop=[("p0l2", "p0s0")])``
    the cable is not there (both ports exist, with no carrier).
``Rewire(dpid_base=0xAB00000000000000, port_offset=100)``
    every switch gets datapath id ``dpid_base + its index in switch order`` and every switch port
    OpenFlow port ``port + port_offset`` (``ofport_request``); interface names stay those of the
    scenario's ports, so shaping, faults and the ECN stage find them. ``deployment`` gives the
    deployment file (controller/deployment.py) that maps the scenario onto those numbers.
``Rewire(..., port_names=True)``
    the deployment file gives every switch port by its NAME (Open vSwitch's port name is the
    interface name, ``p0l0-eth5``), as one would for real switches (``Ethernet12``, ``swp3``): the
    controller resolves the names against the switch's port descriptions when it connects.

``Emulation(scenario, EmulationOptions(rewire=Rewire(...)))`` builds Mininet from ``physical(graph, rewire)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from hpnlab.fabric.scenario.graph import intf_name

from ..errors import UserError


@dataclass(frozen=True)
class Rewire:
    swap: list[tuple[tuple[str, str], tuple[str, str]]] = field(default_factory=list)
    drop: list[tuple[str, str]] = field(default_factory=list)
    dpid_base: int | None = None
    port_offset: int = 0
    port_names: bool = False

    def __bool__(self) -> bool:
        return bool(self.swap or self.drop or self.dpid_base is not None or self.port_offset or self.port_names)

    @property
    def foreign(self) -> bool:
        """Does the controller need a deployment file for this fabric?"""
        return self.dpid_base is not None or bool(self.port_offset) or self.port_names


def _edge(g: nx.MultiGraph, u: str, v: str) -> tuple[str, str, int, dict]:
    if not g.has_edge(u, v):
        raise UserError(f"rewire: there is no cable {u}-{v} in the scenario")
    k = min(g[u][v])
    return u, v, k, g.edges[u, v, k]


def foreign_dpids(g: nx.MultiGraph, base: int) -> dict[str, int]:
    """Switch -> ``base`` + its index among the graph's switches (in node order)."""
    switches = [n for n, d in g.nodes(data=True) if d["tier"] > 0]
    return {sw: base + i for i, sw in enumerate(switches)}


def physical(g: nx.MultiGraph, rewire: Rewire) -> nx.MultiGraph:
    """The graph Mininet builds: ``g`` with cables swapped or dropped and, when asked, foreign datapath
    ids (node ``dpid``) and port numbers (edge ``ofports``: node -> OpenFlow port; ``ports`` keeps the
    scenario's numbers, which name the interfaces)."""
    out = g.copy()
    out.graph.pop("_controller_index", None)
    for (a, b), (c, d) in rewire.swap:
        _, _, k1, d1 = _edge(out, a, b)
        _, _, k2, d2 = _edge(out, c, d)
        out.remove_edge(a, b, k1)
        out.remove_edge(c, d, k2)
        out.add_edge(a, d, **dict(d1, ports={a: d1["ports"][a], d: d2["ports"][d]}))
        out.add_edge(c, b, **dict(d2, ports={c: d2["ports"][c], b: d1["ports"][b]}))
    for u, v in rewire.drop:
        _, _, k, _d = _edge(out, u, v)
        out.remove_edge(u, v, k)
    if rewire.dpid_base is not None:
        for sw, dpid in foreign_dpids(g, rewire.dpid_base).items():
            out.nodes[sw]["dpid"] = dpid
    if rewire.port_offset:
        for u, v, k, d in list(out.edges(keys=True, data=True)):
            ofports = {n: p + rewire.port_offset if out.nodes[n]["tier"] > 0 else p for n, p in d["ports"].items()}
            out.edges[u, v, k]["ofports"] = ofports
    return out


def deployment(g: nx.MultiGraph, rewire: Rewire) -> dict:
    """The deployment file's content (controller/deployment.py) for a rewire's foreign numbers:
    every switch's datapath id and, for every port it uses, scenario port -> OpenFlow port (or, with
    ``port_names``, the port's name on the switch)."""
    dpids = foreign_dpids(g, rewire.dpid_base) if rewire.dpid_base is not None else {}
    # a dropped cable's ports are not made at all (Mininet makes no interface without a link), so they
    # have no name to give: they are given by number (a real switch keeps the port of a pulled cable)
    unmade = {(n, _edge(g, u, v)[3]["ports"][n]) for u, v in rewire.drop for n in (u, v)}
    switches: dict[str, dict] = {}
    for n, d in g.nodes(data=True):
        if d["tier"] == 0:
            continue
        ports = sorted({e["ports"][n] for _u, _v, e in g.edges(n, data=True)})
        switches[n] = {"dpid": f"{dpids.get(n, d['dpid']):#018x}",
                       "ports": {p: intf_name(n, p) if rewire.port_names and (n, p) not in unmade
                                 else p + rewire.port_offset for p in ports}}
    return {"scenario": g.graph["scenario"].name, "switches": switches}
