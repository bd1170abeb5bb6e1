#!/usr/bin/env python3
"""Benchmark: the default run before and after the measured budget (issue 18), side by side.

``hpnlab run mini-hpn`` runs ``experiment.RUN_DEFAULTS`` (all-reduce and all-to-all over roce
flow, roce spray and tcp, ``experiment.run_sizes``: 32-256 KiB per rank). Before the budget it ran
4 ranks on the preset's rates (host ports 10 Mbit/s, fabric 40, MTU 1500) at 128 KiB to 1 MiB;
now it runs 8 ranks at 256 KiB to 2 MiB at the rates ``prepare`` (``sizing.rates_for_ranks``) derives from this
machine's measured budget (``hpnlab doctor --measure``: the switches' ceiling and the
generators'). This benchmark runs both, interleaved (before, after, before, after, ...), each
on a fabric brought up for it, ``--repeat`` times, and prints per cell, at the largest size:

  aggregate  the bytes every rank puts on its ports per second, summed over the ranks
             (busbw x ranks: nccl-tests' busbw is one rank's share of the traffic), Mbit/s
  fraction   busbw / line rate (a rank's ports at their shaped rate)
  retx       retransmissions (roce: the transport's; tcp: tcpi_total_retrans)

median [min-max] over the repetitions, the after/before ratio of the aggregate paired per
repetition, the share of the machine's CPU left idle during each run and the load average.
The issue's goal: after >= 3x before in aggregate, with a fraction no lower than before.

A third configuration, ``control`` (``--no-control`` leaves it out), runs after's rank count at
before's rates, so that a fraction that changes can be told apart: by the rank count (8 ranks
make every all-to-all receiver a 7-to-1 incast) or by the rates.
Needs root and Open vSwitch; without them it says so and exits 0 (nothing to measure).
Exit code 1 if an element came back wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from hpnlab.fabric.emulation.preflight import measurement_refused, say
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.prepare import PreparedRun, prepare
from hpnlab.fabric.scenario.arguments import add_scenario_args, overrides_of
from hpnlab.fabric.stats import median_range as spread
from hpnlab.fabric.workload import report

GB = 1e9
BEFORE_RANKS = 4          # RUN_DEFAULTS.ranks before the budget (commit f39ea58 raised it to 8)


def configs(preset: str, control: bool = True, after_set: dict[str, Any] | None = None
            ) -> dict[str, tuple[PreparedRun, str]]:
    """``{name: (the run prepared, where its rates come from)}`` for before, after and (``control``)
    after's ranks at before's rates (``prepare``: the preset loaded once, after's rates sized for its
    ranks, every cell placed). ``after_set``: scenario overrides of after's run only (``--set``)."""
    ranks = experiment.RUN_DEFAULTS.ranks
    given = after_set or {}

    def plan(r: int) -> experiment.Plan:
        return experiment.RUN_DEFAULTS.replace(ranks=r, sizes=experiment.run_sizes(r))

    after = prepare(preset, given, plan=plan, ranks=ranks)
    line = after.rates_line + (f"; set: {json.dumps(given, sort_keys=True)}" if given else "")
    out = {"before": (prepare(preset, {}, plan=plan, ranks=BEFORE_RANKS, size=False),
                      f"the preset's rates (nothing measured), {BEFORE_RANKS} ranks"),
           "after": (after, line)}
    if control:
        out["control"] = (prepare(preset, {}, plan=plan, ranks=ranks, size=False),
                          f"the preset's rates, {ranks} ranks (what the rank count alone changes)")
    return out


def cell_key(r: dict) -> str:
    return f"{r['collective']} {r['transport']}{'/' + r['entropy'] if r.get('entropy') else ''}"


def one_run(run: PreparedRun) -> dict:
    """Bring the prepared fabric up, run the default matrix, and return per cell the aggregate
    Mbit/s, fraction and retransmissions at the largest size, plus CPU idle."""
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, SupervisionOptions

    scenario, plan = run.scenario, run.plan
    assert plan is not None
    with Emulation(scenario, EmulationOptions(supervision=SupervisionOptions(lock_wait_s=600)), log=None) as emu:
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        doc = experiment.run(plan, emu, progress=False)
        seconds = time.monotonic() - t0
    cells = {}
    for r in doc["results"]:
        busbw = r["rows"][-1]["oop"]["busbw_gbs"] * GB * 8
        cells[cell_key(r)] = {"aggregate_mbps": busbw * r["nranks"] / 1e6,
                              "fraction": report.largest_fraction(r),
                              "retx": report.flow_totals(r).get("retransmissions", 0)}
    return {"cells": cells, "wrong": report.wrong_total(doc["results"]), "seconds": seconds,
            "idle": 1.0 - doc["meta"]["machine_busy"], "load": load,
            "host_mbps": scenario.emulation.host_mbps, "mtu": scenario.emulation.mtu,
            "buffer_frames": scenario.emulation.buffer_frames}


