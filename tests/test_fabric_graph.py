"""Invariants of every preset's fabric graph, checked edge by edge (pure, no root)."""
import ipaddress
import itertools
from collections import Counter, defaultdict

import networkx as nx
import pytest

from hpnlab.fabric import graph, spec

SMALL_PRESETS = [n for n in spec.preset_names() if n != "hpn-130k"] + ["fat-tree-4", "fat-tree-8"]


@pytest.fixture(scope="module", params=SMALL_PRESETS)
def fabric(request):
    return graph.build(spec.load(request.param))


def _switch_slots(g):
    s = g.graph["scenario"]
    slots: Counter[str] = Counter()
    for u, v, d in g.edges(data=True):
        for n in (u, v):
            if g.nodes[n]["tier"] > 0:
                slots[n] += d["rate_gbps"] / s.switch_port_rate_gbps
    return slots


def test_no_switch_uses_more_ports_than_its_radix(fabric):
    s = fabric.graph["scenario"]
    assert max(_switch_slots(fabric).values()) <= s.switch_radix


def test_switch_port_numbers_are_unique_and_contiguous(fabric):
    ports = defaultdict(list)
    for u, v, d in fabric.edges(data=True):
        ports[u].append(d["ports"][u])
        ports[v].append(d["ports"][v])
    for node, numbers in ports.items():
        first = 0 if fabric.nodes[node]["tier"] == 0 else 1
        assert sorted(numbers) == list(range(first, first + len(numbers))), node


def test_each_nic_has_one_port_in_every_plane(fabric):
    s = fabric.graph["scenario"]
    for h in graph.hosts(fabric):
        by_rail = defaultdict(list)
        for p in graph.host_ports(fabric, h):
            by_rail[p["rail"]].append(p["plane"])
            assert fabric.nodes[p["leaf"]]["plane"] == p["plane"]
        assert sorted(by_rail) == list(range(s.rails))
        for planes in by_rail.values():
            assert sorted(planes) == list(range(s.planes))


def test_every_leaf_reaches_every_spine_of_its_plane_and_pod(fabric):
    s = fabric.graph["scenario"]
    for leaf in (n for n in graph.switches(fabric) if fabric.nodes[n]["tier"] == 1):
        leaf_attrs = fabric.nodes[leaf]
        spines = {n for n in graph.switches(fabric)
                  if fabric.nodes[n]["tier"] == 2 and fabric.nodes[n]["plane"] == leaf_attrs["plane"]
                  and (fabric.nodes[n]["campus"], fabric.nodes[n]["pod"]) == (leaf_attrs["campus"], leaf_attrs["pod"])}
        assert {v for v in fabric[leaf] if fabric.nodes[v]["tier"] == 2} == spines
        for spine in spines:
            assert fabric.number_of_edges(leaf, spine) == s.leaf_spine_links


def test_planes_are_disjoint_switch_networks(fabric):
    for u, v in fabric.edges():
        du, dv = fabric.nodes[u], fabric.nodes[v]
        if du["tier"] and dv["tier"]:
            assert du["plane"] == dv["plane"]


def test_host_addresses_are_unique_and_inside_their_leaf_prefix(fabric):
    plan = fabric.graph["plan"]
    seen = set()
    for h in graph.hosts(fabric):
        for p in graph.host_ports(fabric, h):
            ip = ipaddress.IPv4Address(p["ip"])
            leaf_net = ipaddress.IPv4Network(fabric.nodes[p["leaf"]]["prefix"])
            assert ip in leaf_net and ip != leaf_net.network_address
            assert ip in ipaddress.IPv4Network(plan.plane_prefix(p["plane"]))
            assert ip not in seen
            seen.add(ip)


def test_leaf_prefixes_nest_in_pod_and_plane_prefixes_without_overlap(fabric):
    plan = fabric.graph["plan"]
    leaves = [fabric.nodes[n] for n in graph.switches(fabric) if fabric.nodes[n]["tier"] == 1]
    nets = [ipaddress.IPv4Network(d["prefix"]) for d in leaves]
    for d, net in zip(leaves, nets, strict=True):
        pod = ipaddress.IPv4Network(plan.pod_prefix(d["plane"], d["campus"], d["pod"]))
        campus = ipaddress.IPv4Network(plan.campus_prefix(d["plane"], d["campus"]))
        plane = ipaddress.IPv4Network(plan.plane_prefix(d["plane"]))
        assert net.subnet_of(pod) and pod.subnet_of(campus) and campus.subnet_of(plane)
    ordered = sorted(nets)
    for lower, upper in itertools.pairwise(ordered):
        assert not lower.overlaps(upper)


def test_dpids_and_macs_are_unique(fabric):
    dpids = [fabric.nodes[n]["dpid"] for n in graph.switches(fabric)]
    assert len(dpids) == len(set(dpids)) and all(0 < d < 2 ** 64 for d in dpids)
    macs = [d["mac"] for _, _, d in fabric.edges(data=True) if d["kind"] == "host"]
    assert len(macs) == len(set(macs))
    assert all(int(m.split(":")[0], 16) & 0b11 == 0b10 for m in macs)  # local, unicast


def test_building_twice_gives_the_same_graph(fabric):
    again = graph.build(fabric.graph["scenario"])
    assert nx.utils.graphs_equal(fabric, again)


def test_add_links_matches_networkx_add_edges_from():
    s = spec.load("mini-rail")
    g = graph.build(s)
    ref = nx.MultiGraph()
    ref.add_nodes_from(g.nodes(data=True))
    ref.add_edges_from((u, v, d) for u, v, d in g.edges(data=True))
    assert sorted(map(repr, ref.edges(keys=True, data=True))) == sorted(map(repr, g.edges(keys=True, data=True)))


@pytest.mark.parametrize("k", [4, 6, 8])
def test_fat_tree_has_the_closed_form_sizes(k):
    g = graph.build(spec.load(f"fat-tree-{k}"))
    roles = Counter(d["role"] for _, d in g.nodes(data=True))
    assert roles == {"host": k ** 3 // 4, "edge": k * k // 2, "agg": k * k // 2, "core": k * k // 4}
    assert all(len(g[n]) == k for n in graph.switches(g))  # every switch uses exactly k ports


def test_long_haul_links_carry_fibre_delay_between_matching_cores():
    s = spec.load("cross-campus")
    g = graph.build(s)
    assert s.long_haul is not None
    long_haul = [(u, v, d) for u, v, d in g.edges(data=True) if d["kind"] == "long-haul"]
    assert len(long_haul) == s.planes * s.cores_per_plane * s.long_haul.links
    for u, v, d in long_haul:
        assert d["delay_us"] == pytest.approx(s.long_haul.distance_km * 5.0)
        assert g.nodes[u]["plane"] == g.nodes[v]["plane"]
        assert g.nodes[u]["campus"] != g.nodes[v]["campus"]
        assert g.nodes[u]["deep_buffer"] and g.nodes[v]["deep_buffer"]


def test_rail_r_of_every_host_lands_on_the_leaf_serving_rail_r():
    g = graph.build(spec.load("mini-spine-leaf"))
    for h in graph.hosts(g):
        for p in graph.host_ports(g, h):
            assert p["rail"] in g.nodes[p["leaf"]]["rails"]
            assert g.nodes[p["leaf"]]["segment"] == g.nodes[h]["segment"]
