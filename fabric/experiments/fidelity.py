"""Fidelity: the flow model against the emulator on the same scenario, placement, collective and mode.

Pure: plain values in, plain values out (the command ``hpnlab fidelity`` runs the emulation
and the model and calls these).

The two sides
    *emulated*  ``hpnlab run``'s machinery (``experiment.run`` on an ``Emulation``) at the
                emulated rates: the roce transport with one entropy mode, the ranks the
                placement chose, the generators' schedule (``collectives.build``).
    *model*     ``hpnlab.fabric.model.flow`` on the same fabric graph with every link at its
                **emulated** rate and delay (:func:`emulated_graph`), the same ranks in the
                same order, running **the generators' schedule**: the steps of
                ``collectives.build`` for the same collective and rank count, each step's
                transfers at once (:func:`schedule_steps`; the all-to-all is one step with
                every pair at once, as the generators send it), with ``model.run_steps``.
                Beside it, where the model can place the ranks, the model's own schedule
                (``model.run_collective``) is reported as ``model_own``: the same steps (the
                model runs the generators' schedules), a cross-check.

Modes: the roce transport's entropy modes and the model's routing for each (:data:`MODE_ROUTING`):
``flow`` and ``ecmp`` (per-flow hashing: one connection per pair, or one per plane),
``flowlet``, ``spray`` and ``adaptive`` (the model has all of them; a mode whose routing a model
lacks would be reported as such, ``model: null`` with the reason, never substituted).

Errors: relative, ``(model - emulated) / emulated``, for busbw and for completion time.
Where either exceeds :data:`TOLERANCE` (10%), :func:`explain` says why from what the
emulated run measured (a classifier of known causes, each with its evidence and the
share of the gap it accounts for, and only causes that push the gap the way it goes):

    incast_loss   packets lost and re-sent (switch drops, retransmissions) on a fan-in step
    schedule      the model's own schedule differs from the generators' (pairwise vs concurrent)
    congestion_control  the same cell emulated again without DCQCN (``--cc dcqcn,none``) took
                  that much less time: congestion control's share of the gap, measured
    rate_ramp     congestion control cut the senders' rates (DCQCN cuts) or each step pays
                  round trips before its bytes flow (steps x measured RTT)
    timer_ticks   retransmission timeouts (count x the transport's minimum RTO)
    cpu           a generator rank near a full core (its measured CPU share), or the machine's
                  cores busy during the cell (``/proc/stat`` over the cell; for files without
                  it, the 1-minute load average beyond the cores)
    collisions    per-flow hashing put connections on the same links in one world and not
                  the other: both forward over the compiler's tables and give each connection
                  the same plane and entropy value (``routing.entropy.flow_hash`` and
                  ``connection_path``, one function for both), so a difference comes from what
                  the model does not follow -- a flowlet moving inside a step, a migration after
                  loss: the busiest leaf uplink over the mean, from the emulated uplinks' byte
                  counters and from the model's first step, on the slower side
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import networkx as nx
import numpy as np

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments.compare_routing import imbalance
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario.rates import ETH_HEADER, emulated_delay_us, emulated_mbps
from hpnlab.fabric.workload import collectives as col

#: the transport's entropy mode -> (the model's routing, connections per rank pair: "planes" = one per plane)
MODE_ROUTING: dict[str, tuple[str, int | str]] = {
    "flow": ("flow", 1),
    "ecmp": ("flow", "planes"),
    "flowlet": ("flowlet", "planes"),
    "spray": ("spray", 1),
    "adaptive": ("adaptive", 1),
    "reps": ("adaptive", 1),
}
#: the model's routing aliases (``flow`` is also called ``ecmp``)
ROUTING_ALIASES = {"flow": ("flow", "ecmp"), "ecmp": ("ecmp", "flow")}
#: relative error above which the report says why
TOLERANCE = 0.10
#: the roce transport's congestion control in an emulated cell (``hpnlab fidelity --cc``)
CONGESTION_CONTROLS = ("dcqcn", "none")
#: one switch hop's one-way latency on the userspace datapath: 0.3-0.4 ms RTT per switch hop
#: measured (docs: environment.md, "Open vSwitch"), half of 0.35 ms
EMULATED_SWITCH_LATENCY_US = 175.0


def hop_latency_us(g_emulated: nx.MultiGraph) -> float:
    """One switch's latency on the emulated fabric: Open vSwitch's own (:data:`EMULATED_SWITCH_LATENCY_US`,
    measured with small packets) plus store-and-forward, one MTU-sized frame at the emulated host
    port rate: each switch receives a whole frame before its shaped egress sends it on, which
    the fluid model's rates leave out (0.7 ms a switch at 48 Mbit/s and MTU 4096; 82 ns at
    400 Gbit/s, where it does not matter)."""

    s = g_emulated.graph["scenario"]
    frame_bits = (s.emulation.mtu + ETH_HEADER) * 8
    return EMULATED_SWITCH_LATENCY_US + frame_bits / emulated_mbps(s, s.host_rate_gbps)
#: thresholds of the classifier (fractions; each cause also has to account for a share of the gap)
LOSS_FRACTION = 0.005        # re-sent packets / packets above which loss is a cause
CPU_SHARE = 0.85             # a rank's CPU share of one core (or the machine's busy share) that saturates it
MIN_SHARE = 0.25             # a cause must account for at least this share of the time gap


def model_routing(mode: str, available: Sequence[str]) -> str | None:
    """The model's routing name for an entropy mode, among the routings the model has (None: not yet)."""
    if mode not in MODE_ROUTING:
        raise UserError(f"unknown mode {mode!r} (known: {', '.join(MODE_ROUTING)})")
    want = MODE_ROUTING[mode][0]
    for name in ROUTING_ALIASES.get(want, (want,)):
        if name in available:
            return name
    return None


