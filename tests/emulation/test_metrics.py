"""`hpnlab emulate --metrics ADDR:PORT`: the controller's Prometheus endpoint where a Prometheus set up from
the shipped dashboards scrapes, while a plain emulation runs (no --web)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from support.controller_process import free_port
from support.paths import REPO

pytestmark = [pytest.mark.emulation]


def _scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(hpnlab_switches_\w+) (\S+)$", text, re.M)}


def test_emulate_with_metrics_serves_the_controllers_prometheus_endpoint_with_every_switch_connected(
        emulation_ready):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hpnlab.cli", "emulate", "mini-hpn", "--no-verify",
                             "--lock-wait", "900", "--metrics", f"127.0.0.1:{port}", "--duration", "300"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "controller metrics:" in line:
                break
        assert f"http://127.0.0.1:{port}/metrics" in "".join(seen), "".join(seen)
        deadline = time.monotonic() + 60
        while True:         # the switches connected before "up"; their gauge follows within a telemetry round
            metrics = _scrape(f"http://127.0.0.1:{port}/metrics")
            if metrics.get("hpnlab_switches_connected") == metrics.get("hpnlab_switches_expected") or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert metrics["hpnlab_switches_expected"] == 12
        assert metrics["hpnlab_switches_connected"] == 12
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)          # Ctrl-C: the emulation takes itself down
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    rest = proc.stdout.read()
    assert proc.returncode == 130 and "Traceback" not in rest, "".join(seen) + rest    # Ctrl-C's exit code
