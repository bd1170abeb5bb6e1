"""A controller process against simulated switches, both started as processes and stopped by pid (for tests and
tools/bench/bench_controller_scale.py). The controller is started by its command line (``python -m
hpnlab.controller``), never imported: this package stands beside the controller, as real switches do.

    with Run("mini-hpn", controller_args=["--on-miswire", "off"]) as run:
        run.wait(run.settled(expected))            # every switch holds what it should, a barrier after it
        run.send("link down p0l0 p0s0")
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpnlab.fabric.routing import compiler

from . import server

#: the controller under cProfile, its profile written when SIGTERM stops it (cProfile's own -o writes only at a
#: normal exit): argv[1] the profile's path, the rest the controller's arguments
PROFILED = """
import cProfile, os, runpy, signal, sys
out = sys.argv[1]
prof = cProfile.Profile()
def stop(*_):
    prof.disable()
    prof.dump_stats(out)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
sys.argv = ["hpnlab.controller", *sys.argv[2:]]
prof.enable()
runpy.run_module("hpnlab.controller", run_name="__main__", alter_sys=True)
"""


class RunError(RuntimeError):
    """A process of the run died or something never happened in time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def expected_counts(states: Mapping[str, compiler.SwitchState], extra_flows: int = 0) -> dict[str, tuple[int, int]]:
    """Per switch (flow entries, groups) that compiled ``states`` install (``extra_flows``: the controller's
    own rules besides, e.g. 1 for the LLDP rule)."""
    return {n: (st.flow_count + extra_flows, len(st.groups)) for n, st in states.items()}


class Run:
    def __init__(self, scenario: str, *, controller_args: list[str] | tuple[str, ...] = (),
                 switch_args: list[str] | tuple[str, ...] = (), nice: int = 0, directory: Path | None = None,
                 start_controller: bool = True, profile: Path | None = None):
        self.scenario = scenario
        self.controller_args = list(controller_args)
        self.switch_args = list(switch_args)
        self.nice = nice
        self._own_dir = directory is None          # removed at a clean exit (kept, with the logs, after an error)
        self.dir = Path(directory or tempfile.mkdtemp(prefix="hpnlab-switches-run-"))
        self.port = free_port()
        self.controller: subprocess.Popen | None = None
        self.switches: subprocess.Popen | None = None
        self.start_controller = start_controller
        self.controller_started_at: float | None = None
        self.profile = profile          # the controller runs under cProfile, writing here when stopped

    @property
    def control(self) -> Path:
        return self.dir / "switches" / "control.sock"

    def _popen(self, argv: list[str], log: str) -> subprocess.Popen:
        pre = ["nice", "-n", str(self.nice)] if self.nice else []
        with open(self.dir / log, "w") as out:
            return subprocess.Popen(pre + argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def start_the_controller(self) -> None:
        self.controller_started_at = time.time()
        start = ["-c", PROFILED, str(self.profile)] if self.profile else ["-m", "hpnlab.controller"]
        self.controller = self._popen([sys.executable, *start, self.scenario, "--ofp-port",
                                       str(self.port), "--listen", "127.0.0.1", *self.controller_args],
                                      "controller.log")
        self.wait_log("controller.log", "ready", self.controller, 120)

    def stop_the_controller(self) -> None:
        self._stop(self.controller)
        self.controller = None

    def controller_usage(self) -> dict[str, float]:
        """The controller process's CPU seconds so far and peak resident memory (MiB), from /proc."""
        assert self.controller is not None
        pid = self.controller.pid
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        tick = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / tick
        hwm = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmHWM:"))
        return {"cpu_s": cpu, "peak_rss_mib": hwm / 1024}

    def __enter__(self) -> Run:
        self.switches = self._popen([sys.executable, "-m", "hpnlab.cli", "switches", self.scenario, "--controller",
                                     f"127.0.0.1:{self.port}", "--run-dir", str(self.dir / "switches"),
                                     *self.switch_args], "switches.log")
        self.wait_log("switches.log", "ready", self.switches, 300)
        if self.start_controller:
            self.start_the_controller()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._stop(self.controller)
        self._stop(self.switches)
        if self._own_dir and exc_type is None:
            shutil.rmtree(self.dir, ignore_errors=True)
        elif self._own_dir:       # kept for its logs, and said so: nothing else would remove it
            print(f"hpnlab switches: run directory kept for its logs: {self.dir}", file=sys.stderr)

    @staticmethod
    def _stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def log(self, name: str) -> str:
        return (self.dir / name).read_text(errors="replace")

    def wait_log(self, name: str, word: str, proc: subprocess.Popen, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if word in self.log(name):
                return
            if proc.poll() is not None:
                raise RunError(f"{name}: exited ({proc.returncode}): {self.log(name)[-2000:]}")
            time.sleep(0.05)
        raise RunError(f"{name}: no {word!r} within {timeout_s:g} s")

    # ---- the switches' control socket -------------------------------------------------------------
    def send(self, line: str) -> str:
        answer = server.send(self.control, line)
        if answer.startswith("error"):
            raise RunError(f"{line!r}: {answer}")
        return answer

    def stats(self) -> dict:
        return dict(json.loads(self.send("stats")))

    def wait(self, done: Callable[[dict], bool], timeout_s: float = 120.0, poll_s: float = 0.2) -> dict:
        """Poll the switches' stats until ``done(stats)``; the stats that satisfied it."""
        deadline = time.monotonic() + timeout_s
        last: dict = {}
        while time.monotonic() < deadline:
            for proc, name in ((self.controller, "controller.log"), (self.switches, "switches.log")):
                if proc is not None and proc.poll() is not None:
                    raise RunError(f"{name}: exited ({proc.returncode}): {self.log(name)[-2000:]}")
            last = self.stats()
            if done(last):
                return last
            time.sleep(poll_s)
        raise RunError(f"not settled within {timeout_s:g} s: {summary(last, {})}")

    @staticmethod
    def settled(expected: Mapping[str, tuple[int, int]], since: float = 0.0) -> Callable[[dict], bool]:
        """Every switch holds the expected number of flows and groups, and answered a barrier after its last
        change (after ``since``, when it changed after ``since``)."""
        def done(st: dict) -> bool:
            sws = st["switches"]
            for name, (flows, groups) in expected.items():
                s = sws.get(name)
                if s is None or s["flows"] != flows or s["groups"] != groups:
                    return False
                if s["changed_at"] is not None and s["changed_at"] > since and (
                        s["barrier_at"] is None or s["barrier_at"] < s["changed_at"]):
                    return False
            return True
        return done


def summary(st: dict, expected: Mapping[str, tuple[int, int]]) -> str:
    sws = st.get("switches", {})
    flows = sum(s["flows"] for s in sws.values())
    want = sum(f for f, _g in expected.values())
    return f"{len(sws)} switches, {flows} flows held" + (f" of {want}" if expected else "")
