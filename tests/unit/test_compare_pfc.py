"""The ECN comparison on a lossless fabric, pure: the PFC figures, the victim workload and its slowdown,
the pfc-aware setting, and one comparison of the same cells with and without PFC."""
from __future__ import annotations

import pytest
from support.compare_stand_ins import FakeEmu, FakePlan

from hpnlab.fabric.experiments import compare_ecn as compare
from hpnlab.fabric.workload import jobspec


def doc(busbw=None, msg_ms=()):
    """A run document as experiment.run makes it, with only what the comparison reads."""
    ecn = {"queue_p99_bytes": 1000.0, "ce_fraction": 0.01, "drops": 0}
    results = []
    if busbw is not None:
        results.append({"collective": "all_reduce", "avg_busbw_gbs": busbw, "switch_ecn": ecn,
                        "rows": [{"size": 1, "oop": {"wrong": 0}, "ip": None}]})
    if msg_ms:
        results.append({"collective": "incast", "switch_ecn": ecn,
                        "rows": [{"size": 1, "ip": None,
                                  "oop": {"wrong": 0, "message_times_s": [m / 1e3 for m in msg_ms]}}]})
    return {"meta": {"wall_s": 1.0}, "results": results}


def pfc_doc(busbw=None, msg_ms=(), pauses=0, share=0.0, ports=0, headroom_drops=0):
    """A run document of a run with PFC: ``doc``'s figures and the runner's ``switch_pfc`` summary."""
    d = doc(busbw=busbw, msg_ms=msg_ms)
    pfc = {"pauses": pauses, "paused_s": share, "ports_paused": ports, "paused_share_max": share,
           "headroom_drops": headroom_drops, "lossy_drops": 0,
           "per_port": {"p0s0-eth1": {"pauses": pauses, "paused_share": share}} if pauses else {}}
    for r in d["results"]:
        r["switch_pfc"] = pfc
    d["meta"]["pfc"] = "on"
    return d


def test_the_victim_workload_is_two_jobs_and_brings_its_elephant_job_alone():
    jobs = jobspec.parse(compare.WORKLOADS["victim"])
    assert [j.collective for j in jobs] == ["all_reduce", "incast"]
    assert compare.parse_workloads("victim") == ("victim", "allreduce")
    assert compare.parse_workloads("allreduce,victim") == ("allreduce", "victim")


def test_pfc_aware_is_a_setting_one_names_and_not_a_default_one():
    assert compare.parse_settings("low,pfc-aware") == ("low", "pfc-aware")
    assert "pfc-aware" not in compare.SETTINGS
    assert compare.is_policy("pfc-aware") and not compare.is_static("pfc-aware")


def test_summarize_takes_the_pfc_figures_of_a_run_with_pfc():
    s = compare.summarize(pfc_doc(busbw=0.002, pauses=40, share=0.3, ports=2, headroom_drops=1))
    assert (s["pauses"], s["paused_share_max"], s["ports_paused"], s["headroom_drops"]) == (40, 0.3, 2, 1)
    assert s["paused_ports"] == {"p0s0-eth1": 0.3}


def test_summarize_has_no_pfc_figures_for_a_run_without_pfc():
    s = compare.summarize(doc(busbw=0.002))
    assert s["pauses"] is None and s["headroom_drops"] is None


def test_run_comparison_runs_pfc_aware_as_its_own_policy_beside_dynamic():
    calls = []

    def run(plan, emu, *, progress=True, say=None, ecn_thresholds=None, ecn_policy=None):
        calls.append((ecn_thresholds, ecn_policy))
        return pfc_doc(busbw=0.001)
    compare.run_comparison(FakeEmu(), FakePlan(), ["allreduce"], ["dynamic", "pfc-aware"], 1, say=lambda m: None,
                           run=run)
    assert sorted(calls) == [("default", "dynamic"), ("default", "pfc-aware")]


def records(workload, setting, busbws, **pfc):
    return [{"rep": k, "workload": workload, "setting": setting,
             "summary": compare.summarize(pfc_doc(busbw=b, msg_ms=[5.0], **pfc))} for k, b in enumerate(busbws)]


