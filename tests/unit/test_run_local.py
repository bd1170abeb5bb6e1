"""Collectives over loopback through the library (``hpnlab.fabric.experiments.runner``) and the
`hpnlab collective` command: one process per rank on 127.0.0.0/8, data verified at every rank,
busbw as nccl-tests defines it, concurrent jobs, bad input in one line, and a rank killed
mid-run stopping the others with nothing left behind; placement on the fabric graph (pure)."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from support.paths import REPO

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.runner import Plan, sweep
from hpnlab.fabric.transport import ranks
from hpnlab.fabric.workload import collectives as col
from hpnlab.fabric.workload import report
from hpnlab.fabric.workload.jobs import Job
from hpnlab.fabric.workload.placement import place

ROOT = REPO
HPNLAB = [sys.executable, "-m", "hpnlab.cli"]


def hpnlab(*args, timeout=120):
    return subprocess.run(HPNLAB + list(args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _hosts(n, first=2, net="127.0.0"):
    return ",".join(f"{net}.{first + i}" for i in range(n))


# busbw / algbw as nccl-tests defines it (doc/PERFORMANCE.md), written out here rather than
# taken from hpnlab.fabric.workload.collectives, so a wrong factor there fails these tests
NCCL_TESTS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_reduce_hd": lambda n: 2 * (n - 1) / n,
                     "reduce_scatter": lambda n: (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                     "all_to_all": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


@pytest.mark.parametrize("collective,transport,entropy", [
    ("all_reduce", "roce", "spray"), ("all_to_all", "roce", "flow"), ("all_reduce", "tcp", "flow"),
    ("all_reduce_hd", "roce", "flow"), ("broadcast", "tcp", "flow"), ("reduce_scatter", "roce", "spray"),
    ("all_gather", "roce", "flow")])
def test_collective_over_loopback_verifies_every_element_and_reports_nccl_tests_busbw(collective, transport,
                                                                                       entropy):
    plan = Plan(collectives=collective, transports=transport, entropies=entropy, sizes=sweep("16K", "64K"),
                iterations=2)
    t0 = time.monotonic()
    doc = experiment.run(plan, experiment.Loopback(planes=2, line_rate_bps=50e6), progress=False)
    wall_s = time.monotonic() - t0
    [result] = doc["results"]
    n = result["nranks"]
    assert result["collective"] == collective and n == 4
    assert [row["size"] for row in result["rows"]] == [16384, 32768, 65536]
    timed_s = 0.0
    for row in result["rows"]:
        for mode in ("oop", "ip"):
            cell = row[mode]
            if cell is None:
                continue
            assert cell["wrong"] == 0 and cell["iterations"] == 2      # every element checked, every rank
            seconds = cell["time_us"] * 1e-6
            algbw = row["size"] / seconds / 1e9
            assert cell["algbw_gbs"] == pytest.approx(algbw)
            assert cell["busbw_gbs"] == pytest.approx(algbw * NCCL_TESTS_FACTOR[collective](n))
            timed_s += seconds * cell["iterations"]
    assert timed_s < wall_s                  # the timed iterations happened inside this run
    # the data crossed the transport: every rank's share of the schedule, every iteration
    moved = sum(f.get("bytes", 0) for f in result["flows"] if "bytes" in f)
    iterations = plan.iterations + plan.warmup
    need = 0
    for size in plan.size_list:
        sched = col.build(collective, n, size)
        modes = 2 if sched.has_inplace else 1
        need += modes * iterations * sum(sched.bytes_sent(r) for r in range(n))
    assert moved >= need


def test_the_command_line_writes_tables_json_and_plots(tmp_path):
    out = tmp_path / "res"
    res = hpnlab("collective", "all_reduce", "--hosts", _hosts(4), "-b", "16K", "-e", "32K", "-n", "1",
                 "--transport", "roce", "--entropy", "spray", "--line-rate", "50M",
                 "--port", "21000", "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("# Out of bounds values : 0 OK") == 1
    doc = json.loads((out / "results.json").read_text())
    [result] = doc["results"]
    assert [row["size"] for row in result["rows"]] == [16384, 32768]
    assert (out / "busbw.png").stat().st_size > 0 and len(list(out.glob("flows-*-job0.png"))) == 1
    assert 0 < result["cpu"]["max_rank_share"] <= 1.5
    assert 0 < result["cpu"]["machine_busy"] <= 1.0          # the ranks themselves kept it busy
    assert doc["meta"]["kernel"] and doc["meta"]["plan"]["collectives"] == ["all_reduce"]


def test_concurrent_jobs_on_disjoint_hosts_each_get_a_table():
    plan = Plan(collectives="all_gather", sizes="12K", iterations=2, ranks=3, jobs=2)
    doc = experiment.run(plan, experiment.Loopback(line_rate_bps=50e6), progress=False)
    assert [r["job"] for r in doc["results"]] == [0, 1]
    assert all(r["rows"][0]["oop"]["wrong"] == 0 for r in doc["results"])
    ports = [r["transport_info"]["udp_port"] for r in doc["results"]]
    assert ports[1] - ports[0] == 100


@pytest.mark.parametrize("args,message", [
    (["all_reduse", "--hosts", "127.0.0.2,127.0.0.3"], "unknown collective 'all_reduse'"),
    (["all_reduce", "--hosts", "127.0.0.2,127.0.0.3", "-b", "1M", "-e", "64K"], "-b"),
    (["all_gather", "--hosts", "127.0.0.2,127.0.0.3,127.0.0.4", "-b", "8", "-e", "8"], "too small"),
    (["all_reduce", "--hosts", "127.0.0.2,127.0.0.3", "-b", "64G", "-e", "64G"], "does not fit"),
    (["all_reduce_hd", "--hosts", _hosts(3)], "power-of-two"),
    (["all_reduce", "--hosts", "127.0.0.2,10.255.0.3"], "not on this machine"),
    (["all_reduce", "--hosts", "127.0.0.2,127.0.0.300"], "not an IPv4 address"),
    (["all_reduce", "--hosts", "127.0.0.2", "--hosts", "127.0.0.5,127.0.0.6"], "at least 2 ranks"),
    (["all_reduce", "--hosts", "127.0.0.2,127.0.0.3", "--hosts", "127.0.0.3,127.0.0.4"], "disjoint"),
])
def test_bad_input_is_one_line_and_starts_nothing(args, message):
    res = hpnlab("collective", *args, "--quiet", timeout=30)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie not yet reaped would still answer; the launcher reaps, so this is a live process
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


def test_a_rank_killed_mid_run_stops_the_others_and_leaves_nothing_running():
    job = Job("all_reduce", [[f"127.0.0.{i}"] for i in range(2, 6)], [1 << 20], iters=50,
                    warmup=0, line_rate_bps=20e6, base_port=22000, timeout_s=300)
    started = {}

    def on_started(popens):
        started["pids"] = [p.pid for p in popens]

        def kill_later():
            time.sleep(2.0)
            os.kill(popens[2].pid, 9)
        threading.Thread(target=kill_later, daemon=True).start()

    t0 = time.monotonic()
    with pytest.raises(UserError) as info:
        ranks.run_jobs([job], ranks.LocalSpawner(), progress=False, on_started=on_started)
    msg = str(info.value)
    assert "rank 2 (127.0.0.4) died" in msg and "the other ranks were stopped" in msg
    assert "\n" not in msg
    assert time.monotonic() - t0 < 150           # it did not wait for the peers' own timeouts (300 s)
    assert not any(_alive(pid) for pid in started["pids"])


def test_a_rank_that_cannot_bind_its_address_is_named():
    # 127.0.0.2 and 127.0.0.2 for two ranks with the same port cannot both bind
    job = Job("all_reduce", [["127.0.0.2"], ["127.0.0.3"]], [4096], iters=1, base_port=22100,
                    timeout_s=5)
    blocker = __import__("socket").socket(2, 2)
    blocker.bind(("127.0.0.3", 22101))
    try:
        with pytest.raises(UserError, match=r"rank 1 .*cannot bind UDP 127\.0\.0\.3:22101"):
            ranks.run_jobs([job], ranks.LocalSpawner(), progress=False)
    finally:
        blocker.close()


# ---- placement on the fabric graph (pure) ------------------------------------------------

def _graph(name):
    from hpnlab.fabric.scenario import graph, spec
    return graph.build(spec.load(name))


def _leaves(g, host, planes):
    return {leaf for _, leaf, d in g.edges(host, data=True) if d["plane"] in planes}


def test_same_rail_puts_every_rank_under_one_leaf_per_plane():
    g = _graph("mini-hpn")
    [job] = place(g, "same-rail", 4)
    assert len({frozenset(_leaves(g, p.host, {0, 1})) for p in job}) == 1
    assert all(len(p.addrs) == 2 and p.planes == [0, 1] for p in job)


def test_cross_rail_spreads_ranks_over_segments_and_rails():
    g = _graph("mini-rail")
    [job] = place(g, "cross-rail", 4)
    assert len({g.nodes[p.host]["segment"] for p in job}) == 2
    assert {p.rail for p in job} == {0, 1}
    # ring neighbours never share a leaf
    for a, b in zip(job, job[1:] + job[:1], strict=False):
        la = {leaf for _, leaf, d in g.edges(a.host, data=True) if d["rail"] == a.rail}
        lb = {leaf for _, leaf, d in g.edges(b.host, data=True) if d["rail"] == b.rail}
        assert not la & lb


def test_cross_plane_pins_each_job_to_one_plane_and_jobs_get_disjoint_hosts():
    g = _graph("mini-hpn")
    jobs = place(g, "cross-plane", 4, jobs=2)
    assert [{tuple(p.planes) for p in job} for job in jobs] == [{(0,)}, {(1,)}]
    assert not {p.host for p in jobs[0]} & {p.host for p in jobs[1]}


def test_concurrent_cross_rail_jobs_each_span_every_segment_on_disjoint_hosts():
    g = _graph("mini-hpn")                                 # 4 segments: 2 jobs used to sit on 2 each
    jobs = place(g, "cross-rail", 4, jobs=2)
    assert [{g.nodes[p.host]["segment"] for p in job} for job in jobs] == [{0, 1, 2, 3}] * 2
    assert not {p.host for p in jobs[0]} & {p.host for p in jobs[1]}
    assert _leaves(g, jobs[0][0].host, {0}) == _leaves(g, jobs[1][0].host, {0})   # they share leaves


def test_unequal_jobs_take_turns_until_every_rank_has_a_host():
    g = _graph("mini-hpn")
    jobs = place(g, "cross-rail", 8, jobs=2)               # every host of the fabric
    assert sorted(p.host for job in jobs for p in job) == sorted(h for h in g.nodes if g.nodes[h]["tier"] == 0)


def test_two_cross_campus_jobs_each_cross_the_long_haul():
    g = _graph("mini-cross-campus")
    jobs = place(g, "cross-campus", 4, jobs=2)
    assert [[g.nodes[p.host]["campus"] for p in job] for job in jobs] == [[0, 1, 0, 1]] * 2


def test_cross_campus_alternates_campuses_and_needs_several():
    g = _graph("mini-cross-campus")
    [job] = place(g, "cross-campus", 4)
    assert [g.nodes[p.host]["campus"] for p in job] == [0, 1, 0, 1]
    with pytest.raises(UserError, match="several campuses"):
        place(_graph("mini-hpn"), "cross-campus", 4)


def test_placement_that_does_not_fit_says_how_many_hosts_there_are():
    g = _graph("mini-hpn")
    with pytest.raises(UserError, match="need 20 hosts, the scenario has 16"):
        place(g, "cross-rail", 10, jobs=2)
    with pytest.raises(UserError, match="unknown placement"):
        place(g, "same-plane", 4)


def test_the_progress_line_carries_nccl_tests_busbw_of_the_size_just_done():
    """The bar (and the browser view, through the same callback) shows busbw so far: rank 0's median
    out-of-place time, times nccl-tests' factor; nothing when no time was measured."""
    from hpnlab.fabric.transport import ranks
    from hpnlab.fabric.workload.jobs import Job
    job = Job("all_reduce", addrs=[["10.0.0.1"], ["10.0.0.2"], ["10.0.0.3"], ["10.0.0.4"]], sizes=[1 << 20])
    # 1 MiB in 10 ms: algbw 0.839 Gbit/s; all-reduce on 4 ranks: x 2*3/4 = 1.26 Gbit/s
    assert ranks._busbw_so_far(job, 1 << 20, 0.01) == ", busbw 1.26 Gbit/s (rank 0)"
    assert ranks._busbw_so_far(job, 1 << 20, None) == ""


