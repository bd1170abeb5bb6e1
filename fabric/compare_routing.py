"""``hpnlab run --compare routing``: the routing modes side by side on one emulated fabric.

Modes (the roce transport's entropy policies, all on the same planes and the same source
ports from the controller's entropy map):

    ecmp       per-flow ECMP with one connection per plane per rank pair (hashed, as NCCL's QPs)
    flowlet    a new path after an idle gap (LetFlow-like)
    spray      oblivious per-packet spraying
    adaptive   per-packet, REPS-like feedback
    adaptive+w adaptive, with the switches' weights load-following (the controller's weighted mode,
               ``hpnlab.controller.weights``); every other mode runs with equal weights on the same
               tables, so it sends every source port where ecmp switches do. Needs an emulation started
               with ``routing_weights="weighted"``; otherwise this mode is left out (said once).

Fabrics: the emulated scenario as it is (symmetric), then the same with one leaf uplink
(both directions) shaped to ``asym_factor`` of its rate (and its ECN marking set for the new
rate). Collectives: the plan's (e.g.
``--collective all_to_all,all_reduce,permutation``). Every (collective, mode) cell runs ``reps`` times, interleaved
(repetition r of every mode before repetition r + 1 of any), so that a slow minute of the
machine hurts every mode alike.

Per cell: busbw and completion time (the collective's first size), per-uplink load
imbalance (max / mean of the bytes the leaves sent up, from the switch ports' counters),
the deepest reordering any receiver saw, retransmissions, every byte exactly once. Per
(fabric, collective, mode): mean, min, max and stdev over repetitions, and the ratio to
ecmp computed repetition by repetition (same position in the interleaving). JSON first
(``compare-routing.json``), then a table.
"""
from __future__ import annotations

import dataclasses
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import experiment
from . import graph as fgraph
from .errors import UserError
from .experiment import Plan
from .transport.accounting import exactly_once

MODES = ("ecmp", "flowlet", "spray", "adaptive", "adaptive+w")
#: mode -> (the transport's entropy policy, the switches' routing weights)
MODE_SETTINGS = {"ecmp": ("ecmp", "ecmp"), "flowlet": ("flowlet", "ecmp"), "spray": ("spray", "ecmp"),
                 "adaptive": ("adaptive", "ecmp"), "adaptive+w": ("adaptive", "weighted")}
COLLECTIVES = ("all_to_all", "all_reduce", "permutation")


# ---- pure: figures of one cell, and the summary --------------------------------------------

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


def cell_figures(res: dict, uplink_bytes: list[int]) -> dict:
    """The figures of one run of one cell (one job's result)."""
    row = res["rows"][0]["oop"]
    flows = res.get("flows", [])
    return {"busbw_gbs": row["busbw_gbs"], "time_us": row["time_us"], "wrong": row["wrong"],
            "uplink_imbalance": imbalance(uplink_bytes),
            "max_reorder": max((f.get("max_reorder", 0) for f in flows), default=0),
            "retransmissions": sum(f.get("retransmissions", 0) for f in flows),
            "exactly_once": all(exactly_once(f) is not False for f in flows)}


