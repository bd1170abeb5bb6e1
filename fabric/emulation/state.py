"""The machine-wide lock, the per-run state file, and the cleanup that reads it.

Everything an emulation creates on the machine is written into its state file
(``/run/hpnlab/runs/<run id>.json``) *before* it is created:

``bridges``      OVS bridges (each also carries ``external_ids:hpnlab-run=<run id>``)
``interfaces``   interfaces in the root network namespace (switch-side veths)
``pids``         processes: host/switch shells (their network namespaces die with them),
                 the controller (its own process group), traffic tools; each with its
                 start time so that a reused pid is never killed
``bpf_pins``     bpffs paths (pinned ECN program and maps)
``dirs``         run directories (logs, compiled objects)
``scheduling``   processes of the machine whose scheduling the run changed (ovs-vswitchd's main
                 thread on the userspace datapath), with the policy and nice value to restore
``send_buffers`` sockets of the machine whose send buffer the run raised (ovs-vswitchd's packet
                 socket on the userspace datapath, :mod:`.datapath_socket`): pid, start time,
                 descriptor, inode and the size to restore while that process still holds it
``notes``        among others ``ftrace_instances`` (tracefs instances the failover probe makes to
                 see ovs-vswitchd's failed sends) and ``tracefs_mounted`` (where the run mounted
                 tracefs because nothing had)
``remote``       per cluster server: the ssh command that reaches it, the bridges and the
                 interfaces the run makes there (``hpnlab.fabric.emulation.remote`` cleans them)

Every child process also inherits ``HPNLAB_RUN=<run id>`` in its environment, so a
process started in the instant between creation and recording is still found.

``clean()`` removes exactly what the state files of dead runs list (or every run with
``force``), plus any OVS bridge marked ``hpnlab-run`` whose run is not alive. It never
touches anything else: other OVS bridges, other interfaces and other processes survive.
"""
from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from . import ovs_sched, ovsdb

__all__ = ["ENV_MARK", "Lock", "RunState", "all_runs", "clean", "marked_pids", "pid_alive", "teardown"]

RUN_DIR = Path(os.environ.get("HPNLAB_RUN_DIR", "/run/hpnlab"))
ENV_MARK = "HPNLAB_RUN"


def runs_dir() -> Path:
    return RUN_DIR / "runs"


def _pid_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3 = state first), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may contain spaces: fields after the last ')'
    return stat.rsplit(")", 1)[1].split()


