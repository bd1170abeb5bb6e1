"""Pause as telemetry on the emulated mini-hpn with PFC (real Open vSwitch, the hpnlab controller, the tc BPF
PFC data path and the pause agent): the controller's control loop reads the PFC stage, and its telemetry
file carries the pause figures of the ports that paused and were paused (controller/ecn_loop.py,
fabric/routing/telemetry.py). Plumbing only: no figure is asserted beyond "a pause happened, it shows"."""
from __future__ import annotations

import time

import pytest

from hpnlab.fabric.emulation.traffic import udp_incast
from hpnlab.fabric.routing import telemetry

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

#: mini-hpn's plane 0: h1-h4 under p0l0, h5-h8 under p0l1, h9-h12 under p0l2, h13-h16 under p0l3
INCAST = {"h5": 9.0, "h9": 9.0, "h13": 9.0}     # three leaves, 27 Mbit/s into h1's 10 Mbit/s port


@pytest.fixture(scope="module")
def emu(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, PortOptions, SupervisionOptions
    from hpnlab.fabric.scenario import spec

    options = EmulationOptions(controller=ControllerOptions(on_loss="continue", ecn_policy="pfc-aware"),
                               ports=PortOptions(pfc=True), supervision=SupervisionOptions(lock_wait_s=1200))
    e = Emulation(spec.load("mini-hpn"), options, log=None)
    e.start()
    try:
        yield e
    finally:
        e.stop()


def _rows(emu) -> list[dict]:
    return [dict(row, t=line["t"]) for line in telemetry.read_lines(emu.controller.telemetry_file)
            if line.get("kind") == "sample" for row in line["ports"]]


def _found_at(emu, timeout_s: float = 60.0) -> float:
    """The controller's time of its first sample with pause figures (it looks for the PFC stage after start)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with_pfc = [line["t"] for line in telemetry.read_lines(emu.controller.telemetry_file)
                    if line.get("kind") == "sample" and any("paused_fraction" in r for r in line["ports"])]
        if with_pfc:
            return float(with_pfc[0])
        time.sleep(0.5)
    raise AssertionError("the controller's telemetry never carried pause figures")


def test_the_telemetry_of_a_lossless_run_carries_the_pause_of_the_ports_that_paused(emu):
    start = _found_at(emu)
    before = emu.pfc.counters()
    udp_incast(emu, "h1", INCAST, seconds=3.0, port=9401, flows=4)
    time.sleep(1.0)                     # a few more ticks: the last interval's pause is written too
    after = emu.pfc.counters()
    assert sum((after[i].get("pauses_sent") or 0) - (before[i].get("pauses_sent") or 0) for i in after) > 0
    rows = [r for r in _rows(emu) if r["t"] >= start]
    assert rows and all("paused_fraction" in r and "pausing_fraction" in r for r in rows)
    # h1's leaf paused the spines (its ingress ports from them)...
    assert any(r["switch"] == "p0l0" and r["pauses_sent"] > 0 and r["pausing_fraction"] > 0 for r in rows)
    # ...and the spines' ports towards it were held paused
    assert any(r["switch"].startswith("p0s") and r["peer"] == "p0l0" and r["pauses_received"] > 0
               and r["paused_fraction"] > 0 for r in rows)


def test_the_pfc_aware_policy_cut_kmin_for_the_pause_it_saw(emu):
    changes = [line for line in telemetry.read_lines(emu.controller.telemetry_file) if line.get("kind") == "change"]
    paused = [c for c in changes if "paus" in c["reason"]]
    assert paused
    assert all(c["new"]["kmin"] <= c["old"]["kmin"] for c in paused)
