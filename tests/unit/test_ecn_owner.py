"""ECN has one owner: one ``Thresholds`` type and one default rule (``fabric/workload/ecn.py``), one
frame-overhead constant (``fabric/scenario/rates.py``), and one writer of a port's ECN and shaping state
(``EcnStage.write`` and ``ecn.reshape`` in ``fabric/emulation/ecn.py``) that the controller's actuator,
a run's static setting and the routing comparison go through.

The writer runs here on stand-in BPF maps (the marker's maps as dicts, values packed and unpacked
with the marker's own layouts); the same writer on the kernel's maps is tests/emulation/test_ecn_control.py
(the controller) and test_jobs.py (a static setting)."""
from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpnlab.controller import actuators, ecn_policy
from hpnlab.fabric.emulation import ecn, shaping
from hpnlab.fabric.emulation.ecn import EcnPort, EcnStage
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner
from hpnlab.fabric.routing.telemetry import PortInfo
from hpnlab.fabric.scenario.rates import ETH_HEADER, frame_bytes
from hpnlab.fabric.workload import ecn as ecn_settings
from hpnlab.fabric.workload.ecn import Thresholds, default_thresholds

ROOT = Path(__file__).resolve().parents[2]


class Map:
    """A pinned BPF hash map as a dict, its values packed with the marker's layout."""

    def __init__(self, value: struct.Struct) -> None:
        self.value = value
        self.raw: dict[int, bytes] = {}

    def lookup(self, key: int) -> tuple | None:
        return self.value.unpack(self.raw[key]) if key in self.raw else None

    def update(self, key: int, values: tuple) -> None:
        self.raw[key] = self.value.pack(*values)

    def close(self) -> None:
        pass


def bpf_stage(rates: dict[str, float], mtu: int = 1500) -> EcnStage:
    """The eBPF stage on stand-in maps, every port at the default rule as ``for_emulation`` leaves it."""
    ports = {intf: EcnPort(intf, intf.split("-")[0], i + 1, 100 + i, rate, 62_500)
             for i, (intf, rate) in enumerate(rates.items())}
    stage = EcnStage("bpf", ports, None, mtu)
    stage._cfg, stage._state = Map(ecn._CFG), Map(ecn._STATE)        # type: ignore[assignment]
    for port in ports.values():
        stage._write_cfg(port, default_thresholds(port.rate_mbps * 1e6, mtu), True)
    return stage


def in_force(stage: EcnStage, intf: str) -> Thresholds:
    th = stage.thresholds(intf)
    return Thresholds(th["kmin"], th["kmax"], round(th["pmax"], 4))


# ---- one type, one default rule, one frame constant ---------------------------------------------

def test_the_controller_policies_thresholds_are_the_static_settings_type():
    assert ecn_policy.Thresholds is ecn_settings.Thresholds


@given(rate_bps=st.floats(1e5, 4e11), mtu=st.sampled_from([1500, 4096, 9000]))
def test_the_default_rule_is_four_frames_or_two_ms_of_queue_kmax_four_kmin_pmax_a_fifth(rate_bps, mtu):
    th = default_thresholds(rate_bps, mtu)
    assert th.kmin == int(max(4 * (mtu + ETH_HEADER), rate_bps / 8 * 0.002))
    assert (th.kmax, th.pmax) == (4 * th.kmin, 0.2)


@pytest.mark.parametrize("rate_mbps", [1, 10, 20, 40, 1000, 100_000])
def test_the_default_preset_the_controllers_start_up_and_a_replay_start_from_the_one_rule(rate_mbps):
    rule = default_thresholds(rate_mbps * 1e6)
    assert ecn_settings.preset("default", rate_mbps) == rule
    null = actuators.NullActuator({("l0", 1): PortInfo("l0", 1, "s0", rate_mbps * 1e6)})
    assert null.current() == {("l0", 1): rule}


def test_a_reason_is_not_part_of_the_value_and_only_named():
    assert Thresholds(1, 4, 0.2, reason="why") == Thresholds(1, 4, 0.2)
    positional: tuple[Any, ...] = (1, 4, 0.2, "why")
    with pytest.raises(TypeError):
        Thresholds(*positional)


def test_the_frame_overhead_is_written_once():
    """No module but fabric/scenario/rates.py adds 14 to an MTU or names a 14-byte header."""
    adds = re.compile(r"mtu\s*\+\s*14\b|\b14\s*\+\s*\w*mtu|^\s*(ETH\w*|FRAME_OVERHEAD)\s*(:\s*int\s*)?=\s*14\b", re.M)
    found = [f"{p.relative_to(ROOT)}" for d in ("fabric", "controller", "cli", "tools", "topologies")
             for p in sorted((ROOT / d).rglob("*.py")) if adds.search(p.read_text())
             and p != ROOT / "fabric" / "scenario" / "rates.py"]
    assert found == []


def test_shaping_red_and_the_policies_count_one_frame_alike():
    frame = frame_bytes(4096)
    assert any(f"quantum {frame}" in line for line in shaping.tc_lines(shaping.Shape("x", 10.0, mtu=4096), False))
    red = ecn.red_args(8000, 32000, 0.2, mtu=4096, rate_mbps=10.0, limit_bytes=200_000)
    assert red[red.index("avpkt") + 1] == str(frame)
    assert ecn_policy.DynamicPolicy(mtu=4096).kmin_bounds(1e3)[0] == frame


# ---- one writer ---------------------------------------------------------------------------------

