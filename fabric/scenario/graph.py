"""Fabric graph builders: a Scenario becomes an annotated networkx MultiGraph.

Nodes
    hosts ``h1..hN``: role "host", tier 0, campus, pod, segment, index (0-based), accelerators,
    ports (NIC ports: rails x planes).
    switches: role ("leaf"/"spine"/"core" in an HPN, "edge"/"agg"/"core" in a fat-tree),
    tier (1, 2, 3), plane, campus, pod (None for cores), segment (leaves), index (per plane),
    dpid (int, unique), and for leaves ``prefix`` (the leaf's host prefix) and ``rails``.
    HPN switch names carry their plane: ``p0l3`` is leaf 3 of plane 0, ``p1s0`` spine 0 of
    plane 1, ``p0c1`` core 1 of plane 0. Fat-tree switches are ``e``, ``a`` and ``c``.
Edges (parallel links allowed; key = link number)
    kind ("host", "fabric", "core", "long-haul"), rate_gbps, delay_us, and
    ``ports = {node: port number}``: the switch port (1-based, OpenFlow) or the host
    interface number (0-based, ``hN-ethI``). Host links also carry plane, rail, ip, mac.
    Port numbers on a switch: down-facing ports first, then up-facing, in build order.
Graph attributes
    scenario, plan (AddressPlan).

Every number is deterministic: the same scenario always yields the same names, ports,
dpids, addresses and MACs.
"""
from __future__ import annotations

import gc
from collections.abc import Sequence

import networkx as nx

from hpnlab.fabric.scenario.addressing import AddressPlan, dpid, host_mac, ip_str, plan_for
from hpnlab.fabric.scenario.spec import Scenario, check_limits

TIER = {"host": 0, "leaf": 1, "edge": 1, "spine": 2, "agg": 2, "core": 3}


def build(scenario: Scenario, planes: Sequence[int] | None = None) -> nx.MultiGraph:
    """Build the fabric graph of a validated scenario.

    The scenario's size and identifier ranges are checked first (``spec.check_limits``), so
    a Scenario made in Python that would overflow a dpid, a MAC or the size limits is
    refused in one line before anything is built. ``planes``: only these planes' switches and
    links (every host, with its ports in those planes), each exactly as in the whole graph: the
    flow model builds one plane and copies it (``model.flow.cached_network``); default every plane.
    """
    check_limits(scenario)
    # The build creates millions of small dicts and no cycles: the cyclic garbage
    # collector would rescan them over and over (half the time at 130k scale).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if scenario.kind == "fat-tree":
            return _build_fat_tree(scenario)
        return _build_hpn(scenario, range(scenario.planes) if planes is None else planes)
    finally:
        if was_enabled:
            gc.enable()


def _new_graph(s: Scenario) -> tuple[nx.MultiGraph, AddressPlan]:
    plan = plan_for(s)
    g = nx.MultiGraph(name=s.name, scenario=s, plan=plan)
    return g, plan


def _add_hosts(g: nx.MultiGraph, s: Scenario) -> list[str]:
    names: list[str] = []
    per_pod = s.segments_per_pod * s.hosts_per_segment
    for idx in range(s.hosts):
        campus, rest = divmod(idx, s.pods * per_pod)
        pod, rest = divmod(rest, per_pod)
        segment = rest // s.hosts_per_segment
        name = f"h{idx + 1}"
        g.add_node(name, role="host", tier=0, campus=campus, pod=pod, segment=segment, index=idx,
                   accelerators=s.accelerators_per_host, ports=s.ports_per_host)
        names.append(name)
    return names