def test_victim_slowdown_is_its_busbw_over_the_elephant_job_alone_under_the_same_setting():
    agg = compare.aggregate(records("victim", "low", [0.5, 0.6, 0.7]) + records("allreduce", "low", [1.0, 1.0, 1.0])
                            + records("victim", "high", [0.9]) + records("allreduce", "high", [0.9]))
    slow = compare.victim_slowdown(agg)["victim"]
    assert slow["low"]["ratio"] == pytest.approx(0.6)
    assert not slow["low"]["within_spread"]
    assert slow["high"]["ratio"] == pytest.approx(1.0)


def test_with_and_without_pfc_merge_into_one_comparison_with_the_difference_per_setting():
    on = {"meta": {"workloads": {"victim": "x", "allreduce": "y"}, "settings": ["low"]},
          "records": records("victim", "low", [0.4]) + records("allreduce", "low", [1.0])}
    off = {"meta": {"workloads": {"victim": "x", "allreduce": "y"}, "settings": ["low"]},
           "records": records("victim", "low", [0.8]) + records("allreduce", "low", [1.0])}
    comp = compare.merge([compare.tag_pfc(on, True), compare.tag_pfc(off, False)])
    agg = comp["aggregate"]
    assert set(agg) == {"victim@pfc-on", "allreduce@pfc-on", "victim@pfc-off", "allreduce@pfc-off"}
    assert compare.pfc_difference(agg)["victim"]["low"]["busbw_gbs"] == pytest.approx(0.5)
    assert compare.victim_slowdown(agg)["victim@pfc-on"]["low"]["ratio"] == pytest.approx(0.4)
    assert compare.victim_slowdown(agg)["victim@pfc-off"]["low"]["ratio"] == pytest.approx(0.8)


def test_the_report_shows_pfc_figures_the_victims_slowdown_and_the_difference_pfc_makes():
    on = {"meta": {"workloads": {"victim": "x"}, "settings": ["low"]},
          "records": records("victim", "low", [0.4], pauses=12, share=0.25, ports=3)
          + records("allreduce", "low", [1.0])}
    off = {"meta": {"workloads": {"victim": "x"}, "settings": ["low"]},
           "records": records("victim", "low", [0.8]) + records("allreduce", "low", [1.0])}
    text = compare.format_report(compare.merge([compare.tag_pfc(on, True), compare.tag_pfc(off, False)])["aggregate"],
                                 ["low"])
    assert "priority flow control" in text and "0.250" in text
    assert "victim@pfc-on" in text and "0.400" in text
    assert "the difference PFC makes" in text


def test_interference_and_reach_find_a_mixs_parts_under_the_same_pfc_tag():
    assert compare.part_of("mix@pfc-on", "p99_us") == "incast@pfc-on"
    assert compare.part_of("victim", "busbw_gbs") == "allreduce"
    assert compare.part_of("incast", "busbw_gbs") is None


def test_pause_over_time_is_the_largest_paused_share_of_any_port_per_sample():
    run = {"telemetry": {"ports": {"p0s0:1": {"t": [0.0, 0.2, 0.4], "paused_fraction": [0.0, 0.3, None]},
                                   "p0s1:1": {"t": [0.0, 0.2, 0.4], "paused_fraction": [0.1, 0.2, 0.05]}}}}
    assert compare.pause_series(run) == ([0.0, 0.2, 0.4], [0.1, 0.3, 0.05])
    assert compare.pause_series({"telemetry": {"ports": {"p0s0:1": {"t": [0.0], "kmin": [1]}}}}) == ([], [])


def test_the_plot_has_a_pause_column_where_the_runs_had_pfc(tmp_path):
    pytest.importorskip("matplotlib")
    run = pfc_doc(busbw=0.002, pauses=3, share=0.1)
    run["telemetry"] = {"ports": {"p0s0:1": {"t": [0.0, 0.2], "paused_fraction": [0.0, 0.4], "kmin": [1, 1]}}}
    path = compare.plot_comparison({("victim@pfc-on", "low"): run}, tmp_path / "plot.png")
    assert path.is_file() and path.stat().st_size > 0
