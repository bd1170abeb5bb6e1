#!/usr/bin/env python3
"""Benchmark: the rate up to which the collective generators keep up on this machine (issue 18).

The switches' budget (``tools/bench/bench_ports.py``) says how many packets Open vSwitch forwards
with one fast sender beside it. A run's ranks are Python processes on the same cores, and
past some rate they, not the switches, set the busbw: on a 2-core machine whose budget gave
host ports 54 Mbit/s, the sprayed all-reduce of 8 ranks reached 0.96 of line at 18 Mbit/s,
0.87 at 27, 0.74 at 36 and 0.55 at 54. This calibration measures that curve: mini-hpn at
``sizing.generator_rungs`` of the rate the switches' budget gives (a quarter of it up to all of
it), at the MTU the defaults use, runs the default matrix's most packet-hungry cell (all-reduce,
roce, spray: the highest busbw of the matrix, so the most packets per rank) with the default
rank count at the default matrix's largest size, ``--repeat`` times, interleaved (every rung
once, then again), on a fabric brought up for each run. It prints per rung the busbw fraction
(busbw / the rank's line rate) of each repetition, the CPU left idle and the load average, and
the ceiling ``sizing.generator_ceiling`` reads from them: the rate where the median fraction
falls below ``sizing.GENERATOR_KEEP`` of the lowest rung's.

``--save`` adds the result to the machine's budget (``generators``); the default rates
(``sizing.run_rates``) then take the lower of the switches' share and this ceiling.
``hpnlab doctor --measure`` runs it after ``bench_ports``. Needs root and Open vSwitch; without
them it says so and exits 0 (nothing to measure). Exit code 1 if an element came back wrong.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

from hpnlab.fabric.emulation import Emulation, sizing
from hpnlab.fabric.emulation.options import EmulationOptions, SupervisionOptions
from hpnlab.fabric.emulation.preflight import measurement_parser, measurement_refused, say
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.prepare import prepare
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec
from hpnlab.fabric.stats import median_range as spread
from hpnlab.fabric.workload import report

#: the calibration cell: the default matrix's cell with the highest busbw, so the most packets per rank
CELL = ("all_reduce", "roce", "spray")


def plan() -> experiment.Plan:
    d = experiment.RUN_DEFAULTS
    return d.replace(collectives=(CELL[0],), transports=(CELL[1],), entropies=(CELL[2],), sizes=(d.size_list[-1],))


def switch_rates(preset: str, budget: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The rates the switches' budget alone gives the default run (its generator ceiling left out),
    and the host ports sending at once."""
    g = fgraph.build(spec.load(preset))
    ranks = experiment.RUN_DEFAULTS.ranks
    sending = ranks * sizing.host_ports(g) // max(1, len(fgraph.hosts(g)))
    switches_only = {k: v for k, v in budget.items() if k != "generators"}
    rates, _ = sizing.run_rates(g, {}, switches_only, os.cpu_count() or 1, sending)
    return rates.get("emulation", {}), sending


def one_run(preset: str, host_mbps: float, ratio: float, mtu: int) -> dict[str, Any]:

    overrides = {"emulation": {"host_mbps": host_mbps, "max_mbps": round(host_mbps * ratio, 3), "mtu": mtu}}
    options = EmulationOptions(supervision=SupervisionOptions(lock_wait_s=600))
    with Emulation(prepare(preset, overrides, size=False).scenario, options, log=None) as emu:
        load = os.getloadavg()[0]
        doc = experiment.run(plan(), emu, progress=False)
    (r,) = doc["results"]
    return {"fraction": report.largest_fraction(r), "idle": 1.0 - doc["meta"]["machine_busy"], "load": load,
            "wrong": report.wrong_total(doc["results"]),
            "retx": report.flow_totals(r).get("retransmissions", 0)}


