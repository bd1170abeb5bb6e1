"""/health on a real controller process (os-ken, eventlet hub): no switch has connected, so 503 naming them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from support.controller_process import ROOT, free_port

from hpnlab.fabric.scenario import graph, spec

pytestmark = pytest.mark.controller


def test_a_controller_without_its_switches_answers_503_naming_every_one():
    ofp, http = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hpnlab.controller", "mini-hpn", "--ofp-port", str(ofp),
                             "--metrics-port", str(http), "--telemetry-interval-ms", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        while "ready" not in proc.stdout.readline() and time.monotonic() < deadline:
            assert proc.poll() is None, "the controller exited"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=5)
            raise AssertionError("a controller with no switch answered 200")
        except urllib.error.HTTPError as exc:
            status, body = exc.code, json.loads(exc.read())
        switches = graph.switches(graph.build(spec.load("mini-hpn")))
        assert status == 503 and body["up"] is True
        assert body["switches"] == {"connected": 0, "expected": len(switches), "missing": sorted(switches)}
        assert body["last_recompile"]["age_s"] >= 0 and body["telemetry"] == {"enabled": False}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
