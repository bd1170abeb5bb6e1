"""``--on-miswire off`` on a live fabric (mini-hpn, real Open vSwitch, the controller as a process): a link is
down, the controller is killed and restarted; it holds its changes until every switch has told its ports
(wiring.release_ungated), so no flow is deleted and re-added (Open vSwitch's flow durations keep growing)
and the failed link stays routed around. One emulation, no shaping, no ECN stage (about 25 s)."""
from __future__ import annotations

import re
import time

import pytest
from support.emulated import flows, not_re_added
from support.wait import wait_for

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

LINK = ("p0l0", "p0s0")


@pytest.fixture(scope="module")
def emu(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, PortOptions, SupervisionOptions

    with Emulation("mini-hpn", EmulationOptions(
        controller=ControllerOptions(extra_args=("--on-miswire", "off")), ports=PortOptions(ecn=False, shape=False),
        supervision=SupervisionOptions(verify=False, lock_wait_s=300)), log=None) as e:
        yield e


def released(emu) -> list[str]:
    """The controller log's lines saying the held changes went out (one per controller start)."""
    with open(emu.metadata["controller_log"], errors="replace") as f:
        return re.findall(r"on-miswire off: installing now \(.*\)", f.read())


def test_restarted_during_a_failure_with_the_gate_off_it_re_adds_no_flow(emu, capsys):
    healthy = flows(emu)
    emu.faults.link_down(*LINK)
    time.sleep(3.0)                                   # rerouted around the failed link
    before = flows(emu)
    assert before.keys() != healthy.keys()
    starts = len(released(emu))
    t0 = time.monotonic()
    emu.controller.restart()
    assert wait_for(lambda: len(released(emu)) > starts, 20.0)
    time.sleep(3.0)                                   # whatever it would change, it has sent by now
    after = flows(emu)
    line = released(emu)[-1]
    with capsys.disabled():
        print(f"\nafter the restart: {line}; flows {len(before)} -> {len(after)}, "
              f"re-added {len(not_re_added(before, after, time.monotonic() - t0))}")
    assert not_re_added(before, after, time.monotonic() - t0) == []
    emu.faults.link_up(*LINK)
