"""What the fluid model leaves out of a synchronous step, added back mechanism by mechanism.

Pure. The flow model (``hpnlab.fabric.model.flow``) is a fluid, work-conserving model: every
flow starts at its fair rate, links drain the bytes routed over them at full capacity, nothing
is lost, a step ends when its busiest link has drained plus the longest path's one-way
latency. A packet-level transport (UEC's htsim: NSCC, packet trimming, switch queues of one
bandwidth-delay product) pays for more. Each term below is one mechanism, computed from the
transport's configuration (:class:`Transport`) and the step as the model routed it
(:class:`StepShape`), in this order:

``wire``    headers: every MSS of payload travels in an MTU on the wire (``mtu / (mtu - header)``).
``tail``    the last packet's round trip, measured from the moment the sender has serialised
            it: its one-way latency (the model's, propagation and switch latency), the
            store-and-forward serialisation of one MTU at every switch of the path (the
            packets ahead of it are full-sized), and the acknowledgement's return (the same
            propagation, an ACK's serialisation per hop). It replaces the model's one-way latency.
``overflow`` (lossy fabrics only) the first window's overflow: every flow opens with its whole
            window (``window_bdp`` bandwidth-delay products, or its size if smaller) at line
            rate; where ``fan_in`` flows' first windows meet on one link, the link forwards one
            window's worth while they arrive and its queue (``queue_bdp`` BDPs) holds the rest up
            to its size: the excess is trimmed and sent again, and the re-sent bytes cross the
            busiest link once more. Zero on a lossless fabric (PFC pauses instead of dropping)
            and where the flows are sprayed evenly (fan-in at most one flow's worth).
Per load-balancing policy (:class:`Policy`, fitted against the peer):
``start``   a fixed delay per step, in base RTTs (the barrier's wait for the slowest flow; the
            htsim fit leaves it at 0: the burst's spread, which grows with the window and the
            fabric, accounts for that wait better);
``burst``   the first window's queueing: every flow sends min(size, window) at once, spread at
            random over the step's links (hashed values, sprayed packets); the busiest of L links
            holds about sqrt(2 ln L x the window's packets) packets more than the mean (balls into
            bins), so the step waits ``burst`` times that many packet serialisations -- more on a
            larger fabric;
``efficiency`` the steady state: congestion control holds the busiest link at this share of
            its rate (the sprayed modes' reordering, ECN marks and window cap), the drain divided by it;
``resend``  how much of the re-sent bytes' serialisation the step pays (1: they cross the busiest
            link once more; less where the link stays busy while they are re-sent, more where
            congestion control backs off after the loss).

How the bytes of a flow are spread (which links, which fan-in) is the model's routing, chosen
per mode by the caller (``hpnlab.fabric.experiments.htsim``: per-flow hashing, N hashed entropy
values in equal shares, or the even split the adaptive modes tend to). The constants of a
:class:`Policy` are fitted by :func:`fit` on named cells (``htsim.FIT_CELLS``) and reported on
others (``htsim.VALIDATION_CELLS``); the rest (wire, tail, overflow) come from the transport's
configuration alone.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from hpnlab.fabric.errors import UserError

PER_FLOW = ("ecmp", "flow", "flowlet")
SPRAYED = ("spray", "adaptive")


@dataclass(frozen=True)
class Transport:
    """The packet-level peer's transport and switches: what the mechanisms are computed from.
    Defaults: htsim_uec's (40ccb05) on a 100 Gbit/s fabric, 1 us per hop."""
    rate_gbps: float = 100.0
    mtu_bytes: int = 4150          # a data packet on the wire, headers included
    header_bytes: int = 64
    ack_bytes: int = 64
    window_bdp: float = 1.5        # NSCC's initial (and largest) window
    queue_bdp: float = 1.0         # a switch queue with trimming: one BDP
    base_rtt_us: float = 14.02     # the fabric's largest unloaded RTT (htsim's network_max_unloaded_rtt)
    lossless: bool = False         # PFC: nothing is dropped or trimmed, nothing is sent again

    def __post_init__(self) -> None:
        if self.rate_gbps <= 0 or self.mtu_bytes <= self.header_bytes or self.base_rtt_us < 0:
            raise UserError("corrections: a transport needs a positive rate, an MTU above its header and an RTT >= 0")

    @property
    def rate_bps(self) -> float:
        return self.rate_gbps * 1e9

    @property
    def bdp_bytes(self) -> float:
        return self.base_rtt_us * 1e-6 * self.rate_bps / 8

    @property
    def wire(self) -> float:
        """Bytes on the wire per byte of payload."""
        return self.mtu_bytes / (self.mtu_bytes - self.header_bytes)

    def tail_s(self, latency_s: float, hops: int) -> float:
        """The last packet's round trip after its first serialisation (see ``tail``)."""
        if hops <= 0:
            return 2 * latency_s
        return 2 * latency_s + ((hops - 1) * self.mtu_bytes + hops * self.ack_bytes) * 8 / self.rate_bps

    def overflow_bytes(self, fan_in: float, flow_bytes: float) -> float:
        """Bytes trimmed and sent again at a link where ``fan_in`` flows' first windows meet."""
        if self.lossless or fan_in <= 1:
            return 0.0
        first = min(flow_bytes * self.wire, self.window_bdp * self.bdp_bytes)
        return max(0.0, (fan_in - 1) * first - self.queue_bdp * self.bdp_bytes)