def _build_hpn(s: Scenario, planes: Sequence[int]) -> nx.MultiGraph:
    g, plan = _new_graph(s)
    hosts = _add_hosts(g, s)
    leaves_per_segment = s.leaves_per_plane_per_segment
    rails_per_leaf = s.rails_per_leaf
    spines_per_pod = s.spines_per_plane
    cores_per_campus = s.cores_per_plane
    leaf_spine_links = s.leaf_spine_links
    spine_core_links = s.spine_core_links
    leaf_down = s.leaf_down_ports
    edges: list[tuple[str, str, dict]] = []
    for plane in planes:
        cores: dict[tuple[int, int], str] = {}  # (campus, core in campus) -> name
        for campus in range(s.campuses):
            for core_in_campus in range(cores_per_campus):
                idx = campus * cores_per_campus + core_in_campus
                name = f"p{plane}c{idx}"
                g.add_node(name, role="core", tier=3, plane=plane, campus=campus, pod=None, index=idx,
                           dpid=dpid("core", plane, campus, idx),
                           deep_buffer=bool(s.long_haul and s.long_haul.deep_buffer))
                cores[campus, core_in_campus] = name
            for pod in range(s.pods):
                pod_global = campus * s.pods + pod
                spines = []
                for spine_in_pod in range(spines_per_pod):
                    idx = pod_global * spines_per_pod + spine_in_pod
                    name = f"p{plane}s{idx}"
                    g.add_node(name, role="spine", tier=2, plane=plane, campus=campus, pod=pod, index=idx,
                               dpid=dpid("spine", plane, campus, idx))
                    spines.append(name)
                    # spine -> core uplinks: after the spine's down ports
                    for core_in_campus in range(cores_per_campus):
                        core = cores[campus, core_in_campus]
                        for link in range(spine_core_links):
                            spine_port = (s.leaves_per_plane_per_pod * leaf_spine_links
                                          + core_in_campus * spine_core_links + link + 1)
                            core_port = (pod * spines_per_pod + spine_in_pod) * spine_core_links + link + 1
                            edges.append((name, core, {
                                "kind": "core", "rate_gbps": s.spine_core_rate_gbps, "delay_us": 0.0,
                                "ports": {name: spine_port, core: core_port}}))
                for segment in range(s.segments_per_pod):
                    for leaf_in_segment in range(leaves_per_segment):
                        leaf_in_pod = segment * leaves_per_segment + leaf_in_segment
                        idx = pod_global * s.leaves_per_plane_per_pod + leaf_in_pod
                        name = f"p{plane}l{idx}"
                        first_rail = leaf_in_segment * rails_per_leaf
                        g.add_node(name, role="leaf", tier=1, plane=plane, campus=campus, pod=pod,
                                   segment=segment, leaf=leaf_in_segment, index=idx,
                                   rails=tuple(range(first_rail, first_rail + rails_per_leaf)),
                                   dpid=dpid("leaf", plane, campus, idx),
                                   prefix=plan.leaf_prefix(plane, campus, pod, segment, leaf_in_segment))
                        # leaf -> spine uplinks
                        for spine_in_pod, spine in enumerate(spines):
                            for link in range(leaf_spine_links):
                                edges.append((name, spine, {
                                    "kind": "fabric", "rate_gbps": s.leaf_spine_rate_gbps, "delay_us": 0.0,
                                    "ports": {name: leaf_down + spine_in_pod * leaf_spine_links + link + 1,
                                              spine: leaf_in_pod * leaf_spine_links + link + 1}}))
                        # host ports on this leaf
                        first_host = (pod_global * s.segments_per_pod + segment) * s.hosts_per_segment
                        ip_base = plan.host_ip_int(plane, campus, pod, segment, leaf_in_segment, 0)
                        for host_in_segment in range(s.hosts_per_segment):
                            host_index = first_host + host_in_segment
                            # host_mac(host_index, intf), its host bytes formatted once per host
                            # (the 130k preset has half a million ports; a test checks they agree)
                            mac_host = host_mac(host_index, 0)[5:-2]
                            host = hosts[host_index]
                            for rail_on_leaf in range(rails_per_leaf):
                                rail = first_rail + rail_on_leaf
                                leaf_port = host_in_segment * rails_per_leaf + rail_on_leaf  # 0-based
                                intf = rail * s.planes + plane
                                edges.append((host, name, {
                                    "kind": "host", "rate_gbps": s.host_rate_gbps, "delay_us": 0.0,
                                    "plane": plane, "rail": rail,
                                    "ip": ip_str(ip_base + leaf_port),
                                    "mac": f"02:{intf >> 8:02x}{mac_host}{intf & 0xFF:02x}",
                                    "ports": {host: intf, name: leaf_port + 1}}))
        if s.long_haul:
            long_haul = s.long_haul
            down_ports = s.pods * spines_per_pod * spine_core_links  # a core's ports to its spines
            for near in range(s.campuses):
                for far in range(near + 1, s.campuses):
                    for core_in_campus in range(cores_per_campus):
                        near_core, far_core = cores[near, core_in_campus], cores[far, core_in_campus]
                        for link in range(long_haul.links):
                            # long-haul ports after the core's down ports, one block per far campus
                            # (numbered without the core's own campus)
                            near_port = down_ports + (far - 1) * long_haul.links + link + 1
                            far_port = down_ports + near * long_haul.links + link + 1
                            edges.append((near_core, far_core, {
                                "kind": "long-haul", "rate_gbps": long_haul.rate_gbps,
                                "delay_us": long_haul.delay_us, "distance_km": long_haul.distance_km,
                                "ports": {near_core: near_port, far_core: far_port}}))
    add_links(g, edges)
    return g


