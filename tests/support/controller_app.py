"""Fixtures of the os-ken app on fake datapaths (tests/support/fake_switch.py), registered for every test
module in tests/conftest.py (``pytest_plugins``); each skips where os-ken is not installed."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def app(tmp_path: Path) -> Any:
    """mini-hpn's app with the wiring gate off: it installs as switches connect (the gate: make_app)."""
    pytest.importorskip("os_ken")
    from support.fake_switch import controller_app
    return controller_app(tmp_path, policy="aggregate", on_miswire="off")


@pytest.fixture
def make_app(tmp_path: Path) -> Callable[..., Any]:
    """``make_app(on_miswire="refuse", **settings)``: mini-hpn's app behind the wiring gate, its report in
    ``tmp_path/wiring.json``, no telemetry, the wiring decided when every link is heard (or by the test)."""
    pytest.importorskip("os_ken")
    from support.fake_switch import controller_app

    def make(mode: str = "refuse", **settings: Any) -> Any:
        return controller_app(tmp_path, **{"on_miswire": mode, "wiring_out": str(tmp_path / "wiring.json"),
                                           "discovery_s": 3600, "telemetry_interval_ms": 0, **settings})
    return make
