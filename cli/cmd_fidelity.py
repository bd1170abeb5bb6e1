"""`hpnlab fidelity`: the flow model against the emulator, side by side (root, emulates).

Runs the same small scenario, placement, collective and entropy mode in emulation (``hpnlab
run``'s machinery at the emulated rates, one cell per collective and mode) and in the flow
model at the same rates with the same ranks and the generators' schedule; prints busbw and
completion time side by side with the relative error, per mode, and where they differ by more
than 10% why (``hpnlab.fabric.experiments.fidelity``). JSON first (``fidelity.json`` under ``--out``),
then the table. ``--from FILE`` compares an earlier ``fidelity.json`` again without emulating (the model side and
the explanations recomputed, written beside it as ``fidelity-recomputed.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hpnlab.cli.args import add_pfc_arg, add_scenario_args, overrides_of
from hpnlab.cli.cmd_collective import default_out, int_in
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import fidelity
from hpnlab.fabric.experiments.compare_ecn import comma_list
from hpnlab.fabric.scenario import spec
from hpnlab.fabric.workload import collectives as col
from hpnlab.fabric.workload import report

DEFAULT_MODES = "flow,ecmp,flowlet,spray,adaptive"


def register(sub) -> None:
    p = sub.add_parser("fidelity", help="the flow model against the emulator, side by side (root)",
                       description=__doc__)
    add_scenario_args(p, default="mini-hpn")
    p.add_argument("--collective", default="all_reduce,all_to_all", help="comma list (default all_reduce,all_to_all)")
    p.add_argument("--modes", default=DEFAULT_MODES,
                   help=f"the transport's entropy modes, each mapped to the model's routing (default {DEFAULT_MODES})")
    p.add_argument("--ranks", type=int_in(2, 64), default=4, help="ranks, one per host (default 4)")
    p.add_argument("--placement", default="cross-rail", help="where the ranks sit (default cross-rail)")
    p.add_argument("-b", "--size", default="1M", help="bytes per collective (default 1M)")
    p.add_argument("-n", "--iters", type=int_in(1, 1000), default=3, help="timed iterations (default 3)")
    p.add_argument("-w", "--warmup_iters", type=int_in(0, 1000), default=1, help="warm-up iterations (default 1)")
    p.add_argument("--repeat", type=int_in(1, 50), default=3,
                   help="emulated repetitions of every cell, interleaved; the table shows the median one's figures "
                        "and the range (default 3)")
    p.add_argument("--cc", default="dcqcn",
                   help="the roce transport's congestion control per cell, a comma list of dcqcn and none "
                        "(default dcqcn; dcqcn,none runs every cell both ways, and the gap between the two is "
                        "congestion control's measured share of the model's error)")
    add_pfc_arg(p, several=True)
    p.add_argument("--lock-wait", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds for another emulation on this machine to finish, before each fabric "
                        "(default 0: say who holds it and stop)")
    p.add_argument("--out", metavar="DIR", help="results directory (default results/fidelity-...)")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="compare the emulated runs of an earlier fidelity.json again (no emulation)")
    p.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    p.set_defaults(func=cmd_fidelity)


def _emulate(args: argparse.Namespace, modes: tuple[str, ...], ccs: tuple[str, ...], say) -> dict[str, Any]:
    """Every (collective, mode) cell on one emulated fabric per ``--pfc`` setting (the model stands for a
    lossless fabric: ``--pfc on,off`` measures what the emulation's losses cost the comparison); per cell
    its result, its hosts, the leaf uplinks' byte counts and ``pfc``."""
    pfcs: tuple[bool | None, ...] = args.pfc or (None,)
    runs = [_emulate_one(args, modes, ccs, say, pfc) for pfc in pfcs]
    first = runs[0]
    for other in runs[1:]:
        first["cells"] += other["cells"]
    first["plan"]["pfc"] = [r["pfc"] for r in runs]
    return first


def _emulate_one(args: argparse.Namespace, modes: tuple[str, ...], ccs: tuple[str, ...], say,
                 pfc: bool | None) -> dict[str, Any]:
    from hpnlab.fabric.emulation import Emulation, EmulationError, EmulationOptions
    from hpnlab.fabric.emulation.options import PortOptions, SupervisionOptions
    from hpnlab.fabric.experiments import compare_routing
    from hpnlab.fabric.experiments import runner as experiment
    from hpnlab.fabric.experiments.prepare import prepare
    from hpnlab.fabric.scenario import graph as fgraph

    def plan_for(ranks: int) -> experiment.Plan:
        return experiment.Plan(collectives=args.collective, transports="roce", entropies=modes, sizes=(args.size,),
                               iterations=args.iters, warmup=args.warmup_iters, inplace=False,
                               placement=args.placement, ranks=ranks)

    # load once, size the rates for the ranks, place every cell (every mistake shows before anything is built)
    prepared = prepare(args.scenario, overrides_of(args), plan=plan_for, ranks=args.ranks)
    scenario, plan, rates_line, overrides = prepared.scenario, prepared.plan, prepared.rates_line, \
        prepared.all_overrides
    assert plan is not None
    lossless = scenario.emulation.lossless.pfc if pfc is None else pfc
    say(f"emulating {scenario.name} ({rates_line}; PFC {'on' if lossless else 'off'})")
    options = EmulationOptions(ports=PortOptions(pfc=pfc),
                               supervision=SupervisionOptions(lock_wait_s=max(0.0, args.lock_wait)))
    cells = []
    try:
        with Emulation(scenario, options) as emu:
            ups_all = compare_routing.uplinks(emu.graph)
            order = [(c, m, x) for c in plan.collectives for m in modes for x in ccs]
            for rep, (coll, mode, cc) in ((r, cell) for r in range(args.repeat) for cell in order):
                cell = plan.replace(collectives=coll, entropies=mode, dcqcn=cc == "dcqcn")
                [jobs] = cell.jobs_on(emu.graph).values()
                hosts = list(jobs[0].labels or [])
                rail_of = {p["ip"]: p["rail"] for h in hosts for p in fgraph.host_ports(emu.graph, h)}
                ranks = [[h, rail_of[a[0]]] for h, a in zip(hosts, jobs[0].addrs, strict=True)]
                leaves = {p["leaf"] for h, rail in ranks for p in fgraph.host_ports(emu.graph, h)
                          if p["rail"] == rail}
                ups = [i for lf, i in ups_all if lf in leaves]
                before = compare_routing.read_tx_bytes(ups)
                doc = experiment.run(cell, emu, progress=False)
                after = compare_routing.read_tx_bytes(ups)
                [res] = doc["results"]
                delta = [a - b if a >= 0 and b >= 0 else -1 for a, b in zip(after, before, strict=True)]
                cells.append({"result": res, "cc": cc, "pfc": lossless, "rep": rep, "hosts": hosts, "ranks": ranks,
                              "perm": jobs[0].perm,
                              "planes_per_rank": len(jobs[0].addrs[0]),
                              "uplink_imbalance": compare_routing.imbalance(delta),
                              "load_average": doc["meta"]["load_average"]["after"],
                              "machine_busy": doc["meta"].get("machine_busy")})
                busbw = res["rows"][-1]["oop"]["busbw_gbs"]
                say(f"  emulated {coll} {mode} ({cc}, repetition {rep + 1}/{args.repeat}): "
                    f"busbw {busbw * 1e3:.3f} MB/s")
    except EmulationError as exc:
        raise UserError(f"emulation failed: {exc}") from None
    return {"scenario": spec.to_dict(scenario), "overrides": overrides, "rates": rates_line, "cells": cells,
            "pfc": lossless,
            "plan": {"collectives": list(plan.collectives), "modes": list(modes), "ranks": args.ranks,
                     "placement": args.placement, "size": args.size, "iters": args.iters, "cc": list(ccs),
                     "repeat": args.repeat}}


def compare_cells(emulated: dict[str, Any]) -> list[dict[str, Any]]:
    """The model for every emulated cell, and the comparison rows (pure given the cells): one
    row per (collective, mode, congestion control), from the repetition with the median time
    and the range of all; a DCQCN row reads the same cell without congestion control, where
    it ran, for congestion control's share of the gap."""
    from hpnlab.fabric.scenario import graph as fgraph

    scenario = spec.from_dict(emulated["scenario"])
    g = fgraph.build(scenario)
    groups: dict[tuple[str, str, str, bool], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for cell in emulated["cells"]:
        res = cell["result"]
        cc = cell.get("cc", "dcqcn")           # files from before --cc ran DCQCN
        pfc = bool(cell.get("pfc", False))      # files from before --pfc ran lossy switches
        fig = fidelity.emulated_figures(res, load_average=cell.get("load_average"), cpus=os.cpu_count(),
                                        uplink_imbalance=cell.get("uplink_imbalance"),
                                        machine_busy=cell.get("machine_busy"), cc=cc)
        groups.setdefault((res["collective"], res["entropy"], cc, pfc), []).append((fig, cell))
    medians = {}
    for key, reps in groups.items():
        fig, spread = fidelity.median_of([f for f, _ in reps])
        medians[key] = (fig, spread, next(c for f, c in reps if f is fig))
    rows = []
    for (coll, mode, cc, pfc), (fig, spread, cell) in medians.items():
        ranks = [(h, int(rail)) for h, rail in cell["ranks"]]
        if cell.get("planes_per_rank", scenario.planes) != scenario.planes:
            model: dict[str, Any] = {"missing": "the model gives every rank a port on every plane; this placement "
                                                "uses fewer"}
        else:
            model = fidelity.run_model(fidelity.emulated_graph(g, cell["hosts"]), ranks, mode, coll,
                                       fig["size_bytes"], perm=cell.get("perm"))
        free = medians.get((coll, mode, "none", pfc)) if cc != "none" else None
        row = fidelity.compare(fig, model, without_cc=free[0] if free else None, spread=spread)
        row["pfc"] = pfc
        if len({k[3] for k in medians}) > 1:    # both settings: the table tells the rows apart
            row["cc"] = f"{row['cc']}{'+pfc' if pfc else ''}"
        rows.append(row)
    return rows


def cmd_fidelity(args: argparse.Namespace) -> int:
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.monotonic()
    if args.from_file:
        try:
            doc = json.loads(Path(args.from_file).read_text())
            emulated = doc["emulated"]
        except (OSError, ValueError, KeyError) as exc:
            raise UserError(f"--from {args.from_file}: not a fidelity.json ({type(exc).__name__})") from None
        out = Path(args.from_file).parent
    else:
        modes = comma_list(args.modes, "--modes", "mode", tuple(fidelity.MODE_ROUTING))
        ccs = comma_list(args.cc, "--cc", "congestion control", fidelity.CONGESTION_CONTROLS)
        for c in args.collective.split(","):
            col.canonical(c)
        emulated = _emulate(args, modes, ccs, say)
        out = Path(args.out) if args.out else default_out("fidelity")
    t_emu = time.monotonic() - t0
    rows = compare_cells(emulated)
    doc = {"meta": {"command": " ".join(sys.argv), "emulated_s": round(t_emu, 1),
                    "load_average": list(os.getloadavg()), "cpus": os.cpu_count(),
                    "tolerance": fidelity.TOLERANCE},
           "emulated": emulated, "rows": rows}
    # a recomputation keeps the emulated run's own file
    path = report.write_json(doc, out / ("fidelity-recomputed.json" if args.from_file else "fidelity.json"))
    if args.json:
        json.dump(rows, sys.stdout, indent=1, default=report.jsonable)
        print()
    else:
        s = emulated["scenario"]
        print(f"# hpnlab fidelity: {s['name']}, {emulated['plan']['ranks']} ranks "
              f"({emulated['plan']['placement']}), {emulated['rates']}; busbw in MB/s (1e6 B/s), times in ms, "
              f"the model at the emulated rates")
        for line in fidelity.table(rows):
            print(line)
    say(f"wrote {path}")
    return 0


# ---- `hpnlab model SCENARIO --study NAME` (registered by cmd_model) ---------------------------------
