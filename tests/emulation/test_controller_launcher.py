"""The controller launcher as a real process speaking OpenFlow 1.3 on loopback."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
import yaml
from support.controller_process import HPNLAB, ROOT, free_port, openflow_hello, start, stop


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
def test_a_bad_arp_mode_in_the_config_file_is_one_line_and_exit_code_2(tmp_path):
    config = tmp_path / "controller.yaml"
    config.write_text("scenario: mini-hpn\narp: per-leaf\n")
    r = subprocess.run([sys.executable, "-m", "hpnlab.controller", "--config", str(config), "--ofp-port",
                        str(free_port())], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "arp: 'per-leaf'" in lines[0] and "Traceback" not in r.stderr


@pytest.mark.controller
def test_the_configuration_written_to_the_run_directory_starts_the_same_controller_again(tmp_path):
    port = free_port()
    proc, _line = start([sys.executable, "-m", "hpnlab.controller", "mini-hpn", "--ofp-port", str(port),
                         "--telemetry-interval-ms", "0", "--policy", "host-routes", "--run-dir", str(tmp_path)])
    stop(proc)
    written = yaml.safe_load((tmp_path / "controller.yaml").read_text())
    assert (written["scenario"], written["ofp_port"], written["policy"]) == ("mini-hpn", port, "host-routes")
    assert written["telemetry_interval_ms"] == 0 and written["arp"] == "gateway"      # defaults written too
    proc, line = start([HPNLAB, "controller", "--config", str(tmp_path / "controller.yaml")])
    try:
        assert "host-routes" in line and f"127.0.0.1:{port}" in line
    finally:
        stop(proc)


@pytest.mark.controller
def test_without_a_run_directory_no_configuration_file_is_left_behind(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc, _line = start([sys.executable, "-m", "hpnlab.controller", "mini-hpn", "--ofp-port", str(free_port()),
                         "--telemetry-interval-ms", "0"], env=dict(os.environ, TMPDIR=str(temp)))
    try:
        assert list(temp.iterdir()) == []          # written, read by the app, removed
    finally:
        stop(proc)
