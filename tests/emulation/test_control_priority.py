"""``emulation.control_priority``: a packet marked DSCP 48 (the roce transport's ACKs, NACKs, CNPs
and notices) does not wait behind the data queued at a port, on real htb classes in a live
emulation. One emulation of mini-spine-leaf with the priority and one without (about 40 s)."""
from __future__ import annotations

import re
import statistics
import time

import pytest

from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

FLOOD = r'''
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    try:
        s.sendto(b"x" * 1400, (sys.argv[1], 9))
    except OSError:
        time.sleep(0.0005)
'''


def _rtts(emu, src: str, dst_ip: str, tos: int) -> list[float]:
    out = emu.host(src).cmd(f"ping -n -c 12 -i 0.1 -W 2 -Q {tos:#x} {dst_ip}")
    return [float(x) for x in re.findall(r"time=([\d.]+) ms", out)]


def _queue_and_ping(control_priority: bool) -> tuple[list[float], list[float]]:
    """RTTs of a best-effort ping and a DSCP 48 ping through a port whose queue a UDP flood keeps full."""
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, PortOptions, SupervisionOptions
    from hpnlab.fabric.scenario import spec

    scenario = spec.load("mini-spine-leaf", {"emulation": {"control_priority": control_priority,
                                                           "host_mbps": 4, "max_mbps": 8}})
    e = Emulation(scenario, EmulationOptions(ports=PortOptions(ecn=False),
                                             supervision=SupervisionOptions(verify=False, lock_wait_s=300)), log=None)
    e.start()
    try:
        hosts = sorted(fgraph.hosts(e.graph))
        src, dst = hosts[0], hosts[-1]
        dst_ip = e.host(dst).IP()
        flood = e.host(src).popen(["python3", "-c", FLOOD, dst_ip, "8"])
        try:
            time.sleep(1.0)                   # the queues at the sender's port and on the way fill
            best_effort = _rtts(e, src, dst_ip, 0)
            control = _rtts(e, src, dst_ip, 48 << 2)
        finally:
            flood.kill()
            flood.wait()
    finally:
        e.stop()
    return best_effort, control


def test_a_dscp_48_packet_overtakes_the_data_queued_at_a_port(emulation_ready):
    best_effort, control = _queue_and_ping(True)
    assert len(best_effort) >= 6 and len(control) >= 6, (best_effort, control)
    # the flood keeps the port buffers full: tens of ms for data at 4 Mbit/s
    assert statistics.median(best_effort) > 20, best_effort
    assert statistics.median(control) < statistics.median(best_effort) / 4, (control, best_effort)


def test_without_control_priority_a_dscp_48_packet_waits_in_the_queue_like_data(emulation_ready):
    best_effort, control = _queue_and_ping(False)
    assert len(best_effort) >= 6 and len(control) >= 6, (best_effort, control)
    assert statistics.median(control) > statistics.median(best_effort) / 2, (control, best_effort)
