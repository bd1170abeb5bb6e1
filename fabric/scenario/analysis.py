"""Analyses of a fabric graph: sizes, radix use, oversubscription, bisection, paths, routes.

Everything here is read off the graph (not from the scenario's numbers), so the tests can
compare it with closed-form formulas and catch a builder that wires something wrong.

Route-table sizes count IPv4 forwarding entries per switch under two policies:

``host_routes``
    one route per host address (NIC port) of the switch's plane: what a flat, unaggregated
    fabric installs everywhere.
``aggregated``
    leaf/edge: one host route per attached host port + one default route up (if it has
    uplinks); spine/agg: one prefix per leaf below it + one default up (if it has uplinks);
    core: one prefix per pod below it + one campus prefix per far campus (long-haul).
    This is the route plan the controller's ``aggregate`` policy compiles in a healthy fabric,
    which adds one more entry on every leaf and spine that has uplinks: a drop for addresses
    of its own prefix that belong to no host (without it such a packet would bounce between
    tiers, as OpenFlow switches do not decrement TTL here). ``hpnlab.fabric.routing.compiler.minimum_routes``
    equals this count; tests/unit/test_compiler.py checks both relations on every preset.
"""
from __future__ import annotations

from collections import Counter, defaultdict, deque
from typing import Any

import networkx as nx

from hpnlab.fabric.scenario.graph import TIER

PAIR_KINDS = ("same-leaf", "same-rail", "cross-rail", "cross-pod", "cross-campus")


def scan(g: nx.MultiGraph) -> dict[str, Any]:
    """One pass over every switch's links (the graph's raw adjacency: this is the hot loop
    at 130k scale). Returns per-switch port use and route counts, link counts by kind and
    host ports per plane."""
    s = g.graph["scenario"]
    node = g._node
    port_rate = s.switch_port_rate_gbps
    ports: dict[str, dict[str, float]] = {}
    raw_routes: dict[str, tuple[int, int]] = {}
    links: Counter[str] = Counter()
    ports_per_plane: Counter[int] = Counter()
    for switch, attrs in node.items():
        tier = attrs["tier"]
        if tier == 0:
            continue
        nlinks = 0
        down = up = peer = 0.0
        host_ports = 0
        below: set[object] = set()     # leaves below a spine, (campus, pod)s below a core
        far_campuses: set[int] = set()
        has_up = False
        for neighbour, keydict in g._adj[switch].items():
            neighbour_attrs = node[neighbour]
            neighbour_tier = neighbour_attrs["tier"]
            if len(keydict) == 1:
                nlinks += 1
                for data in keydict.values():
                    cap = data["rate_gbps"]
            else:
                nlinks += len(keydict)
                cap = sum(data["rate_gbps"] for data in keydict.values())
            if neighbour_tier == 0:
                down += cap
                host_ports += len(keydict)
                links["host"] += len(keydict)
            elif neighbour_tier < tier:
                down += cap
                # a spine counts the leaves below it; a core counts the pods below it
                below.add(neighbour if tier == 2 else (neighbour_attrs["campus"], neighbour_attrs["pod"]))
            elif neighbour_tier > tier:
                up += cap
                has_up = True
                links[next(iter(keydict.values()))["kind"]] += len(keydict)
            else:
                peer += cap
                far_campuses.add(neighbour_attrs["campus"])
                if switch < neighbour:
                    links[next(iter(keydict.values()))["kind"]] += len(keydict)
        if host_ports:
            ports_per_plane[attrs["plane"]] += host_ports
        ports[switch] = {"links": nlinks, "slots": (down + up + peer) / port_rate, "down_gbps": down,
                         "up_gbps": up, "peer_gbps": peer}
        raw_routes[switch] = (attrs["plane"], host_ports + len(below) + len(far_campuses) + int(has_up))
    routes = {switch: {"host_routes": ports_per_plane[plane], "aggregated": aggregated}
              for switch, (plane, aggregated) in raw_routes.items()}
    return {"ports": ports, "routes": routes, "links": links, "ports_per_plane": ports_per_plane}


def switch_ports(g: nx.MultiGraph) -> dict[str, dict[str, float]]:
    """Per switch: links, port slots used (in switch_port_rate units), down/up/peer capacity."""
    return scan(g)["ports"]


