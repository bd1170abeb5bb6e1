"""Invariants of every preset's fabric graph, checked edge by edge (pure, no root)."""
import ipaddress
import itertools
import re
from collections import Counter, defaultdict

import networkx as nx
import pytest

from hpnlab.fabric.scenario import addressing, graph, spec

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


# ---- identifiers that cannot collide (issue 15): boundaries of every field of a dpid and a MAC ----

MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def assert_identifiers_distinct(g: nx.MultiGraph) -> None:
    """Every dpid, MAC, host address and interface name of the graph is distinct and well formed."""
    dpids = [g.nodes[n]["dpid"] for n in graph.switches(g)]
    assert len(dpids) == len(set(dpids)) and all(0 < d < 2 ** 64 for d in dpids)
    host_links = [d for _, _, d in g.edges(data=True) if d["kind"] == "host"]
    macs = [d["mac"] for d in host_links]
    assert len(macs) == len(set(macs))
    assert all(MAC.match(m) and int(m[:2], 16) & 0b11 == 0b10 for m in macs)  # well formed, local, unicast
    ips = [d["ip"] for d in host_links]
    assert len(ips) == len(set(ips))
    names = [graph.intf_name(n, d["ports"][n]) for u, v, d in g.edges(data=True) for n in (u, v)]
    assert len(names) == len(set(names))


def test_every_identifier_is_distinct_across_the_whole_graph(fabric):
    assert_identifiers_distinct(fabric)


def test_the_size_computed_from_the_numbers_is_the_size_built(fabric):
    s = fabric.graph["scenario"]
    size = spec.size(s)
    assert size["hosts"] == len(graph.hosts(fabric))
    assert size["switches"] == len(graph.switches(fabric))
    assert size["links"] == fabric.number_of_edges()
    assert size["host_ports"] == sum(1 for _, _, d in fabric.edges(data=True) if d["kind"] == "host")


def _tiny(**fields):
    data = {"name": "edge", "rails": 1, "planes": 1, "hosts_per_segment": 1, "leaves_per_plane_per_segment": 1,
            "spines_per_plane": 1, "switch_radix": 1024}
    data.update(fields)
    return spec.from_dict(data)


@pytest.mark.parametrize("planes", [255, 256])
def test_planes_up_to_the_dpid_field_build_distinct_identifiers(planes):
    g = graph.build(_tiny(planes=planes))
    assert len({g.nodes[n]["plane"] for n in graph.switches(g)}) == planes
    assert_identifiers_distinct(g)


def test_a_257th_plane_is_refused_naming_the_dpid_field():
    with pytest.raises(spec.ScenarioError, match="8 bits of plane"):
        _tiny(planes=257)


@pytest.mark.parametrize("rails,planes", [(256, 1), (257, 1), (128, 3), (2, 256)])
def test_more_than_256_nic_ports_per_host_get_distinct_well_formed_macs(rails, planes):
    g = graph.build(_tiny(rails=rails, planes=planes, hosts_per_segment=2))
    assert g.nodes["h1"]["ports"] == rails * planes
    assert_identifiers_distinct(g)
    for host in graph.hosts(g):
        for port in graph.host_ports(g, host):
            assert port["mac"] == addressing.host_mac(g.nodes[host]["index"], port["intf"])


def test_a_mac_keeps_its_old_form_below_256_ports_and_widens_above():
    assert addressing.host_mac(5, 1) == "02:00:00:00:05:01"
    assert addressing.host_mac(5, 256) == "02:01:00:00:05:00"
    with pytest.raises(ValueError):
        addressing.host_mac(1 << 24, 0)


@pytest.mark.parametrize("field,value", [("plane", 256), ("campus", 256), ("index", 1 << 40), ("plane", -1)])
def test_a_dpid_field_out_of_range_raises_instead_of_wrapping(field, value):
    fields = {"plane": 0, "campus": 0, "index": 0, field: value}
    with pytest.raises(ValueError, match="out of range"):
        addressing.dpid("leaf", **fields)


def test_256_campuses_build_distinct_identifiers_and_257_are_refused():
    joined = {"cores_per_plane": 1, "long_haul": {"links": 1}}
    g = graph.build(_tiny(campuses=256, **joined))
    assert len({g.nodes[n]["campus"] for n in graph.switches(g)}) == 256
    assert_identifiers_distinct(g)
    with pytest.raises(spec.ScenarioError, match="8 bits of campus"):
        _tiny(campuses=257, **joined)


def test_more_hosts_than_a_mac_numbers_are_refused_even_with_the_size_limits_raised(monkeypatch):
    monkeypatch.setenv("HPNLAB_MAX_LINKS", str(10 ** 12))
    monkeypatch.setenv("HPNLAB_MAX_NODES", str(10 ** 12))
    with pytest.raises(spec.ScenarioError, match="host MAC"):
        _tiny(hosts_per_segment=60_000, segments_per_pod=280, switch_radix=65_536)   # 16.8M hosts > 2^24


def _largest_fat_tree_k(links: int, nodes: int) -> int:
    """By the closed forms: k^3/4 hosts, 5k^2/4 switches, 3k^3/4 links."""
    k = 2
    while 3 * (k + 2) ** 3 // 4 <= links and (k + 2) ** 3 // 4 + 5 * (k + 2) ** 2 // 4 <= nodes:
        k += 2
    return k


def test_the_largest_fat_tree_within_the_size_limits_loads_and_the_next_is_refused():
    k = _largest_fat_tree_k(spec.DEFAULT_LIMITS["links"], spec.DEFAULT_LIMITS["nodes"])
    assert spec.load(f"fat-tree-{k}").k == k
    with pytest.raises(spec.ScenarioError, match="above the limit"):
        spec.load(f"fat-tree-{k + 2}")


def test_with_the_limits_raised_the_address_plan_bounds_the_fat_tree(monkeypatch):
    monkeypatch.setenv("HPNLAB_MAX_LINKS", str(10 ** 12))
    monkeypatch.setenv("HPNLAB_MAX_NODES", str(10 ** 12))
    assert addressing.plan_for(spec.load("fat-tree-256")).total_bits == 23   # and fat-tree-258 needs 25
    with pytest.raises(spec.ScenarioError, match="25 host bits"):
        spec.load("fat-tree-258")


def _big_hpn(pods):
    return spec.from_dict({"name": "big", "rails": 8, "planes": 4, "hosts_per_segment": 256, "segments_per_pod": 32,
                           "leaves_per_plane_per_segment": 8, "spines_per_plane": 8, "pods": pods,
                           "cores_per_plane": 8, "switch_radix": 512, "host_rate_gbps": 100,
                           "leaf_spine_rate_gbps": 100, "spine_core_rate_gbps": 100, "switch_port_rate_gbps": 100})


def test_with_the_limits_raised_the_address_plan_bounds_the_hpn(monkeypatch):
    monkeypatch.setenv("HPNLAB_MAX_LINKS", str(10 ** 12))
    monkeypatch.setenv("HPNLAB_MAX_NODES", str(10 ** 12))
    assert addressing.plan_for(_big_hpn(32)).total_bits == 24
    with pytest.raises(spec.ScenarioError, match="25 host bits"):
        _big_hpn(33)


def test_a_fabric_beyond_the_size_limit_is_refused_before_anything_is_built():
    with pytest.raises(spec.ScenarioError, match="above the limit of 2,000,000"):
        _big_hpn(32)
