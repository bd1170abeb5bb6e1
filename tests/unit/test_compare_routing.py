"""The routing comparison's figures (fabric/experiments/compare_routing.py), on made-up runs."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpnlab.fabric.experiments import compare_routing as cr
from hpnlab.fabric.experiments.runner import Plan
from hpnlab.fabric.scenario import graph, spec


def test_imbalance_is_max_over_mean_of_the_uplinks_bytes():
    assert cr.imbalance([100, 100, 100, 100]) == 1.0
    assert cr.imbalance([300, 100, 0, 0]) == 3.0
    assert cr.imbalance([0, 0]) is None


def test_every_leaf_uplink_is_listed_once_by_its_leaf_side_interface():
    g = graph.build(spec.load("mini-hpn"))
    ups = cr.uplinks(g)
    leaves = [n for n in graph.switches(g) if g.nodes[n]["tier"] == 1]
    assert len(ups) == sum(1 for lf in leaves for n in g.adj[lf] if g.nodes[n]["tier"] == 2)
    assert all(intf.startswith(leaf + "-") for leaf, intf in ups)


def _run(fabric, mode, rep, busbw, time_us=100.0):
    return {"fabric": fabric, "collective": "all_to_all", "mode": mode, "rep": rep, "busbw_gbs": busbw,
            "time_us": time_us, "uplink_imbalance": 1.5, "max_reorder": 3, "retransmissions": 2, "wrong": 0,
            "exactly_once": True}


def test_ratios_to_ecmp_are_taken_repetition_by_repetition():
    runs = [_run("symmetric", "ecmp", 0, 1.0), _run("symmetric", "ecmp", 1, 2.0),
            _run("symmetric", "adaptive", 0, 1.5), _run("symmetric", "adaptive", 1, 2.0)]
    rows = {r["mode"]: r for r in cr.summarize(runs)}
    q = rows["adaptive"]["busbw_ratio_to_ecmp"]
    assert (q["min"], q["max"], q["mean"]) == (1.0, 1.5, 1.25)      # not mean(busbw) / mean(busbw) = 1.1667
    assert rows["ecmp"]["busbw_ratio_to_ecmp"]["mean"] == 1.0
    assert list(rows) == ["ecmp", "adaptive"]
    assert len(cr.table(cr.summarize(runs))) == 3


def test_a_lost_byte_anywhere_shows_in_the_summary():
    runs = [_run("symmetric", "ecmp", 0, 1.0), dict(_run("symmetric", "spray", 0, 1.0), exactly_once=False)]
    rows = {r["mode"]: r for r in cr.summarize(runs)}
    assert rows["ecmp"]["exactly_once"] and not rows["spray"]["exactly_once"]


@pytest.mark.parametrize("reps", [0, -1])
def test_no_repetitions_is_one_clear_error(reps):
    with pytest.raises(cr.UserError, match="--repeat"):
        cr.compare(None, Plan(), reps=reps)


def test_adaptive_with_weighted_switches_is_a_row_of_its_own_after_adaptive():
    runs = [_run("symmetric", m, 0, 1.0) for m in ("adaptive+w", "adaptive", "ecmp")]
    rows = cr.summarize(runs)
    assert [r["mode"] for r in rows] == ["ecmp", "adaptive", "adaptive+w"]
    assert cr.MODE_SETTINGS["adaptive+w"] == ("adaptive", "weighted")
    assert all(cr.MODE_SETTINGS[m][1] == "ecmp" for m in cr.MODES if m != "adaptive+w")
    assert "adaptive+w" in cr.table(rows)[-1]


def test_an_unknown_routing_mode_is_one_clear_error():
    with pytest.raises(cr.UserError, match="unknown routing mode"):
        cr.compare(None, Plan(), modes=("ecmp", "weighted-spray"))


def test_a_cell_is_sized_to_last_about_a_second_at_line_rate():
    from hpnlab.fabric.workload.collectives import busbw_factor
    for coll in cr.COLLECTIVES:
        size = cr.cell_bytes(coll, 16, host_mbps=15.0, planes=2)
        seconds = size * busbw_factor(coll, 16) / (2 * 15e6 / 8)
        assert size & (size - 1) == 0 and 0.7 * cr.CELL_S <= seconds <= 1.42 * cr.CELL_S


def test_only_the_weights_records_of_the_cells_time_are_its_weight_changes():
    lines = ['{"kind":"sample","t":5.0}', '{"kind":"weights","t":4.0,"switch":"p0l0"}',
             '{"kind":"weights","t":6.0,"switch":"p0l1"}', '{"kind":"weights","t":9.5,"switch":"p0l2"}',
             '{"kind":"weights","t":7.0,"swi']
    assert [c["switch"] for c in cr.weight_changes(lines, 5.0, 9.0)] == ["p0l1"]


def _hosts(g, ranks):
    [[job]] = Plan(ranks=ranks, collectives="permutation", entropies="ecmp", sizes="1M",
                   perm="random").jobs_on(g).values()
    return job.labels


def test_the_model_predicts_no_gain_where_a_leafs_ranks_cannot_fill_its_uplinks():
    g = graph.build(spec.load("mini-hpn"))       # 8 ranks: 2 per leaf, 2 uplinks of twice the host rate
    pred = cr.predicted(g, "permutation", 1 << 20, _hosts(g, 8), cr.MODES)
    assert all(p["ratio_to_ecmp"] == pytest.approx(1.0) for p in pred.values())


def test_the_model_predicts_spraying_beats_hashing_when_four_ranks_share_a_leafs_two_uplinks():
    g = graph.build(spec.load("mini-hpn"))
    pred = cr.predicted(g, "permutation", 1 << 20, _hosts(g, 16), cr.MODES)
    assert pred["ecmp"]["ratio_to_ecmp"] == 1.0
    assert pred["spray"]["ratio_to_ecmp"] > 1.2 and pred["adaptive"]["ratio_to_ecmp"] > 1.2


def test_the_model_predicts_adaptive_beats_spray_with_one_uplink_at_half_rate():
    g = graph.build(spec.load("mini-hpn"))
    leaf, intf = cr.uplinks(g)[0]
    edge = next((u, v, k) for u, v, k, d in g.edges(keys=True, data=True)
                if d["kind"] != "host" and leaf in (u, v) and graph.intf_name(leaf, d["ports"][leaf]) == intf)
    pred = cr.predicted(g, "permutation", 1 << 20, _hosts(g, 16), ("ecmp", "spray", "adaptive"),
                        shaped=edge, factor=0.5)
    assert pred["adaptive"]["busbw_gbs"] > 1.2 * pred["spray"]["busbw_gbs"]
    assert g.edges[edge]["rate_gbps"] == 400      # the fabric itself is left as it was


def test_the_table_prints_the_models_ratio_beside_the_measured_one():
    runs = [_run("symmetric", "ecmp", 0, 1.0), _run("symmetric", "spray", 0, 1.5)]
    model = {("symmetric", "all_to_all"): {"ecmp": {"ratio_to_ecmp": 1.0}, "spray": {"ratio_to_ecmp": 1.44}}}
    rows = cr.summarize(runs, model=model)
    assert rows[1]["model_ratio_to_ecmp"] == 1.44
    assert " 1.44 " in cr.table(rows)[-1]


class _FakeEmulation:
    """What compare() reads of an emulation: its graph, its controller's telemetry file, no weighted tables."""

    def __init__(self, telemetry):
        self.graph = graph.build(spec.load("mini-hpn"))
        self.controller = SimpleNamespace(telemetry_file=telemetry, live_weights=False, routing_weights="ecmp")


