"""The emulated ECN stage on switches with port numbers of their own (hpnlab.fabric.emulation.rewire,
port_offset 100: the harness hands the controller a deployment file): the stage knows its interfaces by the
scenario's port numbers, the controller's telemetry keys ports by the switches' own; the controller reads the
stage under those, so its samples after the deployment come from the stage. One emulation of mini-spine-leaf,
no shaping (about 20 s)."""
from __future__ import annotations

import json
import re
import time

import pytest

from hpnlab.fabric.emulation.rewire import Rewire
from hpnlab.fabric.routing import telemetry
from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

OFFSET = 100


@pytest.fixture(scope="module")
def emu(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, PortOptions, SupervisionOptions

    e = Emulation("mini-spine-leaf", EmulationOptions(
        controller=ControllerOptions(telemetry_interval_ms=200), ports=PortOptions(ecn=True, shape=False),
        supervision=SupervisionOptions(verify=True, lock_wait_s=300), rewire=Rewire(port_offset=OFFSET)), log=None)
    e.start()
    try:
        yield e
    finally:
        e.stop()


def test_telemetry_on_foreign_port_numbers_comes_from_the_ecn_stage(emu, capsys):
    if emu.ecn is None:
        pytest.skip("no ECN stage on this kernel (hpnlab doctor says why)")
    fabric_ports = len(telemetry.fabric_ports(emu.graph))
    deadline = time.monotonic() + 20
    found = None
    while found is None and time.monotonic() < deadline:
        with open(emu.metadata["controller_log"], errors="replace") as f:
            found = re.search(r"ECN stage found \(\w+ on (\d+) ports\)", f.read())
        time.sleep(0.2)
    assert found is not None and int(found.group(1)) == fabric_ports      # every stage port, renumbered
    src, dst = fgraph.hosts(emu.graph)[0], fgraph.hosts(emu.graph)[-1]
    sp, dp = fgraph.host_ports(emu.graph, src)[0], fgraph.host_ports(emu.graph, dst)[0]
    emu.host(src).cmd(f"ping -c 20 -i 0.05 -W 1 -I {fgraph.intf_name(src, sp['intf'])} {dp['ip']}")
    time.sleep(1.0)
    rows = [row for line in emu.controller.telemetry_file.read_text().splitlines() if '"kind":"sample"' in line
            for row in json.loads(line)["ports"]]
    staged = [r for r in rows if r["queue_bytes"] is not None]
    with capsys.disabled():
        print(f"\nECN stage on {found.group(1)} of {fabric_ports} ports; telemetry rows {len(rows)}, "
              f"{len(staged)} with the stage's queue")
    assert staged and all(r["port"] > OFFSET for r in rows)
    assert {r["switch"] for r in staged} >= {sp["leaf"]}
