"""Local protection on a live fat-tree (real Open vSwitch, the controller process, BFD on every
fabric port), with the controller stopped so that only the switches' fast-failover groups act.

An aggregation switch fails: every core of its group loses its pod at once. Its detour marks the
packet deep (``compiler._deep``): another pod's aggregation switch sends it down to an edge
switch, which bounces it up that pod's other aggregation switch, so up a core of the other
group. An aggregation switch comes back: its neighbours' BFD sessions are up before its own, so
they send it traffic it cannot forward yet; it sends that back where it came from (an edge
bounces it, a core detours it: ``compiler._returns_below``, ``compiler._returned_flows``).
Before 2026-12-04 both lost those packets until the controller reacted (the pure proofs:
tests/unit/test_failover_tables.py)."""
from __future__ import annotations

import signal

import pytest
from support.emulated import BFD_MS, failed_pings_after_repair, walk, walk_with_switch_down
from support.wait import wait_for

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

AGG = "a0"


@pytest.fixture(scope="module")
def emu(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, FailoverOptions, SupervisionOptions

    with Emulation("fat-tree-4", EmulationOptions(
        failover=FailoverOptions(bfd_ms=BFD_MS), supervision=SupervisionOptions(lock_wait_s=300))) as e:
        yield e


def _pod_ips(emu, pod: int) -> set[str]:
    g = emu.graph
    return {p["ip"] for h in emu.hosts for p in emu.interfaces(h) if g.nodes[p["leaf"]]["pod"] == pod}


def _agg_ports(emu) -> list[str]:
    return [i for i in emu.builder.fabric_interfaces() if i.startswith(f"{AGG}-")]


def _live(emu) -> list[bool]:
    from hpnlab.fabric.emulation import ovsdb

    states = ovsdb.port_states(AGG)
    return ["LIVE" in states.get(i, set()) for i in _agg_ports(emu)]


def test_with_the_controller_stopped_a_failed_aggregation_switch_leaves_every_branch_into_its_pod_delivering(emu):

    g = emu.graph
    pod = g.nodes[AGG]["pod"]
    inside = _pod_ips(emu, pod)
    pairs = [p for p in emu.all_pairs() if (p[3] in inside) != (p[1] in inside)]
    assert pairs and len(emu.entropy_source_ports()) > 1
    assert wait_for(lambda: all(_live(emu)), 10.0, 0.02)       # its BFD sessions up (after the test before)
    assert walk(emu, pairs)["missing"] == []             # healthy first: every branch delivers
    result = walk_with_switch_down(emu, pairs, AGG)
    assert result["probes"] > 0 and result["missing"] == []


def test_with_the_controller_stopped_an_aggregation_switch_coming_back_sends_back_what_it_cannot_forward(emu):
    """``ovs-appctl bfd/set-forwarding IF false`` on every port of a0: not live to its own groups,
    while its sessions, and so its neighbours, keep the links live and send it traffic."""
    import subprocess


    g = emu.graph
    inside = _pod_ips(emu, g.nodes[AGG]["pod"])
    pairs = [p for p in emu.all_pairs() if p[3] in inside or p[1] in inside]
    ifs = _agg_ports(emu)
    assert len(ifs) == 4
    assert wait_for(lambda: all(_live(emu)), 10.0, 0.02)       # its BFD sessions up (after the test before)
    emu.controller.signal(signal.SIGSTOP)
    try:
        for name in ifs:
            subprocess.run(["ovs-appctl", "bfd/set-forwarding", name, "false"], check=True, capture_output=True)
        assert wait_for(lambda: not any(_live(emu)), 5.0, 0.02)
        result = walk(emu, pairs)
        assert not any(_live(emu))                      # the state held for the whole walk
        assert result["probes"] > 0 and result["missing"] == []
    finally:
        for name in ifs:
            subprocess.run(["ovs-appctl", "bfd/set-forwarding", name, "normal"], capture_output=True)
        emu.controller.signal(signal.SIGCONT)


def test_the_fat_tree_is_whole_after_the_aggregation_switch_comes_back(emu):
    assert failed_pings_after_repair(emu) == []