@dataclass(frozen=True)
class Policy:
    """A load-balancing mode's congestion costs (see the module's text), fitted against the peer."""
    start_rtts: float = 0.0
    burst: float = 0.0
    efficiency: float = 1.0
    resend: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.efficiency <= 1.5 or self.start_rtts < -5 or self.burst < -1 or not -1 <= self.resend <= 10:
            raise UserError(f"corrections: implausible policy constants {self}")


@dataclass(frozen=True)
class StepShape:
    """One synchronous step as the model routed it: its fluid drain (the busiest link's bytes over
    its rate, payload only), the longest path's one-way latency and links, the bytes of its
    largest flow and how many flows' worth meet on its busiest link."""
    drain_s: float
    latency_s: float
    hops: int
    flow_bytes: float
    fan_in: float = 1.0
    links: int = 2           # links the step's traffic crosses


@dataclass(frozen=True)
class Corrections:
    """A transport and the policies of its load-balancing modes; ``source`` says where they were measured."""
    transport: Transport = field(default_factory=Transport)
    policies: dict[str, Policy] = field(default_factory=dict)     # mode -> constants
    routing_policy: dict[str, str] = field(default_factory=dict)  # the model's routing -> the mode it stands for
    source: str = "none: the uncorrected model"
    fitted_on: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fitted_on"] = list(self.fitted_on)
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Corrections:
        try:
            return cls(transport=Transport(**doc["transport"]),
                       policies={k: Policy(**v) for k, v in doc["policies"].items()},
                       routing_policy=dict(doc.get("routing_policy", {})), source=str(doc.get("source", "")),
                       fitted_on=tuple(doc.get("fitted_on", ())))
        except (KeyError, TypeError) as exc:
            raise UserError(f"corrections: not a corrections document ({type(exc).__name__}: {exc})") from None

    def policy(self, mode: str) -> Policy:
        return self.policies.get(self.routing_policy.get(mode, mode), Policy())


def step_time(shape: StepShape, c: Corrections, mode: str) -> float:
    """One step's corrected time (seconds); the model's own time is ``drain_s + latency_s``."""
    if math.isinf(shape.drain_s):
        return math.inf
    return sum(terms(shape, c, mode).values())


def terms(shape: StepShape, c: Corrections, mode: str) -> dict[str, float]:
    """Each mechanism's share of a corrected step (seconds), for reports: what each adds."""
    t, p = c.transport, c.policy(mode)
    x = columns(shape, t)
    return {"drain": shape.drain_s, "wire": shape.drain_s * (t.wire - 1), "tail": x["tail"],
            "start": p.start_rtts * x["start"], "burst": p.burst * x["burst"],
            "congestion": x["steady"] * (1 / p.efficiency - 1), "resend": p.resend * x["resend"]}