def _result(busbw, labels):
    return {"rows": [{"oop": {"busbw_gbs": busbw, "time_us": 1e6, "wrong": 0}}], "hosts": labels,
            "flows": [{"retransmissions": 1, "timeouts": 1, "max_reorder": 2}]}


def test_a_cell_records_the_load_the_weight_changes_and_both_jobs_of_the_two_jobs_row(tmp_path, monkeypatch):
    import time

    telemetry = tmp_path / "telemetry.jsonl"
    telemetry.write_text('{"kind":"weights","t":0.0,"switch":"old"}\n')
    plans = []

    def run(plan, emu, progress=False):
        plans.append(plan)
        with telemetry.open("a") as fh:       # the controller re-weights while the cell runs
            fh.write(f'{{"kind":"weights","t":{time.monotonic()},"switch":"p0l0"}}\n')
        [jobs] = plan.jobs_on(emu.graph).values()
        return {"results": [dict(_result(0.002 * (k + 1), job.labels), cpu={"machine_busy": 0.4 + 0.2 * k})
                            for k, job in enumerate(jobs)]}

    monkeypatch.setattr(cr.experiment, "run", run)
    monkeypatch.setattr(cr, "reshape", lambda *a, **k: None)
    doc = cr.compare(_FakeEmulation(telemetry), Plan(ranks=16), reps=1, collectives=("permutation", cr.TWO_JOBS),
                     modes=("ecmp", "spray"))
    assert [p.jobs for p in plans[:4]] == [1, 1, 2, 2] and plans[2].ranks == 8
    two = [r for r in doc["runs"] if r["collective"] == cr.TWO_JOBS]
    assert two[0]["busbw_gbs"] == pytest.approx(0.003)          # the mean of the two jobs'
    assert two[0]["retransmissions"] == 2
    first = doc["runs"][0]
    assert [c["switch"] for c in first["weight_changes"]] == ["p0l0"]
    assert len(first["load"]) == 2 and all(x >= 0 for x in first["load"])
    assert first["machine_busy"] == pytest.approx(0.4)
    assert two[0]["machine_busy"] == pytest.approx(0.5)         # the mean of the two jobs'
    assert {(m["fabric"], m["collective"]) for m in doc["model"]} == {
        (f, c) for f in ("symmetric", "asymmetric") for c in ("permutation", cr.TWO_JOBS)}
    assert len(doc["runs"]) == 2 * 2 * 2


