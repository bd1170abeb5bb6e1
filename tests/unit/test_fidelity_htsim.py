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
    assert out["cpu_s"] >= 0


def test_without_a_binary_the_benchmark_skips_with_the_reason(monkeypatch, capsys):
    monkeypatch.delenv("HTSIM", raising=False)
    assert bench_htsim.main([]) == 0
    assert "skipped: no htsim binary given" in capsys.readouterr().out


def test_the_partial_all_to_all_takes_only_its_offsets():
    steps = bench_htsim.all_to_all_steps(8, 10, offsets=(1, 4))
    assert [p for p, _ in steps] == [[(i, (i + s) % 8) for i in range(8)] for s in (1, 4)]


def _fake_htsim(tmp_path, makespan_us: float = 180.5):
    """An htsim stand-in that prints a finish line per flow of its matrix and counts its runs."""
    fake = tmp_path / "htsim_uec"
    count = tmp_path / "runs"
    fake.write_text(f"#!{sys.executable}\n"
                    "import sys, pathlib\n"
                    f"c = pathlib.Path({str(count)!r}); c.write_text(str(int(c.read_text() or 0) + 1) "
                    "if c.exists() else '1')\n"
                    "cm = open(sys.argv[sys.argv.index('-tm') + 1]).read()\n"
                    f"[print(f'Flow x finished at {makespan_us}') for _ in range(cm.count('->'))]\n"
                    "print('New: 980 Rtx: 20 RTS: 0 Bounced: 0')\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return str(fake), count


def test_an_htsim_run_is_cached_by_binary_workload_mode_and_seed(tmp_path):
    binary, count = _fake_htsim(tmp_path)
    cell = bench_htsim.Cell(16, "permutation", 1000, "mixed", (1, 2))
    first, cached = bench_htsim.cached_htsim(binary, cell, 1, tmp_path / "cache", 10.0)
    assert not cached and first["makespan_s"] == pytest.approx(180.5e-6)
    again, cached = bench_htsim.cached_htsim(binary, cell, 1, tmp_path / "cache", 10.0)
    assert cached and again == first and count.read_text() == "1"
    bench_htsim.cached_htsim(binary, cell, 2, tmp_path / "cache", 10.0)           # another seed: a run
    other = bench_htsim.Cell(16, "permutation", 1000, "ecmp", (1,))
    bench_htsim.cached_htsim(binary, other, 1, tmp_path / "cache", 10.0)          # another mode: a run
    assert count.read_text() == "3"


def test_htsims_figures_are_reused_from_an_earlier_file_by_cell_and_seed(tmp_path):
    h = {"makespan_s": 1e-3, "retx_fraction": 0.0, "wall_s": 1.0, "seed": 2}
    cell = bench_htsim.Cell(128, "permutation", 4_000_000, "ecmp", (2,))
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"cells": [{"cell": cell.as_dict(), "htsim": [h]}]}))
    runs = bench_htsim.earlier_htsim_runs(str(path))
    assert bench_htsim.cached_htsim("unused", cell, 2, tmp_path, 1.0, runs) == (h, True)
    with pytest.raises(SystemExit, match="no run of k8-perm-4M-ecmp seed 3"):
        bench_htsim.cached_htsim("unused", cell, 3, tmp_path, 1.0, runs)


def test_fit_and_validation_cells_are_disjoint_and_span_sizes_fabrics_and_modes():
    fit = {c.name for c in bench_htsim.FIT_CELLS}
    val = bench_htsim.VALIDATION_CELLS
    assert not fit & {c.name for c in val}
    assert {c.mode for c in val} == set(bench_htsim.MODES)
    assert {c.hosts for c in val} >= {128, 1024}
    assert min(c.nbytes for c in val) < 64_000 < 4_000_000 < max(c.nbytes for c in val)
    assert {c.case for c in val} == {"permutation", "all_to_all"}
    assert all(len(c.seeds) >= 10 for c in val + bench_htsim.FIT_CELLS if c.mode == "ecmp")


def test_the_holdout_cells_are_workloads_on_fabrics_neither_other_set_has():
    hold = bench_htsim.HOLDOUT_CELLS
    others = bench_htsim.FIT_CELLS + bench_htsim.VALIDATION_CELLS
    assert not {(c.hosts, c.case, c.nbytes) for c in hold} & {(c.hosts, c.case, c.nbytes) for c in others}
    assert {c.hosts for c in hold} - {c.hosts for c in others}
    assert {c.mode for c in hold} == set(bench_htsim.MODES)
    assert all(len(c.seeds) >= 10 for c in hold if c.mode == "ecmp")


