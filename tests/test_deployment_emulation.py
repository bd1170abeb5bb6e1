"""Switches with datapath ids and port numbers of their own, on a live fabric: mini-hpn on real Open
vSwitch with foreign dpids and ofport numbers (hpnlab.fabric.emulation.rewire), driven through the
deployment file the harness writes (controller/deployment.py)."""
from __future__ import annotations

import subprocess

import pytest

from hpnlab.fabric.emulation.rewire import Rewire

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

FOREIGN = Rewire(dpid_base=0xAB00000000000000, port_offset=100)


def vsctl(*args: str) -> str:
    return subprocess.run(["ovs-vsctl", *args], capture_output=True, text=True, timeout=10).stdout.strip()


def test_switches_with_foreign_dpids_and_ports_work_through_the_deployment_file(emulation_ready, capsys):
    from hpnlab.fabric.emulation import Emulation

    emu = Emulation("mini-hpn", ecn=False, shape=False, verify=True, lock_wait_s=300, log=None, rewire=FOREIGN)
    emu.start()         # verify: every pair on every plane pings, or start raises
    try:
        with capsys.disabled():
            print(f"\ntimings {emu.timings}")
        assert emu.metadata["reachability"]["failed"] == 0 and emu.metadata["reachability"]["pairs"] == 480
        assert vsctl("get", "Interface", "p0l0-eth5", "ofport") == "105"
        assert int(vsctl("get", "Bridge", "p0l0", "datapath_id").strip('"'), 16) >> 56 == 0xAB
        assert "--deployment" in emu.metadata["controller_cmd"]
        assert emu.metadata["wiring"]["links_ok"] == 16 and emu.metadata["wiring"]["findings"] == []
    finally:
        emu.stop()
