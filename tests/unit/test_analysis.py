"""`topo inspect` numbers against closed-form formulas, including the 130k preset."""
import pytest
from support.fabrics import fabric

from hpnlab.fabric.scenario import analysis, graph, spec


def inspect(name, **overrides):
    return analysis.inspect(graph.build(spec.load(name, overrides)))


@pytest.fixture(scope="module")
def hpn130k():
    return analysis.inspect(fabric("hpn-130k"))      # the session's cached graph (test_compiler's too)


def test_hpn_130k_reaches_131072_accelerators_within_radix(hpn130k):
    assert hpn130k["accelerators"] >= 131_072
    assert hpn130k["max_ports_used"] <= hpn130k["radix"]
    assert hpn130k["switches"] == {"spine": 4 * 256, "leaf": 4 * 512, "total": 4 * 768}


def test_hpn_130k_aggregation_shrinks_route_tables(hpn130k):
    routes = hpn130k["routes"]
    assert routes["host_routes_max"] == 131_072           # every NIC port of a plane
    assert routes["aggregated_max"] == 512                # a spine: one prefix per leaf
    assert routes["host_routes_max"] / routes["aggregated_max"] >= 100


def test_hpn_130k_paths_equal_spine_count(hpn130k):
    assert hpn130k["paths"]["same-rail"] == {**hpn130k["paths"]["same-rail"], "hops": 4, "paths": 256}
    assert hpn130k["paths"]["cross-rail"]["paths"] == 256


@pytest.mark.parametrize("spines,links", [(2, 1), (4, 1), (2, 2), (3, 2)])
def test_two_tier_paths_are_spines_times_links_squared(spines, links):
    r = inspect("mini-hpn", spines_per_plane=spines, leaf_spine_links=links, oversubscription=None,
                switch_radix=64)
    assert r["paths"]["same-rail"]["paths"] == spines * links * links
    assert r["paths"]["same-rail"]["hops"] == 4
    assert r["paths"]["same-leaf"] == {**r["paths"]["same-leaf"], "hops": 2, "paths": 1}


@pytest.mark.parametrize("k", [4, 8])
def test_fat_tree_cross_pod_paths_are_half_k_squared(k):
    r = inspect(f"fat-tree-{k}")
    assert r["paths"]["cross-pod"]["paths"] == (k // 2) ** 2
    assert r["paths"]["cross-pod"]["hops"] == 6
    assert r["paths"]["same-rail"]["paths"] == k // 2      # edge to edge inside a pod


def test_oversubscription_is_down_over_up_capacity():
    r = inspect("alibaba-hpn")
    assert r["oversubscription"]["leaf"] == pytest.approx(128 * 200 / (60 * 400))
    r = inspect("mini-hpn", spines_per_plane=1, oversubscription=None)
    assert r["oversubscription"]["leaf"] == pytest.approx(4 * 200 / (1 * 400))


def test_cross_campus_reports_long_haul_oversubscription_and_cut():
    s = spec.load("cross-campus")
    r = inspect("cross-campus")
    campus_hosts_gbps = s.hosts // 2 * s.ports_per_host * s.host_rate_gbps
    assert s.long_haul is not None
    long_haul_gbps = s.planes * s.cores_per_plane * s.long_haul.links * s.long_haul.rate_gbps
    assert r["oversubscription"]["long-haul"] == pytest.approx(campus_hosts_gbps / long_haul_gbps)
    assert r["bisection_gbps"] == pytest.approx(long_haul_gbps)
    assert r["paths"]["cross-campus"]["hops"] == 7   # host leaf spine core | core spine leaf host


def test_bisection_of_a_nonblocking_clos_is_half_the_host_capacity():
    s = spec.load("spine-leaf-rail")
    r = inspect("spine-leaf-rail")
    assert r["bisection_gbps"] == pytest.approx(s.hosts * s.ports_per_host * s.host_rate_gbps / 2)


def test_aggregated_routes_per_role_match_the_formula():
    s = spec.load("mini-rail")
    r = inspect("mini-rail")["routes"]["by_role"]
    assert r["leaf"]["aggregated_max"] == s.leaf_down_ports + 1          # own hosts + default up
    assert r["spine"]["aggregated_max"] == s.leaves_per_plane_per_pod     # one prefix per leaf
    assert r["leaf"]["host_routes_max"] == s.hosts * s.rails             # NIC ports per plane


def test_fat_tree_core_routes_one_prefix_per_pod():
    r = inspect("fat-tree-4")["routes"]["by_role"]
    assert r["core"]["aggregated_max"] == 4
    assert r["edge"]["aggregated_max"] == 2 + 1
    assert r["agg"]["aggregated_max"] == 2 + 1
