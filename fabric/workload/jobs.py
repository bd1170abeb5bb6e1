"""Collective jobs as plain data: what a job is and whether it is valid.

Standard library and the collective schedules only (no fabric graph, no networkx): every rank
process imports this module, so what it costs to import, every rank pays at its start.
``hpnlab.fabric.transport.ranks`` runs the jobs described here; ``hpnlab.fabric.workload.placement``
places their ranks on a fabric graph; ``hpnlab.fabric.experiments.runner`` builds them from a plan.

:class:`Job`
    everything one rank process needs (it travels as JSON on the worker's command line).
:func:`validate`
    a mistake the user can make in a job, as one ``UserError`` line, before anything starts.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario.addressing import ip_int
from hpnlab.fabric.workload import collectives as col

#: the transports a job can run on (``hpnlab.fabric.transport.make``)
TRANSPORTS = ("tcp", "roce")
#: the entropy policies a job can choose (``--entropy``): the names of the transport's policy table
#: (``hpnlab.fabric.transport.entropy.ENTROPY_POLICIES``, which holds one class per name)
ENTROPIES = ("flow", "ecmp", "flowlet", "spray", "adaptive", "reps")


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
