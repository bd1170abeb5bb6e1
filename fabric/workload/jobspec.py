"""Several different jobs at once: the ``--jobs`` syntax, as plain data.

Pure (standard library and the collective schedules). ``hpnlab run --jobs SPEC`` runs one job
per ``;``-separated item, concurrently, on disjoint hosts of one emulation
(``hpnlab.fabric.experiments.runner.Plan(job_specs=...)``)::

    all_reduce:ranks=4,size=4M;incast:ranks=5,msg=16K,iters=20,gap=20ms

Each item is ``COLLECTIVE[:key=value,...]``; keys (all optional):

    ranks    ranks of this job (default: the plan's --ranks)
    size     the nccl-tests size of every iteration (default: the plan's sizes); a list as
             ``size=64K/1M``
    msg      incast only: bytes each sender sends to the root (size = msg x ranks), the
             figure an incast is usually described by
    iters    timed iterations (default: the plan's -n)
    warmup   warm-up iterations (default: the plan's -w)
    gap      pause before each iteration after the first (``20ms``, ``0.5s``; a bare number
             is milliseconds): repeated short messages rather than back-to-back ones
    root     the root rank of rooted collectives (default 0)
    after    start this long after the jobs start together (``2s``, ``500ms``; default 0): jobs in
             phases on the same ports (elephants, then short messages, then both)
    on       run on the hosts of an earlier job (``on=1``: rank r on job 1's rank r's host), sharing
             their NICs, as a training job's data-parallel elephants and its pipeline or expert
             messages share them; at most as many ranks as that job. Without it jobs get disjoint hosts

A mistake gives one line naming the job and the key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.workload import collectives as col

KEYS = ("ranks", "size", "msg", "iters", "warmup", "gap", "root", "on", "after")


@dataclass(frozen=True)
class JobSpec:
    """One job of a mix; None means "the plan's value"."""
    collective: str
    ranks: int | None = None
    sizes: tuple[int, ...] | None = None
    msg_bytes: int | None = None
    iterations: int | None = None
    warmup: int | None = None
    gap_s: float = 0.0
    root: int = 0
    on: int | None = None        # 0-based index of the earlier job whose hosts this one shares
    after_s: float = 0.0         # start this long after the jobs start together

    def sizes_for(self, nranks: int, default: tuple[int, ...]) -> tuple[int, ...]:
        """The nccl-tests sizes this job runs with ``nranks`` ranks."""
        if self.msg_bytes is not None:
            return (self.msg_bytes * nranks,)
        return self.sizes if self.sizes is not None else default

    def describe(self) -> str:
        parts = []
        if self.ranks is not None:
            parts.append(f"ranks={self.ranks}")
        if self.msg_bytes is not None:
            parts.append(f"msg={self.msg_bytes}")
        elif self.sizes is not None:
            parts.append("size=" + "/".join(str(s) for s in self.sizes))
        if self.iterations is not None:
            parts.append(f"iters={self.iterations}")
        if self.warmup is not None:
            parts.append(f"warmup={self.warmup}")
        if self.gap_s:
            parts.append(f"gap={self.gap_s * 1e3:g}ms")
        if self.root:
            parts.append(f"root={self.root}")
        if self.on is not None:
            parts.append(f"on={self.on + 1}")
        if self.after_s:
            parts.append(f"after={self.after_s * 1e3:g}ms")
        return self.collective + (":" + ",".join(parts) if parts else "")


def _duration_s(text: str) -> float:
    t = text.strip().lower()
    if t.endswith("ms"):
        num, scale = t[:-2], 1e-3
    elif t.endswith("us"):
        num, scale = t[:-2], 1e-6
    elif t.endswith("s"):
        num, scale = t[:-1], 1.0
    else:
        num, scale = t, 1e-3
    value = float(num) * scale
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


def _int(text: str, low: int) -> int:
    value = int(text.strip())
    if value < low:
        raise ValueError(text)
    return value


def parse_one(item: str, index: int = 1) -> JobSpec:
    """One ``COLLECTIVE[:key=value,...]`` item (``index`` numbers it in messages, from 1)."""
    where = f"--jobs: job {index} ({item.strip()!r})"
    name, _, rest = item.strip().partition(":")
    if not name.strip():
        raise UserError(f"{where}: no collective before ':' (known: {', '.join(col.COLLECTIVES)})")
    try:
        collective = col.canonical(name)
    except col.ScheduleError:
        raise UserError(f"{where}: unknown collective {name.strip()!r} (known: {', '.join(col.COLLECTIVES)})") from None
    fields: dict[str, Any] = {}
    for pair in (p for p in rest.split(",") if p.strip()):
        key, eq, value = pair.partition("=")
        key = key.strip().lower()
        if not eq or not value.strip():
            raise UserError(f"{where}: {pair.strip()!r} is not key=value (keys: {', '.join(KEYS)})")
        if key not in KEYS:
            raise UserError(f"{where}: unknown key {key!r} (keys: {', '.join(KEYS)})")
        if key in fields:
            raise UserError(f"{where}: {key} given twice")
        try:
            if key == "ranks":
                fields[key] = _int(value, 2)
            elif key in ("iters", "on"):
                fields[key] = _int(value, 1)
            elif key in ("warmup", "root"):
                fields[key] = _int(value, 0)
            elif key in ("gap", "after"):
                fields[key] = _duration_s(value)
            else:
                sizes = tuple(col.parse_size(v) for v in value.split("/"))
                if any(s < 1 for s in sizes):
                    raise ValueError(value)
                fields[key] = sizes
        except (ValueError, col.ScheduleError):
            want = {"ranks": "a whole number of at least 2", "iters": "a whole number of at least 1",
                    "warmup": "a whole number of 0 or more", "root": "a whole number of 0 or more",
                    "gap": "a duration (20ms, 0.5s)", "after": "a duration (2s, 500ms)",
                    "size": "sizes in bytes (64K, 1M, 64K/1M)",
                    "msg": "a size in bytes (16K)",
                    "on": "the number of an earlier job (1 for the first)"}[key]
            raise UserError(f"{where}: {key}={value.strip()!r} is not {want}") from None
    if "msg" in fields:
        if collective != "incast":
            raise UserError(f"{where}: msg= is the incast's per-sender message size; use size= for {collective}")
        if "size" in fields:
            raise UserError(f"{where}: give size= or msg=, not both")
        if len(fields["msg"]) != 1:
            raise UserError(f"{where}: msg= takes one size")
    on = fields.get("on")
    ranks = fields.get("ranks")
    root = fields.get("root", 0)
    if ranks is not None and root >= ranks:
        raise UserError(f"{where}: root {root} is not a rank (0..{ranks - 1})")
    return JobSpec(collective, ranks=ranks, sizes=fields.get("size"),
                   msg_bytes=fields["msg"][0] if "msg" in fields else None,
                   iterations=fields.get("iters"), warmup=fields.get("warmup"),
                   gap_s=fields.get("gap", 0.0), root=root, on=None if on is None else on - 1,
                   after_s=fields.get("after", 0.0))


def parse(text: str) -> tuple[JobSpec, ...]:
    """Every job of a ``--jobs`` value (``;``-separated items)."""
    items = [i for i in str(text).split(";") if i.strip()]
    if not items:
        raise UserError("--jobs: no job given (example: all_reduce:ranks=4,size=1M;incast:ranks=5,msg=16K)")
    specs = tuple(parse_one(item, k + 1) for k, item in enumerate(items))
    check_on(specs)
    return specs


def check_on(specs: tuple[JobSpec, ...]) -> None:
    """Every ``on=`` names an earlier job that has hosts of its own (a mistake: one line naming the job)."""
    for k, spec in enumerate(specs):
        if spec.on is None:
            continue
        where = f"--jobs: job {k + 1} ({spec.describe()})"
        if not 0 <= spec.on < k:
            raise UserError(f"{where}: on={spec.on + 1} must name an earlier job (1..{k})" if k
                            else f"{where}: on= names an earlier job; the first job has none")
        further = specs[spec.on].on
        if further is not None:
            raise UserError(f"{where}: job {spec.on + 1} runs on job {further + 1}'s hosts itself; "
                            f"name job {further + 1}")


def host_job(specs: tuple[JobSpec, ...], job: int) -> int:
    """The job whose placed hosts job ``job`` runs on (itself unless it has ``on=``)."""
    on = specs[job].on if specs else None
    return job if on is None else on


def is_count(text: str) -> bool:
    """Whether a ``--jobs`` value is the old form: a number of identical concurrent jobs."""
    return str(text).strip().isdigit()


def label(specs: tuple[JobSpec, ...]) -> str:
    """The name of a mix in tables: its collectives joined by '+'."""
    return "+".join(s.collective for s in specs)