def test_the_benchmark_reports_holdout_cells_in_their_own_group(tmp_path):
    cells = [c for c in bench_htsim.HOLDOUT_CELLS if c.name.startswith("k8-perm-512k-")][1:3]
    doc = {"cells": [{"cell": c.as_dict(), "htsim": [{"makespan_s": 80e-6, "retx_fraction": 0.0, "wall_s": 0.1,
                                                      "cpu_s": 0.1, "seed": s} for s in c.seeds]} for c in cells]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    assert bench_htsim.main(["--htsim-from", str(path), "--cells", ",".join(c.name for c in cells), "--no-before",
                             "--json", str(out)]) == 0
    assert {r["group"] for r in json.loads(out.read_text())["cells"]} == {"holdout"}


def test_the_tables_print_as_markdown_one_row_per_cell(tmp_path, capsys):
    cells = [c for c in bench_htsim.HOLDOUT_CELLS if c.name.startswith("k8-perm-512k-")][1:3]
    doc = {"cells": [{"cell": c.as_dict(), "htsim": [{"makespan_s": 80e-6, "retx_fraction": 0.0, "wall_s": 0.1,
                                                      "cpu_s": 0.1, "seed": s} for s in c.seeds]} for c in cells]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(doc))
    assert bench_htsim.main(["--htsim-from", str(path), "--cells", ",".join(c.name for c in cells), "--no-before",
                             "--markdown"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| k8-perm-512k-")]
    assert [row.split(" | ")[0] for row in rows] == [f"| {c.name}" for c in cells]


def test_the_preset_corrections_were_fitted_on_the_fit_cells_and_none_of_the_validation_cells():
    from hpnlab.fabric.model import corrections as mc
    fitted = set(mc.HTSIM_100G.fitted_on)
    assert fitted == {c.name for c in bench_htsim.FIT_CELLS}
    assert not fitted & {c.name for c in bench_htsim.VALIDATION_CELLS + bench_htsim.HOLDOUT_CELLS}
    assert set(mc.HTSIM_100G.policies) == set(bench_htsim.MODES)


@pytest.mark.parametrize("mode", ["ecmp", "oblivious", "mixed"])
def test_a_hashed_policy_finds_whole_flows_on_its_busiest_link(mode):
    cell = bench_htsim.Cell(16, "permutation", 1_000_000, mode, (1,))
    [(shape, mult)] = bench_htsim.model_cell(cell, 1)
    assert mult == 1 and shape.hops == 6 and shape.latency_s == pytest.approx(6e-6)
    assert shape.fan_in >= 1 and shape.drain_s >= 1_000_000 * 8 / 100e9


def test_moving_bytes_to_free_values_never_drains_slower_than_equal_shares():
    for seed in range(1, 6):
        eq = bench_htsim.model_cell(bench_htsim.Cell(128, "permutation", 1_000_000, "oblivious", (seed,)), seed)
        ad = bench_htsim.model_cell(bench_htsim.Cell(128, "permutation", 1_000_000, "reps", (seed,)), seed)
        assert ad[0][0].drain_s <= eq[0][0].drain_s * (1 + 1e-9)


def test_the_benchmark_reports_htsim_beside_the_model_from_an_earlier_file(tmp_path, capsys):
    cells = [c for c in bench_htsim.VALIDATION_CELLS if c.name.startswith("k8-perm-256k-")][:2]
    doc = {"cells": [{"cell": c.as_dict(), "htsim": [{"makespan_s": 50e-6, "retx_fraction": 0.0, "wall_s": 0.1,
                                                      "cpu_s": 0.1, "seed": s} for s in c.seeds]} for c in cells]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    assert bench_htsim.main(["--htsim-from", str(path), "--cells", ",".join(c.name for c in cells), "--no-before",
                             "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["cells"]
    assert [r["cell"]["name"] for r in rows] == [c.name for c in cells]
    assert all(r["htsim_s"] == pytest.approx(50e-6) and r["model_s"] > 0 for r in rows)
    assert "within 10%" in capsys.readouterr().out


def test_building_htsim_from_a_folder_that_is_not_its_source_says_so_in_one_line(tmp_path):
    said: list[str] = []
    assert bench_htsim.build_htsim(str(tmp_path), tmp_path / "cache", say=said.append) is None
    assert len(said) == 1 and "not a uet-htsim checkout" in said[0]


def test_building_htsim_where_it_cannot_be_fetched_says_so_in_one_line(tmp_path):
    said: list[str] = []
    assert bench_htsim.build_htsim(str(tmp_path / "no-such-repo"), tmp_path / "cache", say=said.append) is None
    assert len(said) == 1 and "cannot fetch htsim" in said[0]