def _pid_start(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), or None when it does not exist."""
    fields = _pid_stat(pid)
    return int(fields[19]) if fields else None


def pid_alive(pid: int, start: int | None = None) -> bool:
    """The process exists, is not a zombie, and (if given) started at ``start``."""
    fields = _pid_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        if fields is not None:
            try:  # our own child: reap it
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        return False
    return start is None or int(fields[19]) == start


# ---- the lock ---------------------------------------------------------------

class Lock:
    """One emulation per machine: an exclusive flock on ``/run/hpnlab/lock``."""

    def __init__(self, path: Path | None = None):
        self.path = path or RUN_DIR / "lock"
        self._fd: int | None = None

    def acquire(self, what: str, wait_s: float = 0.0) -> None:
        """Take the lock; wait up to ``wait_s`` for another run to finish, else one-line UserError."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
            if time.monotonic() >= deadline:
                try:
                    holder = Path(self.path).read_text().strip()
                except OSError:
                    holder = ""
                os.close(fd)
                raise UserError(f"another emulation is running ({holder or 'holder unknown'}); "
                                f"wait for it to finish or stop it")
            time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, {what}, since {_now()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


# ---- the state file -------------------------------------------------------------

@dataclass
class RunState:
    run_id: str
    owner_pid: int
    owner_start: int | None
    scenario: str
    started: str = field(default_factory=_now)
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    pids: list[dict[str, Any]] = field(default_factory=list)
    bpf_pins: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    empty_dirs: list[str] = field(default_factory=list)
    scheduling: list[dict[str, Any]] = field(default_factory=list)
    send_buffers: list[dict[str, Any]] = field(default_factory=list)
    remote: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def new(cls, scenario: str) -> RunState:
        run_id = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        state = cls(run_id=run_id, owner_pid=os.getpid(), owner_start=_pid_start(os.getpid()),
                    scenario=scenario)
        state.save()
        return state

    @property
    def path(self) -> Path:
        return runs_dir() / f"{self.run_id}.json"

    @property
    def run_dir(self) -> Path:
        return RUN_DIR / self.run_id

    def save(self) -> None:
        runs_dir().mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=1))
        os.replace(tmp, self.path)

    # recording: always called before the thing is created
    def add_bridges(self, names) -> None:
        self.bridges.extend(n for n in names if n not in self.bridges)
        self.save()

    def add_interfaces(self, names) -> None:
        known = set(self.interfaces)
        self.interfaces.extend(n for n in names if n not in known)
        self.save()

    def add_pid(self, pid: int, what: str, group: bool = False, hard: bool = False) -> None:
        """Record a process. ``group``: it leads its own process group (kill the group);
        ``hard``: end it with SIGKILL at once (shells)."""
        self.pids.append({"pid": pid, "start": _pid_start(pid), "what": what, "group": group, "hard": hard})
        self.save()

    def add_bpf_pin(self, path: str) -> None:
        if path not in self.bpf_pins:
            self.bpf_pins.append(path)
            self.save()

    def add_dir(self, path: str) -> None:
        if path not in self.dirs:
            self.dirs.append(path)
            self.save()

    def add_empty_dir(self, path: str) -> None:
        """A directory we create that others might fill: removed only while it is empty."""
        if path not in self.empty_dirs:
            self.empty_dirs.append(path)
            self.save()

    def add_scheduling(self, pid: int, policy: int, priority: int, nice: int | None = None) -> None:
        """Record a thread's scheduling policy and nice value before the run changes them (restored
        at teardown)."""
        self.scheduling.append({"pid": pid, "start": _pid_start(pid), "policy": policy, "priority": priority,
                                "nice": nice})
        self.save()

    def add_send_buffer(self, pid: int, fd: int, inode: str, size: int) -> None:
        """Record a socket's send buffer (descriptor ``fd`` of process ``pid``, ``inode``) before the run
        raises it (restored at teardown while the same process holds the same socket)."""
        self.send_buffers.append({"pid": pid, "start": _pid_start(pid), "fd": fd, "inode": inode, "size": size})
        self.save()

    def add_remote(self, server: str, ssh: list[str], bridges: list[str], interfaces: list[str]) -> None:
        """Record a cluster server before the run makes anything there (``remote.teardown`` reads it)."""
        self.remote[server] = {"ssh": list(ssh), "bridges": list(bridges), "interfaces": list(interfaces)}
        self.save()

    def owner_alive(self) -> bool:
        return pid_alive(self.owner_pid, self.owner_start)

    @classmethod
    def load(cls, path: Path) -> RunState:
        data = json.loads(path.read_text())
        data.setdefault("empty_dirs", [])
        data.setdefault("remote", {})
        data.setdefault("send_buffers", [])
        return cls(**data)


def all_runs() -> list[RunState]:
    out = []
    d = runs_dir()
    if d.is_dir():
        for p in sorted(d.glob("*.json")):
            try:
                out.append(RunState.load(p))
            except (OSError, ValueError, TypeError):
                continue
    return out


# ---- cleanup -------------------------------------------------------------------------

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
                         start_of: Callable[[int], int | None] = _pid_start,
                         link_of: Callable[[int, int], str | None] | None = None,
                         restore: Callable[[int, int, int], None] | None = None) -> int:
    """Put back the send buffers a run raised (``RunState.send_buffers``), each only while its
    process (pid and start time) still holds the same socket (descriptor and inode): a restarted
    ovs-vswitchd has new sockets of its own size, and a reused descriptor is another socket.
    Returns how many were put back."""
    from . import datapath_socket as ds
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
    victims += [(pid, _pid_start(pid), False) for pid in marked_pids({state.run_id})
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
        from .remote import teardown as remote_teardown
        for kind, n in remote_teardown(state, log).items():
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
        from . import send_trace
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
