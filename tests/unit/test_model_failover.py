"""Failover as a chain in the flow model (pure, no root): detection (lost), detour over the
fast-failover backups, converged routes (``model.failover_chain``).

The detour phase forwards as the healthy compiled tables do with the failed link dead: the
model's detour path for every leaf pair and entropy pattern of the small presets, under every
single fabric-link failure, is the table interpreter's walk of those tables link for link --
the fast-failover backups of a next-hop set, and the bounced detours of a dead one-port way
(a spine that lost its leaf sends the packet down another leaf, which bounces it up another
spine, marked; a core that lost its pod, in a fat-tree, deep: through an edge switch of another
pod and up that pod's other aggregation switch, compiler._deep) -- and a pair the tables drop
has no model path.
"""
from __future__ import annotations

import pytest
from support.fabrics import fabric
from support.model_checks import PRESETS, compare, every_pattern, fabric_links, leaf_pairs

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.model import flow as model

LINKS = [("p0l0", "p0s0", 0), ("p0s1", "p0l3", 0)]


@pytest.mark.parametrize("name", PRESETS)
def test_detour_paths_are_the_healthy_tables_walks_with_the_failed_link_dead(name):
    g = fabric(name)
    sports = every_pattern(g)
    pairs = leaf_pairs(g)
    for link in fabric_links(g):
        assert compare(g, {link}, pairs, sports, converged=False) == len(pairs) * len(sports)


