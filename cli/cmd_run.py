"""`hpnlab run`: one experiment end to end: emulate the scenario (Mininet + OVS + the
controller), run the collective generators on the emulated hosts, report like nccl-tests.

Comma lists run a matrix on the same emulated fabric, e.g. ``--collective
all_reduce,all_to_all --transport roce,tcp --entropy flow,spray`` (tcp ignores entropy).
Results: a table per run, a comparison table (busbw / line rate, retransmissions, CE
marks, CNPs, reordering, generator CPU), ``results.json`` (scenario, kernel capabilities,
emulation metadata, every parameter) and PNG plots, under ``--out``.
The experiment itself is ``hpnlab.fabric.experiments.runner`` (a Plan run on an Emulation).

``--jobs "all_reduce:ranks=4,size=1M;incast:ranks=5,msg=16K,gap=20ms"`` runs different jobs at
once on disjoint hosts (``hpnlab.fabric.workload.jobspec``); ``--ecn low|high|dcqcn|default|KMIN,KMAX,PMAX``
sets every switch port's ECN thresholds (``hpnlab.fabric.workload.ecn``); ``--compare ecn`` runs
the ECN comparison (``hpnlab.fabric.experiments.compare_ecn``): every workload under every ECN setting,
interleaved, ``--repeat`` times, written to compare.json with tables and plots.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from hpnlab.cli.args import add_emulation_args, add_scenario_args, emulation_options, overrides_of
from hpnlab.cli.cmd_collective import add_generator_args, default_out, plan_from_args
from hpnlab.cli.cmd_emulate import port_type_line
from hpnlab.cli.cmd_web import add_web_args, metrics_line, open_web, web_controller_args
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import compare_ecn as compare
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.prepare import prepare
from hpnlab.fabric.scenario import spec
from hpnlab.fabric.workload import collectives as col
from hpnlab.fabric.workload import ecn as ecn_settings
from hpnlab.fabric.workload import jobspec, report
from hpnlab.fabric.workload.placement import PLACEMENTS

DEFAULTS = experiment.RUN_DEFAULTS


def register(sub) -> None:
    p = sub.add_parser("run", help="emulate a scenario and run collectives on it end to end (root)",
                       description=__doc__)
    add_scenario_args(p, default="mini-hpn")
    p.add_argument("--collective", default=",".join(DEFAULTS.collectives),
                   help=f"comma list of {', '.join(col.COLLECTIVES)} (default {','.join(DEFAULTS.collectives)})")
    p.add_argument("--placement", default=DEFAULTS.placement, choices=PLACEMENTS,
                   help="where the ranks sit (default cross-rail: across leaves, through the spines)")
    p.add_argument("--ranks", type=int, default=None,
                   help=f"ranks per job (default: the scenario's emulation.ranks, else {DEFAULTS.ranks}, never more "
                        f"than the hosts a job gets; one per host; "
                        f"the emulated rates come from the measured budget: hpnlab doctor --measure)")
    p.add_argument("--jobs", default=str(DEFAULTS.jobs), metavar="N|SPECS",
                   help="concurrent jobs on disjoint hosts: a number of identical jobs (default 1), or different "
                        "jobs as 'COLLECTIVE:key=value,...;...' with keys ranks, size, msg (incast: bytes per "
                        "sender), iters, warmup, gap (e.g. 20ms), root, on (on=1: on job 1's hosts), after (a start "
                        "delay, e.g. 2s); e.g. "
                        "'all_reduce:ranks=4,size=1M;incast:ranks=5,msg=16K,iters=20,gap=20ms'")
    p.add_argument("--ecn", metavar="SETTING",
                   help=f"ECN thresholds on every switch egress port: a preset ({', '.join(ecn_settings.PRESETS)}; "
                        "computed from each port's rate) or KMIN,KMAX,PMAX (bytes, bytes, 0..1)")
    p.add_argument("--compare", choices=("ecn", "routing"),
                   help="ecn: every workload under the static ECN settings and dynamic, side by side "
                        "(see --workloads, --repeat, --settings); routing: ecmp, flowlet, spray, adaptive and adaptive "
                        "with weighted switches side by side on the fabric as it is and with one leaf uplink at half "
                        "rate (hpnlab.fabric.experiments.compare_routing)")
    p.add_argument("--repeat", type=int, default=5,
                   help="--compare: repetitions of every cell, interleaved (default 5)")
    p.add_argument("--workloads", default=",".join(compare.DEFAULT_WORKLOADS),
                   help=f"--compare: comma list of {', '.join(compare.WORKLOADS)} (default "
                        f"{','.join(compare.DEFAULT_WORKLOADS)}; alltoall and short are shared's jobs alone)")
    p.add_argument("--settings", default=",".join(compare.SETTINGS),
                   help=f"--compare ecn: comma list of {', '.join(compare.SETTINGS)} (default all) and static "
                        "settings of one's own as KMIN:KMAX:PMAX (e.g. 8K:128K:0.01, every switch port), compared "
                        "as statics")
    p.add_argument("--modes", default=None,
                   help="--compare routing: comma list of ecmp, flowlet, spray, adaptive, adaptive+w (the default) "
                        "and reps (REPS's recycling); ecmp always runs, the ratios are to it")
    add_emulation_args(p, on_controller_loss="restart",
                       ecn_policy_help="; with --compare ecn, the policy its dynamic setting runs (default dynamic)",
                       several_pfc=True)
    p.add_argument("--timeline", metavar="FILE",
                   help="failure timeline (YAML/JSON, as for `hpnlab emulate`) run through every run of the "
                        "matrix, its times counted from each run's start")
    add_web_args(p)
    add_generator_args(p, hosts=False)
    # matrix defaults differ from `hpnlab collective`: comma lists, fewer sizes and iterations
    p.set_defaults(func=cmd_run, transport=",".join(DEFAULTS.transports), entropy=",".join(DEFAULTS.entropies),
                   iters=DEFAULTS.iterations,
                   minbytes=None, maxbytes=None, no_inplace=not DEFAULTS.inplace)
    for action in p._actions:                      # comma lists instead of single choices
        if action.dest in ("transport", "entropy"):
            action.choices = None
    p.add_argument("--inplace", dest="no_inplace", action="store_false",
                   help="also run the in-place columns (off by default in runs: halves the time)")


def size_bounds(minbytes: str | None, maxbytes: str | None, one_size: bool = False,
                ranks: int = DEFAULTS.ranks) -> tuple[str, str]:
    """(-b, -e) of the run's sweep, as nccl-tests reads them: what is given, the defaults of a run
    of ``ranks`` ranks (``experiment.run_sizes``) for the rest; a lone -e below the default smallest
    size is the sweep's only size. ``one_size`` (``--compare routing``, one size per collective):
    the size given, -b's when both are."""
    if one_size and (minbytes or maxbytes):
        size = str(minbytes or maxbytes)
        return size, size
    defaults = experiment.run_sizes(ranks)
    smallest = min(defaults)
    if minbytes is None and maxbytes is not None and col.parse_size(maxbytes) < smallest:
        return maxbytes, maxbytes
    return minbytes or str(smallest), maxbytes or str(max(defaults))


