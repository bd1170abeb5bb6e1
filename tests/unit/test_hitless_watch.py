"""A dead controller is noticed (its pid polled) and answered as the user chose; the timeline can kill
and restart it (pure: real short-lived processes, no root, no switch)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from support.fabrics import fabric

from hpnlab.fabric.emulation import timeline
from hpnlab.fabric.emulation.controller_process import ControllerWatch, check_on_controller_loss
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment


class Ctl:
    """A controller process as the watch sees it."""

    def __init__(self, proc: subprocess.Popen):
        self.proc: subprocess.Popen | None = proc


def exiting(code: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code})"])


def test_a_controller_that_dies_is_reported_once_with_its_exit_code():
    ctl = Ctl(exiting(3))
    seen: list[int] = []
    done = threading.Event()

    def on_loss(code: int) -> None:
        seen.append(code)
        done.set()

    watch = ControllerWatch(ctl, on_loss, interval_s=0.02).start()
    try:
        assert done.wait(10)
        done.clear()
        assert not done.wait(0.2)            # the same dead process is not reported again
    finally:
        watch.stop()
    assert seen == [3] and watch.losses == 1


def test_a_restarted_controller_is_watched_anew():
    ctl = Ctl(exiting(1))
    seen: list[int] = []
    second = threading.Event()

    def on_loss(code: int) -> None:
        seen.append(code)
        if len(seen) == 1:
            ctl.proc = exiting(9)          # what a restart does: a new process in its place
        else:
            second.set()

    watch = ControllerWatch(ctl, on_loss, interval_s=0.02).start()
    try:
        assert second.wait(10)
    finally:
        watch.stop()
    assert seen == [1, 9]


def test_a_live_controller_is_not_reported():
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    ctl = Ctl(live)
    seen: list[int] = []
    watch = ControllerWatch(ctl, seen.append, interval_s=0.02).start()
    try:
        threading.Event().wait(0.2)
    finally:
        watch.stop()
        live.kill()
        live.wait()
    assert seen == []


@pytest.mark.parametrize("choice", ["restart", "stop", "continue"])
def test_the_three_answers_to_a_controller_loss_are_accepted(choice):
    assert check_on_controller_loss(choice) == choice


def test_another_answer_is_one_line():
    with pytest.raises(UserError, match="--on-controller-loss 'reboot': one of restart, stop, continue"):
        check_on_controller_loss("reboot")


def test_a_timeline_kills_and_restarts_the_controller_and_counts_the_kill_as_a_failure():
    g = fabric("mini-hpn")
    events = timeline.parse([{"at": 0.5, "action": "controller_kill"},
                             {"at": 1.5, "action": "controller_restart"}], g)
    assert [(e.action, e.target) for e in events] == [("controller_kill", ("controller",)),
                                                       ("controller_restart", ("controller",))]
    assert experiment.left_failed(events) == []
    assert experiment.left_failed(events[:1]) == ["controller_kill controller"]


def test_a_controller_event_naming_a_switch_is_one_line():
    with pytest.raises(UserError, match="controller_kill takes no 'switch'"):
        timeline.parse([{"at": 0.5, "action": "controller_kill", "switch": "p0l0"}], fabric("mini-hpn"))


def watched_controller(choice: str, proc: subprocess.Popen, said: list[str]):
    """The controller supervisor of an Emulation (not started: no root needed) whose controller is
    ``proc``, watched."""
    from hpnlab.fabric.emulation import Emulation, EmulationOptions
    from hpnlab.fabric.emulation.options import ControllerOptions
    emu = Emulation("mini-hpn", EmulationOptions(controller=ControllerOptions(on_loss=choice)), log=said.append)
    emu.controller._ctl = Ctl(proc)
    emu.controller.watch()
    return emu.controller


def test_a_run_asked_to_stop_on_controller_loss_stops_with_one_line():
    from hpnlab.fabric.emulation import ControllerLost
    said: list[str] = []
    ctl = watched_controller("stop", exiting(5), said)
    try:
        with pytest.raises(ControllerLost, match=r"the controller \(pid \d+\) exited with code 5: stopping the run"):
            threading.Event().wait(10)
    finally:
        ctl.unwatch()
    assert len(said) == 1 and "--on-controller-loss stop" in said[0]
    assert [loss["action"] for loss in ctl.losses] == ["stop"]


def test_a_run_asked_to_continue_says_so_once_and_goes_on():
    said: list[str] = []
    ctl = watched_controller("continue", exiting(0), said)
    try:
        deadline = time.monotonic() + 10
        while not said and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
    finally:
        ctl.unwatch()
    assert len(said) == 1 and "continuing without it" in said[0]