def detour_paths(g, link: tuple) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(source leaf, destination leaf, model path as (tail, head) per link) of every leaf pair and
    entropy pattern in the detour phase with ``link`` dead (every one has a path)."""
    net = model.Network(g, {link})
    fwd = model.Forwarding(g, net.port_link, net.fwd.head, {link}, sports=every_pattern(g), converged=False)
    out = []
    for *_hosts, sleaf, dleaf, _sr, _dr in leaf_pairs(g):
        for sport in fwd.sports:
            path = fwd.leaf_path(sleaf, dleaf, sport)
            assert path is not None, (sleaf, dleaf, sport)
            out.append((sleaf, dleaf, [net.link_ends(x) for x in path]))
    return out


def test_a_spine_that_lost_its_leaf_detours_through_another_leaf_that_bounces_up_another_spine():
    g = fabric("mini-hpn")
    bounced = [p for _s, d, p in detour_paths(g, LINKS[1]) if d == "p0l3" and p and p[0][1] == "p0s1"]
    assert bounced, "some pattern towards p0l3 reaches p0s1"
    for p in bounced:       # leaf, the spine, another leaf (the source's own, too), another spine, p0l3
        (_, spine), (_, other), (_, spine2), (_, leaf) = p
        assert spine == "p0s1" and other != "p0l3" and spine2 != "p0s1" and leaf == "p0l3", p


def test_a_core_that_lost_its_pod_detours_deep_through_a_leaf_of_another_pod_and_up_another_group():
    """fat-tree-4: a core that lost its link into a pod marks the packet deep; the aggregation
    switch of another pod it reaches sends it down to an edge switch, which bounces it up the
    pod's other aggregation switch, so up a core of another group, which reaches the pod through
    its own aggregation switch there (compiler._deep: what survives a failed aggregation switch)."""
    g = fabric("fat-tree-4")
    link = next((u, v, k) for u, v, k in fabric_links(g) if {g.nodes[u]["tier"], g.nodes[v]["tier"]} == {2, 3})
    core, agg = (link[0], link[1]) if g.nodes[link[0]]["tier"] == 3 else (link[1], link[0])
    pod = g.nodes[agg]["pod"]
    through = [(d, p) for _s, d, p in detour_paths(g, link)
               if g.nodes[d]["pod"] == pod and any(t == core for t, _h in p)]
    assert through, f"some pattern into pod {pod} reaches {core}"
    for d, p in through:
        i = next(i for i, (t, _h) in enumerate(p) if t == core)
        heads = [h for _t, h in p[i:]]
        assert len(heads) == 6, p
        agg2, edge, agg3, core2, agg4, leaf = heads
        assert g.nodes[agg2]["pod"] != pod and g.nodes[edge]["tier"] == 1, p      # down into another pod's edge
        assert g.nodes[agg3]["pod"] == g.nodes[agg2]["pod"] and agg3 != agg2, p   # bounced up its other switch
        assert g.nodes[core2]["tier"] == 3 and agg not in g.adj[core2], p         # a core of another group
        assert g.nodes[agg4]["pod"] == pod and agg4 != agg and leaf == d, p


@pytest.mark.parametrize("routing", ["flow", "spray"])
def test_detour_phase_runs_at_the_detour_forwardings_pace(routing):
    g = fabric("mini-hpn")
    failed = {LINKS[0]}
    out = model.failover_chain(g, "all_reduce", 1 << 24, failed, routing=routing, placement="packed")
    detour = model.run_collective(g, "all_reduce", 1 << 24, routing=routing, placement="packed",
                                  network=model.Network(g, failed, converged=False))
    assert out["detour_s"] == detour.time_s
    assert out["detour_rate_gbps_mean"] == detour.rate_gbps_mean
    local = out["by_mode"]["local"]
    assert local["detour_ms"] == pytest.approx(min(local["converge_ms"] - local["detect_ms"], detour.time_s * 1e3))


@pytest.mark.parametrize("routing", ["flow", "spray", "adaptive"])
def test_with_the_same_times_the_backups_carry_what_the_controller_alone_loses(routing):
    """Controller-only and local failover given the same detection and convergence: the only
    difference is the fast-failover backups, which must carry the collective forward between
    the two (a detour that carried nothing, or backups counted for the controller-only mode,
    would make the two equal)."""
    g = fabric("mini-hpn")
    times = {"controller": (1.0, 500.0), "local": (1.0, 500.0)}
    for link in fabric_links(g)[:4]:
        out = model.failover_chain(g, "all_reduce", 1 << 24, {link}, times=times, routing=routing,
                                   placement="packed")
        ctl, local = out["by_mode"]["controller"], out["by_mode"]["local"]
        assert out["connections_hit"] > 0, link
        assert ctl["loss_ms"] == pytest.approx(500.0) and local["loss_ms"] == pytest.approx(1.0)
        assert local["detour_share"] > 0 and ctl["detour_share"] == 0
        assert local["time_s"] < ctl["time_s"]


def test_a_failure_no_connection_crosses_costs_nothing():
    g = fabric("mini-hpn")
    hosts = ["h1", "h2"]                 # two hosts under one leaf pair: p0l3's uplinks carry none of it
    unused = next(lk for lk in fabric_links(g) if "p0l3" in lk[:2])
    out = model.failover_chain(g, "all_reduce", 1 << 24, {unused}, routing="flow", hosts=hosts)
    assert out["connections_hit"] == 0
    assert all(d["time_s"] == out["healthy_s"] for d in out["by_mode"].values())


def test_given_times_set_each_phase():
    g = fabric("mini-hpn")
    times = {"controller": (90.0, 120.0), "local": (3.0, 120.0)}
    out = model.failover_chain(g, "all_reduce", 1 << 24, {LINKS[0]}, times=times, routing="spray",
                               placement="packed")
    assert out["by_mode"]["controller"]["loss_ms"] == pytest.approx(120.0)
    assert out["by_mode"]["local"]["loss_ms"] == pytest.approx(3.0)
    assert set(out["by_mode"]) == set(times)


def test_failover_times_come_from_the_comparisons_json(tmp_path):
    import json

    from hpnlab.cli.cmd_model import failover_times_from
    path = tmp_path / "failover.json"
    path.write_text(json.dumps({"runs": {
        "controller": {"link": [{"loss_window_ms": 90, "convergence_ms": 80}, {"loss_window_ms": 95,
                                                                                "convergence_ms": 85}]},
        "local": {"link": [{"loss_window_ms": 3, "convergence_ms": None}]}}}))
    assert failover_times_from(str(path)) == {"controller": (95, 85), "local": (3, model.FAILOVER_CHAIN_MS["local"][1])}


def _failover_json(tmp_path, loss, conv=None):
    import json
    path = tmp_path / "failover.json"
    path.write_text(json.dumps({"runs": {"local": {"link": [{"loss_window_ms": loss, "convergence_ms": conv}]}}}))
    return str(path)


@pytest.mark.parametrize("loss,conv", [("3 ms", None), (3, "fast"), (True, None), ([3], None)])
def test_a_non_numeric_time_in_the_failover_times_is_one_line_naming_the_flag(tmp_path, loss, conv):
    from hpnlab.cli.cmd_model import failover_times_from
    with pytest.raises(UserError, match=r"^--failover-times .*: local's link failure has \w+ .*not a number"):
        failover_times_from(_failover_json(tmp_path, loss, conv))


def test_a_failover_file_that_is_not_a_benchmarks_json_names_the_flag_given(tmp_path):
    from hpnlab.cli.cmd_model import detection_from, failover_times_from
    path = tmp_path / "x.json"
    path.write_text("[1, 2]")
    with pytest.raises(UserError, match=r"^--failover-times .*not a failover benchmark's JSON"):
        failover_times_from(str(path))
    with pytest.raises(UserError, match=r"^--detect-from .*not a failover benchmark's JSON"):
        detection_from(str(path))


def test_model_reads_the_failover_times_before_it_builds_anything(tmp_path, monkeypatch, capsys):
    from hpnlab.cli import cmd_model, main

    def built(*args, **kw):
        raise AssertionError("the scenario was loaded before --failover-times was read")
    monkeypatch.setattr(cmd_model, "load_scenario", built)
    code = main.main(["model", "mini-hpn", "--fail-links", "1", "--failover-times", _failover_json(tmp_path, "x")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--failover-times" in err and "Traceback" not in err


def test_detect_ms_with_a_study_is_refused_in_one_line(capsys):
    from hpnlab.cli import main
    code = main.main(["model", "mini-hpn", "--study", "failures", "--detect-ms", "local=5"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--detect-ms" in err and "--study" in err


@pytest.mark.parametrize("routing", ["flow", "spray", "adaptive"])
def test_a_failure_that_cuts_every_pair_stalls_every_connection(routing):
    """The failures study's plane failure on a one-plane preset (every link of the plane, host links
    too): no pair has a path, the collective never completes (spraying used to fail on the step
    with no live pair instead)."""
    g = fabric("mini-spine-leaf")
    every = set(g.edges(keys=True))
    out = model.failover_chain(g, "all_reduce", 1 << 20, every, routing=routing, placement="packed")
    assert out["detour_s"] == out["after_repair_s"] == float("inf")
    assert out["stalled_after_repair"] > 0