def _build_fat_tree(s: Scenario) -> nx.MultiGraph:
    g, plan = _new_graph(s)
    hosts = _add_hosts(g, s)
    half = s.k // 2
    edges: list[tuple[str, str, dict]] = []
    cores = []
    for idx in range(half * half):
        name = f"c{idx}"
        g.add_node(name, role="core", tier=3, plane=0, campus=0, pod=None, index=idx,
                   dpid=dpid("core", 0, 0, idx), deep_buffer=False)
        cores.append(name)
    for pod in range(s.k):
        aggs = []
        for agg_in_pod in range(half):
            idx = pod * half + agg_in_pod
            name = f"a{idx}"
            g.add_node(name, role="agg", tier=2, plane=0, campus=0, pod=pod, index=idx,
                       dpid=dpid("agg", 0, 0, idx))
            aggs.append(name)
            # aggregation switch i of every pod reaches cores i*k/2 .. (i+1)*k/2 - 1
            for uplink in range(half):
                core = cores[agg_in_pod * half + uplink]
                edges.append((name, core, {"kind": "core", "rate_gbps": s.spine_core_rate_gbps,
                                           "delay_us": 0.0, "ports": {name: half + uplink + 1, core: pod + 1}}))
        for edge_in_pod in range(half):
            idx = pod * half + edge_in_pod
            name = f"e{idx}"
            g.add_node(name, role="edge", tier=1, plane=0, campus=0, pod=pod, segment=edge_in_pod, leaf=0,
                       index=idx, rails=(0,), dpid=dpid("edge", 0, 0, idx),
                       prefix=plan.leaf_prefix(0, 0, pod, edge_in_pod, 0))
            for agg_in_pod, agg in enumerate(aggs):
                edges.append((name, agg, {"kind": "fabric", "rate_gbps": s.leaf_spine_rate_gbps, "delay_us": 0.0,
                                          "ports": {name: half + agg_in_pod + 1, agg: edge_in_pod + 1}}))
            for host_on_edge in range(half):
                host_index = idx * half + host_on_edge
                host = hosts[host_index]
                edges.append((host, name, {
                    "kind": "host", "rate_gbps": s.host_rate_gbps, "delay_us": 0.0, "plane": 0, "rail": 0,
                    "ip": plan.host_ip(0, 0, pod, edge_in_pod, 0, host_on_edge), "mac": host_mac(host_index, 0),
                    "ports": {host: 0, name: host_on_edge + 1}}))
    add_links(g, edges)
    return g


def add_links(g: nx.MultiGraph, edges: list[tuple[str, str, dict]]) -> None:
    """Add links (u, v, attributes) as parallel edges keyed 0, 1, ... per node pair.

    Same result as ``g.add_edges_from(edges)`` (a test checks this), written against the
    MultiGraph adjacency directly because the public method costs ~10 s for the million
    links of the 130k preset. Both endpoints must already be nodes.
    """
    adj = g._adj
    for u, v, data in edges:
        keydict = adj[u].get(v)
        if keydict is None:
            keydict = {}
            adj[u][v] = keydict
            adj[v][u] = keydict
        keydict[len(keydict)] = data


# ---- small queries used across the project -----------------------------------

def intf_name(node: str, port: int) -> str:
    """The Linux name of a node's interface: ``hN-ethI`` for a host's NIC port ``I`` (its
    ``intf`` number), ``<switch>-ethP`` for a switch's OpenFlow port ``P``, as Mininet and the
    emulation name them (at most 15 characters: see ``mn.IFNAMSIZ``)."""
    return f"{node}-eth{port}"


def switches(g: nx.MultiGraph, role: str | None = None) -> list[str]:
    return [n for n, d in g.nodes(data=True) if d["tier"] > 0 and (role is None or d["role"] == role)]


def hosts(g: nx.MultiGraph) -> list[str]:
    return [n for n, d in g.nodes(data=True) if d["tier"] == 0]


def host_ports(g: nx.MultiGraph, host: str) -> list[dict]:
    """A host's NIC ports in interface order: dicts with intf, plane, rail, ip, mac, leaf, leaf_port."""
    out = []
    for _, leaf, data in g.edges(host, data=True):
        out.append({"intf": data["ports"][host], "plane": data["plane"], "rail": data["rail"],
                    "ip": data["ip"], "mac": data["mac"], "leaf": leaf, "leaf_port": data["ports"][leaf],
                    "rate_gbps": data["rate_gbps"]})
    return sorted(out, key=lambda p: p["intf"])


def link_ports(g: nx.MultiGraph, u: str, v: str) -> list[tuple[int, int]]:
    """(port on u, port on v) for every parallel link between u and v."""
    return sorted((d["ports"][u], d["ports"][v]) for d in g.get_edge_data(u, v, default={}).values())
