"""mini-hpn on AF_XDP switch ports, and with RoCE-sized frames (MTU 4096), end to end: every
host-port pair reachable (the harness verifies it at start) and a collective carried with every
element checked at every rank. The ceilings per port type are speed figures and live in
``tools/bench/bench_ports.py``, not here."""
from __future__ import annotations

import pytest

from hpnlab.fabric.emulation import kernel, sizing
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.runner import Plan

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


@pytest.fixture(autouse=True)
def _no_machine_budget(tmp_path, monkeypatch):
    """These tests check function, not speed: the fallback budget, not this machine's cached one."""
    monkeypatch.setenv(sizing.CACHE_ENV, str(tmp_path))


def _all_reduce(emu, ranks: int = 8) -> dict:
    plan = Plan(collectives="all_reduce", transports="roce", entropies="flow", ranks=ranks,
                placement="cross-rail", sizes="128K", iterations=2, inplace=False)
    [res] = experiment.run(plan, emu, progress=False)["results"]
    return res


def test_mini_hpn_on_afxdp_ports_is_fully_reachable_and_carries_a_collective(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, PortOptions, SupervisionOptions
    from hpnlab.fabric.scenario import spec

    caps = kernel.probe(deep=False)
    if not caps.afxdp_types:
        missing = "the kernel's AF_XDP sockets" if not caps.af_xdp else "Open vSwitch's afxdp interface types"
        pytest.skip(f"AF_XDP unavailable here: no {missing}")
    # no switch-port shaping and no ECN stage: AF_XDP bypasses tc egress, so 'auto' takes AF_XDP only then
    emu = Emulation(spec.load("mini-hpn", {"emulation": {"mtu": 1500}}), EmulationOptions(
        ports=PortOptions(shape=False, ecn=False, port_type="auto"), supervision=SupervisionOptions(lock_wait_s=300)))
    with emu:
        assert emu.metadata["port_type"]["type"] in caps.afxdp_types
        assert emu.metadata["reachability"]["failed"] == 0 and emu.metadata["reachability"]["pairs"] > 0
        res = _all_reduce(emu)
        assert res["nranks"] == 8
        assert all(row["oop"]["wrong"] == 0 for row in res["rows"])


def test_mtu_4096_crosses_the_fabric_unfragmented_and_carries_a_roce_collective(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, SupervisionOptions
    from hpnlab.fabric.scenario import spec

    emu = Emulation(spec.load("mini-hpn", {"emulation": {"mtu": 4096}}), EmulationOptions(
        supervision=SupervisionOptions(lock_wait_s=300)))
    with emu:
        assert emu.metadata["port_type"]["type"] == "system"        # shaped and ECN-marked: tc egress needed
        src, dst = emu.hosts[0], emu.hosts[-1]                       # across the spines
        out = emu.host(src).cmd(f"ping -c1 -W2 -M do -s {4096 - 28} {emu.ip(dst)}")
        assert " 0% packet loss" in out, out
        out = emu.host(src).cmd(f"ping -c1 -W2 -M do -s {4096 - 27} {emu.ip(dst)}")
        assert " 0% packet loss" not in out, out                     # one byte more does not fit
        res = _all_reduce(emu, ranks=4)
        assert all(row["oop"]["wrong"] == 0 for row in res["rows"])
