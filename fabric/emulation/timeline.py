"""Failure timeline: link and switch down/up events at given times, each applied time logged.

File format (YAML or JSON)::

    # seconds after the timeline starts
    events:
      - {at: 1.0, action: link_down, link: [p0l0, p0s0]}      # every parallel link between them
      - {at: 1.0, action: link_down, link: p1l2-p1s1, key: 0} # one of the parallel links
      - {at: 2.5, action: link_up,   link: [p0l0, p0s0]}
      - {at: 3.0, action: switch_down, switch: p1s0}          # all its links go down
      - {at: 4.0, action: switch_up,   switch: p1s0}
      - {at: 5.0, action: link_down_one_side, link: [p0l0, p0s0], side: p0l0}  # one end
      - {at: 5.5, action: link_up,   link: [p0l0, p0s0]}
      - {at: 6.0, action: link_drop, link: [p0l0, p0s0], side: p0l0}  # gray: p0l0 -> p0s0 drops all
      - {at: 7.0, action: link_restore, link: [p0l0, p0s0], side: p0l0}
      - {at: 8.0, action: controller_kill}      # the controller process dies (SIGKILL)
      - {at: 9.0, action: controller_restart}   # started again; returns once every switch is back
      - {at: 7.8, action: controller_freeze}     # the controller stops (SIGSTOP): only the switches act
      - {at: 9.0, action: controller_thaw}       # it continues and handles what it missed

A bare list of events is accepted too. ``load()`` validates everything against the
fabric graph first (unknown action, node or link, negative or unsorted time: one line).

A link goes down by setting both of its interfaces administratively down (the peers see
carrier loss, OVS sends PortStatus to the controller); a switch goes down by doing that to
every link of it. ``link_down_one_side`` sets only ``side``'s interface down (with veth the
peer loses carrier too: see ``faults``); ``link_drop`` is a gray failure: the link stays up
and everything ``side`` sends on it is dropped (a tc egress drop filter) until
``link_restore``; only BFD notices it. ``side`` defaults to the first node of ``link``. ``controller_kill`` ends the
controller process as a crash would; what the run does then is its ``on_controller_loss``
(restart it, stop, or continue); ``controller_restart`` starts it again.
``controller_freeze`` stops the controller process (SIGSTOP to its process group) until
``controller_thaw``: what the switches do alone (local protection without the controller's
update); a timeline that ends frozen thaws it when it ends.

``run()`` sleeps on the monotonic clock until each event's time, applies it, and records
the offset at which the change was in place (``applied_s``), its wall clock time (``wall``;
``start_wall`` when applying it began) and the difference to the schedule (``late_ms``,
logged). ``TOLERANCE_S`` is the
stated accuracy: an event is in place within that time of its schedule (checked by the
tests with an independent sampler of the interface state).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import UserError

ACTIONS = ("link_down", "link_up", "switch_down", "switch_up", "link_down_one_side", "link_drop", "link_restore",
           "controller_kill", "controller_restart", "controller_freeze", "controller_thaw")
#: actions that pause the controller process (no link or switch)
CONTROLLER_ACTIONS = ("controller_freeze", "controller_thaw")
#: actions that act on one end of a link (``side``)
SIDED = ("link_down_one_side", "link_drop", "link_restore")
#: an event is in place within this many seconds of its scheduled time
TOLERANCE_S = 0.05


@dataclass(frozen=True)
class Event:
    at: float
    action: str
    target: tuple[str, ...]
    key: int | None = None
    side: str | None = None

    def describe(self) -> str:
        what = "-".join(self.target) + (f"#{self.key}" if self.key is not None else "")
        return f"{self.action} {what}" + (f" (side {self.side})" if self.side else "")


def parse(data: Any, graph, source: str = "timeline") -> list[Event]:
    if isinstance(data, dict):
        unknown = set(data) - {"events"}
        if unknown:
            raise UserError(f"{source}: unknown field {sorted(unknown)[0]!r} (expected 'events')")
        data = data.get("events")
    if not isinstance(data, list) or not data:
        raise UserError(f"{source}: expected a non-empty list of events")
    events = []
    for i, item in enumerate(data):
        where = f"{source}: event {i + 1}"
        if not isinstance(item, dict):
            raise UserError(f"{where}: must be a mapping like {{at: 1.0, action: link_down, link: [a, b]}}")
        extra = set(item) - {"at", "action", "link", "switch", "key", "side"}
        if extra:
            raise UserError(f"{where}: unknown field {sorted(extra)[0]!r}")
        at = item.get("at")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or at < 0:
            raise UserError(f"{where}: 'at' must be a time in seconds >= 0, got {at!r}")
        action = item.get("action")
        if action not in ACTIONS:
            raise UserError(f"{where}: action must be one of {', '.join(ACTIONS)}, got {action!r}")
        key = item.get("key")
        if action in CONTROLLER_ACTIONS:
            extra = set(item) - {"at", "action"}
            if extra:
                raise UserError(f"{where}: {action} takes no {sorted(extra)[0]!r}")
            events.append(Event(float(at), action, ()))
            continue
        if action.startswith("link"):
            link = item.get("link")
            if isinstance(link, str):
                link = link.split("-")
            if not isinstance(link, list) or len(link) != 2:
                raise UserError(f"{where}: 'link' must name two nodes, like [p0l0, p0s0] or p0l0-p0s0")
            u, v = (str(x) for x in link)
            data_uv = graph.get_edge_data(u, v)
            if not data_uv:
                raise UserError(f"{where}: there is no link between {u} and {v}")
            if key is not None and key not in data_uv:
                raise UserError(f"{where}: link {u}-{v} has no parallel link {key} (has {sorted(data_uv)})")
            target: tuple[str, ...] = (u, v)
            side = item.get("side")
            if side is not None and action not in SIDED and action != "link_up":
                raise UserError(f"{where}: 'side' applies to {', '.join(SIDED)} and link_up, not {action}")
            if side is not None and str(side) not in (u, v):
                raise UserError(f"{where}: 'side' must be {u} or {v}, got {side!r}")
            if action in SIDED:
                side = u if side is None else str(side)
        elif action.startswith("controller"):
            extra = set(item) & {"link", "switch", "key", "side"}
            if extra:
                raise UserError(f"{where}: {action} takes no {sorted(extra)[0]!r}")
            target, side = ("controller",), None
        else:
            if "side" in item:
                raise UserError(f"{where}: 'side' applies to link actions only")
            side = None
            sw = item.get("switch")
            if sw not in graph or graph.nodes[sw]["tier"] == 0:
                raise UserError(f"{where}: 'switch' must name a switch of the fabric, got {sw!r}")
            target = (str(sw),)
        events.append(Event(float(at), action, target, key, side))
    return sorted(events, key=lambda e: e.at)


def load(path_or_data: str | Path | list | dict, graph) -> list[Event]:
    """Events from a file, from parsed data, or (already loaded) a list of Events as is."""
    if isinstance(path_or_data, list) and path_or_data and all(isinstance(e, Event) for e in path_or_data):
        return list(path_or_data)
    if isinstance(path_or_data, (list, dict)):
        return parse(path_or_data, graph)
    path = Path(path_or_data)
    if not path.is_file():
        raise UserError(f"timeline file not found: {path}")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        raise UserError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}") from None
    return parse(data, graph, str(path))


def apply(faults, event: Event) -> None:
    """Apply one event through a fault API (``faults.Faults``, or anything with its methods)."""
    if event.action in ("link_down", "link_down_one_side"):
        faults.link_down(*event.target, key=event.key, side=event.side)
    elif event.action == "link_up":
        faults.link_up(*event.target, key=event.key, side=event.side)
    elif event.action == "link_drop":
        faults.link_drop(*event.target, key=event.key, side=event.side)
    elif event.action == "link_restore":
        faults.link_restore(*event.target, key=event.key, side=event.side)
    elif event.action == "switch_down":
        faults.switch_down(event.target[0])
    elif event.action == "controller_kill":
        faults.kill_controller()
    elif event.action == "controller_restart":
        faults.restart_controller()
    elif event.action in CONTROLLER_ACTIONS:
        signal_controller(faults, signal.SIGSTOP if event.action == "controller_freeze" else signal.SIGCONT)
    else:
        faults.switch_up(event.target[0])


def signal_controller(faults, sig: int) -> None:
    """Stop or continue the run's controller process (its process group); nothing without one."""
    send = getattr(faults, "signal_controller", None)
    if send is not None:
        send(sig)


