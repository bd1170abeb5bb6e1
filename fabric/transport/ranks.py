"""Rank workers and the launcher that runs one worker process per rank and gathers results.

Worker (``python -m hpnlab.fabric.transport.ranks worker JOB_JSON``): one process per rank. It builds its
transport on its own addresses, proves every rank is there with a barrier *over the data
network*, then for every size runs warm-up and timed iterations of the collective's
schedule (``hpnlab.fabric.workload.collectives``): a barrier, the timer, every step's sends and receives
(``Transport.exchange``), the timer; with ``check`` it compares its result, element by
element, with the collective's definition. It writes JSON lines on stdout: ``ready``,
``progress`` and finally ``result`` (or ``error`` with a one-line message) and exits
0 (or 3). The job description travels on the command line; nothing goes through files. Ranks of
concurrent jobs are *held*: after ``ready`` each waits for one ``go`` line on its standard input,
which the launcher sends once every rank of every job is ready, so that the jobs' iterations
overlap (each job's own barrier let one job finish its iterations while the other's ranks were
still starting).

What a job is, its validation and where ranks sit on a fabric are pure and live in
``hpnlab.fabric.workload.placement``; merging the ranks' results into one is ``hpnlab.fabric.workload.report``.

Launcher (:func:`run_jobs`): starts every rank of every job through a *spawner*
(:class:`LocalSpawner` for addresses of this machine, :class:`SshSpawner` for a real
cluster, or the emulation's ``host.popen``), reads their lines, shows progress, and when
any rank fails (error line, non-zero exit, or silence beyond the timeout) stops every other
rank by pid and raises one ``UserError`` naming the rank. Nothing is left running.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hpnlab.fabric import transport as tmod
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.workload import collectives as col
from hpnlab.fabric.workload import report
from hpnlab.fabric.workload.jobs import Job, validate

# ---- worker ----------------------------------------------------------------------------

def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":"), default=report.jsonable) + "\n")
    sys.stdout.flush()


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_rank(job: Job, rank: int, emit: Callable[[dict], None] = _emit) -> dict:
    """Run one rank of ``job`` in this process; returns (and emits) its result."""

    opts = dict(job.options)
    opts.setdefault("timeout_s", job.timeout_s)
    if job.base_port:
        opts["base_port"] = job.base_port
    if job.transport == "roce":
        opts.update(line_rate_bps=job.line_rate_bps, entropy=job.entropy, mtu=job.mtu)
    t = tmod.make(job.transport, rank, job.addrs, **opts)
    try:
        t.start()
        t.barrier()                                    # everyone is up (over the data network)
        emit({"event": "ready", "rank": rank})
        if job.hold:
            wait_go(hold_timeout_s(job))
        if job.after_s:
            time.sleep(job.after_s)                    # a later phase: the other jobs started at go
        started_at = time.time()                       # wall clock: concurrent jobs' starts compare
        name = col.canonical(job.collective)
        perm = tuple(job.perm) if job.perm else None
        sizes_out = []
        cpu0, wall0 = _cpu_s(), time.monotonic()
        timed_cpu = timed_wall = 0.0
        machine = [0.0, 0.0]                           # the machine's (total, idle) ticks, timed spans
        # per-message times (incast): wall clock, so that a sender's start and the root's
        # arrival compare across hosts (one machine's clock here; synchronised clocks on a cluster)
        mono_to_wall = time.time() - time.monotonic()
        per_message = name == "incast"
        for si, size in enumerate(job.sizes):
            sched = col.build(name, job.nranks, size, root=job.root, perm=perm)
            plan = [sched.transfers_of(rank, s) for s in range(len(sched.steps))]
            inp = col.rank_input(rank, sched.in_count, job.seed)
            expected = col.expected_for(sched, rank, job.seed) if job.check else None
            entry: dict[str, Any] = {"size": sched.size_bytes, "count": sched.count, "param_count": sched.param_count,
                     "oop": None, "ip": None}
            modes = ["oop"] + (["ip"] if job.inplace and sched.has_inplace else [])
            for mode in modes:
                work = np.zeros(sched.out_count, col.DTYPE)
                times, wrong = [], 0
                sent_at: list[float | None] = []
                recv_at: list[list[list[float]]] = []
                for it in range(job.warmup + job.iters):
                    if job.gap_s and it:
                        time.sleep(job.gap_s)
                    work[:] = 0
                    if mode == "ip":
                        off = (sched.inplace_offset(rank) or 0) // col.ELEM_BYTES
                        work[off:off + sched.in_count] = inp
                        src_in = work[off:off + sched.in_count]
                    else:
                        src_in = inp
                    t.barrier()
                    c0 = _cpu_s()
                    m0 = report.cpu_times()
                    t0 = time.perf_counter()
                    if mode == "oop":
                        col.apply_prologue(sched, rank, inp, work)
                    first_send: float | None = None
                    arrivals: list[list[float]] = []
                    for sends, recvs in plan:
                        if not sends and not recvs:
                            continue
                        if sends and first_send is None:
                            first_send = time.monotonic()
                        # a rank moves on as soon as its data is in; its sends finish in
                        # the background (copied), as a NIC's send queue would
                        got = t.exchange([(x.dst, col.source_bytes(x, src_in, work)) for x in sends],
                                         [(x.src, x.nbytes) for x in recvs], wait_sends=False)
                        if per_message and recvs:
                            done = getattr(t, "recv_done", None) or [time.monotonic()] * len(recvs)
                            arrivals += [[x.src, d + mono_to_wall] for x, d in zip(recvs, done, strict=False)]
                        for x, data in zip(recvs, got, strict=False):
                            col.deliver(work, x, data)
                    elapsed = time.perf_counter() - t0     # this rank has its whole result
                    t.flush()                              # its last sends are acknowledged
                    if it >= job.warmup:
                        times.append(elapsed)
                        if per_message:
                            sent_at.append(None if first_send is None else first_send + mono_to_wall)
                            recv_at.append(arrivals)
                        timed_wall += time.perf_counter() - t0   # CPU share over the same span
                        timed_cpu += _cpu_s() - c0
                        m1 = report.cpu_times()        # the machine's cores over the same span
                        machine[0] += m1[0] - m0[0]
                        machine[1] += m1[1] - m0[1]
                        if expected is not None:
                            off, nb = sched.result_slice(rank)
                            got_res = work.view(np.uint8)[off:off + nb].view(col.DTYPE)
                            wrong += int(np.count_nonzero(got_res != expected))
                entry[mode] = {"times_s": times, "wrong": wrong if job.check else None}
                if per_message:
                    entry[mode]["messages"] = {"sent_at": sent_at, "recv_at": recv_at}
            sizes_out.append(entry)
            oop = entry["oop"]["times_s"] if entry["oop"] else []
            emit({"event": "progress", "rank": rank, "done": si + 1, "of": len(job.sizes), "size": size,
                  "bytes": entry["size"], "time_s": float(np.median(oop)) if oop else None})
        t.barrier()                                     # nobody leaves while others still need it
        flows = t.flow_stats()
        result = {"event": "result", "rank": rank, "sizes": sizes_out, "flows": flows,
                  "transport_info": t.info(), "socket_drops": t.socket_drops(),
                  "cpu": {"timed_cpu_s": timed_cpu, "timed_wall_s": timed_wall, "machine_ticks": machine,
                          "total_cpu_s": _cpu_s() - cpu0, "total_wall_s": time.monotonic() - wall0},
                  "host": socket.gethostname(), "pid": os.getpid(), "started_at": started_at}
        emit(result)
        return result
    except BaseException:
        if hasattr(t, "abort"):
            with contextlib.suppress(Exception):   # best effort: never hide the error that brought us here
                t.abort()
        raise
    finally:
        t.close()


def hold_timeout_s(job: Job) -> float:
    """How long a held rank waits for ``go``: the other jobs' ranks start beside it (the launcher
    stops every rank sooner when one of them fails or falls silent)."""
    return 60.0 + 4 * job.timeout_s


def wait_go(timeout_s: float, stream: Any = None) -> None:
    """Wait for the launcher's ``go`` line on ``stream`` (stdin): every rank of every job is up, so
    concurrent jobs start their iterations together instead of whenever their own ranks were up."""
    import select

    stream = sys.stdin if stream is None else stream
    readable, _, _ = select.select([stream], [], [], timeout_s)
    if not readable:
        raise UserError(f"the launcher did not start the jobs within {timeout_s:g} s of this rank being up")
    line = stream.readline()
    if line.strip() != "go":
        raise UserError("the launcher closed this rank's input before starting the jobs")


def worker_main(argv: list[str]) -> int:
    job = Job.from_json(argv[0])
    rank = int(argv[1])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        run_rank(job, rank)
        return 0
    except UserError as exc:
        _emit({"event": "error", "rank": rank, "message": str(exc)})
        return 3
    except Exception as exc:  # a bug: say what and where, still one line for the launcher
        _emit({"event": "error", "rank": rank, "message": f"{type(exc).__name__}: {exc}"})
        return 4


# ---- spawners ----------------------------------------------------------------------------

def worker_argv(job: Job, rank: int, python: str = sys.executable) -> list[str]:
    return [python, "-m", "hpnlab.fabric.transport.ranks", "worker", job.to_json(), str(rank)]


def local_addresses() -> set[str]:
    """IPv4 addresses of this machine's (this network namespace's) interfaces."""
    out = {"127.0.0.1"}
    try:
        text = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                              timeout=5).stdout
        for line in text.splitlines():
            parts = line.split()
            if "inet" in parts:
                out.add(parts[parts.index("inet") + 1].split("/")[0])
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def is_local(addr: str, here: set[str]) -> bool:
    return addr in here or addr.startswith("127.")


class LocalSpawner:
    """Ranks on this machine (addresses of its interfaces, or 127.0.0.0/8)."""
    name = "local"

    def __init__(self, cwd: str | None = None):
        self.cwd = cwd or _project_root()

    def check(self, job: Job) -> None:
        here = local_addresses()
        for r, addrs in enumerate(job.addrs):
            for a in addrs:
                if not is_local(a, here):
                    raise UserError(f"address {a} (rank {r}) is not an address of this machine; "
                                    f"use --launcher ssh to run ranks on other hosts")

    def spawn(self, job: Job, rank: int) -> subprocess.Popen:
        return subprocess.Popen(worker_argv(job, rank), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=_stdin(job), cwd=self.cwd, start_new_session=True)


class SshSpawner:
    """Ranks on other machines: ``ssh HOST python3 -m hpnlab.fabric.transport.ranks worker ...`` (hpnlab must be
    importable there; ``remote_python`` names its interpreter)."""
    name = "ssh"

    def __init__(self, remote_python: str = "python3", ssh: str = "ssh"):
        self.remote_python, self.ssh = remote_python, ssh

    def check(self, job: Job) -> None:
        import shutil
        if shutil.which(self.ssh) is None:
            raise UserError(f"--launcher ssh needs an ssh client ({self.ssh!r} not found; "
                            f"apt-get install openssh-client)")

    def spawn(self, job: Job, rank: int) -> subprocess.Popen:
        host = job.addrs[rank][0]
        remote = shlex.join(worker_argv(job, rank, self.remote_python))
        return subprocess.Popen([self.ssh, "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", host, remote],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=_stdin(job),
                                start_new_session=True)


class EmulationSpawner:
    """Ranks on the emulated hosts (``hpnlab.fabric.emulation.Emulation.popen``, recorded by the
    harness so that even a killed run leaves nothing behind)."""
    name = "emulation"

    def __init__(self, emu, hosts_of_job: dict[int, list[str]]):
        self.emu = emu
        self.hosts_of_job = hosts_of_job

    def check(self, job: Job) -> None:
        pass

    def spawn(self, job: Job, rank: int) -> subprocess.Popen:
        host = self.hosts_of_job[job.job][rank]
        return self.emu.popen(host, worker_argv(job, rank), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=_stdin(job), cwd=_project_root())


def _stdin(job: Job) -> int:
    """A rank's standard input: a pipe for the launcher's ``go`` when the job is held, else nothing."""
    return subprocess.PIPE if job.hold else subprocess.DEVNULL


def _project_root() -> str:
    return str(Path(__file__).resolve().parents[2])


# ---- the launcher ------------------------------------------------------------------------

class _Proc:
    def __init__(self, job: Job, rank: int, popen: subprocess.Popen):
        if popen.stdout is None or popen.stderr is None:
            raise ValueError("a rank's process needs piped stdout and stderr")
        self.job, self.rank, self.popen = job, rank, popen
        self.stdout, self.stderr = popen.stdout, popen.stderr
        self.buf = b""
        self.err = b""
        self.out_bytes = 0          # stdout bytes read so far (said when a rank ends without a result)
        self.result: dict | None = None
        self.error: str | None = None
        self.done = False
        self.ready = False          # said "ready": its transport is up and its job's barrier passed
        self.last_heard = time.monotonic()


class Progress:
    """A progress line on stderr: sizes done by the slowest job's rank 0."""

    def __init__(self, total: int, stream=sys.stderr, enabled: bool = True,
                 callback: Callable[[int, int, str], None] | None = None):
        self.total, self.stream, self.enabled, self.callback = total, stream, enabled, callback
        self.done = 0
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def update(self, done: int, label: str) -> None:
        if not self.enabled or done <= self.done:
            return
        self.done = done
        if self.callback is not None:
            self.callback(done, self.total, label)
            return
        width = 30
        fill = int(width * done / max(1, self.total))
        line = f"[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} sizes  {label}"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done >= self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def run_jobs(jobs: list[Job], spawner, *, progress: bool | Callable[[int, int, str], None] = True,
             on_started=None, startup_timeout_s: float | None = None) -> list[dict]:
    """Run every job's ranks at once (concurrent jobs on disjoint ranks); return one result
    dict per job (``hpnlab.fabric.workload.report.build_result``). Any failure stops every rank and
    raises UserError. ``progress``: a bar on stderr (True), nothing (False), or a function
    called with (sizes done, sizes in all, label)."""
    for job in jobs:
        validate(job)
        spawner.check(job)
    # concurrent jobs start their iterations together: each rank, once up, waits for "go", sent when every
    # rank of every job is up (each job's own barrier alone let one job run ahead while the other's ranks started)
    held = len(jobs) > 1
    if held:
        jobs = [dataclasses.replace(job, hold=True) for job in jobs]
    procs: list[_Proc] = []
    sel = selectors.DefaultSelector()
    bar = Progress(len(jobs[0].sizes), enabled=bool(progress),
                   callback=progress if callable(progress) else None)
    failure: str | None = None
    try:
        for job in jobs:
            for rank in range(job.nranks):
                p = _Proc(job, rank, spawner.spawn(job, rank))
                procs.append(p)
                sel.register(p.stdout, selectors.EVENT_READ, (p, "out"))
                sel.register(p.stderr, selectors.EVENT_READ, (p, "err"))
        if on_started:
            on_started([p.popen for p in procs])
        silence = max(j.timeout_s for j in jobs) + 10.0
        if startup_timeout_s:
            silence = max(silence, startup_timeout_s)
        while failure is None and not all(p.done for p in procs):
            for key, _ in sel.select(timeout=0.5):
                p, which = key.data
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                p.last_heard = time.monotonic()
                if which == "err":
                    p.err = (p.err + chunk)[-4000:]
                    continue
                p.buf += chunk
                p.out_bytes += len(chunk)
                while b"\n" in p.buf:
                    line, p.buf = p.buf.split(b"\n", 1)
                    _handle_line(p, line, bar, jobs)
            if held and all(p.ready for p in procs):
                _say_go(procs)
                held = False
            now = time.monotonic()
            for p in procs:
                if p.done:
                    continue
                code = p.popen.poll()
                if code is not None and p.result is None and p.error is None:
                    # drain what it wrote before exiting
                    try:
                        rest = p.stdout.read() or b""
                    except (OSError, ValueError):
                        rest = b""
                    p.out_bytes += len(rest)
                    for line in (p.buf + rest).split(b"\n"):
                        if line.strip():
                            _handle_line(p, line, bar, jobs)
                    p.buf = b""
                if p.error is not None:
                    failure = f"{p.job.where(p.rank)}: {p.error}"
                    break
                if code is not None:
                    if p.result is None:
                        tail = p.err.decode(errors="replace").strip().splitlines()
                        why = tail[-1] if tail else (f"exit code {code} without a result line, "
                                                     f"{p.out_bytes} bytes of output read")
                        if code < 0:
                            why = f"killed by signal {-code}"
                        failure = f"{p.job.where(p.rank)} died ({why})"
                        break
                    p.done = True
                elif now - p.last_heard > silence and p.result is None and _all_silent(procs, now, silence):
                    failure = f"{p.job.where(p.rank)} made no progress for {silence:.0f} s"
                    break
        if failure is not None:
            # a rank that died is the cause; its peers' errors (lost peer) follow from it
            time.sleep(0.2)
            for p in procs:
                code = p.popen.poll()
                if code is not None and code < 0 and p.result is None and p.error is None:
                    failure = f"{p.job.where(p.rank)} died (killed by signal {-code})"
                    break
            raise UserError(f"{failure}; the other ranks were stopped")
    finally:
        _stop_all(procs)
        sel.close()
    return [report.build_result(job, [p.result for p in procs if p.job is job and p.result is not None])
            for job in jobs]


