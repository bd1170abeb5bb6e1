"""`hpnlab run`: one experiment end to end: emulate the scenario (Mininet + OVS + the
controller), run the collective generators on the emulated hosts, report like nccl-tests.

Comma lists run a matrix on the same emulated fabric, e.g. ``--collective
all_reduce,all_to_all --transport roce,tcp --entropy flow,spray`` (tcp ignores entropy).
Results: a table per run, a comparison table (busbw / line rate, retransmissions, CE
marks, CNPs, reordering, generator CPU), ``results.json`` (scenario, kernel capabilities,
emulation metadata, every parameter) and PNG plots, under ``--out``.
The experiment itself is ``hpnlab.fabric.experiment`` (a Plan run on an Emulation).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hpnlab.fabric import collectives as col
from hpnlab.fabric import experiment, report, spec
from hpnlab.fabric.placement import PLACEMENTS

from .cmd_collective import add_generator_args, default_out, plan_from_args
from .cmd_emulate import DEFAULT_BFD_MS, add_port_type_arg, port_type_line

DEFAULTS = experiment.RUN_DEFAULTS


def register(sub) -> None:
    p = sub.add_parser("run", help="emulate a scenario and run collectives on it end to end (root)",
                       description=__doc__)
    p.add_argument("scenario", nargs="?", default="mini-hpn", metavar="SCENARIO",
                   help="preset or YAML file (default mini-hpn)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a scenario field, e.g. --set emulation.host_mbps=5")
    p.add_argument("--collective", default=",".join(DEFAULTS.collectives),
                   help=f"comma list of {', '.join(col.COLLECTIVES)} (default {','.join(DEFAULTS.collectives)})")
    p.add_argument("--placement", default=DEFAULTS.placement, choices=PLACEMENTS,
                   help="where the ranks sit (default cross-rail: across leaves, through the spines)")
    p.add_argument("--ranks", type=int, default=None,
                   help=f"ranks per job (default {DEFAULTS.ranks}, or every host of a smaller fabric; one per host; "
                        f"the emulated rates come from the measured budget: hpnlab doctor --measure)")
    p.add_argument("--jobs", type=int, default=DEFAULTS.jobs, help="concurrent jobs on disjoint hosts (default 1)")
    p.add_argument("--controller", default="hpnlab", help="hpnlab (default) or none")
    p.add_argument("--policy", help="controller routing policy (aggregate or host-routes)")
    p.add_argument("--no-ecn", action="store_true", help="no ECN marking stage on switch ports")
    p.add_argument("--no-fast-failover", action="store_true",
                   help="no local protection (fast-failover groups keep only their primary bucket): "
                        "the controller-only baseline")
    p.add_argument("--bfd", type=int, nargs="?", default=0, const=DEFAULT_BFD_MS, metavar="MS",
                   help=f"BFD on every switch-to-switch port (as in `hpnlab emulate`; alone: {DEFAULT_BFD_MS} ms)")
    p.add_argument("--timeline", metavar="FILE",
                   help="failure timeline (YAML/JSON, as for `hpnlab emulate`) run through every run of the "
                        "matrix, its times counted from each run's start")
    add_port_type_arg(p)
    add_generator_args(p, hosts=False)
    # matrix defaults differ from `hpnlab collective`: comma lists, fewer sizes and iterations
    p.set_defaults(func=cmd_run, transport=",".join(DEFAULTS.transports), entropy=",".join(DEFAULTS.entropies),
                   iters=DEFAULTS.iterations,
                   minbytes=str(min(DEFAULTS.size_list)), maxbytes=str(max(DEFAULTS.size_list)),
                   no_inplace=not DEFAULTS.inplace)
    for action in p._actions:                      # comma lists instead of single choices
        if action.dest in ("transport", "entropy"):
            action.choices = None
    p.add_argument("--inplace", dest="no_inplace", action="store_false",
                   help="also run the in-place columns (off by default in runs: halves the time)")


def default_ranks(g, jobs: int) -> int:
    """The default ranks per job: ``RUN_DEFAULTS.ranks``, or every host a job gets on a smaller fabric."""
    from hpnlab.fabric import graph as fgraph
    return max(2, min(DEFAULTS.ranks, len(fgraph.hosts(g)) // max(1, jobs)))


def cmd_run(args: argparse.Namespace) -> int:
    from hpnlab.fabric import graph as fgraph
    from hpnlab.fabric import sizing
    from hpnlab.fabric.emulation import Emulation, EmulationError

    overrides = spec.parse_overrides(args.overrides)
    scenario = spec.load(args.scenario, overrides)
    g = fgraph.build(scenario)
    ranks = args.ranks if args.ranks is not None else default_ranks(g, args.jobs)
    plan = plan_from_args(args, placement=args.placement, ranks=ranks, jobs=args.jobs)
    sending = plan.ranks * plan.jobs * sizing.host_ports(g) // max(1, len(fgraph.hosts(g)))   # a rank: one host's ports
    rates, rates_line = sizing.run_rates(g, overrides, sizing.load_budget(), os.cpu_count() or 1, sending)
    if rates:
        scenario = spec.load(args.scenario, spec.deep_merge(overrides, rates))
        g = fgraph.build(scenario)
    cells = plan.jobs_on(g)                         # every mistake shows before anything is built
    events = None
    if args.timeline:
        from hpnlab.fabric.emulation import timeline as tl
        events = tl.load(args.timeline, g)
        experiment.check_timeline(events, len(cells))      # before anything is built
    say = lambda m: print(m, flush=True)  # noqa: E731
    hosts = fgraph.hosts(g)
    say(f"emulating {scenario.name}: {len(hosts)} hosts, {g.number_of_nodes() - len(hosts)} switches; "
        f"{len(cells)} run(s); {rates_line}")
    try:
        with Emulation(scenario, controller=args.controller, policy=args.policy, ecn=not args.no_ecn,
                       fast_failover=not args.no_fast_failover, bfd_ms=args.bfd, port_type=args.port_type) as emu:
            md = emu.metadata
            say(f"up in {emu.timings.get('up_s', 0):.1f} s: datapath {md.get('datapath')}, "
                f"shaping {md.get('shaping')}, ECN {md.get('ecn')}")
            say(port_type_line(md))
            for line in md.get("not_emulated", []):
                say(f"not emulated here: {line}")
            doc = experiment.run(plan, emu, progress=not args.quiet, say=say, timeline=events)
            doc["meta"].update(command=" ".join(sys.argv), scenario=spec.to_dict(scenario),
                               kernel=emu.caps.as_dict() if emu.caps else None, emulation=dict(md),
                               timings=dict(emu.timings), uname=" ".join(os.uname()),
                               rates=rates_line)
    except EmulationError as exc:
        print(f"hpnlab: emulation failed: {exc}", file=sys.stderr)
        return 1
    report.save(doc, Path(args.out) if args.out else default_out("run"), say)
    return 1 if report.wrong_total(doc["results"]) else 0