def test_a_cell_counts_the_switch_drops_once_and_the_duplicates_of_every_flow():
    res = [{"rows": [{"oop": {"busbw_gbs": 1.0, "time_us": 5.0, "wrong": 0}}],
            "flows": [{"retransmissions": 3, "duplicates": 2}], "switch_ecn": {"drops": 7, "ce_marked": 4}}] * 2
    fig = cr.cell_figures(res, [1, 1])
    assert fig["jobs_busbw_gbs"] == [1.0, 1.0] and fig["start_skew_s"] is None
    assert (fig["switch_drops"], fig["ce_marked"], fig["duplicates"], fig["retransmissions"]) == (7, 4, 4, 6)
    assert cr.cell_figures(dict(res[0], switch_ecn=None), [1])["switch_drops"] is None


def test_modes_keep_the_comparisons_order_and_always_run_the_ecmp_baseline():
    assert cr.parse_modes("adaptive, spray") == ("ecmp", "spray", "adaptive")
    assert cr.parse_modes("ecmp,adaptive+w") == ("ecmp", "adaptive+w")
    assert cr.parse_modes("reps,adaptive") == ("ecmp", "adaptive", "reps")      # REPS's recycling beside it


@pytest.mark.parametrize("text", ["repss", "spray,,bogus", ","])
def test_an_unknown_routing_mode_in_modes_is_one_clear_error(text):
    with pytest.raises(cr.UserError, match="routing mode"):
        cr.parse_modes(text)


