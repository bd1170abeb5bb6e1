"""Collectives on the emulated mini-hpn (real OVS, the controller process, shaped links, the
ECN stage), run through the library (``hpnlab.fabric.experiments.runner``): data verified at every
rank, busbw as nccl-tests defines it, spray using both planes where per-flow entropy keeps a
flow on one (from the hosts' interface counters), the results pipeline, and a rank killed on
an emulated host. How close busbw comes to line rate is a speed figure and lives in
``tools/bench/bench_collective.py``, not here."""
from __future__ import annotations

import os
import threading
import time

import pytest

from hpnlab.fabric.emulation import timeline
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.runner import Plan, Run
from hpnlab.fabric.scenario import graph
from hpnlab.fabric.transport import ranks
from hpnlab.fabric.workload import report

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

# busbw / algbw as nccl-tests defines it, written out independently of hpnlab.fabric.workload.collectives
NCCL_TESTS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}


@pytest.mark.parametrize("collective,transport,entropy", [
    ("all_reduce", "roce", "spray"), ("all_reduce", "tcp", "flow"),
    ("all_to_all", "roce", "flow"), ("all_to_all", "tcp", "flow")])
def test_collective_on_mini_hpn_completes_with_data_verified(mini_hpn, collective, transport, entropy):
    plan = Plan(collectives=collective, transports=transport, entropies=entropy, ranks=8,
                placement="cross-rail", sizes=experiment.sweep("64K", "128K"), iterations=2)
    [res] = experiment.run(plan, mini_hpn, progress=False)["results"]
    assert res["nranks"] == 8 and len(set(res["hosts"])) == 8
    assert [row["size"] for row in res["rows"]] == [65536, 131072]
    for row in res["rows"]:
        cell = row["oop"]
        assert cell["wrong"] == 0                   # every element checked at every rank
        algbw = row["size"] / (cell["time_us"] * 1e-6) / 1e9
        assert cell["busbw_gbs"] == pytest.approx(algbw * NCCL_TESTS_FACTOR[collective](8))
    # the traffic crossed the fabric: the ranks' hosts span segments (leaves)
    segs = {mini_hpn.graph.nodes[h]["segment"] for h in res["hosts"]}
    assert len(segs) > 1


def test_spray_puts_a_real_share_of_every_ranks_bytes_on_both_planes_and_flow_keeps_one(mini_hpn):
    # one elephant flow per rank (permutation), measured by the hosts' own interface counters:
    # per-flow entropy hashes a flow onto one plane; spraying alternates planes packet by packet
    plan = Plan(collectives="permutation", transports="roce", entropies="flow,spray", ranks=4,
                placement="cross-rail", sizes="256K", iterations=2, inplace=False)
    flow, spray = experiment.run(plan, mini_hpn, progress=False)["results"]
    assert (flow["entropy"], spray["entropy"]) == ("flow", "spray")
    for res in (flow, spray):
        assert res["rows"][0]["oop"]["wrong"] == 0
        assert set(res["tx_bytes_by_plane"]) == set(res["hosts"])
    for host, per_plane in spray["tx_bytes_by_plane"].items():
        assert len(per_plane) == 2 and min(per_plane) >= 0.35 * sum(per_plane), (host, per_plane)
    # a one-path flow whose timer fired twice in a row moves to a new path, maybe on the other plane
    # (path migration): whether a loaded machine delays an ACK that long is timing, so such a rank is
    # not held to one plane
    migrated = {flow["hosts"][f["src"]] for f in flow.get("flows", []) if f.get("migrations")}
    for host, per_plane in flow["tx_bytes_by_plane"].items():
        assert host in migrated or max(per_plane) >= 0.9 * sum(per_plane), (host, per_plane)
    # and the bytes counted are the collective's: at least each rank's buffer per iteration
    for res in (flow, spray):
        for per_plane in res["tx_bytes_by_plane"].values():
            assert sum(per_plane) >= (plan.iterations + plan.warmup) * 256 * 1024


