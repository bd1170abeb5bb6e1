"""The controller launcher as a real process speaking OpenFlow 1.3 on loopback."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from unit.test_controller_launcher import HPNLAB, ROOT, free_port, openflow_hello, start, stop


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
