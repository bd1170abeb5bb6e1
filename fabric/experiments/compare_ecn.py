"""The ECN comparison: every workload under every ECN setting, side by side, with spread.

``hpnlab run SCENARIO --compare ecn [--repeat 5] [--workloads incast,allreduce,mix,shared]`` runs,
on one emulation, each workload under the static settings (``hpnlab.fabric.workload.ecn``
presets ``low``, ``high``, ``dcqcn``, ``default``) and ``dynamic`` (the controller's dynamic-ECN
policy, when the run supports it), ``repeat`` times. The settings are *interleaved*: every
repetition runs every workload under every setting, in an order rotated from one repetition
to the next, so that the machine's load falls on all settings alike (not one block per
setting).

Workloads (the ``--jobs`` syntax of ``hpnlab.fabric.workload.jobspec``; sized for mini-hpn's host ports at
the budget's rates, about 33 Mbit/s and MTU 4096 here)
    incast      short messages, many to one: 4 senders x 16 KiB to one root, 60 times, 20 ms apart,
                after 15 warm-up bursts (about 0.45 s: two telemetry intervals, so that a dynamic
                policy has seen the traffic before the measured messages, as on a long-running job;
                with 1 warm-up and 20 bursts the whole cell was about three intervals long)
    allreduce   elephants: a ring all-reduce of 1 MiB over 4 ranks
    mix         both at once on disjoint hosts (the incast repeated for about as long as the all-reduce);
                each job spans every leaf (``placement.deal``), so their traffic meets in the spines'
                ports down to the incast root's leaf
    shared      an all-to-all of 2 MiB over 4 ranks (elephants converging 3 to 1 on every host port, as an
                expert-parallel exchange does) and, on the same 4 hosts (``on=1``: their NICs shared, as a
                training job's short pipeline messages share the NICs of its elephants), 3 senders x 4 KiB to
                one root 100 times 20 ms apart after 15 warm-up bursts: the short messages wait in the
                queue the elephants keep at the root's port, which the thresholds set
    alltoall    shared's all-to-all alone, on the same hosts     (not run by default: they bound
    short       shared's short messages alone, on the same hosts   what a policy can win on shared)
    overflow    the all-reduce beside 8 senders x 64 KiB to one root, 25 times 20 ms apart after 6
                warm-up bursts: bursts that overflow the root's port buffer (opt-in too)
    victim      PFC's collateral damage (opt-in): the all-reduce beside an unrelated incast of 8 x 16 KiB, 40
                times 20 ms apart; on a lossless fabric the incast's pauses climb to the spines and the leaf
                uplinks the all-reduce shares; brings ``allreduce`` (its job alone: the slowdown)
    phases      time-varying load on the same 4 hosts (opt-in): elephants alone, then short-message bursts,
                then both (jobs started ``after`` a delay)

Figures per (workload, setting), over the repetitions as median [min, max]
    busbw_gbs        the elephant jobs' busbw (every job but the incast: out-of-place, mean over sizes;
                     nccl-tests')
    p50_us, p99_us   the incast jobs' per-message completion time (send start to last byte at
                     the root), pooled over the run's messages
    queue_p99_bytes  99th percentile of the switch ports' sampled queue estimate
    ce_fraction      CE-marked / ECT packets over every switch port
    drops            packets dropped by the switch port buffers
    wall_s           the run's wall time
Ratios: each setting's median over the best static setting's median, per workload (busbw: the
highest is best; completion times: the lowest). Targets (:func:`targets`, printed last and in ``compare.json``): the
dynamic-ECN issue's, judged on the medians, each with whether the spreads overlap: per workload
``dynamic``'s message p99 at most the best static's and its busbw at least 0.95 of the best
static's; on a workload with both figures, against every static setting, 20% better on one figure
while at most 5% worse on the other. Interference (:func:`interference`): a mix's figure under its
best static over the best any setting reached with that job alone (``PARTS``), which bounds what a
policy can win on the mix without beating every setting on the job alone. Reach (:func:`reach`): per
static setting, whether a win is possible at all, a busbw win under the line rate or a p99 win
above the fastest the job ran alone; a setting against which neither is excludes the target for
every policy. The pure part (everything but
:func:`run_comparison` and the plot functions) is tested on synthetic results.
"""
from __future__ import annotations

import inspect
import itertools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.stats import median_of, spread, spread_text
from hpnlab.fabric.workload.ecn import PRESETS, STATIC_POLICY
from hpnlab.fabric.workload.ecn import parse as parse_ecn
from hpnlab.fabric.workload.report import _save, read_json, write_json

STATIC = ("low", "high", "dcqcn", "default")
DYNAMIC = "dynamic"
#: the settings that run a controller policy (each by its own name; ``dynamic`` by ``dynamic_policy``)
POLICIES = (DYNAMIC, "pfc-aware")
#: what ``--settings`` runs when not given
SETTINGS = (*STATIC, DYNAMIC)
#: every name ``--settings`` knows (pfc-aware: opt-in, for a lossless fabric)
KNOWN_SETTINGS = (*STATIC, *POLICIES)
NOT_MERGED = "not available (dynamic ECN not merged)"

