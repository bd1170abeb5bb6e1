"""Local protection on a live fat-tree (real Open vSwitch, the controller process): an aggregation
switch fails while the controller is stopped, so only the switches' fast-failover groups act.

Every core of the switch's group loses its pod at once. Its detour marks the packet deep
(``compiler._deep``): another pod's aggregation switch sends it down to an edge switch, which
bounces it up that pod's other aggregation switch, so up a core of the other group. Before
2026-12-04 those packets were dropped until the controller reacted (the pure proof:
tests/test_failover_tables.py)."""
from __future__ import annotations

import signal
import time

import pytest

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

AGG = "a0"


@pytest.fixture(scope="module")
def emu(emulation_ready):
    from hpnlab.fabric.emulation import Emulation

    e = Emulation("fat-tree-4", controller="hpnlab", lock_wait_s=300)
    e.start()
    try:
        yield e
    finally:
        e.stop()


def _pod_ips(emu, pod: int) -> set[str]:
    g = emu.graph
    return {p["ip"] for h in emu.hosts for p in emu.interfaces(h) if g.nodes[p["leaf"]]["pod"] == pod}


def _walk(emu, pairs: list) -> dict:
    walk = emu.walk_branches(pairs=pairs)
    if walk["missing"]:                              # a pair's first packets can wait for ARP
        walk = emu.walk_branches(pairs=sorted({m[:4] for m in walk["missing"]}))
    return walk


def test_with_the_controller_stopped_a_failed_aggregation_switch_leaves_every_branch_into_its_pod_delivering(emu):
    from hpnlab.fabric.emulation.timeline import signal_controller

    g = emu.graph
    pod = g.nodes[AGG]["pod"]
    inside = _pod_ips(emu, pod)
    pairs = [p for p in emu.all_pairs() if (p[3] in inside) != (p[1] in inside)]
    assert pairs and len(emu.entropy_source_ports()) > 1
    assert _walk(emu, pairs)["missing"] == []            # healthy first: every branch delivers
    signal_controller(emu, signal.SIGSTOP)
    try:
        emu.switch_down(AGG)
        time.sleep(0.3)                                  # carrier loss reaches the groups in ms
        walk = _walk(emu, pairs)
        assert walk["probes"] > 0 and walk["missing"] == []
    finally:
        emu.switch_up(AGG)
        signal_controller(emu, signal.SIGCONT)


def test_the_fat_tree_is_whole_after_the_aggregation_switch_comes_back(emu):
    time.sleep(0.5)
    result = emu.ping_all()
    if result["failed"]:
        time.sleep(1.5)
        result = emu.ping_all(pairs=result["failed"])
    assert result["failed"] == []
