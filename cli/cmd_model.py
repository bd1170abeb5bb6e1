"""`hpnlab model`: the flow-level model at full scale (entropy policies side by side, failures)."""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from hpnlab.cli.args import add_scenario_args, load_scenario
from hpnlab.fabric.errors import UserError, short
from hpnlab.fabric.experiments import studies
from hpnlab.fabric.model import corrections as model_corrections
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.workload import collectives as col
from hpnlab.fabric.workload import report
from hpnlab.fabric.workload.collectives import parse_size, sweep

DEFAULT_DETECT = ",".join(f"{k}={v:g}" for k, v in model.FAILOVER_DEFAULT_MS.items())


def register(sub) -> None:
    p = sub.add_parser("model", help="flow-level model of a collective at full scale (entropy policies, failures)",
                       description=model.__doc__.split("\n\n")[0])
    add_scenario_args(p)
    p.add_argument("-c", "--collective", default="all_to_all",
                   help=f"one of {', '.join(model.MODEL_COLLECTIVES)} (default all_to_all)")
    p.add_argument("-b", "--minbytes", default="64M", help="smallest size per rank (nccl-tests -b), default 64M")
    p.add_argument("-e", "--maxbytes", default=None, help="largest size (nccl-tests -e), default = -b")
    p.add_argument("-f", "--stepfactor", type=float, default=4.0, help="size multiplication factor (-f), default 4")
    p.add_argument("--routing", default="flow,spray",
                   help=f"comma list of {', '.join(model.ROUTINGS)} (ecmp = flow); default flow,spray")
    p.add_argument("--hosts", type=int, default=None, help="hosts in the job (default: all)")
    p.add_argument("--placement", choices=("packed", "random"), default="random",
                   help="job placement: first hosts in order, or a random set in random ring order (default)")
    p.add_argument("--qps", type=int, default=4, help="connections (queue pairs) per rank pair, default 4")
    p.add_argument("--max-steps", type=int, default=16,
                   help="flowlet and broadcast: distinct steps modelled, default 16")
    p.add_argument("--exact-pairs", type=int, default=model.EXACT_PAIRS,
                   help=f"all-to-all: rank pairs modelled exactly up to this many, sampled above "
                        f"(the sampling error is printed), default {model.EXACT_PAIRS}")
    p.add_argument("--entropy-values", type=int, default=model.ENTROPY_VALUES,
                   help=f"entropy values (source ports) per plane a NIC uses, as the RoCE transport's ports_per_nic "
                        f"(capped at the entropy map's path count), default {model.ENTROPY_VALUES}")
    p.add_argument("--switch-weights", choices=model.SWITCH_WEIGHTS, default="ecmp",
                   help="the switches' multipath weights: ecmp (equal shares, default) or weighted (the controller's "
                        "--routing-weights weighted policy iterated over the model's own link loads to a fixed point, "
                        f"at most --weight-iterations, default {model.WEIGHT_ITERATIONS}; the iterations are printed)")
    p.add_argument("--weight-iterations", type=int, default=model.WEIGHT_ITERATIONS, help=argparse.SUPPRESS)
    p.add_argument("--jobs", metavar="SPEC",
                   help="several jobs at once on disjoint hosts (or on an earlier job's, on=), in hpnlab run's "
                        "--jobs syntax, e.g. "
                        "'all_reduce:ranks=64,size=256M;all_to_all:ranks=64,size=16M' (ranks count every rail "
                        "of a host, 2 hosts' worth without ranks=; -b is the size of a job without one; each "
                        "job is also run alone for its slowdown)")
    p.add_argument("--background", metavar="SPEC",
                   help="with --jobs: jobs in the same syntax that load the fabric for the whole run and "
                        "are not timed (elephants beside the timed jobs)")
    p.add_argument("--fail-links", type=int, default=0, help="fail this many random leaf-spine links")
    p.add_argument("--detect-ms", default=None,
                   help=f"with --fail-links: name=ms detection+convergence times (default {DEFAULT_DETECT}; "
                        f"not with --study: its failures study takes --failover-times)")
    p.add_argument("--detect-from", metavar="FILE",
                   help="with --fail-links: take the detection+convergence times from a failover benchmark's JSON "
                        "(tools/bench/bench_failover.py --json: the median loss window of each mode for a link "
                        "failure, measured on the emulated fabric) instead of --detect-ms")
    p.add_argument("--failover-times", metavar="FILE",
                   help="with --fail-links: each failover mode's detection and convergence times for the failover "
                        "chain (detection: traffic lost; detour over the fast-failover backups until convergence; "
                        "then the converged routes), from a failover comparison's JSON (tools/bench/bench_failover.py "
                        "--json: the median loss window and controller convergence of each mode for a link failure); "
                        "default: " + ", ".join(f"{k} {d:g}/{c:g} ms" for k, (d, c) in model.FAILOVER_CHAIN_MS.items()))
    p.add_argument("--corrections", choices=tuple(model_corrections.PRESETS),
                   default=model_corrections.DEFAULT_PRESET,
                   help="costs the fluid model leaves out, mechanism by mechanism (headers, the last packet's "
                        "round trip, the first window's overflow at the busiest link, and per load-balancing mode the "
                        "step's start, the first window's queueing and congestion control's steady share), shown as "
                        "a corrected time and efficiency beside the raw ones: htsim-100g (default: UEC's htsim with "
                        "NSCC on 100 Gbit/s fat-trees, the constants fitted by tools/bench/bench_htsim.py --fit on "
                        "named cells and validated on others; on other fabrics and rates an extrapolation) or none")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON results")
    add_study_args(p)
    p.set_defaults(func=cmd_model)