def test_write_sets_each_named_port_and_leaves_the_others():
    stage = bpf_stage({"l0-eth1": 10.0, "l0-eth2": 10.0})
    before = in_force(stage, "l0-eth2")
    stage.write({"l0-eth1": Thresholds(3000, 12000, 0.5)})
    assert in_force(stage, "l0-eth1") == Thresholds(3000, 12000, 0.5)
    assert in_force(stage, "l0-eth2") == before


def test_a_bad_value_is_one_line_and_no_port_is_written():
    stage = bpf_stage({"l0-eth1": 10.0, "l0-eth2": 10.0})
    before = {i: in_force(stage, i) for i in stage.ports}
    with pytest.raises(UserError, match="kmin <= kmax"):
        stage.write({"l0-eth1": Thresholds(3000, 12000, 0.5), "l0-eth2": Thresholds(9000, 100, 0.5)})
    assert {i: in_force(stage, i) for i in stage.ports} == before


def test_write_keeps_a_ports_marking_off_unless_told():
    stage = bpf_stage({"l0-eth1": 10.0})
    stage.set_thresholds(enabled=False)
    stage.write({"l0-eth1": Thresholds(3000, 12000, 0.5)})
    assert stage.thresholds("l0-eth1")["enabled"] is False
    stage.write({"l0-eth1": Thresholds(3000, 12000, 0.5)}, enabled=True)
    assert stage.thresholds("l0-eth1")["enabled"] is True


def test_set_thresholds_keeps_what_it_is_not_given():
    stage = bpf_stage({"l0-eth1": 10.0})
    start = in_force(stage, "l0-eth1")
    stage.set_thresholds(pmax=0.5)
    assert in_force(stage, "l0-eth1") == Thresholds(start.kmin, start.kmax, 0.5)


def test_a_new_rate_is_the_markers_drain_rate_and_its_defaults_are_the_rules_at_it():
    stage = bpf_stage({"l0-eth1": 10.0})
    stage.set_thresholds(kmin=3000, kmax=12000, pmax=0.5)
    stage.set_rate("l0-eth1", 40.0)
    assert stage.ports["l0-eth1"].rate_mbps == 40.0
    assert stage.thresholds("l0-eth1")["rate_bytes_per_s"] == int(40e6 / 8)
    assert in_force(stage, "l0-eth1") == default_thresholds(40e6)


def test_the_controllers_actuator_writes_through_the_stage():
    stage = bpf_stage({"l0-eth1": 10.0, "l0-eth2": 10.0})
    ports = {("l0", 1): PortInfo("l0", 1, "s0", 10e6), ("l0", 2): PortInfo("l0", 2, "s1", 10e6)}
    act = actuators.EmulatedActuator(stage, ports)
    act.apply({("l0", 2): Thresholds(3000, 12000, 0.3, reason="policy")})
    assert in_force(stage, "l0-eth2") == Thresholds(3000, 12000, 0.3)
    assert act.current() == {("l0", 1): default_thresholds(10e6), ("l0", 2): Thresholds(3000, 12000, 0.3)}


def test_a_runs_static_setting_writes_every_port_at_its_own_rate_through_the_stage():
    stage = bpf_stage({"l0-eth1": 10.0, "l0-eth2": 20.0})
    stage.set_thresholds(enabled=False)

    class Emu:
        ecn = stage

    meta = runner._OnEmulation(Emu()).apply_ecn("low")
    for intf, port in stage.ports.items():
        want = ecn_settings.preset("low", port.rate_mbps, 1500, port.limit_bytes)
        assert in_force(stage, intf) == Thresholds(want.kmin, want.kmax, want.pmax)
        assert stage.thresholds(intf)["enabled"] is True
    assert meta["by_rate_mbps"]["20"] == want.as_setting()


def test_a_rate_change_is_the_start_up_shapings_class_at_the_new_rate():
    shape = shaping.Shape("l0-eth1", 25.0, mtu=4096)
    (klass,) = [line for line in shaping.tc_lines(shape, netem=False) if line.startswith("class add")]
    assert shaping.rate_change_lines(shape) == [klass.replace("class add", "class change", 1)]


def _tc_run(monkeypatch) -> list[str]:
    """What ``ecn.reshape`` asks tc to do, one command a line (tc itself stood in for)."""
    ran: list[str] = []

    def run(argv, input=None, **kw):
        ran.extend(input.splitlines() if argv[:2] == ["tc", "-batch"] else [" ".join(argv[1:])])
        return type("Done", (), {"returncode": 0, "stderr": ""})()
    monkeypatch.setattr(ecn.subprocess, "run", run)
    return ran


@pytest.mark.parametrize("tree", [{"control_priority": True}, {"pfc": True}], ids=["control priority", "pfc"])
def test_a_reshape_changes_every_htb_class_of_the_port_to_the_new_rate(tree, monkeypatch):
    """Beside a control class (or under PFC) the classes below 1:1 have their own assured rate and
    ceiling, and htb lets a class send at its assured rate whatever its parent's: changing 1:1 alone
    left the port sending at the old rate's data share."""
    ran = _tc_run(monkeypatch)
    ecn.reshape(shaping.Shape("l0-eth1", 10.0, **tree))
    started = [line for line in shaping.tc_lines(shaping.Shape("l0-eth1", 20.0, **tree), netem=False)
               if line.startswith("class add")]
    changed = {line.split(" classid ")[1].split()[0]: line for line in ran}
    assert set(changed) == {line.split(" classid ")[1].split()[0] for line in started}
    assert all(line.startswith("class change") and "ceil 10mbit" in line for line in changed.values())
    assert "rate 1mbit" in changed["1:10"]          # the control class's assured share, of the new rate
