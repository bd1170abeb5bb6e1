"""``hpnlab run --compare routing``: the routing modes side by side on one emulated fabric.

Modes (the roce transport's entropy policies, all on the same planes and the same source
ports from the controller's entropy map):

    ecmp       per-flow ECMP with one connection per plane per rank pair (hashed, as NCCL's QPs)
    flowlet    a new path after an idle gap (LetFlow-like)
    spray      oblivious per-packet spraying
    adaptive   per-packet, REPS-like feedback
    adaptive+w adaptive, with the switches' weights load-following (the controller's weighted mode,
               ``hpnlab.fabric.routing.weights``); every other mode runs with equal weights on the same
               tables, so it sends every source port where ecmp switches do. Needs an emulation started
               with ``routing_weights="weighted"``; otherwise this mode is left out (said once).

Fabrics: the emulated scenario as it is (symmetric), then the same with one leaf uplink
(both directions) shaped to ``asym_factor`` of its rate (and its ECN marking set for the new
rate). Collectives: the plan's (e.g.
``--collective all_to_all,all_reduce,permutation``). Every (collective, mode) cell runs ``reps`` times, interleaved
(repetition r of every mode before repetition r + 1 of any), so that a slow minute of the
machine hurts every mode alike.

Sizes: each collective at the size it takes about ``CELL_S`` (1 s) at line rate (:func:`cell_bytes`),
so that retransmission timeouts (40 ms at least) do not set the pace. The permutation is a random
derangement (the plan's seed), as the flow model's.

Per cell: busbw and completion time, per-uplink load
imbalance (max / mean of the bytes the leaves sent up, from the switch ports' counters),
the deepest reordering any receiver saw, retransmissions, timeouts and duplicates (a re-sent
packet that had arrived), the switch ports' drops and CE marks, every byte exactly once,
the machine's load average before and after, and the routing weights' changes the controller
made meanwhile (its telemetry file's "weights" records). Per (fabric, collective, mode): mean,
min, max and stdev over repetitions, and the ratio to ecmp computed repetition by repetition
(same position in the interleaving), beside the flow model's ratio for the same ranks, sizes and
fabric (:func:`predicted`), and to spray where it ran. JSON first (``compare-routing.json``),
then a table and a plot (``compare-routing.png``, :func:`plot`; ``python -m
hpnlab.fabric.experiments.compare_routing compare-routing.json --out DIR`` draws them again).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpnlab.fabric.emulation import ecn as emulated_ecn
from hpnlab.fabric.emulation.shaping import port_shape
from hpnlab.fabric.emulation.sizing import round_rate
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.runner import Plan
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario.rates import emulated_mbps
from hpnlab.fabric.stats import spread_text
from hpnlab.fabric.tail import LineTail
from hpnlab.fabric.transport.accounting import exactly_once
from hpnlab.fabric.workload.collectives import busbw_factor
from hpnlab.fabric.workload.report import _save, read_json

MODES = ("ecmp", "flowlet", "spray", "adaptive", "adaptive+w")
#: what --modes also takes: REPS's recycling (the ``reps`` entropy), for comparison with ``adaptive``
MORE_MODES = ("reps",)
#: mode -> (the transport's entropy policy, the switches' routing weights)
MODE_SETTINGS = {"ecmp": ("ecmp", "ecmp"), "flowlet": ("flowlet", "ecmp"), "spray": ("spray", "ecmp"),
                 "adaptive": ("adaptive", "ecmp"), "adaptive+w": ("adaptive", "weighted"), "reps": ("reps", "ecmp")}
COLLECTIVES = ("all_to_all", "all_reduce", "permutation")
#: the "two concurrent jobs" row: two all-to-all jobs of half the ranks each, at once on disjoint hosts
#: (``Plan(jobs=2)``); its busbw is the jobs' mean, its time the slower job's
TWO_JOBS = "two_jobs"
TWO_JOBS_COLLECTIVE = "all_to_all"
#: the flow model's routing (``hpnlab.fabric.model.flow``) for each mode: ecmp and flowlet with one connection per
#: plane per rank pair, as the transport's policies; adaptive+w is predicted as adaptive on ecmp switches:
#: the comparison does not use the model's weighted switches (``run_collective(switch_weights="weighted")``,
#: `hpnlab model --switch-weights weighted`; single collectives only, ``run_jobs`` has none)
MODEL_ROUTING = {"ecmp": "flow", "flowlet": "flowlet", "spray": "spray", "adaptive": "adaptive",
                 "adaptive+w": "adaptive", "reps": "adaptive"}


# ---- pure: figures of one cell, and the summary --------------------------------------------

def parse_modes(text: str) -> tuple[str, ...]:
    """``--modes``: a comma list of :data:`MODES` and :data:`MORE_MODES` (one clear error for an
    unknown one), in that order, with ``ecmp`` always among them: every ratio is to it."""
    known = MODES + MORE_MODES
    given = {m.strip() for m in text.split(",") if m.strip()}
    unknown = sorted(given - set(known))
    if not given or unknown:
        raise UserError(f"unknown routing mode(s) {', '.join(unknown) or repr(text)}: use {', '.join(known)}")
    return tuple(m for m in known if m in given or m == "ecmp")


def uplinks(g: Any, leaves: set[str] | None = None) -> list[tuple[str, str]]:
    """(leaf, its switch-side interface) of every leaf uplink (of ``leaves`` only, if given)."""
    out = []
    for u, v, d in g.edges(data=True):
        if d["kind"] == "host":
            continue
        lo, hi = (u, v) if g.nodes[u]["tier"] < g.nodes[v]["tier"] else (v, u)
        if g.nodes[lo]["tier"] == 1 and g.nodes[hi]["tier"] == 2 and (leaves is None or lo in leaves):
            out.append((lo, fgraph.intf_name(lo, d["ports"][lo])))
    return sorted(out)


def imbalance(tx_bytes: list[int]) -> float | None:
    """max / mean of the uplinks' bytes (1.0: perfectly even; None: nothing sent)."""
    loaded = [b for b in tx_bytes if b >= 0]
    if not loaded or sum(loaded) == 0:
        return None
    return max(loaded) / (sum(loaded) / len(loaded))


