"""The ECN comparison's pure part on synthetic run documents: order, figures, spread, ratios,
tables, and a setting that is not available."""
import json

import pytest
from support.compare_stand_ins import FakeEmu, FakePlan

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import compare_ecn as compare


def doc(busbw=None, msg_ms=(), queue=0.0, ce=0.0, drops=0, wall=1.0, wrong=0, line=None):
    """A run document as experiment.run makes it, with only what the comparison reads."""
    ecn = {"queue_p99_bytes": queue, "ce_fraction": ce, "drops": drops,
           "queue_samples": {"interval_s": 0.1, "t": [100.0, 100.1, 100.2], "ports": {"a": [0, 3000, 1000],
                                                                                      "b": [500, 0, 2000]}}}
    results = []
    if busbw is not None:
        results.append({"collective": "all_reduce", "avg_busbw_gbs": busbw, "switch_ecn": ecn, "line_rate_bps": line,
                        "rows": [{"size": 1, "oop": {"wrong": wrong}, "ip": None}]})
    if msg_ms:
        results.append({"collective": "incast", "switch_ecn": ecn,
                        "rows": [{"size": 1, "ip": None,
                                  "oop": {"wrong": 0, "message_times_s": [m / 1e3 for m in msg_ms]}}]})
    return {"meta": {"wall_s": wall, "ecn": {"setting": "low", "by_rate_mbps": {"10": {"kmin": 1514}}}},
            "results": results}


def test_schedule_interleaves_settings_within_each_repetition_and_rotates_them():
    order = compare.schedule(["incast", "mix"], ["low", "high", "dynamic"], 2)
    assert order[:6] == [(0, "incast", "low"), (0, "incast", "high"), (0, "incast", "dynamic"),
                         (0, "mix", "low"), (0, "mix", "high"), (0, "mix", "dynamic")]
    assert [s for _, w, s in order[6:9]] == ["high", "dynamic", "low"]
    assert len(order) == 12


def test_schedule_needs_a_repetition():
    with pytest.raises(UserError, match="--repeat must be at least 1"):
        compare.schedule(["incast"], ["low"], 0)


def test_workloads_and_settings_parse_with_one_line_per_mistake():
    assert compare.parse_workloads("incast, all_reduce,mix,incast") == ("incast", "allreduce", "mix")
    with pytest.raises(UserError, match="unknown workload 'storm'"):
        compare.parse_workloads("incast,storm")
    with pytest.raises(UserError, match="unknown ECN setting 'medium'"):
        compare.parse_settings("low,medium")


def test_settings_take_static_thresholds_of_ones_own_beside_the_presets():
    assert compare.parse_settings("high, 8k:128K:0.01,dynamic,8K:128K:0.01") == ("high", "8K:128K:0.01", "dynamic")
    assert compare.parse_settings("4K:64K:0.2") == ("4K:64K:0.2",)
    assert compare.is_static("8K:128K:0.01") and not compare.is_static("dynamic")
    assert compare.thresholds_arg("8K:128K:0.01") == "8K,128K,0.01"


@pytest.mark.parametrize("text,line", [
    ("high,8K:128K", "--settings: '8K:128K' is not KMIN:KMAX:PMAX"),
    ("64K:8K:0.1", "--settings: 64K:8K:0.1: ECN thresholds need 0 <= kmin <= kmax"),
    ("8K:LOTS:0.1", "--settings: 8K:LOTS:0.1: kmax 'LOTS' is not a size in bytes"),
    ("8K:64K:2", "--settings: 8K:64K:2: ECN pmax must be between 0 and 1"),
    ("8K:64K:0.1,medium", "--settings: unknown ECN setting 'medium'"),
])
def test_a_wrong_setting_of_ones_own_is_one_line(text, line):
    with pytest.raises(UserError) as exc:
        compare.parse_settings(text)
    assert str(exc.value).startswith(line)


