"""The controller on other fabric shapes, live: a three-tier fat-tree and two campuses joined
by long-haul links (real OVS, Mininet hosts, the controller process). Every host pair on
every plane must ping, then again with one core-facing link down."""
from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


@pytest.mark.parametrize("name,link", [("fat-tree-4", ("a0", "c0")), ("mini-cross-campus", ("p0s0", "p0c0"))])
def test_every_pair_pings_before_and_after_a_core_link_fails(emulation_ready, name, link):
    from hpnlab.fabric.emulation import Emulation

    with Emulation(name, controller="hpnlab", ecn=False, shape=False, verify=False, lock_wait_s=300) as emu:
        first = emu.ping_all()
        assert first["failed"] == [] and first["pairs"] > 0
        emu.link_down(*link)
        time.sleep(1.0)     # PortStatus -> recompile -> flow-mods
        after = emu.ping_all()
        assert after["failed"] == []