def connections_per_pair(mode: str, planes: int) -> int:
    """Connections (QPs) per rank pair the transport opens in this mode."""
    qps = MODE_ROUTING[mode][1]
    return planes if qps == "planes" else int(qps)


def emulated_graph(g: nx.MultiGraph, hosts_in_order: Sequence[str] = ()) -> nx.MultiGraph:
    """A copy of the fabric graph with every link at its emulated rate (``mn.emulated_mbps``,
    in Gbit/s) and delay, and ``hosts_in_order`` first among the hosts (the model's ``packed``
    placement takes hosts in graph order: the ranks then sit where the emulation put them)."""

    s = g.graph["scenario"]
    first = list(hosts_in_order)
    unknown = [h for h in first if h not in g]
    if unknown:
        raise UserError(f"hosts not in the fabric: {', '.join(unknown)}")
    order = first + [n for n in g.nodes if n not in set(first)]
    out = nx.MultiGraph()
    out.graph.update(g.graph)
    out.add_nodes_from((n, dict(g.nodes[n])) for n in order)
    for u, v, k, d in g.edges(keys=True, data=True):
        e = dict(d)
        e["rate_gbps"] = emulated_mbps(s, d["rate_gbps"]) / 1e3
        e["delay_us"] = emulated_delay_us(s, d["delay_us"])
        out.add_edge(u, v, key=k, **e)
    return out


def schedule_steps(collective: str, nranks: int, size_bytes: int,
                   perm: Sequence[int] | None = None) -> list[tuple[list[tuple[int, int]], float]]:
    """The generators' steps (``collectives.build``): per step, the (src, dst) rank pairs that
    send at once and the bytes per pair (the mean where chunks differ by an element)."""
    sched = col.build(col.canonical(collective), nranks, size_bytes, perm=tuple(perm) if perm else None)
    out = []
    for step in sched.steps:
        if not step:
            continue
        by_pair: dict[tuple[int, int], int] = {}
        for t in step:
            by_pair[(t.src, t.dst)] = by_pair.get((t.src, t.dst), 0) + t.nbytes
        out.append((list(by_pair), sum(by_pair.values()) / len(by_pair)))
    return out


