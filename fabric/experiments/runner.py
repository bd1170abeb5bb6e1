"""Experiments as a library: a plan (what to run), a target (where), and :func:`run`.

A :class:`Plan` is plain, frozen data: the collectives, transports and entropies whose
product is the run matrix (:meth:`Plan.matrix`), the sizes, iterations and warm-up, and where
ranks sit on a fabric (placement, ranks per job, concurrent jobs: identical ones, or different
ones from ``job_specs``, ``hpnlab.fabric.workload.jobspec``). Building one checks it: a
mistake raises one ``UserError`` line. :meth:`Plan.jobs_on` turns it into the jobs of every run
on a fabric graph (``hpnlab.fabric.workload.placement``), so every mistake shows before anything is
built.

Targets: a live ``hpnlab.fabric.emulation.Emulation`` (ranks on its hosts, placed on its
graph), :class:`Loopback` (ranks on this machine's 127.0.0.0/8, no root) or :class:`Hosts`
(addresses you give: this machine's, or a cluster's over ssh).

:func:`run` runs the matrix in order and returns ``{"meta": ..., "results": [...]}``, the
document ``results.json`` holds (``hpnlab.fabric.workload.report`` makes tables and plots of it)::

    from hpnlab.fabric import experiment, report
    plan = experiment.Plan(collectives=["all_reduce"], entropies=["flow", "spray"])
    doc = experiment.run(plan, experiment.Loopback(planes=2))
    print(report.format_table(doc["results"][0]))
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import networkx as nx

from hpnlab.fabric.emulation.pfc_plan import summarize as pfc_summary
from hpnlab.fabric.emulation.timeline import Runner
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing.compiler import entropy_map
from hpnlab.fabric.routing.telemetry import read_lines, summarise
from hpnlab.fabric.scenario.rates import emulated_mbps
from hpnlab.fabric.transport import ENTROPIES, TRANSPORTS, ranks
from hpnlab.fabric.transport.accounting import failure_windows, recovery_join_s, summarize_windows
from hpnlab.fabric.workload import collectives as col
from hpnlab.fabric.workload import ecn as ecn_settings
from hpnlab.fabric.workload import placement as pl
from hpnlab.fabric.workload import report
from hpnlab.fabric.workload.jobs import Job, validate
from hpnlab.fabric.workload.jobspec import JobSpec, check_on, host_job
from hpnlab.fabric.workload.jobspec import label as mix_label
from hpnlab.fabric.workload.jobspec import parse as parse_jobs

RECOVERIES = ("selective", "gobackn")
PERMUTATIONS = ("shift", "random")
#: the transports' own base ports (roce: RoCEv2's UDP port; tcp: torch.distributed's)
DEFAULT_BASE_PORT = {"roce": 4791, "tcp": 29500}

Say = Callable[[str], None]
Progress = bool | Callable[[int, int, str], None]


def sweep(min_bytes: int | str, max_bytes: int | str, factor: float = 2.0,
          step_bytes: int | str = 0) -> tuple[int, ...]:
    """Sizes as nccl-tests' ``-b/-e/-f`` (or ``-i``) make them; "64K" and "1M" are accepted."""
    return tuple(col.sweep(col.parse_size(str(min_bytes)), col.parse_size(str(max_bytes)), factor,
                           col.parse_size(str(step_bytes))))


@dataclass(frozen=True)
class Run:
    """One cell of the matrix. ``entropy`` is None for tcp (the kernel picks the path)."""
    collective: str
    transport: str
    entropy: str | None

    def describe(self) -> str:
        return f"{self.collective} over {self.transport}" + (f" ({self.entropy} entropy)" if self.entropy else "")


def _names(value: str | Iterable[str]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(v).strip() for v in items if str(v).strip())


def _known(items: Sequence[str], known: Sequence[str], what: str) -> None:
    if not items:
        raise UserError(f"no {what} given (known: {', '.join(known)})")
    for item in items:
        if item not in known:
            raise UserError(f"unknown {what} {item!r} (known: {', '.join(known)})")


#: roce options of ``Plan(host_failover=False)``, the baseline before host-side failover: no
#: dead-path rule, no path migration, no carrier watch, the retransmission timer backing off
#: to 1 s (fabric/transport/paths.py has the rules this turns off)
NO_HOST_FAILOVER: dict[str, Any] = {"paths": {"dead_rtts": 1e6, "dead_floor_s": 3600.0, "migrate_after_rtos": 10**6},
                                    "watch_links": False, "max_rto_s": 1.0}


