"""Rank workers and the launcher that runs one worker process per rank and gathers results.

Worker (``python -m hpnlab.fabric.ranks worker JOB_JSON``): one process per rank. It builds its
transport on its own addresses, proves every rank is there with a barrier *over the data
network*, then for every size runs warm-up and timed iterations of the collective's
schedule (``hpnlab.fabric.collectives``): a barrier, the timer, every step's sends and receives
(``Transport.exchange``), the timer; with ``check`` it compares its result, element by
element, with the collective's definition. It writes JSON lines on stdout: ``ready``,
``progress`` and finally ``result`` (or ``error`` with a one-line message) and exits
0 (or 3). The job description travels on the command line; nothing goes through files.

Launcher (:func:`run_jobs`): starts every rank of every job through a *spawner*
(:class:`LocalSpawner` for addresses of this machine, :class:`SshSpawner` for a real
cluster, or the emulation's ``host.popen``), reads their lines, shows progress, and when
any rank fails (error line, non-zero exit, or silence beyond the timeout) stops every other
rank by pid and raises one ``UserError`` naming the rank. Nothing is left running.
"""
from __future__ import annotations

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
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from . import collectives as col
from . import report
from .errors import UserError


# ---- the job description ------------------------------------------------------------------

@dataclass
class Job:
    """Everything a rank needs; serialised to JSON on the worker's command line."""
    collective: str
    addrs: list                     # per rank: list of addresses (one per plane / NIC port)
    sizes: list                     # bytes
    iters: int = 5
    warmup: int = 1
    check: bool = True
    inplace: bool = True
    transport: str = "roce"
    entropy: str = "flow"
    line_rate_bps: float = 20e6     # per NIC port of a rank (pacing and the busbw fraction)
    mtu: int = 1500
    base_port: int = 0              # 0: the transport's default (roce 4791, tcp 29500)
    root: int = 0
    perm: list | None = None
    seed: int = 0
    timeout_s: float = 15.0
    options: dict = field(default_factory=dict)   # extra transport options (recovery, dcqcn, ...)
    job: int = 0
    labels: list | None = None      # per rank: where it runs (host name), for messages

    @property
    def nranks(self) -> int:
        return len(self.addrs)

    def rank_line_rate_bps(self, rank: int = 0) -> float:
        return self.line_rate_bps * len(self.addrs[rank])

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Job":
        return cls(**json.loads(text))

    def where(self, rank: int) -> str:
        label = self.labels[rank] if self.labels else None
        addr = "+".join(self.addrs[rank])
        return f"rank {rank} ({label} {addr})" if label else f"rank {rank} ({addr})"


def validate(job: Job, ranks_here: int | None = None) -> None:
    """Check a job before anything starts; a mistake raises one UserError line."""
    name = col.canonical(job.collective)
    n = job.nranks
    if n < 2:
        raise UserError(f"{name} needs at least 2 ranks, got {n}")
    flat = [a for addrs in job.addrs for a in addrs]
    for a in flat:
        try:
            socket.inet_aton(a)
            if a.count(".") != 3:
                raise OSError
        except OSError:
            raise UserError(f"not an IPv4 address: {a!r}") from None
    for r, addrs in enumerate(job.addrs):
        if not addrs:
            raise UserError(f"rank {r} has no address")
    if len({len(a) for a in job.addrs}) != 1:
        raise UserError("every rank must have the same number of addresses (one per plane)")
    if job.iters < 1 or job.warmup < 0:
        raise UserError(f"-n must be at least 1 and -w at least 0 (got {job.iters}, {job.warmup})")
    if not job.sizes:
        raise UserError("no sizes to run (check -b/-e)")
    for size in job.sizes:
        col.build(name, n, size, root=job.root, perm=tuple(job.perm) if job.perm else None)
    if not 0 <= job.root < n:
        raise UserError(f"root {job.root} is not a rank (0..{n - 1})")
    if job.transport not in ("tcp", "roce"):
        raise UserError(f"unknown transport {job.transport!r} (known: tcp, roce)")
    if job.entropy not in ("flow", "spray", "adaptive"):
        raise UserError(f"unknown entropy {job.entropy!r} (known: flow, spray, adaptive)")
    need = col.memory_per_rank_bytes(name, n, max(job.sizes))
    if job.transport == "roce":
        need += 2 * col.fit_count(name, n, max(job.sizes)) * col.ELEM_BYTES
    avail = _mem_available()
    here = ranks_here if ranks_here is not None else n
    if avail and need * here > 0.8 * avail:
        raise UserError(f"size {max(job.sizes)} B does not fit: {here} ranks on this machine need about "
                        f"{need * here / 2**20:.0f} MiB, {avail / 2**20:.0f} MiB are available (lower -e)")


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---- worker ----------------------------------------------------------------------------