WORKLOADS = {
    "incast": "incast:ranks=5,msg=16K,iters=60,warmup=15,gap=20ms",
    "allreduce": "all_reduce:ranks=4,size=1M,iters=3,warmup=1",
    "mix": "all_reduce:ranks=4,size=1M,iters=3,warmup=1;incast:ranks=5,msg=16K,iters=100,warmup=15,gap=20ms",
    "shared": "all_to_all:ranks=4,size=2M,iters=3,warmup=1;incast:ranks=4,msg=4K,iters=100,warmup=15,gap=20ms,on=1",
    # shared's two jobs each alone, on the same 4 hosts (one hosted job is placed as shared's is)
    "alltoall": "all_to_all:ranks=4,size=2M,iters=3,warmup=1",
    "short": "incast:ranks=4,msg=4K,iters=100,warmup=15,gap=20ms",
    # an incast whose bursts overflow the root's port buffer beside the all-reduce (8 x 64 KiB)
    "overflow": "all_reduce:ranks=4,size=1M,iters=3,warmup=1;incast:ranks=8,msg=64K,iters=25,warmup=6,gap=20ms",
    # PFC's victim: the all-reduce (job 1, placed as ``allreduce`` alone is: its figure alone) beside an
    # unrelated incast of 8 x 16 KiB bursts 20 ms apart for about as long; each job spans every leaf, so on a
    # lossless fabric the incast's pauses climb from the root's leaf to the spines and the leaf uplinks the
    # all-reduce's ring shares: its busbw over its busbw alone is the collateral damage
    "victim": "all_reduce:ranks=4,size=1M,iters=3,warmup=1;incast:ranks=8,msg=16K,iters=40,warmup=5,gap=20ms",
    # phases on the same 4 hosts (``after``: a job's start delay): elephants alone (a 512 KiB all-reduce, about
    # 2 s at 10 Mbit/s), then from 2.5 s 3 x 4 KiB to one root every 40 ms (80 bursts: about 4-7 s at 33 to
    # 10 Mbit/s, the gap dominating), and from 5 s the elephants again beside them: no single static fits all
    "phases": "all_reduce:ranks=4,size=512K,iters=1,warmup=1;incast:ranks=4,msg=4K,iters=80,warmup=5,gap=40ms,"
              "on=1,after=2.5s;all_reduce:ranks=4,size=512K,iters=1,warmup=1,on=1,after=5s",
}
#: a workload -> the workloads it needs in the same comparison (its jobs alone, for the slowdown)
NEEDS = {"victim": ("allreduce",)}
#: what ``--workloads`` runs when not given (``alltoall`` and ``short`` only bound ``shared``;
#: ``overflow`` is a burst no setting keeps within the buffer at the preset's rate)
DEFAULT_WORKLOADS = ("incast", "allreduce", "mix", "shared")
_WORKLOAD_ALIASES = {"all_reduce": "allreduce", "elephants": "allreduce", "all-reduce": "allreduce"}

#: figure -> whether higher is better (for the ratios and "best")
METRICS = {"busbw_gbs": True, "p50_us": False, "p99_us": False, "queue_p99_bytes": False,
           "ce_fraction": False, "drops": False, "wall_s": False,
           # priority flow control (None on a lossy fabric): pause frames the switches sent, the largest share
           # of the run one port held its upstream paused, ports that paused, lossless packets the headroom dropped
           "pauses": False, "paused_share_max": False, "ports_paused": False, "headroom_drops": False}
#: the PFC figures (``summarize``), reported where a run had PFC
PFC_METRICS = ("pauses", "paused_share_max", "ports_paused", "headroom_drops")
#: how a workload is named when the comparison ran with and without PFC (``tag_pfc``)
PFC_TAG = {True: "@pfc-on", False: "@pfc-off"}
#: the figures the ratio table compares to the best static setting
RATIO_METRICS = ("busbw_gbs", "p50_us", "p99_us")

assert set(STATIC) == set(PRESETS)