def route_counts(g: nx.MultiGraph) -> dict[str, dict[str, int]]:
    """Per switch: {'host_routes': n, 'aggregated': n} (see the module docstring)."""
    return scan(g)["routes"]


def count_shortest_paths(g: nx.MultiGraph, src: str, dst: str) -> tuple[int, int]:
    """(switch-to-switch links on a shortest path, number of shortest link-level paths)
    between two switches, walking only switches (hosts do not forward); (-1, 0) unreachable."""
    return shortest_path_counts(g, src, {dst})[dst]


def shortest_path_counts(g: nx.MultiGraph, source: str, targets: set[str]) -> dict[str, tuple[int, int]]:
    """``count_shortest_paths`` from one switch to many target switches in one breadth-first
    search (parallel links counted; it stops at the distance of the farthest target)."""
    node, adj = g._node, g._adj
    dist = {source: 0}
    sigma = {source: 1}
    queue = deque([source])
    left = set(targets) - {source}
    horizon = None if left else 0      # the distance of the farthest target, once every target is found
    while queue:
        u = queue.popleft()
        du = dist[u]
        if horizon is not None and du >= horizon:
            break
        su = sigma[u]
        for v, keydict in adj[u].items():
            dv = dist.get(v)
            if dv is None:
                if node[v]["tier"] == 0:
                    continue
                dist[v] = dv = du + 1
                sigma[v] = 0
                queue.append(v)
                left.discard(v)
                if not left and horizon is None:
                    horizon = dv
            if dv == du + 1:
                sigma[v] += su * len(keydict)
    return {t: (dist[t], sigma[t]) if t in dist else (-1, 0) for t in targets}


def _host_port_on(g: nx.MultiGraph, leaf: str, *, rail: int | None = None,
                  not_host: str | None = None) -> dict[str, Any] | None:
    """The first host port on a leaf (of a rail, not of a host): host, leaf, rail, ip."""
    for host, keydict in g._adj[leaf].items():
        if host == not_host:
            continue
        for data in keydict.values():
            if data["kind"] == "host" and (rail is None or data["rail"] == rail):
                return {"host": host, "leaf": leaf, "rail": data["rail"], "ip": data["ip"]}
    return None


def representative_pairs(g: nx.MultiGraph) -> dict[str, tuple[dict, dict]]:
    """One pair of host ports of plane 0 for each kind of pair the fabric has."""
    leaves = {}
    for switch, attrs in g._node.items():
        if attrs["tier"] == 1 and attrs["plane"] == 0:
            leaves[(attrs["campus"], attrs["pod"], attrs["segment"], attrs["leaf"])] = switch
    first_leaf = leaves[min(leaves)]
    first_attrs = g._node[first_leaf]
    source = _host_port_on(g, first_leaf)
    if source is None:
        return {}
    pairs: dict[str, tuple[dict, dict]] = {}
    target = _host_port_on(g, first_leaf, not_host=source["host"])
    if target:
        pairs["same-leaf"] = (source, target)
    for _, leaf in sorted(leaves.items()):
        if leaf == first_leaf:
            continue
        leaf_attrs = g._node[leaf]
        if leaf_attrs["campus"] != first_attrs["campus"]:
            kind = "cross-campus"
        elif leaf_attrs["pod"] != first_attrs["pod"]:
            kind = "cross-pod"
        elif source["rail"] in leaf_attrs["rails"]:
            kind = "same-rail"
        else:
            kind = "cross-rail"
        if kind not in pairs:
            target = _host_port_on(g, leaf, rail=source["rail"] if kind == "same-rail" else None,
                                   not_host=source["host"])
            if target:
                pairs[kind] = (source, target)
    return pairs


def path_table(g: nx.MultiGraph) -> dict[str, dict[str, Any]]:
    """Per pair kind: host-to-host links on a shortest path and the number of equal-cost paths."""
    out: dict[str, dict[str, Any]] = {}
    pairs = representative_pairs(g)
    for kind in PAIR_KINDS:
        if kind not in pairs:
            continue
        source, target = pairs[kind]
        links, paths = count_shortest_paths(g, source["leaf"], target["leaf"])
        out[kind] = {"hops": links + 2, "switches": links + 1, "paths": paths,
                     "example": [f"{source['host']} {source['ip']}", f"{target['host']} {target['ip']}"]}
    out["cross-plane"] = {"hops": None, "switches": None, "paths": 0,
                          "note": "planes are disjoint networks; a host reaches another plane only "
                                  "through its own NIC port on that plane"}
    return out