def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":"), default=report._jsonable) + "\n")
    sys.stdout.flush()


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_rank(job: Job, rank: int, emit: Callable[[dict], None] = _emit) -> dict:
    """Run one rank of ``job`` in this process; returns (and emits) its result."""
    from . import transport as tmod

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
        name = col.canonical(job.collective)
        perm = tuple(job.perm) if job.perm else None
        sizes_out = []
        cpu0, wall0 = _cpu_s(), time.monotonic()
        timed_cpu = timed_wall = 0.0
        for si, size in enumerate(job.sizes):
            sched = col.build(name, job.nranks, size, root=job.root, perm=perm)
            plan = [sched.transfers_of(rank, s) for s in range(len(sched.steps))]
            inp = col.rank_input(rank, sched.in_count, job.seed)
            expected = col.expected_for(sched, rank, job.seed) if job.check else None
            entry = {"size": sched.size_bytes, "count": sched.count, "param_count": sched.param_count,
                     "oop": None, "ip": None}
            modes = ["oop"] + (["ip"] if job.inplace and sched.has_inplace else [])
            for mode in modes:
                work = np.zeros(sched.out_count, col.DTYPE)
                times, wrong = [], 0
                for it in range(job.warmup + job.iters):
                    work[:] = 0
                    if mode == "ip":
                        off = sched.inplace_offset(rank) // col.ELEM_BYTES
                        work[off:off + sched.in_count] = inp
                        src_in = work[off:off + sched.in_count]
                    else:
                        src_in = inp
                    t.barrier()
                    c0 = _cpu_s()
                    t0 = time.perf_counter()
                    if mode == "oop":
                        col.apply_prologue(sched, rank, inp, work)
                    for sends, recvs in plan:
                        if not sends and not recvs:
                            continue
                        # a rank moves on as soon as its data is in; its sends finish in
                        # the background (copied), as a NIC's send queue would
                        got = t.exchange([(x.dst, col.source_bytes(x, src_in, work)) for x in sends],
                                         [(x.src, x.nbytes) for x in recvs], wait_sends=False)
                        for x, data in zip(recvs, got):
                            col.deliver(work, x, data)
                    elapsed = time.perf_counter() - t0     # this rank has its whole result
                    t.flush()                              # its last sends are acknowledged
                    if it >= job.warmup:
                        times.append(elapsed)
                        timed_wall += time.perf_counter() - t0   # CPU share over the same span
                        timed_cpu += _cpu_s() - c0
                        if expected is not None:
                            off, nb = sched.result_slice(rank)
                            got_res = work.view(np.uint8)[off:off + nb].view(col.DTYPE)
                            wrong += int(np.count_nonzero(got_res != expected))
                entry[mode] = {"times_s": times, "wrong": wrong if job.check else None}
            sizes_out.append(entry)
            emit({"event": "progress", "rank": rank, "done": si + 1, "of": len(job.sizes), "size": size})
        t.barrier()                                     # nobody leaves while others still need it
        flows = t.flow_stats()
        result = {"event": "result", "rank": rank, "sizes": sizes_out, "flows": flows,
                  "transport_info": t.info(),
                  "cpu": {"timed_cpu_s": timed_cpu, "timed_wall_s": timed_wall,
                          "total_cpu_s": _cpu_s() - cpu0, "total_wall_s": time.monotonic() - wall0},
                  "host": socket.gethostname(), "pid": os.getpid()}
        emit(result)
        return result
    except BaseException:
        if hasattr(t, "abort"):
            try:
                t.abort()
            except Exception:   # best effort: never hide the error that brought us here
                pass
        raise
    finally:
        t.close()


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
    return [python, "-m", "hpnlab.fabric.ranks", "worker", job.to_json(), str(rank)]


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
                                stdin=subprocess.DEVNULL, cwd=self.cwd, start_new_session=True)


