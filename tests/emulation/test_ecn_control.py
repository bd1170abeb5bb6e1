"""Dynamic ECN on the emulated mini-hpn: the controller process reads the ECN stage and the
switches' port statistics, and thresholds its policy decides are applied live to the real
switch ports (eBPF marker here, RED on full kernels). Two policies from a file, named the way a
user names one, replace each other through ``emu.controller.set_ecn_policy``: *eager* marks as soon
as a packet finds any queue, *quiet* never marks. Marking on a real overloaded port follows the
controller's choice, and the ``roce`` transport's DCQCN rate falls only when marks arrive."""
from __future__ import annotations

import json
import time

import pytest
from support.paths import EXAMPLES

from hpnlab.fabric.emulation.traffic import udp_overload
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.runner import Plan

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

#: the example policies file (Eager, Quiet), as a user writes one
POLICIES = EXAMPLES / "ecn_policies.py"


@pytest.fixture(scope="module")
def emu(mini_hpn):
    """The shared mini-hpn (its controller samples telemetry every 200 ms), given back with the
    start-up policy (every port back to its start-up thresholds)."""
    assert mini_hpn.options.controller.telemetry_interval_ms == 200
    policy = mini_hpn.controller.ecn_policy
    mini_hpn.policy_file = POLICIES
    try:
        yield mini_hpn
    finally:
        mini_hpn.controller.set_ecn_policy(policy)


def _use(emu, name: str, intf: str, kmin: int) -> None:
    """Switch the controller to a test policy and wait until the stage holds its Kmin on ``intf``."""
    emu.controller.set_ecn_policy(f"{emu.policy_file}:{name}")
    deadline = time.monotonic() + 3
    while emu.ecn.thresholds(intf)["kmin"] != kmin:
        assert time.monotonic() < deadline, f"the controller did not apply {name} to {intf}"
        time.sleep(0.05)


def _bottleneck(emu, dst="h5"):
    leaf = next(p["leaf"] for p in emu.interfaces(dst) if p["plane"] == 0)
    return next(p for p in emu.switch_ports() if p["switch"] == leaf and p["peer"] == dst)


def _overload(emu, seconds=1.5, port=9100) -> tuple[dict, float, float]:
    """h1 and h2 send ECT(0) UDP at 8 Mbit/s each to h5 (its port: 10 Mbit/s): the stage's counters
    of that port over the phase, and the phase's monotonic start and end."""
    return udp_overload(emu, "h5", ("h1", "h2"), _bottleneck(emu)["intf"], seconds=seconds, port=port)


def _telemetry(emu) -> list[dict]:
    return [json.loads(x) for x in emu.controller.telemetry_file.read_text().splitlines() if x.strip()]


def test_thresholds_the_controller_applies_live_change_the_marking_rate_on_a_real_port(emu):
    port = _bottleneck(emu)
    _use(emu, "Eager", port["intf"], 0)
    eager, e0, e1 = _overload(emu)
    _use(emu, "Quiet", port["intf"], 1 << 30)
    quiet, q0, q1 = _overload(emu)
    time.sleep(1.3)                       # the controller's last samples of the phase (drops: every 1 s)
    assert eager["ect"] > 100 and quiet["ect"] > 100   # both phases overloaded the port
    assert eager["ce_marked"] / eager["ect"] > 0.5
    assert quiet["ce_marked"] == 0
    # the controller saw it too: its telemetry of that port, and the changes with their reasons
    lines = _telemetry(emu)
    rows = [(ln["t"], r) for ln in lines if ln["kind"] == "sample" for r in ln["ports"]
            if (r["switch"], r["port"]) == (port["switch"], port["port"])]
    eager_pps = [r["ce_marked_pps"] for t, r in rows if e0 + 0.3 < t <= e1]
    quiet_pps = [r["ce_marked_pps"] for t, r in rows if q0 + 0.3 < t <= q1]
    assert eager_pps and quiet_pps
    assert max(eager_pps) > 100 and max(quiet_pps) == 0
    assert max(r["utilisation"] for t, r in rows if e0 < t <= e1 + 0.4) > 0.5
    assert sum(r["drops"] for t, r in rows if e0 < t <= e1 + 1.2) > 0      # 16 Mbit/s into 10: the buffer drops
    changes = [ln for ln in lines if ln["kind"] == "change" and ln["switch"] == port["switch"]
               and ln["port"] == port["port"]]
    reasons = [c["reason"] for c in changes if c["reason"].startswith("example:")]
    assert reasons[-2:] == ["example: mark on any queue", "example: never mark"]