@dataclass(frozen=True)
class Plan:
    """What to run: the matrix collectives x transports x entropies (tcp once, whatever the
    entropies), each over every size, and where ranks sit on a fabric graph.

    Sequences may be given as lists or comma strings; sizes as ints or "64K"-like strings
    (or :func:`sweep`). ``ranks``/``jobs``/``placement`` place ranks on an emulated fabric or
    on :class:`Loopback`; a :class:`Hosts` target brings its own addresses.
    """
    # Given as a list, a tuple or a comma string (sizes also as "64K"); held as tuples once checked.
    collectives: str | Sequence[str] = ("all_reduce", "all_to_all")
    transports: str | Sequence[str] = ("roce",)
    entropies: str | Sequence[str] = ("flow",)
    sizes: int | str | Sequence[int | str] = field(default_factory=lambda: sweep("64K", "1M"))
    iterations: int = 5
    warmup: int = 1
    check: bool = True
    inplace: bool = True
    placement: str = "cross-rail"
    ranks: int = 4
    jobs: int = 1
    root: int = 0
    perm: str = "shift"
    seed: int = 0
    recovery: str = "selective"
    dcqcn: bool = True
    ports_per_nic: int = 8
    window_pkts: int = 64
    pace: float = 1.0
    timeout_s: float = 15.0
    base_port: int = 0
    host_failover: bool = True
    #: different jobs at once (``hpnlab.fabric.workload.jobspec``: a ``--jobs`` string or JobSpecs): one
    #: job per spec, concurrently on disjoint hosts; ``collectives`` and ``jobs`` are then unused
    job_specs: str | Sequence[JobSpec] = ()
    flowlet_gap_us: float | None = None     # None: the transport's default (4 packet times, >= 500 us)
    #: more options of the roce transport, as (name, value) pairs or a dict (a benchmark comparing a setting)
    roce_options: Any = ()

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        put("roce_options", tuple(sorted(dict(self.roce_options).items())))
        put("collectives", tuple(col.canonical(c) for c in _names(self.collectives)))
        if not self.collectives:
            raise UserError(f"no collective given (known: {', '.join(col.COLLECTIVES)})")
        put("transports", _names(self.transports))
        _known(self.transports, TRANSPORTS, "transport")
        put("entropies", _names(self.entropies))
        _known(self.entropies, ENTROPIES, "entropy")
        if self.flowlet_gap_us is not None and self.flowlet_gap_us <= 0:
            raise UserError(f"--flowlet-gap-us must be above 0, got {self.flowlet_gap_us:g}")
        sizes = [self.sizes] if isinstance(self.sizes, (int, str)) else list(self.sizes)
        put("sizes", tuple(col.parse_size(str(s)) for s in sizes))
        if not self.size_list or min(self.size_list) < 1:
            raise UserError("no sizes to run (check -b/-e)")
        if self.iterations < 1 or self.warmup < 0:
            raise UserError(f"-n must be at least 1 and -w at least 0 (got {self.iterations}, {self.warmup})")
        if self.placement not in pl.PLACEMENTS:
            raise UserError(f"unknown placement {self.placement!r} (known: {', '.join(pl.PLACEMENTS)})")
        if self.ranks < 2:
            raise UserError(f"--ranks must be at least 2, got {self.ranks}")
        if self.jobs < 1:
            raise UserError(f"--jobs must be at least 1, got {self.jobs}")
        specs = parse_jobs(self.job_specs) if isinstance(self.job_specs, str) else tuple(self.job_specs)
        put("job_specs", specs)
        if specs and self.jobs != 1:
            raise UserError("--jobs takes either a number of identical jobs or job specs, not both")
        check_on(specs)
        for k, spec in enumerate(specs):
            if spec.on is not None and self.ranks_of(k) > self.ranks_of(spec.on):
                raise UserError(f"--jobs: job {k + 1} ({spec.describe()}): {self.ranks_of(k)} ranks on job "
                                f"{spec.on + 1}'s {self.ranks_of(spec.on)} hosts (at most one rank per host)")
            if self.ranks_of(k) <= spec.root:
                raise UserError(f"--jobs: job {k + 1} ({spec.describe()}): root {spec.root} is not a rank "
                                f"(0..{self.ranks_of(k) - 1})")
        _known((self.perm,), PERMUTATIONS, "permutation (--perm)")
        _known((self.recovery,), RECOVERIES, "recovery")
        if not 0.1 <= self.pace <= 1.0:
            raise UserError(f"--pace must be between 0.1 and 1 (a fraction of line rate), got {self.pace}")

    @property
    def specs(self) -> tuple[JobSpec, ...]:
        """The job specs (``__post_init__`` has parsed them; empty: identical jobs)."""
        return cast(tuple[JobSpec, ...], self.job_specs)

    @property
    def job_count(self) -> int:
        return len(self.specs) or self.jobs

    def ranks_of(self, job: int) -> int:
        """Ranks of job ``job`` (its spec's, else ``ranks``)."""
        spec = self.specs[job] if self.specs else None
        return spec.ranks if spec is not None and spec.ranks is not None else self.ranks

    @property
    def size_list(self) -> tuple[int, ...]:
        """The sizes in bytes (``__post_init__`` has parsed them)."""
        return cast(tuple[int, ...], self.sizes)

    def replace(self, **changes: Any) -> Plan:
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def matrix(self) -> list[Run]:
        """Every (collective, transport, entropy) to run, in order; tcp once per collective. With
        job specs, one run per (transport, entropy) named after the mix (``all_reduce+incast``)."""
        names = (mix_label(self.specs),) if self.specs else cast(tuple[str, ...], self.collectives)
        return [Run(c, t, e if t == "roce" else None)
                for c in names for t in self.transports
                for e in (self.entropies if t == "roce" else self.entropies[:1])]

    def jobs_at(self, run: Run, addrs_per_job: list[list[list[str]]], line_rate_bps: float, mtu: int = 1500,
                labels: list[list[str]] | None = None, base_port: int | None = None,
                entropy_map: dict | None = None) -> list[Job]:
        """The jobs of one run on given addresses (per job, per rank, one address per plane),
        each checked (``hpnlab.fabric.workload.jobs.validate``). ``entropy_map``: the fabric's
        (``hpnlab.fabric.routing.compiler.entropy_map``), for the roce transport's source ports."""
        base = self.base_port if base_port is None else base_port
        if not base and len(addrs_per_job) > 1:
            base = DEFAULT_BASE_PORT[run.transport]
        opts: dict[str, Any] = {}
        if run.transport == "roce":
            opts = {"recovery": self.recovery, "dcqcn": self.dcqcn, "ports_per_nic": self.ports_per_nic,
                    "window_pkts": self.window_pkts, "pace": self.pace}
            if not self.host_failover:
                opts.update(NO_HOST_FAILOVER)
            if entropy_map is not None:
                opts["entropy_map"] = entropy_map
            if self.flowlet_gap_us is not None:
                opts["flowlet_gap_us"] = self.flowlet_gap_us
            opts.update(dict(self.roce_options))
        if self.specs and len(addrs_per_job) != len(self.specs):
            raise UserError(f"{len(self.specs)} job specs but addresses for {len(addrs_per_job)} job(s)")
        jobs = []
        for j, addrs in enumerate(addrs_per_job):
            n = len(addrs)
            spec = self.specs[j] if self.specs else None
            collective = spec.collective if spec else run.collective
            sizes = spec.sizes_for(n, self.size_list) if spec else self.size_list
            perm = list(col.random_perm(n, self.seed)) if (collective == "permutation" and n > 1
                                                           and self.perm == "random") else None
            where = f"job {j + 1} ({collective}): " if spec else ""
            for size in sizes:
                if n > 1 and col.fit_count(collective, n, size) < (1 if collective == "permutation" else n):
                    raise UserError(f"{where}size {size} B is too small for {collective} over {n} ranks "
                                    f"(at least {n * col.ELEM_BYTES} B; raise -b)")
            job = Job(collective=collective, addrs=addrs, sizes=list(sizes),
                      iters=spec.iterations if spec and spec.iterations is not None else self.iterations,
                      warmup=spec.warmup if spec and spec.warmup is not None else self.warmup,
                      check=self.check, inplace=self.inplace, transport=run.transport,
                      entropy=run.entropy or "flow", line_rate_bps=line_rate_bps, mtu=mtu,
                      base_port=base + 100 * j if base else 0, root=spec.root if spec else self.root, perm=perm,
                      seed=self.seed, timeout_s=self.timeout_s, options=opts, job=j,
                      labels=labels[j] if labels else None, gap_s=spec.gap_s if spec else 0.0,
                      after_s=spec.after_s if spec else 0.0)
            validate(job)
            jobs.append(job)
        for job in jobs:
            own = [a for addrs in job.addrs for a in addrs]
            if len(set(own)) != len(own):
                raise UserError("two ranks of one job share an address")
        def host_owner(k: int) -> int:        # the job whose hosts job k runs on (itself, or the one on= names)
            while self.specs and (on := self.specs[k].on) is not None:
                k = on
            return k

        for a, b in itertools.combinations(range(len(jobs)), 2):
            shared = {x for addrs in jobs[a].addrs for x in addrs} & {x for addrs in jobs[b].addrs for x in addrs}
            if shared and host_owner(a) != host_owner(b):
                raise UserError(f"jobs {a + 1} and {b + 1} share address {min(shared)}: concurrent jobs "
                                f"use disjoint hosts unless one names the other with on=")
        return jobs

    def host_jobs(self) -> list[int]:
        """The jobs that get hosts of their own (the others run on theirs, ``on=``)."""
        return [j for j in range(self.job_count) if host_job(self.specs, j) == j]

    def share_hosts(self, placed: list[list[Any]]) -> list[list[Any]]:
        """Per job, its ranks' places, from ``placed`` (one list per :meth:`host_jobs` job): a job with
        ``on=`` takes the first of its host job's."""
        own = dict(zip(self.host_jobs(), placed, strict=True))
        return [own[host_job(self.specs, j)][:self.ranks_of(j)] for j in range(self.job_count)]

    def jobs_on(self, g: nx.MultiGraph) -> dict[Run, list[Job]]:
        """Every run's jobs on a fabric graph: ranks placed by ``placement`` (their hosts are
        the jobs' ``labels``), at the scenario's emulated host rate and MTU. Checks them all."""

        s = g.graph["scenario"]
        if self.specs:
            # every job placed as if it had the most ranks (the placements' rules, job j's
            # segment or plane included), then cut to its own ranks: disjoint hosts
            hosted = self.host_jobs()
            widest = max(self.ranks_of(j) for j in hosted)
            placed = self.share_hosts([job[:self.ranks_of(j)] for j, job in
                                       zip(hosted, pl.place(g, self.placement, widest, len(hosted)), strict=True)])
        else:
            placed = pl.place(g, self.placement, self.ranks, self.jobs)
        addrs = [[p.addrs for p in job] for job in placed]
        hosts = [[p.host for p in job] for job in placed]
        line = emulated_mbps(s, s.host_rate_gbps) * 1e6

        emap = entropy_map(g).as_dict()
        return {run: self.jobs_at(run, addrs, line, s.emulation.mtu, labels=hosts, entropy_map=emap)
                for run in self.matrix()}


