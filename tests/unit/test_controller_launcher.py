"""The controller as a process: `python -m hpnlab.controller` and `hpnlab controller` (real os-ken, real TCP)."""
from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import REPO

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph, spec

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


@pytest.mark.parametrize("argv,needle", [
    (["no-such-preset"], "unknown preset"),
    (["mini-hpn", "--set", "planes=0"], "planes"),
    (["mini-hpn", "--ofp-port", "70000"], "not a TCP port"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, needle):
    r = subprocess.run([sys.executable, "-m", "hpnlab.controller", *argv], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_a_taken_port_is_one_line_and_exit_code_2():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "hpnlab.controller", "mini-hpn", "--ofp-port", str(port)],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and f"127.0.0.1:{port}" in r.stderr


def test_hpnlab_controller_show_prints_a_switchs_compiled_flows():
    r = subprocess.run([HPNLAB, "controller", "mini-hpn", "--show", "p0l1", "--fail", "p0l0-p0s0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    g = graph.build(spec.load("mini-hpn"))
    st = compiler.compile_fabric(g, compiler.Failures.of([("p0l0", "p0s0", 0)]))["p0l1"]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 + st.flow_count
    assert "3 de-aggregated routes" in lines[0]
    # p0l0's prefix avoids p0s0: the uplink set's metadata with "avoid that port" (compiler docstring)
    assert any(line.startswith("table=1 ") and "ipv4_dst=10.0.0.0/255.255.255.248" in line and "goto:2" in line
               for line in lines)


def test_hpnlab_controller_show_rejects_an_unknown_switch_in_one_line():
    r = subprocess.run([HPNLAB, "controller", "mini-hpn", "--show", "p9l9"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "p9l9" in r.stderr