def summary(runs: dict[str, list[dict]]) -> list[str]:
    before, after, control = runs["before"], runs["after"], runs.get("control", [])
    lines = [f"{'cell':<22} {'before Mbit/s':>22} {'after Mbit/s':>22} {'after/before':>20} "
             f"{'fraction before':>20} {'fraction after':>20}"
             + (f" {'fraction control':>20}" if control else "") + f" {'retx b/a' + ('/c' if control else ''):>12}"]
    keys = sorted(set().union(*(r["cells"] for r in before + after + control)))
    agg_ratios = []
    for k in keys:
        b, a, c = ([r["cells"][k] for r in rs if k in r["cells"]] for rs in (before, after, control))
        ratios = [x["aggregate_mbps"] / y["aggregate_mbps"] for x, y in zip(a, b, strict=False)
                  if y["aggregate_mbps"] > 0]
        agg_ratios += ratios
        retx = "/".join(f"{statistics.median([x['retx'] for x in xs]) if xs else 0:g}"
                        for xs in ((b, a, c) if control else (b, a)))
        lines.append(f"{k:<22} {spread([x['aggregate_mbps'] for x in b]):>22} "
                     f"{spread([x['aggregate_mbps'] for x in a]):>22} {spread(ratios, '{:.2f}'):>20} "
                     f"{spread([x['fraction'] for x in b], '{:.3f}'):>20} "
                     f"{spread([x['fraction'] for x in a], '{:.3f}'):>20}"
                     + (f" {spread([x['fraction'] for x in c], '{:.3f}'):>20}" if control else "")
                     + f" {retx:>12}")
    for name, rs in runs.items():
        lines.append(f"{name}: host ports {rs[0]['host_mbps']:g} Mbit/s, MTU {rs[0]['mtu']}, port buffers of at "
                     f"least {rs[0]['buffer_frames']} frames; run "
                     f"{spread([r['seconds'] for r in rs], '{:.0f}')} s; CPU idle during the run "
                     f"{spread([r['idle'] for r in rs], '{:.0%}')}; "
                     f"load average {spread([r['load'] for r in rs], '{:.1f}')}")
    if agg_ratios:
        lines.append(f"aggregate after/before over every cell and repetition: "
                     f"median {statistics.median(agg_ratios):.2f}, min {min(agg_ratios):.2f}, "
                     f"max {max(agg_ratios):.2f} (goal >= 3)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_args(p, default="mini-hpn",
                      set_help="a scenario override for the after run only (repeatable), e.g. "
                               "emulation.buffer_frames=96")
    p.add_argument("--repeat", type=int, default=3, help="repetitions of each configuration, interleaved (default 3)")
    p.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    p.add_argument("--no-control", action="store_true",
                   help="leave out the control run (after's ranks at before's rates)")
    args = p.parse_args(argv)
    refused = measurement_refused("bench_defaults", args.repeat, 100, say)
    if refused is not None:
        return refused
    try:
        cfg = configs(args.scenario, control=not args.no_control, after_set=overrides_of(args))
    except UserError as exc:
        say(f"bench_defaults: {exc}")
        return 2
    if not cfg["after"][0].all_overrides:
        say(f"bench_defaults: {cfg['after'][1]}; before and after would be the same run")
        return 0
    for name, (prepared, line) in cfg.items():
        say(f"{name}: {prepared.ranks} ranks; {line}")
    runs: dict[str, list[dict]] = {name: [] for name in cfg}
    wrong = 0
    for k in range(args.repeat):
        for name, (prepared, _) in cfg.items():
            res = one_run(prepared)
            wrong += res["wrong"]
            runs[name].append(res)
            say(f"  rep {k + 1}/{args.repeat} {name}: {res['seconds']:.0f} s, load {res['load']:.1f}, "
                + ", ".join(f"{c} {v['aggregate_mbps']:.1f}" for c, v in res["cells"].items()))
    for line in summary(runs):
        say(line)
    if args.json:
        report.write_json({"configs": {n: {"ranks": p.ranks, "overrides": p.all_overrides, "rates": line}
                                       for n, (p, line) in cfg.items()}, "runs": runs}, args.json)
    if wrong:
        say(f"{wrong} wrong elements")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
