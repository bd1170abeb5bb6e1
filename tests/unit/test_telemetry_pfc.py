"""Pause figures in telemetry (fabric/routing/telemetry.py), the control loop reading a PFC stage
(controller/ecn_loop.py) and the replay of what it wrote (controller/ecn_replay.py), pure."""
from __future__ import annotations

import io
import json

import pytest

from hpnlab.controller import ecn_loop, ecn_policy, ecn_replay
from hpnlab.fabric.routing import telemetry
from hpnlab.fabric.routing.telemetry import OfPortStats, PfcCounters, PortInfo, StageCounters, Telemetry

RATE = 20e6
MTU = 4096
PORTS = {("l0", 1): PortInfo("l0", 1, "h0", RATE), ("l0", 2): PortInfo("l0", 2, "h1", RATE),
         ("l0", 3): PortInfo("l0", 3, "s0", 2 * RATE), ("s0", 1): PortInfo("s0", 1, "l0", 2 * RATE)}


def test_pause_figures_are_shares_and_counts_of_the_interval():
    tel = Telemetry(PORTS, 0.2)
    tel.pfc_counters(10.0, {("l0", 3): PfcCounters(pauses_received=4, paused_s=1.0, pauses_sent=2, pausing_s=0.5)})
    tel.pfc_counters(10.2, {("l0", 3): PfcCounters(pauses_received=10, paused_s=1.05, pauses_sent=3, pausing_s=0.52,
                                                   headroom_drops=1)})
    s = tel.sample(10.2)[("l0", 3)]
    assert s.paused_fraction == pytest.approx(0.25)
    assert s.pauses_received == 6
    assert s.pausing_fraction == pytest.approx(0.1)
    assert s.pauses_sent == 1
    assert s.headroom_drops == 1


def test_without_a_pfc_stage_the_pause_figures_are_unknown_not_zero():
    tel = Telemetry(PORTS, 0.2)
    s = tel.sample(1.0)[("l0", 1)]
    assert s.paused_fraction is None and s.pauses_received is None and s.pausing_fraction is None


def test_with_a_pfc_stage_a_port_that_paused_nothing_shows_zero():
    tel = Telemetry(PORTS, 0.2)
    for t in (1.0, 1.2):
        tel.pfc_counters(t, {("l0", 3): PfcCounters(pauses_received=3, paused_s=0.1)})
    s = tel.sample(1.2)
    assert s[("l0", 3)].paused_fraction == 0.0
    assert s[("l0", 1)].paused_fraction == 0.0


def test_a_pfc_counter_that_goes_down_gives_no_figure_for_that_interval():
    tel = Telemetry(PORTS, 0.2)
    tel.pfc_counters(1.0, {("l0", 3): PfcCounters(pauses_received=30, paused_s=2.0)})
    tel.pfc_counters(1.2, {("l0", 3): PfcCounters(pauses_received=1, paused_s=0.01)})
    assert tel.sample(1.2)[("l0", 3)].pauses_received == 0


def test_the_stage_rows_become_counters_per_switch_port_and_host_nics_are_left_out():
    rows = {"l0-eth3": {"node": "l0", "switch_port": True, "pauses_sent": 5, "paused_s": 0.5, "headroom_drops": 0,
                        "pauses_received": 7, "paused_rx_s": 0.7},
            "h0-eth1": {"node": "h0", "switch_port": False, "pauses_received": 2, "paused_rx_s": 0.1}}
    assert telemetry.pfc_counters(rows) == {("l0", 3): PfcCounters(pauses_sent=5, pausing_s=0.5, pauses_received=7,
                                                                   paused_s=0.7)}


def test_a_sample_line_carries_pause_figures_only_where_pfc_was_read():
    tel = Telemetry(PORTS, 0.2)
    tel.port_stats("l0", 1.0, [OfPortStats(3, tx_bytes=0)])
    tel.port_stats("l0", 1.2, [OfPortStats(3, tx_bytes=100_000)])
    lossy = telemetry.sample_line(1.2, tel.sample(1.2), {}, PORTS)
    assert "paused_fraction" not in lossy["ports"][0]
    tel.pfc_counters(1.2, {("l0", 1): PfcCounters()})
    tel.pfc_counters(1.4, {("l0", 1): PfcCounters(pauses_received=2, paused_s=0.02)})
    rows = {(r["switch"], r["port"]): r for r in telemetry.sample_line(1.4, tel.sample(1.4), {}, PORTS)["ports"]}
    assert rows[("l0", 1)]["paused_fraction"] == pytest.approx(0.1)     # paused though it sent nothing
    assert rows[("l0", 1)]["pauses_received"] == 2