@pytest.mark.parametrize("argv", [["--modes", "spray"], ["--compare", "routing", "--modes", "bogus"]])
def test_a_wrong_modes_flag_is_one_line_before_anything_is_built(argv, monkeypatch, capsys):
    from hpnlab.cli import main
    from hpnlab.fabric import emulation

    def built(*a, **kw):
        raise AssertionError("an emulation was built")
    monkeypatch.setattr(emulation, "Emulation", built)
    assert main.main(["run", "mini-hpn", *argv]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("--compare routing" in err[0] or "routing mode" in err[0])


def test_the_table_shows_each_rows_mean_share_of_the_machines_cores_busy():
    runs = [dict(_run("symmetric", "ecmp", 0, 1.0), machine_busy=0.99),
            dict(_run("symmetric", "ecmp", 1, 1.0), machine_busy=0.97),
            dict(_run("symmetric", "spray", 0, 1.0), machine_busy=0.80),
            dict(_run("symmetric", "spray", 1, 1.0), machine_busy=0.90)]
    rows = cr.summarize(runs)
    assert rows[0]["machine_busy"]["mean"] == pytest.approx(0.98)
    lines = cr.table(rows)
    assert " 98% " in lines[1] and " 85% " in lines[2]
    assert "   - " in cr.table(cr.summarize([_run("symmetric", "ecmp", 0, 1.0)]))[1]     # not measured


def test_a_cells_line_share_is_its_busbw_over_the_ranks_line_rate():
    res = {"rows": [{"oop": {"busbw_gbs": 0.0015, "time_us": 5.0, "wrong": 0}}], "flows": [],
           "line_rate_bps": 16e6}                          # 2 planes x 8 Mbit/s: 0.002 GB/s
    assert cr.cell_figures(res, [1])["line"] == pytest.approx(0.75)
    assert cr.cell_figures(dict(res, line_rate_bps=None), [1])["line"] is None


def test_ratios_to_spray_are_taken_repetition_by_repetition_where_spray_ran():
    cells = (("ecmp", 0, 1.0), ("ecmp", 1, 1.0), ("spray", 0, 1.0), ("spray", 1, 2.0), ("adaptive", 0, 1.5),
             ("adaptive", 1, 2.0))
    runs = [_run("asymmetric", m, rep, b) for m, rep, b in cells]
    rows = {r["mode"]: r for r in cr.summarize(runs)}
    q = rows["adaptive"]["busbw_ratio_to_spray"]
    assert (q["min"], q["max"], q["mean"]) == (1.0, 1.5, 1.25)
    no_spray = cr.summarize([r for r in runs if r["mode"] != "spray"])
    assert all("busbw_ratio_to_spray" not in r for r in no_spray)
    assert cr.table(no_spray)[-1].count("[") == 1                 # x ecmp's spread only: "-" for x spray
    assert cr.table(cr.summarize(runs))[-1].count("[") == 2


def test_the_table_shows_the_share_of_line_rate_and_the_ratio_to_spray():
    runs = [dict(_run("symmetric", m, 0, b), line=b / 2) for m, b in (("ecmp", 1.0), ("spray", 1.8), ("adaptive", 1.9))]
    head, *lines = cr.table(cr.summarize(runs))
    assert " line " in head and "x spray" in head
    assert " 0.95 " in lines[-1] and "1.06 [1.06-1.06]" in lines[-1]


def test_the_plot_draws_every_fabric_and_the_model_beside_the_measured_ratios(tmp_path):
    runs = [_run(f, m, r, b * (1 + r / 10)) for f in ("symmetric", "asymmetric") for r in range(2)
            for m, b in (("ecmp", 1.0), ("spray", 1.5), ("adaptive", 1.7))]
    model = {(f, "all_to_all"): {"ecmp": {"ratio_to_ecmp": 1.0}, "spray": {"ratio_to_ecmp": 1.4},
                                 "adaptive": {"ratio_to_ecmp": 1.6}} for f in ("symmetric", "asymmetric")}
    path = cr.plot(cr.summarize(runs, model=model), tmp_path / "sub" / "compare-routing.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_redrawing_from_a_file_that_is_not_a_comparison_is_one_line(tmp_path, capsys):
    bad = tmp_path / "compare-routing.json"
    bad.write_text('{"kind": "something else"}')
    assert cr.main([str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read a routing comparison" in err


def test_redrawing_a_comparison_prints_its_table_and_writes_its_plot(tmp_path, capsys):
    import json

    runs = [_run("symmetric", m, 0, b) for m, b in (("ecmp", 1.0), ("spray", 1.5))]
    f = tmp_path / "compare-routing.json"
    f.write_text(json.dumps({"kind": "compare-routing", "runs": runs, "model": []}))
    assert cr.main([str(f), "--out", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "x spray" in out and (tmp_path / "plots" / "compare-routing.png").exists()


def test_a_routing_comparison_runs_at_half_the_budgets_rates_and_keeps_a_rate_the_user_set():
    budget = {"emulation": {"host_mbps": 14.0, "max_mbps": 28.0, "mtu": 4096}}
    rates, line = cr.comparison_rates(budget, "rates from the measured budget: host ports 14 Mbit/s")
    assert rates == {"emulation": {"host_mbps": 7.0, "max_mbps": 14.0, "mtu": 4096}}
    assert "host ports 7 Mbit/s" in line and "50%" in line
    set_by_hand = {"emulation": {"mtu": 4096}}
    assert cr.comparison_rates(set_by_hand, "rates as set") == (set_by_hand, "rates as set")
    assert cr.comparison_rates({}, "rates as set") == ({}, "rates as set")
    assert cr.comparison_rates({"emulation": {"host_mbps": 15.0, "max_mbps": 30.0}}, "x")[0]["emulation"][
        "host_mbps"] == 7.5                                    # rounded down, two figures below 10


def test_a_cells_start_skew_is_the_spread_of_every_jobs_ranks_starts():
    job = {"rows": [{"oop": {"busbw_gbs": 1.0, "time_us": 5.0, "wrong": 0}}]}
    res = [dict(job, ranks=[{"started_at": 100.0}, {"started_at": 100.25}]),
           dict(job, ranks=[{"started_at": 100.5}, {"started_at": None}])]
    assert cr.start_skew(res) == pytest.approx(0.5)
    assert cr.start_skew([job]) is None