def test_roce_dcqcn_rate_falls_only_when_the_controllers_thresholds_make_marks(emu):
    intf = _bottleneck(emu)["intf"]
    plan = Plan(collectives="permutation", transports="roce", entropies="flow", ranks=2, sizes="128K",
                iterations=1, warmup=0, inplace=False, placement="cross-rail")
    policy = f"{emu.policy_file}:Quiet"
    _use(emu, "Quiet", intf, 1 << 30)
    quiet = experiment.run(plan, emu, progress=False, ecn_policy=policy)
    policy = f"{emu.policy_file}:Eager"
    eager = experiment.run(plan, emu, progress=False, ecn_policy=policy)

    # one record per directed flow: the sender's counters (cnps, DCQCN rate samples [time, bytes
    # acknowledged, rate]) joined with the receiver's (ce_marks)
    quiet_flows, eager_flows = quiet["results"][0]["flows"], eager["results"][0]["flows"]
    assert quiet_flows and eager_flows
    assert sum(f["ce_marks"] for f in quiet_flows) == 0
    line_rate = max(s[2] for f in quiet_flows for s in f["samples"])
    for f in quiet_flows:
        assert f["cnps"] == 0
        assert {s[2] for s in f["samples"]} == {line_rate}                    # never cut: line rate throughout
    assert sum(f["ce_marks"] for f in eager_flows) > 0
    cut = [f for f in eager_flows if f["cnps"] > 0]
    assert cut
    for f in cut:
        assert f["samples"][0][2] == line_rate                                # it started at line rate
        assert min(s[2] for s in f["samples"]) < 0.9 * line_rate              # and fell once marks came
    # the run's JSON carries the controller's telemetry: series per port and the changes
    assert eager["meta"]["ecn_policy"] == policy
    tel = eager["telemetry"]
    assert tel["policy"] == "eager"
    assert any(max(p["tx_mbps"]) > 0 for p in tel["ports"].values())


def test_a_replay_of_the_controllers_telemetry_file_makes_every_decision_the_controller_made(emu):
    """The controller's decisions are the pure policy's on its own telemetry: the built-in dynamic
    policy under a real overload, the telemetry file replayed offline (``controller/ecn_replay.py``)
    gives the same changes at the same ticks, and the same thresholds in force at every tick."""
    from hpnlab.controller import ecn_replay

    port = _bottleneck(emu)
    emu.controller.set_ecn_policy("dynamic")
    _overload(emu, port=9102)
    time.sleep(1.3)                       # the controller's last samples of the phase (drops: every 1 s)
    r = ecn_replay.replay(ecn_replay.read(emu.controller.telemetry_file))
    dynamic = [s for s in r["segments"] if s["recorded_policy"] == "dynamic"]
    assert dynamic and dynamic[-1]["ticks"] > 5 and dynamic[-1]["skipped"] is None
    cuts = [c for c in dynamic[-1]["changes"] if (c["switch"], c["port"]) == (port["switch"], port["port"])
            and c["new"]["kmin"] < c["old"]["kmin"]]
    assert cuts                           # the overload made the policy cut that port's Kmin (in the replay too)
    assert r["agree"], (r["only_replayed"][:3], r["only_recorded"][:3])
    assert r["in_force_differ"] == 0