def cell_figures(res: dict | list[dict], uplink_bytes: list[int]) -> dict:
    """The figures of one run of one cell (its jobs' results: busbw the jobs' mean, time the slowest)."""
    results = res if isinstance(res, list) else [res]
    rows = [r["rows"][0]["oop"] for r in results]
    flows = [f for r in results for f in r.get("flows", [])]
    lines = [row["busbw_gbs"] * 8e9 / r["line_rate_bps"] for row, r in zip(rows, results, strict=True)
             if r.get("line_rate_bps")]
    return {"busbw_gbs": statistics.fmean(r["busbw_gbs"] for r in rows), "time_us": max(r["time_us"] for r in rows),
            "line": statistics.fmean(lines) if lines else None,
            "wrong": sum(r["wrong"] for r in rows),
            "uplink_imbalance": imbalance(uplink_bytes),
            "max_reorder": max((f.get("max_reorder", 0) for f in flows), default=0),
            "retransmissions": sum(f.get("retransmissions", 0) for f in flows),
            "timeouts": sum(f.get("timeouts", 0) for f in flows),
            "duplicates": sum(f.get("duplicates", 0) for f in flows),
            "switch_drops": _ecn_total(results, "drops"), "ingress_drops": _ecn_total(results, "ingress_drops"),
            "ce_marked": _ecn_total(results, "ce_marked"),
            "exactly_once": all(exactly_once(f) is not False for f in flows),
            "jobs_busbw_gbs": [r["busbw_gbs"] for r in rows], "start_skew_s": start_skew(results)}