def rel_error(model: float | None, emulated: float | None) -> float | None:
    """(model - emulated) / emulated, None when either is missing or the emulated one is 0."""
    if model is None or emulated is None or not emulated or math.isinf(model) or math.isnan(model):
        return None
    return (model - emulated) / emulated


# ---- the emulated side's figures -------------------------------------------------------------

def emulated_figures(result: dict[str, Any], *, load_average: Sequence[float] | None = None,
                     cpus: int | None = None, uplink_imbalance: float | None = None,
                     machine_busy: float | None = None, cc: str | None = None) -> dict[str, Any]:
    """One emulated job result (``report.build_result``) -> busbw, completion time and the
    evidence the classifier reads (all measured on the run): packets, re-sent packets,
    timeouts, DCQCN rate cuts, switch drops, the RTT, the busiest rank's CPU share, the share
    of the machine's cores busy during the cell (and the load average), the uplink imbalance.
    ``cc``: the congestion control the cell ran with (:data:`CONGESTION_CONTROLS`)."""
    row = result["rows"][-1]["oop"]
    flows = result.get("flows", [])
    info = result.get("transport_info", {}) or {}
    ecn = result.get("switch_ecn") or {}
    srtts = [f["srtt_us"] for f in flows if f.get("srtt_us")]
    cpu = result.get("cpu", {}) or {}

    def total(key: str) -> int:
        return int(sum(f.get(key, 0) or 0 for f in flows))

    return {"size_bytes": result["rows"][-1]["size"], "busbw_gbs": row["busbw_gbs"], "time_us": row["time_us"],
            "line_rate_bps": result.get("line_rate_bps"), "nranks": result["nranks"],
            "collective": result["collective"], "entropy": result.get("entropy"), "cc": cc,
            "wrong": row.get("wrong"),
            "evidence": {"packets": total("packets"), "retransmissions": total("retransmissions"),
                         "timeouts": total("timeouts"), "max_flow_timeouts": max(
                             (f.get("timeouts", 0) or 0 for f in flows), default=0),
                         "rate_cuts": total("rate_cuts"), "switch_drops": ecn.get("drops"),
                         "min_rto_s": info.get("min_rto_s"), "srtt_us_mean": (sum(srtts) / len(srtts)
                                                                                if srtts else None),
                         "cpu_max_rank_share": cpu.get("max_rank_share"),
                         "load_average": list(load_average) if load_average else None, "cpus": cpus,
                         "machine_busy": machine_busy,
                         "uplink_imbalance": uplink_imbalance}}


# ---- comparison and explanation --------------------------------------------------------------

