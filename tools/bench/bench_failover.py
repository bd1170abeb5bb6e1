#!/usr/bin/env python3
"""Benchmark: the loss window of a running collective through a failure, failover modes side by side.

One invocation, on the emulated mini-hpn (``--scenario``: another preset, e.g. fat-tree-4, where
``spine`` fails an aggregation switch of rank 0's pod; real OVS, the controller process, BFD on every
fabric port), runs an all-reduce over the ``roce`` transport (sprayed entropy, 4 ranks across leaves)
through a failure timeline, for each failover mode and each kind of failure, repeated:

modes   ``controller``    no local protection (fast-failover groups keep only their primary
                          bucket) and no host-side failover: the switches wait for the
                          controller's update, the transport for its retransmission timer;
        ``local``         the switches' fast-failover groups alone (DPFR-style local repair):
                          the controller is stopped (SIGSTOP, timeline ``controller_freeze``)
                          from 0.2 s before the failure until 0.3 s after the repair, so nothing
                          upstream learns of it;
        ``local+remote``  + the remote notification: the switch next to the failure sends its
                          PortStatus (an OpenFlow asynchronous message, in band on its
                          controller connection) and the controller pushes only the affected
                          routes to the switches upstream (their convergence is the
                          controller's "converged in X ms": PortStatus to every switch's
                          barrier reply). Open vSwitch has no switch-to-switch notification;
                          this controller-relayed update is the honest equivalent here;
        ``local+remote+host``  + the transport's dead-path rule, plane avoidance and migration.
kinds   ``link``        a leaf-spine link under rank 0's leaf, both ends down (carrier loss);
        ``one-side``    the same link, the leaf's end only (the spine sees carrier loss on veth);
        ``gray``        the same link keeps carrier but the spine's end drops everything it
                        sends (found by BFD only);
        ``spine``       that spine down;
        ``nic``         rank 0's plane-0 NIC port down (no switch can repair that: only the host).

Each run fails at ``--fail-at`` s after the ranks start and repairs ``--hold`` s later. Figures,
from the receivers' per-packet records (``hpnlab.fabric.transport.accounting``): the largest
loss window and in-order stall over the flows the failure hurt, flows hurt, packets re-sent,
every byte exactly once (byte counts and CRCs at both ends), the collective's busbw
against a run without failure in the same mode (slowdown), and the controller's remote
convergence (its log: from the PortStatus to every switch confirming the update); the same loss
window and flows hurt for the repair, whose reroute back can hurt flows too. A failure's figures
end at its repair. Median and [min-max] over the
repetitions, the load average beside them; JSON with every repetition via ``--json``.

The userspace datapath here is far slower than a real switch: compare the modes as ratios in
one run; the absolute figures belong to this machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from datetime import datetime
from typing import Any

from hpnlab.fabric.emulation import Emulation
from hpnlab.fabric.emulation import timeline as tl
from hpnlab.fabric.emulation.options import (
    ControllerOptions,
    EmulationOptions,
    FailoverOptions,
    PortOptions,
    SupervisionOptions,
)
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.prepare import prepare
from hpnlab.fabric.scenario import graph
from hpnlab.fabric.workload import report

MODES = {"controller": {"fast_failover": False, "host_failover": False, "remote": True},
         "local": {"fast_failover": True, "host_failover": False, "remote": False},
         "local+remote": {"fast_failover": True, "host_failover": False, "remote": True},
         "local+remote+host": {"fast_failover": True, "host_failover": True, "remote": True}}
#: a mode's name with this suffix: the same mode with the control class on every port
#: (``emulation.control_priority``: the transport's ACKs, NACKs, CNPs and notices ahead of data)
PRIO = "/prio"


def base_mode(mode: str) -> str:
    """The mode of ``MODES`` that a mode's name (``local``, ``local/prio``) runs."""
    return mode.removesuffix(PRIO)


#: the controller stops this long before the failure and continues this long after the repair (mode local)
FREEZE_LEAD_S, THAW_AFTER_S = 0.2, 0.3
KINDS = ("link", "one-side", "gray", "spine", "nic")
#: timeline actions that fail something
FAILURES = ("link_down", "link_down_one_side", "link_drop", "switch_down")
#: timeline actions that repair them
REPAIRS = ("link_up", "link_restore", "switch_up")
BFD_MS = 50


def plan(host_failover: bool, iterations: int) -> experiment.Plan:
    return experiment.Plan(collectives="all_reduce", transports="roce", entropies="spray", ranks=4,
                           placement="cross-rail", sizes="1M", iterations=iterations, warmup=1, inplace=False,
                           host_failover=host_failover)