def reuse_freed_memory() -> bool:
    """Ask glibc to keep freed memory for the next arrays (big blocks from the heap, not a fresh
    mmap each; the heap not trimmed): a 130k step allocates and frees arrays of 30-130 MB by the
    hundred, and fresh pages are zeroed by the kernel on first touch (a third of the CPU of an
    adaptive 130k run, more on a loaded machine). Process-wide, so only here, in the command;
    HPNLAB_MODEL_MALLOC=default leaves the allocator alone. False where it does not apply (not glibc)."""
    if os.environ.get("HPNLAB_MODEL_MALLOC", "") == "default":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_max = -1, -2, -4      # glibc's mallopt parameters
        return bool(libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1)
                    and libc.mallopt(m_top_pad, 256 << 20))
    except (OSError, AttributeError):
        return False


def _failover_runs(path: str, flag: str, kind: str) -> dict[str, list[dict]]:
    """{mode: runs of one failure kind} of a failover benchmark's JSON, every loss window and
    convergence a number of milliseconds (or null); anything else is one UserError line naming ``flag``."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
        out = {str(mode): list(kinds.get(kind, [])) for mode, kinds in doc["runs"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{flag} {path}: not a failover benchmark's JSON ({type(exc).__name__})") from None
    for mode, runs in out.items():
        for r in runs:
            if not isinstance(r, dict):
                raise UserError(f"{flag} {path}: {mode}'s {kind} failures are not runs ({short(r)}): "
                                f"not a failover benchmark's JSON")
            for key in ("loss_window_ms", "convergence_ms"):
                v = r.get(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                    raise UserError(f"{flag} {path}: {mode}'s {kind} failure has {key} {short(v)}, "
                                    f"not a number of milliseconds")
    return out


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def detection_from(path: str, kind: str = "link", flag: str = "--detect-from") -> dict[str, float]:
    """{mode: median loss window ms} of one failure kind in a failover benchmark's JSON."""
    runs = _failover_runs(path, flag, kind)
    out = {mode: _median(vals) for mode, rs in runs.items()
           if (vals := [r["loss_window_ms"] for r in rs if r.get("loss_window_ms") is not None])}
    if not out:
        raise UserError(f"{flag} {path}: no {kind!r} failure measured in it")
    return out


