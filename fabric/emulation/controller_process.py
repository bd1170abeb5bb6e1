"""The controller as a process: started in its own process group, ready when it prints
``ready``, stopped by its pid (never by name); watched, so that its loss is noticed
(:class:`ControllerWatch`) and answered as the user chose (:data:`ON_CONTROLLER_LOSS`).

Everything the run tells the controller goes on its command line as plain flags (the emulation
never imports the controller): the controller checks them as it checks any user's, builds its one
configuration from them and writes it into the run directory (``--run-dir``) as
:data:`CONFIG_FILE`, every setting with its value; the app reads it from there. Only what the run
sets is passed: every default is the controller's own. The run's id goes as ``--ecn-stage-run``:
the controller writes thresholds to this run's ECN stage."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import yaml

from hpnlab.fabric.routing.compiler import ARP_MODES
from hpnlab.fabric.scenario import spec

from ..errors import UserError
from .state import ENV_MARK

DEFAULT_OFP_PORT = 6653
#: the controller's configuration, as it writes it into the run directory (``--run-dir``)
CONFIG_FILE = "controller.yaml"
#: what a run does when its controller process dies: restart it (the switches keep their tables in
#: fail mode secure, and the restarted controller reads them back and changes only what differs),
#: stop the run, or say so and continue without it
ON_CONTROLLER_LOSS = ("restart", "stop", "continue")

#: a TLS directory's files, as tools/scripts/make_test_ca.sh writes them: what the controller and the
#: switches (Open vSwitch's ``set-ssl``) each present, and the CA both trust
TLS_FILES = {"ca": "ca-cert.pem", "controller_key": "controller-key.pem", "controller_cert": "controller-cert.pem",
             "switch_key": "switch-key.pem", "switch_cert": "switch-cert.pem"}


def tls_files(directory: str | Path) -> dict[str, str]:
    """The TLS directory's files by role (``TLS_FILES``), as absolute paths; UserError (one line)
    when the directory or one of them is missing."""
    d = Path(directory)
    if not d.is_dir():
        raise UserError(f"TLS directory {directory}: no such directory "
                        f"(make a test one: tools/scripts/make_test_ca.sh DIR)")
    missing = [name for name in TLS_FILES.values() if not (d / name).is_file()]
    if missing:
        raise UserError(f"TLS directory {directory} lacks {', '.join(missing)} "
                        f"(tools/scripts/make_test_ca.sh DIR writes the whole set)")
    return {role: str((d / name).resolve()) for role, name in TLS_FILES.items()}


def tls_args(files: dict[str, str]) -> list[str]:
    """The controller's TLS flags for a TLS directory's files (controller/__main__.py)."""
    return ["--ssl-key", files["controller_key"], "--ssl-cert", files["controller_cert"], "--ssl-ca", files["ca"]]


class ControllerError(RuntimeError):
    """The controller exited or never said it was ready."""


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(preferred: int = DEFAULT_OFP_PORT) -> int:
    """``preferred`` when it is free, else a port the kernel picks."""
    if port_free(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(scenario_file: Path, port: int, listen: str, policy: str | None = None,
            extra: list[str] | tuple[str, ...] = (), run_dir: Path | None = None,
            run_id: str | None = None) -> list[str]:
    """The controller's command line (this interpreter, ``-m hpnlab.controller``): its configuration
    written to ``run_dir``, thresholds to run ``run_id``'s ECN stage."""
    cmd = [sys.executable, "-m", "hpnlab.controller", str(scenario_file), "--ofp-port", str(port),
           "--listen", listen]
    if policy:
        cmd += ["--policy", policy]
    if run_dir is not None:
        cmd += ["--run-dir", str(run_dir)]
    if run_id:
        cmd += ["--ecn-stage-run", run_id]
    return cmd + list(extra)


def ecn_args(ecn_policy: str | None = None, telemetry_interval_ms: float | None = None,
             telemetry_out: Path | None = None, control: Path | None = None) -> list[str]:
    """The controller flags of telemetry and dynamic ECN (controller/conf.py); None: the controller's default."""
    out = []
    if ecn_policy is not None:
        out += ["--ecn-policy", ecn_policy]
    if telemetry_interval_ms is not None:
        out += ["--telemetry-interval-ms", f"{telemetry_interval_ms:g}"]
    if telemetry_out is not None:
        out += ["--telemetry-out", str(telemetry_out)]
    if control is not None:
        out += ["--ecn-control", str(control)]
    return out


def request_policy(control: Path, policy: str, timeout_s: float = 5.0, what: str = "ECN policy") -> None:
    """Ask a running controller to replace its ECN policy (through ``control``, see controller/ecn_loop.py)
    and wait for its answer; ControllerError when it refuses or does not answer in time."""
    ack = control.with_name(control.name + ".ack")
    seq = time.monotonic_ns()
    tmp = control.with_name(control.name + ".tmp")
    tmp.write_text(json.dumps({"policy": policy, "seq": seq}))
    os.replace(tmp, control)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            answer = json.loads(ack.read_text())
        except (OSError, ValueError):
            answer = {}
        if answer.get("seq") == seq:
            if answer.get("error"):
                raise ControllerError(f"the controller refused {what} {policy!r}: {answer['error']}")
            return
        time.sleep(0.05)
    raise ControllerError(f"the controller did not take {what} {policy!r} within {timeout_s:g} s")


