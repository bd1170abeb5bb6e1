"""What an emulation of a fabric costs on this machine, and whether it fits (pure: no root, no Mininet).

``hpnlab doctor`` and the emulation's preflight both ask this; neither needs the harness for it.
"""
from __future__ import annotations

from typing import Any

import networkx as nx

from . import graph as fgraph
from .errors import UserError

#: userspace OVS on 2 cores forwards about this many packets/s through the whole fabric
#: (environment note: iperf3 UDP through two switches); scaled with the CPU count.
PPS_PER_CORE = 21_500
#: Mininet nodes (hosts + switches) per core the emulation accepts.
NODES_PER_CORE = 64


def estimate(g: nx.MultiGraph, cpus: int) -> dict[str, Any]:
    """What an emulation of this graph costs here, and whether it fits."""
    scenario = g.graph["scenario"]
    hosts = len(fgraph.hosts(g))
    switches = len(fgraph.switches(g))
    links = g.number_of_edges()
    host_links = sum(1 for _, _, d in g.edges(data=True) if d["kind"] == "host")
    frame_bits = 8 * (scenario.emulation.mtu + 14)
    # every host port sending at its emulated rate; each packet crosses at least one switch
    pps_one_hop = host_links * scenario.emulation.host_mbps * 1e6 / frame_bits
    budget = PPS_PER_CORE * cpus
    nodes_max = NODES_PER_CORE * cpus
    return {"hosts": hosts, "switches": switches, "links": links, "host_ports": host_links,
            "interfaces": 2 * links, "nodes": hosts + switches, "nodes_max": nodes_max,
            "pps_full_load_per_hop": round(pps_one_hop), "pps_budget": budget,
            "fits": hosts + switches <= nodes_max and pps_one_hop <= budget}


def check_fits(g: nx.MultiGraph, cpus: int) -> dict[str, Any]:
    """The estimate, or a one-line UserError saying which limit the scenario passes and by how much."""
    est = estimate(g, cpus)
    name = g.graph["scenario"].name
    if est["nodes"] > est["nodes_max"]:
        raise UserError(
            f"scenario {name!r} is too large for this machine: {est['hosts']} hosts + "
            f"{est['switches']} switches = {est['nodes']} nodes, {est['links']} links; this {cpus}-core "
            f"machine takes at most {est['nodes_max']} nodes (pick a mini-/small- preset or fewer hosts)")
    if est["pps_full_load_per_hop"] > est["pps_budget"]:
        raise UserError(
            f"scenario {name!r} is too fast for this machine: {est['host_ports']} host "
            f"ports at {g.graph['scenario'].emulation.host_mbps:g} Mbit/s need "
            f"{est['pps_full_load_per_hop']} packets/s per switch hop, above the ~{est['pps_budget']} packets/s "
            f"userspace OVS forwards on {cpus} cores (lower emulation.host_mbps or raise emulation.mtu)")
    return est


def has_loops(g: nx.MultiGraph) -> bool:
    """Whether the switches form a cycle (parallel links count): standalone OVS would flood forever."""
    sw = g.subgraph(fgraph.switches(g))
    simple = nx.Graph(sw)
    parallel = any(len(d) > 1 for _, nbrs in sw.adj.items() for d in nbrs.values())
    return parallel or simple.number_of_edges() >= simple.number_of_nodes() - nx.number_connected_components(simple) + 1