def run(faults, timeline, log: Callable[[str], None] = lambda m: None,
        stop: threading.Event | None = None) -> list[dict[str, Any]]:
    """Apply the events at their times through a fault API (``faults.Faults``: an emulation's
    ``faults``), blocking. Returns one record per event."""
    events = load(timeline, faults.graph)
    if hasattr(faults, "netlink"):
        faults.netlink()          # open the netlink socket now, not at the first event
    restore = _realtime()
    try:
        return _run(faults, events, log, stop)
    finally:
        restore()
        if any(e.action == "controller_freeze" for e in events):
            signal_controller(faults, signal.SIGCONT)      # never leave it frozen


def _realtime():
    """Run this thread with SCHED_FIFO while the timeline runs (root only), so that a busy
    machine does not delay events by its scheduling latency. Returns the undo function."""
    try:
        old_policy = os.sched_getscheduler(0)
        old_param = os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (OSError, AttributeError):
        return lambda: None

    def undo():
        try:
            os.sched_setscheduler(0, old_policy, old_param)
        except OSError:
            pass
    return undo


def _run(faults, events, log, stop) -> list[dict[str, Any]]:
    t0 = time.monotonic()
    wall0 = time.time()
    records: list[dict[str, Any]] = []
    for ev in events:
        while True:
            left = ev.at - (time.monotonic() - t0)
            if left <= 0:
                break
            if stop is not None and stop.wait(min(left, 0.5)):
                return records
            elif stop is None:
                time.sleep(min(left, 0.5) if left > 0.002 else left)
        started = time.monotonic() - t0
        apply(faults, ev)
        applied = time.monotonic() - t0
        rec = {"at": ev.at, "action": ev.action, "target": list(ev.target), "key": ev.key, "side": ev.side,
               "applied_s": round(applied, 6), "late_ms": round((applied - ev.at) * 1000, 3),
               "wall": wall0 + applied, "start_wall": wall0 + started}
        records.append(rec)
        log(f"t=+{applied:.3f}s {ev.describe()} (scheduled +{ev.at:.3f}s, {rec['late_ms']:+.1f} ms)")
    return records


class Runner:
    """Run a timeline in a background thread: ``r = Runner(emu.faults, tl).start(); ...; r.join()``."""

    def __init__(self, faults, timeline, log: Callable[[str], None] = lambda m: None):
        self.faults = faults
        self.events = load(timeline, faults.graph)
        self.log = log
        self.records: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hpnlab-timeline")

    def _run(self) -> None:
        try:
            self.records = run(self.faults, self.events, self.log, self._stop)
        except BaseException as exc:
            self.error = exc

    def start(self) -> Runner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> list[dict[str, Any]]:
        self._thread.join(timeout)
        if self.error:
            raise self.error
        return self.records

    @property
    def duration(self) -> float:
        return self.events[-1].at if self.events else 0.0
