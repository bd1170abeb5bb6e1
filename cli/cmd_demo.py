"""`hpnlab demo`: a small emulation end to end: build, connect, pingall, traffic, collectives
reported like nccl-tests (``hpnlab.fabric.experiments.runner.RUN_DEFAULTS``, the matrix `hpnlab run`
runs by default, on the same fabric), clean shutdown, summary."""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import cast

from hpnlab.cli.args import add_pfc_arg, add_scenario_args, overrides_of


def register(sub) -> None:
    p = sub.add_parser("demo", help="emulate a small fabric end to end and print a summary (root)")
    add_scenario_args(p, default="mini-hpn")
    add_pfc_arg(p)
    p.add_argument("--seconds", type=float, default=3.0, help="length of each iperf3 check (default 3)")
    p.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    p.add_argument("--no-collectives", action="store_true",
                   help="skip the collective experiment (the default 'hpnlab run' matrix)")
    p.add_argument("--no-measure", action="store_true",
                   help="on a machine whose budget was never measured, run at the preset's rates instead of "
                        "probing it first (a short probe, about 20 s, cached; hpnlab doctor --measure runs the "
                        "full calibration: the switches, about 2 min, and the generators, 2-5 min)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    from hpnlab.cli.cmd_collective import default_out
    from hpnlab.fabric.emulation import Emulation, EmulationError, EmulationOptions, sizing
    from hpnlab.fabric.emulation.options import PortOptions
    from hpnlab.fabric.emulation.traffic import iperf3
    from hpnlab.fabric.experiments import runner as experiment
    from hpnlab.fabric.experiments.prepare import prepare
    from hpnlab.fabric.scenario import spec
    from hpnlab.fabric.scenario.rates import emulated_mbps
    from hpnlab.fabric.workload import report

    say = lambda m: print(m, flush=True)  # noqa: E731
    t0 = time.monotonic()
    base = None if args.no_collectives else experiment.RUN_DEFAULTS    # what `hpnlab run` runs
    overrides = overrides_of(args)
    scenario = spec.load(args.scenario, overrides)       # a mistake shows before anything is measured
    # the rates the measured budget carries for the ranks, as `hpnlab run`: a first run probes the budget
    if base and not args.no_measure and not (sizing.load_budget() or {}).get("ports"):
        from hpnlab.fabric.emulation import budget as bench_ports
        say(f"[0/5] this machine's packet budget was never measured: a short probe sets safe rates (about "
            f"20 s, cached in {sizing.budget_path()}; hpnlab doctor --measure runs the full calibration, "
            f"--no-measure skips)")
        bench_ports.main(["--save", "--probe"])

    def plan_for(ranks: int) -> experiment.Plan:
        assert base is not None
        return base.replace(ranks=ranks, sizes=experiment.run_sizes(ranks))

    prepared = prepare(scenario, overrides, size=base is not None, jobs=base.jobs if base else 1,
                       plan=plan_for if base else None)
    plan, cells = prepared.plan, prepared.cells        # every mistake shows before anything is built
    if plan:
        say(prepared.rates_line)
        s0 = prepared.scenario
        swept = tuple(int(x) for x in cast(Sequence[int], plan.sizes))     # held as ints once checked
        fitted = experiment.fit_sizes(swept, plan.ranks, emulated_mbps(s0, s0.host_rate_gbps) * 1e6,
                                      s0.ports_per_host)
        if fitted != swept:     # a first look answers in bounded time: the sweep fits the rate
            plan = plan.replace(sizes=fitted)
            cells = plan.jobs_on(prepared.graph)
            say(f"      sizes {fitted[0] // 1024}K-{fitted[-1] // 1024}K: the largest all-reduce takes about "
                f"{experiment.DEMO_LARGEST_S:g} s per iteration at this rate ('hpnlab run' sweeps "
                f"{swept[0] // 1024}K-{swept[-1] // 1024}K)")
    emu = Emulation(prepared.scenario, EmulationOptions(ports=PortOptions(pfc=args.pfc)))
    s = emu.scenario
    say(f"[1/5] building {s.name}: {len(emu.hosts)} hosts x {s.ports_per_host} NIC ports, "
        f"{emu.graph.number_of_nodes() - len(emu.hosts)} switches, {emu.graph.number_of_edges()} links")
    summary: dict = {"scenario": s.name}
    try:
        with emu:
            md = emu.metadata
            say(f"[2/5] up in {emu.timings['up_s']:.1f} s; {len(emu.connected_switches())} switches connected to "
                f"the controller on 127.0.0.1:{emu.controller.ofp_port}; datapath {md['datapath']}, ECN {md['ecn']}, "
                f"delay {md['delay']}")
            t = time.monotonic()
            ping = emu.ping_all()
            say(f"[3/5] pingall: {ping['pairs'] - len(ping['failed'])}/{ping['pairs']} host-port pairs reachable "
                f"on {s.planes} plane(s) ({time.monotonic() - t:.1f} s)")
            hosts = emu.hosts
            far = hosts[-1]
            near = next((h for h in hosts[1:] if emu.graph.nodes[h]["segment"] == emu.graph.nodes[hosts[0]]["segment"]
                         and emu.graph.nodes[h]["pod"] == emu.graph.nodes[hosts[0]]["pod"]), hosts[1])
            rate = emulated_mbps(s, s.host_rate_gbps)
            checks = []
            for dst, plane, what in ((near, 0, "same leaf"), (far, s.planes - 1, "across the spines")):
                r = iperf3(emu, hosts[0], dst, plane=plane, seconds=args.seconds)
                ratio = r["received_mbps"] / rate
                checks.append({"src": hosts[0], "dst": dst, "plane": plane, "path": what,
                               "received_mbps": round(r["received_mbps"], 3), "shaped_mbps": rate,
                               "ratio": round(ratio, 3), "retransmits": r["retransmits"]})
                say(f"[4/5] iperf3 TCP {hosts[0]} -> {dst} plane {plane} ({what}): {r['received_mbps']:.2f} Mbit/s "
                    f"of {rate:g} shaped ({ratio:.0%}), {r['retransmits']} retransmits")
            ecn = {}
            if emu.ecn is not None:
                c = emu.ecn.counters()
                ecn = {k: sum(v[k] or 0 for v in c.values()) for k in ("packets", "ect", "ce_marked")}
                say(f"      ECN stage: {ecn['packets']} packets through {len(c)} switch ports, {ecn['ect']} ECT, "
                    f"{ecn['ce_marked']} marked CE")
            summary.update(timings=emu.timings, metadata=md, pingall={"pairs": ping["pairs"],
                                                                      "failed": len(ping["failed"])},
                           iperf3=checks, ecn=ecn)
            doc = None
            if plan:
                say(f"[5/5] collectives ({len(cells)} runs, as 'hpnlab run {s.name}'):")
                doc = experiment.run(plan, emu, say=say)
                doc["meta"].update(command=" ".join(sys.argv), scenario=spec.to_dict(s),
                                   kernel=emu.caps.as_dict() if emu.caps else None,
                                   emulation=dict(md), timings=dict(emu.timings))
        summary["removed"] = emu.metadata.get("removed", {})
        say(f"clean shutdown: removed {summary['removed']}")
        if doc:
            report.save(doc, default_out("demo"), say)
            summary["collectives"] = [{"collective": r.get("collective"), "transport": r.get("transport"),
                                       "entropy": r.get("entropy")} for r in doc["results"]]
            summary["collectives_wrong"] = report.wrong_total(doc["results"])
    except EmulationError as exc:
        print(f"hpnlab: demo failed: {exc}", file=sys.stderr)
        return 1
    ok = (summary["pingall"]["failed"] == 0 and all(c["ratio"] > 0.9 for c in summary["iperf3"])
          and not summary.get("collectives_wrong"))
    say(f"summary: {s.name} up in {summary['timings']['up_s']:.1f} s, pingall "
        f"{summary['pingall']['pairs'] - summary['pingall']['failed']}/{summary['pingall']['pairs']}, "
        f"TCP at {min(c['ratio'] for c in summary['iperf3']):.0%}-{max(c['ratio'] for c in summary['iperf3']):.0%} "
        f"of the shaped rate"
        + (f", {len(summary['collectives'])} collective runs with every element verified"
           if summary.get("collectives") and not summary.get("collectives_wrong") else "")
        + f", total {time.monotonic() - t0:.1f} s: {'OK' if ok else 'PROBLEMS'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 0 if ok else 1
