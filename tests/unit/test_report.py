"""nccl-tests tables, JSON results and plots from per-rank measurements (pure + matplotlib)."""
import pytest

from hpnlab.fabric.workload import report


def _rank(rank, times, wrong=0, ip=True):
    return {"rank": rank, "sizes": [
        {"size": 1 << 20, "count": 262144, "param_count": 262144,
         "oop": {"times_s": times, "wrong": wrong},
         "ip": {"times_s": times, "wrong": wrong} if ip else None}]}


def _result(rows, **kw):
    base = {"collective": "all_reduce", "nranks": 4, "transport": "roce", "entropy": "spray",
            "type": "int32", "redop": "sum", "root": -1, "rows": rows}
    base.update(kw)
    return base


def test_an_iteration_takes_as_long_as_its_slowest_rank():
    ranks = [_rank(0, [0.010, 0.020]), _rank(1, [0.030, 0.010]), _rank(2, [0.01, 0.01]),
             _rank(3, [0.01, 0.01])]
    rows = report.aggregate(ranks, "all_reduce")
    assert rows[0]["oop"]["time_us"] == pytest.approx((30_000 + 20_000) / 2)


def test_algbw_is_size_over_time_and_busbw_applies_the_collective_factor():
    ranks = [_rank(r, [0.001]) for r in range(4)]
    cellv = report.aggregate(ranks, "all_reduce")[0]["oop"]
    assert cellv["algbw_gbs"] == pytest.approx((1 << 20) / 0.001 / 1e9)
    assert cellv["busbw_gbs"] == pytest.approx(cellv["algbw_gbs"] * 2 * 3 / 4)
    a2a = report.aggregate(ranks, "all_to_all")[0]["oop"]
    assert a2a["busbw_gbs"] == pytest.approx(a2a["algbw_gbs"] * 3 / 4)


def test_wrong_elements_are_summed_over_ranks_and_unknown_when_unchecked():
    ranks = [_rank(0, [1.0], wrong=2), _rank(1, [1.0], wrong=3)]
    assert report.aggregate(ranks, "all_gather")[0]["oop"]["wrong"] == 5
    ranks = [_rank(0, [1.0], wrong=None), _rank(1, [1.0], wrong=None)]
    assert report.aggregate(ranks, "all_gather")[0]["oop"]["wrong"] is None


def test_table_has_the_nccl_tests_columns_rows_and_footer():
    rows = report.aggregate([_rank(r, [0.5]) for r in range(4)], "all_reduce")
    text = report.format_table(_result(rows, line_rate_bps=20e6))
    lines = text.splitlines()
    header = next(line for line in lines if "redop" in line)
    for col in ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"):
        assert col in header
    assert header.count("busbw") == 2          # out-of-place and in-place
    assert "out-of-place" in text and "in-place" in text
    data = [line for line in lines if not line.startswith("#")]
    assert len(data) == 1
    fields = data[0].split()
    assert fields[:5] == ["1048576", "262144", "int32", "sum", "-1"]
    assert float(fields[5]) == pytest.approx(500000.0)
    assert "# Out of bounds values : 0 OK" in text
    avg = float(next(line for line in lines if "Avg bus bandwidth" in line).split(":")[1])
    assert avg == pytest.approx((1 << 20) / 0.5 / 1e9 * 1.5, rel=1e-3)
    assert "busbw / line rate" in text


def test_in_place_columns_read_na_when_not_run_and_wrong_reads_na_unchecked():
    rows = report.aggregate([_rank(r, [0.5], wrong=None, ip=False) for r in range(2)], "all_to_all")
    line = next(x for x in report.format_table(_result(rows)).splitlines() if not x.startswith("#"))
    assert line.split()[-4:] == ["N/A"] * 4
    assert line.split()[8] == "N/A"


def test_line_rate_fraction_uses_the_largest_size():
    rows = report.aggregate([_rank(r, [(1 << 20) * 8 * 1.5 / 10e6]) for r in range(4)], "all_reduce")
    # busbw = 1.5 x algbw; time chosen so that busbw is exactly 10 Mbit/s
    assert report.largest_fraction(_result(rows, line_rate_bps=10e6)) == pytest.approx(1.0)


def test_flow_rate_series_differentiates_cumulative_bytes():
    ts, rates = report.flow_rate_series({"samples": [[0.0, 0, 0], [0.5, 125_000, 0], [1.0, 375_000, 0]]})
    assert ts == [0.5, 1.0]
    assert rates == [2e6, 4e6]


