"""`hpnlab controller --config FILE` as a process: the file's settings reach the running controller
(TLS, ports, policy), and a flag on the command line wins over the file."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from support.controller_process import HPNLAB, ROOT, free_port
from support.paths import SCRIPTS

pytestmark = pytest.mark.controller


def test_the_config_files_settings_reach_the_running_controller_and_flags_win(tmp_path):
    ca = tmp_path / "tls"
    subprocess.run(["sh", str(SCRIPTS / "make_test_ca.sh"), str(ca)], check=True, capture_output=True)
    ofp, http = free_port(), free_port()
    cfg = tmp_path / "controller.yaml"
    cfg.write_text(f"scenario: mini-hpn\nofp_port: {ofp}\nmetrics_port: {http}\npolicy: aggregate\n"
                   f"telemetry_interval_ms: 0\n"
                   f"tls: {{key: {ca}/controller-key.pem, cert: {ca}/controller-cert.pem, ca: {ca}/ca-cert.pem}}\n")
    proc = subprocess.Popen([HPNLAB, "controller", "--config", str(cfg), "--policy", "host-routes"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        line, deadline = "", time.monotonic() + 30
        while "ready" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        assert "ready" in line, "no ready line"
        assert f"OpenFlow 1.3 over TLS on 127.0.0.1:{ofp}" in line
        assert f"127.0.0.1:{http}/metrics" in line
        assert "policy host-routes" in line            # the command line's, not the file's
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