def failover_times_from(path: str, kind: str = "link",
                        flag: str = "--failover-times") -> dict[str, tuple[float, float]]:
    """{mode: (detection ms, convergence ms)} from a failover comparison's JSON: the median loss
    window of each mode for one failure kind, and its median controller convergence where the run
    measured one (else the mode's default, model.FAILOVER_CHAIN_MS)."""
    detect = detection_from(path, kind, flag)
    runs = _failover_runs(path, flag, kind)
    out = {}
    for mode, ms in detect.items():
        conv = [r["convergence_ms"] for r in runs[mode] if r.get("convergence_ms") is not None]
        default = model.FAILOVER_CHAIN_MS.get(mode, (ms, ms))[1]
        out[mode] = (ms, _median(conv) if conv else max(ms, default))
    return out


def failover_inputs(args) -> tuple[dict[str, float], dict[str, tuple[float, float]] | None]:
    """(--detect-ms or --detect-from's detection times, --failover-times' chain times or None), read
    and checked before any work: a mistake in them is one line, not a traceback after the model ran."""
    detect = detection_from(args.detect_from) if args.detect_from else _parse_detect(args.detect_ms or DEFAULT_DETECT)
    times = failover_times_from(args.failover_times) if args.failover_times else None
    return detect, times


def _parse_detect(text: str) -> dict[str, float]:
    out = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise UserError(f"--detect-ms: expected name=milliseconds, got {item!r}") from None
    return out


def _stalled(count: int, pairs: list) -> str:
    """One line: how many connections have no path, between which rank pairs (a few named)."""
    shown = ", ".join(f"{a[0]}/rail{a[1]} -> {b[0]}/rail{b[1]}" for a, b in pairs[:3])
    more = f" and {len(pairs) - 3} more" if len(pairs) > 3 else ""
    return (f"{count} connections have no path ({len(pairs)} rank pairs: {shown}{more}); "
            f"the collective never completes")


def _rate(gbps: float) -> str:
    """A connection rate for the table: one decimal, or three significant digits below 1 Gbit/s
    (an all-to-all of 131,072 ranks gives each connection a few Mbit/s)."""
    return f"{gbps:.1f}" if gbps >= 1 or gbps == 0 else f"{gbps:.3g}"


