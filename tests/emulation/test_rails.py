"""mini-rail: hosts with several NIC ports on one plane; traffic leaves by its source address's port."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


def _tx_packets(emu, host, intf):
    return int(emu.host(host).cmd(f"cat /sys/class/net/{intf}/statistics/tx_packets").strip())


def test_multi_rail_hosts_reach_every_port_and_send_from_the_port_of_their_source_address(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, PortOptions, SupervisionOptions

    with Emulation("mini-rail", EmulationOptions(
        ports=PortOptions(ecn=False), supervision=SupervisionOptions(lock_wait_s=300))) as emu:
        s = emu.scenario
        result = emu.ping_all()
        assert result["pairs"] == s.hosts * (s.hosts - 1) * (s.rails ** 2) * s.planes
        assert result["failed"] == []

        ports = emu.interfaces("h1")
        plane0 = [p for p in ports if p["plane"] == 0]
        assert len(plane0) == s.rails >= 2          # several ports share plane 0
        dst = emu.ip("h5", plane=0, rail=0)
        for port in plane0:
            before = {p["name"]: _tx_packets(emu, "h1", p["name"]) for p in plane0}
            out = emu.host("h1").cmd(f"ping -n -q -c 20 -i 0.01 -W 1 -I {port['ip']} {dst}")
            assert " 0% packet loss" in out
            sent = {name: _tx_packets(emu, "h1", name) - n for name, n in before.items()}
            assert sent[port["name"]] >= 20
            assert all(v < 20 for name, v in sent.items() if name != port["name"]), sent
