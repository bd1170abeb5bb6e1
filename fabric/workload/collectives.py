"""Collective communication schedules: who sends which bytes to whom at every step.

Pure (standard library + numpy). A :class:`Schedule` is plain data that a rank worker
executes step by step over a transport (``hpnlab.fabric.transport``); the same schedule can be
interpreted here without a network (:func:`simulate`), which is how the tests check every
schedule against the definition of its collective (:func:`reference`).

Buffers
    Every rank has an *input* buffer (``in_count`` elements) and a *work* buffer
    (``out_count`` elements) where the algorithm runs and the result is left
    (:meth:`Schedule.result_slice`). The *prologue* copies input into the work buffer
    (out-of-place). In-place runs alias the input to a slice of the work buffer
    (:meth:`Schedule.inplace_offset`) and skip the prologue, as nccl-tests' in-place
    columns do. Elements are ``int32`` and the reduction is ``sum`` (exact in any order,
    so receivers can check every element; nccl-tests' default is float sum).

Collectives (``n`` ranks, ``count`` elements of the nccl-tests "size")
    all_reduce       ring: reduce-scatter then all-gather, 2(n-1) steps of count/n
    all_reduce_hd    halving-doubling (Rabenseifner): recursive-halving reduce-scatter then
                     recursive-doubling all-gather, 2 log2(n) steps; n must be a power of two
    all_gather       ring, n-1 steps; every rank contributes count/n
    reduce_scatter   ring, n-1 steps; rank r ends with the sum of chunk r
    all_to_all       one step, every pair at once (as NCCL groups its sends and receives);
                     chunk j of rank r lands in chunk r of rank j
    broadcast        pipelined chain from the root along the ring, count split in
                     4(n-1) pieces
    incast           N->1: every rank sends its count/n to the root at once (a gather); the
                     rank workers also time every message, from its sender's send start to
                     the root holding its last byte (``report.message_completions``)
    permutation      elephant flows: rank r sends its whole buffer to perm[r] (a derangement;
                     by default r -> r + n/2, which crosses the fabric's middle)

Bus bandwidth (nccl-tests, doc/PERFORMANCE.md): algbw = size / time with size the
"size" column (for all-gather, reduce-scatter, all-to-all and incast the whole array),
GB = 1e9 bytes, and busbw = algbw x factor (:func:`busbw_factor`).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from hpnlab.fabric.errors import UserError, short

ELEM_BYTES = 4
DTYPE = np.int32
TYPE_NAME = "int32"
REDOP = "sum"

COLLECTIVES = ("all_reduce", "all_reduce_hd", "all_gather", "reduce_scatter", "all_to_all",
               "broadcast", "incast", "permutation")
_ALIASES = {"allreduce": "all_reduce", "ring": "all_reduce", "all_reduce_ring": "all_reduce",
            "allreduce_hd": "all_reduce_hd", "halving_doubling": "all_reduce_hd",
            "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "alltoall": "all_to_all", "a2a": "all_to_all", "bcast": "broadcast",
            "gather": "incast", "perm": "permutation"}
#: collectives that reduce (print redop "sum"; others print "none" as nccl-tests does)
REDUCING = {"all_reduce", "all_reduce_hd", "reduce_scatter"}
#: collectives with a root (printed in the "root" column; -1 otherwise, as nccl-tests)
ROOTED = {"broadcast", "incast"}


class ScheduleError(UserError, ValueError):
    """A schedule that cannot be built for these numbers (message says why)."""


def canonical(name: str) -> str:
    """The collective's canonical name, accepting '-' for '_' and common aliases."""
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in COLLECTIVES:
        raise ScheduleError(f"unknown collective {name!r} (known: {', '.join(COLLECTIVES)})")
    return key