def test_a_setting_of_ones_own_counts_as_a_static_for_the_best():
    per = {"high": {"busbw_gbs": {"median": 0.02}, "p99_us": {"median": 30_000}},
           "8K:128K:0.01": {"busbw_gbs": {"median": 0.019}, "p99_us": {"median": 15_000}},
           "dynamic": {"busbw_gbs": {"median": 0.03}, "p99_us": {"median": 10_000}}}
    assert compare.best_static(per, "p99_us") == ("8K:128K:0.01", 15_000)
    assert compare.best_static(per, "busbw_gbs") == ("high", 0.02)


def test_run_comparison_passes_a_setting_of_ones_own_as_thresholds():
    seen = []

    def run(plan, emu, progress=False, say=None, ecn_thresholds=None, ecn_policy="static"):
        seen.append(ecn_thresholds)
        return doc(busbw=0.002)

    comp = compare.run_comparison(FakeEmu(), FakePlan(), ["allreduce"], ["8K:128K:0.01"], 1, say=lambda m: None,
                                  run=run)
    assert seen == ["8K,128K,0.01"]
    assert "8K:128K:0.01" in compare.format_report(comp["aggregate"], ["8K:128K:0.01"])


def test_every_workload_is_valid_jobs_syntax():
    from hpnlab.fabric.workload import jobspec
    for spec in compare.WORKLOADS.values():
        assert jobspec.parse(spec)


def test_summarize_reads_busbw_pooled_message_percentiles_and_switch_figures():
    s = compare.summarize(doc(busbw=0.002, msg_ms=range(1, 101), queue=9000.0, ce=0.25, drops=3, wall=4.0))
    assert s["busbw_gbs"] == 0.002
    assert s["messages"] == 100
    assert s["p50_us"] == pytest.approx(50_500)
    assert s["p99_us"] == pytest.approx(99_010)
    assert (s["queue_p99_bytes"], s["ce_fraction"], s["drops"], s["wall_s"]) == (9000.0, 0.25, 3, 4.0)


def test_summarize_takes_busbw_from_every_job_but_the_incast():
    d = doc(busbw=0.002, msg_ms=[1.0])
    d["results"][0]["collective"] = "all_to_all"
    assert compare.summarize(d)["busbw_gbs"] == 0.002


def test_summarize_without_an_incast_has_no_message_times():
    s = compare.summarize(doc(busbw=0.001))
    assert s["p99_us"] is None and s["messages"] == 0


def _records():
    recs = []
    for rep in range(3):
        for setting, bw, p99 in (("low", 0.0010, 30), ("high", 0.0020, 90), ("dcqcn", 0.0012, 20),
                                 ("default", 0.0018, 50)):
            recs.append({"rep": rep, "workload": "mix", "setting": setting,
                         "summary": compare.summarize(doc(busbw=bw + rep * 1e-5, msg_ms=[p99 / 2, p99]))})
        recs.append({"rep": rep, "workload": "mix", "setting": "dynamic", "unavailable": compare.NOT_MERGED})
    return recs


def test_aggregate_gives_each_setting_its_spread_and_keeps_unavailable_ones():
    agg = compare.aggregate(_records())
    assert agg["mix"]["high"]["busbw_gbs"]["n"] == 3
    assert agg["mix"]["high"]["busbw_gbs"]["min"] == pytest.approx(0.0020)
    assert agg["mix"]["high"]["busbw_gbs"]["max"] == pytest.approx(0.00202)
    assert agg["mix"]["dynamic"] == {"unavailable": compare.NOT_MERGED}


def test_best_static_is_highest_busbw_and_lowest_completion():
    agg = compare.aggregate(_records())
    assert (compare.best_static(agg["mix"], "busbw_gbs") or ("",))[0] == "high"
    assert (compare.best_static(agg["mix"], "p99_us") or ("",))[0] == "dcqcn"


def test_ratios_are_to_the_best_static_setting():
    r = compare.ratios(compare.aggregate(_records()))["mix"]
    assert r["high"]["busbw_gbs"] == pytest.approx(1.0)
    assert r["low"]["busbw_gbs"] == pytest.approx(0.00101 / 0.00201)
    # p99 of two messages (p/2, p) is p/2 + 0.99 p/2 (numpy's linear percentile)
    assert r["high"]["p99_us"] == pytest.approx((45 + 0.99 * 45) / (10 + 0.99 * 10))
    assert r["dynamic"] == {"busbw_gbs": None, "p50_us": None, "p99_us": None}


