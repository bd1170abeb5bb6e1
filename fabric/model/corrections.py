"""Documented corrections for what the flow model leaves out, applied to its per-step times.

Pure. The flow model (``hpnlab.fabric.model.flow``) is a fluid, work-conserving model: every flow
starts at its fair rate, links drain at full capacity, nothing is lost. A packet-level peer
(UEC's htsim, NSCC, trimming, 1 x BDP queues) pays for what the model leaves out; each term
below adds one cost back, per synchronous step, in this order:

``ramp_rtts_per_step`` (rate ramp and congestion control per step, queueing at the start)
    Each synchronous step pays a fixed time of ``ramp_rtts_per_step`` base round trips: the
    barrier that starts the step, the congestion window's climb to its fair share and the
    queue that builds while it does, the last packet's acknowledgement. Added to every step:
    ``t += ramp_rtts_per_step * base_rtt``.
``retx_fraction`` (retransmission)
    Packets lost (trimmed or dropped) are sent again: a step's bytes grow by that fraction,
    ``t *= 1 + retx_fraction[routing]``, per routing (per-flow hashing collides and loses more).
``spray_efficiency`` (congestion control under spraying)
    Sprayed traffic in the model is perfectly even; the packet-level peer's congestion control
    holds the sprayed flows below the fair share (reordering, trimming, ECN-driven decreases):
    the drain part of a sprayed step is divided by ``spray_efficiency``.
``entropy_values`` (spraying over a finite set of entropy values)
    Not a factor: a transport that sprays over E entropy values is E hashed connections per
    flow, each with 1/E of the bytes. :func:`finite_entropy_routing` says how the model runs
    that exactly (its per-flow routing with ``qps = E``) instead of the perfectly even split.

The constants come from measurement: :data:`HTSIM_100G` was fitted by ``tools/bench/bench_htsim.py
--fit`` (:func:`fit`) on the model against htsim on a 100 Gbit/s three-tier fat-tree (the
runs and their figures are in the benchmark's JSON; the fit's inputs are printed with it).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hpnlab.fabric.errors import UserError

PER_FLOW = ("ecmp", "flow", "flowlet")
SPRAYED = ("spray", "adaptive")


@dataclass(frozen=True)
class Corrections:
    """The correction terms (see the module's text); ``source`` says where they were measured."""
    base_rtt_us: float = 12.0
    ramp_rtts_per_step: float = 0.0
    retx_fraction: dict[str, float] = field(default_factory=dict)     # routing -> re-sent / new packets
    spray_efficiency: float = 1.0
    source: str = "none: the uncorrected model"

    def __post_init__(self) -> None:
        if self.base_rtt_us < 0 or self.ramp_rtts_per_step < 0:
            raise UserError("corrections: the base RTT and the RTTs per step cannot be negative")
        if not 0 < self.spray_efficiency <= 1:
            raise UserError(f"corrections: spray efficiency must be in (0, 1], got {self.spray_efficiency}")
        if any(not 0 <= f < 1 for f in self.retx_fraction.values()):
            raise UserError("corrections: a retransmitted fraction must be in [0, 1)")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


NONE = Corrections()

#: fitted by ``tools/bench/bench_htsim.py --hosts 128 --fit`` against htsim (uet-htsim 40ccb05, htsim_uec, its
#: defaults: NSCC, 12 us base RTT, 100 Gbit/s, trimming) on a 3-tier k=8 fat-tree (128 hosts): hpnlab's
#: derangement (4 MB per flow, seed 1) and the pairwise all-to-all (256 kB per pair, 127 steps, a barrier
#: between steps), modes ecmp (-paths 1), spray (default), reps, oblivious (64 values). Inputs: htsim's
#: makespans and re-sent fractions (per-flow ECMP 2.5% on the permutation, 22.1% on the all-to-all;
#: sprayed 0-0.16%), the model's uncorrected makespans; measured 2026-12-01 at load 6-12 on 2 cores
#: (simulated time does not depend on the load). See /work/notes/htsim.txt.
HTSIM_100G = Corrections(base_rtt_us=12.0, ramp_rtts_per_step=1.277, retx_fraction={"per_flow": 0.1231, "sprayed": 0.0},
                         spray_efficiency=0.8865,
                         source="tools/bench/bench_htsim.py --hosts 128 --fit (htsim_uec defaults, k=8 fat-tree, 100G)")


#: the corrections ``hpnlab model --corrections`` offers, by name
PRESETS: dict[str, Corrections] = {"htsim-100g": HTSIM_100G, "none": NONE}
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


def correct_step(time_s: float, latency_s: float, routing: str, c: Corrections) -> float:
    """One synchronous step's corrected time: the drain part (``time_s - latency_s``) divided by
    the spray efficiency (sprayed routings), grown by the re-sent fraction, then the latency
    and the per-step ramp added."""
    if math.isinf(time_s):
        return time_s
    drain = max(0.0, time_s - latency_s)
    if routing_kind(routing) == "sprayed":
        drain /= c.spray_efficiency
    drain *= 1.0 + c.retx_fraction.get(routing, c.retx_fraction.get(routing_kind(routing), 0.0))
    return drain + latency_s + c.ramp_rtts_per_step * c.base_rtt_us * 1e-6


def correct_steps(step_times_s: Sequence[float], routing: str, c: Corrections,
                  latencies_s: Sequence[float] | None = None,
                  multiplicities: Sequence[float] | None = None) -> float:
    """A collective's corrected time: the sum of its corrected steps (each counted ``multiplicity`` times)."""
    lats = latencies_s or [0.0] * len(step_times_s)
    mults = multiplicities or [1.0] * len(step_times_s)
    return float(sum(m * correct_step(t, lat, routing, c)
                     for t, lat, m in zip(step_times_s, lats, mults, strict=True)))


def correct_result(result: Any, c: Corrections) -> dict[str, Any]:
    """A ``model.ModelResult`` corrected: its time and busbw, with the terms applied to its
    steps (the corrections are affine in each step's time, so the result's total and its
    number of steps carry them exactly: sum(m * (a t + b)) = a * total + b * steps)."""
    steps = float(result.steps_total)
    total = float(result.time_s)      # sum(m * step time) over ``result.steps`` (``model.StepResult``)
    if math.isinf(total) or total <= 0:
        return {"time_s": total, "busbw_gbs": result.busbw_gbs, "efficiency": result.efficiency,
                "corrections": c.as_dict()}
    latency = sum(s.multiplicity * s.latency_s for s in result.steps)
    drain = total - latency
    kind = routing_kind(result.routing)
    if kind == "sprayed":
        drain /= c.spray_efficiency
    drain *= 1.0 + c.retx_fraction.get(result.routing, c.retx_fraction.get(kind, 0.0))
    corrected = drain + latency + steps * c.ramp_rtts_per_step * c.base_rtt_us * 1e-6
    scale = total / corrected
    return {"time_s": corrected, "busbw_gbs": result.busbw_gbs * scale, "efficiency": result.efficiency * scale,
            "corrections": c.as_dict()}


def finite_entropy_routing(routing: str, entropy_values: int | None) -> tuple[str, int]:
    """(model routing, connections per pair) that sprays over ``entropy_values`` values exactly:
    E hashed connections of 1/E of the bytes each; None keeps the perfectly even split."""
    if entropy_values is None or routing_kind(routing) != "sprayed":
        return routing, 1
    if entropy_values < 1:
        raise UserError(f"entropy values must be at least 1, got {entropy_values}")
    return "ecmp", int(entropy_values)


# ---- fitting the constants from side-by-side runs ------------------------------------------------

def fit(runs: Sequence[dict[str, Any]], base_rtt_us: float, source: str) -> Corrections:
    """Constants from side-by-side runs of the model and a packet-level peer. Each run:
    {"case": "permutation" | "all_to_all", "routing", "steps", "model_s" (uncorrected
    makespan), "peer_s", "retx_fraction" (the peer's re-sent / new packets)}.

    * retx_fraction per routing kind: the median the peer measured;
    * spray_efficiency: the median over the sprayed one-step runs (permutation) of
      model / peer once retransmission and the one step's ramp are accounted for (capped at 1);
    * ramp_rtts_per_step: the median over the multi-step runs (all-to-all) of the time left
      per step, in base RTTs, once the other terms are applied (at least 0).
    The last two depend on each other; they are alternated until they settle.
    """
    retx: dict[str, float] = {}
    for kind in ("per_flow", "sprayed"):
        vals = [r["retx_fraction"] for r in runs if routing_kind(r["routing"]) == kind and r.get("retx_fraction")
                is not None]
        if vals:
            retx[kind] = statistics.median(vals)
    rtt = base_rtt_us * 1e-6
    eff, ramp = 1.0, 0.0
    for _ in range(50):           # the two terms depend on each other: alternate until they settle
        effs = [r["model_s"] * (1 + retx.get("sprayed", 0.0)) / (r["peer_s"] - ramp * rtt) for r in runs
                if r["case"] == "permutation" and routing_kind(r["routing"]) == "sprayed" and r["peer_s"] > ramp * rtt]
        eff = min(1.0, statistics.median(effs)) if effs else 1.0
        partial = Corrections(base_rtt_us=base_rtt_us, retx_fraction=retx, spray_efficiency=eff, source=source)
        ramps = [max(0.0, (r["peer_s"] - correct_steps([r["model_s"] / r["steps"]] * r["steps"], r["routing"],
                                                       partial)) / r["steps"] / rtt)
                 for r in runs if r["steps"] > 1 and rtt > 0]
        new_ramp = statistics.median(ramps) if ramps else 0.0
        if abs(new_ramp - ramp) < 1e-9:
            break
        ramp = new_ramp
    return Corrections(base_rtt_us=base_rtt_us, ramp_rtts_per_step=round(ramp, 3),
                       retx_fraction={k: round(v, 4) for k, v in retx.items()}, spray_efficiency=round(eff, 4),
                       source=source)