def cmd_model(args) -> int:
    if args.study:
        if args.detect_ms is not None:
            raise UserError("--detect-ms is not used by --study (the failures study takes detection and convergence "
                            "times per mode from --failover-times FILE): drop it")
        return cmd_study(args)
    if args.background and not args.jobs:
        raise UserError("--background needs --jobs (the jobs it runs beside)")
    if args.jobs:
        for flag, bad in (("--fail-links", args.fail_links), ("-e", args.maxbytes),
                          ("--switch-weights weighted", args.switch_weights != "ecmp")):
            if bad:
                raise UserError(f"{flag} does not combine with --jobs")
    detect, times = failover_inputs(args)
    scenario = load_scenario(args)
    reuse_freed_memory()
    routings = [r.strip() for r in args.routing.split(",") if r.strip()]
    try:
        routings = [model.routing_name(r) for r in routings]
    except UserError:
        raise UserError(f"--routing: choose from {', '.join(model.ROUTINGS)} (ecmp = flow), "
                        f"got {args.routing!r}") from None
    lo = parse_size(args.minbytes)
    hi = parse_size(args.maxbytes) if args.maxbytes else lo
    if hi < lo:
        raise UserError(f"-e {args.maxbytes} is below -b {args.minbytes}")
    sizes = sweep(lo, hi, args.stepfactor)
    if args.entropy_values < 1:
        raise UserError(f"--entropy-values must be at least 1, got {args.entropy_values}")
    t0 = time.perf_counter()
    failed = None
    if args.fail_links:
        g = graph.build(scenario)
        failed = model.random_fabric_links(g, args.fail_links, args.seed)
        net = model.Network(g, failed, entropy_values=args.entropy_values)
        how = "built and indexed"
    else:              # the healthy fabric: the model network is cached between runs
        net, cached = model.cached_network(scenario, entropy_values=args.entropy_values)
        g = net.g
        how = f"loaded from the cache {model.cache_dir()}" if cached else "built, indexed and cached"
    print(f"# {scenario.name}: fabric {how} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.weight_iterations < 1:
        raise UserError(f"--weight-iterations must be at least 1, got {args.weight_iterations}")
    kw = dict(hosts=args.hosts, placement=args.placement, qps=args.qps, seed=args.seed, max_steps=args.max_steps,
              exact_pairs=args.exact_pairs, switch_weights=args.switch_weights,
              weight_iterations=args.weight_iterations)
    if args.jobs:
        return _run_mix(args, g, net, routings, lo, kw)
    results = []
    for size in sizes:
        for routing in routings:
            results.append(model.run_collective(g, args.collective, size, routing=routing, network=net, **kw))
    failure = None
    if failed:
        failure = {r: model.failure_impact(g, args.collective, sizes[-1], failed, detect_ms=detect,
                                           routing=r, entropy_values=args.entropy_values, **kw)
                   for r in routings}
        for r in routings:
            failure[r]["chain"] = model.failover_chain(g, args.collective, sizes[-1], failed, times=times, routing=r,
                                                       entropy_values=args.entropy_values, **kw)
    corr = model_corrections.for_fabric(model_corrections.preset(args.corrections), scenario.host_rate_gbps, results)
    corrected = [model_corrections.correct_result(r, corr) if corr is not model_corrections.NONE else None
                 for r in results]
    if args.json:
        json.dump({"scenario": scenario.name, "corrections": {"name": args.corrections, **corr.as_dict()},
                   "results": [r.as_dict() | ({"corrected": {k: c[k] for k in ("time_s", "busbw_gbs", "efficiency")}}
                                              if c else {})
                               for r, c in zip(results, corrected, strict=True)],
                   "failure": failure}, sys.stdout, indent=2, default=float)
        print()
        return 0
    first = results[0]
    print(f"# hpnlab model: {scenario.name}, {first.collective}, {first.ranks:,} ranks "
          f"({first.detail['hosts']:,} hosts, {args.placement} placement), {args.qps} QPs per pair, "
          f"NIC {first.nic_gbps:g} Gbit/s ({scenario.planes} planes x {scenario.host_rate_gbps:g}G)")
    corr_head = f" {'corrected us':>13} {'of line':>8}" if corr is not model_corrections.NONE else ""
    print(f"# {'size (B)':>12} {'routing':>8} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13} "
          f"{'of line':>8} {'conn. Gbit/s mean/min':>22}{corr_head}")
    for r, c in zip(results, corrected, strict=True):      # connection rates: max-min, over every step modelled
        corr_cols = f" {c['time_s'] * 1e6:>13.1f} {c['efficiency']:>8.1%}" if c else ""
        print(f"  {r.size_bytes:>12} {r.routing:>8} {r.time_s * 1e6:>12.1f} {r.algbw_gbs:>13.2f} "
              f"{r.busbw_gbs:>13.2f} {r.efficiency:>8.1%} "
              f"{_rate(r.rate_gbps_mean):>13} / {_rate(r.rate_gbps_min):<6}{corr_cols}")
    if corr is not model_corrections.NONE:
        modes = ", ".join(f"{r} as {corr.routing_policy.get(r, r)} (start {p.start_rtts:g} RTT, burst {p.burst:g}, "
                          f"efficiency {p.efficiency:g})"
                          for r in routings if (p := corr.policy(r)) is not None)
        print(f"# corrected ({args.corrections}): headers, the last packet's round trip, the first window's overflow "
              f"({'lossless' if corr.transport.lossless else 'trimmed and re-sent'}); {modes}; constants from "
              f"{corr.source}")
    for r in results:
        if r.stalled_connections:
            print(f"# {r.routing}, {r.size_bytes} B: {_stalled(r.stalled_connections, r.stalled_pairs)}")
    if len(routings) > 1 and routings[0] == "flow":
        for size in sizes:
            pair = {r.routing: r for r in results if r.size_bytes == size}
            base = pair["flow"].busbw_gbs
            ratios = ", ".join(f"{k} / flow {v.busbw_gbs / base:.2f}x"
                               for k, v in pair.items() if k != "flow" and base)
            print(f"# {size} B busbw: {ratios}")
    for r in results:
        w = r.detail.get("weighting")
        if w:
            state = "a fixed point" if w["converged"] else f"no fixed point within {w['iterations']}"
            print(f"# {r.routing}, {r.size_bytes} B: weighted switches: {w['iterations']} interval(s) of the "
                  f"controller's policy on the model's loads, {state}; {w['changes']} set re-weightings "
                  f"over {w['sets']} sets")
    for r in results:
        if r.steps and r.steps[0].sampled > 1:
            print(f"# {r.routing}, {r.size_bytes} B: all-to-all sampled, each modelled pair standing for "
                  f"{r.steps[0].sampled:.0f}; relative standard error of the time {r.sampling_error:.2%} "
                  f"(4 independent samples)")
    if failure:
        print(f"# {args.fail_links} leaf-spine link(s) failed at the start of the collective "
              f"({sizes[-1]} B):")
        for routing, f in failure.items():
            print(f"#   {routing}: healthy {f['healthy_s'] * 1e3:.2f} ms, "
                  f"after repair {f['after_repair_s'] * 1e3:.2f} ms, "
                  f"{f['connections_hit']} connections crossed a failed link")
            if f["stalled_after_repair"]:
                print(f"#     after repair: {_stalled(f['stalled_after_repair'], f['stalled_pairs_after_repair'])}")
            ch = f["chain"]
            print(f"#     failover chain (detection: lost; detour over the backups, {ch['detour_s'] * 1e3:.2f} ms "
                  f"for the whole collective, connections {_rate(ch['detour_rate_gbps_mean'])} / "
                  f"{_rate(ch['detour_rate_gbps_min'])} Gbit/s mean/min; then converged):")
            for name, d in ch["by_mode"].items():
                print(f"#     {name:<18} lost {d['loss_ms']:>8g} ms, detour {d['detour_ms']:>8.2f} ms "
                      f"(converged at {max(d['detect_ms'], d['converge_ms']):g} ms) -> "
                      f"{d['time_s'] * 1e3:>9.2f} ms ({d['slowdown']:.2f}x)")
            for name, d in f["by_detection"].items():
                print(f"#     flat stall: {name:<14} detect+converge {d['detect_ms']:>7g} ms -> "
                      f"{d['time_s'] * 1e3:>9.2f} ms ({d['slowdown']:.2f}x)")
    return 0


def _run_mix(args, g, net, routings: list[str], default_size: int, kw: dict) -> int:
    """``--jobs`` (and ``--background``): every routing, the jobs together and each alone."""
    from hpnlab.fabric.workload import jobspec

    jobs = jobspec.parse(args.jobs)
    background = jobspec.parse(args.background) if args.background else ()
    if g is None:                              # a cached network carries no graph; the jobs' placement needs it
        g = graph.build(net.s)
    runs: list[dict[str, Any]] = []
    bg: list[dict[str, Any]] = []
    for routing in routings:
        specs = model.mix_jobs(g, jobs, background, routing=routing, qps=args.qps, default_size=default_size,
                               placement=args.placement, seed=args.seed)
        bg = [{"collective": b.collective, "hosts": len(b.hosts), "size_bytes": b.size_bytes}
              for b in specs if b.background]       # placed alike under every routing
        opts = dict(seed=args.seed, network=net, max_steps=kw["max_steps"], exact_pairs=kw["exact_pairs"])
        together = model.run_jobs(g, specs, **opts)
        timed = [j for j in specs if not j.background]
        alone = [model.run_jobs(g, [j], **opts)[0] for j in timed]
        for i, (j, res, a) in enumerate(zip(timed, together, alone, strict=True)):
            runs.append({"routing": routing, "job": i, "collective": res.collective, "ranks": res.ranks,
                         "hosts": len(j.hosts), "size_bytes": res.size_bytes, "time_s": res.time_s,
                         "busbw_gbs": res.busbw_gbs, "efficiency": res.efficiency, "alone_time_s": a.time_s,
                         "alone_busbw_gbs": a.busbw_gbs, "slowdown": res.time_s / a.time_s if a.time_s else None,
                         "stalled_connections": res.stalled_connections})
    if args.json:
        json.dump({"scenario": g.graph["scenario"].name, "jobs": args.jobs, "background": args.background,
                   "background_jobs": bg, "placement": args.placement, "runs": runs},
                  sys.stdout, indent=2, default=float)
        print()
        return 0
    s = g.graph["scenario"]
    print(f"# hpnlab model: {s.name}, {len(jobs)} job(s) at once on disjoint hosts ({args.placement} placement)"
          + (f", beside {len(background)} background job(s) ({args.background})" if background else "")
          + f", {args.qps} QPs per pair")
    print(f"# {'routing':>8} {'job':>3} {'collective':<14} {'ranks':>7} {'size (B)':>12} {'time (us)':>12} "
          f"{'alone (us)':>12} {'slowdown':>8} {'busbw (GB/s)':>13} {'of line':>8}")
    for r in runs:
        slow = f"{r['slowdown']:.2f}x" if r["slowdown"] else "-"
        print(f"  {r['routing']:>8} {r['job']:>3} {r['collective']:<14} {r['ranks']:>7,} {r['size_bytes']:>12} "
              f"{r['time_s'] * 1e6:>12.1f} {r['alone_time_s'] * 1e6:>12.1f} {slow:>8} {r['busbw_gbs']:>13.2f} "
              f"{r['efficiency']:>8.1%}")
        if r["stalled_connections"]:
            print(f"#   {r['stalled_connections']} connection(s) stalled")
    return 0


def add_study_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--study", choices=studies.STUDIES,
                   help="a study, a table and a plot, JSON first (hpnlab.fabric.experiments.studies): routing "
                        "modes as the job grows, planes 1/2/4/8, route counts, failure impact, cross-campus")
    p.add_argument("--study-out", metavar="DIR", help="--study: where study-NAME.json and .png go (default results/)")
    p.add_argument("--study-max-ranks", type=int, default=None,
                   help="--study routing: stop the job sizes at this many ranks (default: the scenario's)")