def test_run_pipeline_writes_tables_json_and_plots(mini_hpn, tmp_path):
    plan = Plan(collectives="permutation", transports="roce", entropies="flow,spray", ranks=4, jobs=2,
                sizes="64K", iterations=1)
    doc = experiment.run(plan, mini_hpn, progress=False)
    results = doc["results"]
    assert [(r["entropy"], r["job"]) for r in results] == [("flow", 0), ("flow", 1), ("spray", 0), ("spray", 1)]
    hosts0, hosts1 = set(results[0]["hosts"]), set(results[1]["hosts"])
    assert not hosts0 & hosts1                                  # concurrent jobs on disjoint hosts
    assert doc["meta"]["target"] == {"kind": "emulation", "scenario": "mini-hpn"}
    lines: list[str] = []
    path = report.save(doc, tmp_path, say=lines.append)
    text = "\n".join(lines)
    assert text.count("# Avg bus bandwidth") == 4 and "busbw / line rate" in text
    assert report.read_json(path)["meta"]["plan"]["entropies"] == ["flow", "spray"]
    assert (tmp_path / "busbw.png").is_file()
    assert len(list(tmp_path.glob("flows-permutation-roce-*-job*.png"))) == 4


def test_a_rank_killed_on_an_emulated_host_stops_the_others(mini_hpn):
    plan = Plan(collectives="all_reduce", transports="roce", ranks=4, sizes="1M", iterations=20)
    [job] = plan.jobs_on(mini_hpn.graph)[Run("all_reduce", "roce", "flow")]
    assert job.labels is not None
    spawner = ranks.EmulationSpawner(mini_hpn, {0: job.labels})
    pids: list[int] = []

    def on_started(popens):
        pids.extend(p.pid for p in popens)
        threading.Timer(3.0, lambda: os.kill(popens[1].pid, 9)).start()

    with pytest.raises(UserError, match=rf"rank 1 \({job.labels[1]} .*\) died .* the other ranks were stopped"):
        ranks.run_jobs([job], spawner, progress=False, on_started=on_started)
    time.sleep(0.2)
    for pid in pids:
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    """A process that still runs (a zombie not yet reaped does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_collective_runs_through_a_link_failure_and_repair_with_every_byte_verified(mini_hpn):
    # the timeline runs beside the ranks: an uplink of the first rank's leaf fails under the
    # collective and comes back; the transport recovers and every rank checks every element
    plan = Plan(collectives="all_reduce", transports="roce", entropies="spray", ranks=4,
                placement="cross-rail", sizes="1M", iterations=4)
    [job] = plan.jobs_on(mini_hpn.graph)[Run("all_reduce", "roce", "spray")]
    assert job.labels is not None
    g = mini_hpn.graph
    leaf = next(n for n in g.adj[job.labels[0]] if g.nodes[n].get("plane") == 0)
    spine = next(n for n in g.adj[leaf] if g.nodes[n]["tier"] == 2)
    tl = timeline.load({"events": [{"at": 0.3, "action": "link_down", "link": [leaf, spine]},
                                   {"at": 1.5, "action": "link_up", "link": [leaf, spine]}]}, g)
    t0 = time.time()
    [res] = experiment.run(plan, mini_hpn, progress=False, timeline=tl)["results"]
    assert all(row["oop"]["wrong"] == 0 for row in res["rows"])
    assert [r["action"] for r in res["timeline"]] == ["link_down", "link_up"]
    assert all(t0 < r["wall"] < time.time() for r in res["timeline"])
    fail, repair = res["failover"]                # the failure's figures and the repair's, from the receivers
    assert fail["event"] == f"link_down {leaf}-{spine}" and fail["exactly_once"]
    assert repair["event"] == f"link_up {leaf}-{spine}" and repair["t"] > fail["t"]
    assert fail["flows"] == repair["flows"] == len(res["flows"])
    ports = g.edges[leaf, spine, 0]["ports"]
    assert all(mini_hpn.faults.is_up(graph.intf_name(n, ports[n])) for n in (leaf, spine))   # repaired