def start_skew(results: list[dict]) -> float | None:
    """How far apart the ranks of a cell's jobs started their iterations (s, wall clock: max - min of
    the ranks' ``started_at``); None where the ranks did not record it."""
    starts = [r["started_at"] for res in results for r in res.get("ranks", []) if r.get("started_at") is not None]
    return max(starts) - min(starts) if starts else None


def _jobs_text(fig: dict) -> str:
    """", jobs A/B GB/s, started N ms apart" for a cell of several jobs ("" for one job)."""
    if len(fig["jobs_busbw_gbs"]) < 2:
        return ""
    text = ", jobs " + "/".join(f"{b:.5f}" for b in fig["jobs_busbw_gbs"]) + " GB/s"
    skew = fig["start_skew_s"]
    return text if skew is None else f"{text}, started {skew * 1e3:.0f} ms apart"


def machine_busy(res: dict | list[dict]) -> float | None:
    """The share of the machine's cores busy over a cell's timed iterations (its jobs' mean of
    ``report.cpu_summary``'s ``machine_busy``; None where the ranks did not read it)."""
    results = res if isinstance(res, list) else [res]
    busy = [b for r in results if (b := (r.get("cpu") or {}).get("machine_busy")) is not None]
    return statistics.fmean(busy) if busy else None


def weight_changes(lines: Iterable[str], t0: float, t1: float) -> list[dict]:
    """The routing weights' changes the controller wrote to its telemetry file (records of kind
    "weights", ``hpnlab.fabric.routing.weights.Change.as_dict``) between monotonic times ``t0`` and ``t1``."""
    out = []
    for line in lines:
        if '"weights"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue                         # a line being written
        if rec.get("kind") == "weights" and t0 <= rec.get("t", -1.0) <= t1:
            out.append(rec)
    return out


def predicted(g: Any, collective: str, size_bytes: int, hosts: list[str], modes: Iterable[str], *,
              shaped: tuple[str, str, int] | None = None, factor: float = 1.0, seed: int = 0) -> dict[str, dict]:
    """The flow model's figures for each mode on the same ranks (``hosts``, in rank order), size and
    permutation seed, on the fabric as it is or with edge ``shaped`` (u, v, key) at ``factor`` of its
    rate: {mode: {"busbw_gbs" (at the model's real rates), "ratio_to_ecmp"}} (pure)."""

    if shaped is not None:
        g = g.copy()
        g.edges[shaped]["rate_gbps"] *= factor
    net = model.Network(g)
    planes = g.graph["scenario"].planes
    out: dict[str, dict] = {}
    for mode in modes:
        if collective == TWO_JOBS:        # ``hosts``: the first job's, then the second's
            half = len(hosts) // 2
            jobs = [model.JobSpec(TWO_JOBS_COLLECTIVE, size_bytes, list(h), MODEL_ROUTING[mode], planes)
                    for h in (hosts[:half], hosts[half:])]
            busbw = statistics.fmean(r.busbw_gbs for r in model.run_jobs(g, jobs, seed=seed, network=net))
        else:
            job = model.make_job(g, list(hosts), "packed", seed, network=net)
            busbw = model.run_collective(g, collective, size_bytes, routing=MODEL_ROUTING[mode], qps=planes,
                                         seed=seed, network=net, job=job).busbw_gbs
        out[mode] = {"busbw_gbs": busbw}
    base = out.get("ecmp", {}).get("busbw_gbs")
    for fig in out.values():
        fig["ratio_to_ecmp"] = fig["busbw_gbs"] / base if base else None
    return out


#: a cell's collective lasts about this long at line rate (``cell_bytes``)
CELL_S = 1.0


#: ``--compare routing`` without a rate set runs at this share of the budget's rates: at the generators'
#: ceiling (14 Mbit/s, 2026-12-03) spray still showed the routing but adaptive, whose per-packet work
#: needs CPU, fell to 0.73-0.89x spray on the symmetric fabric; at about half of it (8 Mbit/s) it was
#: level with spray there and 1.35-1.45x spray on the asymmetric all-to-all and permutation
RATE_SHARE = 0.5