#: the default sweep's share of each rank (size / ranks), smallest and largest: what a ring all-reduce
#: step or an all-to-all peer carries. 32-256 KiB, as the 128K-1M sweep gave the 4 ranks of earlier
#: defaults; with 8 ranks and the same sizes an all-to-all peer's 128 KiB took a few RTTs and the TCP
#: all-to-all reached 0.44-0.46 of line where 2 MiB gave 0.70 (mini-hpn, 18 Mbit/s, MTU 4096)
CHUNKS = (32 * 1024, 256 * 1024)


def run_sizes(ranks: int) -> tuple[int, ...]:
    """The default sweep of a run of ``ranks`` ranks: ``CHUNKS`` times the rank count, doubling."""
    return sweep(CHUNKS[0] * max(1, ranks), CHUNKS[1] * max(1, ranks))


#: the demo's largest message: an all-reduce iteration of it takes about this many seconds at line rate
DEMO_LARGEST_S = 0.5


def fit_sizes(sizes: Sequence[int], ranks: int, line_bps: float, ports: int,
              seconds: float = DEMO_LARGEST_S, floor: int = 1024) -> tuple[int, ...]:
    """A sweep that answers in bounded time (pure): ``sizes`` halved together until the largest
    all-reduce iteration (ring: busbw factor 2(n-1)/n over ``ports`` ports at ``line_bps`` each) takes
    at most ``seconds``; never below ``floor`` bytes per rank. A rate the sweep already fits keeps it."""
    out = tuple(int(x) for x in sizes)
    if not out:
        return out

    def longest(sz: tuple[int, ...]) -> float:
        return col.busbw_factor("all_reduce", max(2, ranks)) * max(sz) * 8 / max(1.0, line_bps * max(1, ports))

    while longest(out) > seconds and min(out) // 2 >= floor * max(1, ranks):
        out = tuple(x // 2 for x in out)
    return out


#: the matrix `hpnlab run` and `hpnlab demo` run by default
#: (8 ranks: the measured budget, ``hpnlab.fabric.emulation.sizing.run_rates``, carries every host port at once;
#: a run with other ranks takes ``run_sizes`` of its own)
RUN_DEFAULTS = Plan(collectives=("all_reduce", "all_to_all"), transports=("roce", "tcp"),
                    entropies=("flow", "spray"), sizes=run_sizes(8), iterations=3, inplace=False, ranks=8)


# ---- targets -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hosts:
    """Ranks at the addresses you give: per job, per rank, one address per plane. Ranks whose
    addresses are all this machine's start here; ``launcher="ssh"`` starts the others over ssh
    (hpnlab installed there, ``remote_python`` its interpreter)."""
    addrs: tuple
    line_rate_bps: float = 20e6      # one NIC port's rate
    mtu: int = 1500
    launcher: str = "auto"
    remote_python: str = "python3"

    def __post_init__(self) -> None:
        _known((self.launcher,), ("auto", "local", "ssh"), "launcher")
        if self.line_rate_bps <= 0:
            raise UserError(f"a line rate must be positive, got {self.line_rate_bps}")

    def jobs(self, plan: Plan) -> dict[Run, list[Job]]:
        addrs = [[list(a) for a in job] for job in self.addrs]
        return {run: plan.jobs_at(run, addrs, self.line_rate_bps, self.mtu) for run in plan.matrix()}

    def spawner(self, jobs: list[Job]) -> Any:
        launcher = self.launcher
        if launcher == "auto":
            here = ranks.local_addresses()
            if not all(ranks.is_local(a, here) for job in jobs for ad in job.addrs for a in ad):
                raise UserError("some addresses are not on this machine; pass --launcher ssh to start "
                                "those ranks over ssh (hpnlab must be installed there)")
            launcher = "local"
        return ranks.LocalSpawner() if launcher == "local" else ranks.SshSpawner(self.remote_python)

    def describe(self) -> dict[str, Any]:
        return {"kind": "hosts", "launcher": self.launcher, "hosts": [list(j) for j in self.addrs],
                "line_rate_bps": self.line_rate_bps, "mtu": self.mtu}


@dataclass(frozen=True)
class Loopback:
    """Ranks on this machine's loopback, no root and no fabric: the plan's ``ranks`` per job
    and ``jobs``; rank r of job j on plane p at 127.p.j.(first + r). With the plan's
    ``base_port`` 0 it picks ports no socket of this machine is bound to."""
    planes: int = 1
    line_rate_bps: float = 20e6      # one (emulated) NIC port's rate
    mtu: int = 1500
    first: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.planes <= 8:
            raise UserError(f"loopback planes must be 1..8, got {self.planes}")
        if self.line_rate_bps <= 0:
            raise UserError(f"a line rate must be positive, got {self.line_rate_bps}")

    def addresses(self, plan: Plan) -> list[list[list[str]]]:
        widest = max(plan.ranks_of(j) for j in range(plan.job_count))
        if self.first + widest > 255:
            raise UserError(f"loopback has room for {255 - self.first} ranks per job, asked for {widest}")
        return plan.share_hosts([[[f"127.{p}.{j}.{self.first + r}" for p in range(self.planes)]
                                  for r in range(plan.ranks_of(j))] for j in plan.host_jobs()])

    def jobs(self, plan: Plan) -> dict[Run, list[Job]]:
        addrs = self.addresses(plan)
        base = plan.base_port or free_base_port(addrs)
        return {run: plan.jobs_at(run, addrs, self.line_rate_bps, self.mtu, base_port=base)
                for run in plan.matrix()}

    def spawner(self, jobs: list[Job]) -> Any:
        return ranks.LocalSpawner()

    def describe(self) -> dict[str, Any]:
        return {"kind": "loopback", "planes": self.planes, "line_rate_bps": self.line_rate_bps, "mtu": self.mtu}


def free_base_port(addrs_per_job: list[list[list[str]]], low: int = 20000, high: int = 32000,
                   tries: int = 50) -> int:
    """A base port b such that job j's rank r can bind b + 100 j + r (UDP and TCP) on each of
    its addresses right now (below Linux's ephemeral range)."""
    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(low, high - 100 * len(addrs_per_job), 10)
        if all(_bindable(a, base + 100 * j + r) for j, job in enumerate(addrs_per_job)
               for r, addrs in enumerate(job) for a in addrs):
            return base
    raise UserError(f"no free port range found on loopback between {low} and {high}")


def _bindable(addr: str, port: int) -> bool:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind((addr, port))
            except OSError:
                return False
    return True


# ---- the emulation as a target (duck-typed: graph, popen, interfaces) -----------------------

class _OnEmulation:
    """Ranks on an emulation's hosts; per run, the hosts' interface byte counters by plane and
    the ECN stage's counters (when the emulation has one)."""

    def __init__(self, emu: Any):
        self.emu = emu
        self._pfc_before: tuple[dict, float] | None = None

    def jobs(self, plan: Plan) -> dict[Run, list[Job]]:
        cells = plan.jobs_on(self.emu.graph)
        pfc = getattr(self.emu, "pfc", None)
        if pfc is not None:        # the roce transport's NIC stops sending a priority its port has paused
            for jobs in cells.values():
                for job in jobs:
                    if job.transport == "roce":
                        job.options["pause"] = pfc.transport_option()
        return cells

    def spawner(self, jobs: list[Job]) -> Any:
        return ranks.EmulationSpawner(self.emu, {j.job: list(j.labels or []) for j in jobs})

    def describe(self) -> dict[str, Any]:
        return {"kind": "emulation", "scenario": self.emu.graph.graph["scenario"].name}

    def counters(self, hosts: list[str]) -> dict[str, dict[str, int]]:
        """tx bytes of every interface of ``hosts``, read inside each host's namespace."""
        procs = {h: self.emu.popen(h, ["cat", "/proc/net/dev"], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL) for h in hosts}
        out = {}
        for h, p in procs.items():
            text, _ = p.communicate(timeout=30)
            out[h] = tx_bytes_by_interface(text.decode(errors="replace"))
        return out

    def apply_ecn(self, value: Any) -> dict[str, Any]:
        """Set every switch egress port's ECN thresholds (``ecn_settings.from_value``: a preset
        computed from each port's rate, or one kmin/kmax/pmax) through the stage's one writer
        (``EcnStage.write``); returns what was set."""
        stage = getattr(self.emu, "ecn", None)
        if stage is None:
            raise UserError("ECN thresholds need the ECN marking stage (the run has none: --no-ecn, "
                            "or this kernel has no marking mechanism; see hpnlab doctor)")
        setting = ecn_settings.from_value(value)
        per = ecn_settings.for_ports(setting, {n: (p.rate_mbps, p.limit_bytes) for n, p in stage.ports.items()},
                                     stage.mtu)
        stage.write(per, enabled=True)
        rates = {n: p.rate_mbps for n, p in stage.ports.items()}
        by_rate = {f"{rates[n]:g}": th.as_setting() for n, th in per.items()}
        return {"setting": setting if isinstance(setting, str) else "custom", "by_rate_mbps": by_rate,
                "described": ecn_settings.describe(per, rates)}

    def start_cell(self) -> tuple[Any, dict[str, int]]:
        """Before a cell: zero the ECN stage's counters, read the switch ports' drops and start
        sampling their queues (None, {} without an ECN stage)."""
        pfc = getattr(self.emu, "pfc", None)
        if pfc is not None:          # priority flow control: its counters now, its peaks from now on
            pfc.reset_peaks()
            self._pfc_before = (pfc.counters(), time.monotonic())
        stage = getattr(self.emu, "ecn", None)
        if stage is None:
            return None, {}
        try:
            stage.reset_counters()
        except UserError:
            pass                      # RED's counters are the qdisc's own; they are not reset
        return QueueSampler(stage).start(), {**switch_drops(list(stage.ports)), **self._ingress_drops()}

    def _ingress_drops(self) -> dict[str, int]:
        """What the switches' ingress dropped so far, keyed ``ingress:INTF`` (the harness's
        ``ingress_drops``: OVS's receive sockets on the userspace datapath; {} elsewhere)."""
        read = getattr(getattr(self.emu, "builder", None), "ingress_drops", None)
        return {f"ingress:{k}": v for k, v in (read() if read else {}).items()}

    def after_run(self, results: list[dict], before: dict[str, dict[str, int]],
                  sampler: QueueSampler | None = None, drops_before: dict[str, int] | None = None) -> None:
        after = self.counters(list(before))
        for r in results:
            r["tx_bytes_by_plane"] = {h: plane_bytes(self.emu.interfaces(h), before[h], after[h])
                                      for h in r["hosts"]}
        ecn_stage = getattr(self.emu, "ecn", None)
        ecn = None
        if ecn_stage is not None:
            queues = sampler.stop() if sampler is not None else None
            try:
                ecn = ecn_summary(ecn_stage.counters())
                drops = switch_drops(list(ecn_stage.ports))
                ecn["drops"] = sum(max(0, v - (drops_before or {}).get(k, 0)) for k, v in drops.items())
                ingress = self._ingress_drops()
                if ingress:
                    ecn["ingress_drops"] = sum(max(0, v - (drops_before or {}).get(k, 0))
                                               for k, v in ingress.items())
                if queues is not None:
                    ecn.update(queues)
                ecn_stage.reset_counters()
            except Exception as exc:   # counters are informative; keep the run's results
                ecn = {"error": f"{type(exc).__name__}: {exc}"}
        for r in results:
            r["switch_ecn"] = ecn
        pfc = getattr(self.emu, "pfc", None)
        if pfc is not None and self._pfc_before is not None:
            counters, t0 = self._pfc_before
            try:
                summary: dict[str, Any] = pfc_summary(counters, pfc.counters(), pfc.switches(), time.monotonic() - t0)
            except Exception as exc:   # counters are informative; keep the run's results
                summary = {"error": f"{type(exc).__name__}: {exc}"}
            for r in results:
                r["switch_pfc"] = summary


def ecn_summary(counters: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ECN stage's per-port counters of one cell summed over the switch ports: packets,
    ECT packets, CE marked, CE fraction (marked / ECT), the largest queue."""
    def total(key: str) -> int:
        return sum(c.get(key, 0) or 0 for c in counters.values())
    ect, marked = total("ect"), total("ce_marked")
    return {"packets": total("packets"), "ect": ect, "ce_marked": marked,
            "ce_fraction": marked / ect if ect else 0.0,
            "max_queue_bytes": max((c.get("max_queue_bytes", 0) or 0 for c in counters.values()), default=0)}


def switch_drops(ports: list[str]) -> dict[str, int]:
    """Packets dropped by the port buffers (the leaf qdiscs under htb) of these interfaces,
    read with one ``tc -s -j qdisc show`` in this namespace (where the switch ports are)."""
    try:
        text = subprocess.run(["tc", "-s", "-j", "qdisc", "show"], capture_output=True, text=True,
                              timeout=20).stdout
        qdiscs = json.loads(text or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    wanted = set(ports)
    out: dict[str, int] = {}
    for q in qdiscs:
        if q.get("dev") in wanted and q.get("kind") not in ("htb", "clsact", "ingress"):
            out[q["dev"]] = out.get(q["dev"], 0) + int(q.get("drops", 0) or 0)
    return out


def queue_percentile(samples: Sequence[float], q: float = 99.0) -> float:
    """Percentile of queue samples (bytes; numpy's linear interpolation), 0 with none."""
    import numpy as np
    return float(np.percentile(samples, q)) if samples else 0.0


class QueueSampler:
    """Samples every switch port's queue estimate from the ECN stage while a cell runs.

    Each sample is the port's peak since the previous one (the eBPF stage's ring of 10 ms peaks,
    ``queue_peak_bytes``), so a burst between two samples is seen; where the stage has no peaks
    (RED) it is the backlog the last packet found, and a port that passed no packet since the
    previous sample counts as empty (at the emulated rates any backlog below the port buffer
    drains within ``interval_s``). ``stop`` returns {"queue_p99_bytes": p99 over the samples of
    ports that carried packets, "queue_samples": {"interval_s", "t" (wall s), "ports":
    {intf: [bytes per sample]}} for the ports that ever queued}."""

    def __init__(self, stage: Any, interval_s: float = 0.05):
        self.stage, self.interval_s = stage, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hpnlab-queue-sampler", daemon=True)
        self.t: list[float] = []
        self.series: dict[str, list[int]] = {}
        self.active: list[int] = []
        self._packets: dict[str, int] = {}

    def start(self) -> QueueSampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        since = time.monotonic()
        while not self._stop.wait(self.interval_s):
            try:
                now = time.monotonic()
                counters = self.stage.counters(since=since)
                since = now
            except Exception:      # a sample is informative; never break the run
                continue
            self.t.append(time.time())
            k = len(self.t) - 1
            for intf, c in counters.items():
                packets = c.get("packets") or 0
                moved = packets != self._packets.get(intf, 0)
                self._packets[intf] = packets
                peak = c.get("queue_peak_bytes")
                q = int(peak) if peak is not None else int(c.get("queue_bytes") or 0) if moved else 0
                if moved:
                    self.active.append(q)
                if q and intf not in self.series:
                    self.series[intf] = [0] * k
                if intf in self.series:
                    self.series[intf].append(q)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=5)
        return {"queue_p99_bytes": queue_percentile(self.active),
                "queue_samples": {"interval_s": self.interval_s, "t": self.t, "ports": self.series}}


def tx_bytes_by_interface(proc_net_dev: str) -> dict[str, int]:
    """``/proc/net/dev`` -> {interface: bytes transmitted}."""
    out = {}
    for line in proc_net_dev.splitlines()[2:]:
        name, _, fields = line.partition(":")
        values = fields.split()
        if len(values) >= 9:
            out[name.strip()] = int(values[8])
    return out


def plane_bytes(interfaces: list[dict], before: dict[str, int], after: dict[str, int]) -> list[int]:
    """Bytes a host sent on each plane between two readings (``interfaces``: name, plane)."""
    planes = 1 + max((i["plane"] for i in interfaces), default=0)
    out = [0] * planes
    for i in interfaces:
        out[i["plane"]] += after.get(i["name"], 0) - before.get(i["name"], 0)
    return out


def _target(where: Any) -> Any:
    if isinstance(where, (Hosts, Loopback)):
        return where
    if hasattr(where, "graph") and hasattr(where, "popen"):
        return _OnEmulation(where)
    raise UserError(f"cannot run on {type(where).__name__}: give an Emulation, experiment.Loopback "
                    f"or experiment.Hosts")


# ---- running -------------------------------------------------------------------------------

#: timeline actions that break something, and the action that repairs each
_REPAIRS = {"link_down": "link_up", "link_down_one_side": "link_up", "link_drop": "link_restore",
            "switch_down": "switch_up", "controller_kill": "controller_restart"}


def left_failed(events: list[Any]) -> list[str]:
    """What a failure timeline leaves broken at its end (descriptions; empty: all repaired)."""
    broken: dict[tuple, str] = {}
    for ev in events:
        if ev.action in _REPAIRS:
            broken[(ev.action, tuple(sorted(ev.target)), ev.key)] = ev.describe()
        else:
            for k in [k for k in broken if _REPAIRS[k[0]] == ev.action and k[1] == tuple(sorted(ev.target))
                      and (ev.key is None or k[2] in (None, ev.key))]:
                del broken[k]
    return list(broken.values())


def check_timeline(events: list[Any], runs: int) -> None:
    """Refuse (one line) a timeline that leaves something failed when several runs share it."""
    broken = left_failed(events)
    if broken and runs > 1:
        raise UserError(f"the timeline leaves {', '.join(broken)} failed: with {runs} runs "
                        f"it must repair what it breaks, so that every run starts on the same fabric")


def failover_figures(result: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per failure of a timeline run under a collective, from the transports' per-packet
    records (roce: arrival gaps at the receivers, re-sends, byte counts and CRCs at both
    ends): flows hurt, loss window and stall, packets re-sent, every byte exactly once
    (``accounting.summarize_windows``); and the same per repair, whose own reroute can hurt
    flows too (what begins after it: a pause under way when it comes is the failure's). Each
    event's figures end at the timeline's next record of any kind (a repair ends its
    failure's; before 2026-12-04 a failure's ran 2 s past it, through its repair). Empty when
    the transport keeps no such records."""
    changes = set(_REPAIRS) | set(_REPAIRS.values())
    named = [(f"{rec['action']} {'-'.join(rec['target'])}", rec.get("start_wall", rec["wall"]), rec["action"])
             for rec in records]
    events = [(name, t) for name, t, action in named if action in changes]
    flows = [f for f in result.get("flows", []) if "gaps" in f]
    if not events or not flows:
        return []
    others = [t for _name, t, action in named if action not in changes]
    repairs = {name for name, _t, action in named if action in _REPAIRS.values()}
    join_s = recovery_join_s((result.get("transport_info") or {}).get("max_rto_s"))
    return summarize_windows(failure_windows(flows, events, boundaries=others, repairs=repairs, join_s=join_s))


def telemetry_of(emu: Any, t0: float, t1: float, max_points: int = 300) -> dict[str, Any] | None:
    """The controller's telemetry (``emu.controller.telemetry_file``, JSON lines) between two monotonic times, as the
    run's ``telemetry`` key (``hpnlab.fabric.routing.telemetry.summarise``); None when there is none."""
    path = getattr(getattr(emu, "controller", None), "telemetry_file", None)
    if path is None or not Path(path).is_file():
        return None
    lines = [line for line in read_lines(path)
             if line.get("kind") in ("header", "policy") or t0 <= float(line.get("t", t0)) <= t1]
    return summarise(lines, max_points)


def run(plan: Plan, where: Any, *, progress: Progress = True, say: Say | None = None,
        timeline: list[Any] | None = None, ecn_policy: str = ecn_settings.STATIC_POLICY,
        ecn_thresholds: str | dict | None = None) -> dict[str, Any]:
    """Run every cell of ``plan.matrix()`` on ``where`` (an Emulation, :class:`Loopback` or
    :class:`Hosts`), one after the other; concurrent jobs of a cell run at once.

    Every cell's jobs are built and checked before the first starts. Returns
    ``{"meta": {plan, target, load average, times}, "results": [one dict per job and cell]}``;
    a failing rank stops the others and raises one UserError line. ``progress``: a bar on
    stderr (True), none (False), or a function of (sizes done, sizes, label); ``say`` gets a
    line per cell.

    ``timeline`` (emulation only; events of ``hpnlab.fabric.emulation.timeline.load``): run
    through every cell, its times counted from the cell's start; the cell ends when both its
    ranks and the timeline have finished, and each of its results carries the timeline's
    records (``timeline``: applied offsets and wall-clock times, to line up with the
    transports' per-packet timestamps). With more than one cell the timeline must repair
    everything it breaks, so that every cell starts on the same fabric.

    ``ecn_policy`` (emulation with the hpnlab controller): the controller's dynamic-ECN policy
    during these cells (``ControllerSupervisor.set_ecn_policy``: every port starts from its start-up
    thresholds). The document then carries ``telemetry``: per switch egress port its time series
    and every threshold change (``telemetry_of``), and each result its cell's ``telemetry_t``
    (start, end) in seconds on the same clock as the series.
    ``ecn_thresholds`` (emulation only): set every switch egress port's ECN thresholds before
    the first cell, after ``ecn_policy`` is set (which puts every port back to its start-up
    thresholds): a preset of ``hpnlab.fabric.workload.ecn`` ("low", "high", "dcqcn", "default",
    computed from each port's rate), a dict {"kmin": bytes, "kmax": bytes, "pmax": p} or
    "kmin,kmax,pmax"; ``meta["ecn"]`` records what was set. On an emulation with an ECN
    stage each result's ``switch_ecn`` has the cell's marking, drops and queue samples.
    """
    target = _target(where)
    say = say or (lambda _m: None)
    cells = target.jobs(plan)
    if timeline:
        if not isinstance(target, _OnEmulation):
            raise UserError("a failure timeline needs an emulated fabric (hpnlab run), not "
                            f"{type(target).__name__}")
        check_timeline(timeline, len(cells))
    emu = target.emu if isinstance(target, _OnEmulation) else None
    controller = getattr(emu, "controller", None)         # the emulation's ControllerSupervisor
    if controller is not None and hasattr(controller, "set_ecn_policy"):
        controller.set_ecn_policy(ecn_policy)
    elif ecn_policy != ecn_settings.STATIC_POLICY:
        raise UserError(f"ECN policy {ecn_policy!r} needs an emulated fabric with the hpnlab controller")
    ecn_meta = None
    if ecn_thresholds is not None:
        if not isinstance(target, _OnEmulation):
            raise UserError(f"ECN thresholds need an emulated fabric (hpnlab run), not {type(target).__name__}")
        ecn_meta = target.apply_ecn(ecn_thresholds)
        for line in ecn_meta["described"]:
            say(f"ECN {ecn_meta['setting']}: {line}")
    t0 = time.monotonic()
    load_before = os.getloadavg()
    cpu_before = report.cpu_times()
    results: list[dict] = []
    for k, (cell, jobs) in enumerate(cells.items()):
        first = jobs[0]
        shape = (f"{len(jobs)} job(s) x {first.nranks} ranks" if not plan.specs else
                 "jobs " + ", ".join(f"{j.collective} x {j.nranks} ranks" for j in jobs))
        say(f"[{k + 1}/{len(cells)}] {cell.describe()}: {shape}"
            + (f", {plan.placement}" if isinstance(target, _OnEmulation) else "")
            + f", line rate {first.line_rate_bps / 1e6:g} Mbit/s x {len(first.addrs[0])} port(s) per rank")
        hosts = sorted({h for job in jobs for h in (job.labels or [])})
        cell_t0 = time.monotonic()
        before = target.counters(hosts) if isinstance(target, _OnEmulation) else None
        sampler, drops_before = target.start_cell() if isinstance(target, _OnEmulation) else (None, {})
        runner = None
        if timeline:
            runner = Runner(target.emu.faults, timeline, log=lambda m: say(f"  timeline: {m}")).start()
        try:
            out = ranks.run_jobs(jobs, target.spawner(jobs), progress=progress)
        except BaseException:
            if runner is not None:
                runner.stop()
                runner.join()
            if sampler is not None:
                sampler.stop()
            raise
        if runner is not None:
            records = runner.join()       # the cell ends when the timeline has been applied too
            for r in out:
                r["timeline"] = records
                r["failover"] = failover_figures(r, records)
                for f in r["failover"]:
                    say(f"  {f['event']}: {f['flows_hurt']} of {f['flows']} flows hurt, loss window "
                        f"max {f['loss_window_ms_max']:.1f} ms (median {f['loss_window_ms_median']:.1f}), "
                        f"stall max {f['stall_ms_max']:.1f} ms, {f['packets_lost']} packets re-sent, "
                        f"every byte exactly once: {'yes' if f['exactly_once'] else 'NO'}")
        for r, job in zip(out, jobs, strict=False):
            if emu is not None:
                r["telemetry_t"] = [round(cell_t0 - t0, 3), round(time.monotonic() - t0, 3)]
            r["hosts"] = list(job.labels) if job.labels else None
            r["placement"] = plan.placement if isinstance(target, _OnEmulation) else None
        if before is not None:
            target.after_run(out, before, sampler, drops_before)
        results.extend(out)
    meta = {"plan": plan.as_dict(), "target": target.describe(), "time": time.time(),
            "wall_s": time.monotonic() - t0, "load_average": {"before": load_before, "after": os.getloadavg()},
            "machine_busy": round(report.busy_share(cpu_before, report.cpu_times()), 4), "cpus": os.cpu_count()}
    if ecn_meta is not None:
        meta["ecn"] = ecn_meta
    doc: dict[str, Any] = {"meta": meta, "results": results}
    if emu is not None:
        meta["ecn_policy"] = ecn_policy
        meta["pfc"] = "on" if getattr(emu, "pfc", None) is not None else "off"
        if getattr(emu, "pfc", None) is not None:
            meta["pfc_agent"] = {k: v for k, v in emu.pfc.agent_stats().items()
                                 if k in ("pauses", "resumes", "storms", "netlink_errors", "cpu_share",
                                          "pause_reaction_us", "pause_reaction_frames")}
        tel = telemetry_of(emu, t0, time.monotonic())
        if tel is not None:
            doc["telemetry"] = tel
    return doc