class SshSpawner:
    """Ranks on other machines: ``ssh HOST python3 -m hpnlab.fabric.ranks worker ...`` (hpnlab must be
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
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
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
                              stdin=subprocess.DEVNULL, cwd=_project_root())


def _project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- the launcher ------------------------------------------------------------------------

class _Proc:
    def __init__(self, job: Job, rank: int, popen: subprocess.Popen):
        self.job, self.rank, self.popen = job, rank, popen
        self.buf = b""
        self.err = b""
        self.result = None
        self.error = None
        self.done = False
        self.last_heard = time.monotonic()


class Progress:
    """A progress line on stderr: sizes done by the slowest job's rank 0."""

    def __init__(self, total: int, stream=sys.stderr, enabled: bool = True):
        self.total, self.stream, self.enabled = total, stream, enabled
        self.done = 0
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def update(self, done: int, label: str) -> None:
        if not self.enabled or done <= self.done:
            return
        self.done = done
        width = 30
        fill = int(width * done / max(1, self.total))
        line = f"[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} sizes  {label}"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done >= self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def run_jobs(jobs: list[Job], spawner, *, progress: bool = True, on_started=None,
             startup_timeout_s: float | None = None) -> list[dict]:
    """Run every job's ranks at once (concurrent jobs on disjoint ranks); return one result
    dict per job (``build_result``). Any failure stops every rank and raises UserError."""
    for job in jobs:
        validate(job)
        spawner.check(job)
    procs: list[_Proc] = []
    sel = selectors.DefaultSelector()
    bar = Progress(len(jobs[0].sizes), enabled=progress)
    failure: str | None = None
    try:
        for job in jobs:
            for rank in range(job.nranks):
                p = _Proc(job, rank, spawner.spawn(job, rank))
                procs.append(p)
                sel.register(p.popen.stdout, selectors.EVENT_READ, (p, "out"))
                sel.register(p.popen.stderr, selectors.EVENT_READ, (p, "err"))
        if on_started:
            on_started([p.popen for p in procs])
        silence = max(j.timeout_s for j in jobs) + 10.0
        if startup_timeout_s:
            silence = max(silence, startup_timeout_s)
        while failure is None and not all(p.done for p in procs):
            for key, _ in sel.select(timeout=0.5):
                p, which = key.data
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                p.last_heard = time.monotonic()
                if which == "err":
                    p.err = (p.err + chunk)[-4000:]
                    continue
                p.buf += chunk
                while b"\n" in p.buf:
                    line, p.buf = p.buf.split(b"\n", 1)
                    _handle_line(p, line, bar, jobs)
            now = time.monotonic()
            for p in procs:
                if p.done:
                    continue
                code = p.popen.poll()
                if code is not None and p.result is None and p.error is None:
                    # drain what it wrote before exiting
                    try:
                        rest = p.popen.stdout.read() or b""
                    except (OSError, ValueError):
                        rest = b""
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
                        why = tail[-1] if tail else f"exit code {code}"
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
    return [build_result(job, [p.result for p in procs if p.job is job]) for job in jobs]


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
    elif ev == "progress" and p.rank == 0:
        slowest = msg["done"]
        bar.update(slowest, f"{p.job.collective} size {msg['size']} B"
                   + (f" (job {p.job.job})" if len(jobs) > 1 else ""))