def test_the_report_shows_every_setting_its_spread_the_ratios_and_what_is_missing():
    text = compare.format_report(compare.aggregate(_records()))
    assert "## workload mix" in text
    assert "dynamic" in text and compare.NOT_MERGED in text
    assert "16.08 [16.00-16.16]" in text       # high's busbw in Mbit/s: median [min-max]
    assert "## ratio to the best static setting" in text


def test_wrong_elements_are_shown():
    recs = [{"rep": 0, "workload": "allreduce", "setting": "low",
             "summary": compare.summarize(doc(busbw=0.001, wrong=7))}]
    assert "WRONG ELEMENTS: 7" in compare.format_report(compare.aggregate(recs))


def test_queue_series_is_the_largest_port_queue_per_sample():
    ts, q = compare.queue_series(doc(busbw=0.001))
    assert ts == pytest.approx([0.0, 0.1, 0.2]) and q == [500, 3000, 2000]


def test_threshold_series_of_a_dynamic_run_reads_the_telemetry_ports_that_moved():
    d = doc(busbw=0.001)
    d["meta"]["ecn_policy"] = "dynamic"
    d["telemetry"] = {"ports": {"s1:1": {"t": [0.0, 0.2, 0.4], "kmin": [6000, 6000, 6000]},
                                "s1:2": {"t": [0.0, 0.2, 0.4], "kmin": [6000, 3000, 1500]}}}
    assert compare.threshold_series(d, max_ports=1) == [("s1:2", [0.0, 0.2, 0.4], [6000.0, 3000.0, 1500.0])]


def test_threshold_series_of_a_static_run_ignores_the_telemetry():
    d = doc(busbw=0.001)
    d["meta"]["ecn_policy"] = "static"
    d["telemetry"] = {"ports": {"s1:1": {"t": [0.0], "kmin": [6000]}}}
    assert compare.threshold_series(d)[0][0] == "Kmin at 10 Mbit/s"


def test_threshold_series_of_a_static_run_is_its_flat_kmin():
    (label, ts, k) = compare.threshold_series(doc(busbw=0.001))[0]
    assert label == "Kmin at 10 Mbit/s" and k == [1514, 1514] and ts == pytest.approx([0.0, 0.2])


def test_dynamic_is_detected_from_the_run_signature():
    def old(plan, where, *, progress=True, say=None, ecn_thresholds=None):
        pass

    def new(plan, where, *, ecn_thresholds=None, ecn_policy=None):
        pass
    assert not compare.dynamic_supported(old) and compare.dynamic_supported(new)


def test_run_comparison_marks_dynamic_unavailable_and_passes_each_static_setting():
    calls = []

    def run(plan, emu, *, progress=True, say=None, ecn_thresholds=None):
        calls.append(ecn_thresholds)
        return doc(busbw=0.001, msg_ms=[5, 6])
    comp = compare.run_comparison(FakeEmu(), FakePlan(), ["incast"], ["low", "dynamic", "dcqcn"], 2,
                                  say=lambda m: None, run=run)
    assert calls == ["low", "dcqcn", "dcqcn", "low"]
    assert comp["aggregate"]["incast"]["dynamic"] == {"unavailable": compare.NOT_MERGED}
    assert comp["aggregate"]["incast"]["low"]["runs"] == 2


def test_run_comparison_passes_the_policy_for_dynamic_when_the_run_takes_it():
    calls = []

    def run(plan, emu, *, progress=True, say=None, ecn_thresholds=None, ecn_policy=None):
        calls.append((ecn_thresholds, ecn_policy))
        return doc(busbw=0.001)
    compare.run_comparison(FakeEmu(), FakePlan(), ["allreduce"], ["dynamic"], 1, say=lambda m: None, run=run)
    assert calls == [("default", "dynamic")]


