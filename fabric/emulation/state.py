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

The cleanup that reads these records is :mod:`.cleanup` (``teardown`` of one run, ``clean``
of every dead one).
"""
from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError

__all__ = ["ENV_MARK", "RUN_DIR", "Lock", "RunState", "all_runs", "pid_alive"]

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


def pid_start(pid: int) -> int | None:
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

_SAVE_LOCK = threading.RLock()

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
        state = cls(run_id=run_id, owner_pid=os.getpid(), owner_start=pid_start(os.getpid()),
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
        """Write the state file atomically. A harness records from several threads at once
        (a test's traffic in a thread starts processes while the main thread starts others),
        so the writes are serialised and each writer has its own temporary file."""
        with _SAVE_LOCK:
            runs_dir().mkdir(parents=True, exist_ok=True)
            tmp = self.path.parent / f"{self.run_id}.{os.getpid()}-{threading.get_ident()}.tmp"
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
        self.pids.append({"pid": pid, "start": pid_start(pid), "what": what, "group": group, "hard": hard})
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
        self.scheduling.append({"pid": pid, "start": pid_start(pid), "policy": policy, "priority": priority,
                                "nice": nice})
        self.save()

    def add_send_buffer(self, pid: int, fd: int, inode: str, size: int) -> None:
        """Record a socket's send buffer (descriptor ``fd`` of process ``pid``, ``inode``) before the run
        raises it (restored at teardown while the same process holds the same socket)."""
        self.send_buffers.append({"pid": pid, "start": pid_start(pid), "fd": fd, "inode": inode, "size": size})
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
