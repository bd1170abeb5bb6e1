"""The documented corrections to the flow model (hpnlab.fabric.model.corrections)."""
from __future__ import annotations

import pytest

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.model import corrections as mc
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph, spec


def test_no_corrections_leave_a_step_as_the_model_timed_it():
    assert mc.correct_step(1e-3, 1e-5, "ecmp", mc.NONE) == pytest.approx(1e-3)
    assert mc.correct_step(1e-3, 1e-5, "spray", mc.NONE) == pytest.approx(1e-3)


def test_the_ramp_adds_its_round_trips_to_every_synchronous_step():
    c = mc.Corrections(base_rtt_us=10.0, ramp_rtts_per_step=2.0)
    plain = mc.correct_steps([1e-4] * 5, "ecmp", mc.NONE)
    assert mc.correct_steps([1e-4] * 5, "ecmp", c) - plain == pytest.approx(5 * 2 * 10e-6)


def test_retransmission_grows_the_drain_but_not_the_latency():
    c = mc.Corrections(retx_fraction={"per_flow": 0.05})
    assert mc.correct_step(1e-3, 2e-4, "ecmp", c) == pytest.approx(8e-4 * 1.05 + 2e-4)


def test_a_retransmitted_fraction_given_for_a_routing_wins_over_its_kind():
    c = mc.Corrections(retx_fraction={"per_flow": 0.05, "flowlet": 0.01})
    assert mc.correct_step(1.0, 0.0, "flowlet", c) == pytest.approx(1.01)


def test_spray_efficiency_slows_only_sprayed_routings():
    c = mc.Corrections(spray_efficiency=0.8)
    assert mc.correct_step(1e-3, 0.0, "spray", c) == pytest.approx(1.25e-3)
    assert mc.correct_step(1e-3, 0.0, "ecmp", c) == pytest.approx(1e-3)


def test_a_correction_of_a_model_result_equals_the_sum_of_its_corrected_steps():
    g = graph.build(spec.load("mini-hpn"))
    # flowlet: one distinct step per salt, so the result has several steps, each with its latency
    r = model.run_collective(g, "all_reduce", 1 << 24, routing="flowlet", hosts=8, placement="packed")
    assert len(r.steps) > 4
    c = mc.Corrections(base_rtt_us=12.0, ramp_rtts_per_step=1.5, retx_fraction={"per_flow": 0.02},
                       spray_efficiency=0.9)
    expected = mc.correct_steps([s.time_s for s in r.steps], "flowlet", c,
                                latencies_s=[s.latency_s for s in r.steps],
                                multiplicities=[s.multiplicity for s in r.steps])
    out = mc.correct_result(r, c)
    assert out["time_s"] == pytest.approx(expected)
    assert out["busbw_gbs"] == pytest.approx(r.busbw_gbs * r.time_s / expected)


def test_spraying_over_a_finite_set_runs_as_that_many_hashed_connections():
    assert mc.finite_entropy_routing("spray", 64) == ("ecmp", 64)
    assert mc.finite_entropy_routing("spray", None) == ("spray", 1)
    assert mc.finite_entropy_routing("ecmp", 64) == ("ecmp", 1)


def test_the_fit_recovers_the_constants_that_made_the_runs():
    truth = mc.Corrections(base_rtt_us=12.0, ramp_rtts_per_step=1.75, retx_fraction={"per_flow": 0.04,
                           "sprayed": 0.01}, spray_efficiency=0.8)
    runs = []
    for case, routing, steps, step_s in [("permutation", "ecmp", 1, 4e-4), ("permutation", "spray", 1, 3e-4),
                                         ("all_to_all", "ecmp", 127, 8e-5), ("all_to_all", "spray", 127, 2e-5)]:
        peer = mc.correct_steps([step_s] * steps, routing, truth)
        kind = mc.routing_kind(routing)
        runs.append({"case": case, "routing": routing, "steps": steps, "model_s": step_s * steps, "peer_s": peer,
                     "retx_fraction": truth.retx_fraction[kind]})
    got = mc.fit(runs, 12.0, "synthetic")
    assert got.retx_fraction == truth.retx_fraction
    assert got.spray_efficiency == pytest.approx(truth.spray_efficiency, rel=1e-3)
    assert got.ramp_rtts_per_step == pytest.approx(truth.ramp_rtts_per_step, rel=1e-3)


@pytest.mark.parametrize("bad", [dict(spray_efficiency=0.0), dict(ramp_rtts_per_step=-1.0),
                                 dict(retx_fraction={"per_flow": 1.5})])
def test_impossible_constants_are_one_user_error(bad):
    with pytest.raises(UserError):
        mc.Corrections(**bad)


# ---- hpnlab model --corrections -------------------------------------------------------------------

def _model_cli(capsys, monkeypatch, tmp_path, *extra: str) -> str:
    from hpnlab.cli.main import main
    monkeypatch.setenv("HPNLAB_CACHE", str(tmp_path))
    assert main(["model", "mini-hpn", "-c", "all_reduce", "-b", "1M", "--routing", "flow,spray", *extra]) == 0
    return capsys.readouterr().out


def test_the_model_command_reports_the_corrected_figures_beside_the_raw_ones(capsys, monkeypatch, tmp_path):
    import json
    doc = json.loads(_model_cli(capsys, monkeypatch, tmp_path, "--json"))
    assert doc["corrections"]["name"] == mc.DEFAULT_PRESET
    assert doc["corrections"]["source"] == mc.PRESETS[mc.DEFAULT_PRESET].source
    g = graph.build(spec.load("mini-hpn"))
    for row in doc["results"]:
        raw = model.run_collective(g, "all_reduce", 1 << 20, routing=row["routing"], placement="random")
        assert row["efficiency"] == pytest.approx(raw.efficiency, rel=1e-12)
        want = mc.correct_result(raw, mc.PRESETS[mc.DEFAULT_PRESET])
        assert row["corrected"]["efficiency"] == pytest.approx(want["efficiency"], rel=1e-12)
        assert row["corrected"]["time_s"] > row["time_s"]          # every term adds a cost


def test_the_table_shows_both_efficiencies_and_where_the_constants_were_fitted(capsys, monkeypatch, tmp_path):
    out = _model_cli(capsys, monkeypatch, tmp_path)
    assert "corrected us" in out and mc.HTSIM_100G.source in out


def test_corrections_none_prints_the_raw_model_only(capsys, monkeypatch, tmp_path):
    import json
    out = _model_cli(capsys, monkeypatch, tmp_path, "--corrections", "none")
    assert "corrected" not in out
    doc = json.loads(_model_cli(capsys, monkeypatch, tmp_path, "--corrections", "none", "--json"))
    assert all("corrected" not in row for row in doc["results"])


def test_an_unknown_corrections_name_is_one_user_error():
    with pytest.raises(UserError, match="htsim-100g"):
        mc.preset("htsim-400g")