def comma_list(text: str, flag: str, what: str, known: Sequence[str],
                aliases: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """A comma list of known names (case-insensitive, aliases mapped, duplicates dropped);
    an unknown name or an empty list is one line naming ``flag``."""
    out: list[str] = []
    for item in (i.strip().lower() for i in str(text).split(",") if i.strip()):
        name = (aliases or {}).get(item, item)
        if name not in known:
            raise UserError(f"{flag}: unknown {what} {item!r} (known: {', '.join(known)})")
        if name not in out:
            out.append(name)
    if not out:
        raise UserError(f"{flag}: none given (known: {', '.join(known)})")
    return tuple(out)


def parse_workloads(text: str) -> tuple[str, ...]:
    """``--workloads`` (comma list of ``WORKLOADS``' names), with what each needs (``NEEDS``: ``victim``
    brings ``allreduce``, its elephant job alone) added after it."""
    chosen = comma_list(text, "--workloads", "workload", tuple(WORKLOADS), _WORKLOAD_ALIASES)
    out: list[str] = []
    for w in chosen:
        out += [x for x in (w, *NEEDS.get(w, ())) if x not in out]
    return tuple(out)


def is_policy(setting: str) -> bool:
    """A setting that runs a controller policy (``POLICIES``) rather than fixed thresholds."""
    return setting in POLICIES


def is_static(setting: str) -> bool:
    """A preset or a user's own ``KMIN:KMAX:PMAX`` (both static: set once before the run)."""
    return setting in STATIC or ":" in setting


def thresholds_arg(setting: str) -> str:
    """What ``experiment.run(ecn_thresholds=...)`` takes for a setting: a preset's name, or
    ``kmin,kmax,pmax`` for a user's ``KMIN:KMAX:PMAX``."""
    return setting.replace(":", ",")


def parse_settings(text: str) -> tuple[str, ...]:
    """``--settings``: a comma list of the ECN settings (presets and ``dynamic``) and static
    settings of one's own as ``KMIN:KMAX:PMAX`` (sizes in bytes, "6K" allowed: a threshold sweep
    beside the presets), each checked as ``--ecn`` checks it; one line per mistake."""

    out: list[str] = []
    for item in (i.strip() for i in str(text).split(",") if i.strip()):
        if ":" not in item:
            out += comma_list(item, "--settings", "ECN setting", KNOWN_SETTINGS)
            continue
        item = item.upper()
        if item.count(":") != 2:
            raise UserError(f"--settings: {item!r} is not KMIN:KMAX:PMAX (example: 8K:128K:0.01)")
        try:
            parse_ecn(thresholds_arg(item))
        except UserError as exc:
            raise UserError(f"--settings: {item}: {str(exc).removeprefix('--ecn: ')}") from None
        out.append(item)
    if not out:
        comma_list(text, "--settings", "ECN setting", tuple(SETTINGS))      # one line: none given
    return tuple(dict.fromkeys(out))


def schedule(workloads: Sequence[str], settings: Sequence[str], repeat: int) -> list[tuple[int, str, str]]:
    """(repetition, workload, setting) in run order: every repetition runs every workload under
    every setting; the settings' order rotates by one each repetition."""
    if repeat < 1:
        raise UserError(f"--repeat must be at least 1, got {repeat}")
    out: list[tuple[int, str, str]] = []
    for rep in range(repeat):
        k = rep % len(settings)
        order = list(settings[k:]) + list(settings[:k])
        for w in workloads:
            out.extend((rep, w, s) for s in order)
    return out


# ---- figures of one run --------------------------------------------------------------

def _pooled_summary(times_s: list[float]) -> tuple[float | None, float | None]:
    import numpy as np
    if not times_s:
        return None, None
    a = np.asarray(times_s, dtype=float) * 1e6
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    """The comparison's figures of one run's document (``experiment.run``'s), None where the
    run has no such figure (no all-reduce job: no busbw)."""
    results = doc.get("results", [])
    busbw = [r["avg_busbw_gbs"] for r in results if r.get("collective") not in (None, "incast")]
    line_rates = [r["line_rate_bps"] for r in results if r.get("collective") not in (None, "incast")
                  and r.get("line_rate_bps")]
    times = [t for r in results if r.get("collective") == "incast" for row in r.get("rows", [])
             for t in (row.get("oop") or {}).get("message_times_s", [])]
    p50, p99 = _pooled_summary(times)
    ecn = next((r["switch_ecn"] for r in results if r.get("switch_ecn")), None) or {}
    wrong = sum((row.get(m) or {}).get("wrong") or 0 for r in results for row in r.get("rows", [])
                for m in ("oop", "ip"))
    pfc = next((r["switch_pfc"] for r in results if r.get("switch_pfc") and "error" not in r["switch_pfc"]), None)
    return {**{m: (pfc or {}).get(m) if pfc is not None else None for m in PFC_METRICS},
            "pfc": doc.get("meta", {}).get("pfc", "on" if pfc is not None else None),
            "paused_ports": {k: v.get("paused_share") for k, v in (pfc or {}).get("per_port", {}).items()},
            "busbw_gbs": statistics.fmean(busbw) if busbw else None, "p50_us": p50, "p99_us": p99,
            "messages": len(times), "queue_p99_bytes": ecn.get("queue_p99_bytes"),
            "ce_fraction": ecn.get("ce_fraction"), "drops": ecn.get("drops"),
            "wall_s": doc.get("meta", {}).get("wall_s"), "wrong": wrong,
            "line_bps": statistics.fmean(line_rates) if line_rates else None}


def aggregate(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{workload: {setting: {figure: spread, or "unavailable": why}}} from the run records
    ({"workload", "setting", "rep", "summary"} or {..., "unavailable": why})."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in records:
        grouped.setdefault((rec["workload"], rec["setting"]), []).append(rec)
    for (w, s), recs in grouped.items():
        done = [r["summary"] for r in recs if "summary" in r]
        if not done:
            out.setdefault(w, {})[s] = {"unavailable": recs[0].get("unavailable", "no run finished")}
            continue
        figures: dict[str, Any] = {m: spread([d.get(m) for d in done]) for m in METRICS}
        figures["runs"] = len(done)
        figures["failed"] = [r["unavailable"] for r in recs if "unavailable" in r]
        figures["wrong"] = sum(d.get("wrong") or 0 for d in done)
        figures["line_bps"] = max((d["line_bps"] for d in done if d.get("line_bps")), default=None)
        out.setdefault(w, {})[s] = figures
    return out


def _median(f: Mapping[str, Any], metric: str) -> float | None:
    """A setting's median of ``metric`` (None: unavailable, or no such figure)."""
    return None if "unavailable" in f else median_of(f.get(metric))


def best_static(per_setting: dict[str, dict[str, Any]], metric: str) -> tuple[str, float] | None:
    """(setting, median) of the best static setting for ``metric`` (None when none has it)."""
    higher = METRICS[metric]
    have = [(s, m) for s, f in per_setting.items() if is_static(s) and (m := _median(f, metric)) is not None]
    if not have:
        return None
    return max(have, key=lambda x: x[1]) if higher else min(have, key=lambda x: x[1])


def ratios(agg: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """{workload: {setting: {figure: median / best static median}}} for ``RATIO_METRICS``."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for w, per in agg.items():
        for s, f in per.items():
            row: dict[str, float | None] = {}
            for m in RATIO_METRICS:
                best = best_static(per, m)
                mine = _median(f, m)
                row[m] = mine / best[1] if (best and mine is not None and best[1]) else None
            out.setdefault(w, {})[s] = row
    return out


# ---- the targets, judged from the figures -----------------------------------------------

#: what a dynamic policy must show against the static settings (the dynamic-ECN issue), per workload:
#: its message p99 at most ``P99_AT_MOST`` x the best static's, its busbw at least ``BUSBW_AT_LEAST`` x
#: the best static's; on a workload with both figures (a mix), against *every* static setting, a win
#: of ``WIN`` on one figure (busbw x (1 + WIN), or p99 x (1 - WIN)) while losing at most ``LOSS`` on
#: the other (busbw x (1 - LOSS), p99 x (1 + LOSS)). Judged on medians; ``within_spread`` says whether
#: the two settings' [min, max] ranges overlap (a verdict the repetitions could turn).
P99_AT_MOST = 1.00
BUSBW_AT_LEAST = 0.95
WIN = 0.20
LOSS = 0.05
#: a mix's figures and the workload that runs the same job alone in the comparison
PARTS = {"mix": {"busbw_gbs": "allreduce", "p99_us": "incast"},
         "shared": {"busbw_gbs": "alltoall", "p99_us": "short"},
         "victim": {"busbw_gbs": "allreduce"}}


def part_of(workload: str, metric: str) -> str | None:
    """The workload that runs ``workload``'s job of ``metric`` alone (``PARTS``), with the same PFC tag
    (``victim@pfc-on`` -> ``allreduce@pfc-on``), or None."""
    base, sep, tag = workload.partition("@")
    part = PARTS.get(base, {}).get(metric)
    return part + sep + tag if part else None


def _overlap(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return bool(a and b and a.get("n") and b.get("n") and a["min"] <= b["max"] and b["min"] <= a["max"])


def mix_win(mine: Mapping[str, float], theirs: Mapping[str, float]) -> str | None:
    """Which figure a setting wins by ``WIN`` against another while losing at most ``LOSS`` on
    the other ("busbw_gbs" or "p99_us"; None if neither). ``mine``/``theirs``: medians by figure."""
    bw, p99, obw, op99 = mine["busbw_gbs"], mine["p99_us"], theirs["busbw_gbs"], theirs["p99_us"]
    if bw >= obw * (1 + WIN) and p99 <= op99 * (1 + LOSS):
        return "busbw_gbs"
    if p99 <= op99 * (1 - WIN) and bw >= obw * (1 - LOSS):
        return "p99_us"
    return None


def targets(agg: dict[str, dict[str, dict[str, Any]]], candidate: str = DYNAMIC) -> dict[str, Any]:
    """The issue's targets for ``candidate`` per workload (see ``P99_AT_MOST`` ...):
    {workload: {"checks": [{"check", "value", "bound", "against", "met", "within_spread"}], "met"}},
    a workload where the candidate did not run: {"unavailable": why}."""
    out: dict[str, Any] = {}
    for w, per in agg.items():
        mine = per.get(candidate)
        if mine is None or "unavailable" in mine:
            out[w] = {"unavailable": (mine or {}).get("unavailable", f"{candidate} did not run")}
            continue
        checks: list[dict[str, Any]] = []
        for metric, bound, higher in (("p99_us", P99_AT_MOST, False), ("busbw_gbs", BUSBW_AT_LEAST, True)):
            best, value = best_static(per, metric), _median(mine, metric)
            if best is None or value is None:
                continue
            ratio = value / best[1]
            checks.append({"check": f"{metric} / best static's", "value": ratio, "bound": bound, "against": best[0],
                           "met": ratio >= bound if higher else ratio <= bound,
                           "within_spread": _overlap(mine[metric], per[best[0]][metric])})
        both = ("busbw_gbs", "p99_us")
        if all(_median(mine, m) is not None for m in both):
            for s, f in per.items():
                if not is_static(s) or any(_median(f, m) is None for m in both):
                    continue
                mm = {m: float(_median(mine, m) or 0.0) for m in both}
                theirs = {m: float(_median(f, m) or 0.0) for m in both}
                won = mix_win(mm, theirs)
                checks.append({"check": f"mix: {WIN:.0%} better on one figure, at most {LOSS:.0%} worse on the other",
                               "value": {m: mm[m] / theirs[m] if theirs[m] else None for m in both},
                               "bound": WIN, "against": s, "met": won is not None, "won": won,
                               "within_spread": all(_overlap(mine[m], f[m]) for m in both)})
        out[w] = {"checks": checks, "met": bool(checks) and all(c["met"] for c in checks)}
    return out


def interference(agg: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """How much a mix's jobs slow each other: per mix figure, the best static setting's median in the
    mix over the best median any setting reached with that job alone in the same comparison
    (``PARTS``; busbw: mix / alone, below 1 is slower; p99: mix / alone, above 1 is slower). A mix
    within a few percent of its jobs alone leaves no policy a 20% win on it but by beating every
    setting on the job alone."""
    out: dict[str, dict[str, Any]] = {}
    for mix in agg:
        for metric in METRICS:
            alone = part_of(mix, metric)
            if alone is None:
                continue
            best = best_static(agg[mix], metric)
            have = [(s, m) for s, f in agg.get(alone, {}).items() if (m := _median(f, metric)) is not None]
            if best is None or not have:
                continue
            top = (max if METRICS[metric] else min)(have, key=lambda x: x[1])
            line = agg[mix][best[0]].get("line_bps") if metric == "busbw_gbs" else None
            out.setdefault(mix, {})[metric] = {"mix": best[1], "mix_setting": best[0], "alone": top[1],
                                               "alone_setting": top[0], "alone_workload": alone,
                                               "ratio": best[1] / top[1] if top[1] else None,
                                               "of_line": best[1] * 8e9 / line if line else None}
    return out


def victim_slowdown(agg: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """PFC's collateral damage: per victim workload (``victim``, with any PFC tag) and setting, the elephant
    job's median busbw beside the incast over its median busbw alone under the same setting (``part_of``);
    below 1 it was slowed. {workload: {setting: {"victim", "alone", "ratio", "within_spread"}}}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for w, per in agg.items():
        if w.partition("@")[0] != "victim" or (alone := part_of(w, "busbw_gbs")) not in agg:
            continue
        for s, f in per.items():
            a = agg[alone].get(s) or {}
            mine, theirs = _median(f, "busbw_gbs"), _median(a, "busbw_gbs")
            if mine is None or theirs is None:
                continue
            lo, hi = f["busbw_gbs"], a["busbw_gbs"]
            out.setdefault(w, {})[s] = {"victim": mine, "alone": theirs, "ratio": mine / theirs if theirs else None,
                                        # the ranges overlap: the repetitions cannot tell a slowdown
                                        "within_spread": lo["max"] >= hi["min"]}
    return out


def tag_pfc(comp: dict[str, Any], pfc: bool) -> dict[str, Any]:
    """A comparison's records with each workload named for the PFC setting it ran under (``incast@pfc-on``),
    so that comparisons with and without PFC :func:`merge` into one whose tables show both."""
    records = [dict(rec, workload=rec["workload"].partition("@")[0] + PFC_TAG[pfc], pfc=pfc)
               for rec in comp["records"]]
    meta = {**comp["meta"], "pfc": "on" if pfc else "off",
            "workloads": {w.partition("@")[0] + PFC_TAG[pfc]: spec for w, spec in comp["meta"]["workloads"].items()}}
    return {**comp, "meta": meta, "records": records}


def pfc_difference(agg: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The difference PFC makes: per workload run both ways and setting, each figure's median with PFC over
    its median without (busbw above 1: PFC helped; times, drops below 1: PFC helped).
    {workload: {setting: {figure: ratio or None}}}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for w in agg:
        base, _, tag = w.partition("@")
        off = base + PFC_TAG[False]
        if "@" + tag != PFC_TAG[True] or off not in agg:
            continue
        for s, on_f in agg[w].items():
            off_f = agg[off].get(s)
            if off_f is None or "unavailable" in on_f or "unavailable" in off_f:
                continue
            row = {}
            for m in ("busbw_gbs", "p99_us", "drops"):
                a, b = _median(on_f, m), _median(off_f, m)
                row[m] = a / b if a is not None and b else None
            out.setdefault(base, {})[s] = row
    return out


def reach(agg: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Whether the mix rule can be met at all, from bounds measured in the same comparison, per
    workload with both figures and per static setting: a busbw win needs (1 + WIN) x the
    setting's median busbw, which the line rate caps (``line_bps``: the elephants' NIC ports,
    every plane); a p99 win needs (1 - WIN) x its median p99, below which the job never ran
    alone (the fastest p99 of any repetition of any setting with that job alone, ``PARTS``:
    more traffic does not shorten it). A setting against which both are out of reach excludes
    the target for every policy ("out_of_reach"). Without a part run alone, the p99 side is not
    bounded (None): the target is then not excluded."""
    out: dict[str, dict[str, Any]] = {}
    for w, per in agg.items():
        part = part_of(w, "p99_us")
        alone = [(s, f["p99_us"]["min"]) for s, f in agg.get(part or "", {}).items()
                 if "unavailable" not in f and f.get("p99_us")]
        floor = min(alone, key=lambda x: x[1]) if alone else None
        against: dict[str, dict[str, Any]] = {}
        for s, f in per.items():
            bw, p99 = _median(f, "busbw_gbs"), _median(f, "p99_us")
            if not is_static(s) or bw is None or p99 is None:
                continue
            line = f.get("line_bps")
            need_bw, need_p99 = bw * (1 + WIN), p99 * (1 - WIN)
            against[s] = {"busbw_needed_bps": need_bw * 8e9, "line_bps": line,
                          "busbw_reachable": None if not line else need_bw * 8e9 <= line,
                          "p99_needed_us": need_p99, "p99_floor_us": floor[1] if floor else None,
                          "p99_floor_from": f"{part}, {floor[0]}" if floor else None,
                          "p99_reachable": None if floor is None else need_p99 >= floor[1]}
        if against:
            out[w] = {"against": against,
                      "out_of_reach": [s for s, v in against.items()
                                       if v["busbw_reachable"] is False and v["p99_reachable"] is False]}
    return out


def format_targets(agg: dict[str, dict[str, dict[str, Any]]], candidate: str = DYNAMIC) -> str:
    """The targets' verdict as lines: per workload, each check with its ratio and bound, met or not."""
    judged = targets(agg, candidate)
    if all("unavailable" in v for v in judged.values()):
        return ""
    lines = [f"## targets for {candidate} (medians; 'within spread': the ranges overlap, the repetitions could "
             f"turn it; mix rule: against every static, busbw >= {1 + WIN:.2f}x at p99 <= {1 + LOSS:.2f}x, or "
             f"p99 <= {1 - WIN:.2f}x at busbw >= {1 - LOSS:.2f}x)"]
    for w, v in judged.items():
        if "unavailable" in v:
            lines.append(f"{w:<10} {v['unavailable']}")
            continue
        lines.append(f"{w:<10} {'MET' if v['met'] else 'not met'}")
        for c in v["checks"]:
            spread_note = ", within spread" if c["within_spread"] else ""
            if isinstance(c["value"], dict):
                got = f"busbw {c['value']['busbw_gbs']:.2f}x, p99 {c['value']['p99_us']:.2f}x"
                won = {"busbw_gbs": ": wins on busbw", "p99_us": ": wins on p99"}.get(c.get("won") or "", "")
                verdict = "met" if c["met"] else "NOT"
                lines.append(f"  {verdict}  mix rule against {c['against']}: {got}{won}{spread_note}")
            else:
                sign = ">=" if c["check"].startswith("busbw") else "<="
                lines.append(f"  {'met' if c['met'] else 'NOT'}  {c['check']} ({c['against']}): {c['value']:.3f} "
                             f"{sign} {c['bound']:.2f}{spread_note}")
    for mix, figs in interference(agg).items():
        for metric, v in figs.items():
            what = "busbw" if metric == "busbw_gbs" else "message p99"
            of_line = f", {v['of_line']:.2f} of the line rate" if v.get("of_line") else ""
            lines.append(f"{mix}: its {what} under its best static ({v['mix_setting']}) is {v['ratio']:.2f}x the best "
                         f"with the job alone ({v['alone_workload']}, {v['alone_setting']}){of_line}")
    for w, r in reach(agg).items():
        for s in r["out_of_reach"]:
            v = r["against"][s]
            lines.append(f"{w}: a {WIN:.0%} win against {s} is out of reach for any policy: busbw would need "
                         f"{v['busbw_needed_bps'] / 1e6:.1f} Mbit/s, above the line rate ({v['line_bps'] / 1e6:.1f}); "
                         f"p99 would need {v['p99_needed_us'] / 1e3:.2f} ms, below the fastest with the job alone "
                         f"({v['p99_floor_us'] / 1e3:.2f} ms, {v['p99_floor_from']})")
        if not r["out_of_reach"]:
            lines.append(f"{w}: a {WIN:.0%} win against every static is not excluded by the line rate"
                         + (" or the job alone" if any(v["p99_floor_us"] for v in r["against"].values()) else
                            " (no part of it ran alone)"))
    return "\n".join(lines)


# ---- tables ----------------------------------------------------------------------------

def format_report(agg: dict[str, dict[str, dict[str, Any]]], settings: Sequence[str] = SETTINGS) -> str:
    """Per workload: one line per setting with every figure as median [min-max]; then the
    ratios to the best static setting."""
    lines = []
    sw = max([9] + [len(s) for s in settings])       # a setting of one's own, KMIN:KMAX:PMAX, is longer
    head = (f"{'setting':<{sw}} {'runs':>4} {'busbw Mbit/s':>20} {'msg p50 ms':>20} {'msg p99 ms':>20} "
            f"{'queue p99 KB':>18} {'CE fraction':>20} {'drops':>14} {'wall s':>16}")
    for w, per in agg.items():
        lines += [f"## workload {w}: median [min-max] over repetitions", head, "-" * len(head)]
        for s in [s for s in settings if s in per]:
            f = per[s]
            if "unavailable" in f:
                lines.append(f"{s:<{sw}} {'':>4} {f['unavailable']}")
                continue
            cols = [(spread_text(f["busbw_gbs"], "{:.2f}", 8e3), 20), (spread_text(f["p50_us"], "{:.1f}", 1e-3), 20),
                    (spread_text(f["p99_us"], "{:.1f}", 1e-3), 20),
                    (spread_text(f["queue_p99_bytes"], "{:.1f}", 1e-3), 18),
                    (spread_text(f["ce_fraction"], "{:.3f}"), 20), (spread_text(f["drops"], "{:.0f}"), 14),
                    (spread_text(f["wall_s"], "{:.1f}"), 16)]
            lines.append(f"{s:<{sw}} {f['runs']:>4} " + " ".join(text.rjust(width) for text, width in cols))
            if f.get("wrong"):
                lines.append(f"{'':<{sw}} {'':>4} WRONG ELEMENTS: {f['wrong']}")
            for why in f.get("failed", []):
                lines.append(f"{'':<{sw}} {'':>4} one repetition {why}")
        lines.append("")
    rat = ratios(agg)
    head = f"{'workload':<10} {'setting':<{sw}} " + " ".join(f"{m:>10}" for m in RATIO_METRICS) + "   best static"
    lines += ["## ratio to the best static setting per workload (busbw: higher is better; times: lower)",
              head, "-" * len(head)]
    for w, per in rat.items():
        best = ", ".join(f"{m} {b[0]}" for m in RATIO_METRICS if (b := best_static(agg[w], m)))
        for s in [s for s in settings if s in per]:
            if "unavailable" in agg[w][s]:
                lines.append(f"{w:<10} {s:<{sw}} {agg[w][s]['unavailable']}")
                continue
            cells = " ".join(f"{'-' if per[s][m] is None else format(per[s][m], '.3f'):>10}" for m in RATIO_METRICS)
            lines.append(f"{w:<10} {s:<{sw}} {cells}   {best}")
    lines += format_pfc(agg, settings, sw)
    verdicts = [format_targets(agg, c) for c in POLICIES if any(c in per for per in agg.values())]
    return "\n".join(lines + [x for v in verdicts if v for x in ("", v)])


def format_pfc(agg: dict[str, dict[str, dict[str, Any]]], settings: Sequence[str], sw: int = 9) -> list[str]:
    """The PFC figures per workload that had PFC, the victim's slowdown, the difference PFC made (lines;
    none on a lossy comparison)."""
    lines: list[str] = []
    had = [w for w, per in agg.items() if any((f.get("pauses") or {}).get("n") for f in per.values())]
    if had:
        head = (f"{'workload':<16} {'setting':<{sw}} {'pause frames':>20} {'largest pause share':>22} "
                f"{'ports paused':>14} {'headroom drops':>16}")
        lines += ["## priority flow control: median [min-max] over repetitions (pause share: of the run, on the "
                  "port that paused most)", head, "-" * len(head)]
        for w in had:
            for s in [s for s in settings if s in agg[w] and "unavailable" not in agg[w][s]]:
                f = agg[w][s]
                lines.append(f"{w:<16} {s:<{sw}} {spread_text(f['pauses'], '{:.0f}'):>20} "
                             f"{spread_text(f['paused_share_max'], '{:.3f}'):>22} "
                             f"{spread_text(f['ports_paused'], '{:.0f}'):>14} "
                             f"{spread_text(f['headroom_drops'], '{:.0f}'):>16}")
        lines.append("")
    for w, per in victim_slowdown(agg).items():
        lines.append(f"## {w}: the elephant job's busbw beside the incast over its busbw alone (same setting)")
        for s in [s for s in settings if s in per]:
            v = per[s]
            lines.append(f"{w:<16} {s:<{sw}} {v['ratio']:.3f}  ({v['victim'] * 8e3:.2f} / {v['alone'] * 8e3:.2f} "
                         f"Mbit/s{', ranges overlap' if v['within_spread'] else ''})")
        lines.append("")
    diff = pfc_difference(agg)
    if diff:
        lines += ["## the difference PFC makes: median with PFC over median without, per setting",
                  f"{'workload':<16} {'setting':<{sw}} {'busbw':>8} {'msg p99':>8} {'drops':>8}"]
        for w, per in diff.items():
            for s in [s for s in settings if s in per]:
                cells = (f"{'-' if per[s][m] is None else format(per[s][m], '.3f'):>8}"
                         for m in ("busbw_gbs", "p99_us", "drops"))
                lines.append(f"{w:<16} {s:<{sw}} " + " ".join(cells))
        lines.append("")
    return lines


# ---- plots (matplotlib, imported when called) ------------------------------------------------

def queue_series(doc: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(seconds from the first sample, the largest sampled queue over the ports, bytes) of a run."""
    ecn = next((r["switch_ecn"] for r in doc.get("results", []) if r.get("switch_ecn")), None) or {}
    qs = ecn.get("queue_samples") or {}
    t, ports = qs.get("t") or [], qs.get("ports") or {}
    if not t:
        return [], []
    top = [max((p[k] for p in ports.values() if k < len(p)), default=0) for k in range(len(t))]
    return [x - t[0] for x in t], top


def threshold_series(doc: dict[str, Any], max_ports: int = 4) -> list[tuple[str, list[float], list[float]]]:
    """Kmin over time, [(label, seconds, bytes)]. A run under a controller policy other than
    static (``meta["ecn_policy"]``) with the run's "telemetry" (per port ``{"t": [...], "kmin":
    [...]}`` under "ports"): the ports whose Kmin moved most (at most ``max_ports``). Otherwise
    the static setting the run applied (``meta["ecn"]``), flat, one line per port rate."""
    meta = doc.get("meta", {})
    ports = (doc.get("telemetry") or {}).get("ports") or {}
    if meta.get("ecn_policy") not in (None, STATIC_POLICY) and ports:
        def moves(series: dict[str, Any]) -> int:
            ks = [k for k in series.get("kmin") or [] if k is not None]
            return sum(1 for x, y in itertools.pairwise(ks) if x != y)
        ranked = sorted(ports.items(), key=lambda kv: (-moves(kv[1]), kv[0]))[:max_ports]
        out = []
        for name, series in ranked:
            pts = [(float(t), float(k)) for t, k in zip(series.get("t") or [], series.get("kmin") or [], strict=False)
                   if k is not None]
            if pts:
                out.append((name, [t for t, _ in pts], [k for _, k in pts]))
        return out
    by_rate = (meta.get("ecn") or {}).get("by_rate_mbps") or {}
    ts, _ = queue_series(doc)
    span = [0.0, ts[-1] if ts else 1.0]
    return [(f"Kmin at {rate} Mbit/s", span, [th["kmin"]] * 2)
            for rate, th in sorted(by_rate.items(), key=lambda x: float(x[0]))]


def pause_series(doc: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(seconds, the largest share of an interval any switch port was held paused) over a run, from its
    controller telemetry (``paused_fraction`` per port, present where the run had PFC); empty without."""
    ports = (doc.get("telemetry") or {}).get("ports") or {}
    top: dict[float, float] = {}
    for series in ports.values():
        for t, v in zip(series.get("t") or [], series.get("paused_fraction") or [], strict=False):
            if v is not None:
                top[float(t)] = max(top.get(float(t), 0.0), float(v))
    ts = sorted(top)
    return ts, [top[t] for t in ts]


def plot_comparison(docs: dict[tuple[str, str], dict[str, Any]], path: str | Path) -> Path:
    """One row per workload: the largest switch queue over time and Kmin over time, one line per
    setting (``docs``: (workload, setting) -> one run's document, e.g. the last repetition's), and
    where the runs had PFC, the largest paused share of a port over time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    workloads = sorted({w for w, _ in docs})
    pauses = {key: pause_series(doc) for key, doc in docs.items()}
    paused = any(t for t, _ in pauses.values())
    cols = 3 if paused else 2
    fig, axes = plt.subplots(len(workloads), cols, figsize=(5.5 * cols, 3.2 * len(workloads)), squeeze=False)
    for i, w in enumerate(workloads):
        qa, ta = axes[i][0], axes[i][1]
        if paused:
            pa = axes[i][2]
            for (ww, s), (pt, pv) in sorted(pauses.items()):
                if ww == w:
                    pa.plot(pt, pv, linewidth=1, label=s)
            pa.set_title(f"{w}: largest paused share of a port")
            pa.set_xlabel("time (s)")
            pa.set_ylabel("paused share of the interval")
            pa.grid(True, alpha=0.3)
            pa.legend(fontsize=7)
        for (ww, s), doc in sorted(docs.items()):
            if ww != w:
                continue
            ts, q = queue_series(doc)
            line, = qa.plot(ts, [x / 1e3 for x in q], linewidth=1, label=s)
            for label, tt, k in threshold_series(doc):
                ta.step(tt, [x / 1e3 for x in k], where="post", color=line.get_color(), linewidth=1,
                        label=f"{s}: {label}")
        qa.set_title(f"{w}: largest switch queue (sampled)")
        qa.set_xlabel("time (s)")
        qa.set_ylabel("queue (KB)")
        qa.grid(True, alpha=0.3)
        qa.legend(fontsize=7)
        ta.set_title(f"{w}: ECN Kmin over time")
        ta.set_xlabel("time (s)")
        ta.set_ylabel("Kmin (KB)")
        ta.grid(True, alpha=0.3)
        ta.legend(fontsize=6)
    return _save(fig, path)


def _colour(setting: str, own: list[str]) -> str:
    """A setting's colour in the plots: the presets and dynamic their own, settings of one's
    own the next ones in the order given (grey beyond)."""
    if setting in KNOWN_SETTINGS:
        return f"C{KNOWN_SETTINGS.index(setting)}"
    k = len(KNOWN_SETTINGS) + own.index(setting) if setting in own else 9
    return f"C{min(k, 9)}"


def plot_figures(agg: dict[str, dict[str, dict[str, Any]]], path: str | Path) -> Path:
    """Bars with min-max whiskers: busbw, message p99 and queue p99 per workload and setting."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    figures = (("busbw_gbs", "busbw (Mbit/s)", 8e3), ("p99_us", "message p99 (ms)", 1e-3),
               ("queue_p99_bytes", "queue p99 (KB)", 1e-3))
    fig, axes = plt.subplots(1, len(figures), figsize=(13, 3.8))
    own = list(dict.fromkeys(s for per in agg.values() for s in per if s not in SETTINGS))
    for ax, (m, title, scale) in zip(axes, figures, strict=False):
        x = 0
        ticks, labels = [], []
        for w, per in agg.items():
            for s, f in per.items():
                sp = f.get(m) if "unavailable" not in f else None
                if sp and sp.get("n"):
                    ax.bar(x, sp["median"] * scale, color=_colour(s, own))
                    ax.errorbar(x, sp["median"] * scale, yerr=[[(sp["median"] - sp["min"]) * scale],
                                                               [(sp["max"] - sp["median"]) * scale]],
                                color="black", capsize=2)
                ticks.append(x)
                labels.append(f"{w}\n{s}")
                x += 1
            x += 1
        ax.set_xticks(ticks, labels, fontsize=6, rotation=90)
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


# ---- the shell: run everything on one emulation ---------------------------------------------

def dynamic_supported(run: Callable[..., Any]) -> bool:
    """Whether ``experiment.run`` takes ``ecn_policy`` (the dynamic-ECN work adds it)."""
    try:
        return "ecn_policy" in inspect.signature(run).parameters
    except (TypeError, ValueError):
        return False


def run_comparison(emu: Any, base: Any, workloads: Sequence[str], settings: Sequence[str], repeat: int, *,
                   say: Callable[[str], None] = print, run: Callable[..., Any] | None = None,
                   dynamic_policy: str = "dynamic") -> dict[str, Any]:
    """Run the :func:`schedule` on ``emu`` (``base``: an ``experiment.Plan`` giving transport,
    entropy and the generator's options; each workload replaces its jobs). The ``dynamic``
    setting runs the controller policy ``dynamic_policy`` (a built-in name, MODULE:CLASS or
    FILE.py: a policy of one's own, measured beside the statics). Returns the
    comparison document: {"meta", "records": [{"rep", "workload", "setting", "summary",
    "doc"} or {..., "unavailable"}], "aggregate", "ratios"}."""

    run = run or experiment.run
    dynamic_ok = dynamic_supported(run)
    order = schedule(workloads, settings, repeat)
    plans = {w: base.replace(job_specs=WORKLOADS[w], jobs=1) for w in workloads}
    for plan in plans.values():
        plan.jobs_on(emu.graph)                       # every mistake before the first run
    records: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for k, (rep, w, s) in enumerate(order):
        rec: dict[str, Any] = {"rep": rep, "workload": w, "setting": s}
        if is_policy(s) and not dynamic_ok:
            rec["unavailable"] = NOT_MERGED
            records.append(rec)
            continue
        say(f"[{k + 1}/{len(order)}] repetition {rep + 1}, {w}, ECN {s}")
        kwargs: dict[str, Any] = {"ecn_thresholds": "default" if is_policy(s) else thresholds_arg(s)}
        if is_policy(s):
            kwargs["ecn_policy"] = dynamic_policy if s == DYNAMIC else s
        started = time.monotonic()
        try:
            doc = run(plans[w], emu, progress=False, say=lambda m: None, **kwargs)
        except TypeError as exc:
            if not is_policy(s):
                raise
            rec["unavailable"] = f"{NOT_MERGED}: {exc}"
            records.append(rec)
            continue
        except UserError as exc:       # one run failed (a rank died...): say so, keep the others
            rec["unavailable"] = f"failed: {exc}"
            say(f"  failed: {exc}")
            records.append(rec)
            continue
        rec["summary"] = summarize(doc)
        rec["elapsed_s"] = time.monotonic() - started
        rec["doc"] = doc
        sm = rec["summary"]
        say(f"  {rec['elapsed_s']:.1f} s: busbw {_num(sm['busbw_gbs'], 8e3, 'Mbit/s')}, msg p50/p99 "
            f"{_num(sm['p50_us'], 1e-3, 'ms')}/{_num(sm['p99_us'], 1e-3, 'ms')}, queue p99 "
            f"{_num(sm['queue_p99_bytes'], 1e-3, 'KB')}, CE {_num(sm['ce_fraction'], 1, '')}, drops {sm['drops']}"
            + (f", pauses {sm['pauses']} (largest share {_num(sm['paused_share_max'], 1, '')}), headroom drops "
               f"{sm['headroom_drops']}" if sm.get("pauses") is not None else ""))
        records.append(rec)
    agg = aggregate(records)
    meta = {"workloads": {w: WORKLOADS[w] for w in workloads}, "settings": list(settings), "repeat": repeat,
            "order": [list(x) for x in order], "wall_s": time.monotonic() - t0,
            "dynamic_available": dynamic_ok, "dynamic_policy": dynamic_policy, "plan": base.as_dict()}
    return {"meta": meta, "records": records, "aggregate": agg, "ratios": ratios(agg), "targets": targets(agg),
            "interference": interference(agg), "reach": reach(agg), "victim": victim_slowdown(agg)}


def repetition_times(records: list[dict[str, Any]]) -> dict[int, float]:
    """Seconds the runs of each repetition took together (runs of pieces merged: per piece
    and repetition, numbered in order)."""
    out: dict[tuple[int, int], float] = {}
    for rec in records:
        if "elapsed_s" in rec:
            key = (rec.get("piece", 0), rec["rep"])
            out[key] = out.get(key, 0.0) + rec["elapsed_s"]
    return {k: out[key] for k, key in enumerate(sorted(out))}


def _num(v: float | None, scale: float, unit: str) -> str:
    return "-" if v is None else f"{v * scale:.3g}{' ' + unit if unit else ''}"


def save(comp: dict[str, Any], out_dir: str | Path, say: Callable[[str], None] = print) -> Path:
    """Write ``compare.json`` first, then print the tables and draw the plots."""

    out_dir = Path(out_dir)
    agg = comp["aggregate"]
    comp = {**comp, "targets": targets(agg), "interference": interference(agg), "reach": reach(agg),
            "victim": victim_slowdown(agg), "pfc_difference": pfc_difference(agg),
            **{f"targets_{c}": targets(agg, c) for c in POLICIES[1:] if any(c in per for per in agg.values())}}
    path = write_json(comp, out_dir / "compare.json")
    settings = comp["meta"]["settings"]
    say(format_report(comp["aggregate"], settings))
    reps = repetition_times(comp["records"])
    if reps:
        say("wall time per repetition: " + ", ".join(f"{t:.1f} s" for t in reps.values()))
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in comp["records"]:
        if "doc" in rec:
            last[(rec["workload"], rec["setting"])] = rec["doc"]
    plots = []
    if last:
        plots.append(plot_comparison(last, out_dir / "ecn-queues-thresholds.png"))
        plots.append(plot_figures(comp["aggregate"], out_dir / "ecn-figures.png"))
    say(f"comparison: {path}  plots: {', '.join(str(p) for p in plots) or 'none'}")
    return path


# ---- merging comparisons run in pieces ------------------------------------------------------

def merge(comps: list[dict[str, Any]]) -> dict[str, Any]:
    """One comparison from several (run one after the other, e.g. a workload at a time where a
    run may hold the emulation only a few minutes): their records together, each tagged with
    the piece it came from, aggregated again."""
    if not comps:
        raise UserError("nothing to merge")
    records = [dict(rec, piece=k) for k, comp in enumerate(comps) for rec in comp["records"]]
    settings: list[str] = []
    for comp in comps:
        settings += [s for s in comp["meta"]["settings"] if s not in settings]
    agg = aggregate(records)
    meta = {"pieces": [comp["meta"] for comp in comps], "settings": settings,
            "workloads": {w: spec for comp in comps for w, spec in comp["meta"]["workloads"].items()},
            "wall_s": sum(comp["meta"].get("wall_s", 0.0) for comp in comps)}
    return {"meta": meta, "records": records, "aggregate": agg, "ratios": ratios(agg), "targets": targets(agg),
            "interference": interference(agg), "reach": reach(agg)}


def resummarize(comp: dict[str, Any]) -> dict[str, Any]:
    """A comparison whose figures are taken again from the run documents it holds (a file written by
    an older version reads with today's figures); records without a document keep their summary."""
    records = [dict(rec, summary=summarize(rec["doc"])) if "doc" in rec else rec for rec in comp["records"]]
    agg = aggregate(records)
    return {**comp, "records": records, "aggregate": agg, "ratios": ratios(agg)}


def main(argv: list[str] | None = None) -> int:
    """``python -m hpnlab.fabric.experiments.compare_ecn compare.json [...] --out DIR``: the tables and plots
    again from comparison files; several files are merged into one comparison first."""
    import argparse
    import sys


    p = argparse.ArgumentParser(prog="python -m hpnlab.fabric.experiments.compare_ecn", description=main.__doc__)
    p.add_argument("files", nargs="+", help="compare.json written by hpnlab run --compare ecn")
    p.add_argument("--out", required=True, help="folder for the merged compare.json and the plots")
    args = p.parse_args(argv)
    try:
        comps = [resummarize(read_json(f)) for f in args.files]
        save(comps[0] if len(comps) == 1 else merge(comps), args.out)
    except (OSError, ValueError, KeyError, TypeError, UserError) as exc:
        print(f"hpnlab: cannot read comparisons from {', '.join(args.files)}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