def test_the_dynamic_setting_runs_a_policy_of_ones_own_and_records_which():
    calls = []

    def run(plan, emu, *, progress=True, say=None, ecn_thresholds=None, ecn_policy=None):
        calls.append((ecn_thresholds, ecn_policy))
        return doc(busbw=0.001)
    comp = compare.run_comparison(FakeEmu(), FakePlan(), ["allreduce"], ["low", "dynamic"], 1, say=lambda m: None,
                                  run=run, dynamic_policy="mine.py:Mine")
    assert sorted(calls, key=str) == sorted([("low", None), ("default", "mine.py:Mine")], key=str)
    assert comp["meta"]["dynamic_policy"] == "mine.py:Mine"


def test_a_failed_run_is_reported_and_the_others_kept():
    n = [0]

    def run(plan, emu, *, progress=True, say=None, ecn_thresholds=None):
        n[0] += 1
        if n[0] == 2:
            raise UserError("rank 3 (h7) died")
        return doc(busbw=0.001)
    comp = compare.run_comparison(FakeEmu(), FakePlan(), ["allreduce"], ["low"], 3, say=lambda m: None, run=run)
    f = comp["aggregate"]["allreduce"]["low"]
    assert f["runs"] == 2 and f["failed"] == ["failed: rank 3 (h7) died"]
    assert "one repetition failed: rank 3 (h7) died" in compare.format_report(comp["aggregate"])


