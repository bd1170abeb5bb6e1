"""Collective jobs as plain data: what a job is, whether it is valid, and where its ranks sit.

Pure (standard library, the fabric graph and the collective schedules): nothing here starts a
process or opens a socket. ``hpnlab.fabric.transport.ranks`` runs the jobs described here;
``hpnlab.fabric.experiments.runner`` builds them from a plan.

:class:`Job`
    everything one rank process needs (it travels as JSON on the worker's command line).
:func:`validate`
    a mistake the user can make in a job, as one ``UserError`` line, before anything starts.
:func:`place`
    which host NIC (rail) each rank of each job uses on a fabric graph, and its address on
    every plane (the placements: ``PLACEMENTS``).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import networkx as nx

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario.addressing import ip_int
from hpnlab.fabric.workload import collectives as col

#: the transports a job can run on (``hpnlab.fabric.transport.make``)
TRANSPORTS = ("tcp", "roce")
#: the entropy policies a job can choose (``--entropy``): the names of the transport's policy table
#: (``hpnlab.fabric.transport.entropy.ENTROPY_POLICIES``, which holds one class per name)
ENTROPIES = ("flow", "ecmp", "flowlet", "spray", "adaptive", "reps")

#: where ranks sit on a fabric graph (see :func:`place`)
PLACEMENTS = ("cross-rail", "same-rail", "cross-plane", "cross-campus")


# ---- the job description ------------------------------------------------------------------

@dataclass(frozen=True)
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
    gap_s: float = 0.0              # pause before each iteration after the first (repeated short messages)
    after_s: float = 0.0            # start this long after the jobs start together (jobs in phases)
    hold: bool = False              # once up, wait for the launcher's "go" on stdin (concurrent jobs start together)

    @property
    def nranks(self) -> int:
        return len(self.addrs)

    def rank_line_rate_bps(self, rank: int = 0) -> float:
        """Line rate of one rank: its NIC ports' rate times the ports it uses."""
        return self.line_rate_bps * len(self.addrs[rank])

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Job:
        return cls(**json.loads(text))

    def where(self, rank: int) -> str:
        """How messages name a rank: ``rank 2 (h5 10.0.0.9+10.128.0.9)``."""
        label = self.labels[rank] if self.labels else None
        addr = "+".join(self.addrs[rank])
        return f"rank {rank} ({label} {addr})" if label else f"rank {rank} ({addr})"


def validate(job: Job, ranks_here: int | None = None, mem_available_bytes: int | None = None) -> None:
    """Check a job before anything starts; a mistake raises one UserError line.

    ``ranks_here``: how many of its ranks share this machine's memory (default: all);
    ``mem_available_bytes``: the memory they may use (default: this machine's MemAvailable).
    """
    name = col.canonical(job.collective)
    n = job.nranks
    if n < 2:
        raise UserError(f"{name} needs at least 2 ranks, got {n}")
    for a in (a for addrs in job.addrs for a in addrs):
        try:
            ip_int(a)        # a dotted quad (``127.0.0.300`` and ``10.1`` are not)
        except ValueError:
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
    if not job.gap_s >= 0:
        raise UserError(f"a job's gap between iterations must be 0 s or more, got {job.gap_s}")
    if not job.after_s >= 0:
        raise UserError(f"a job's start delay must be 0 s or more, got {job.after_s}")
    for size in job.sizes:
        col.build(name, n, size, root=job.root, perm=tuple(job.perm) if job.perm else None)
    if not 0 <= job.root < n:
        raise UserError(f"root {job.root} is not a rank (0..{n - 1})")
    if job.transport not in TRANSPORTS:
        raise UserError(f"unknown transport {job.transport!r} (known: {', '.join(TRANSPORTS)})")
    if job.entropy not in ENTROPIES:
        raise UserError(f"unknown entropy {job.entropy!r} (known: {', '.join(ENTROPIES)})")
    need = col.memory_per_rank_bytes(name, n, max(job.sizes))
    if job.transport == "roce":
        need += 2 * col.fit_count(name, n, max(job.sizes)) * col.ELEM_BYTES
    avail = mem_available() if mem_available_bytes is None else mem_available_bytes
    here = ranks_here if ranks_here is not None else n
    if avail and need * here > 0.8 * avail:
        raise UserError(f"size {max(job.sizes)} B does not fit: {here} ranks on this machine need about "
                        f"{need * here / 2**20:.0f} MiB, {avail / 2**20:.0f} MiB are available (lower -e)")


def mem_available() -> int:
    """This machine's MemAvailable in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---- placement on a fabric graph ------------------------------------------------------------

@dataclass(frozen=True)
class Placed:
    """One rank on the fabric: its host, the NIC (rail) it uses, and that NIC's address on
    every plane it uses (plane order)."""
    host: str
    rail: int
    addrs: list
    planes: list


def place(g: nx.MultiGraph, placement: str = "cross-rail", nranks: int | None = None,
          jobs: int = 1) -> list[list[Placed]]:
    """Choose each job's ranks on the fabric graph: one rank per NIC (rail) of a host, using
    that NIC's port on every plane (``hpnlab.fabric.scenario.graph.host_ports``). Jobs get disjoint hosts.

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
    by_segment: dict[Any, list[str]] = {}
    for h in hosts:
        d = g.nodes[h]
        by_segment.setdefault((d["campus"], d["pod"], d["segment"]), []).append(h)
    if placement == "same-rail":
        segs = list(by_segment.values())
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
        groups = [[h for h in hosts if g.nodes[h]["campus"] == c] for c in range(s.campuses)]
    else:
        groups = list(by_segment.values())
    order = [h for tup in zip(*groups, strict=False) for h in tup]
    usable = len(order) if jobs == 1 else sum(len(gr) for gr in groups)
    per_job = nranks or usable // jobs
    if per_job < 2:
        raise UserError(f"{placement}: {usable} hosts cannot give {jobs} jobs of at least 2 ranks")
    if per_job * jobs > usable:
        raise UserError(f"{placement}: {jobs} job(s) of {per_job} ranks need {per_job * jobs} hosts, "
                        f"the scenario has {usable} usable")
    chosen = [order[:per_job]] if jobs == 1 else deal(groups, jobs, per_job)
    out = []
    for j in range(jobs):
        mine = chosen[j]
        planes = [j % s.planes] if placement == "cross-plane" else all_planes
        out.append([rank_on(h, (i % s.rails) if placement != "cross-campus" else 0, planes)
                    for i, h in enumerate(mine)])
    return out


def deal(groups: list[list[str]], jobs: int, per_job: int) -> list[list[str]]:
    """Disjoint hosts for ``jobs`` jobs of ``per_job`` ranks, each job's rank i from group i mod
    len(groups) (the next group with a host left when that one has none), the jobs taking turns
    rank by rank (pure). So every job spans every group (segment or campus) as one job does, and
    concurrent jobs share the fabric's leaves and uplinks, as jobs of a cluster do: the jobs
    dealt every ``jobs``-th host of the round-robin order instead (before) sat on disjoint
    segments whenever the segment count was a multiple of ``jobs`` (2 jobs on mini-hpn's 4
    segments: no switch port in common), and 2 cross-campus jobs each on one campus."""
    free = [list(gr) for gr in groups]
    out: list[list[str]] = [[] for _ in range(jobs)]
    for i in range(per_job):
        for j in range(jobs):
            # place() checked that the groups hold jobs * per_job hosts: one is always left
            group = next(gr for k in range(len(free)) if (gr := free[(i + k) % len(free)]))
            out[j].append(group.pop(0))
    return out