def test_results_roundtrip_through_json_and_plot_to_png(tmp_path):
    rows = report.aggregate([_rank(r, [0.5]) for r in range(4)], "all_reduce")
    res = _result(rows, line_rate_bps=20e6, flows=[
        {"src": 0, "dst": 1, "bytes": 10, "packets": 5, "retransmissions": 1, "max_reorder": 3,
         "samples": [[0.0, 0, 2e7], [0.1, 100000, 1e7], [0.2, 200000, 1.5e7]]},
        {"src": 1, "dst": 2, "bytes": 10, "packets": 7, "retransmissions": 0, "max_reorder": 5,
         "samples": [[0.0, 0, 0], [0.1, 50000, 0]]}])
    path = report.write_json(res, tmp_path / "r.json")
    assert report.read_json(path) == res
    totals = report.flow_totals(res)
    assert (totals["packets"], totals["retransmissions"], totals["max_reorder"]) == (12, 1, 5)
    for fn, name in ((lambda p: report.plot_busbw([res], p), "busbw.png"),
                     (lambda p: report.plot_flow_rates(res, p), "flows.png")):
        out = fn(tmp_path / name)
        data = out.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "roce" in report.format_comparison([res])


def test_tables_and_plots_come_back_from_a_results_file(tmp_path, capsys):
    rows = report.aggregate([_rank(r, [0.5]) for r in range(4)], "all_reduce")
    path = report.write_json({"meta": {}, "results": [_result(rows, line_rate_bps=20e6)]}, tmp_path / "r.json")
    assert report.main([str(path), "--plots", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "# Avg bus bandwidth" in out and "roce" in out
    assert (tmp_path / "p" / "busbw.png").is_file()
    assert report.main([str(tmp_path / "missing.json")]) == 2


def test_a_flow_joins_its_senders_and_its_receivers_counters_and_idle_pairs_are_dropped():
    ranks = [{"flows": [{"side": "tx", "src": 0, "dst": 1, "bytes": 4096, "packets": 4},
                        {"side": "rx", "src": 1, "dst": 0, "packets_received": 0, "ce_marks": 0}]},
             {"flows": [{"side": "rx", "src": 0, "dst": 1, "packets_received": 4, "ce_marks": 2},
                        {"side": "tx", "src": 1, "dst": 0, "bytes": 0, "packets": 0}]}]
    assert report.merge_flows(ranks) == [
        {"src": 0, "dst": 1, "bytes": 4096, "packets": 4, "packets_received": 4, "ce_marks": 2}]


def test_wrong_elements_are_counted_over_every_run_size_and_column():
    ok = {"rows": [{"oop": {"wrong": 0}, "ip": None}]}
    bad = {"rows": [{"oop": {"wrong": 2}, "ip": {"wrong": 3}}, {"oop": {"wrong": None}, "ip": None}]}
    assert report.wrong_total([ok]) == 0
    assert report.wrong_total([ok, bad]) == 5


def test_the_machines_busy_share_is_the_non_idle_part_of_the_cpu_time_between_two_readings():
    assert report.busy_share((1000.0, 400.0), (1200.0, 450.0)) == pytest.approx(0.75)
    assert report.busy_share((1000.0, 400.0), (1000.0, 400.0)) == 0.0       # no time passed: nothing measured


def test_the_machines_cpu_times_count_idle_within_the_total():
    total, idle = report.cpu_times()
    assert 0 <= idle <= total


def test_a_retransmission_whose_original_also_arrived_counts_as_spurious_the_rest_as_lost():
    flows = [{"src": 0, "dst": 1, "retransmissions": 5, "retx_timeout": 4, "retx_nack": 1, "duplicates": 3,
              "timeouts": 2, "timeouts_paused": 1},
             {"src": 1, "dst": 0, "retransmissions": 2, "retx_nack": 2, "duplicates": 0}]
    causes = report.retransmission_causes({"flows": flows, "socket_drops": 7})
    assert causes == {"retransmissions": 7, "spurious": 3, "lost": 4, "timeout": 4, "nack": 3, "failover": 0,
                      "migrate": 0, "timeouts": 2, "timeouts_paused": 1, "socket_drops": 7}


def test_duplicates_beyond_the_retransmissions_never_make_lost_negative():
    causes = report.retransmission_causes({"flows": [{"src": 0, "dst": 1, "retransmissions": 1, "duplicates": 4}]})
    assert (causes["spurious"], causes["lost"], causes["socket_drops"]) == (1, 0, None)


def test_the_ranks_socket_drops_are_summed_and_unknown_when_no_rank_could_say():
    assert report.rank_socket_drops([{"socket_drops": 2}, {"socket_drops": None}, {"socket_drops": 3}]) == 5
    assert report.rank_socket_drops([{"socket_drops": None}, {}]) is None