def test_the_command_writes_json_then_tables_and_plots(monkeypatch, tmp_path, capsys):
    """`hpnlab run --compare ecn` end to end with the emulation and the runs replaced."""
    import hpnlab.fabric.emulation as emulation
    from hpnlab.cli import main

    class Emu(FakeEmu):
        caps = None

        def __init__(self, scenario, options=None, **kw):
            from hpnlab.fabric.scenario import graph
            self.graph = graph.build(scenario)
            self.metadata: dict = {}
            self.timings: dict = {}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def run(plan, emu, *, progress=True, say=None, ecn_thresholds=None):
        return doc(busbw=0.001, msg_ms=[4, 8])
    real = compare.run_comparison
    monkeypatch.setattr(emulation, "Emulation", Emu)
    monkeypatch.setattr(compare, "run_comparison", lambda *a, **kw: real(*a, **kw, run=run))
    rc = main.main(["run", "mini-hpn", "--compare", "ecn", "--repeat", "2", "--workloads", "incast",
                    "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["meta"]["repeat"] == 2 and saved["meta"]["command"]
    assert saved["aggregate"]["incast"]["dynamic"] == {"unavailable": compare.NOT_MERGED}
    assert "## workload incast" in out and "## ratio to the best static" in out
    assert (tmp_path / "ecn-queues-thresholds.png").is_file() and (tmp_path / "ecn-figures.png").is_file()


def test_pieces_merge_into_one_comparison():
    def piece(workload, setting, busbw):
        recs = [{"rep": r, "workload": workload, "setting": setting, "summary": compare.summarize(doc(busbw=b))}
                for r, b in enumerate(busbw)]
        return {"meta": {"settings": [setting], "workloads": {workload: "x"}, "wall_s": 10.0}, "records": recs}
    merged = compare.merge([piece("allreduce", "low", [0.001, 0.002]), piece("allreduce", "high", [0.004])])
    assert merged["meta"]["settings"] == ["low", "high"] and merged["meta"]["wall_s"] == 20.0
    assert merged["aggregate"]["allreduce"]["low"]["busbw_gbs"]["n"] == 2
    assert merged["ratios"]["allreduce"]["low"]["busbw_gbs"] == pytest.approx(0.0015 / 0.004)
    assert [r["piece"] for r in merged["records"]] == [0, 0, 1]


def test_repetition_times_add_up_each_repetitions_runs():
    recs: list[dict] = [{"rep": 0, "elapsed_s": 2.0}, {"rep": 0, "elapsed_s": 3.0}, {"rep": 1, "elapsed_s": 4.0},
            {"rep": 1, "unavailable": compare.NOT_MERGED}, {"rep": 0, "piece": 1, "elapsed_s": 1.5}]
    assert compare.repetition_times(recs) == {0: 5.0, 1: 4.0, 2: 1.5}


def test_a_spread_can_be_centred_on_its_mean():
    from hpnlab.fabric.stats import spread_text
    assert spread_text({"mean": 1.5, "min": 1.0, "max": 2.5, "n": 3}, "{:.2f}", centre="mean") == "1.50 [1.00-2.50]"


def test_median_range_prints_raw_values():
    from hpnlab.fabric.stats import median_range
    assert median_range([0.002, 0.001, 0.004], "{:.1f}", scale=1000) == "2.0 [1.0-4.0]"
    assert median_range([]) == "-"


def _agg(cells):
    """An aggregate from {(workload, setting): (busbw, p99_ms)} medians, one repetition each."""
    recs = [{"rep": 0, "workload": w, "setting": s,
             "summary": compare.summarize(doc(busbw=bw, msg_ms=[p99] * 3 if p99 else ()))}
            for (w, s), (bw, p99) in cells.items()]
    return compare.aggregate(recs)


def test_a_mix_target_needs_a_win_of_a_fifth_against_every_static_setting():
    agg = _agg({("mix", "high"): (0.0040, 30), ("mix", "dcqcn"): (0.0030, 14), ("mix", "dynamic"): (0.0039, 14)})
    v = compare.targets(agg)["mix"]
    rule = {c["against"]: c for c in v["checks"] if c["check"].startswith("mix")}
    assert rule["high"]["met"] and rule["high"]["won"] == "p99_us"          # p99 0.47x at busbw 0.975x
    assert rule["dcqcn"]["met"] and rule["dcqcn"]["won"] == "busbw_gbs"     # busbw 1.3x at the same p99
    assert v["met"]


def test_a_mix_win_that_loses_more_than_five_percent_on_the_other_figure_is_not_met():
    agg = _agg({("mix", "high"): (0.0040, 30), ("mix", "dynamic"): (0.0037, 14)})   # p99 0.47x, busbw 0.925x
    v = compare.targets(agg)["mix"]
    assert not v["met"]
    assert [c["met"] for c in v["checks"] if c["against"] == "high" and c["check"].startswith("mix")] == [False]


def test_the_per_workload_targets_are_p99_at_most_and_busbw_at_least_095_of_the_best_static():
    agg = _agg({("incast", "high"): (None, 10), ("incast", "low"): (None, 20), ("incast", "dynamic"): (None, 10.5),
                ("allreduce", "high"): (0.0040, None), ("allreduce", "dynamic"): (0.0038, None)})
    t = compare.targets(agg)
    (p99,) = t["incast"]["checks"]
    assert (p99["against"], round(p99["value"], 3), p99["met"]) == ("high", 1.05, False)
    (bw,) = t["allreduce"]["checks"]
    assert (bw["against"], round(bw["value"], 3), bw["met"]) == ("high", 0.95, True)


def test_a_workload_where_dynamic_did_not_run_has_no_verdict():
    recs = _records()
    t = compare.targets(compare.aggregate(recs))
    assert t["mix"] == {"unavailable": compare.NOT_MERGED}
    assert compare.format_targets(compare.aggregate(recs)) == ""


def test_a_verdict_says_when_the_repetitions_could_turn_it():
    recs = [{"rep": r, "workload": "allreduce", "setting": s, "summary": compare.summarize(doc(busbw=bw))}
            for r, (hi, dyn) in enumerate(((0.0040, 0.0035), (0.0041, 0.0041)))
            for s, bw in (("high", hi), ("dynamic", dyn))]
    (bw,) = compare.targets(compare.aggregate(recs))["allreduce"]["checks"]
    assert bw["within_spread"]                          # dynamic's [0.0035, 0.0041] overlaps high's [0.0040, 0.0041]


def test_interference_is_the_mix_under_its_best_static_over_the_best_with_the_job_alone():
    agg = _agg({("mix", "high"): (0.0038, 12), ("mix", "low"): (0.0030, 11),
                ("allreduce", "high"): (0.0040, None), ("allreduce", "dynamic"): (0.0039, None),
                ("incast", "high"): (None, 10), ("incast", "dynamic"): (None, 9)})
    i = compare.interference(agg)["mix"]
    assert i["busbw_gbs"]["ratio"] == pytest.approx(0.95) and i["busbw_gbs"]["alone_setting"] == "high"
    assert i["p99_us"]["ratio"] == pytest.approx(11 / 9) and i["p99_us"]["mix_setting"] == "low"
    assert i["p99_us"]["alone_setting"] == "dynamic"


def test_interference_gives_the_mix_busbw_as_a_fraction_of_the_elephants_line_rate():
    recs = [{"rep": 0, "workload": w, "setting": "high",
             "summary": compare.summarize(doc(busbw=bw, msg_ms=[5], line=40e6))}
            for w, bw in (("mix", 0.0045), ("allreduce", 0.0046))]
    v = compare.interference(compare.aggregate(recs))["mix"]["busbw_gbs"]
    assert v["of_line"] == pytest.approx(0.0045 * 8e9 / 40e6)          # 36 of 40 Mbit/s
    assert "0.90 of the line rate" in compare.format_targets(compare.aggregate(recs), candidate="high")


def test_the_report_ends_with_the_targets_and_the_interference():
    agg = _agg({("mix", "high"): (0.0040, 30), ("mix", "dynamic"): (0.0040, 14),
                ("incast", "high"): (None, 10), ("incast", "dynamic"): (None, 12)})
    text = compare.format_report(agg)
    assert "## targets for dynamic" in text
    assert "mix        MET" in text and "incast     not met" in text
    assert "met  mix rule against high: busbw 1.00x, p99 0.47x: wins on p99" in text
    assert ("mix: its message p99 under its best static (high) is 3.00x the best with the job alone "
            "(incast, high)") in text


def test_the_saved_comparison_carries_the_targets(tmp_path):
    agg = _agg({("mix", "high"): (0.0040, 30), ("mix", "dynamic"): (0.0040, 14)})
    comp = {"meta": {"settings": ["high", "dynamic"]}, "records": [], "aggregate": agg}
    compare.save(comp, tmp_path, say=lambda m: None)
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["targets"]["mix"]["met"] is True and "interference" in saved


def test_a_comparison_read_again_takes_its_figures_from_the_run_documents():
    old = {"meta": {"settings": ["high"]}, "aggregate": {},
           "records": [{"rep": 0, "workload": "allreduce", "setting": "high", "summary": {"busbw_gbs": 1.0},
                        "doc": doc(busbw=0.004, line=40e6)},
                       {"rep": 1, "workload": "allreduce", "setting": "high",
                        "summary": compare.summarize(doc(busbw=0.002))}]}
    agg = compare.resummarize(old)["aggregate"]["allreduce"]["high"]
    assert (agg["busbw_gbs"]["min"], agg["busbw_gbs"]["max"], agg["line_bps"]) == (0.002, 0.004, 40e6)


def _line_agg(cells, line=40e6):
    """An aggregate from {(workload, setting): [(busbw, p99_ms), ...]} repetitions, elephants at ``line``."""
    recs = [{"rep": r, "workload": w, "setting": s,
             "summary": compare.summarize(doc(busbw=bw, msg_ms=[p99] * 3 if p99 else (), line=line))}
            for (w, s), reps in cells.items() for r, (bw, p99) in enumerate(reps)]
    return compare.aggregate(recs)


def test_a_mix_win_is_out_of_reach_when_busbw_is_near_the_line_and_p99_near_the_job_alone():
    # mix under default: 38 of 40 Mbit/s, p99 13 ms; the incast alone was never faster than 11 ms
    agg = _line_agg({("mix", "default"): [(0.00475, 13)] * 3, ("mix", "low"): [(0.0035, 19)] * 3,
                     ("incast", "high"): [(None, 11.5), (None, 11.0)], ("incast", "dynamic"): [(None, 12)]})
    r = compare.reach(agg)["mix"]
    assert r["out_of_reach"] == ["default"]
    d = r["against"]["default"]
    assert d["busbw_needed_bps"] == pytest.approx(0.00475 * 1.2 * 8e9) and d["busbw_reachable"] is False
    assert d["p99_needed_us"] == pytest.approx(13e3 * 0.8) and d["p99_floor_us"] == pytest.approx(11e3)
    assert d["p99_floor_from"] == "incast, high"            # the fastest repetition, not the median
    assert r["against"]["low"]["busbw_reachable"] is True   # 1.2 x 28 Mbit/s fits under 40


def test_a_mix_win_is_not_excluded_while_either_figure_has_room():
    agg = _line_agg({("mix", "default"): [(0.00475, 20)], ("incast", "high"): [(None, 11)]})
    r = compare.reach(agg)["mix"]
    assert r["out_of_reach"] == [] and r["against"]["default"]["p99_reachable"] is True
    assert "mix: a 20% win against every static is not excluded by the line rate or the job alone" in \
        compare.format_targets(_line_agg({("mix", "default"): [(0.00475, 20)], ("mix", "dynamic"): [(0.00475, 20)],
                                          ("incast", "high"): [(None, 11)]}))


def test_a_mix_whose_part_did_not_run_alone_has_no_p99_bound():
    r = compare.reach(_line_agg({("shared", "high"): [(0.00475, 20)]}))["shared"]
    assert r["against"]["high"]["p99_reachable"] is None and r["out_of_reach"] == []


def test_the_report_says_which_static_puts_the_win_out_of_reach():
    agg = _line_agg({("mix", "default"): [(0.00475, 13)], ("mix", "dynamic"): [(0.00475, 14)],
                     ("incast", "high"): [(None, 11)]})
    assert ("mix: a 20% win against default is out of reach for any policy: busbw would need 45.6 Mbit/s, above the "
            "line rate (40.0); p99 would need 10.40 ms, below the fastest with the job alone (11.00 ms, incast, high)"
            ) in compare.format_targets(agg)
    assert "reach" in compare.merge([{"meta": {"settings": ["default"], "workloads": {}}, "records": []}])


def test_shareds_jobs_alone_run_on_the_hosts_they_have_in_shared():
    from hpnlab.fabric.experiments.runner import Plan
    from hpnlab.fabric.scenario import graph, spec
    g = graph.build(spec.load("mini-hpn"))
    base = Plan(transports="roce", entropies="spray")

    def labels(workload):
        [jobs] = base.replace(job_specs=compare.WORKLOADS[workload], jobs=1).jobs_on(g).values()
        return [(j.collective, list(j.labels or [])) for j in jobs]

    (a2a, a2a_hosts), (inc, inc_hosts) = labels("shared")
    assert (a2a, inc) == ("all_to_all", "incast") and a2a_hosts == inc_hosts      # on=1: the same hosts
    assert labels("alltoall") == [("all_to_all", a2a_hosts)]
    assert labels("short") == [("incast", inc_hosts)]                              # the same root: rank 0's host
    assert compare.PARTS["shared"] == {"busbw_gbs": "alltoall", "p99_us": "short"}
    assert set(compare.DEFAULT_WORKLOADS) == {"incast", "allreduce", "mix", "shared"}


def test_every_workload_places_on_mini_hpn_with_each_job_on_hosts_of_its_own_unless_on():
    from hpnlab.fabric.experiments.runner import Plan
    from hpnlab.fabric.scenario import graph, spec
    g = graph.build(spec.load("mini-hpn"))
    base = Plan(transports="roce", entropies="spray")
    for workload, specs in compare.WORKLOADS.items():
        [jobs] = base.replace(job_specs=specs, jobs=1).jobs_on(g).values()
        hosts = [set(j.labels or []) for j in jobs]
        assert len(jobs) == specs.count(";") + 1, workload
        if ",on=" not in specs:
            assert sum(map(len, hosts)) == len(set().union(*hosts)), workload       # disjoint
    [overflow] = base.replace(job_specs=compare.WORKLOADS["overflow"], jobs=1).jobs_on(g).values()
    assert [(j.collective, j.nranks) for j in overflow] == [("all_reduce", 4), ("incast", 8)]
