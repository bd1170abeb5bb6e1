"""The controller as a process started by a test (``python -m hpnlab.controller``, ``hpnlab controller``):
started in its own session, ready once it printed its ready line, stopped by its process group's id."""
from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from support.paths import REPO

ROOT = REPO
HPNLAB = str(Path(sys.executable).with_name("hpnlab"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """Start a controller process; return it once it printed its ready line (and that line)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=env, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "ready" in line:
            return proc, line
        if not line and proc.poll() is not None:
            break
    stop(proc)
    raise AssertionError(f"no ready line; stderr: {proc.stderr.read()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def openflow_hello(port: int) -> bytes:
    """Say OFPT_HELLO (OpenFlow 1.3) to the controller and return its first message header."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(struct.pack("!BBHI", 4, 0, 8, 1))
        return s.recv(8)