def bisection(g: nx.MultiGraph, ports: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Capacity of the worst balanced cut of a Clos: min over tiers of half the capacity above
    the tier (all planes together), and the long-haul cut between campuses."""
    s = g.graph["scenario"]
    by_tier: dict[int, float] = defaultdict(float)
    host_gbps = 0.0
    for switch, use in ports.items():
        tier = g.nodes[switch]["tier"]
        by_tier[tier] += use["up_gbps"]
        if tier == 1:
            host_gbps += use["down_gbps"]
    cuts = {"hosts": host_gbps / 2}
    for tier, cap in sorted(by_tier.items()):
        if cap > 0:
            cuts[f"tier{tier}_up"] = cap / 2
    if s.campuses > 1 and s.long_haul:
        half = s.campuses // 2
        per_pair = s.planes * s.cores_per_plane * s.long_haul.links * s.long_haul.rate_gbps
        cuts["long_haul"] = half * (s.campuses - half) * per_pair
    return {"bisection_gbps": min(cuts.values()), "cuts_gbps": cuts}


def inspect(g: nx.MultiGraph) -> dict[str, Any]:
    """The numbers `hpnlab topo inspect` prints (and its --json)."""
    s = g.graph["scenario"]
    nodes = g._node
    scanned = scan(g)
    ports, routes, links = scanned["ports"], scanned["routes"], scanned["links"]
    roles = Counter(nodes[switch]["role"] for switch in ports)
    nic_ports = links.get("host", 0)
    max_slots = max((use["slots"] for use in ports.values()), default=0)
    max_links = max((use["links"] for use in ports.values()), default=0)
    oversubscription: dict[str, float] = {}
    for switch, use in ports.items():
        role = nodes[switch]["role"]
        if use["up_gbps"] > 0:
            oversubscription[role] = max(oversubscription.get(role, 0.0), use["down_gbps"] / use["up_gbps"])
    if s.campuses > 1 and s.long_haul:
        campus_host_gbps = s.hosts // s.campuses * s.ports_per_host * s.host_rate_gbps
        far_gbps = (s.campuses - 1) * s.planes * s.cores_per_plane * s.long_haul.links * s.long_haul.rate_gbps
        oversubscription["long-haul"] = campus_host_gbps / far_gbps
    per_pod: dict[str, int] = defaultdict(int)
    per_pod_host: dict[str, int] = defaultdict(int)
    for switch, counts in routes.items():
        attrs = nodes[switch]
        if attrs["pod"] is None:
            continue
        key = f"campus{attrs['campus']}/pod{attrs['pod']}"
        per_pod[key] += counts["aggregated"]
        per_pod_host[key] += counts["host_routes"]
    by_role_routes = {}
    for role in roles:
        members = [routes[switch] for switch in ports if nodes[switch]["role"] == role]
        by_role_routes[role] = {"host_routes_max": max(counts["host_routes"] for counts in members),
                                "aggregated_max": max(counts["aggregated"] for counts in members)}
    result = {
        "scenario": s.name,
        "kind": s.kind,
        "accelerators": s.hosts * s.accelerators_per_host,
        "hosts": len(nodes) - len(ports),
        "nic_ports": nic_ports,
        "planes": s.planes,
        "rails": s.rails,
        "switches": dict(sorted(roles.items(), key=lambda item: -TIER[item[0]])) | {"total": len(ports)},
        "links": dict(links) | {"total": sum(links.values())},
        "radix": s.switch_radix,
        "switch_port_rate_gbps": s.switch_port_rate_gbps,
        "max_ports_used": max_slots,
        "max_links_per_switch": max_links,
        "ports_used_by_role": {role: max(use["slots"] for switch, use in ports.items()
                                         if nodes[switch]["role"] == role)
                               for role in roles},
        "oversubscription": oversubscription,
        "paths": path_table(g),
        "routes": {
            "host_routes_max": max((counts["host_routes"] for counts in routes.values()), default=0),
            "aggregated_max": max((counts["aggregated"] for counts in routes.values()), default=0),
            "per_pod_total": {"aggregated": dict(per_pod), "host_routes": dict(per_pod_host)},
            "by_role": by_role_routes,
        },
    }
    result.update(bisection(g, ports))
    return result