def _all_silent(procs, now, silence) -> bool:
    return all(p.done or now - p.last_heard > silence for p in procs)


def _handle_line(p: _Proc, line: bytes, bar: Progress, jobs: list[Job]) -> None:
    try:
        msg = json.loads(line)
    except ValueError:
        p.err = (p.err + line + b"\n")[-4000:]
        return
    ev = msg.get("event")
    if ev == "result":
        p.result = msg
    elif ev == "error":
        if p.error is None:
            p.error = msg.get("message", "failed")
    elif ev == "ready":
        p.ready = True
    elif ev == "progress" and p.rank == 0:
        slowest = msg["done"]
        bar.update(slowest, f"{p.job.collective} size {msg['size']} B"
                   + _busbw_so_far(p.job, msg.get("bytes"), msg.get("time_s"))
                   + (f" (job {p.job.job})" if len(jobs) > 1 else ""))


def _busbw_so_far(job: Job, size: Any, time_s: Any) -> str:
    """", busbw X Gbit/s (rank 0)" for the size just done: nccl-tests' busbw from rank 0's median
    out-of-place time (the table's figure takes the slowest rank; this is the running estimate)."""
    if not isinstance(size, int) or not isinstance(time_s, (int, float)) or time_s <= 0:
        return ""
    busbw = size * 8 / time_s * col.busbw_factor(job.collective, job.nranks) / 1e9
    return f", busbw {busbw:.3g} Gbit/s (rank 0)"


def _say_go(procs: list[_Proc]) -> None:
    """Start every held rank: one ``go`` line on its standard input, which is then closed (a rank that
    has died meanwhile is the failure the launcher reports next)."""
    for p in procs:
        pipe = p.popen.stdin
        if pipe is None:
            continue
        with contextlib.suppress(OSError, ValueError):
            pipe.write(b"go\n")
            pipe.flush()
        with contextlib.suppress(OSError, ValueError):
            pipe.close()


def _stop_all(procs: list[_Proc]) -> None:
    """End every rank process still running: SIGTERM, then SIGKILL; reap all."""
    alive = [p for p in procs if p.popen.poll() is None]
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            p.popen.terminate()
    deadline = time.monotonic() + 2.0
    for p in alive:
        try:
            p.popen.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.popen.kill()
            p.popen.wait(timeout=5)
    for p in procs:
        for f in (p.stdout, p.stderr, p.popen.stdin):     # stdin: a held rank's, when no go was sent
            if f is not None:
                with contextlib.suppress(OSError, AttributeError):
                    f.close()


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    print("usage: python -m hpnlab.fabric.transport.ranks worker JOB_JSON RANK", file=sys.stderr)
    sys.exit(2)
