"""The failover benchmark's plan (tools/bench/bench_failover.py) and the flow model reading its figures:
every failure kind is a valid timeline that repairs what it breaks, and the model takes each mode's
median loss window for a link failure as its detection + convergence time."""
from __future__ import annotations

import json

import bench_failover
import pytest

from hpnlab.cli.cmd_model import detection_from
from hpnlab.fabric.emulation import timeline
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.scenario import graph, spec


@pytest.mark.parametrize("kind", bench_failover.KINDS)
def test_every_failure_kind_is_a_valid_timeline_that_repairs_what_it_breaks(kind):
    g = graph.build(spec.load("mini-hpn"))
    t = bench_failover.targets(g, sorted(graph.hosts(g)))
    events = timeline.load({"events": bench_failover.timeline(kind, t, 1.0, 0.5)}, g)
    assert [e.at for e in events] == [1.0, 1.5]
    assert experiment.left_failed(events[:1]) and experiment.left_failed(events) == []


def test_local_protection_alone_freezes_the_controller_around_the_failure_and_its_repair():
    g = graph.build(spec.load("mini-hpn"))
    t = bench_failover.targets(g, sorted(graph.hosts(g)))
    events = timeline.load({"events": bench_failover.timeline("link", t, 1.0, 0.5, remote=False)}, g)
    assert [(e.at, e.action) for e in events] == [
        (1.0 - bench_failover.FREEZE_LEAD_S, "controller_freeze"), (1.0, "link_down"), (1.5, "link_up"),
        (1.5 + bench_failover.THAW_AFTER_S, "controller_thaw")]
    assert experiment.left_failed(events) == []


def test_every_mode_but_local_protection_alone_lets_the_controller_notify_upstream():
    assert [m for m, cfg in bench_failover.MODES.items() if not cfg["remote"]] == ["local"]
    assert bench_failover.MODES["local+remote"]["fast_failover"] and bench_failover.MODES["local"]["fast_failover"]


def test_the_model_takes_each_modes_median_link_loss_window(tmp_path):
    runs = {"controller": {"link": [{"loss_window_ms": v} for v in (90, 70, 110)]},
            "local": {"link": [{"loss_window_ms": v} for v in (4, 2, None, 3)], "gray": [{"loss_window_ms": 9}]}}
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"runs": runs}))
    assert detection_from(str(path)) == {"controller": 90, "local": 3}


@pytest.mark.parametrize("text", ["{", "[]", '{"runs": {"local": {"gray": []}}}'])
def test_a_file_that_is_not_a_failover_benchmark_is_one_line(tmp_path, text):
    path = tmp_path / "f.json"
    path.write_text(text)
    with pytest.raises(UserError, match="--detect-from"):
        detection_from(str(path))


def _result(t0: float) -> dict:
    timeline_records = [{"action": "controller_freeze", "wall": t0 - 0.2},
                        {"action": "link_down", "start_wall": t0, "wall": t0 + 0.002},
                        {"action": "link_up", "start_wall": t0 + 1.0, "wall": t0 + 1.002}]
    flows = [{"src": "h1", "dst": "h2", "gaps": [[t0 - 0.004, t0 + 0.030, 1, 9, True], [t0 - 3, t0 - 2.9, 0, 1, 0],
                                                [t0 + 0.1, t0 + 0.3, 20, 21, False]]},
             {"src": "h2", "dst": "h1", "gaps": []}]
    return {"timeline": timeline_records, "flows": flows}


def test_the_plot_places_gaps_detection_update_and_repair_after_the_failure():
    t0 = 1_800_000_000.0
    d = bench_failover.plot_data(_result(t0), [(t0 + 0.050, 40.0)], remote=True)
    assert d is not None
    assert d["repair_s"] == pytest.approx(1.0, abs=1e-6)
    # the gap three seconds before is left out, and so is the idle one (no message in flight)
    assert d["flows"][0]["gaps"] == [[pytest.approx(-0.004, abs=1e-6), pytest.approx(0.030, abs=1e-6)]]
    assert d["delivering_again_s"] == pytest.approx(0.030, abs=1e-6)
    assert d["controller_update_s"] == (pytest.approx(0.010, abs=1e-6), pytest.approx(0.050, abs=1e-6))
    local = bench_failover.plot_data(_result(t0), [(t0 + 0.050, 40.0)], remote=False)
    assert local is not None and local["controller_update_s"] is None


def test_convergences_are_read_with_their_log_times():
    text = "2026-12-01 01:02:03,250 INFO hpnlab.controller.reconcile: converged in 12.5 ms after x (4 switch(es))\n"
    [(done, ms)] = bench_failover.convergences(text)
    assert ms == 12.5 and done % 1 == pytest.approx(0.25)


def test_the_comparison_writes_one_plot_per_failure_kind(tmp_path):
    t0 = 1_800_000_000.0
    shown = bench_failover.plot_data(_result(t0), [(t0 + 0.05, 40.0)], remote=True)
    path = tmp_path / "failover-link.png"
    bench_failover.plot("link", {"local": [{"plot": shown, "loss_window_ms": 34.0}], "controller": []}, str(path))
    assert path.read_bytes()[:4] == b"\x89PNG"


def _record(action, wall, target=("p0l0", "p0s0")):
    return {"action": action, "target": list(target), "wall": wall}


def _flow(bursts, gaps):
    return {"src": 0, "dst": 1, "app_bytes_sent": 10, "app_bytes_delivered": 10, "app_crc_sent": "1",
            "app_crc_delivered": "1", "gaps": gaps, "retx_bursts": bursts}


def test_a_failure_s_figures_end_at_its_repair_which_has_figures_of_its_own():
    """The repair's reroute back hurts flows too; its stall is not the failure's."""
    records = [_record("controller_freeze", 9.8, ()), _record("link_down", 10.0), _record("link_up", 11.0),
               _record("controller_thaw", 11.3, ())]
    flow = _flow(bursts=[[10.01, 10.01, 2, {"nack": 2}], [11.05, 11.06, 3, {"nack": 3}],
                         [11.35, 11.35, 1, {"nack": 1}]],
                 gaps=[[10.005, 10.012, 5, 6, True], [11.04, 11.09, 50, 51, True], [11.30, 11.40, 70, 71, True]])
    down, up = experiment.failover_figures({"flows": [flow]}, records)
    assert down["event"] == "link_down p0l0-p0s0" and down["packets_lost"] == 2
    assert down["loss_window_ms_max"] == pytest.approx(7.0)
    # the repair's figures end at the thaw: the stall after it is neither the failure's nor the repair's
    assert up["event"] == "link_up p0l0-p0s0" and up["packets_lost"] == 3
    assert up["loss_window_ms_max"] == pytest.approx(50.0)


def test_a_pause_under_way_when_the_link_comes_back_is_the_failure_s_not_the_repair_s():
    """A dead plane recovered in timer-paced rounds until the repair: its last round's pause and
    re-sends straddle the repair and belong to the failure."""
    records = [_record("link_down", 10.0), _record("link_up", 11.0)]
    flow = _flow(bursts=[[10.04, 10.8, 8, {"timeout": 8}], [10.99, 11.01, 3, {"timeout": 3}]],
                 gaps=[[10.0, 10.04, 5, 6, True], [10.96, 11.005, 50, 51, True]])
    down, up = experiment.failover_figures({"flows": [flow]}, records)
    assert down["packets_lost"] == 11 and down["loss_window_ms_max"] == pytest.approx(45.0)
    assert up["flows_hurt"] == 0 and up["loss_window_ms_max"] == 0.0 and up["packets_lost"] == 0