def compare(emulated: dict[str, Any], model: dict[str, Any] | None, *,
            without_cc: dict[str, Any] | None = None, spread: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row: both sides' busbw and time, the relative errors, and (beyond the tolerance) why.
    ``model``: {"busbw_gbs", "time_us", "steps", "own": {...} | None} or None (not modelled).
    ``without_cc``: the same cell's figures emulated without congestion control (its time
    measures congestion control's share of the gap); ``spread``: the repetitions behind
    ``emulated`` (:func:`median_of`)."""
    row: dict[str, Any] = {"mode": emulated.get("entropy"), "cc": emulated.get("cc"),
                           "collective": emulated["collective"],
                           "size_bytes": emulated["size_bytes"], "nranks": emulated["nranks"],
                           "emulated": {k: emulated[k] for k in ("busbw_gbs", "time_us")},
                           "model": None, "model_own": None, "error": None, "within_tolerance": None,
                           "causes": []}
    if spread:
        row["emulated"].update(spread)
    if without_cc:
        row["without_cc"] = {k: without_cc[k] for k in ("busbw_gbs", "time_us")}
    line = emulated.get("line_rate_bps")
    if line:
        row["emulated"]["of_line"] = emulated["busbw_gbs"] * 8e9 / line
    if model is None or model.get("busbw_gbs") is None:
        row["model_missing"] = (model or {}).get("missing", "not modelled")
        return row
    row["model"] = {k: model[k] for k in ("busbw_gbs", "time_us")}
    if line:
        row["model"]["of_line"] = model["busbw_gbs"] * 8e9 / line
    own = model.get("own")
    if own:
        row["model_own"] = {k: own[k] for k in ("busbw_gbs", "time_us")}
    row["error"] = {"busbw": rel_error(model["busbw_gbs"], emulated["busbw_gbs"]),
                    "time": rel_error(model["time_us"], emulated["time_us"])}
    errs = [abs(e) for e in row["error"].values() if e is not None]
    row["within_tolerance"] = bool(errs) and max(errs) <= TOLERANCE
    if not row["within_tolerance"]:
        row["causes"] = explain(emulated, model, without_cc=without_cc)
    return row


def median_of(figures: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The repetitions of one cell (each :func:`emulated_figures`) -> the one with the median
    completion time (the lower median of an even count: a real run, whose evidence explains
    it) and the spread: {"repeat", "time_us_range", "busbw_gbs_range"}."""
    if not figures:
        raise ValueError("no repetitions")
    ordered = sorted(figures, key=lambda f: f["time_us"])
    times = [f["time_us"] for f in ordered]
    busbw = sorted(f["busbw_gbs"] for f in ordered)
    return ordered[(len(ordered) - 1) // 2], {"repeat": len(ordered), "time_us_range": [times[0], times[-1]],
                                               "busbw_gbs_range": [busbw[0], busbw[-1]]}


def explain(emulated: dict[str, Any], model: dict[str, Any], *,
            without_cc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Why the model and the emulation differ, from what the emulated run measured.

    Each cause: {"cause", "evidence" (a sentence with the measured figures), "share" (the
    fraction of the completion-time gap it accounts for, where it can be estimated)}. A
    cause that slows the emulation explains only a model that is faster (and the other way
    round); causes are sorted by share. None found: one ``unexplained`` entry with the gap."""
    ev = emulated["evidence"]
    t_emu = emulated["time_us"] * 1e-6
    t_mod = model["time_us"] * 1e-6
    gap = t_emu - t_mod                      # > 0: the emulation is slower (the model optimistic)
    causes: list[dict[str, Any]] = []

    def add(name: str, evidence: str, seconds: float | None) -> None:
        share = None if seconds is None or not gap else seconds / abs(gap)
        if share is not None and share < MIN_SHARE:
            return
        causes.append({"cause": name, "evidence": evidence,
                       "share": None if share is None else round(min(share, 9.99), 3)})

    steps = max(1, int(model.get("steps") or 1))
    line = emulated.get("line_rate_bps") or 0
    # measured, either way: the same cell without congestion control
    if without_cc is not None and emulated.get("cc") not in (None, "none"):
        t_free = without_cc["time_us"] * 1e-6
        if (t_emu - t_free) * gap > 0:
            add("congestion_control", f"the same cell emulated without {emulated['cc'].upper()} took "
                f"{t_free * 1e3:.1f} ms, against {t_emu * 1e3:.1f} ms with it ({ev.get('rate_cuts') or 0} rate cuts; "
                f"the model has no congestion control)", min(abs(t_emu - t_free), abs(gap)))
    # slows the emulation: the model is optimistic
    if gap > 0:
        packets, retx = ev.get("packets") or 0, ev.get("retransmissions") or 0
        drops = ev.get("switch_drops") or 0
        if packets and (retx / packets > LOSS_FRACTION or drops):
            payload_bits = 8 * emulated["size_bytes"] / max(1, packets - retx) * retx if packets > retx else 0
            cost = payload_bits / line if line else None
            fan_in = emulated["collective"] in ("all_to_all", "incast")
            add("incast_loss" if fan_in else "loss",
                f"{retx} of {packets} packets re-sent ({retx / packets:.1%}), {drops} dropped at switch ports"
                + (" on a fan-in step (every rank sends to one at once)" if fan_in else ""), cost)
        timeouts = ev.get("max_flow_timeouts") or 0
        rto = ev.get("min_rto_s")
        if timeouts and rto:
            add("timer_ticks", f"{ev.get('timeouts')} retransmission timeouts (at most {timeouts} on one flow), "
                f"each at least the {rto * 1e3:g} ms minimum RTO", timeouts * rto)
        cuts = ev.get("rate_cuts") or 0
        rtt = ev.get("srtt_us_mean")
        ramp = steps * rtt * 1e-6 if rtt else None
        if cuts:
            add("rate_ramp", f"DCQCN cut the senders' rates {cuts} times (congestion control, which the model "
                f"leaves out)" + (f"; {steps} step(s) x {rtt:.0f} us RTT" if rtt else ""), ramp if ramp else None)
        elif ramp is not None:
            add("rate_ramp", f"{steps} synchronous step(s), each paying at least one {rtt:.0f} us round trip "
                f"before and after its bytes (the model starts every flow at its rate)", ramp)
        share = ev.get("cpu_max_rank_share")
        busy = ev.get("machine_busy")
        load = ev.get("load_average")
        cpus = ev.get("cpus")
        if share is not None and share >= CPU_SHARE:
            add("cpu", f"the busiest generator rank used {share:.0%} of a core", None)
        elif busy is not None:
            if busy >= CPU_SHARE:
                add("cpu", f"the machine's {cpus or '?'} cores were {busy:.0%} busy during the cell "
                    f"(Open vSwitch, the generators and everything else)", None)
        elif load and cpus and load[0] > cpus:          # a file from before the busy share was measured
            add("cpu", f"the machine's 1-minute load average was {load[0]:.1f} on {cpus} cores after the cell",
                None)
    # either way: the schedule, and hashing collisions
    own = model.get("own")
    if own and own.get("time_us"):
        t_own = own["time_us"] * 1e-6
        if abs(t_own - t_mod) > TOLERANCE * t_mod and (t_own - t_mod) * (t_emu - t_mod) > 0:
            add("schedule", f"the model's own {emulated['collective']} schedule ({own.get('steps', '?')} steps) "
                f"takes {own['time_us'] / 1e3:.1f} ms where the generators' ({steps} step(s), their transfers at "
                f"once) takes {model['time_us'] / 1e3:.1f} ms: the emulation is {t_emu * 1e3:.1f} ms",
                min(abs(t_own - t_mod), abs(gap)))
    imb = ev.get("uplink_imbalance")
    m_imb = model.get("uplink_imbalance")
    # the side whose hashing loaded its busiest leaf uplink more must be the slower one
    if imb is not None and m_imb is not None and abs(imb - m_imb) > TOLERANCE * min(imb, m_imb) \
            and (imb - m_imb) * gap > 0:
        sprayed = emulated.get("entropy") in ("spray", "adaptive", "reps")
        how = ("the model spreads a pair's bytes over every live path (spray: evenly, adaptive: max-min), the "
               "transport's packets took its entropy values unevenly" if sprayed
               else "both put each connection on the same plane and entropy value (one hash, "
                    "routing.entropy.connection_path), so the packets left those paths unevenly in time "
                    "(flowlets moving at gaps the model does not see, migrations after loss)")
        add("collisions", f"the busiest leaf uplink carried {imb:.2f}x the mean in the emulation and "
            f"{m_imb:.2f}x in the model: both forward over the compiler's tables, but {how}", None)
    if not causes:
        causes.append({"cause": "unexplained",
                       "evidence": f"the emulation took {t_emu * 1e3:.1f} ms and the model {t_mod * 1e3:.1f} ms; "
                                   f"no measured loss, timeout, rate cut, CPU limit or schedule difference accounts "
                                   f"for {abs(gap) * 1e3:.1f} ms", "share": None})
    causes.sort(key=lambda c: -(c["share"] if c["share"] is not None else 0.0))
    return causes


# ---- the report ---------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The side-by-side table, then one line per cause under each row beyond the tolerance.
    ``cc``: the congestion control the emulated cell ran with; ``n``: its repetitions (the
    emulated figures are the median repetition's, the range beside them)."""
    head = (f"{'collective':<12} {'mode':<9} {'cc':<9} {'ranks':>5} {'size(B)':>9} {'n':>2}  {'busbw emu':>10} "
            f"{'model':>10} {'err':>7}  {'time emu(ms)':>12} {'[min-max]':>15} {'model':>9} {'err':>7}  "
            f"{'model own(ms)':>13}")
    out = [head, "-" * len(head)]
    for r in rows:
        e, m = r["emulated"], r["model"]
        own = r.get("model_own")
        span = e.get("time_us_range")
        span_s = f"[{span[0] / 1e3:.1f}-{span[1] / 1e3:.1f}]" if span and e.get("repeat", 1) > 1 else ""
        lead = (f"{r['collective']:<12} {r['mode'] or '-':<9} {r.get('cc') or '-':<9} {r['nranks']:>5} "
                f"{r['size_bytes']:>9} {e.get('repeat', 1):>2}  {e['busbw_gbs'] * 1e3:>10.3f} ")
        if m is None:
            out.append(lead + f"{'-':>10} {'':>7}  {e['time_us'] / 1e3:>12.1f} {span_s:>15} {'-':>9}"
                       f"   model: {r.get('model_missing')}")
            continue
        out.append(lead + f"{m['busbw_gbs'] * 1e3:>10.3f} {_pct(r['error']['busbw']):>7}  "
                   f"{e['time_us'] / 1e3:>12.1f} {span_s:>15} {m['time_us'] / 1e3:>9.1f} "
                   f"{_pct(r['error']['time']):>7}  " + (f"{own['time_us'] / 1e3:>13.1f}" if own else f"{'-':>13}"))
        for c in r["causes"]:
            share = "" if c["share"] is None else f" (~{c['share']:.0%} of the gap)"
            out.append(f"    why: {c['cause']}{share}: {c['evidence']}")
    return out


# ---- the model's side -------------------------------------------------------------------------

def run_model(g_emulated: nx.MultiGraph, ranks: Sequence[tuple[str, int]], mode: str, collective: str,
              size_bytes: int, *, perm: Sequence[int] | None = None, seed: int = 1,
              switch_latency_us: float | None = None) -> dict[str, Any]:
    """The model on the emulated-rate graph (:func:`emulated_graph`) for these ranks ((host,
    rail) in rank order) in one mode: the generators' schedule step by step
    (``model.run_steps``, synchronous steps summed), and, where the model can place the same
    ranks itself, its own schedule (``model.run_collective``, ``model.steps``) as ``own``: the
    same steps since the model runs the generators' schedules, so a difference between the two
    is a finding (the ``schedule`` cause). {"missing": reason} when the model has no routing
    for the mode. ``switch_latency_us``: per switch traversed (default :func:`hop_latency_us`)."""

    if switch_latency_us is None:
        switch_latency_us = hop_latency_us(g_emulated)
    routing = model_routing(mode, model.ROUTINGS)
    if routing is None:
        return {"missing": f"the model has no {MODE_ROUTING[mode][0]!r} routing yet (has {', '.join(model.ROUTINGS)})"}
    s = g_emulated.graph["scenario"]
    qps = connections_per_pair(mode, s.planes)
    name = col.canonical(collective)
    steps = schedule_steps(name, len(ranks), size_bytes, perm)
    net = model.Network(g_emulated)
    run = run_schedule(net, ranks, steps, routing, qps, seed=seed, switch_latency_us=switch_latency_us)
    total = run["time_s"]
    imbalance = first_step_uplink_imbalance(net, ranks, steps, routing, qps, seed=seed) if steps else None
    algbw = size_bytes / total / 1e9 if total > 0 and not math.isinf(total) else 0.0
    out: dict[str, Any] = {"routing": routing, "qps": qps, "steps": len(steps), "time_us": total * 1e6,
                           "busbw_gbs": algbw * col.busbw_factor(name, len(ranks)),
                           "stalled_connections": run["stalled"], "stalled_pairs": run["stalled_pairs"],
                           "own": None, "uplink_imbalance": imbalance, "entropy_values": net.entropy_values}
    hosts = [h for h, _ in ranks]
    if (name in model.MODEL_COLLECTIVES and s.rails == 1 and len(set(hosts)) == len(hosts) and perm is None
            and name != "permutation"):
        own = model.run_collective(None, name, size_bytes, routing=routing, hosts=len(ranks),
                                   placement="packed", qps=qps, seed=seed, max_steps=len(ranks),
                                   switch_latency_us=switch_latency_us, network=net,
                                   job=model.Job(ranks=[(str(h), int(r)) for h, r in ranks]))
        out["own"] = {"time_us": own.time_s * 1e6, "busbw_gbs": own.busbw_gbs, "steps": own.steps_total}
    return out


def run_schedule(g: Any, ranks: Sequence[tuple[str, int]],
                 steps: Sequence[tuple[Sequence[tuple[int, int]], float]], routing: str, qps: int, *,
                 seed: int = 1, switch_latency_us: float = 1.0, entropy_values: int | None = None) -> dict[str, Any]:
    """The model on a given schedule: synchronous steps, each (rank pairs sending at once, bytes
    per pair), run with ``model.run_steps`` (``g``: the fabric graph or a ``model.Network``;
    ``entropy_values``: the transport's, default the model's) and summed. {"time_s",
    "step_times_s" and "latencies_s" (per step), "stalled" (the most connections without a path
    in one step), "stalled_pairs" (rank pairs that had none, once each)}."""

    results = model.run_steps(g, ranks, steps, routing, qps, seed=seed, switch_latency_us=switch_latency_us,
                              entropy_values=entropy_values or model.ENTROPY_VALUES)
    times = [r.time_s for r in results]
    pairs = sorted({p for r in results for p in r.stalled_pairs})
    return {"time_s": float(sum(times)), "step_times_s": times, "latencies_s": [r.latency_s for r in results],
            "stalled": max((r.stalled for r in results), default=0), "stalled_pairs": pairs}


def first_step_uplink_imbalance(g: Any, ranks: Sequence[tuple[str, int]],
                                steps: Sequence[tuple[Sequence[tuple[int, int]], float]], routing: str, qps: int, *,
                                seed: int = 1) -> float | None:
    """max / mean of the bytes the model puts on the leaf uplinks of the ranks' leaves in the first
    step (the leaves the ranks' NIC ports sit on, every uplink of theirs counted, idle ones too):
    the figure the emulation measures from the uplinks' byte counters. ``g``: the fabric graph
    or its ``model.Network`` (built from a graph); the step is routed as ``run_schedule`` routes it."""

    net = g if isinstance(g, model.Network) else model.Network(g)
    job = model.Job(ranks=[(str(h), int(r)) for h, r in ranks])
    pairs, nbytes = steps[0]
    load = model.step_link_bytes(net, job, list(pairs), nbytes, routing, qps, seed=seed)
    leaf_idx = net.rank_table(job)[0]
    leaves = {net.fwd.leaves[i] for i in np.unique(leaf_idx).tolist() if i >= 0}
    tier = net.g.nodes
    per_uplink = [float(load[link]) for link in range(net.n_links)
                  if (ends := net.link_ends(link))[0] in leaves and tier[ends[1]]["tier"] == 2]
    return imbalance([int(b) for b in per_uplink]) if per_uplink else None
