"""``emulation.tcp_congestion`` reaches every emulated host's network namespace: a congestion
control other than the one this machine's namespaces inherit is the one each host's kernel
TCP uses. One emulation of mini-spine-leaf, no shaping and no ECN stage (about 20 s)."""
from __future__ import annotations

from pathlib import Path

import pytest

from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.emulation, pytest.mark.controller]
SYSCTL = Path("/proc/sys/net/ipv4")


def _other_than_inherited() -> str | None:
    """One the hosts may be given (allowed outside the machine's own namespace) that they do not
    inherit."""
    inherited = (SYSCTL / "tcp_congestion_control").read_text().strip()
    allowed = (SYSCTL / "tcp_allowed_congestion_control").read_text().split()
    return next((name for name in allowed if name != inherited), None)


def test_every_host_uses_the_congestion_control_the_scenario_names(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, PortOptions, SupervisionOptions
    from hpnlab.fabric.scenario import spec

    wanted = _other_than_inherited()
    if wanted is None:
        pytest.skip("this kernel allows other namespaces one TCP congestion control only: nothing to choose")
    e = Emulation(spec.load("mini-spine-leaf", {"emulation": {"tcp_congestion": wanted}}), EmulationOptions(
        ports=PortOptions(ecn=False, shape=False),
        supervision=SupervisionOptions(verify=False, lock_wait_s=300)), log=None)
    e.start()
    try:
        used = {h: e.host(h).cmd(f"cat {SYSCTL / 'tcp_congestion_control'}").strip() for h in fgraph.hosts(e.graph)}
    finally:
        e.stop()
    assert set(used.values()) == {wanted}, used
