"""The controller as a process: started in its own process group, ready when it prints
``ready``, stopped by its pid (never by name)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from .. import spec
from ..errors import UserError

DEFAULT_OFP_PORT = 6653

#: a TLS directory's files, as tools/make_test_ca.sh writes them: what the controller and the
#: switches (Open vSwitch's ``set-ssl``) each present, and the CA both trust
TLS_FILES = {"ca": "ca-cert.pem", "controller_key": "controller-key.pem", "controller_cert": "controller-cert.pem",
             "switch_key": "switch-key.pem", "switch_cert": "switch-cert.pem"}


def tls_files(directory: str | Path) -> dict[str, str]:
    """The TLS directory's files by role (``TLS_FILES``), as absolute paths; UserError (one line)
    when the directory or one of them is missing."""
    d = Path(directory)
    if not d.is_dir():
        raise UserError(f"TLS directory {directory}: no such directory (make a test one: tools/make_test_ca.sh DIR)")
    missing = [name for name in TLS_FILES.values() if not (d / name).is_file()]
    if missing:
        raise UserError(f"TLS directory {directory} lacks {', '.join(missing)} "
                        f"(tools/make_test_ca.sh DIR writes the whole set)")
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
            extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The controller's command line (this interpreter, ``-m hpnlab.controller``)."""
    cmd = [sys.executable, "-m", "hpnlab.controller", str(scenario_file), "--ofp-port", str(port),
           "--listen", listen]
    if policy:
        cmd += ["--policy", policy]
    return cmd + list(extra)


def ecn_args(ecn_policy: str = "static", telemetry_interval_ms: float = 200, telemetry_out: Path | None = None,
             control: Path | None = None) -> list[str]:
    """The controller flags of telemetry and dynamic ECN (controller/__main__.py)."""
    out = ["--ecn-policy", ecn_policy, "--telemetry-interval-ms", f"{telemetry_interval_ms:g}"]
    if telemetry_out is not None:
        out += ["--telemetry-out", str(telemetry_out)]
    if control is not None:
        out += ["--ecn-control", str(control)]
    return out


def request_policy(control: Path, policy: str, timeout_s: float = 5.0) -> None:
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
                raise ControllerError(f"the controller refused ECN policy {policy!r}: {answer['error']}")
            return
        time.sleep(0.05)
    raise ControllerError(f"the controller did not take ECN policy {policy!r} within {timeout_s:g} s")


class ControllerProcess:
    """One controller process for one run; its files go into ``run_dir``."""

    def __init__(self, scenario: spec.Scenario, run_dir: Path, port: int, listen: str = "127.0.0.1",
                 policy: str | None = None, extra_args: list[str] | tuple[str, ...] = ()):
        self.scenario_file = run_dir / "scenario.yaml"
        self.log_file = run_dir / "controller.log"
        self.scenario = scenario
        self.port = port
        self.cmd = command(self.scenario_file, port, listen, policy, extra_args)
        self.proc: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        """Start it in its own session (process group = its pid); the caller records the pid."""
        self.scenario_file.write_text(yaml.safe_dump(spec.to_dict(self.scenario), sort_keys=False))
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log_file, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, cwd=root, env=env)
        return self.proc

    def exited(self) -> int | None:
        """Its exit code once it has exited, else None."""
        return None if self.proc is None else self.proc.poll()

    def wait_ready(self, timeout_s: float) -> None:
        """Until the log says ``ready``; ControllerError when it exits or the time is up."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log_file.read_text(errors="replace")
            if "ready" in text:
                return
            if self.exited() is not None:
                tail = text.strip().splitlines()[-3:]
                raise ControllerError(f"the controller exited (code {self.exited()}): " + " | ".join(tail))
            time.sleep(0.05)
        raise ControllerError(f"the controller did not print 'ready' within {timeout_s:g} s (log: {self.log_file})")
