"""`hpnlab fidelity` end to end on the emulated mini-hpn: one collective in one mode, and every
figure it prints comes from the two runs (the emulated run's result and the model's)."""
from __future__ import annotations

import json

import pytest

from hpnlab.cli.main import main
from hpnlab.fabric import fidelity, graph, spec

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


def test_fidelity_prints_the_emulated_and_the_model_figures_of_the_same_run(tmp_path, capsys):
    rc = main(["fidelity", "mini-hpn", "--collective", "all_reduce", "--modes", "spray", "--ranks", "4",
               "-b", "256K", "-n", "1", "-w", "0", "--out", str(tmp_path)])
    assert rc == 0
    printed = capsys.readouterr().out
    doc = json.loads((tmp_path / "fidelity.json").read_text())
    [cell] = doc["emulated"]["cells"]
    [row] = doc["rows"]
    res = cell["result"]
    # the emulated side is the run's own result
    assert res["collective"] == "all_reduce" and res["entropy"] == "spray" and res["rows"][-1]["oop"]["wrong"] == 0
    assert row["emulated"]["time_us"] == res["rows"][-1]["oop"]["time_us"]
    assert row["emulated"]["busbw_gbs"] == res["rows"][-1]["oop"]["busbw_gbs"]
    # the model side is the model run again on the same ranks at the emulated rates
    g = graph.build(spec.from_dict(doc["emulated"]["scenario"]))
    ranks = [(h, r) for h, r in cell["ranks"]]
    again = fidelity.run_model(fidelity.emulated_graph(g, cell["hosts"]), ranks, "spray", "all_reduce", 262144)
    assert row["model"]["time_us"] == pytest.approx(again["time_us"])
    assert row["error"]["time"] == pytest.approx((again["time_us"] - res["rows"][-1]["oop"]["time_us"])
                                                 / res["rows"][-1]["oop"]["time_us"])
    # and the table prints those figures
    assert f"{res['rows'][-1]['oop']['time_us'] / 1e3:.1f}" in printed
    assert f"{again['time_us'] / 1e3:.1f}" in printed
    assert row["within_tolerance"] or row["causes"]          # beyond 10%: a reason, measured on the run
