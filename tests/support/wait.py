"""Waiting for something a live system does (a switch connects, a flow appears, a log line is written):
``wait_for`` polls a predicate until it holds or the time is up. Import with
``from support.wait import wait_for``."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float = 15.0, step_s: float = 0.2) -> T:
    """Call ``predicate`` every ``step_s`` until it returns something true or ``timeout_s`` has passed;
    its last answer (true: it held in time), so that ``assert wait_for(...)`` fails when it did not."""
    deadline = time.monotonic() + timeout_s
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(step_s)
        value = predicate()
    return value
