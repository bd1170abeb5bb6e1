#!/usr/bin/env python3
"""Benchmark: why the roce transport retransmits on a lossless fabric (issue 50), and the fix, side by side.

On mini-hpn (the preset's rates) one fabric without priority flow control and one with it are brought up
per repetition, interleaved. On the lossless fabric the roce transport's cells run in every variant of
``VARIANTS`` one after the other (same fabric, same minute); on the lossy fabric once, as it runs by default:

  all_to_all roce/flow and roce/spray   the default matrix's all-to-all cells, its largest size only
  incast                                7->1 (roce, 1 MiB gather, 8 ranks)

Per cell: the busbw fraction of line rate (the incast: completion time), the retransmissions split by cause
(``report.retransmission_causes``: spurious, i.e. the receiver got the original too, against lost; by trigger:
timeout, NACK; timeouts that fired while the flow's own NIC port was paused), the ranks' receive-socket
drops, the switch drops (switch model, headroom, Open vSwitch ingress) and the pauses. Prints median
[min-max] over the repetitions and the machine's load; ``--json FILE`` keeps every figure.
Needs root and Open vSwitch; without them it says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from bench_pfc import BRINGUP_PAUSE_S, BRINGUP_TRIES, drops_of

from hpnlab.fabric.emulation import Emulation, EmulationError
from hpnlab.fabric.emulation.options import EmulationOptions, PortOptions, SupervisionOptions
from hpnlab.fabric.emulation.preflight import measurement_refused
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.prepare import prepare
from hpnlab.fabric.scenario import spec
from hpnlab.fabric.stats import median_range as spread
from hpnlab.fabric.workload import report

TIMEOUT_S = 60.0
#: the roce transport's settings compared on the lossless fabric: as it was (the retransmission timer runs
#: while the NIC port is paused; a sprayed connection's receiver NACKs a hole by its age), as it is now (the
#: timer stands still while the port is paused; on a lossless fabric a hole is a loss only by its path's
#: sequence numbers), and that with a larger minimum retransmission timeout (the transport's default now,
#: ``roce.transport.LOSSLESS_MIN_RTO_S``)
VARIANTS: dict[str, dict[str, Any]] = {
    "before": {"pause_holds_timer": False, "lossless_holes": False, "lossless_min_rto_s": None},
    "after": {"pause_holds_timer": True, "lossless_holes": True, "lossless_min_rto_s": None},
    "after+rto200ms": {"pause_holds_timer": True, "lossless_holes": True, "lossless_min_rto_s": 0.2}}
A2A = experiment.Plan(collectives="all_to_all", transports="roce", entropies=("flow", "spray"), sizes="2M",
                      iterations=3, warmup=1, ranks=8, inplace=False, timeout_s=TIMEOUT_S)
INCAST = experiment.Plan(collectives="incast", transports="roce", entropies="flow", sizes="1M", iterations=4,
                         warmup=1, ranks=8, inplace=False, timeout_s=TIMEOUT_S)


def cell_key(r: dict) -> str:
    return f"{r['collective']} {r['transport']}/{r.get('entropy')}"


def figures(r: dict) -> dict[str, Any]:
    last = r["rows"][-1]["oop"]
    return {"fraction": report.largest_fraction(r), "time_s": min(last.get("times_s") or [last["time_us"] / 1e6]),
            **report.retransmission_causes(r), **drops_of(r),
            "send_blocked": int(report.flow_totals(r).get("send_blocked", 0)),
            "pause_waits": int(report.flow_totals(r).get("pause_waits", 0)),
            "wrong": report.wrong_total([r])}


def one_fabric(scenario: spec.Scenario, pfc: bool, say: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"pfc": pfc, "cells": {}}
    options = EmulationOptions(ports=PortOptions(pfc=pfc), supervision=SupervisionOptions(lock_wait_s=3600))
    t0 = time.monotonic()
    with Emulation(scenario, options, log=None) as emu:
        out["bringup_s"] = time.monotonic() - t0
        out["load"] = [os.getloadavg()[0]]
        variants = VARIANTS if pfc else {"lossy (default transport)": {}}
        for name, opts in variants.items():
            for plan in (A2A, INCAST):
                try:
                    doc = experiment.run(plan.replace(roce_options=opts), emu, progress=False)
                except UserError as exc:
                    say(f"    {name} {plan.collectives[0]} failed: {exc}")
                    continue
                for r in doc["results"]:
                    out["cells"][f"{cell_key(r)} | {name}"] = figures(r)
                out["load"].append(os.getloadavg()[0])
    out["seconds"] = time.monotonic() - t0
    return out


def summary(runs: list[dict]) -> list[str]:
    keys: list[str] = []
    for r in runs:
        keys += [k for k in r["cells"] if k not in keys]
    cols = [("fraction", "{:.3f}"), ("time_s", "{:.2f}"), ("retransmissions", "{:.0f}"), ("spurious", "{:.0f}"),
            ("lost", "{:.0f}"), ("timeout", "{:.0f}"), ("nack", "{:.0f}"), ("timeouts_paused", "{:.0f}"),
            ("socket_drops", "{:.0f}"), ("switch", "{:.0f}"), ("headroom", "{:.0f}"), ("ingress", "{:.0f}"),
            ("pauses", "{:.0f}"), ("send_blocked", "{:.0f}"), ("wrong", "{:.0f}")]
    lines = ["median [min-max] over the repetitions; fabric: lossy = --pfc off, lossless = --pfc on"]
    for k in keys:
        for pfc in (False, True):
            xs = [r["cells"][k] for r in runs if r["pfc"] == pfc and k in r["cells"]]
            if not xs:
                continue
            lines.append(f"{k} [{'lossless' if pfc else 'lossy'}, n={len(xs)}]")
            lines.append("    " + ", ".join(f"{c} {spread([x.get(c) for x in xs], f)}" for c, f in cols))
    for pfc in (False, True):
        rs = [r for r in runs if r["pfc"] == pfc]
        loads = [v for r in rs for v in r["load"]]
        if rs:
            up = spread([r["bringup_s"] for r in rs], "{:.0f}")
            lines.append(f"--pfc {'on' if pfc else 'off'}: bring-up {up} s, "
                         f"everything {spread([r['seconds'] for r in rs], '{:.0f}')} s, 1-min load average "
                         f"{spread(loads, '{:.1f}')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset", nargs="?", default="mini-hpn")
    p.add_argument("--repeat", type=int, default=3, help="repetitions, interleaved (default 3)")
    p.add_argument("--no-lossy", action="store_true", help="only the lossless fabric (its variants)")
    p.add_argument("--json", metavar="FILE", help="also write every figure here")
    args = p.parse_args(argv)
    say = lambda m: print(m, flush=True)  # noqa: E731
    refused = measurement_refused("bench_pfc_retx", args.repeat, 20, say)
    if refused is not None:
        return refused
    try:
        prepared = prepare(args.preset, {}, ranks=8)
    except UserError as exc:
        say(f"bench_pfc_retx: {exc}")
        return 2
    say(f"bench_pfc_retx: {args.preset}, {prepared.rates_line}; {args.repeat} repetitions")
    runs: list[dict] = []
    for k in range(args.repeat):
        for pfc in ((True,) if args.no_lossy else (False, True)):
            res = None
            for attempt in range(1, BRINGUP_TRIES + 1):
                try:
                    res = one_fabric(prepared.scenario, pfc, say)
                    break
                except (UserError, EmulationError) as exc:
                    say(f"  rep {k + 1} --pfc {'on' if pfc else 'off'}: bring-up {attempt} failed: {exc}")
                    time.sleep(BRINGUP_PAUSE_S)
            if res is None:
                continue
            runs.append(res)
            head = f"  rep {k + 1}/{args.repeat} --pfc {'on' if pfc else 'off'}: {res['seconds']:.0f} s; "
            say(head + "; ".join(
                f"{c}: {v['fraction']:.2f} retx {v['retransmissions']} (spurious {v['spurious']}, timeout "
                f"{v['timeout']}, nack {v['nack']}, socket drops {v['socket_drops']})"
                for c, v in res["cells"].items()))
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump({"preset": args.preset, "rates": prepared.rates_line, "runs": runs}, fh, indent=1,
                              default=str)
    for line in summary(runs):
        say(line)
    return 1 if any(v.get("wrong") for r in runs for v in r["cells"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