def _spread(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": None, "min": None, "max": None, "stdev": None, "n": 0}
    return {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs),
            "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def summarize(runs: list[dict], baseline: str = "ecmp") -> list[dict]:
    """Per (fabric, collective, mode): every figure's spread, and the per-repetition ratio
    of busbw (and completion time) to the baseline mode's same repetition."""
    keys = sorted({(r["fabric"], r["collective"], r["mode"]) for r in runs},
                  key=lambda k: (k[0], k[1], MODES.index(k[2]) if k[2] in MODES else 99))
    by = {(r["fabric"], r["collective"], r["mode"], r["rep"]): r for r in runs}
    out = []
    for fabric, coll, mode in keys:
        mine = [r for r in runs if (r["fabric"], r["collective"], r["mode"]) == (fabric, coll, mode)]
        row: dict[str, Any] = {"fabric": fabric, "collective": coll, "mode": mode}
        for fig in ("busbw_gbs", "time_us", "uplink_imbalance", "max_reorder", "retransmissions"):
            row[fig] = _spread([r[fig] for r in mine])
        ratios, time_ratios = [], []
        for r in mine:
            base = by.get((fabric, coll, baseline, r["rep"]))
            if base and base["busbw_gbs"]:
                ratios.append(r["busbw_gbs"] / base["busbw_gbs"])
                time_ratios.append(r["time_us"] / base["time_us"])
        row["busbw_ratio_to_" + baseline] = _spread(ratios)
        row["time_ratio_to_" + baseline] = _spread(time_ratios)
        row["exactly_once"] = all(r["exactly_once"] for r in mine)
        row["wrong"] = sum(r["wrong"] for r in mine)
        out.append(row)
    return out


def table(summary: list[dict], baseline: str = "ecmp") -> list[str]:
    key = "busbw_ratio_to_" + baseline
    lines = [f"{'fabric':<11} {'collective':<12} {'mode':<10} {'busbw GB/s':>11} {'x ' + baseline:>17} "
             f"{'imbalance':>9} {'reorder':>7} {'retx':>6}  exactly once"]
    for r in summary:
        b, q = r["busbw_gbs"], r[key]
        ratio = f"{q['mean']:.2f} [{q['min']:.2f}-{q['max']:.2f}]" if q["n"] else "-"
        imb = r["uplink_imbalance"]["mean"]
        lines.append(f"{r['fabric']:<11} {r['collective']:<12} {r['mode']:<10} {b['mean']:>11.5f} {ratio:>17} "
                     f"{imb if imb is None else format(imb, '.2f'):>9} {r['max_reorder']['max']:>7} "
                     f"{r['retransmissions']['mean']:>6.0f}  {'yes' if r['exactly_once'] else 'NO'}")
    return lines


# ---- side effects: counters and shaping on the emulation ------------------------------------

def read_tx_bytes(intfs: list[str]) -> list[int]:
    out = []
    for name in intfs:
        try:
            out.append(int(Path(f"/sys/class/net/{name}/statistics/tx_bytes").read_text()))
        except (OSError, ValueError):
            out.append(-1)
    return out


def set_rate(intf: str, rate_mbps: float, mtu: int) -> None:
    """Change an interface's htb class (as the emulation shaped it) to ``rate_mbps``."""
    frame = mtu + 14
    burst = max(2 * frame, int(rate_mbps * 1e6 / 8 / 1000))
    r = subprocess.run(["tc", "class", "change", "dev", intf, "parent", "1:", "classid", "1:1", "htb",
                        "rate", f"{rate_mbps:g}mbit", "ceil", f"{rate_mbps:g}mbit", "burst", str(burst),
                        "cburst", str(burst), "quantum", str(frame)], capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"cannot reshape {intf}: {r.stderr.strip()[:200]}")


def reshape(emu: Any, intf: str, rate_mbps: float, mtu: int) -> None:
    """Shape ``intf`` to ``rate_mbps``, and tell the emulation's ECN stage (its marker drains
    a virtual queue at the port's rate; its thresholds are set again for the new rate)."""
    set_rate(intf, rate_mbps, mtu)
    stage = getattr(emu, "ecn", None)
    if stage is not None and intf in getattr(stage, "ports", {}):
        from .emulation import ecn

        stage.ports[intf] = dataclasses.replace(stage.ports[intf], rate_mbps=rate_mbps)
        kmin, kmax, pmax = ecn.default_thresholds(rate_mbps, mtu)
        stage.set_thresholds(kmin, kmax, pmax, ports=intf)


def compare(emu: Any, base: Plan, *, reps: int = 5, collectives: tuple[str, ...] | None = None,
            modes: tuple[str, ...] = MODES, asym_factor: float = 0.5,
            say: Callable[[str], None] = lambda _m: None, save: Callable[[dict], Any] | None = None) -> dict:
    """Run the comparison on a started emulation; returns the JSON document. ``collectives``:
    default the plan's; ``save`` gets the document so far after every cell (a run cut short
    keeps what it measured)."""
    from .mn import emulated_mbps

    if reps < 1:
        raise UserError(f"--repeat must be at least 1, got {reps}")
    collectives = tuple(collectives or base.collectives)
    unknown = [m for m in modes if m not in MODE_SETTINGS]
    if unknown:
        raise UserError(f"unknown routing mode(s) {', '.join(unknown)}: use {', '.join(MODES)}")
    if any(MODE_SETTINGS[m][1] == "weighted" for m in modes) and getattr(emu, "_weights_control", None) is None:
        say("adaptive+w left out: the emulation's controller does not run weighted mode's tables")
        modes = tuple(m for m in modes if MODE_SETTINGS[m][1] != "weighted")
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
    fabrics = [("symmetric", None), ("asymmetric", (intf, peer_intf, rate))]
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
                        if getattr(emu, "routing_weights", "ecmp") != weights:
                            emu.set_routing_weights(weights)
                        plan = base.replace(collectives=coll, transports="roce", entropies=entropy)
                        cells = plan.jobs_on(g)
                        hosts = {h for jobs in cells.values() for j in jobs for h in (j.labels or [])}
                        leaves = {p["leaf"] for h in hosts for p in fgraph.host_ports(g, h)}
                        ups = [i for lf, i in ups_all if lf in leaves]
                        before = read_tx_bytes(ups)
                        [res] = experiment.run(plan, emu, progress=False)["results"]
                        after = read_tx_bytes(ups)
                        delta = [a - b if a >= 0 and b >= 0 else -1 for a, b in zip(after, before, strict=True)]
                        fig = cell_figures(res, delta)
                        runs.append({"fabric": fabric, "collective": coll, "mode": mode, "rep": rep, **fig,
                                     "uplink_bytes": dict(zip(ups, delta, strict=True))})
                        say(f"  {fabric} rep {rep + 1}/{reps} {coll} {mode}: busbw {fig['busbw_gbs']:.5f} GB/s, "
                            f"imbalance {fig['uplink_imbalance'] or 0:.2f}, retx {fig['retransmissions']}")
                        if save is not None:
                            save(_doc(s.name, reps, modes, collectives, asym_factor, [intf, peer_intf], base, runs))
        finally:
            if shaped:
                for i in shaped[:2]:
                    reshape(emu, i, shaped[2], s.emulation.mtu)
    return _doc(s.name, reps, modes, collectives, asym_factor, [intf, peer_intf], base, runs)


def _doc(scenario: str, reps: int, modes: tuple, collectives: tuple, asym_factor: float, shaped: list,
         base: Plan, runs: list[dict]) -> dict:
    return {"kind": "compare-routing", "scenario": scenario, "reps": reps, "modes": list(modes),
            "collectives": list(collectives), "asym_factor": asym_factor, "shaped_uplink": shaped,
            "plan": base.as_dict(), "summary": summarize(runs), "runs": runs}