def comparison_rates(rates: dict[str, Any], line: str, share: float = RATE_SHARE) -> tuple[dict[str, Any], str]:
    """The budget's rates (``sizing.run_rates``' overrides and line) at ``share`` for a routing
    comparison (pure); a rate the user set (no ``host_mbps`` among them) is left as it is."""
    emu = dict(rates.get("emulation", {}))
    if "host_mbps" not in emu:
        return rates, line
    host = round_rate(emu["host_mbps"] * share)
    emu["max_mbps"] = round(emu["max_mbps"] * host / emu["host_mbps"], 3)
    emu["host_mbps"] = host
    return ({**rates, "emulation": emu},
            f"{line}; --compare routing runs at {share:.0%} of that: host ports {host:g} Mbit/s (the ranks' CPU "
            f"for adaptive's per-packet work; --set emulation.host_mbps to choose)")


def cell_bytes(collective: str, ranks: int, host_mbps: float, planes: int, target_s: float = CELL_S) -> int:
    """The size (bytes, a power of two) at which ``collective`` over ``ranks`` ranks takes about
    ``target_s`` at line rate (every plane's host port at ``host_mbps``; busbw = size x the
    busbw factor / time). Why: at the emulated rates an RTT is a few ms and the shortest
    retransmission timeout 40 ms; a cell of 0.1 s is set by one or two timeouts, a cell of
    1 s (hundreds of RTTs, 25 minimum timeouts) by the routing (pure)."""

    line_bytes_s = planes * host_mbps * 1e6 / 8
    want = target_s * line_bytes_s / busbw_factor(collective, ranks)
    return 1 << max(16, round(math.log2(max(1.0, want))))


def _ecn_total(results: list[dict], key: str) -> int | None:
    """A counter of the ECN stage summed over the switch ports (``experiment``'s ``switch_ecn``; None
    without the stage). Both jobs of a cell read the same counters: taken once."""
    ecn = (results[0].get("switch_ecn") or {}) if results else {}
    value = ecn.get(key)
    return int(value) if isinstance(value, (int, float)) else None


def _spread(values: list[Any]) -> dict:
    xs: list[float] = [x for x in values if x is not None]
    if not xs:
        return {"mean": None, "min": None, "max": None, "stdev": None, "n": 0}
    return {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs),
            "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def summarize(runs: list[dict], baseline: str = "ecmp", model: dict | None = None,
              versus: tuple[str, ...] = ("spray",)) -> list[dict]:
    """Per (fabric, collective, mode): every figure's spread (``line``: busbw over the rank's line
    rate, every plane's port), and the per-repetition ratio of busbw (and completion time) to the
    baseline mode's same repetition, and of busbw to each mode of ``versus`` that ran (the
    issue's other yardstick: adaptive against oblivious spray); the machine's load
    (1-minute average before and after each cell); ``model``: {(fabric, collective): :func:`predicted`},
    whose ratio goes beside the measured one."""
    keys = sorted({(r["fabric"], r["collective"], r["mode"]) for r in runs},
                  key=lambda k: (k[0], k[1], (MODES + MORE_MODES).index(k[2]) if k[2] in MODES + MORE_MODES else 99))
    by = {(r["fabric"], r["collective"], r["mode"], r["rep"]): r for r in runs}
    ran = {k[:3] for k in by}
    out = []
    for fabric, coll, mode in keys:
        mine = [r for r in runs if (r["fabric"], r["collective"], r["mode"]) == (fabric, coll, mode)]
        row: dict[str, Any] = {"fabric": fabric, "collective": coll, "mode": mode}
        for fig in ("busbw_gbs", "line", "time_us", "uplink_imbalance", "max_reorder", "retransmissions", "timeouts",
                    "duplicates", "switch_drops", "ingress_drops", "ce_marked"):
            row[fig] = _spread([r.get(fig) for r in mine])
        row["load"] = _spread([x for r in mine for x in r.get("load", ())])
        row["machine_busy"] = _spread([r.get("machine_busy") for r in mine])
        row["weight_changes"] = sum(len(r.get("weight_changes", ())) for r in mine)
        ratios, time_ratios = [], []
        for r in mine:
            base = by.get((fabric, coll, baseline, r["rep"]))
            if base and base["busbw_gbs"]:
                ratios.append(r["busbw_gbs"] / base["busbw_gbs"])
                time_ratios.append(r["time_us"] / base["time_us"])
        row["busbw_ratio_to_" + baseline] = _spread(ratios)
        row["time_ratio_to_" + baseline] = _spread(time_ratios)
        for other in versus:
            if (fabric, coll, other) in ran:
                row["busbw_ratio_to_" + other] = _spread(
                    [r["busbw_gbs"] / o["busbw_gbs"] for r in mine
                     if (o := by.get((fabric, coll, other, r["rep"]))) and o["busbw_gbs"]])
        pred = (model or {}).get((fabric, coll), {}).get(mode)
        row["model_ratio_to_" + baseline] = pred["ratio_to_ecmp"] if pred else None
        row["exactly_once"] = all(r["exactly_once"] for r in mine)
        row["wrong"] = sum(r["wrong"] for r in mine)
        out.append(row)
    return out


