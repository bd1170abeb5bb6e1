"""SIGTERM and SIGHUP unwind a run through its ``stop()`` (as SIGINT does), then the old handlers return."""
from __future__ import annotations

import signal
import threading
from typing import Any


class Unwind:
    """While installed, SIGTERM/SIGHUP raise SystemExit(128 + signal) in the main thread."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return   # only the main thread may set handlers; a worker's run relies on its caller

        def on_term(signum: int, _frame: Any) -> None:
            raise SystemExit(128 + signum)

        for sig in self.SIGNALS:
            self._old[sig] = signal.signal(sig, on_term)

    def restore(self) -> None:
        for sig, handler in self._old.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, TypeError):
                pass
        self._old.clear()