def columns(shape: StepShape, t: Transport) -> dict[str, float]:
    """The step's time per unit of each policy constant (seconds): the corrected time is
    ``tail + start_rtts * start + burst * burst + steady / efficiency + resend * resend``."""
    if math.isinf(shape.drain_s):
        return {"tail": math.inf, "start": 0.0, "burst": 0.0, "steady": math.inf, "resend": 0.0}
    first = min(shape.flow_bytes * t.wire, t.window_bdp * t.bdp_bytes)
    return {"tail": t.tail_s(shape.latency_s, shape.hops), "start": t.base_rtt_us * 1e-6,
            "burst": math.sqrt(2 * math.log(max(shape.links, 2)) * first / t.mtu_bytes) * t.mtu_bytes * 8 / t.rate_bps,
            "steady": shape.drain_s * t.wire,
            "resend": t.overflow_bytes(shape.fan_in, shape.flow_bytes) * 8 / t.rate_bps}


NONE = Corrections()

#: htsim's modes and the model routings they stand for in ``hpnlab model``: per-flow hashing is
#: ECMP; the model's perfectly even spraying and its adaptive routing are htsim's default (mixed:
#: REPS' recycling with the bitmap's skipping of marked values)
CLI_ROUTING_POLICY = {"ecmp": "ecmp", "flow": "ecmp", "flowlet": "ecmp", "spray": "mixed", "adaptive": "mixed"}

#: fitted by ``tools/bench/bench_htsim.py --fit`` on ``htsim.FIT_CELLS`` only, reported on the disjoint
#: ``htsim.VALIDATION_CELLS`` and on ``htsim.HOLDOUT_CELLS``, named after these were frozen
#: (docs/results/2026-12-07-model-vs-htsim-holdout.md: 26 of 28 holdout cells within 10%). Per mode
#: its burst and efficiency; ECMP's burst, efficiency and the share of its re-sent bytes' serialisation
#: it pays; the start of a step is fitted nowhere (the burst's spread stands for the barrier's wait).
HTSIM_100G = Corrections(
    transport=Transport(base_rtt_us=14.02272),
    policies={
        "oblivious": Policy(burst=0.3095, efficiency=0.9425, resend=1.0),
        "mixed": Policy(burst=0.7335, efficiency=0.895, resend=1.0),
        "bitmap": Policy(burst=0.7174, efficiency=0.8825, resend=1.0),
        "reps": Policy(burst=0.5078, efficiency=0.7596, resend=1.0),
        "reps_legacy": Policy(burst=0.5805, efficiency=0.8232, resend=1.0),
        "ar": Policy(burst=0.437, efficiency=0.9351, resend=1.0),
        "ecmp": Policy(burst=0.0, efficiency=0.9546, resend=0.5529),
    },
    routing_policy=CLI_ROUTING_POLICY,
    source=("fitted by tools/bench/bench_htsim.py --fit on the 22 cells of htsim.FIT_CELLS (128 hosts: 1 MB and 4 MB "
            "permutations, the 64 kB all-to-all, every mode; ECMP also a 2 MB permutation); htsim 40ccb05, its "
            "defaults (NSCC, trimming, 100 Gbit/s fat-tree); docs/results/2026-12-07-model-vs-htsim.md"),
    fitted_on=("k8-perm-1M-ecmp", "k8-perm-1M-oblivious", "k8-perm-1M-mixed", "k8-perm-1M-bitmap", "k8-perm-1M-reps",
               "k8-perm-1M-reps_legacy", "k8-perm-1M-ar", "k8-perm-4M-ecmp", "k8-perm-4M-oblivious",
               "k8-perm-4M-mixed", "k8-perm-4M-bitmap", "k8-perm-4M-reps", "k8-perm-4M-reps_legacy", "k8-perm-4M-ar",
               "k8-a2a-64k-ecmp", "k8-a2a-64k-oblivious", "k8-a2a-64k-mixed", "k8-a2a-64k-bitmap", "k8-a2a-64k-reps",
               "k8-a2a-64k-reps_legacy", "k8-a2a-64k-ar", "k8-perm-2M-ecmp"),
)

#: the corrections ``hpnlab model --corrections`` offers, by name (``-lossless``: the same on a fabric
#: with PFC, where nothing is trimmed or dropped and nothing is sent again)
PRESETS: dict[str, Corrections] = {
    "htsim-100g": HTSIM_100G,
    "htsim-100g-lossless": replace(HTSIM_100G, transport=replace(HTSIM_100G.transport, lossless=True),
                                   source=HTSIM_100G.source + "; lossless: nothing re-sent"),
    "none": NONE,
}
#: the default of ``hpnlab model``: the only constants measured against a packet-level peer
DEFAULT_PRESET = "htsim-100g"


