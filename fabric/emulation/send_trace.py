"""When a switch's datapath stopped sending into a dead port: ovs-vswitchd's failed sends.

On the userspace datapath a packet output to a port that is administratively down fails in
the send system call with ENETDOWN (AF_PACKET ports; ``netdev_linux`` logs "error sending
Ethernet packet ... Network is down", rate-limited). The last such failure after a fault is
the moment the megaflows stopped pointing at the port: between the port's liveness changing
(its PortStatus) and the first packet delivered over the backup, it separates Open vSwitch's
own reaction (the revalidation of its cached flows) from the rest of the path.

They are read from the kernel's syscall exit tracepoints (``sendmmsg``, ``sendto``,
``sendmsg`` with a negative return) through an ftrace instance of the run's own
(``/sys/kernel/tracing/instances/hpnlab-<run>``), limited to ovs-vswitchd's threads and
stamped with CLOCK_TAI, so nothing of the machine's own tracing set-up is touched; the
instance is removed at the end. Where tracefs or the syscall tracepoints are missing,
:func:`unavailable` says why and the stage is left out.

:class:`Scheduling` uses the same kind of instance for ``sched_switch``: when each of
ovs-vswitchd's threads ran (the second repetition of ``tools/probes/ovs_reaction.py``).

A failure that drops silently is not seen here: a gray failure (a tc drop filter) or a
carrier-less peer (a veth whose other end is down still accepts packets and drops them).
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from . import ovs_sched

TRACEFS = Path("/sys/kernel/tracing")
EVENTS = ("sys_exit_sendmmsg", "sys_exit_sendto", "sys_exit_sendmsg")
ENETDOWN = 100
_T = TypeVar("_T", bound="Trace")
_LINE = re.compile(r"^\s*.+-(\d+)\s+\[\d+\]\s+\S+\s+(\d+\.\d+): sys_(\w+) -> (0x[0-9a-f]+|-?\d+)")


def parse(text: str, tai_offset_s: float, errno: int = ENETDOWN) -> list[float]:
    """Wall-clock times (s) of failed sends with ``errno`` in an ftrace ``trace`` text of the
    syscall exit events (CLOCK_TAI stamps; ``tai_offset_s`` = CLOCK_TAI - CLOCK_REALTIME)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        ret = int(m.group(4), 0)
        if ret >= 1 << 63:
            ret -= 1 << 64
        if ret == -errno:
            out.append(float(m.group(2)) - tai_offset_s)
    return out


#: failed sends further apart than this end the datapath's burst into the dead port: it sends
#: there at the flows' packet rate (every 0.25-1 ms in the probe) until its cached flows move,
#: while BFD's own control packets, sent into the dead port by ovs-vswitchd too, come every
#: interval (50 ms and more, then 1 s once the session is down)
BURST_JOIN_S = 0.02


def window(times: Iterable[float], start: float, end: float, join_s: float = BURST_JOIN_S) -> dict[str, Any]:
    """The failed sends between ``start`` and ``end`` (wall seconds): how many, the first, and
    the last of their first burst (each within ``join_s`` of the one before), ms after
    ``start``; the sends after that burst are counted apart (``dead_port_sends_later``). Before
    2026-12-05 the last failed send of all was taken: with BFD on, the session's own packets
    into the dead port put the stage at 170-950 ms after the fault."""
    ts = sorted(t for t in times if start <= t < end)
    burst = ts[:1]
    for t in ts[1:]:
        if t - burst[-1] > join_s:
            break
        burst.append(t)
    return {"dead_port_sends": len(burst), "dead_port_sends_later": len(ts) - len(burst),
            "dead_port_first_ms": round((ts[0] - start) * 1000, 3) if ts else None,
            "dead_port_last_ms": round((burst[-1] - start) * 1000, 3) if ts else None}


def unavailable(root: Path = TRACEFS) -> str | None:
    """Why failed sends cannot be traced here, or None."""
    if not (root / "instances").is_dir():
        return f"no tracefs at {root}"
    if not all((root / "events" / "syscalls" / ev).is_dir() for ev in EVENTS):
        return "no syscall tracepoints (CONFIG_FTRACE_SYSCALLS)"
    return None


def _ensure_tracefs(root: Path) -> bool:
    """Mount tracefs where the kernel has it but nothing mounted it; True when this mounted it."""
    if (root / "instances").is_dir() or not root.is_dir():
        return False
    r = subprocess.run(["mount", "-t", "tracefs", "nodev", str(root)], capture_output=True, text=True)
    return r.returncode == 0 and (root / "instances").is_dir()


def running_ovs_pid() -> int | None:
    """ovs-vswitchd's pid from its pid file (:func:`.ovs_sched.ovs_pid`), or None when it is not
    running."""
    try:
        pid = ovs_sched.ovs_pid()
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").is_dir() else None