class ControllerProcess:
    """One controller process for one run; its files go into ``run_dir``."""

    def __init__(self, scenario: spec.Scenario, run_dir: Path, port: int, listen: str = "127.0.0.1",
                 policy: str | None = None, extra_args: list[str] | tuple[str, ...] = (),
                 run_id: str | None = None):
        self.scenario_file = run_dir / "scenario.yaml"
        self.log_file = run_dir / "controller.log"
        #: the controller's configuration, every setting with its value, once it started (``config``)
        self.config_file = run_dir / CONFIG_FILE
        self.scenario = scenario
        self.port = port
        #: the run whose ECN stage the controller writes to: this process's run (its mark), unless given
        self.run_id = run_id if run_id is not None else os.environ.get(ENV_MARK)
        self.cmd = command(self.scenario_file, port, listen, policy, extra_args, run_dir, self.run_id)
        self.proc: subprocess.Popen | None = None

    def config(self) -> dict:
        """The configuration the controller wrote (plain keys: its flags' names), {} before it did."""
        try:
            doc = yaml.safe_load(self.config_file.read_text())
        except (OSError, yaml.YAMLError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def start(self) -> subprocess.Popen:
        """Start it in its own session (process group = its pid); the caller records the pid. A
        restart appends to the same log (``wait_ready`` reads only what the new process wrote)."""
        self.scenario_file.write_text(yaml.safe_dump(spec.to_dict(self.scenario), sort_keys=False))
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._log_from = self.log_file.stat().st_size if self.log_file.exists() else 0
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, cwd=root, env=env)
        try:      # started from a real-time thread (a timeline's), it would inherit SCHED_FIFO
            os.sched_setscheduler(self.proc.pid, os.SCHED_OTHER, os.sched_param(0))
        except (OSError, AttributeError):
            pass
        return self.proc

    def exited(self) -> int | None:
        """Its exit code once it has exited, else None."""
        return None if self.proc is None else self.proc.poll()

    def kill(self, sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> int | None:
        """End it (its process group, by its pid) and reap it; its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise ControllerError(f"the controller (pid {self.proc.pid}) did not end within {timeout_s:g} s") from None

    def _log_text(self) -> str:
        with open(self.log_file, "rb") as f:
            f.seek(getattr(self, "_log_from", 0))
            return f.read().decode(errors="replace")

    def wait_ready(self, timeout_s: float) -> None:
        """Until the log says ``ready``; ControllerError when it exits or the time is up."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self._log_text()
            if "ready" in text:
                return
            if self.exited() is not None:
                tail = text.strip().splitlines()[-3:]
                raise ControllerError(f"the controller exited (code {self.exited()}): " + " | ".join(tail))
            time.sleep(0.05)
        raise ControllerError(f"the controller did not print 'ready' within {timeout_s:g} s (log: {self.log_file})")


def check_on_controller_loss(choice: str) -> str:
    """``choice`` when it is one of :data:`ON_CONTROLLER_LOSS`, else a one-line UserError."""
    if choice not in ON_CONTROLLER_LOSS:
        raise UserError(f"--on-controller-loss {choice!r}: one of {', '.join(ON_CONTROLLER_LOSS)}")
    return choice


def check_arp_mode(mode: str, controller: str = "hpnlab") -> str:
    """``mode`` when it is one of the controller's ARP modes (``compiler.ARP_MODES``) and a controller
    that answers ARP runs, else a one-line UserError."""
    if mode not in ARP_MODES:
        raise UserError(f"--arp {mode!r}: one of {', '.join(ARP_MODES)}")
    if mode != "gateway" and controller != "hpnlab":
        raise UserError(f"--arp {mode} needs the hpnlab controller (its leaves answer ARP)")
    return mode


class Watched(Protocol):
    """What a watch follows: the controller's current process (replaced on a restart)."""
    proc: subprocess.Popen | None


class ControllerWatch:
    """Polls a controller process every ``interval_s`` and calls ``on_loss(exit_code)`` once each time
    it is found dead (a thread; ``stop()`` before ending the controller on purpose). ``on_loss`` may
    start a new process (the watch then follows ``ctl.proc``, whatever object it is now)."""

    def __init__(self, ctl: Watched, on_loss: Callable[[int], None], interval_s: float = 0.2):
        self.ctl = ctl
        self.on_loss = on_loss
        self.interval_s = interval_s
        self.losses = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpnlab-controller-watch", daemon=True)

    def start(self) -> ControllerWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        seen = None
        while not self._stop.wait(self.interval_s):
            proc = self.ctl.proc
            if proc is None or proc is seen:
                continue
            code = proc.poll()
            if code is not None:
                seen = proc          # this process is reported once; a restarted one is watched anew
                self.losses += 1
                try:
                    self.on_loss(code)
                except Exception as exc:     # the watch must survive what the answer does
                    print(f"hpnlab: answering the controller's loss failed: {exc}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