def table(summary: list[dict], baseline: str = "ecmp", versus: str = "spray") -> list[str]:
    """The summary as text: per row busbw, its share of line rate, the ratios to ``baseline`` and
    to ``versus`` (mean [min-max] of the per-repetition ratios; "-" where ``versus`` did not run)."""
    key = "busbw_ratio_to_" + baseline
    lines = [f"{'fabric':<11} {'collective':<12} {'mode':<10} {'busbw GB/s':>11} {'line':>5} {'x ' + baseline:>17} "
             f"{'model':>5} {'x ' + versus:>17} {'imbalance':>9} {'reorder':>7} {'retx':>6} {'RTOs':>5} {'load':>9} "
             f"{'CPU':>4}  exactly once"]
    for r in summary:
        b, q = r["busbw_gbs"], r[key]
        ratio = spread_text(q, "{:.2f}", centre="mean")
        vs_text = spread_text(r.get("busbw_ratio_to_" + versus), "{:.2f}", centre="mean")
        ln = (r.get("line") or {}).get("mean")
        pred = r.get("model_ratio_to_" + baseline)
        imb = r["uplink_imbalance"]["mean"]
        ld = r.get("load") or {"n": 0}
        load = f"{ld['min']:.1f}-{ld['max']:.1f}" if ld["n"] else "-"
        rto = (r.get("timeouts") or {}).get("mean")
        busy = (r.get("machine_busy") or {}).get("mean")
        cpu = "-" if busy is None else format(busy, ".0%")
        lines.append(f"{r['fabric']:<11} {r['collective']:<12} {r['mode']:<10} {b['mean']:>11.5f} "
                     f"{'-' if ln is None else format(ln, '.2f'):>5} {ratio:>17} "
                     f"{'-' if pred is None else format(pred, '.2f'):>5} {vs_text:>17} "
                     f"{imb if imb is None else format(imb, '.2f'):>9} {r['max_reorder']['max']:>7} "
                     f"{r['retransmissions']['mean']:>6.0f} {'-' if rto is None else format(rto, '.0f'):>5} "
                     f"{load:>9} {cpu:>4}  {'yes' if r['exactly_once'] else 'NO'}")
    return lines