class Trace:
    """An ftrace instance of the run's own on ovs-vswitchd's threads, between :meth:`begin`
    and :meth:`end` (root); :meth:`configure` says which events."""

    def __init__(self, name: str, pid: int | None = None, root: Path = TRACEFS, state=None) -> None:
        self.name = f"hpnlab-{name}"
        self.pid = pid
        self.root = root
        self.state = state            # the run's state: what this makes is listed there first
        self.mounted = False
        self.inst: Path | None = None
        self.offset = 0.0
        self.text = ""
        self.reason: str | None = None
        self.tids: dict[str, str] = {}
        self.overrun = 0             # events the ring buffer overwrote (lost)

    def _note(self, key: str, value: str, present: bool) -> None:
        if self.state is None:
            return
        listed = self.state.notes.setdefault(key, [])
        if present and value not in listed:
            listed.append(value)
        elif not present and value in listed:
            listed.remove(value)
        self.state.save()

    def configure(self, inst: Path, tids: list[str]) -> None:
        raise NotImplementedError

    def begin(self: _T) -> _T:
        needs_mount = not (self.root / "instances").is_dir()
        if needs_mount:
            self._note("tracefs_mounted", str(self.root), True)
        self.mounted = _ensure_tracefs(self.root)
        if needs_mount and not self.mounted:
            self._note("tracefs_mounted", str(self.root), False)
        self.reason = self.missing()
        pid = self.pid or running_ovs_pid()
        if self.reason is None and pid is None:
            self.reason = "ovs-vswitchd is not running"
        if self.reason is not None:
            return self
        inst = self.root / "instances" / self.name
        self._note("ftrace_instances", str(inst), True)
        try:
            inst.mkdir(exist_ok=True)
            self.inst = inst
            self.tids = {t: Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
                         for t in os.listdir(f"/proc/{pid}/task")}
            (inst / "trace_clock").write_text("tai")
            self.configure(inst, list(self.tids))
            self.offset = time.clock_gettime(time.CLOCK_TAI) - time.time()
            (inst / "tracing_on").write_text("1")
        except OSError as e:
            self.reason = f"ftrace instance: {e.strerror or e}"
            if self.inst is None:
                self._note("ftrace_instances", str(inst), False)
            self.end()
        return self

    def end(self) -> None:
        if self.inst is not None:
            try:
                (self.inst / "tracing_on").write_text("0")
                self.text = (self.inst / "trace").read_text(errors="replace")
                self.overrun = sum(int(m) for f in (self.inst / "per_cpu").glob("cpu*/stats")
                                   for m in re.findall(r"^overrun: (\d+)", f.read_text(), re.M))
            except OSError:
                pass
            remove(self.inst)
            self._note("ftrace_instances", str(self.inst), False)
            self.inst = None
        if self.mounted:
            subprocess.run(["umount", str(self.root)], capture_output=True)
            self._note("tracefs_mounted", str(self.root), False)
            self.mounted = False

    def missing(self) -> str | None:
        return None if (self.root / "instances").is_dir() else f"no tracefs at {self.root}"


class FailedSends(Trace):
    """ovs-vswitchd's failed sends (syscall exit tracepoints with a negative return)."""

    def missing(self) -> str | None:
        return unavailable(self.root)

    def configure(self, inst: Path, tids: list[str]) -> None:
        (inst / "set_event_pid").write_text(" ".join(tids))
        for ev in EVENTS:
            (inst / "events" / "syscalls" / ev / "filter").write_text("ret < 0")
            (inst / "events" / "syscalls" / ev / "enable").write_text("1")

    def times(self) -> list[float]:
        return parse(self.text, self.offset)


class Scheduling(Trace):
    """When each of ovs-vswitchd's threads ran (``sched_switch`` into and out of them)."""

    def configure(self, inst: Path, tids: list[str]) -> None:
        (inst / "buffer_size_kb").write_text("65536")      # per CPU: a few seconds of a busy datapath
        ev = inst / "events" / "sched" / "sched_switch"
        ev.joinpath("filter").write_text(" || ".join(f"prev_pid == {t} || next_pid == {t}" for t in tids))
        ev.joinpath("enable").write_text("1")

    def runs(self) -> dict[str, list[tuple[float, float, str]]]:
        return on_cpu(self.text, self.offset, self.tids)


_SWITCH = re.compile(r"\s(\d+\.\d+): sched_switch: .*prev_pid=(\d+) .*prev_state=(\S+) ==> .*next_pid=(\d+) ")


def on_cpu(text: str, tai_offset_s: float, tids: dict[str, str]) -> dict[str, list[tuple[float, float, str]]]:
    """Per thread, named "name/tid" (``tids``: tid -> name), the wall-clock intervals it ran
    and the state it left the CPU in (``R`` preempted, ``S`` asleep, ``D`` waiting in the
    kernel), from a ``sched_switch`` trace (pure); a thread already running when the trace began starts
    at the trace's first switch, and a switch out without the switch in before it (an event
    the buffer lost) is left out."""
    runs: dict[str, list[tuple[float, float, str]]] = {}
    start: dict[str, float] = {}
    first: float | None = None
    for line in text.splitlines():
        m = _SWITCH.search(line)
        if not m:
            continue
        t = float(m.group(1)) - tai_offset_s
        first = t if first is None else first
        prev, nxt = m.group(2), m.group(4)
        if prev in tids:
            name = f"{tids[prev]}/{prev}"
            state = m.group(3).rstrip("+")
            if prev in start:
                runs.setdefault(name, []).append((start.pop(prev), t, state))
            elif name not in runs:                 # running since before the trace
                runs[name] = [(first, t, state)]
        if nxt in tids:
            start[nxt] = t
    return runs


def remove(inst: Path) -> None:
    """Remove an ftrace instance (its events are switched off with it)."""
    try:
        inst.rmdir()
    except OSError:
        pass


def teardown(notes: dict[str, Any]) -> int:
    """Remove the ftrace instances a run's state lists, and unmount tracefs where the run
    mounted it (a run that died while tracing); returns how many instances were removed."""
    n = 0
    for inst in notes.get("ftrace_instances", []):
        if Path(inst).is_dir():
            remove(Path(inst))
            n += 1
    for root in notes.get("tracefs_mounted", []):
        if not any((Path(root) / "instances").glob("*")):       # nobody else's instance in it
            subprocess.run(["umount", root], capture_output=True)
    return n
