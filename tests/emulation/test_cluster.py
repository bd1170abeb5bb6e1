"""Multi-machine: Mininet's cluster edition (MininetCluster) with localhost as the only server."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


def test_cluster_edition_with_localhost_builds_and_reaches_every_pair(emulation_ready):
    from mininet.examples.cluster import MininetCluster

    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ClusterOptions, EmulationOptions, SupervisionOptions
    from hpnlab.fabric.scenario import spec

    ssh = Path(os.environ.get("HOME", "/root")) / ".ssh"
    had_ssh = ssh.exists()
    with Emulation(spec.load("mini-hpn", {"segments_per_pod": 2}), EmulationOptions(
        supervision=SupervisionOptions(lock_wait_s=300),
        cluster=ClusterOptions(servers=("localhost",), placement="plane"))) as emu:
        assert isinstance(emu.net, MininetCluster)
        assert {getattr(n, "server", None) for n in emu.net.hosts + emu.net.switches} == {"localhost"}
        assert all(emu.connected_switches().values())
        result = emu.ping_all()
        assert result["pairs"] == 8 * 7 * 2 and result["failed"] == []
        assert emu.ecn is not None and len(emu.ecn.ports) == len(emu.switch_ports())
    # what MininetCluster created in $HOME (~/.ssh/mn) is gone again, and only that
    assert ssh.exists() == had_ssh
