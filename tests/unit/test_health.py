"""The controller's /health answer (controller/metrics.py): the decision, pure; the endpoint beside /metrics."""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

from hpnlab.controller.metrics import STALE_INTERVALS, STALE_MIN_S, Metrics, health

SWITCHES = ["p0l0", "p0l1", "p0s0", "p1l0"]


def check(**changes: Any) -> tuple[int, dict[str, Any]]:
    inputs: dict[str, Any] = dict(uptime_s=60.0, expected=SWITCHES, connected=SWITCHES, last_recompile_unix=1.7e9,
                                  last_recompile_age_s=30.0, telemetry_interval_s=0.2, telemetry_age_s=0.1)
    inputs.update(changes)
    return health(**inputs)


def test_every_switch_connected_and_fresh_telemetry_is_healthy():
    status, body = check()
    assert status == 200 and body["status"] == "ok" and body["problems"] == []
    assert body["switches"] == {"connected": 4, "expected": 4, "missing": []}


def test_a_missing_switch_is_503_naming_it():
    status, body = check(connected=["p0l0", "p0l1", "p0s0"])
    assert status == 503 and body["switches"]["missing"] == ["p1l0"]
    assert body["problems"] == ["1 of 4 switches not connected: p1l0"]


def test_a_switch_not_in_the_scenario_does_not_count_as_connected():
    status, body = check(connected=["p0l0", "p0l1", "p0s0", "stranger"])
    assert status == 503 and body["switches"]["connected"] == 3


def test_telemetry_older_than_its_limit_is_503():
    limit = max(STALE_INTERVALS * 0.2, STALE_MIN_S)
    assert check(telemetry_age_s=limit)[0] == 200
    status, body = check(telemetry_age_s=limit + 0.5)
    assert status == 503 and "telemetry is" in body["problems"][0]


def test_no_telemetry_sample_yet_is_healthy_only_while_the_controller_is_young():
    limit = max(STALE_INTERVALS * 0.2, STALE_MIN_S)
    assert check(telemetry_age_s=None, uptime_s=limit - 0.1)[0] == 200
    assert check(telemetry_age_s=None, uptime_s=limit + 0.1)[0] == 503


def test_telemetry_switched_off_is_never_stale():
    status, body = check(telemetry_interval_s=0.0, telemetry_age_s=None)
    assert status == 200 and body["telemetry"] == {"enabled": False}


def test_the_answer_carries_the_last_recompile():
    assert check()[1]["last_recompile"] == {"unix": 1.7e9, "age_s": 30.0}


@pytest.fixture
def served():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = Metrics()
    m.switches_expected.set(4)
    m.serve(port)
    return m, f"http://127.0.0.1:{port}"


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("path", ["/health", "/healthz"])
def test_the_endpoint_answers_the_health_sources_status_and_json(served, path):
    m, base = served
    m.health_source = lambda: check(connected=[])
    status, data = get(base + path)
    assert status == 503 and json.loads(data)["switches"]["missing"] == sorted(SWITCHES)
    m.health_source = check
    status, data = get(base + path)
    assert status == 200 and json.loads(data)["status"] == "ok"


def test_metrics_are_still_served_beside_it(served):
    _, base = served
    status, data = get(base + "/metrics")
    assert status == 200 and b"hpnlab_switches_expected 4.0" in data
