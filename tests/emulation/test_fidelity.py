"""`hpnlab fidelity` end to end on the emulated mini-hpn: one collective in one mode, with and
without congestion control, and every figure it prints comes from the runs (the emulated runs'
results and the model's)."""
from __future__ import annotations

import json

import pytest

from hpnlab.cli.main import main
from hpnlab.fabric.experiments import fidelity
from hpnlab.fabric.scenario import graph, spec

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


def test_fidelity_prints_the_emulated_and_the_model_figures_of_the_same_run(tmp_path, capsys):
    rc = main(["fidelity", "mini-hpn", "--collective", "all_reduce", "--modes", "spray", "--ranks", "4",
               "-b", "256K", "-n", "1", "-w", "0", "--cc", "dcqcn,none", "--repeat", "1", "--out", str(tmp_path)])
    assert rc == 0
    printed = capsys.readouterr().out
    doc = json.loads((tmp_path / "fidelity.json").read_text())
    cell, free = doc["emulated"]["cells"]
    row, free_row = doc["rows"]
    # the second cell ran the same collective without DCQCN, and the DCQCN row reads its time
    assert (cell["cc"], free["cc"]) == ("dcqcn", "none") and (row["cc"], free_row["cc"]) == ("dcqcn", "none")
    assert cell["result"]["transport_info"]["dcqcn"] and free["result"]["transport_info"]["dcqcn"] is None
    assert row["without_cc"]["time_us"] == free["result"]["rows"][-1]["oop"]["time_us"]
    assert 0.0 <= cell["machine_busy"] <= 1.0
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