def cmd_run(args: argparse.Namespace) -> int:
    from hpnlab.controller.ecn_policy import policy_class
    from hpnlab.fabric.emulation import Emulation, EmulationError
    from hpnlab.fabric.scenario import graph as fgraph

    # sizes: the run's default sweep; --compare routing sizes each collective to last about a second
    # (compare_routing.cell_bytes) unless -b/-e are given
    sizes_given = args.minbytes is not None or args.maxbytes is not None
    routing_collectives = None
    adjust_rates = None
    if args.compare == "routing":             # its own row names (two_jobs) are not the plan's collectives
        from hpnlab.fabric.experiments import compare_routing
        from hpnlab.fabric.experiments.compare_routing import TWO_JOBS, TWO_JOBS_COLLECTIVE
        routing_collectives = tuple(c.strip() for c in args.collective.split(",") if c.strip())
        if args.modes:
            compare_routing.parse_modes(args.modes)       # a wrong mode: one line before anything is built
        args.collective = ",".join(dict.fromkeys(TWO_JOBS_COLLECTIVE if c == TWO_JOBS else c
                                                 for c in routing_collectives))
        adjust_rates = compare_routing.comparison_rates
    elif args.modes:
        raise UserError("--modes chooses the routing modes of --compare routing (add --compare routing)")
    # --pfc on,off (comparisons only): one emulation per value, one after the other (one at a time machine-wide)
    pfcs: tuple[bool | None, ...] = tuple(args.pfc) if isinstance(args.pfc, tuple) else (args.pfc,)
    if len(pfcs) > 1 and args.compare is None:
        raise UserError("--pfc on,off runs a comparison both ways (add --compare ecn or --compare routing); "
                        "a run takes --pfc on or --pfc off")
    args.pfc = pfcs[0]
    web_args, metrics_port = web_controller_args(args)
    options = emulation_options(args, extra_args=web_args,
                                routing_weights="weighted" if args.compare == "routing" else args.routing_weights)
    policy_class(args.ecn_policy)                   # a wrong policy name: one line before anything is built
    ecn = ecn_settings.parse(args.ecn) if args.ecn else None
    comparing = None
    if args.compare == "ecn":
        if args.timeline or args.ecn or args.no_ecn:
            raise UserError("--compare ecn sets the ECN thresholds itself and runs no timeline "
                            "(drop --ecn, --no-ecn and --timeline)")
        comparing = (compare.parse_workloads(args.workloads), compare.parse_settings(args.settings))
    counted = jobspec.is_count(args.jobs)

    def make_plan(ranks: int) -> experiment.Plan:
        minbytes, maxbytes = size_bounds(args.minbytes, args.maxbytes, one_size=args.compare == "routing",
                                         ranks=ranks)
        sized = argparse.Namespace(**{**vars(args), "minbytes": minbytes, "maxbytes": maxbytes})
        if counted:
            plan = plan_from_args(sized, placement=args.placement, ranks=ranks, jobs=int(args.jobs))
        else:
            plan = plan_from_args(sized, placement=args.placement, ranks=ranks, jobs=1, job_specs=args.jobs)
        if comparing is not None:   # the workloads run roce (DCQCN answers the marks) with the first entropy given
            plan = plan.replace(transports=("roce",), entropies=plan.entropies[:1])
        return plan

    # load once, size the rates for the ranks that send, place every cell (every mistake shows here)
    prepared = prepare(args.scenario, overrides_of(args), plan=make_plan, jobs=int(args.jobs) if counted else 1,
                       ranks=args.ranks, adjust_rates=adjust_rates)
    scenario, g, cells, rates_line = prepared.scenario, prepared.graph, prepared.cells, prepared.rates_line
    plan = prepared.plan
    assert plan is not None
    if comparing is not None:
        for w in comparing[0]:
            plan.replace(job_specs=compare.WORKLOADS[w], jobs=1).jobs_on(g)
    events = None
    if args.timeline:
        from hpnlab.fabric.emulation import timeline as tl
        events = tl.load(args.timeline, g)
        experiment.check_timeline(events, len(cells))      # before anything is built
    say = lambda m: print(m, flush=True)  # noqa: E731
    hosts = fgraph.hosts(g)
    runs = (len(compare.schedule(comparing[0], comparing[1], args.repeat)) if comparing is not None
            else len(cells))
    say(f"emulating {scenario.name}: {len(hosts)} hosts, {g.number_of_nodes() - len(hosts)} switches; "
        f"{runs} run(s); {rates_line}")
    out_dir = Path(args.out) if args.out else default_out("compare-ecn" if comparing is not None else "run")
    if len(pfcs) > 1:
        return _compare_both_ways(args, pfcs, scenario, options, plan, comparing, out_dir, say,
                                  sizes_given=sizes_given, routing_collectives=routing_collectives)
    try:
        with Emulation(scenario, options) as emu, \
                open_web(emu, args, metrics_port, say) as web:
            md = emu.metadata
            say(f"up in {emu.timings.get('up_s', 0):.1f} s: datapath {md.get('datapath')}, "
                f"shaping {md.get('shaping')}, ECN {md.get('ecn')}")
            say(port_type_line(md))
            if metrics_line(web_args, metrics_port):
                say(str(metrics_line(web_args, metrics_port)))
            for line in md.get("not_emulated", []):
                say(f"not emulated here: {line}")
            if args.compare == "routing":
                return _compare_routing(args, emu, plan, say, sized=sizes_given, collectives=routing_collectives)
            if comparing is not None:
                dynamic = args.ecn_policy if args.ecn_policy != ecn_settings.STATIC_POLICY else "dynamic"
                doc = compare.run_comparison(emu, plan, comparing[0], comparing[1], args.repeat, say=say,
                                             dynamic_policy=dynamic)
            else:
                doc = experiment.run(plan, emu, progress=web.source.progress if web else not args.quiet,
                                     say=say, timeline=events,
                                     ecn_policy=args.ecn_policy,
                                     ecn_thresholds=ecn if not isinstance(ecn, ecn_settings.Thresholds)
                                     else ecn.as_dict())
            doc["meta"].update(command=" ".join(sys.argv), scenario=spec.to_dict(scenario),
                               kernel=emu.caps.as_dict() if emu.caps else None, emulation=dict(md),
                               timings=dict(emu.timings), uname=" ".join(os.uname()),
                               rates=rates_line)
            if web is not None and web.records:
                doc["web_events"] = web.records      # failures injected from the page, as timeline records
            keep_telemetry(emu, out_dir, say)
    except EmulationError as exc:
        print(f"hpnlab: emulation failed: {exc}", file=sys.stderr)
        return 1
    if comparing is not None:
        compare.save(doc, out_dir, say)
        return 1 if any(f.get("wrong") for per in doc["aggregate"].values() for f in per.values()) else 0
    report.save(doc, out_dir, say)
    return 1 if report.wrong_total(doc["results"]) else 0


