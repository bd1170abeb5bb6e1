"""The web view of a running emulation (side effects: reads files, ovsdb, the controller's metrics).

:class:`LiveSource` makes a frame every ``period_s`` from

- the controller's telemetry file (``emu.controller.telemetry_file``, ``--telemetry-out``): the newest
  ``sample`` line (``telemetry.sample_line`` rows per switch egress port), read incrementally;
- the faults as they are applied: every fault of the emulation goes through ``emu.faults``
  (``Faults.link_down`` … ``switch_up``), whoever calls it: the harness timeline, the failover
  probe, this view's injections. :func:`observe_faults` wraps those methods of that one object
  (no change to the harness) and hands each applied fault, as a timeline-style record, to the view;
- the controller's Prometheus metrics (``--metrics-port``, when given) and ovsdb's connected
  switches, once a second;
- the collective's progress (``progress`` callback of ``experiment.run``) and log lines.

Injections from the page are timeline events: ``timeline.parse`` validates them against the
graph and ``timeline.apply`` applies them, exactly as a timeline file's events; each gives a record
with the timeline's fields (``at``, ``action``, ``target``, ``key``, ``side``, ``applied_s``,
``late_ms``, ``wall``, ``start_wall``) and ``source: "web"``, kept in :attr:`LiveSource.records` for
the run's JSON.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpnlab.fabric.emulation import timeline as tl
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.tail import LineTail

from . import view
from .server import Source, WebServer

FAULT_METHODS = {"link_down": "link_down", "link_up": "link_up", "link_drop": "link_drop",
                 "link_restore": "link_restore", "switch_down": "switch_down", "switch_up": "switch_up"}


def observe_faults(faults: Any, on_fault: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
    """Wrap the fault methods of one ``Faults`` object so that every applied fault is reported as a
    record {action, target, key, side, wall}. Returns the function that removes the wrappers."""
    originals: dict[str, Any] = {}

    def wrap(name: str, action: str) -> Callable[..., float]:
        original = getattr(faults, name)
        originals[name] = original

        def wrapped(*args: Any, **kwargs: Any) -> float:
            applied = original(*args, **kwargs)
            rec: dict[str, Any]
            if action.startswith("switch"):
                rec = {"action": action, "target": [args[0] if args else kwargs["name"]], "key": None, "side": None}
            else:
                u, v = (list(args) + [kwargs.get("u"), kwargs.get("v")])[:2]
                key = args[2] if len(args) > 2 else kwargs.get("key")
                side = args[3] if len(args) > 3 else kwargs.get("side")
                if action in ("link_drop", "link_restore"):
                    side = side or u
                act = "link_down_one_side" if action == "link_down" and side else action
                rec = {"action": act, "target": [u, v], "key": key, "side": side}
            rec["wall"] = applied if isinstance(applied, float) else time.time()
            on_fault(rec)
            return applied
        return wrapped

    for name, action in FAULT_METHODS.items():
        setattr(faults, name, wrap(name, action))

    def undo() -> None:
        for name in originals:
            if name in vars(faults):
                delattr(faults, name)
    return undo


class TelemetryTail(LineTail):
    """The newest sample of a growing telemetry file (JSON lines), read from where the last read ended."""

    def __init__(self, path: str | Path | None):
        super().__init__(path)
        self.latest: dict[str, Any] | None = None
        self.header: dict[str, Any] | None = None

    def read(self) -> dict[str, Any] | None:
        for raw in self.lines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if line.get("kind") == "sample":
                self.latest = line
            elif line.get("kind") == "header":
                self.header = line
        return self.latest


class LiveSource(Source):
    """Frames of a running emulation (see the module docstring)."""
    mode = "live"

    def __init__(self, emu: Any, lay: Mapping[str, Any] | None = None, *, period_s: float = 0.5,
                 metrics_url: str | None = None):
        super().__init__(lay or view.layout(emu.graph))
        if self.ix is None:
            raise UserError("the live view draws every link; this fabric is too large for it (replay a model run)")
        self.emu = emu
        self.period_s = period_s
        self.metrics_url = metrics_url
        self.tail = TelemetryTail(getattr(getattr(emu, "controller", None), "telemetry_file", None))
        self.t0_wall = time.time()
        self.t0 = time.monotonic()
        self.failures = view.Failures()
        self.records: list[dict[str, Any]] = []       # the page's injections, as timeline records
        self.events: deque[dict[str, Any]] = deque(maxlen=12)
        self.collective: dict[str, Any] = {}
        self.controller: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.frames_made = 0
        self.cpu_s = 0.0                                # CPU seconds of the frame loop (its thread)
        self.error: str | None = None                   # the last error of the frame loop
        self._undo = observe_faults(emu.faults, self.on_fault) if hasattr(emu, "faults") else (lambda: None)
        self._thread = threading.Thread(target=self._loop, daemon=True, name="hpnlab-web-live")
        self._slow_thread = threading.Thread(target=self._slow_loop, daemon=True, name="hpnlab-web-controller")

    # -- inputs -----------------------------------------------------------------------------
    def on_fault(self, rec: dict[str, Any]) -> None:
        with self._lock:
            view.fold_events(self.ix, [rec], self.failures)  # type: ignore[arg-type]
            t = rec["wall"] - self.t0_wall
            self.events.append(view._event_line({**rec, "t": round(t, 3)}))

    def log(self, line: str) -> None:
        with self._lock:
            self.events.append({"t": round(time.monotonic() - self.t0, 3), "text": line, "source": "log"})

    def progress(self, done: int, total: int, label: str) -> None:
        """``experiment.run``'s progress callback: sizes done of the running collective."""
        with self._lock:
            self.collective = {"label": label, "done": done, "of": total,
                               "elapsed_s": round(time.monotonic() - self.t0, 1)}

    # -- injection ----------------------------------------------------------------------------
    def inject(self, request: Mapping[str, Any]) -> list[dict[str, Any]]:
        req = dict(request)
        if req.get("action") == "repair":
            target = [req["switch"]] if req.get("switch") else list(req.get("link") or [])
            if not target:
                raise UserError("repair needs a 'link' or a 'switch'")
            with self._lock:
                items = view.repair_events(self.ix, self.failures, target, req.get("key"))  # type: ignore[arg-type]
            if not items:
                return []
        else:
            items = [{k: v for k, v in req.items() if k in ("action", "link", "switch", "key", "side")}]
        events = tl.parse([{**it, "at": 0.0} for it in items], self.emu.graph, source="web injection")
        out = []
        for ev in events:
            start_wall = time.time()
            tl.apply(self.emu.faults, ev)
            wall = time.time()
            at = round(start_wall - self.t0_wall, 6)
            rec = {"at": at, "action": ev.action, "target": list(ev.target), "key": ev.key, "side": ev.side,
                   "applied_s": round(wall - self.t0_wall, 6), "late_ms": round((wall - start_wall) * 1000, 3),
                   "wall": wall, "start_wall": start_wall, "source": "web"}
            self.records.append(rec)
            out.append(rec)
        return out

    # -- the loop -----------------------------------------------------------------------------
    def _slow(self) -> None:
        """The controller's metrics and connected switches (once a second)."""
        state: dict[str, Any] = {}
        if self.metrics_url:
            try:
                with urllib.request.urlopen(self.metrics_url, timeout=0.5) as r:
                    state.update(view.controller_state(r.read().decode()))
            except (OSError, ValueError):
                state["metrics"] = "unreachable"
        if hasattr(self.emu, "connected_switches"):
            try:
                conn = self.emu.connected_switches()
                state["connected"] = sum(1 for v in conn.values() if v)
                state["switches"] = len(conn)
            except Exception:          # ovsdb busy or gone at shutdown: keep the last state
                pass
        with self._lock:
            self.controller.update(state)

    def make_frame(self) -> dict[str, Any]:
        sample = self.tail.read()
        rows = sample["ports"] if sample else []
        pfc = getattr(self.emu, "pfc", None)
        held = pfc.paused() if pfc is not None else []
        with self._lock:
            loads = view.link_loads(self.ix, rows)  # type: ignore[arg-type]
            fr = view.frame(self.layout, time.monotonic() - self.t0, loads, self.failures,
                            collective=self.collective, controller=self.controller, events=list(self.events),
                            ix=self.ix, paused=view.paused_directions(self.ix, held))  # type: ignore[arg-type]
        fr["sample_t"] = sample["t"] - self.t0 if sample else None
        self.frames_made += 1
        return fr

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            cpu = time.thread_time()
            try:
                self.publish(self.make_frame())
            except Exception as exc:          # one bad reading must not end the view: say it, go on
                self.error = f"{type(exc).__name__}: {exc}"
            self.cpu_s += time.thread_time() - cpu
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))

    def _slow_loop(self) -> None:
        """The controller's state once a second, in its own thread: a slow ovsdb or metrics
        answer on a busy machine must not delay the frames."""
        while not self._stop.is_set():
            cpu = time.thread_time()
            try:
                self._slow()
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
            self.cpu_s += time.thread_time() - cpu
            self._stop.wait(1.0)

    def start(self) -> LiveSource:
        self._thread.start()
        self._slow_thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for th in (self._thread, self._slow_thread):
            if th.is_alive():
                th.join(timeout=6)
        self._undo()


class LiveWeb:
    """``--web``: a live source and its server around a running emulation (a context manager)."""

    def __init__(self, emu: Any, addr: str, port: int, *, allow_remote: bool = False,
                 metrics_port: int | None = None, say: Callable[[str], None] = print, period_s: float = 0.5):
        url = f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port else None
        self.source = LiveSource(emu, period_s=period_s, metrics_url=url)
        self.server = WebServer(self.source, addr, port, allow_remote=allow_remote, period_s=period_s)
        self.say = say

    def __enter__(self) -> LiveWeb:
        self.source.start()
        self.server.start()
        self.say(f"web view: {self.server.url}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        self.source.stop()

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.source.records