def _stop_all(procs: list[_Proc]) -> None:
    """End every rank process still running: SIGTERM, then SIGKILL; reap all."""
    alive = [p for p in procs if p.popen.poll() is None]
    for p in alive:
        try:
            p.popen.terminate()
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 2.0
    for p in alive:
        try:
            p.popen.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                p.popen.kill()
            except ProcessLookupError:
                pass
            p.popen.wait(timeout=5)
    for p in procs:
        for f in (p.popen.stdout, p.popen.stderr):
            try:
                f.close()
            except (OSError, AttributeError):
                pass


# ---- merging ranks into one result --------------------------------------------------------

def merge_flows(rank_results: list[dict]) -> list[dict]:
    """One record per directed flow, joining the sender's and the receiver's counters."""
    flows: dict[tuple, dict] = {}
    for rr in rank_results:
        for f in rr.get("flows", []):
            key = (f["src"], f["dst"])
            rec = flows.setdefault(key, {"src": f["src"], "dst": f["dst"]})
            side = f.get("side", "tx")
            for k, v in f.items():
                if k in ("side", "src", "dst"):
                    continue
                rec[k] = v
            rec.setdefault("sides", []).append(side)
    out = [f for f in flows.values() if f.get("bytes", 0) or f.get("packets_received", 0)]
    for f in out:
        f.pop("sides", None)
    return sorted(out, key=lambda f: (f["src"], f["dst"]))


def cpu_summary(rank_results: list[dict]) -> dict:
    """Generator CPU during the timed iterations: each rank's share of one core, the busiest
    rank's share, the cores all ranks used together, and headroom = 1 - busiest share."""
    shares = []
    for rr in rank_results:
        c = rr["cpu"]
        shares.append(c["timed_cpu_s"] / c["timed_wall_s"] if c["timed_wall_s"] > 0 else 0.0)
    top = max(shares) if shares else 0.0
    return {"rank_shares": shares, "max_rank_share": top, "cores_used": sum(shares),
            "headroom": 1.0 - top, "machine_cores": os.cpu_count()}


def build_result(job: Job, rank_results: list[dict]) -> dict:
    name = col.canonical(job.collective)
    rows = report.aggregate(rank_results, name)
    info = rank_results[0].get("transport_info", {})
    sched = col.build(name, job.nranks, job.sizes[0], root=job.root,
                      perm=tuple(job.perm) if job.perm else None)
    return {"collective": name, "nranks": job.nranks, "job": job.job, "transport": job.transport,
            "entropy": job.entropy if job.transport == "roce" else None,
            "type": col.TYPE_NAME, "redop": sched.redop, "root": sched.root,
            "line_rate_bps": job.rank_line_rate_bps(),
            "busbw_factor": col.busbw_factor(name, job.nranks),
            "rows": rows, "avg_busbw_gbs": report.avg_busbw(rows),
            "flows": merge_flows(rank_results), "cpu": cpu_summary(rank_results),
            "transport_info": info, "params": json.loads(job.to_json()),
            "ranks": [{"rank": r["rank"], "host": r.get("host"), "pid": r.get("pid"),
                       "cpu": r["cpu"]} for r in sorted(rank_results, key=lambda r: r["rank"])]}


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    print("usage: python -m hpnlab.fabric.ranks worker JOB_JSON RANK", file=sys.stderr)
    sys.exit(2)


# ---- placement on a fabric graph (pure) ------------------------------------------------------

PLACEMENTS = ("cross-rail", "same-rail", "cross-plane", "cross-campus")