def plot(summary: list[dict], path: str | Path, baseline: str = "ecmp") -> Path:
    """Per fabric, bars of each mode's busbw ratio to ``baseline`` per collective (mean of the
    per-repetition ratios, min-max whiskers), the flow model's ratio as a black tick on each bar,
    and a dashed line at 1.25 (the issue's target)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    key = "busbw_ratio_to_" + baseline
    fabrics = sorted({r["fabric"] for r in summary}, key=lambda f: (f != "symmetric", f))
    order = MODES + MORE_MODES
    modes = sorted({r["mode"] for r in summary}, key=lambda m: order.index(m) if m in order else 99)
    fig, axes = plt.subplots(1, max(1, len(fabrics)), figsize=(5.5 * max(1, len(fabrics)), 3.8), squeeze=False)
    width = 0.8 / max(1, len(modes))
    for ax, fabric in zip(axes[0], fabrics, strict=False):
        rows = [r for r in summary if r["fabric"] == fabric]
        colls = list(dict.fromkeys(r["collective"] for r in rows))
        for j, mode in enumerate(modes):
            for i, coll in enumerate(colls):
                r = next((x for x in rows if x["collective"] == coll and x["mode"] == mode), None)
                sp = (r or {}).get(key) or {}
                if not sp.get("n"):
                    continue
                x = i + (j - (len(modes) - 1) / 2) * width
                ax.bar(x, sp["mean"], width, color=f"C{j}", label=mode if i == 0 else None)
                ax.errorbar(x, sp["mean"], yerr=[[sp["mean"] - sp["min"]], [sp["max"] - sp["mean"]]],
                            color="black", capsize=2, lw=0.8)
                pred = r.get("model_ratio_to_" + baseline) if r else None
                if pred is not None:
                    ax.plot([x - width / 2, x + width / 2], [pred, pred], color="black", lw=1.5)
        ax.axhline(1.25, color="grey", ls="--", lw=0.8)
        ax.set_xticks(range(len(colls)), colls, fontsize=8)
        ax.set_ylabel(f"busbw / {baseline} (per repetition)")
        ax.set_title(f"{fabric} (bars: measured; ticks: flow model)", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def main(argv: list[str] | None = None) -> int:
    """``python -m hpnlab.fabric.experiments.compare_routing compare-routing.json --out DIR``: the table and the
    plot again from a comparison file (the summary recomputed from its runs)."""
    import argparse
    import sys


    p = argparse.ArgumentParser(prog="python -m hpnlab.fabric.experiments.compare_routing", description=main.__doc__)
    p.add_argument("file", help="compare-routing.json written by hpnlab run --compare routing")
    p.add_argument("--out", required=True, help="folder for the plot")
    args = p.parse_args(argv)
    try:
        doc = read_json(args.file)
        model = {(m["fabric"], m["collective"]): m["modes"] for m in doc.get("model", [])}
        summary = summarize(doc["runs"], model=model)
        lines = table(summary)
        path = plot(summary, Path(args.out) / "compare-routing.png")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"hpnlab: cannot read a routing comparison from {args.file}: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    print(f"plot: {path}")
    return 0


# ---- side effects: counters and shaping on the emulation ------------------------------------

def read_tx_bytes(intfs: list[str]) -> list[int]:
    out = []
    for name in intfs:
        try:
            out.append(int(Path(f"/sys/class/net/{name}/statistics/tx_bytes").read_text()))
        except (OSError, ValueError):
            out.append(-1)
    return out


def reshape(emu: Any, intf: str, rate_mbps: float, mtu: int) -> None:
    """Shape ``intf`` to ``rate_mbps`` through the emulation's one writer of port state
    (``emulation.ecn.reshape``: every htb class of the port, and the ECN stage's rate and thresholds)."""
    port = next(p for p in emu.switch_ports() if p["intf"] == intf)
    emulated_ecn.reshape(replace(port_shape(port, mtu, delay=False), rate_mbps=rate_mbps), getattr(emu, "ecn", None))


def compare(emu: Any, base: Plan, *, reps: int = 5, collectives: tuple[str, ...] | None = None,
            modes: tuple[str, ...] = MODES, asym_factor: float = 0.5, sizes: dict[str, int] | None = None,
            say: Callable[[str], None] = lambda _m: None, save: Callable[[dict], Any] | None = None) -> dict:
    """Run the comparison on a started emulation; returns the JSON document. ``collectives``:
    default the plan's; ``sizes``: per collective, its size (default :func:`cell_bytes` at the
    emulated host rate); ``save`` gets the document so far after every cell (a run cut short
    keeps what it measured). Per cell it also records the machine's load average before and
    after, and the routing weights' changes the controller made meanwhile."""

    if reps < 1:
        raise UserError(f"--repeat must be at least 1, got {reps}")
    collectives = tuple(collectives or base.collectives)
    unknown = [c for c in collectives if c not in COLLECTIVES + (TWO_JOBS,) and c not in base.collectives]
    if unknown:
        raise UserError(f"--compare routing runs {', '.join(COLLECTIVES + (TWO_JOBS,))}; got {', '.join(unknown)}")
    unknown = [m for m in modes if m not in MODE_SETTINGS]
    if unknown:
        raise UserError(f"unknown routing mode(s) {', '.join(unknown)}: use {', '.join(MODES)}")
    controller = emu.controller                       # the emulation's ControllerSupervisor
    if any(MODE_SETTINGS[m][1] == "weighted" for m in modes) and not controller.live_weights:
        say("adaptive+w left out: the emulation's controller does not run weighted mode's tables")
        modes = tuple(m for m in modes if MODE_SETTINGS[m][1] != "weighted")
    # the permutation is random (seeded by the plan): the flow model's, so that its prediction is for the same
    # pairs; a shift by n/2 keeps every pair on one leaf on the placements that deal ranks round-robin over leaves
    base = base.replace(perm="random")
    g = emu.graph
    s = g.graph["scenario"]
    runs: list[dict] = []
    ups_all = uplinks(g)
    if not ups_all:
        raise UserError(f"{s.name} has no leaf uplinks to compare routing over")
    # the shaped uplink: the first leaf's first uplink, both directions
    leaf, intf = ups_all[0]
    u, v, d = next((u, v, d) for u, v, d in g.edges(data=True)
                   if d["kind"] != "host" and leaf in (u, v) and fgraph.intf_name(leaf, d["ports"][leaf]) == intf)
    peer = v if u == leaf else u
    peer_intf = fgraph.intf_name(peer, d["ports"][peer])
    rate = emulated_mbps(s, d["rate_gbps"])
    edge = next((a, b, k) for a, b, k, dd in g.edges(keys=True, data=True) if dd is d)
    fabrics = [("symmetric", None), ("asymmetric", (intf, peer_intf, rate))]
    if sizes is None:
        host_mbps = emulated_mbps(s, s.host_rate_gbps)
        sizes = {c: cell_bytes(TWO_JOBS_COLLECTIVE, base.ranks // 2, host_mbps, s.planes) if c == TWO_JOBS
                 else cell_bytes(c, base.ranks, host_mbps, s.planes) for c in collectives}
    say("sizes: " + ", ".join(f"{c} {sizes[c] / 2**20:g} MiB" for c in collectives)
        + f" (about {CELL_S:g} s per iteration at line rate)")

    def plan_of(coll: str, entropy: str) -> Plan:
        if coll == TWO_JOBS:
            return base.replace(collectives=TWO_JOBS_COLLECTIVE, jobs=2, ranks=max(2, base.ranks // 2),
                                transports="roce", entropies=entropy, sizes=sizes[coll])
        return base.replace(collectives=coll, transports="roce", entropies=entropy, sizes=sizes[coll])

    hosts_of = {}
    for coll in collectives:
        [jobs] = plan_of(coll, "ecmp").jobs_on(g).values()
        hosts_of[coll] = [h for job in jobs for h in (job.labels or [])]
    model: dict[tuple[str, str], dict] = {}
    for fabric, shaped in fabrics:
        for coll in collectives:
            try:
                model[fabric, coll] = predicted(g, coll, sizes[coll], hosts_of[coll], modes,
                                                shaped=edge if shaped else None, factor=asym_factor, seed=base.seed)
            except (UserError, ValueError) as exc:
                say(f"no model prediction for {fabric} {coll}: {exc}")
    telemetry = LineTail(controller.telemetry_file)      # the controller appends

    def doc() -> dict:
        return _doc(s.name, reps, modes, collectives, asym_factor, [intf, peer_intf], base, runs, sizes, model,
                    hosts_of)
    for fabric, shaped in fabrics:
        if shaped:
            for i in shaped[:2]:
                reshape(emu, i, shaped[2] * asym_factor, s.emulation.mtu)
            say(f"asymmetric: {leaf}'s uplink {intf} <-> {peer_intf} shaped to {shaped[2] * asym_factor:g} "
                f"of {shaped[2]:g} Mbit/s")
        try:
            for rep in range(reps):
                for coll in collectives:
                    for mode in modes:
                        entropy, weights = MODE_SETTINGS[mode]
                        if controller.routing_weights != weights:
                            controller.set_routing_weights(weights)
                        plan = plan_of(coll, entropy)
                        leaves = {p["leaf"] for h in hosts_of[coll] for p in fgraph.host_ports(g, h)}
                        ups = [i for lf, i in ups_all if lf in leaves]
                        telemetry.lines()                  # what came before this cell
                        load0, t0 = os.getloadavg()[0], time.monotonic()
                        before = read_tx_bytes(ups)
                        res = experiment.run(plan, emu, progress=False)["results"]
                        busy = machine_busy(res)
                        after = read_tx_bytes(ups)
                        load1, t1 = os.getloadavg()[0], time.monotonic()
                        delta = [a - b if a >= 0 and b >= 0 else -1 for a, b in zip(after, before, strict=True)]
                        fig = cell_figures(res, delta)
                        changes = weight_changes(telemetry.lines(), t0, t1)
                        runs.append({"fabric": fabric, "collective": coll, "mode": mode, "rep": rep, **fig,
                                     "size_bytes": sizes[coll], "load": [load0, load1], "machine_busy": busy,
                                     "weight_changes": changes,
                                     "uplink_bytes": dict(zip(ups, delta, strict=True))})
                        say(f"  {fabric} rep {rep + 1}/{reps} {coll} {mode}: busbw {fig['busbw_gbs']:.5f} GB/s, "
                            f"imbalance {fig['uplink_imbalance'] or 0:.2f}, retx {fig['retransmissions']}, "
                            f"RTOs {fig['timeouts']}, drops {fig['switch_drops']} (ingress {fig['ingress_drops']}), "
                            f"load {load0:.1f}-{load1:.1f}"
                            + ("" if busy is None else f", CPU {busy:.0%} busy")
                            + (f", {len(changes)} weight changes" if changes else "") + _jobs_text(fig))
                        if save is not None:
                            save(doc())
        finally:
            if shaped:
                for i in shaped[:2]:
                    reshape(emu, i, shaped[2], s.emulation.mtu)
    return doc()


def _doc(scenario: str, reps: int, modes: tuple, collectives: tuple, asym_factor: float, shaped: list,
         base: Plan, runs: list[dict], sizes: dict[str, int], model: dict[tuple[str, str], dict],
         hosts: dict[str, list[str]]) -> dict:
    return {"kind": "compare-routing", "scenario": scenario, "reps": reps, "modes": list(modes),
            "collectives": list(collectives), "asym_factor": asym_factor, "shaped_uplink": shaped,
            "sizes": sizes, "hosts": hosts, "plan": base.as_dict(),
            "model": [{"fabric": f, "collective": c, "modes": m} for (f, c), m in model.items()],
            "summary": summarize(runs, model=model), "runs": runs}


if __name__ == "__main__":
    raise SystemExit(main())