def main(argv: list[str] | None = None) -> int:
    p = measurement_parser(__doc__, 2, "repetitions of every rung, interleaved")
    p.add_argument("--save", action="store_true", help="add the result to this machine's budget")
    args = p.parse_args(argv)
    refused = measurement_refused("bench_generators", args.repeat, 20, say)
    if refused is not None:
        return refused
    budget = sizing.load_budget()
    if not (budget or {}).get("ports"):
        say("bench_generators: the switches' budget was never measured (tools/bench/bench_ports.py --save first)")
        return 0
    assert budget is not None
    try:
        base, sending = switch_rates(args.preset, budget)
    except UserError as exc:
        say(f"bench_generators: {exc}")
        return 2
    if not base:
        say("bench_generators: the switches' budget gives no rates for the default run; nothing measured")
        return 0
    mtu = int(base.get("mtu") or spec.load(args.preset).emulation.mtu)
    ratio = base["max_mbps"] / base["host_mbps"]
    rungs = sizing.generator_rungs(base["host_mbps"])
    say(f"bench_generators: {args.preset}, {experiment.RUN_DEFAULTS.ranks} ranks ({sending} host ports), "
        f"{' '.join(CELL)} at {plan().size_list[-1]} B, MTU {mtu}; the switches' budget gives {base['host_mbps']:g} "
        f"Mbit/s; rungs {', '.join(f'{r:g}' for r in rungs)} Mbit/s, {args.repeat} repetitions, interleaved")
    load_before = [round(v, 2) for v in os.getloadavg()]
    runs: dict[float, list[dict[str, Any]]] = {r: [] for r in rungs}
    wrong = 0
    t0 = time.monotonic()
    for k in range(args.repeat):
        for r in rungs:
            try:
                res = one_run(args.preset, r, ratio, mtu)
            except (UserError, RuntimeError, OSError) as exc:     # the emulation's own errors are RuntimeErrors
                say(f"bench_generators: the run at {r:g} Mbit/s failed ({str(exc).splitlines()[0][:300]}); "
                    f"nothing saved")
                return 1
            wrong += res["wrong"]
            runs[r].append(res)
            say(f"  rep {k + 1}/{args.repeat} {r:g} Mbit/s: fraction {res['fraction']:.3f}, retx {res['retx']}, "
                f"CPU idle {res['idle']:.0%}, load {res['load']:.1f}")
    gen = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "preset": args.preset,
           "cell": " ".join(CELL), "ranks": experiment.RUN_DEFAULTS.ranks, "sending_ports": sending, "mtu": mtu,
           "size": plan().size_list[-1], "switches_mbps": base["host_mbps"], "load": load_before,
           "load_after": [round(v, 2) for v in os.getloadavg()], "seconds": round(time.monotonic() - t0, 1),
           "rungs": [{"host_mbps": r, "fractions": [round(x["fraction"], 4) for x in xs],
                      "idle": [round(x["idle"], 3) for x in xs], "retx": [x["retx"] for x in xs]}
                     for r, xs in runs.items()]}
    say(f"{'Mbit/s':>8} {'fraction':>22} {'CPU idle':>18} {'load':>14}")
    for r, xs in runs.items():
        say(f"{r:>8g} {spread([x['fraction'] for x in xs], '{:.3f}'):>22} "
            f"{spread([x['idle'] for x in xs], '{:.0%}'):>18} {spread([x['load'] for x in xs], '{:.1f}'):>14}")
    ceiling = sizing.generator_ceiling(gen)
    if ceiling is not None:
        per_port = ceiling[0] / sending * 8 * (mtu + sizing.ETH) / 1e6
        say(f"ceiling: {per_port:.1f} Mbit/s per host port ({ceiling[1]}); median fraction per rung "
            + ", ".join(f"{r['host_mbps']:g}: {statistics.median(r['fractions']):.3f}" for r in gen["rungs"]))
    if wrong:
        say(f"{wrong} wrong elements: nothing saved")
        return 1
    if args.save:
        budget = sizing.load_budget() or budget
        budget["generators"] = gen
        say(f"saved to {sizing.save_budget(budget)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
