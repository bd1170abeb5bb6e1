"""Failover as a chain in the flow model (pure, no root): detection (lost), detour over the
fast-failover backups, converged routes (``model.failover_chain``).

The detour phase forwards as the healthy compiled tables do with the failed link dead (their
fast-failover groups pick the backups): the model's detour path for every leaf pair and entropy
pattern of mini-hpn is the table interpreter's walk of those tables, except where a switch's
only way is dead and its detour group bounces the packet through another leaf, which the model
does not follow (it then has no detour path; the interpreter's walk is longer).
"""
from __future__ import annotations

import pytest
from fabrics import fabric
from test_model_forwarding import every_pattern, fabric_links, leaf_pairs

from hpnlab.controller import compiler
from hpnlab.controller.oftable import FabricTables
from hpnlab.fabric import model
from hpnlab.fabric.errors import UserError

LINKS = [("p0l0", "p0s0", 0), ("p0s1", "p0l3", 0)]


@pytest.mark.parametrize("link", LINKS)
def test_detour_paths_are_the_fast_failover_backups_of_the_healthy_tables(link):
    g = fabric("mini-hpn")
    failed = {link}
    failures = compiler.Failures.of(failed)
    tables = FabricTables(g, compiler.compile_fabric(g), failures)     # healthy tables, the link dead
    net = model.Network(g, failed)
    sports = every_pattern(g)
    fwd = model.Forwarding(g, net.port_link, net.fwd.head, failed, sports=sports, converged=False)
    followed = 0
    for src, dst, plane, sleaf, dleaf, srail, drail in leaf_pairs(g):
        for sport in sports:
            walk = tables.send(src, dst, plane, sport=sport, src_rail=srail, dst_rail=drail)
            path = fwd.leaf_path(sleaf, dleaf, sport)
            assert walk.result == "delivered", (src, dst, sport, walk.where)
            links = [net.link_at(sw, out) for sw, _in, out in walk.hops[:-1]]
            if path is None:                  # a bounce through another leaf: longer than any leaf-spine-leaf way
                assert len(links) > 2, (src, dst, sport, walk.hops)
            else:
                assert path == links, (src, dst, sport, walk.hops, path)
                followed += 1
    assert followed > 0


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