def test_the_machines_busy_share_is_the_median_of_the_ranks_readings_over_their_timed_spans():
    def rank(total, idle):
        return {"cpu": {"timed_cpu_s": 1.0, "timed_wall_s": 2.0, "machine_ticks": [total, idle]}}
    summary = report.cpu_summary([rank(100, 25), rank(200, 100), rank(400, 80), rank(0, 0)])
    assert summary["machine_busy"] == pytest.approx(0.75)        # of 0.75, 0.5, 0.8; no ticks: no reading
    assert report.cpu_summary([{"cpu": {"timed_cpu_s": 1.0, "timed_wall_s": 2.0}}])["machine_busy"] is None


# ---- concurrent jobs start together -------------------------------------------------------

class _LateSecondJob(ranks.LocalSpawner):
    """Spawns job 1's ranks ``delay_s`` after job 0's: a job whose ranks are slow to start."""

    def __init__(self, delay_s):
        super().__init__()
        self.delay_s, self.waited = delay_s, False

    def spawn(self, job, rank):
        if job.job == 1 and not self.waited:
            time.sleep(self.delay_s)
            self.waited = True
        return super().spawn(job, rank)


def test_concurrent_jobs_start_their_iterations_together_when_one_jobs_ranks_start_late():
    jobs = [Job("all_gather", [[f"127.0.{j}.{i}"] for i in range(2, 4)], [12 << 10], iters=2, warmup=0,
                line_rate_bps=50e6, base_port=22200 + 100 * j, timeout_s=15, job=j) for j in (0, 1)]
    late_s = 3.0
    results = ranks.run_jobs(jobs, _LateSecondJob(late_s), progress=False)
    starts = [r["started_at"] for res in results for r in res["ranks"]]
    assert all(res["rows"][0]["oop"]["wrong"] == 0 for res in results)
    # without the hold job 0 starts (and finishes) about late_s before job 1 (measured: 2.15 s at a 2 s delay);
    # with it every rank starts on the same go, whatever the machine's load adds to each rank's wake-up
    assert max(starts) - min(starts) < late_s / 2


def test_a_single_job_is_not_held():
    job = Job("all_gather", [["127.0.0.2"], ["127.0.0.3"]], [12 << 10], iters=1, warmup=0,
              line_rate_bps=50e6, base_port=22400, timeout_s=15)
    [res] = ranks.run_jobs([job], ranks.LocalSpawner(), progress=False)
    assert res["params"]["hold"] is False


def test_a_held_rank_starts_on_go():
    r, w = os.pipe()
    os.write(w, b"go\n")
    with os.fdopen(r) as stream:
        ranks.wait_go(1.0, stream)


def test_a_held_rank_whose_launcher_closes_its_input_says_so():
    r, w = os.pipe()
    os.close(w)
    with os.fdopen(r) as stream, pytest.raises(UserError, match="closed this rank's input"):
        ranks.wait_go(1.0, stream)


def test_a_held_rank_that_never_hears_go_gives_up_within_its_bound():
    r, w = os.pipe()
    t0 = time.monotonic()
    try:
        with os.fdopen(r) as stream, pytest.raises(UserError, match=r"did not start the jobs within 0\.2 s"):
            ranks.wait_go(0.2, stream)
    finally:
        os.close(w)
    assert time.monotonic() - t0 < 2.0