def preset(name: str) -> Corrections:
    """The named corrections (:data:`PRESETS`); bad names are one line."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"--corrections: choose from {', '.join(PRESETS)}, got {name!r}") from None


def routing_kind(routing: str) -> str:
    if routing in PER_FLOW:
        return "per_flow"
    if routing in SPRAYED:
        return "sprayed"
    raise UserError(f"corrections: unknown routing {routing!r}")


def shape_of(step: Any, switch_latency_s: float = 0.0) -> StepShape:
    """A model step (``flow.StepResult``) as a :class:`StepShape`: its drain (time less latency),
    latency, hops, the bytes of one connection (its bytes over its connections) and the fan-in
    at its busiest link."""
    flows = max(1, int(step.flows))
    return StepShape(drain_s=max(0.0, step.time_s - step.latency_s), latency_s=step.latency_s,
                     hops=int(getattr(step, "hops", 0)), flow_bytes=float(step.bytes) / flows,
                     fan_in=float(getattr(step, "fan_in", 1.0)), links=int(getattr(step, "links", 2)))


def correct_result(result: Any, c: Corrections) -> dict[str, Any]:
    """A ``flow.ModelResult`` corrected step by step (each distinct step counted its multiplicity
    times): its time, busbw and efficiency."""
    total = float(result.time_s)
    if math.isinf(total) or total <= 0 or c is NONE:
        return {"time_s": total, "busbw_gbs": result.busbw_gbs, "efficiency": result.efficiency,
                "corrections": c.as_dict()}
    corrected = float(sum(s.multiplicity * step_time(shape_of(s), c, result.routing) for s in result.steps))
    scale = total / corrected
    return {"time_s": corrected, "busbw_gbs": result.busbw_gbs * scale, "efficiency": result.efficiency * scale,
            "corrections": c.as_dict()}


def finite_entropy_routing(routing: str, entropy_values: int | None) -> tuple[str, int]:
    """(model routing, connections per pair) that sprays over ``entropy_values`` values in equal
    shares: E hashed connections of 1/E of the bytes each; None keeps the perfectly even split."""
    if entropy_values is None or routing_kind(routing) != "sprayed":
        return routing, 1
    if entropy_values < 1:
        raise UserError(f"entropy values must be at least 1, got {entropy_values}")
    return "ecmp", int(entropy_values)


# ---- fitting a policy from side-by-side runs -----------------------------------------------------

FIT_ORDER = ("steady", "start", "burst", "resend")


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a x - b| with x >= 0, by trying every set of free columns (a handful of constants: exact)."""
    n = a.shape[1]
    best, best_x = math.inf, np.zeros(n)
    for mask in range(1 << n):
        cols = [i for i in range(n) if mask >> i & 1]
        x = np.zeros(n)
        if cols:
            sol = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            if (sol < 0).any():
                continue
            x[cols] = sol
        res = float(np.linalg.norm(a @ x - b))
        if res < best - 1e-15:
            best, best_x = res, x
    return best_x


def _cell_row(cell: dict[str, Any], transport: Transport) -> tuple[dict[str, float], float]:
    """A cell's columns (:func:`columns`, summed over its steps, averaged over the model's seeds) and
    its peer time."""
    per_seed = cell["steps"]
    sums = dict.fromkeys(("tail", *FIT_ORDER), 0.0)
    for steps in per_seed:
        for shape, mult in steps:
            for k, v in columns(shape, transport).items():
                sums[k] += mult * v / len(per_seed)
    return sums, float(cell["peer_s"])


