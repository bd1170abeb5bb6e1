"""The cleanup that reads the run state files (:mod:`.state`): ``teardown`` removes what one
run made, ``clean`` every run whose process is gone (or every run with ``force``).

``clean()`` removes exactly what the state files of dead runs list, plus any OVS bridge marked
``hpnlab-run`` whose run is not alive. It never touches anything else: other OVS bridges, other
interfaces and other processes survive. Processes end by pid (and start time), never by name.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import datapath_socket as ds
from . import ovs_sched, ovsdb, remote, send_trace
from .state import ENV_MARK, RunState, all_runs, pid_alive, pid_start

__all__ = ["clean", "marked_pids", "restore_send_buffers", "teardown"]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def marked_pids(run_ids: set[str]) -> list[int]:
    """Processes whose environment carries HPNLAB_RUN=<one of run_ids> (never us or our parents)."""
    wanted = {f"{ENV_MARK}={r}".encode() for r in run_ids}
    skip = _ancestors()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid in skip:
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if any(var in wanted for var in env.split(b"\0")):
            out.append(pid)
    return out


def _kill(pid: int, start: int | None, group: bool, sig: int) -> bool:
    if not pid_alive(pid, start):
        return False
    try:
        if group:
            try:
                os.killpg(pid, sig)  # a group we created: its leader's pid is its id
            except ProcessLookupError:
                os.kill(pid, sig)
        else:
            os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def restore_send_buffers(entries: list[dict[str, Any]], log: Callable[[str], None] = lambda s: None, *,
                         start_of: Callable[[int], int | None] = pid_start,
                         link_of: Callable[[int, int], str | None] | None = None,
                         restore: Callable[[int, int, int], None] | None = None) -> int:
    """Put back the send buffers a run raised (``RunState.send_buffers``), each only while its
    process (pid and start time) still holds the same socket (descriptor and inode): a restarted
    ovs-vswitchd has new sockets of its own size, and a reused descriptor is another socket.
    Returns how many were put back."""
    link_of = link_of or ds.fd_link
    restore = restore or ds.restore_send_buffer
    done = 0
    for entry in entries:
        pid, fd = entry["pid"], entry["fd"]
        if ds.same_socket(entry, start_of(pid), link_of(pid, fd)):
            restore(pid, fd, entry["size"])
            done += 1
        else:
            log(f"send buffer of pid {pid} fd {fd} not restored: the process or the socket is not the one recorded")
    return done


def teardown(state: RunState, log: Callable[[str], None] = lambda s: None) -> dict[str, int]:
    """Remove everything one run's state lists. Returns counts of what was removed."""
    removed = {"processes": 0, "bridges": 0, "interfaces": 0, "bpf_pins": 0, "dirs": 0}
    # 0. scheduling policies and nice values the run changed on processes it did not create: put them back
    for entry in state.scheduling:
        if pid_alive(entry["pid"], entry.get("start")):
            try:
                ovs_sched.restore(entry["pid"], entry["policy"], entry["priority"], entry.get("nice"))
            except OSError as exc:
                log(f"could not restore the scheduling policy of pid {entry['pid']}: {exc}")
    removed["send_buffers"] = restore_send_buffers(state.send_buffers, log)    # put back, in fact
    skip = _ancestors()
    # 1. processes: recorded ones (by pid and start time), then any marked in the environment
    victims = [(p["pid"], p.get("start"), p.get("group", False)) for p in state.pids
               if p["pid"] not in skip]
    recorded = {v[0] for v in victims}
    victims += [(pid, pid_start(pid), False) for pid in marked_pids({state.run_id})
                if pid not in recorded]
    # shells and unrecorded marked processes get SIGKILL at once (an interactive bash
    # ignores SIGTERM); recorded programs (the controller, tools) get SIGTERM first
    hard = {p["pid"] for p in state.pids if p.get("hard")} | {v[0] for v in victims if v[0] not in recorded}
    for pid, start, group in victims:
        if _kill(pid, start, group, signal.SIGKILL if pid in hard else signal.SIGTERM):
            removed["processes"] += 1
    deadline = time.monotonic() + 2.0
    for pid, start, group in victims:
        while pid_alive(pid, start) and time.monotonic() < deadline:
            time.sleep(0.01)
        _kill(pid, start, group, signal.SIGKILL)
    for pid, start, _ in victims:
        while pid_alive(pid, start) and time.monotonic() < deadline + 2:
            time.sleep(0.01)
    # 1b. what the run made on other servers (processes, bridges, interfaces there)
    if state.remote:
        for kind, n in remote.teardown(state, log).items():
            removed[f"remote_{kind}"] = removed.get(f"remote_{kind}", 0) + n
    # 2. OVS bridges: those listed, and any marked with this run id
    marked = ovsdb.marked_bridges()
    bridges = [b for b in state.bridges if b not in marked or marked[b] == state.run_id]
    bridges += [b for b, run in marked.items() if run == state.run_id and b not in bridges]
    existing = ovsdb.bridges()
    doomed = [b for b in bridges if b in existing and marked.get(b) == state.run_id]
    if doomed:
        error = ovsdb.delete_bridges(doomed)
        if error:
            log(f"ovs-vsctl del-br failed: {error}")
        removed["bridges"] = len(doomed)
    ovsdb.destroy_qos([u for u, run in ovsdb.marked_qos().items() if run == state.run_id])
    # 3. root-namespace interfaces (veths): only the listed names that still exist
    present = {p.name for p in Path("/sys/class/net").iterdir()} if Path("/sys/class/net").is_dir() else set()
    gone = [i for i in state.interfaces + state.bridges if i in present]
    if gone:
        batch = "".join(f"link del dev {i}\n" for i in gone)
        _run(["ip", "-force", "-batch", "-"], input=batch)
        removed["interfaces"] = len(gone)
    # 4. pinned BPF objects (programs and maps are freed once unpinned and detached)
    for pin in state.bpf_pins:
        p = Path(pin)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            removed["bpf_pins"] += 1
        elif p.exists():
            p.unlink(missing_ok=True)
            removed["bpf_pins"] += 1
    # 5. run directories
    for d in state.dirs:
        if Path(d).is_dir():
            shutil.rmtree(d, ignore_errors=True)
            removed["dirs"] += 1
    for d in sorted(state.empty_dirs, key=len, reverse=True):  # deepest first
        try:
            os.rmdir(d)
            removed["dirs"] += 1
        except OSError:
            pass
    # 6. Open vSwitch's SSL settings (machine-wide) the run replaced for ``ssl:`` controllers: put back
    if "ovs_ssl" in state.notes:
        error = ovsdb.restore_ssl(state.notes["ovs_ssl"].get("previous"))
        if error:
            log(f"could not restore Open vSwitch's SSL settings: {error}")
    # 7. ftrace instances (the failover probe's trace of failed sends) and tracefs if the run mounted it
    if state.notes.get("ftrace_instances") or state.notes.get("tracefs_mounted"):
        removed["ftrace_instances"] = send_trace.teardown(state.notes)
    state.path.unlink(missing_ok=True)
    return removed


def clean(force: bool = False, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Tear down every run whose owner is dead (every run with ``force``).

    Returns a summary: runs cleaned, runs skipped (alive), counts removed.
    """
    summary: dict[str, Any] = {"runs": [], "alive": [], "removed": {}}
    live_ids = set()
    for state in all_runs():
        if state.owner_alive() and not force:
            summary["alive"].append({"run_id": state.run_id, "pid": state.owner_pid,
                                     "scenario": state.scenario})
            live_ids.add(state.run_id)
            continue
        counts = teardown(state, log)
        summary["runs"].append(state.run_id)
        for k, v in counts.items():
            summary["removed"][k] = summary["removed"].get(k, 0) + v
    # bridges marked by a run that has no state file and is not alive
    orphans = [b for b, run in ovsdb.marked_bridges().items() if run not in live_ids]
    if orphans:
        ovsdb.delete_bridges(orphans)
        summary["removed"]["bridges"] = summary["removed"].get("bridges", 0) + len(orphans)
    ovsdb.destroy_qos([u for u, run in ovsdb.marked_qos().items() if run not in live_ids])
    return summary
