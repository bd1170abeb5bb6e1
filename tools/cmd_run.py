"""`hpnlab run`: one experiment end to end: emulate the scenario (Mininet + OVS + the
controller), run the collective generators on the emulated hosts, report like nccl-tests.

Comma lists run a matrix on the same emulated fabric, e.g. ``--collective
all_reduce,all_to_all --transport roce,tcp --entropy flow,spray`` (tcp ignores entropy).
Results: a table per run, a comparison table (busbw / line rate, retransmissions, CE
marks, CNPs, reordering, generator CPU), ``results.json`` (scenario, kernel capabilities,
emulation metadata, every parameter) and PNG plots, under ``--out``.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from hpnlab.fabric import collectives as col
from hpnlab.fabric import ranks, spec
from hpnlab.fabric.errors import UserError

from .cmd_collective import add_generator_args, default_out, jobs_from_args, present


def register(sub) -> None:
    p = sub.add_parser("run", help="emulate a scenario and run collectives on it end to end (root)",
                       description=__doc__)
    p.add_argument("scenario", nargs="?", default="mini-hpn", metavar="SCENARIO",
                   help="preset or YAML file (default mini-hpn)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a scenario field, e.g. --set emulation.host_mbps=5")
    p.add_argument("--collective", default="all_reduce,all_to_all",
                   help=f"comma list of {', '.join(col.COLLECTIVES)} (default all_reduce,all_to_all)")
    p.add_argument("--placement", default="cross-rail", choices=ranks.PLACEMENTS,
                   help="where the ranks sit (default cross-rail: across leaves, through the spines)")
    p.add_argument("--ranks", type=int, default=4,
                   help="ranks per job (default 4: one per host NIC; more ranks on a 2-core machine "
                        "exceed userspace OVS's packet rate)")
    p.add_argument("--jobs", type=int, default=1, help="concurrent jobs on disjoint hosts (default 1)")
    p.add_argument("--controller", default="hpnlab", help="hpnlab (default) or none")
    p.add_argument("--policy", help="controller routing policy (aggregate or host-routes)")
    p.add_argument("--no-ecn", action="store_true", help="no ECN marking stage on switch ports")
    add_generator_args(p, hosts=False)
    # matrix defaults differ from `hpnlab collective`
    p.set_defaults(func=cmd_run, transport="roce,tcp", entropy="flow,spray", iters=3, maxbytes="1M",
                   minbytes="128K", no_inplace=True)
    for action in p._actions:                      # comma lists instead of single choices
        if action.dest in ("transport", "entropy"):
            action.choices = None
    p.add_argument("--inplace", dest="no_inplace", action="store_false",
                   help="also run the in-place columns (off by default in runs: halves the time)")


def _split(text: str, known: tuple, what: str) -> list[str]:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    for t in items:
        if t not in known:
            raise UserError(f"unknown {what} {t!r} (known: {', '.join(known)})")
    return items


def matrix(args) -> list[tuple[str, str, str]]:
    """(collective, transport, entropy) runs; tcp runs once whatever the entropy list."""
    colls = [col.canonical(c) for c in str(args.collective).split(",") if c.strip()]
    transports = _split(args.transport, ("roce", "tcp"), "transport")
    entropies = _split(args.entropy, ("flow", "spray", "adaptive"), "entropy")
    if not colls:
        raise UserError("--collective is empty")
    runs = []
    for c in colls:
        for t in transports:
            for e in (entropies if t == "roce" else [entropies[0]]):
                runs.append((c, t, e))
    return runs


def plan_jobs(args, g, run: tuple[str, str, str]) -> tuple[list[ranks.Job], list[list[str]]]:
    """The jobs of one (collective, transport, entropy) run on graph g, and their hosts."""
    from hpnlab.fabric.mn import emulated_mbps

    s = g.graph["scenario"]
    placed = ranks.place(g, args.placement, args.ranks, args.jobs)
    ns = type(args)(**vars(args))
    ns.collective, ns.transport, ns.entropy = run
    line = emulated_mbps(s, s.host_rate_gbps) * 1e6
    jobs = jobs_from_args(ns, [[p.addrs for p in job] for job in placed], line, s.emulation.mtu,
                          labels=[[p.host for p in job] for job in placed])
    for job in jobs:
        ranks.validate(job)
    return jobs, [[p.host for p in job] for job in placed]


def run_on(emu, args, runs, say=print) -> list[dict]:
    """Run every (collective, transport, entropy) of ``runs`` on a live emulation."""
    results = []
    for k, run in enumerate(runs):
        jobs, hosts = plan_jobs(args, emu.graph, run)
        say(f"[{k + 1}/{len(runs)}] {run[0]} over {run[1]}" + (f" ({run[2]} entropy)" if run[1] == "roce" else "")
            + f": {len(jobs)} job(s) x {jobs[0].nranks} ranks, {args.placement}, "
            f"line rate {jobs[0].line_rate_bps / 1e6:g} Mbit/s x {len(jobs[0].addrs[0])} port(s) per rank")
        spawner = ranks.EmulationSpawner(emu, {j.job: hosts[j.job] for j in jobs})
        out = ranks.run_jobs(jobs, spawner, progress=not args.quiet)
        ecn = None
        if getattr(emu, "ecn", None) is not None:
            try:
                counters = emu.ecn.counters()
                ecn = {"ce_marked": sum(c.get("ce_marked", 0) or 0 for c in counters.values()),
                       "max_queue_bytes": max((c.get("max_queue_bytes", 0) or 0 for c in counters.values()),
                                              default=0)}
                emu.ecn.reset_counters()
            except Exception as exc:   # counters are informative; keep the run's results
                ecn = {"error": f"{type(exc).__name__}: {exc}"}
        for r in out:
            r["placement"] = args.placement
            r["hosts"] = hosts[r["job"]]
            r["switch_ecn"] = ecn
        results.extend(out)
    return results


def cmd_run(args) -> int:
    from hpnlab.fabric import graph as fgraph
    from hpnlab.fabric.emulation import Emulation, EmulationError

    overrides = spec.parse_overrides(args.overrides)
    scenario = spec.load(args.scenario, overrides)
    runs = matrix(args)
    g = fgraph.build(scenario)
    for run in runs:                                # every mistake shows before anything is built
        plan_jobs(args, g, run)
    say = lambda m: print(m, flush=True)  # noqa: E731
    out_dir = Path(args.out) if args.out else default_out("run")
    emu = Emulation(scenario, controller=args.controller, policy=args.policy, ecn=not args.no_ecn)
    say(f"emulating {scenario.name}: {len(fgraph.hosts(g))} hosts, "
        f"{g.number_of_nodes() - len(fgraph.hosts(g))} switches; {len(runs)} run(s)")
    t0 = time.monotonic()
    try:
        with emu:
            md = emu.metadata
            say(f"up in {emu.timings.get('up_s', 0):.1f} s: datapath {md.get('datapath')}, "
                f"shaping {md.get('shaping')}, ECN {md.get('ecn')}")
            for line in md.get("not_emulated", []):
                say(f"not emulated here: {line}")
            results = run_on(emu, args, runs, say)
            meta = {"command": " ".join(sys.argv), "scenario": spec.to_dict(scenario),
                    "kernel": emu.caps.as_dict() if emu.caps else None,
                    "emulation": {k: v for k, v in md.items()}, "timings": dict(emu.timings),
                    "time": time.time(), "uname": " ".join(os.uname()),
                    "wall_s": time.monotonic() - t0}
    except EmulationError as exc:
        print(f"hpnlab: emulation failed: {exc}", file=sys.stderr)
        return 1
    present(results, out_dir, meta, say)
    bad = sum((row[m] or {}).get("wrong") or 0 for r in results for row in r["rows"] for m in ("oop", "ip"))
    return 1 if bad else 0