class FakePfcStage:
    """What ecn_loop reads of ``PfcStage``: ``counters()`` per interface name, cumulative."""

    def __init__(self):
        self.rows: dict = {}

    def counters(self):
        return json.loads(json.dumps(self.rows))


def record_with_pause(policy: str = "pfc-aware", ticks: int = 60):
    """A telemetry file written by the live loop with a PFC stage: traffic on l0:3 (busy, marking), whose
    downstream pauses it in bursts (ticks 10-19 and 40-44), the rest quiet."""
    out = io.StringIO()
    stage = FakePfcStage()
    loop = ecn_loop.EcnLoop(Telemetry(PORTS, 0.2), ecn_policy.load(policy, MTU), "auto", mtu=MTU, out=out,
                            open_stage=lambda run: None, open_pfc=lambda run: stage)
    tx = 0
    sc = StageCounters()
    pauses, paused_s = 0, 0.0
    now = 50.0
    for i in range(ticks):
        now += 0.2
        tx += int(2 * RATE / 8 * 0.2 * 0.95)
        pkts = int(2 * RATE / 8 * 0.2 * 0.95) // MTU
        pausing = 10 <= i < 20 or 40 <= i < 45
        if pausing:
            pauses += 5
            paused_s += 0.06
        sc = StageCounters(bytes=sc.bytes + pkts * MTU, packets=sc.packets + pkts, ect=sc.ect + pkts,
                           ce_marked=sc.ce_marked + pkts // 50, queue_bytes=3 * MTU, queue_peak_bytes=3 * MTU)
        stage.rows = {"s0-eth1": {"node": "s0", "switch_port": True, "pauses_sent": pauses, "paused_s": paused_s},
                      "l0-eth3": {"node": "l0", "switch_port": True, "pauses_received": pauses,
                                  "paused_rx_s": paused_s}}
        loop.telemetry.port_stats("l0", now, [OfPortStats(3, tx_bytes=tx)])
        loop.telemetry.stage_counters(now, {("l0", 3): sc})
        loop.tick(now, ["l0", "s0"])
    return [json.loads(x) for x in out.getvalue().splitlines()], loop


def test_the_loop_reads_the_pfc_stage_into_every_sample_it_writes():
    lines, _ = record_with_pause()
    samples = [ln for ln in lines if ln.get("kind") == "sample"]
    assert all("paused_fraction" in row for ln in samples for row in ln["ports"])
    paused = [row for ln in samples for row in ln["ports"] if (row["switch"], row["port"]) == ("l0", 3)
              and row["paused_fraction"] > 0]
    assert paused and all(row["pauses_received"] > 0 for row in paused)


def test_the_loop_without_a_pfc_opener_writes_no_pause_figures():
    out = io.StringIO()
    loop = ecn_loop.EcnLoop(Telemetry(PORTS, 0.2), ecn_policy.load("dynamic", MTU), "auto", mtu=MTU, out=out,
                            open_stage=lambda run: None)
    loop.telemetry.port_stats("l0", 1.0, [OfPortStats(3, tx_bytes=0)])
    loop.tick(1.0, ["l0"])
    loop.telemetry.port_stats("l0", 1.2, [OfPortStats(3, tx_bytes=500_000)])
    loop.tick(1.2, ["l0"])
    rows = [row for ln in map(json.loads, out.getvalue().splitlines()) if ln.get("kind") == "sample"
            for row in ln["ports"]]
    assert rows and all("paused_fraction" not in row for row in rows)


def test_pause_cuts_kmin_in_the_live_loop_and_the_replay_makes_the_same_decisions():
    lines, loop = record_with_pause("pfc-aware")
    cuts = [c for c in loop.changes if c["new"]["kmin"] < c["old"]["kmin"]]
    assert cuts and all("paus" in c["reason"] for c in cuts)
    r = ecn_replay.replay(lines)
    assert r["agree"] is True
    assert r["in_force_differ"] == 0


def test_replaying_recorded_pause_through_dynamic_decides_otherwise():
    lines, _ = record_with_pause("pfc-aware")
    aware = ecn_replay.replay(lines, policy="pfc-aware")
    dynamic = ecn_replay.replay(lines, policy="dynamic")
    assert [c for c in aware["changes"] if "paus" in c["reason"]]
    assert not [c for c in dynamic["changes"] if "paus" in c["reason"]]