def _compare_both_ways(args: argparse.Namespace, pfcs: tuple[bool | None, ...], scenario, options, plan,
                       comparing: tuple[tuple[str, ...], tuple[str, ...]] | None, out_dir: Path, say, *,
                       sizes_given: bool, routing_collectives: tuple[str, ...] | None) -> int:
    """``--compare ecn|routing --pfc on,off``: the comparison on one emulation per PFC setting, one after
    the other. ECN: one comparison whose workloads are named for the setting (``victim@pfc-on``), with the
    difference PFC makes per workload and setting (``compare_ecn.pfc_difference``); routing: one folder per
    setting (``OUT/pfc-on``, ``OUT/pfc-off``)."""
    import dataclasses

    from hpnlab.fabric.emulation import Emulation, EmulationError

    comps: list[dict] = []
    worst = 0
    for pfc in pfcs:
        tag = "on" if pfc else "off"
        opts = dataclasses.replace(options, ports=dataclasses.replace(options.ports, pfc=pfc))
        say(f"== PFC {tag} ==")
        try:
            with Emulation(scenario, opts) as emu:
                md = emu.metadata
                say(f"up in {emu.timings.get('up_s', 0):.1f} s: datapath {md.get('datapath')}, shaping "
                    f"{md.get('shaping')}, ECN {md.get('ecn')}, PFC {'on' if getattr(emu, 'pfc', None) else 'off'}")
                if args.compare == "routing":
                    sub = argparse.Namespace(**{**vars(args), "out": str(out_dir / f"pfc-{tag}")})
                    worst = max(worst, _compare_routing(sub, emu, plan, say, sized=sizes_given,
                                                        collectives=routing_collectives))
                    continue
                assert comparing is not None
                doc = compare.run_comparison(emu, plan, comparing[0], comparing[1], args.repeat, say=say,
                                             dynamic_policy=args.ecn_policy if args.ecn_policy != "static"
                                             else "dynamic")
                doc["meta"].update(emulation=dict(md), timings=dict(emu.timings))
                comps.append(compare.tag_pfc(doc, bool(getattr(emu, "pfc", None))))
                keep_telemetry(emu, out_dir, say, name=f"telemetry-pfc-{tag}.jsonl")
        except EmulationError as exc:
            print(f"hpnlab: emulation failed (PFC {tag}): {exc}", file=sys.stderr)
            return 1
    if args.compare == "routing":
        return worst
    merged = compare.merge(comps)
    merged["meta"].update(command=" ".join(sys.argv), scenario=spec.to_dict(scenario), uname=" ".join(os.uname()),
                          pfc=[c["meta"]["pfc"] for c in comps], settings=list(comparing[1]) if comparing else [])
    compare.save(merged, out_dir, say)
    return 1 if any(f.get("wrong") for per in merged["aggregate"].values() for f in per.values()) else 0