def busbw_factor(collective: str, n: int) -> float:
    """busbw / algbw, as nccl-tests defines it (doc/PERFORMANCE.md).

    all-reduce: 2(n-1)/n — every rank sends and receives 2(n-1)/n of the buffer, the
    minimum any all-reduce needs, so busbw is comparable to the link rate.
    all-gather, reduce-scatter, all-to-all: (n-1)/n of the (whole) buffer crosses each
    rank's link. incast is a gather (nccl-tests' gather_perf): (n-1)/n, the root's link
    carries that share of the array. broadcast: 1 (every byte crosses every link once;
    nccl-tests uses 1 for broadcast and reduce). permutation: 1 (nccl-tests' sendrecv).
    """
    c = canonical(collective)
    if n < 1:
        raise ScheduleError("need at least one rank")
    if c in ("all_reduce", "all_reduce_hd"):
        return 2.0 * (n - 1) / n
    if c in ("all_gather", "reduce_scatter", "all_to_all", "incast"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Transfer:
    """One message: ``nbytes`` from ``src``'s buffer at ``src_off`` to ``dst``'s work buffer
    at ``dst_off``; ``reduce`` adds it element-wise (sum) instead of overwriting."""
    src: int
    dst: int
    src_buf: str          # "in" or "work"
    src_off: int          # bytes
    dst_off: int          # bytes
    nbytes: int
    reduce: bool = False


@dataclass(frozen=True)
class Schedule:
    collective: str
    nranks: int
    count: int                 # elements of the nccl-tests "size" column
    in_count: int              # elements of each rank's input buffer
    out_count: int             # elements of each rank's work buffer
    root: int                  # -1 when the collective has no root
    param_count: int           # the nccl-tests "count" column
    steps: tuple               # tuple of tuples of Transfer
    prologue: tuple            # (rank, in_off, work_off, nbytes) local copies
    perm: tuple = ()           # permutation: destination of each rank
    _inplace: tuple = field(default=(), repr=False)   # per rank: offset of input in work, or None
    _result: tuple = field(default=(), repr=False)    # per rank: (offset, nbytes) in work

    @property
    def size_bytes(self) -> int:
        return self.count * ELEM_BYTES

    @property
    def busbw_factor(self) -> float:
        return busbw_factor(self.collective, self.nranks)

    @property
    def redop(self) -> str:
        return REDOP if self.collective in REDUCING else "none"

    def inplace_offset(self, rank: int) -> int | None:
        """Byte offset of the input inside the work buffer for an in-place run (None: no in-place form)."""
        return self._inplace[rank] if self._inplace else None

    @property
    def has_inplace(self) -> bool:
        return bool(self._inplace)

    def result_slice(self, rank: int) -> tuple[int, int]:
        """(byte offset, nbytes) of the rank's result inside its work buffer."""
        return self._result[rank]

    def transfers_of(self, rank: int, step: int) -> tuple[list[Transfer], list[Transfer]]:
        """(sends, receives) of ``rank`` at ``step``, in schedule order."""
        sends = [t for t in self.steps[step] if t.src == rank]
        recvs = [t for t in self.steps[step] if t.dst == rank]
        return sends, recvs

    def bytes_sent(self, rank: int) -> int:
        return sum(t.nbytes for step in self.steps for t in step if t.src == rank)


def _bounds(count: int, parts: int) -> list[int]:
    """Element boundaries splitting ``count`` into ``parts`` nearly equal chunks."""
    return [count * i // parts for i in range(parts + 1)]


def fit_count(collective: str, n: int, size_bytes: int) -> int:
    """Elements used for a requested size: rounded down as nccl-tests does (to a multiple
    of n for collectives that split the array in equal per-rank parts). 0 means too small."""
    c = canonical(collective)
    count = size_bytes // ELEM_BYTES
    if c in ("all_gather", "reduce_scatter", "all_to_all", "incast"):
        count = count // n * n
    return count


def default_perm(n: int) -> tuple[int, ...]:
    """r -> r + n/2 (mod n): every flow crosses to the other half of the ranks."""
    shift = max(1, n // 2)
    return tuple((r + shift) % n for r in range(n))


def random_perm(n: int, seed: int) -> tuple[int, ...]:
    """A random derangement (no rank sends to itself), reproducible from ``seed``."""
    rng = random.Random(seed)
    while True:
        p = list(range(n))
        rng.shuffle(p)
        if all(p[i] != i for i in range(n)):
            return tuple(p)


def build(collective: str, n: int, size_bytes: int, *, root: int = 0,
          perm: tuple[int, ...] | None = None) -> Schedule:
    """The schedule of ``collective`` over ``n`` ranks for a buffer of ``size_bytes``."""
    c = canonical(collective)
    if n < 2:
        raise ScheduleError(f"{c} needs at least 2 ranks, got {n}")
    count = fit_count(c, n, size_bytes)
    if count < n and c != "permutation":
        raise ScheduleError(f"size {size_bytes} B is too small for {c} over {n} ranks "
                            f"(at least {n * ELEM_BYTES} B)")
    if count < 1:
        raise ScheduleError(f"size {size_bytes} B is smaller than one {TYPE_NAME} element")
    if not 0 <= root < n:
        raise ScheduleError(f"root {root} is not a rank (0..{n - 1})")
    return _BUILDERS[c](n, count, root if c in ROOTED else -1, perm)


def _everyone(n: int, value) -> tuple:
    return tuple(value(r) if callable(value) else value for r in range(n))


def _ring_reduce_scatter(n: int, b: list[int]) -> list[tuple]:
    """n-1 steps; at step s rank r sends chunk (r-s-1) mod n to r+1, which adds it.
    Chunk c starts at rank c+1 and has visited every rank when it reaches rank c."""
    steps = []
    for s in range(n - 1):
        step = []
        for r in range(n):
            c = (r - s - 1) % n
            step.append(Transfer(r, (r + 1) % n, "work", b[c] * ELEM_BYTES, b[c] * ELEM_BYTES,
                                 (b[c + 1] - b[c]) * ELEM_BYTES, reduce=True))
        steps.append(tuple(step))
    return steps


def _ring_all_gather(n: int, b: list[int]) -> list[tuple]:
    """n-1 steps; rank r starts owning chunk r; at step s it forwards chunk (r-s) mod n to r+1."""
    steps = []
    for s in range(n - 1):
        step = []
        for r in range(n):
            c = (r - s) % n
            step.append(Transfer(r, (r + 1) % n, "work", b[c] * ELEM_BYTES, b[c] * ELEM_BYTES,
                                 (b[c + 1] - b[c]) * ELEM_BYTES))
        steps.append(tuple(step))
    return steps


def _copy_all(n: int, count: int) -> tuple:
    return tuple((r, 0, 0, count * ELEM_BYTES) for r in range(n))


def _all_reduce(n, count, root, perm):
    b = _bounds(count, n)
    steps = _ring_reduce_scatter(n, b) + _ring_all_gather(n, b)
    return Schedule("all_reduce", n, count, count, count, root, count, tuple(steps),
                    _copy_all(n, count), _inplace=_everyone(n, 0),
                    _result=_everyone(n, (0, count * ELEM_BYTES)))


def _all_reduce_hd(n, count, root, perm):
    if n & (n - 1):
        raise ScheduleError(f"halving-doubling all-reduce needs a power-of-two number of ranks, got {n}")
    k = n.bit_length() - 1
    b = _bounds(count, n)

    def span(lo: int, hi: int) -> tuple[int, int]:   # chunk range -> (byte offset, nbytes)
        return b[lo] * ELEM_BYTES, (b[hi] - b[lo]) * ELEM_BYTES

    owned = dict.fromkeys(range(n), (0, n))
    steps = []
    # recursive halving: distance n/2, n/4, ..., 1; the rank with the distance bit set keeps
    # the upper half, sends the lower half to its partner and adds the partner's upper half.
    for j in range(k):
        d = n >> (j + 1)
        step = []
        new = {}
        for r in range(n):
            lo, hi = owned[r]
            mid = (lo + hi) // 2
            keep, give = ((mid, hi), (lo, mid)) if r & d else ((lo, mid), (mid, hi))
            off, nb = span(*give)
            step.append(Transfer(r, r ^ d, "work", off, off, nb, reduce=True))
            new[r] = keep
        owned = new
        steps.append(tuple(step))
    # recursive doubling: distance 1, 2, ..., n/2; exchange owned ranges (copy).
    for j in range(k):
        d = 1 << j
        step = []
        for r in range(n):
            off, nb = span(*owned[r])
            step.append(Transfer(r, r ^ d, "work", off, off, nb))
        owned = {r: (min(owned[r][0], owned[r ^ d][0]), max(owned[r][1], owned[r ^ d][1]))
                 for r in range(n)}
        steps.append(tuple(step))
    return Schedule("all_reduce_hd", n, count, count, count, root, count, tuple(steps),
                    _copy_all(n, count), _inplace=_everyone(n, 0),
                    _result=_everyone(n, (0, count * ELEM_BYTES)))


def _all_gather(n, count, root, perm):
    per = count // n
    b = _bounds(count, n)
    prologue = tuple((r, 0, r * per * ELEM_BYTES, per * ELEM_BYTES) for r in range(n))
    return Schedule("all_gather", n, count, per, count, root, per, tuple(_ring_all_gather(n, b)),
                    prologue, _inplace=_everyone(n, lambda r: r * per * ELEM_BYTES),
                    _result=_everyone(n, (0, count * ELEM_BYTES)))


def _reduce_scatter(n, count, root, perm):
    per = count // n
    b = _bounds(count, n)
    return Schedule("reduce_scatter", n, count, count, count, root, per,
                    tuple(_ring_reduce_scatter(n, b)), _copy_all(n, count),
                    _inplace=_everyone(n, 0),
                    _result=_everyone(n, lambda r: (r * per * ELEM_BYTES, per * ELEM_BYTES)))


def _all_to_all(n, count, root, perm):
    per = count // n
    nb = per * ELEM_BYTES
    step = tuple(Transfer(r, j, "in", j * nb, r * nb, nb)
                 for r in range(n) for j in range(n) if j != r)
    prologue = tuple((r, r * nb, r * nb, nb) for r in range(n))
    return Schedule("all_to_all", n, count, count, count, root, per, (step,), prologue,
                    _result=_everyone(n, (0, count * ELEM_BYTES)))


def _broadcast(n, count, root, perm):
    pieces = min(count, 4 * (n - 1))
    b = _bounds(count, pieces)
    ring = [(root + i) % n for i in range(n)]
    steps = []
    for s in range(pieces + n - 2):
        step = []
        for i in range(n - 1):
            c = s - i
            if 0 <= c < pieces:
                off = b[c] * ELEM_BYTES
                step.append(Transfer(ring[i], ring[i + 1], "work", off, off,
                                     (b[c + 1] - b[c]) * ELEM_BYTES))
        steps.append(tuple(step))
    # only the root's input matters; the others' work buffers are overwritten
    return Schedule("broadcast", n, count, count, count, root, count, tuple(steps),
                    ((root, 0, 0, count * ELEM_BYTES),), _inplace=_everyone(n, 0),
                    _result=_everyone(n, (0, count * ELEM_BYTES)))


def _incast(n, count, root, perm):
    per = count // n
    nb = per * ELEM_BYTES
    step = tuple(Transfer(r, root, "in", 0, r * nb, nb) for r in range(n) if r != root)
    return Schedule("incast", n, count, per, count, root, per, (step,),
                    ((root, 0, root * nb, nb),),
                    _result=_everyone(n, lambda r: (0, count * ELEM_BYTES) if r == root else (0, 0)))


def _permutation(n, count, root, perm):
    p = tuple(perm) if perm is not None else default_perm(n)
    if sorted(p) != list(range(n)) or any(p[r] == r for r in range(n)):
        raise ScheduleError(f"permutation must send every rank to another rank exactly once, got {p}")
    nb = count * ELEM_BYTES
    step = tuple(Transfer(r, p[r], "in", 0, 0, nb) for r in range(n))
    return Schedule("permutation", n, count, count, count, root, count, (step,), (), perm=p,
                    _result=_everyone(n, (0, nb)))


_BUILDERS = {"all_reduce": _all_reduce, "all_reduce_hd": _all_reduce_hd, "all_gather": _all_gather,
             "reduce_scatter": _reduce_scatter, "all_to_all": _all_to_all, "broadcast": _broadcast,
             "incast": _incast, "permutation": _permutation}


# ---- data: inputs, the definition of each collective, and a network-free interpreter ----

def rank_input(rank: int, count: int, seed: int = 0) -> np.ndarray:
    """The deterministic input of a rank: small int32 values that differ by rank and index
    (so a misplaced chunk or a missed reduction changes the result)."""
    idx = np.arange(count, dtype=np.int64)
    return (((idx * 7919 + rank * 104729 + seed * 1299709) % 2001) - 1000).astype(DTYPE)


def reference(sched: Schedule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Each rank's result by the collective's definition (not by its schedule)."""
    n, c = sched.nranks, sched.collective
    if c in ("all_reduce", "all_reduce_hd"):
        total = np.sum(np.stack(inputs).astype(np.int64), axis=0).astype(DTYPE)
        return [total.copy() for _ in range(n)]
    if c == "reduce_scatter":
        total = np.sum(np.stack(inputs).astype(np.int64), axis=0).astype(DTYPE)
        per = sched.count // n
        return [total[r * per:(r + 1) * per].copy() for r in range(n)]
    if c == "all_gather":
        full = np.concatenate(inputs)
        return [full.copy() for _ in range(n)]
    if c == "all_to_all":
        per = sched.count // n
        return [np.concatenate([inputs[src][dst * per:(dst + 1) * per] for src in range(n)])
                for dst in range(n)]
    if c == "broadcast":
        return [inputs[sched.root].copy() for _ in range(n)]
    if c == "incast":
        return [np.concatenate(inputs) if r == sched.root else np.zeros(0, DTYPE) for r in range(n)]
    if c == "permutation":
        inv = {d: s for s, d in enumerate(sched.perm)}
        return [inputs[inv[r]].copy() for r in range(n)]
    raise ScheduleError(f"no reference for {c}")


def apply_prologue(sched: Schedule, rank: int, inp: np.ndarray, work: np.ndarray) -> None:
    wb, ib = work.view(np.uint8), inp.view(np.uint8)
    for r, in_off, work_off, nbytes in sched.prologue:
        if r == rank:
            wb[work_off:work_off + nbytes] = ib[in_off:in_off + nbytes]


def deliver(work: np.ndarray, t: Transfer, payload) -> None:
    """Apply a received message to the work buffer (copy, or int32 sum for reductions)."""
    if t.reduce:
        lo, hi = t.dst_off // ELEM_BYTES, (t.dst_off + t.nbytes) // ELEM_BYTES
        work[lo:hi] += np.frombuffer(payload, dtype=DTYPE, count=hi - lo)
    else:
        work.view(np.uint8)[t.dst_off:t.dst_off + t.nbytes] = np.frombuffer(payload, np.uint8, t.nbytes)


def source_bytes(t: Transfer, inp: np.ndarray, work: np.ndarray) -> memoryview:
    buf = inp if t.src_buf == "in" else work
    return memoryview(buf.view(np.uint8).data)[t.src_off:t.src_off + t.nbytes]


def simulate(sched: Schedule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run the schedule without a network: every step's sends read the state before the
    step (as concurrent sends do), then receives are applied. Returns each rank's result."""
    n = sched.nranks
    works = [np.zeros(sched.out_count, DTYPE) for _ in range(n)]
    for r in range(n):
        apply_prologue(sched, r, inputs[r], works[r])
    for step in sched.steps:
        payloads = [bytes(source_bytes(t, inputs[t.src], works[t.src])) for t in step]
        for t, data in zip(step, payloads, strict=False):
            deliver(works[t.dst], t, data)
    out = []
    for r in range(n):
        off, nb = sched.result_slice(r)
        out.append(works[r].view(np.uint8)[off:off + nb].view(DTYPE).copy())
    return out


def sweep(min_bytes: int, max_bytes: int, factor: float = 2.0, step_bytes: int = 0) -> list[int]:
    """Sizes like nccl-tests -b/-e/-f (or -i for a fixed increment)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ScheduleError(f"sizes: need 1 <= -b ({min_bytes}) <= -e ({max_bytes})")
    sizes = []
    size = min_bytes
    if step_bytes:
        while size <= max_bytes:
            sizes.append(size)
            size += step_bytes
        return sizes
    if factor <= 1:
        raise ScheduleError(f"-f must be greater than 1, got {factor:g}")
    while size <= max_bytes:
        sizes.append(int(size))
        size = int(size * factor)
    return sizes


def parse_size(text: str) -> int:
    """'64', '64K', '1M', '2G' (powers of 1024, as nccl-tests) -> bytes."""
    t = str(text).strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    num = t[:-1] if mult > 1 else t
    try:
        value = float(num)
    except ValueError:
        raise ScheduleError(f"not a size: {short(text)} (examples: 4096, 64K, 1M)") from None
    if not math.isfinite(value):
        raise ScheduleError(f"not a size: {short(text)} (examples: 4096, 64K, 1M)")
    if value < 0:
        raise ScheduleError(f"size must not be negative: {text!r}")
    return int(value * mult)


def expected_for(sched: Schedule, rank: int, seed: int = 0) -> np.ndarray:
    """One rank's correct result, generating the other ranks' inputs one at a time (memory
    of two buffers, not n): what a rank worker checks its received data against."""
    n, c = sched.nranks, sched.collective

    def inp(r: int) -> np.ndarray:
        return rank_input(r, sched.in_count, seed)

    if c in ("all_reduce", "all_reduce_hd", "reduce_scatter"):
        total = np.zeros(sched.in_count, np.int64)
        for r in range(n):
            total += inp(r)
        out = total.astype(DTYPE)
        if c == "reduce_scatter":
            per = sched.count // n
            out = out[rank * per:(rank + 1) * per].copy()
        return out
    if c == "all_gather":
        return np.concatenate([inp(r) for r in range(n)])
    if c == "all_to_all":
        per = sched.count // n
        return np.concatenate([inp(src)[rank * per:(rank + 1) * per] for src in range(n)])
    if c == "broadcast":
        return inp(sched.root)
    if c == "incast":
        return np.concatenate([inp(r) for r in range(n)]) if rank == sched.root else np.zeros(0, DTYPE)
    if c == "permutation":
        return inp(sched.perm.index(rank))
    raise ScheduleError(f"no reference for {c}")


def memory_per_rank_bytes(collective: str, n: int, size_bytes: int) -> int:
    """What a rank worker holds for one size: input, work buffer, expected result, the
    transport's reassembly copies of one step's messages, and numpy temporaries (x2)."""
    count = max(1, fit_count(collective, n, size_bytes))
    return 6 * count * ELEM_BYTES + (8 << 20)