@dataclass
class Placed:
    host: str
    rail: int
    addrs: list           # one address per plane used, plane order
    planes: list


def place(g, placement: str = "cross-rail", nranks: int | None = None, jobs: int = 1) -> list[list[Placed]]:
    """Choose each job's ranks on the fabric graph: one rank per NIC (rail) of a host, using
    that NIC's port on every plane (``hpnlab.fabric.graph.host_ports``). Jobs get disjoint hosts.

    same-rail     ranks on rail 0 of hosts of one segment: every ring neighbour is under the
                  same leaf in each plane (leaf-local traffic, no spine). Job j takes segment j.
    cross-rail    ranks spread over segments and rails, rank i on rail i mod rails, hosts
                  taken round-robin across segments: neighbours sit under different leaves,
                  so traffic crosses the spines (the default).
    cross-plane   as cross-rail, but job j uses only plane j mod planes (one port per rank):
                  concurrent jobs are separated by plane; one job shows the single-plane case.
    cross-campus  ranks alternate between campuses (needs a scenario with campuses > 1):
                  every ring step crosses the long-haul links.
    """
    from . import graph as fgraph

    if placement not in PLACEMENTS:
        raise UserError(f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})")
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")
    s = g.graph["scenario"]
    hosts = sorted(fgraph.hosts(g), key=lambda h: g.nodes[h]["index"])
    ports = {h: fgraph.host_ports(g, h) for h in hosts}

    def rank_on(h: str, rail: int, planes: list[int]) -> Placed:
        mine = sorted((p for p in ports[h] if p["rail"] == rail and p["plane"] in planes),
                      key=lambda p: p["plane"])
        return Placed(h, rail, [p["ip"] for p in mine], [p["plane"] for p in mine])

    all_planes = list(range(s.planes))
    groups: list[list[str]] = []
    if placement == "same-rail":
        by_seg: dict = {}
        for h in hosts:
            d = g.nodes[h]
            by_seg.setdefault((d["campus"], d["pod"], d["segment"]), []).append(h)
        segs = list(by_seg.values())
        if jobs > len(segs):
            raise UserError(f"same-rail: {jobs} jobs need {jobs} segments, the scenario has {len(segs)}")
        want = nranks or len(segs[0])
        if want > len(segs[0]):
            raise UserError(f"same-rail: a segment has {len(segs[0])} hosts, asked for {want} ranks "
                            f"(lower --ranks or use cross-rail)")
        return [[rank_on(h, 0, all_planes) for h in segs[j][:want]] for j in range(jobs)]
    if placement == "cross-campus":
        if s.campuses < 2:
            raise UserError(f"cross-campus needs a scenario with several campuses ({s.name} has 1; "
                            f"try mini-cross-campus)")
        by_campus = [[h for h in hosts if g.nodes[h]["campus"] == c] for c in range(s.campuses)]
        order = [h for tup in zip(*by_campus) for h in tup]
    else:
        by_seg = {}
        for h in hosts:
            d = g.nodes[h]
            by_seg.setdefault((d["campus"], d["pod"], d["segment"]), []).append(h)
        order = [h for tup in zip(*by_seg.values()) for h in tup]
    per_job = nranks or len(order) // jobs
    if per_job < 2:
        raise UserError(f"{placement}: {len(order)} hosts cannot give {jobs} jobs of at least 2 ranks")
    if per_job * jobs > len(order):
        raise UserError(f"{placement}: {jobs} job(s) of {per_job} ranks need {per_job * jobs} hosts, "
                        f"the scenario has {len(order)} usable")
    out = []
    for j in range(jobs):
        mine = order[j::jobs][:per_job]     # interleave so every job spans the segments
        planes = [j % s.planes] if placement == "cross-plane" else all_planes
        out.append([rank_on(h, (i % s.rails) if placement != "cross-campus" else 0, planes)
                    for i, h in enumerate(mine)])
    return out
