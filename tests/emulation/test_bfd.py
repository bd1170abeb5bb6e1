"""BFD on the fabric ports of a live emulation: a gray failure (the link keeps its carrier but
drops everything one way) and a one-sided failure make the port not live, the controller
hears of it and routes around it; repair brings it back. (How fast: the failover probe,
``hpnlab emulate --failover-probe``, measures it; tests check the behaviour.)"""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from support.emulated import BFD_MS, failed_pings_after_repair
from support.wait import wait_for

from hpnlab.fabric.emulation import faults, ovsdb
from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

LEAF, SPINE = "p0l0", "p0s0"


@pytest.fixture(scope="module")
def emu(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, FailoverOptions, SupervisionOptions

    e = Emulation("mini-hpn", EmulationOptions(
        failover=FailoverOptions(bfd_ms=BFD_MS), supervision=SupervisionOptions(lock_wait_s=300)))
    e.start()
    try:
        yield e
    finally:
        e.stop()


def _ports(emu):
    (pl, ps), = fgraph.link_ports(emu.graph, LEAF, SPINE)
    return f"{LEAF}-eth{pl}", f"{SPINE}-eth{ps}", pl, ps


def _states(emu) -> dict[str, set[str]]:
    leaf_if, spine_if, _, _ = _ports(emu)
    return {leaf_if: ovsdb.port_states(LEAF).get(leaf_if, {"?"}),
            spine_if: ovsdb.port_states(SPINE).get(spine_if, {"?"})}


def _controller_log(emu) -> str:
    return Path(emu.metadata["controller_log"]).read_text()


def _pairs_through_the_leaf(emu):
    """Every pair whose source port hangs under the leaf (and goes up through its uplinks)."""
    under = {p["ip"] for h in emu.hosts for p in emu.interfaces(h) if p["leaf"] == LEAF}
    return [pair for pair in emu.all_pairs() if pair[1] in under]


def _converges_around_the_failure(emu, timeout_s: float = 10.0) -> bool:
    pairs = _pairs_through_the_leaf(emu)
    deadline = time.monotonic() + timeout_s
    while True:
        walk = emu.walk_branches(pairs=pairs)
        if walk["probes"] > 0 and not walk["missing"]:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def test_bfd_runs_on_every_fabric_port_and_every_port_is_live(emu):
    names = emu.builder.fabric_interfaces()
    status = ovsdb.bfd_status(names)
    assert len(names) == 32
    assert {n: status[n].get("forwarding") for n in names} == dict.fromkeys(names, "true")
    assert all("LIVE" in s for s in _states(emu).values())


def test_a_gray_failure_keeps_the_carrier_but_makes_both_ends_not_live(emu):
    leaf_if, spine_if, pl, ps = _ports(emu)
    log_before = len(_controller_log(emu))
    emu.faults.link_drop(LEAF, SPINE, side=LEAF)
    try:
        assert emu.faults.is_dropping(leaf_if)
        assert wait_for(lambda: not any("LIVE" in s for s in _states(emu).values()), 5.0, 0.02)
        assert emu.faults.is_up(leaf_if) and emu.faults.is_up(spine_if)          # carrier stays
        assert all("LINK_DOWN" not in s for s in _states(emu).values())      # OpenFlow agrees: only LIVE went
        assert wait_for(lambda: f"{LEAF} port {pl} down" in _controller_log(emu)[log_before:], 5.0, 0.02)
        assert f"{SPINE} port {ps} down" in _controller_log(emu)[log_before:]
        # routed around once the controller's update is in: every entropy branch of every pair
        # from under the leaf arrives while the link still drops (how soon: the failover probe)
        assert _converges_around_the_failure(emu)
    finally:
        emu.faults.link_restore(LEAF, SPINE, side=LEAF)
    assert not emu.faults.is_dropping(leaf_if)
    assert wait_for(lambda: all("LIVE" in s for s in _states(emu).values()), 5.0, 0.02)


def test_a_one_sided_down_is_seen_at_both_ends(emu):
    leaf_if, _, pl, _ = _ports(emu)
    log_before = len(_controller_log(emu))
    emu.faults.link_down(LEAF, SPINE, side=SPINE)
    try:
        assert wait_for(lambda: all("LIVE" not in s for s in _states(emu).values()), 5.0, 0.02)
        states = _states(emu)
        assert "LINK_DOWN" in states[leaf_if]          # the veth peer lost carrier
        assert wait_for(lambda: f"{LEAF} port {pl} down" in _controller_log(emu)[log_before:], 5.0, 0.02)
    finally:
        emu.faults.link_up(LEAF, SPINE, side=SPINE)
    assert wait_for(lambda: all("LIVE" in s for s in _states(emu).values()), 5.0, 0.02)


def test_a_link_failure_and_its_repair_bring_link_notifications_only_no_route_or_address(emu):
    # Open vSwitch 3.1 re-reads the routing table (then revalidates every flow) on any link event and
    # on any route or address notification; a switch port must add none of the latter: no IPv6 on it
    ports = emu.metadata["switch_ports"]
    assert ports["ipv6_off"] == ports["ports"] == len(emu.switch_ports())
    leaf_if, spine_if, _, _ = _ports(emu)
    ours = {socket.if_nametoindex(leaf_if), socket.if_nametoindex(spine_if)}
    with faults.RtnlWatch() as watch:
        emu.faults.link_down(LEAF, SPINE)
        try:
            assert wait_for(lambda: all("LIVE" not in s for s in _states(emu).values()), 5.0, 0.02)
        finally:
            emu.faults.link_up(LEAF, SPINE)
        assert wait_for(lambda: all("LIVE" in s for s in _states(emu).values()), 5.0, 0.02)
        watch.drain()
    events = watch.events(ours)
    assert {i for _, i in events} == ours                # the watch heard both ends go down and up ...
    assert [e for e, _ in events if e in faults.ROUTE_EVENTS] == []      # ... and no route or address change


def test_a_spine_coming_back_sends_back_what_it_cannot_forward_yet_and_the_leaf_bounces_it(emu):
    """A spine coming back from a failure: its leaves' BFD sessions are up and they send it traffic
    while its own ends do not forward yet. Made here with ``ovs-appctl bfd/set-forwarding IF false``
    on every port of the spine (not live to its groups; the sessions, and so the leaves, untouched)
    and the controller stopped. Every entropy branch of every pair from under a leaf still arrives:
    the spine sends what it cannot forward back out of the port it came in on and the leaf bounces
    it up the other spine. Before 2026-12-04 those branches were lost until the spine's sessions
    came up (the failover benchmark: a spine's repair under local protection cost flows 60-122 ms)."""
    import signal
    import subprocess


    spine_ifs = [i for i in emu.builder.fabric_interfaces() if i.startswith(f"{SPINE}-")]
    leaf_if = _ports(emu)[0]
    assert len(spine_ifs) == 4
    emu.controller.signal(signal.SIGSTOP)
    try:
        for name in spine_ifs:
            subprocess.run(["ovs-appctl", "bfd/set-forwarding", name, "false"], check=True, capture_output=True)
        assert wait_for(lambda: not any("LIVE" in ovsdb.port_states(SPINE).get(i, {"LIVE"}) for i in spine_ifs),
                        5.0, 0.02)
        assert "LIVE" in ovsdb.port_states(LEAF)[leaf_if]          # the leaf still sends up to the spine
        walk = emu.walk_branches(pairs=_pairs_through_the_leaf(emu))
        assert walk["probes"] > 0 and walk["missing"] == []
    finally:
        for name in spine_ifs:
            subprocess.run(["ovs-appctl", "bfd/set-forwarding", name, "normal"], capture_output=True)
        emu.controller.signal(signal.SIGCONT)
    assert wait_for(lambda: all("LIVE" in ovsdb.port_states(SPINE).get(i, set()) for i in spine_ifs), 5.0, 0.02)


def test_the_fabric_is_whole_after_repair(emu):
    assert failed_pings_after_repair(emu) == []


def test_ovs_vswitchd_forwards_at_nice_minus_20_and_not_real_time_during_the_run(emu):
    import os
    pid = emu.metadata["ovs_sched"]["pid"]
    assert os.sched_getscheduler(pid) == os.SCHED_OTHER       # real-time throttling stalled it
    assert os.getpriority(os.PRIO_PROCESS, pid) == -20


def test_the_failover_probe_sees_a_gray_failure_end_before_its_repair_and_accounts_for_every_packet(emu):
    from hpnlab.fabric.emulation import failover

    probe = failover.Probe(kind="gray", link=(LEAF, SPINE), flows=8, pps=2000.0, hold_s=1.5)
    result = failover.run_once(emu, probe)
    fail = result["events"][0]
    assert 0 < len(fail["affected"]) < result["flows"] == 8       # only the flows through the link
    assert 0 < fail["loss_window_ms"] < 1500                      # BFD found it: routed around before repair
    assert all(ms is not None for ms in result["detection_ms"].values())
    # every packet sent arrived in time, arrived late (counted in lost too) or was lost
    assert result["sent"] == result["packets"] + sum(e["lost"] - e["late"] for e in result["events"])