def keep_telemetry(emu, out_dir: Path, say, name: str = "telemetry.jsonl") -> Path | None:
    """The controller's whole telemetry file (every tick's per-port samples and every threshold change,
    the run's JSON has a summary of it) kept as ``out_dir/telemetry.jsonl`` before the emulation's
    run directory goes: ``python -m hpnlab.controller.ecn_replay`` replays it through a policy."""
    src = getattr(getattr(emu, "controller", None), "telemetry_file", None)
    if src is None or not Path(src).is_file() or not Path(src).stat().st_size:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / name
    shutil.copyfile(src, dst)
    say(f"controller telemetry: {dst} (replay: python -m hpnlab.controller.ecn_replay {dst})")
    return dst


def _compare_routing(args: argparse.Namespace, emu, plan: experiment.Plan, say, sized: bool = False,
                     collectives: tuple[str, ...] | None = None) -> int:
    """``--compare routing``: JSON first, then the table (see hpnlab.fabric.experiments.compare_routing). ``sized``:
    -b or -e given, every collective runs the plan's first size, the one given (``size_bounds``; else each
    its own, about a second long)."""
    from hpnlab.fabric.experiments import compare_routing

    out = Path(args.out) if args.out else default_out("compare-routing")
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(sys.argv), "emulation": dict(emu.metadata), "uname": " ".join(os.uname())}

    def save(doc: dict):
        return report.write_json({**doc, "meta": meta}, out / "compare-routing.json")

    sizes = dict.fromkeys(collectives or plan.collectives, plan.size_list[0]) if sized else None
    modes = compare_routing.parse_modes(args.modes) if args.modes else compare_routing.MODES
    doc = compare_routing.compare(emu, plan, reps=args.repeat, collectives=collectives, sizes=sizes, say=say,
                                  save=save, modes=modes)
    path = save(doc)
    for line in compare_routing.table(doc["summary"]):
        say(line)
    say(f"wrote {path} and {compare_routing.plot(doc['summary'], out / 'compare-routing.png')}")
    return 0 if all(r["exactly_once"] and not r["wrong"] for r in doc["summary"]) else 1