def cmd_study(args: argparse.Namespace) -> int:
    """One study on the scenario: JSON, then the table, then the plot."""
    scenario = load_scenario(args)
    size = col.parse_size(args.minbytes)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    # hpnlab model's default --routing (flow,spray; ecmp,spray before) means every routing for a study
    default = args.routing in ("flow,spray", "ecmp,spray")
    routings = None if default else [r.strip() for r in args.routing.split(",") if r.strip()]
    if args.study == "routing":
        doc = studies.study_routing(scenario, size_bytes=size, routings=routings, max_steps=min(args.max_steps, 4),
                               qps=args.qps, seed=args.seed, max_ranks=args.study_max_ranks, say=say)
    elif args.study == "planes":
        doc = studies.study_planes(scenario)
    elif args.study == "routes":
        names = {scenario.name}
        extra = [spec.load(n) for n in ("mini-hpn", "small-hpn", "alibaba-hpn") if n not in names]
        doc = studies.study_routes([*extra, scenario])
    elif args.study == "failures":
        flag, source = ("--failover-times", args.failover_times) if args.failover_times else ("--detect-from",
                                                                                             args.detect_from)
        doc = studies.study_failures(scenario, size_bytes=size,
                                times=failover_times_from(source, flag=flag) if source else None,
                                routings=routings, hosts=args.hosts, qps=args.qps, seed=args.seed)
    else:
        doc = studies.study_cross_campus(scenario, size_bytes=size, qps=args.qps, seed=args.seed)
    out = Path(args.study_out) if args.study_out else Path("results")
    path = report.write_json(doc, out / f"study-{args.study}.json")
    if args.json:
        json.dump(doc, sys.stdout, indent=1, default=report.jsonable)
        print()
    else:
        for line in studies.table(doc):
            print(line)
    png = studies.plot(doc, str(out / f"study-{args.study}.png"))
    say(f"wrote {path} and {png}")
    return 0
