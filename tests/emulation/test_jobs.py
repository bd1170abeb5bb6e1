"""Two different jobs at once on the emulated mini-hpn (real OVS, the controller, shaped links,
the ECN stage): an all-reduce and an incast on disjoint hosts, or an incast on an all-to-all's own
hosts (on=), overlapping in time, every element checked, the incast's per-message completion
times reported, under a static ECN preset applied to every switch port."""
from __future__ import annotations

import pytest

from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.workload import ecn as ecn_settings

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


def _span(result: dict) -> tuple[float, float]:
    """First and last rate sample (wall clock) of a job's flows."""
    ts = [s[0] for f in result["flows"] for s in f.get("samples", [])]
    return min(ts), max(ts)


def test_an_allreduce_and_an_incast_run_at_once_on_disjoint_hosts(mini_hpn):
    plan = experiment.Plan(job_specs="all_reduce:ranks=4,size=256K,iters=2;incast:ranks=5,msg=16K,iters=10,gap=10ms",
                           transports="roce", entropies="flow", inplace=False)
    stage = mini_hpn.ecn
    before = {intf: stage.thresholds(intf) for intf in stage.ports}
    try:
        doc = experiment.run(plan, mini_hpn, progress=False, ecn_thresholds="low")
    finally:   # as it found them: the emulation is shared with the next modules (conftest)
        for intf, t in before.items():
            stage.set_thresholds(kmin=t["kmin"], kmax=t["kmax"], pmax=t["pmax"], enabled=t["enabled"], ports=intf)
    ar, inc = doc["results"]
    assert (ar["collective"], ar["nranks"], inc["collective"], inc["nranks"]) == ("all_reduce", 4, "incast", 5)
    assert not set(ar["hosts"]) & set(inc["hosts"])
    for res in (ar, inc):
        assert res["rows"][0]["oop"]["wrong"] == 0              # every element checked at every rank
    (a0, a1), (i0, i1) = _span(ar), _span(inc)
    assert a0 < i1 and i0 < a1                                   # the two jobs overlapped in time
    msgs = inc["rows"][0]["oop"]["messages"]
    assert msgs["messages"] == 4 * 10                            # 4 senders x 10 timed iterations
    assert 0 < msgs["p50_us"] <= msgs["p99_us"] <= msgs["max_us"]
    assert min(inc["rows"][0]["oop"]["message_times_s"]) > 0      # no message ends before it starts
    # the preset was applied to every switch port, computed from that port's rate
    assert doc["meta"]["ecn"]["setting"] == "low"
    port = next(iter(mini_hpn.ecn.ports.values()))
    want = ecn_settings.preset("low", port.rate_mbps, mini_hpn.scenario.emulation.mtu, port.limit_bytes)
    assert doc["meta"]["ecn"]["by_rate_mbps"][f"{port.rate_mbps:g}"]["kmin"] == want.kmin
    assert {"ce_fraction", "drops", "queue_p99_bytes"} <= set(ar["switch_ecn"])


def test_a_job_with_on_shares_the_hosts_of_the_job_it_names(mini_hpn):
    jobs = "all_to_all:ranks=4,size=512K,iters=2;incast:ranks=4,msg=4K,iters=10,gap=10ms,on=1"
    plan = experiment.Plan(job_specs=jobs, transports="roce", entropies="flow", inplace=False)
    doc = experiment.run(plan, mini_hpn, progress=False)
    a2a, inc = doc["results"]
    assert inc["hosts"] == a2a["hosts"]                           # one host each rank of both jobs
    for res in (a2a, inc):
        assert res["rows"][0]["oop"]["wrong"] == 0              # every element checked at every rank
    (a0, a1), (i0, i1) = _span(a2a), _span(inc)
    assert a0 < i1 and i0 < a1                                   # they ran at once, through the same NICs
    assert inc["rows"][0]["oop"]["messages"]["messages"] == 3 * 10
