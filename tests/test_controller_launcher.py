"""The controller as a process: `python -m hpnlab.controller` and `hpnlab controller` (real os-ken, real TCP)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpnlab.controller import compiler
from hpnlab.fabric import graph, spec

ROOT = Path(__file__).resolve().parent.parent
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


@pytest.mark.controller
def test_launcher_prints_ready_and_speaks_openflow_13_on_loopback():
    port = free_port()
    proc, line = start([sys.executable, "-m", "hpnlab.controller", "mini-hpn", "--ofp-port", str(port)])
    try:
        assert f"127.0.0.1:{port}" in line and "aggregate" in line
        version, msg_type, _, _ = struct.unpack("!BBHI", openflow_hello(port))
        assert (version, msg_type) == (4, 0)          # OpenFlow 1.3 HELLO back
        listening = subprocess.run(["ss", "-Htln", f"sport = :{port}"], capture_output=True, text=True).stdout
        assert [line.split()[3] for line in listening.splitlines()] == [f"127.0.0.1:{port}"]   # loopback only
    finally:
        stop(proc)
    assert proc.returncode is not None


@pytest.mark.controller
def test_hpnlab_controller_runs_the_same_launcher_with_metrics():
    port, mport = free_port(), free_port()
    proc, line = start([HPNLAB, "controller", "mini-hpn", "--policy", "host-routes", "--ofp-port", str(port),
                        "--metrics-port", str(mport)])
    try:
        assert "host-routes" in line and f"127.0.0.1:{mport}/metrics" in line
        import urllib.request
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
        assert "hpnlab_switches_expected 12.0" in text
        assert "hpnlab_switches_connected 0.0" in text
    finally:
        stop(proc)


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


@pytest.mark.controller
def test_the_same_app_file_runs_under_ryu_manager():
    try:
        import ryu  # noqa: F401
    except ImportError:
        pytest.skip("Ryu is not installed (it does not install on Python >= 3.10 without patches); "
                    "the import shim is exercised by os-ken only")
    manager = shutil.which("ryu-manager") or str(Path(sys.executable).with_name("ryu-manager"))
    port = free_port()
    env = dict(os.environ, HPNLAB_SCENARIO="mini-hpn")
    proc = subprocess.Popen([manager, "--ofp-tcp-listen-port", str(port), "--ofp-listen-host", "127.0.0.1",
                             str(ROOT / "controller" / "app.py")], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        header = b""
        while time.monotonic() < deadline and not header:
            try:
                header = openflow_hello(port)
            except OSError:
                time.sleep(0.2)
        assert struct.unpack("!BBHI", header)[:2] == (4, 0)
    finally:
        stop(proc)


@pytest.mark.controller
def test_a_bad_hpnlab_arp_is_one_line_and_exit_code_2_when_the_app_starts():
    r = subprocess.run([sys.executable, "-m", "hpnlab.controller", "mini-hpn", "--ofp-port", str(free_port())],
                       capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env=dict(os.environ, HPNLAB_ARP="per-leaf"))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "HPNLAB_ARP='per-leaf'" in lines[0] and "Traceback" not in r.stderr