def targets(g, hosts: list[str]) -> dict[str, Any]:
    """The leaf of rank 0's plane-0 port, its first spine, and rank 0's NIC link."""
    host = hosts[0]
    leaf = next(n for n in sorted(g.adj[host]) if g.nodes[n].get("plane") == 0)
    spine = next(n for n in sorted(g.adj[leaf]) if g.nodes[n]["tier"] == 2)
    return {"host": host, "leaf": leaf, "spine": spine}


def timeline(kind: str, t: dict, at: float, hold: float, remote: bool = True) -> list[dict]:
    """The failure and its repair; without ``remote`` the controller is frozen around both."""
    events = _failure(kind, t, at, hold)
    if remote:
        return events
    return ([{"at": max(0.0, at - FREEZE_LEAD_S), "action": "controller_freeze"}] + events
            + [{"at": at + hold + THAW_AFTER_S, "action": "controller_thaw"}])


def _failure(kind: str, t: dict, at: float, hold: float) -> list[dict]:
    link, back = [t["leaf"], t["spine"]], at + hold
    if kind == "link":
        return [{"at": at, "action": "link_down", "link": link}, {"at": back, "action": "link_up", "link": link}]
    if kind == "one-side":
        return [{"at": at, "action": "link_down_one_side", "link": link, "side": t["leaf"]},
                {"at": back, "action": "link_up", "link": link, "side": t["leaf"]}]
    if kind == "gray":
        return [{"at": at, "action": "link_drop", "link": link, "side": t["spine"]},
                {"at": back, "action": "link_restore", "link": link, "side": t["spine"]}]
    if kind == "spine":
        return [{"at": at, "action": "switch_down", "switch": t["spine"]},
                {"at": back, "action": "switch_up", "switch": t["spine"]}]
    nic = [t["host"], t["leaf"]]
    return [{"at": at, "action": "link_down", "link": nic}, {"at": back, "action": "link_up", "link": nic}]


_CONVERGED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*converged in ([0-9.]+) ms", re.M)


def convergences(text: str) -> list[tuple[float, float]]:
    """(wall time the update was complete, its duration in ms) of every "converged in X ms" line of
    the controller's log (logging's asctime: local time, milliseconds; pure)."""
    out = []
    for stamp, ms in _CONVERGED.findall(text):
        done = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append((done, float(ms)))
    return out


def converged_ms(emu, since: int) -> tuple[list[tuple[float, float]], int]:
    """The controller's convergences (``convergences``) logged after byte ``since`` of its log."""
    try:
        with open(emu.metadata["controller_log"], "rb") as fh:
            fh.seek(since)
            text = fh.read().decode(errors="replace")
            end = fh.tell()
    except (OSError, KeyError):
        return [], since
    return convergences(text), end


def plot_data(res: dict, conv: list[tuple[float, float]], remote: bool) -> dict | None:
    """What a run's timeline plot shows (pure), in seconds after the failure began: per flow its
    arrival gaps of 2 ms or more while it had a message in flight (the transport keeps the 32
    largest), the repair, when the first
    hurt flow delivered again (local failover or the controller's update, whichever came first),
    and the controller's update: from its PortStatus (detection) to every switch's confirmation."""
    records = res.get("timeline") or []
    fails = [r for r in records if r["action"] in FAILURES]
    if not fails:
        return None
    t0 = fails[0].get("start_wall", fails[0]["wall"])
    repairs = [r.get("start_wall", r["wall"]) for r in records
               if r["action"] in ("link_up", "switch_up", "link_restore")]
    out: dict = {"repair_s": (repairs[0] - t0) if repairs else None, "flows": []}
    for f in res.get("flows", []):
        # only gaps while the flow had a message in flight (an idle flow receives nothing either)
        gaps = [[g[0] - t0, g[1] - t0] for g in f.get("gaps", []) if g[1] >= t0 - 0.5 and (len(g) < 5 or g[4])]
        out["flows"].append({"name": f"{f.get('src')}->{f.get('dst')}", "gaps": sorted(gaps)})
    after = [b for f in out["flows"] for a, b in f["gaps"] if a <= 0.0 <= b]
    out["delivering_again_s"] = min(after) if after else None
    update = next(((done - ms / 1000 - t0, done - t0) for done, ms in conv if done >= t0), None) if remote else None
    out["controller_update_s"] = update
    return out


