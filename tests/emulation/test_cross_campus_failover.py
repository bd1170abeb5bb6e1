"""Local protection across campuses on a live fabric (real Open vSwitch, the controller process),
with the controller stopped so that only the switches' fast-failover groups act.

mini-cross-campus with two cores per plane and campus (``cores_per_plane: 2``: core i of one campus
has a long-haul link to core i of the other). A core fails: the core of the other campus with
the long-haul link to it has no way left to it, and detours what it has for the failed core's
campus down to a spine of its own campus, which bounces it up the other core, over the other
long-haul link (issue 54: before, every branch sent to that core was dropped until the
controller reacted; the pure proof: tests/unit/test_local_protection.py)."""
from __future__ import annotations

import pytest
from support.emulated import failed_pings_after_repair, walk, walk_with_switch_down

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

CORE = "p0c0"


@pytest.fixture(scope="module")
def emu(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, SupervisionOptions
    from hpnlab.fabric.scenario import spec

    with Emulation(spec.load("mini-cross-campus", {"cores_per_plane": 2}),
                   EmulationOptions(supervision=SupervisionOptions(lock_wait_s=3600))) as e:
        yield e


def _across(emu) -> list[tuple[str, str, str, str]]:
    """Every pair of plane-0 host ports in different campuses, both ways."""
    g = emu.graph
    campus = {p["ip"]: g.nodes[p["leaf"]]["campus"] for h in emu.hosts for p in emu.interfaces(h)
              if p["plane"] == 0}
    return [p for p in emu.all_pairs() if p[1] in campus and p[3] in campus and campus[p[1]] != campus[p[3]]]


def test_with_the_controller_stopped_a_failed_core_leaves_every_branch_across_the_campuses_delivering(emu):
    pairs = _across(emu)
    assert pairs and len(emu.entropy_source_ports()) > 1
    assert walk(emu, pairs)["missing"] == []             # healthy first: every branch delivers
    result = walk_with_switch_down(emu, pairs, CORE)
    assert result["probes"] > 0 and result["missing"] == []


def test_the_fabric_is_whole_after_the_core_comes_back(emu):
    assert failed_pings_after_repair(emu) == []
