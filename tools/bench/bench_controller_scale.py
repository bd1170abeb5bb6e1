#!/usr/bin/env python3
"""Benchmark: the controller process (``python -m hpnlab.controller``) over TCP against simulated switches
(``hpnlab switches``, fabric/switches/), at the scale of a preset or a subset of its planes.

Per scenario, with the switches of ``--planes`` simulated (the controller compiles the whole fabric and
installs what connects):
    cold start    the controller started against empty switches, until every simulated switch holds its
                  compiled flows and groups and answered a barrier after its last change: wall time from the
                  controller's start and from the first message a switch received, messages the switches
                  received per second over that span, the controller's CPU seconds and peak RSS.
                  Repeated ``--cold`` times (a new controller and new switches each time).
    link failure  a leaf-spine link of the first simulated plane taken down (PortStatus at both ends) and
                  brought back, ``--repeat`` times each (``--events link,spine``: then that link's spine fails,
                  its neighbours' ports towards it go down, and it returns with empty tables): wall time from
                  the injection to the last barrier a changed switch answered (every switch settled), switches
                  changed, and the controller's CPU seconds over that span (its own compute: decode,
                  recompile, diff, plan, encode, send).
    restart       the controller stopped and started again with the switches holding their tables: flow and
                  group modifications sent (goal 0) and the time until every switch was read back and settled.
    switches      the simulated switches' own CPU seconds and peak RSS, per switch.
Printed as median [min-max] with the machine's load average. ``--profile FILE`` runs the controller under
cProfile in the last cold start (the top functions by cumulative time are printed).

    nice -n 19 .venv/bin/python tools/bench/bench_controller_scale.py alibaba-hpn --repeat 5
    nice -n 19 .venv/bin/python tools/bench/bench_controller_scale.py hpn-130k --planes 0 --window 300
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.stats import median_range
from hpnlab.fabric.switches import endpoint, harness

#: the controller as measured: no LLDP gate (--on-miswire off: installs once every switch told its ports),
#: no telemetry, no ECN actuator (a standalone controller would otherwise find a running emulation's stage)
CONTROLLER_ARGS = ["--on-miswire", "off", "--telemetry-interval-ms", "0", "--ecn-actuator", "none"]


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} CPUs"


def fmt(values: list[float], unit: str = "", digits: int = 2) -> str:
    return median_range(values, f"{{:.{digits}f}}") + unit if values else "-"


def first_leaf_spine(g, names: list[str]) -> tuple[str, str]:
    sw = set(names)
    for leaf in names:
        if g.nodes[leaf]["role"] == "leaf":
            for nb in sorted(g[leaf]):
                if nb in sw and g.nodes[nb].get("role") == "spine":
                    return leaf, nb
    raise SystemExit("no leaf-spine link among the simulated switches")


def settle_after(run: harness.Run, expected: dict, since: float, timeout_s: float) -> tuple[dict, float, int, float]:
    """Wait until settled after ``since``; (stats, seconds from ``since`` to the last barrier of a changed switch,
    switches changed, the controller's CPU seconds when it went idle). The counts can match before the
    controller has sent anything (a spine's failure changes the leaves' groups, not how many they hold), so it
    also waits for the controller to go idle; the time is taken from the switches' own timestamps and the CPU at
    the start of the idle span, so the wait adds to neither."""
    run.wait(run.settled(expected, since), timeout_s)
    _idle_at, cpu = quiet_since(run, timeout_s)
    st = run.wait(run.settled(expected, since), timeout_s)
    changed = [s for s in st["switches"].values() if s["changed_at"] and s["changed_at"] > since]
    last = max((s["barrier_at"] for s in changed), default=since)
    return st, last - since, len(changed), cpu


def cold_start(args, name: str, g, names: list[str], expected: dict, profile: Path | None) -> dict:
    switch_args = ["--planes", args.planes] if args.planes else []
    with harness.Run(name, controller_args=CONTROLLER_ARGS + args.controller_arg, switch_args=switch_args,
                     profile=profile) as run:
        t0 = run.controller_started_at or time.time()
        st = run.wait(run.settled(expected), args.timeout)
        sws = st["switches"].values()
        last = max(s["barrier_at"] for s in sws)
        first = min(s["first_at"] for s in sws if s["first_at"])
        msgs = sum(s["received"] for s in sws)
        usage = run.controller_usage()
        out = {"from_start_s": last - t0, "from_first_message_s": last - first, "messages": msgs,
               "messages_per_s": msgs / max(last - first, 1e-9), "controller_cpu_s": usage["cpu_s"],
               "controller_peak_rss_mib": usage["peak_rss_mib"], "switches_cpu_s": st["cpu_s"],
               "switches_peak_rss_mib": st["peak_rss_kib"] / 1024, "flows": sum(s["flows"] for s in sws)}
        print(f"  {name} cold start: {out['from_start_s']:.1f} s from the controller's start to the last barrier "
              f"({out['from_first_message_s']:.1f} s from the first switch message, {msgs} messages), controller "
              f"CPU {usage['cpu_s']:.1f} s, peak RSS {usage['peak_rss_mib']:.0f} MiB, {load()}", flush=True)
        if args.repeat and profile is None:
            for kind in args.events:
                out.update(failures(args, run, g, names, expected, kind))
            if args.restart:
                out.update(restart(args, run, expected))
            st = run.stats()
            out["switches_cpu_s"], out["switches_peak_rss_mib"] = st["cpu_s"], st["peak_rss_kib"] / 1024
        return out


def window(args, name: str, names: list[str], expected: dict) -> None:
    """A cold start watched for ``args.window`` seconds at most (a fabric too large to finish here): every
    10 s the flows held, the messages received per second, the controller's CPU and peak RSS."""
    switch_args = ["--planes", args.planes] if args.planes else []
    want = sum(c[0] for c in expected.values())
    print(f"\n## {name}: cold start watched for {args.window:g} s ({len(names)} switches simulated, {want:,} flows "
          f"to install; {load()})")
    print("| s after controller start | flows held | messages/s (last 10 s) | controller CPU s | controller peak "
          "RSS MiB | switches CPU s | switches RSS MiB |\n|---|---|---|---|---|---|---|")
    with harness.Run(name, controller_args=CONTROLLER_ARGS + args.controller_arg, switch_args=switch_args) as run:
        t0 = run.controller_started_at or time.time()
        last_msgs, last_t = 0, time.time()
        while time.time() - t0 < args.window:
            time.sleep(10)
            st = run.stats()
            msgs = sum(s["received"] for s in st["switches"].values())
            now = time.time()
            use = run.controller_usage()
            print(f"| {now - t0:.0f} | {sum(s['flows'] for s in st['switches'].values()):,} | "
                  f"{(msgs - last_msgs) / (now - last_t):.0f} | {use['cpu_s']:.0f} | {use['peak_rss_mib']:.0f} | "
                  f"{st['cpu_s']:.0f} | {st['peak_rss_kib'] / 1024:.0f} |", flush=True)
            last_msgs, last_t = msgs, now
            if run.settled(expected)(st):
                break


#: what ``--events`` can fail and bring back, and the key prefix of its figures in the JSON
EVENTS = {"link": "", "spine": "spine_"}


def failures(args, run: harness.Run, g, names: list[str], healthy: dict, kind: str = "link") -> dict:
    """``kind`` "link": the first leaf-spine link of the simulated switches goes down (PortStatus at both ends)
    and comes back; "spine": that link's spine fails (its connection drops, its neighbours' ports towards it go
    down) and returns with empty tables. ``args.repeat`` times each."""
    leaf, spine = first_leaf_spine(g, names)
    if kind == "link":
        what, fail = f"{leaf}-{spine}", compiler.Failures.of([(min(leaf, spine), max(leaf, spine), k)
                                                             for k in g[leaf][spine]])
        commands = {"down": f"link down {leaf} {spine}", "up": f"link up {leaf} {spine}"}
    else:
        what, fail = spine, compiler.Failures.of(switches=[spine])
        commands = {"down": f"switch down {spine}", "up": f"switch up {spine}"}
    failed = {n: c for n, c in harness.expected_counts(compiler.compile_fabric(g, fail)).items() if n in healthy}
    down: list[float] = []
    up: list[float] = []
    cpu_down: list[float] = []
    changed = 0
    for _ in range(args.repeat):
        for word, want, times in (("down", failed, down), ("up", healthy, up)):
            before = run.controller_usage()["cpu_s"]
            since = time.time()
            run.send(commands[word])
            _st, took, n, idle_cpu = settle_after(run, want, since, args.timeout)
            times.append(took)
            cpu = idle_cpu - before
            if word == "down":
                cpu_down.append(cpu)
                changed = n
            print(f"  {kind} {what} {word}: {took * 1000:.0f} ms to the last barrier, {n} switches changed, "
                  f"controller CPU {cpu * 1000:.0f} ms, {load()}", flush=True)    # kept if the run is stopped
            time.sleep(0.5)       # the controller's tick and stragglers: not counted in the next event
    p = EVENTS[kind]
    return {kind: what, f"{p}failure_s": down, f"{p}recovery_s": up, f"{p}failure_controller_cpu_s": cpu_down,
            f"{p}failure_switches_changed": changed}


def quiet_since(run: harness.Run, timeout_s: float, quiet_s: float = 3.0, share: float = 0.05) -> tuple[float, float]:
    """When the controller went idle: the start of the first ``quiet_s`` seconds in which it used less
    than ``share`` of a CPU, and its CPU seconds then."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        t0, cpu0 = time.time(), run.controller_usage()["cpu_s"]
        time.sleep(quiet_s)
        if run.controller_usage()["cpu_s"] - cpu0 < share * quiet_s:
            return t0, cpu0
    raise harness.RunError(f"the controller was not idle within {timeout_s:g} s")


def restart(args, run: harness.Run, expected: dict) -> dict:
    before = run.stats()["switches"]
    mods = sum(s["flow_mods"] + s["group_mods"] for s in before.values())
    reads = sum(s["reads"] for s in before.values())
    run.stop_the_controller()
    since = time.time()
    run.start_the_controller()
    st = run.wait(lambda st: all((s["read_at"] or 0) > since for s in st["switches"].values()), args.timeout)
    # every switch asked; the controller is done once it has decoded the answers and sent what differs:
    # it goes idle ("routes installed" is logged only when every switch of the fabric is connected)
    idle_at, _cpu = quiet_since(run, args.timeout)
    st = run.wait(run.settled(expected), args.timeout)
    last_read = max(s["read_at"] for s in st["switches"].values())
    out = {"restart_changes": sum(s["flow_mods"] + s["group_mods"] for s in st["switches"].values()) - mods,
           "restart_read_back_s": last_read - since, "restart_idle_s": idle_at - since,
           "restart_reads": sum(s["reads"] for s in st["switches"].values()) - reads}
    print(f"  controller restart: the last switch asked for its tables after {out['restart_read_back_s']:.1f} s, "
          f"the controller idle after {out['restart_idle_s']:.1f} s ({out['restart_reads']} tables read for "
          f"{len(st['switches'])} switches), {out['restart_changes']} changes sent, {load()}", flush=True)
    return out


def events_arg(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in EVENTS]
    if bad or not kinds:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more of {', '.join(EVENTS)}, comma-separated")
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="+")
    ap.add_argument("--planes", help="simulate only these planes (e.g. 0)")
    ap.add_argument("--cold", type=int, default=3, help="cold starts (default 3)")
    ap.add_argument("--repeat", type=int, default=5, help="link failures (and recoveries) per run (default 5)")
    ap.add_argument("--events", default="link", type=events_arg, metavar="KIND[,KIND]",
                    help=f"what fails and returns --repeat times after each cold start, in order: "
                         f"{', '.join(EVENTS)} (default link)")
    ap.add_argument("--no-restart", dest="restart", action="store_false",
                    help="leave out the controller restart over the running switches")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--window", type=float, metavar="S",
                    help="instead: watch one cold start for at most S seconds, printing progress every 10 s")
    ap.add_argument("--profile", metavar="FILE", help="one more cold start with the controller under cProfile")
    ap.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    ap.add_argument("--controller-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for the controller (repeatable), e.g. --controller-arg=--confirm-timeout-s "
                         "--controller-arg=60")
    args = ap.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).parent).stdout.strip()
    print(f"# bench_controller_scale, commit {rev}, {platform.node()}, {os.cpu_count()} CPUs, {load()}; controller "
          f"{' '.join(CONTROLLER_ARGS + args.controller_arg)}")
    report = {}
    for name in args.scenario:
        g = graph.build(spec.load(name))
        names = endpoint.select(g, endpoint.parse_numbers(args.planes, "planes") if args.planes else None)
        states = compiler.compile_fabric(g)
        expected = {n: c for n, c in harness.expected_counts(states).items() if n in set(names)}
        if args.window:
            window(args, name, names, expected)
            continue
        runs = []
        for _ in range(args.cold):
            r = cold_start(args, name, g, names, expected, None)
            runs.append(r)
        if args.profile:
            cold_start(argparse.Namespace(**{**vars(args), "repeat": 0}), name, g, names, expected, Path(args.profile))
            print(f"  controller profile (cumulative) of a cold start: {args.profile}")
            pstats.Stats(args.profile).sort_stats("cumulative").print_stats(25)
        flows = sum(c[0] for c in expected.values())
        groups = sum(c[1] for c in expected.values())
        n = len(names)
        col = {k: [r[k] for r in runs if k in r] for k in runs[0]}
        print(f"\n## {name}: {n} of {len(states)} switches simulated, {flows:,} flows, {groups:,} groups ({load()})")
        print("| measure | median [min-max] |\n|---|---|")
        print(f"| cold start, controller start to last barrier | {fmt(col['from_start_s'], ' s', 1)} |")
        print(f"| cold start, first switch message to last barrier | {fmt(col['from_first_message_s'], ' s', 1)} |")
        print(f"| messages the switches received per second | {fmt(col['messages_per_s'], '', 0)} |")
        print(f"| controller CPU for the cold start | {fmt(col['controller_cpu_s'], ' s', 1)} |")
        print(f"| controller peak RSS | {fmt(col['controller_peak_rss_mib'], ' MiB', 0)} |")
        for kind, p in EVENTS.items():
            if f"{p}failure_s" not in col:
                continue
            down = [x for r in runs for x in r[f"{p}failure_s"]]
            up = [x for r in runs for x in r[f"{p}recovery_s"]]
            cpu = [x for r in runs for x in r[f"{p}failure_controller_cpu_s"]]
            print(f"| {kind} {runs[0][kind]} down: event to last barrier ({len(down)} times, "
                  f"{runs[0][f'{p}failure_switches_changed']} switches changed) | "
                  f"{fmt([x * 1000 for x in down], ' ms', 0)} |")
            print(f"| its controller CPU (decode, recompile, diff, plan, encode, send) | "
                  f"{fmt([x * 1000 for x in cpu], ' ms', 0)} |")
            print(f"| {kind} back up: event to last barrier | {fmt([x * 1000 for x in up], ' ms', 0)} |")
        if "restart_changes" in col:
            print(f"| controller restart with the switches holding their tables: changes sent | "
                  f"{fmt(col['restart_changes'], '', 0)} |")
            print(f"| restart: until the last switch was asked for its tables | "
                  f"{fmt(col['restart_read_back_s'], ' s', 1)} |")
            print(f"| restart: until the controller was idle (every table decoded, differences sent) | "
                  f"{fmt(col['restart_idle_s'], ' s', 1)} |")
            print(f"| restart: tables read (one per switch without timeouts) | "
                  f"{fmt(col['restart_reads'], '', 0)} |")
        print(f"| simulated switches: CPU per switch (whole run) | "
              f"{fmt([r['switches_cpu_s'] / n * 1000 for r in runs], ' ms', 1)} |")
        print(f"| simulated switches: peak RSS per switch | "
              f"{fmt([r['switches_peak_rss_mib'] / n * 1024 for r in runs], ' KiB', 0)} |")
        report[name] = {"switches": n, "flows": flows, "groups": groups, "runs": runs}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"\n# done, {load()}")


if __name__ == "__main__":
    os.environ.setdefault("TMPDIR", tempfile.gettempdir())
    # stopped by TERM: the harness still stops the switches and the controller it started (by pid)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
