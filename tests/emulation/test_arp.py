"""The ARP mode chosen on `hpnlab emulate` / `hpnlab run` (``ControllerOptions(arp=...)``) reaches the controller
process the harness starts: with ``per-host`` the leaves answer a flushed host with its peer's own MAC, and
the run's metadata records the mode. One emulation of mini-spine-leaf, no shaping (about 20 s)."""
from __future__ import annotations

import subprocess

import pytest

from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


@pytest.fixture(scope="module")
def per_host(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, PortOptions, SupervisionOptions

    e = Emulation("mini-spine-leaf", EmulationOptions(
        controller=ControllerOptions(arp="per-host"), ports=PortOptions(ecn=False, shape=False),
        supervision=SupervisionOptions(verify=True, lock_wait_s=300)), log=None)
    e.start()
    try:
        yield e
    finally:
        e.stop()


def test_per_host_arp_reaches_the_controller_the_emulation_starts(per_host):
    e = per_host
    assert e.metadata["arp"] == "per-host"
    assert "--arp per-host" in e.metadata["controller_cmd"]
    src, dst = fgraph.hosts(e.graph)[:2]
    sp, dp = fgraph.host_ports(e.graph, src)[0], fgraph.host_ports(e.graph, dst)[0]
    intf = fgraph.intf_name(src, sp["intf"])
    host = e.host(src)
    host.cmd(f"ip neigh flush dev {intf}")
    host.cmd(f"ping -c 2 -W 1 -I {intf} {dp['ip']}")
    neigh = host.cmd(f"ip neigh show {dp['ip']} dev {intf}")
    assert dp["mac"] in neigh, neigh                       # the peer's own MAC, not the gateway's
    flows = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", sp["leaf"]], capture_output=True,
                           text=True, timeout=10).stdout
    assert "move:" not in flows.lower() and "arp_tpa" in flows    # per-host responders: set-field only
