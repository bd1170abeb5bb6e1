"""`hpnlab collective` and the rank launcher over loopback: one process per rank on 127.0.0.x,
data verified at every rank, concurrent jobs, bad input in one line, and a rank killed
mid-run stopping the others with nothing left behind."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpnlab.fabric import ranks
from hpnlab.fabric.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
HPNLAB = [sys.executable, "-m", "hpnlab.cli"]


def hpnlab(*args, timeout=120):
    return subprocess.run(HPNLAB + list(args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _hosts(n, first=2, net="127.0.0"):
    return ",".join(f"{net}.{first + i}" for i in range(n))


@pytest.mark.parametrize("collective,transport,entropy", [
    ("all_reduce", "roce", "spray"), ("all_to_all", "roce", "flow"), ("all_reduce", "tcp", "flow"),
    ("all_reduce_hd", "roce", "flow"), ("broadcast", "tcp", "flow")])
def test_collective_over_loopback_verifies_every_element(tmp_path, collective, transport, entropy):
    out = tmp_path / "res"
    res = hpnlab("collective", collective, "--hosts", _hosts(4), "-b", "16K", "-e", "64K", "-n", "2",
                 "--transport", transport, "--entropy", entropy, "--line-rate", "50M",
                 "--port", "21000", "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    assert "# Out of bounds values : 0 OK" in res.stdout
    doc = json.loads((out / "results.json").read_text())
    result = doc["results"][0]
    assert result["collective"] == collective and result["nranks"] == 4
    assert [row["size"] for row in result["rows"]] == [16384, 32768, 65536]
    for row in result["rows"]:
        assert row["oop"]["wrong"] == 0 and row["oop"]["busbw_gbs"] > 0
    assert (out / "busbw.png").stat().st_size > 0 and len(list(out.glob("flows-*-job0.png"))) == 1
    assert 0 < result["cpu"]["max_rank_share"] <= 1.5
    assert doc["meta"]["kernel"]


def test_concurrent_jobs_on_disjoint_hosts_each_get_a_table(tmp_path):
    res = hpnlab("collective", "all_gather", "--hosts", _hosts(3, 2), "--hosts", _hosts(3, 10),
                 "-b", "12K", "-e", "12K", "-n", "2", "--line-rate", "50M", "--out", str(tmp_path), "--quiet")
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [r["job"] for r in doc["results"]] == [0, 1]
    assert res.stdout.count("# Out of bounds values : 0 OK") == 2


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
    job = ranks.Job("all_reduce", [[f"127.0.0.{i}"] for i in range(2, 6)], [1 << 20], iters=50,
                    warmup=0, line_rate_bps=20e6, base_port=22000, timeout_s=30)
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
    assert time.monotonic() - t0 < 25            # it did not wait for the peers' own timeouts
    assert not any(_alive(pid) for pid in started["pids"])


def test_a_rank_that_cannot_bind_its_address_is_named():
    # 127.0.0.2 and 127.0.0.2 for two ranks with the same port cannot both bind
    job = ranks.Job("all_reduce", [["127.0.0.2"], ["127.0.0.3"]], [4096], iters=1, base_port=22100,
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
    from hpnlab.fabric import graph, spec
    return graph.build(spec.load(name))


def _leaves(g, host, planes):
    return {leaf for _, leaf, d in g.edges(host, data=True) if d["plane"] in planes}


def test_same_rail_puts_every_rank_under_one_leaf_per_plane():
    g = _graph("mini-hpn")
    [job] = ranks.place(g, "same-rail", 4)
    assert len({frozenset(_leaves(g, p.host, {0, 1})) for p in job}) == 1
    assert all(len(p.addrs) == 2 and p.planes == [0, 1] for p in job)


def test_cross_rail_spreads_ranks_over_segments_and_rails():
    g = _graph("mini-rail")
    [job] = ranks.place(g, "cross-rail", 4)
    assert len({g.nodes[p.host]["segment"] for p in job}) == 2
    assert {p.rail for p in job} == {0, 1}
    # ring neighbours never share a leaf
    for a, b in zip(job, job[1:] + job[:1]):
        la = {leaf for _, leaf, d in g.edges(a.host, data=True) if d["rail"] == a.rail}
        lb = {leaf for _, leaf, d in g.edges(b.host, data=True) if d["rail"] == b.rail}
        assert not la & lb


def test_cross_plane_pins_each_job_to_one_plane_and_jobs_get_disjoint_hosts():
    g = _graph("mini-hpn")
    jobs = ranks.place(g, "cross-plane", 4, jobs=2)
    assert [{tuple(p.planes) for p in job} for job in jobs] == [{(0,)}, {(1,)}]
    assert not {p.host for p in jobs[0]} & {p.host for p in jobs[1]}


def test_cross_campus_alternates_campuses_and_needs_several():
    g = _graph("mini-cross-campus")
    [job] = ranks.place(g, "cross-campus", 4)
    assert [g.nodes[p.host]["campus"] for p in job] == [0, 1, 0, 1]
    with pytest.raises(UserError, match="several campuses"):
        ranks.place(_graph("mini-hpn"), "cross-campus", 4)


def test_placement_that_does_not_fit_says_how_many_hosts_there_are():
    g = _graph("mini-hpn")
    with pytest.raises(UserError, match="need 20 hosts, the scenario has 16"):
        ranks.place(g, "cross-rail", 10, jobs=2)
    with pytest.raises(UserError, match="unknown placement"):
        ranks.place(g, "same-plane", 4)
