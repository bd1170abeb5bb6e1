"""hpnlab.fabric.experiments.htsim's pure parts: hpnlab's workloads written as htsim connection matrices."""
from __future__ import annotations

import json
import stat
import sys

import pytest

from hpnlab.fabric.experiments import htsim as bench_htsim
from hpnlab.fabric.workload import collectives as col


def test_the_permutation_is_the_generators_derangement_as_one_step():
    [(pairs, nbytes)] = bench_htsim.permutation_steps(16, 1000, seed=3)
    assert pairs == [(i, p) for i, p in enumerate(col.random_perm(16, 3))]
    assert all(a != b for a, b in pairs) and nbytes == 1000


def test_the_all_to_all_is_n_minus_one_pairwise_steps():
    steps = bench_htsim.all_to_all_steps(4, 10)
    assert [p for p, _ in steps] == [[(i, (i + s) % 4) for i in range(4)] for s in (1, 2, 3)]


def test_each_step_after_the_first_starts_on_a_barrier_counting_the_previous_steps_flows():
    cm = bench_htsim.connection_matrix(3, bench_htsim.all_to_all_steps(3, 10))
    lines = cm.splitlines()
    assert lines[:3] == ["Nodes 3", "Connections 6", "Triggers 1"]
    assert lines[3] == "0->1 id 1 start 0 size 10 send_done_trigger 1"
    assert lines[6] == "0->2 id 4 trigger 1 size 10"
    assert lines[-1] == "trigger id 1 barrier count 3"


def test_a_one_step_matrix_has_no_triggers():
    cm = bench_htsim.connection_matrix(2, [([(0, 1), (1, 0)], 5.0)])
    assert cm == "Nodes 2\nConnections 2\n0->1 id 1 start 0 size 5\n1->0 id 2 start 0 size 5\n"


def test_the_makespan_and_retransmissions_are_read_from_htsims_output(tmp_path):
    fake = tmp_path / "htsim_uec"
    fake.write_text(f"#!{sys.executable}\n"
                    "print('Flow Uec_0_1 flowId 1 uecSrc 0 finished at 176.2 total messages 1')\n"
                    "print('Flow Uec_1_0 flowId 2 uecSrc 1 finished at 180.5 total messages 1')\n"
                    "print('New: 980 Rtx: 20 RTS: 0 Bounced: 0')\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    cm = bench_htsim.connection_matrix(2, [([(0, 1), (1, 0)], 5.0)])
    out = bench_htsim.run_htsim(str(fake), 2, cm, [], 10.0, tmp_path)
    assert out["makespan_s"] == pytest.approx(180.5e-6)
    assert out["retx_fraction"] == pytest.approx(20 / 980)


def test_without_a_binary_the_benchmark_skips_with_the_reason(monkeypatch, capsys):
    monkeypatch.delenv("HTSIM", raising=False)
    monkeypatch.setattr(sys, "argv", ["bench_htsim.py"])
    assert bench_htsim.main() == 0
    assert "skipped: no htsim binary given" in capsys.readouterr().out


def test_htsims_figures_are_reused_from_an_earlier_run_of_the_same_workload_only(tmp_path):
    h = {"makespan_s": 1e-3, "retx_fraction": 0.0, "wall_s": 1.0}
    path = tmp_path / "k8.json"
    path.write_text('{"runs": [{"case": "permutation", "mode": "ecmp", "hosts": 128, "bytes": 4000000, "htsim": '
                    + json.dumps(h) + "}]}")
    runs = bench_htsim.earlier_htsim_runs(str(path))
    assert bench_htsim.reused_run(runs, "permutation", "ecmp", 128, 4000000, 0, str(path)) == h
    with pytest.raises(SystemExit, match="no permutation ecmp run on 128 hosts with 1000 B"):
        bench_htsim.reused_run(runs, "permutation", "ecmp", 128, 1000, 0, str(path))
    with pytest.raises(SystemExit, match="1 seed"):
        bench_htsim.reused_run(runs, "permutation", "ecmp", 128, 4000000, 1, str(path))


def test_building_htsim_from_a_folder_that_is_not_its_source_says_so_in_one_line(tmp_path):
    said: list[str] = []
    assert bench_htsim.build_htsim(str(tmp_path), tmp_path / "cache", say=said.append) is None
    assert len(said) == 1 and "not a uet-htsim checkout" in said[0]


def test_building_htsim_where_it_cannot_be_fetched_says_so_in_one_line(tmp_path):
    said: list[str] = []
    assert bench_htsim.build_htsim(str(tmp_path / "no-such-repo"), tmp_path / "cache", say=said.append) is None
    assert len(said) == 1 and "cannot fetch htsim" in said[0]