def plot(kind: str, runs: dict[str, list[dict]], path: str, scenario: str = "mini-hpn") -> None:
    """One figure per failure kind: a row per mode (its first repetition), a line per flow with its
    arrival gaps as bars; the failure, detection, delivering again, controller update and repair
    marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m, reps in runs.items() if reps and reps[0].get("plot")]
    if not modes:
        return
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 1.2 + 1.6 * len(modes)), squeeze=False, sharex=True)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        d = runs[mode][0]["plot"]
        for i, f in enumerate(d["flows"]):
            ax.broken_barh([(a * 1e3, (b - a) * 1e3) for a, b in f["gaps"]], (i - 0.35, 0.7), color="tab:gray")
        ax.axvline(0, color="tab:red", label="failure")
        if d.get("controller_update_s"):
            start, end = d["controller_update_s"]
            ax.axvline(start * 1e3, color="tab:orange", ls="--", label="detection (controller's PortStatus)")
            ax.axvline(end * 1e3, color="tab:orange", label="controller update confirmed")
        if d.get("delivering_again_s") is not None:
            ax.axvline(d["delivering_again_s"] * 1e3, color="tab:green", label="first hurt flow delivers again")
        if d.get("repair_s") is not None:
            ax.axvline(d["repair_s"] * 1e3, color="tab:blue", label="repair")
        ax.set_yticks(range(len(d["flows"])), [f["name"] for f in d["flows"]], fontsize=6)
        ax.set_title(f"{mode}: loss window {runs[mode][0].get('loss_window_ms') or 0:.1f} ms", fontsize=9)
        ax.legend(fontsize=6, loc="upper right")
    axes[-1, 0].set_xlabel("ms after the failure (bars: a flow's arrival gaps of 2 ms or more, a message in flight)")
    axes[-1, 0].set_xlim(-100, 1000 * max((runs[m][0]["plot"].get("repair_s") or 1.0) for m in modes) + 200)
    fig.suptitle(f"failover on {scenario}: {kind}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def one_run(emu, p: experiment.Plan, events: list | None, remote: bool = True) -> dict:
    load = os.getloadavg()[0]
    _, mark = converged_ms(emu, 0)
    doc = experiment.run(p, emu, progress=False, timeline=events)
    conv, _ = converged_ms(emu, mark)
    [res] = doc["results"]
    shown = plot_data(res, conv, remote) if events else None
    rows = res.get("failover", [])
    f: dict[str, Any] = next((r for r in rows if r["event"].split()[0] in FAILURES), {})
    up: dict[str, Any] = next((r for r in rows if r["event"].split()[0] in REPAIRS), {})
    return {"busbw": report.largest_fraction(res), "wrong": report.wrong_total(doc["results"]), "load": load,
            "loss_window_ms": f.get("loss_window_ms_max"), "stall_ms": f.get("stall_ms_max"),
            "repair_loss_window_ms": up.get("loss_window_ms_max"), "repair_flows_hurt": up.get("flows_hurt"),
            "flows_hurt": f.get("flows_hurt"), "flows": f.get("flows"), "packets_resent": f.get("packets_lost"),
            "exactly_once": f.get("exactly_once"),
            # frozen through the failure, the controller's later update is no remote convergence
            "convergence_ms": conv[0][1] if conv and remote else None, "plot": shown}


def spread(vals: list[float]) -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    return f"{statistics.median(vals):7.1f} [{min(vals):.1f}-{max(vals):.1f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5, help="repetitions per mode and kind (default 5)")
    p.add_argument("--scenario", default="mini-hpn", help="the preset or scenario file to emulate (default mini-hpn)")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"comma list of {', '.join(MODES)}; a mode with {PRIO} (e.g. local+remote+host{PRIO}) runs "
                        f"with the control class on every port (emulation.control_priority)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {', '.join(KINDS)}")
    p.add_argument("--fail-at", type=float, default=1.5, help="seconds after the ranks start (default 1.5)")
    p.add_argument("--hold", type=float, default=1.0, help="seconds until the repair (default 1)")
    p.add_argument("--iterations", type=int, default=6, help="all-reduce iterations per run (default 6)")
    p.add_argument("--json", metavar="FILE", help="write every repetition here")
    p.add_argument("--port-type", default="auto", metavar="TYPE",
                   help="the switches' port type: auto (default), system, afxdp or afxdp-nonpmd; AF_XDP ports "
                        "forward off ovs-vswitchd's main thread but skip tc egress (no shaping)")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [m for m in modes if base_mode(m) not in MODES] + [k for k in kinds if k not in KINDS]
    if bad or args.repeat < 1:
        print(f"bench_failover: unknown mode or kind {bad[0]!r}" if bad else "--repeat must be >= 1", file=sys.stderr)
        return 2
    say = lambda m: print(m, flush=True)  # noqa: E731
    if os.geteuid() != 0:
        say("bench_failover skipped: needs root and Open vSwitch (sudo make bench)")
        return 0
    say(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    rows: dict[str, dict[str, list[dict]]] = {}
    baseline: dict[str, list[dict]] = {}
    wrong = 0
    t0 = time.monotonic()
    for mode in modes:
        cfg = MODES[base_mode(mode)]
        prio = {"emulation": {"control_priority": True}} if mode.endswith(PRIO) else None
        scenario = prepare(args.scenario, prio, size=False).scenario     # the scenario's own rates
        with Emulation(scenario, EmulationOptions(
            controller=ControllerOptions(fast_failover=cfg["fast_failover"]),
            ports=PortOptions(ecn=False, port_type=args.port_type), failover=FailoverOptions(bfd_ms=BFD_MS),
            supervision=SupervisionOptions(lock_wait_s=600)), log=None) as emu:
            pl = plan(cfg["host_failover"], args.iterations)
            [job] = next(iter(pl.jobs_on(emu.graph).values()))
            t = targets(emu.graph, list(job.labels or []))
            if "nic" in kinds and len(graph.host_ports(emu.graph, t["host"])) < 2:
                raise UserError(f"{t['host']} has one NIC port on {args.scenario}: a NIC failure would cut it off "
                                f"(run the other kinds, --kinds link,one-side,gray,spine)")
            baseline[mode] = [one_run(emu, pl, None) for _ in range(2)]
            say(f"{mode}: without failure busbw/line {spread([r['busbw'] * 1e3 for r in baseline[mode]])} (x1e-3)")
            for kind in kinds:
                events = tl.load({"events": timeline(kind, t, args.fail_at, args.hold, cfg["remote"])}, emu.graph)
                reps = rows.setdefault(mode, {}).setdefault(kind, [])
                for _ in range(args.repeat):
                    reps.append(one_run(emu, pl, events, cfg["remote"]))
                    wrong += reps[-1]["wrong"]
                    time.sleep(0.5 if kind != "gray" else 2.5)   # BFD sessions come back 1-2 s after a repair
                say(f"  {kind:<9} loss window ms {spread([r['loss_window_ms'] for r in reps])}  "
                    f"stall ms {spread([r['stall_ms'] for r in reps])}  "
                    f"controller converged ms {spread([r['convergence_ms'] for r in reps])}  "
                    f"exactly once {sum(bool(r['exactly_once']) for r in reps)}/{len(reps)}")
    say(f"\nfailover on {args.scenario}: all_reduce 1 MiB over roce (spray), 4 ranks, BFD {BFD_MS} ms, "
        f"{args.repeat} repetitions, median [min-max]; {time.monotonic() - t0:.0f} s")
    say(f"{'kind':<9} {'mode':<23} {'loss window ms':>22} {'stall ms':>22} {'converged ms':>22} {'hurt':>6} "
        f"{'re-sent':>8} {'slowdown':>9} {'once':>5} {'load':>5} {'repair: loss window ms':>24} {'hurt':>5}")
    for kind in kinds:
        for mode in modes:
            reps = rows[mode][kind]
            base = statistics.median(r["busbw"] for r in baseline[mode])
            slow = statistics.median(base / r["busbw"] for r in reps if r["busbw"]) if base else float("nan")
            say(f"{kind:<9} {mode:<23} {spread([r['loss_window_ms'] for r in reps]):>22} "
                f"{spread([r['stall_ms'] for r in reps]):>22} "
                f"{spread([r['convergence_ms'] for r in reps]):>22} "
                f"{statistics.median(r['flows_hurt'] or 0 for r in reps):>6.0f} "
                f"{statistics.median(r['packets_resent'] or 0 for r in reps):>8.0f} {slow:>8.2f}x "
                f"{sum(bool(r['exactly_once']) for r in reps)}/{len(reps):<3} "
                f"{statistics.mean(r['load'] for r in reps):>5.1f} "
                f"{spread([r['repair_loss_window_ms'] for r in reps]):>24} "
                f"{statistics.median(r['repair_flows_hurt'] or 0 for r in reps):>5.0f}")
        if "controller" in modes and "local" in modes:
            c = [r["loss_window_ms"] for r in rows["controller"][kind] if r["loss_window_ms"] is not None]
            lo = [r["loss_window_ms"] for r in rows["local"][kind] if r["loss_window_ms"] is not None]
            if c and lo and statistics.median(lo) > 0:
                say(f"{'':<9} controller / local loss window (medians): "
                    f"{statistics.median(c) / statistics.median(lo):.1f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"scenario": args.scenario, "modes": MODES, "kinds": kinds, "bfd_ms": BFD_MS,
                       "baseline": baseline, "runs": rows, "cpus": os.cpu_count()}, fh, indent=1)
        say(f"wrote {args.json}")
        for kind in kinds:
            png = os.path.join(os.path.dirname(os.path.abspath(args.json)), f"failover-{kind}.png")
            plot(kind, {mode: rows[mode][kind] for mode in modes}, png, args.scenario)
            say(f"wrote {png}")
    if wrong:
        say(f"{wrong} wrong elements")
    return 1 if wrong else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:          # e.g. a rank that stopped progressing: one line, not a traceback
        print(f"bench_failover: {exc}", file=sys.stderr)
        sys.exit(1)