def fit_group(cells_by_mode: Mapping[str, Sequence[dict[str, Any]]], transport: Transport,
              shared: Sequence[str] = (), own: Sequence[str] = FIT_ORDER) -> dict[str, Policy]:
    """Policies for some modes at once, from cells run on both sides. Each cell: {"peer_s": the
    peer's time (mean over its seeds), "steps": [[(StepShape, multiplicity), ...] per seed of the
    model]}. The corrected time is linear in (1/efficiency, start, burst, resend) (:func:`columns`);
    the constants named in ``shared`` are one for every mode, those in ``own`` one per mode, the
    rest keep their defaults. Least squares on the relative error of every cell (each weighs the
    same whatever its length), every constant at least 0 (a cost is never a gain); a constant whose
    column is zero in every cell (nothing re-sent anywhere) keeps its default."""
    default = Policy()
    defaults = {"steady": 1 / default.efficiency, "start": default.start_rtts, "burst": default.burst,
                "resend": default.resend}
    modes = list(cells_by_mode)
    unknowns = [(None, k) for k in shared] + [(m, k) for m in modes for k in own]
    rows, rhs = [], []
    for m in modes:
        for cell in cells_by_mode[m]:
            cols, peer = _cell_row(cell, transport)
            row = [cols[k] / peer if mm is None or mm == m else 0.0 for mm, k in unknowns]
            fixed = sum(cols[k] * defaults[k] for k in FIT_ORDER if k not in shared and k not in own)
            rows.append(row)
            rhs.append((peer - cols["tail"] - fixed) / peer)
    a, b = np.array(rows), np.array(rhs)
    live = [i for i in range(len(unknowns)) if np.abs(a[:, i]).max(initial=0.0) > 1e-12]
    values = {u: defaults[u[1]] for u in unknowns}
    dead = [i for i in range(len(unknowns)) if i not in live]
    if dead:
        b = b - a[:, dead] @ np.array([values[unknowns[i]] for i in dead])
    if live:
        x = _nnls(a[:, live], b)
        values.update({unknowns[i]: float(v) for i, v in zip(live, x, strict=True)})
    out = {}
    for m in modes:
        got = {k: values[(None, k)] if k in shared else values.get((m, k), defaults[k]) for k in FIT_ORDER}
        eff = 1 / got["steady"] if got["steady"] > 0 else 1.5
        out[m] = Policy(start_rtts=round(got["start"], 4), burst=round(got["burst"], 4),
                        efficiency=round(min(eff, 1.5), 4), resend=round(got["resend"], 4))
    return out


def fit_policy(cells: Sequence[dict[str, Any]], transport: Transport,
               constants: Sequence[str] = FIT_ORDER) -> Policy:
    """One mode's policy from its cells (:func:`fit_group` with every constant its own)."""
    return fit_group({"mode": cells}, transport, own=constants)["mode"]


def fit(groups: Sequence[tuple[Mapping[str, Sequence[dict[str, Any]]], Sequence[str], Sequence[str]]],
        transport: Transport, source: str, fitted_on: Sequence[str]) -> Corrections:
    """Corrections from groups of modes, each (cells by mode, shared constants, own constants)
    (:func:`fit_group`)."""
    policies: dict[str, Policy] = {}
    for cells_by_mode, shared, own in groups:
        policies.update(fit_group(cells_by_mode, transport, shared, own))
    return Corrections(transport=transport, policies=policies, routing_policy=CLI_ROUTING_POLICY, source=source,
                       fitted_on=tuple(fitted_on))


def for_fabric(c: Corrections, rate_gbps: float, results: Sequence[Any]) -> Corrections:
    """``c`` on another fabric: its transport at the fabric's port rate, its base RTT the longest
    round trip of the results' steps (``flow.ModelResult``: the tail of their longest path plus one
    MTU's serialisation), as htsim takes its fabric's largest unloaded RTT. The policies' constants
    stay (fitted on htsim's fat-tree: elsewhere an extrapolation)."""
    if c is NONE:
        return c
    t = replace(c.transport, rate_gbps=rate_gbps)
    tails = [t.tail_s(s.latency_s, int(getattr(s, "hops", 0))) for r in results for s in r.steps
             if math.isfinite(s.latency_s)]
    rtt_us = (max(tails, default=0.0) + t.mtu_bytes * 8 / t.rate_bps) * 1e6
    return replace(c, transport=replace(t, base_rtt_us=rtt_us))


def with_transport(c: Corrections, **changes: Any) -> Corrections:
    """``c`` with its transport changed (e.g. ``lossless=True``)."""
    return replace(c, transport=replace(c.transport, **changes))
