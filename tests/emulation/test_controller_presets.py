"""The controller on other fabric shapes, live: a three-tier fat-tree and two campuses joined
by long-haul links (real OVS, Mininet hosts, the controller process). Every host pair on
every plane must ping, then again with one core-facing link down. mini-cross-campus is the
shared one of conftest (its tests run one after another on one emulation)."""
from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


def _every_pair_pings_before_and_after_a_link_fails(emu, link: tuple[str, str]) -> None:
    first = emu.ping_all()
    assert first["failed"] == [] and first["pairs"] > 0
    emu.faults.link_down(*link)
    try:
        time.sleep(1.0)     # PortStatus -> recompile -> flow-mods
        after = emu.ping_all()
        assert after["failed"] == []
    finally:
        emu.faults.link_up(*link)


def test_mini_cross_campus_comes_up_with_every_pair_reachable(mini_cross_campus):
    emu = mini_cross_campus
    assert emu.graph.graph["scenario"].campuses == 2
    result = emu.ping_all()
    assert result["pairs"] == 8 * 7 * 2 and result["failed"] == []
    assert all(emu.connected_switches().values()) and len(emu.connected_switches()) == 20
    if emu.caps.netem:
        assert emu.metadata["delay"] == "netem"
    else:
        # said plainly: the long-haul delay could not be emulated here
        assert emu.metadata["delay"] == "not emulated"
        assert any("no netem" in line for line in emu.metadata["not_emulated"])


def test_every_pair_pings_across_the_campuses_before_and_after_a_core_link_fails(mini_cross_campus):
    _every_pair_pings_before_and_after_a_link_fails(mini_cross_campus, ("p0s0", "p0c0"))


def test_every_pair_pings_on_a_fat_tree_before_and_after_a_core_link_fails(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, PortOptions, SupervisionOptions

    with Emulation("fat-tree-4", EmulationOptions(
        ports=PortOptions(ecn=False, shape=False),
        supervision=SupervisionOptions(verify=False, lock_wait_s=300))) as emu:
        _every_pair_pings_before_and_after_a_link_fails(emu, ("a0", "c0"))
