"""The model's studies (hpnlab.fabric.experiments.studies): small scenarios, closed forms where there are."""
from __future__ import annotations

import pytest

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import studies as ms
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import analysis, graph, spec


def test_the_job_sizes_grow_by_eight_from_64_to_the_scenario():
    assert ms.rank_grid(131072, 8) == [64, 512, 4096, 32768, 131072]
    assert ms.rank_grid(16, 1) == [16]


@pytest.mark.parametrize("planes", [1, 2])
def test_the_two_tier_arithmetic_equals_the_built_fabric(planes):
    # a scenario small enough to build: NIC 2 x 100G, 8 x 100G switches, one rail
    s = spec.from_dict({"name": "t", "kind": "hpn", "accelerators_per_host": 1, "rails": 1, "planes": 2,
                        "hosts_per_segment": 2, "segments_per_pod": 2, "leaves_per_plane_per_segment": 1,
                        "spines_per_plane": 2, "host_rate_gbps": 100, "leaf_spine_rate_gbps": 100,
                        "switch_radix": 8, "switch_port_rate_gbps": 100, "oversubscription": 1.0})
    t = ms.two_tier(s, planes)
    g = graph.build(spec.from_dict(t))
    size = ms.two_tier_size(t)
    assert size["hosts"] == len(graph.hosts(g))
    assert size["switches"] == len(graph.switches(g))
    assert size["links"] == g.number_of_edges()


def test_more_planes_reach_more_accelerators_in_two_tiers_with_the_same_switch_and_nic():
    rows = ms.study_planes(spec.load("hpn-130k"))["rows"]
    assert [r["planes"] for r in rows] == [1, 2, 4, 8]
    # radix doubles with the planes: two-tier scale radix^2 / 2 NIC ports per plane
    assert all(r["accelerators"] == r["radix"] ** 2 // 2 for r in rows)
    assert next(r for r in rows if r["planes"] == 4)["accelerators"] == 131072   # the preset's own scale


def test_route_counts_are_the_compilers_and_aggregation_holds_fewer():
    from hpnlab.fabric.routing import compiler

    s = spec.load("mini-hpn")
    rows = {r["policy"]: r for r in ms.study_routes([s])["rows"]}
    summary = compiler.route_summary(graph.build(s), "aggregate")
    assert rows["aggregate"]["max_per_switch"] == summary["max_routes_per_switch"]
    assert rows["aggregate"]["max_per_switch"] < rows["host-routes"]["max_per_switch"]
    assert rows["aggregate"]["source"] == "compiled"


def test_counted_routes_are_the_compilers_host_routes_and_its_aggregation_minimum():
    from hpnlab.fabric.routing import compiler

    g = graph.build(spec.load("small-hpn"))
    counted = analysis.route_counts(g)
    host = compiler.route_summary(g, "host-routes")["switches"]
    assert {n: r["routes"] for n, r in host.items()} == {n: c["host_routes"] for n, c in counted.items()}
    agg = compiler.route_summary(g, "aggregate")["switches"]
    assert {n: r["minimum_routes"] for n, r in agg.items()} == {n: c["aggregated"] for n, c in counted.items()}
    # the compiled aggregation holds at most one route more per switch than that minimum
    assert {r["routes"] - counted[n]["aggregated"] for n, r in agg.items()} <= {0, 1}


def test_failure_sets_are_one_link_every_link_of_one_spine_and_every_link_of_one_plane():
    g = graph.build(spec.load("mini-hpn"))
    sets = ms.failure_sets(g)
    assert len(sets["link"]) == 1
    [spine] = {n for u, v, _ in sets["spine"] for n in (u, v) if g.nodes[n]["tier"] == 2}
    assert len(sets["spine"]) == g.degree(spine)
    plane_switches = {n for u, v, _ in sets["plane"] for n in (u, v) if g.nodes[n]["tier"] > 0}
    assert {g.nodes[n]["plane"] for n in plane_switches} == {0}


def test_failure_study_times_a_hit_collective_through_each_modes_chain():
    s = spec.load("mini-hpn")
    doc = ms.study_failures(s, size_bytes=1 << 24, times={"controller": (1.0, 100.0), "local": (1.0, 100.0)},
                            routings=["spray"])
    for r in doc["rows"]:
        assert r["stalled_after_repair"] == 0
        if r["connections_hit"]:
            rest = (1 - r["detour_ms"] / 1e3 / r["detour_s"]) * r["after_repair_s"]
            assert r["time_s"] == pytest.approx((r["loss_ms"] + r["detour_ms"]) / 1e3 + rest)
            assert r["loss_ms"] == (100.0 if r["mode"] == "controller" else 1.0)


def test_routing_study_runs_every_routing_per_flow_ecmp_under_its_alias():
    doc = ms.study_routing(spec.load("mini-hpn"), size_bytes=1 << 20, max_steps=2)
    assert {r["routing"] for r in doc["rows"]} == set(ms.ALL_ROUTINGS)
    assert doc["missing_routings"] == []


def test_routing_study_lists_the_routings_the_model_lacks(monkeypatch):
    monkeypatch.setattr(model, "ROUTINGS", tuple(r for r in model.ROUTINGS if r != "flowlet"))
    doc = ms.study_routing(spec.load("mini-hpn"), size_bytes=1 << 20, max_steps=2, collectives=("all_reduce",))
    assert {r["routing"] for r in doc["rows"]} == set(ms.ALL_ROUTINGS) - {"flowlet"}
    assert doc["missing_routings"] == ["flowlet"]


def test_cross_campus_study_needs_two_campuses():
    with pytest.raises(UserError, match="two campuses"):
        ms.study_cross_campus(spec.load("mini-hpn"), size_bytes=1 << 20)


def test_the_cross_campus_exchange_is_no_faster_with_a_thinner_long_haul():
    doc = ms.study_cross_campus(spec.load("mini-cross-campus"), size_bytes=1 << 24, links=(1, 2),
                                distances_km=(10,))
    thin, wide = sorted((r for r in doc["rows"] if "error" not in r), key=lambda r: r["long_haul_links"])
    assert thin["dp_exchange_ms"] >= wide["dp_exchange_ms"]


def test_every_study_draws_its_plot(tmp_path):
    pytest.importorskip("matplotlib")
    doc = ms.study_planes(spec.load("hpn-130k"))
    path = ms.plot(doc, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 0 and path.endswith("p.png")
