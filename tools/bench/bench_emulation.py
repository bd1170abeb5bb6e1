#!/usr/bin/env python3
"""Benchmark: time for an emulated fabric to come up, host count, and CPU headroom.

For mini-hpn and the largest preset that fits this machine (small-hpn: 32 hosts x 2 planes;
goal: up in < 60 s on 2 cores) it prints, measured in this run: seconds to controller ready,
network built, all switches connected, all host-port pairs verified; the ratio to the goal;
and CPU use of the whole machine idle with the fabric up and while every host sends TCP to
a partner at its shaped rate (headroom = 1 - busy share). On the first preset it also
measures, ``--repeat`` times, the rate a shaped host link delivers as a share of its shaped
rate (one TCP flow; UDP offered at 3x the rate), with the spread and the machine's load
average beside them: these figures depend on the machine's load, so they live here and
not in the tests. Needs root and Open vSwitch; when they are missing it says so and exits 0
(nothing to measure).

A preset may carry overrides, ``PRESET:FIELD=VALUE,...`` (e.g. ``small-hpn:segments_per_pod=24``,
96 hosts x 2 planes), to find the largest fabric that comes up within the goal; one the size
check refuses is reported in one line (the refusal is the answer) and the next is tried.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from hpnlab.fabric.emulation import Emulation, kernel
from hpnlab.fabric.emulation.options import EmulationOptions, SupervisionOptions
from hpnlab.fabric.emulation.traffic import iperf3
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments.prepare import prepare
from hpnlab.fabric.scenario import spec
from hpnlab.fabric.scenario.rates import emulated_mbps
from hpnlab.fabric.workload import report


def proc_cpu_s(pids) -> float:
    """CPU seconds (user + system) used so far by these processes."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def fabric_pids(emu) -> list[int]:
    """ovs-vswitchd (it forwards every packet) and the controller process."""
    pids = []
    try:
        pids.append(int(Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text().strip()))
    except (OSError, ValueError):
        pass
    if emu.controller.proc is not None:
        pids.append(emu.controller.proc.pid)
    return pids


def busy_share(seconds: float, pids=()) -> tuple[float, float]:
    """(share of all CPUs busy machine-wide, cores used by `pids`) over `seconds`."""
    c_before = report.cpu_times()
    c1 = proc_cpu_s(pids)
    w1 = time.monotonic()
    time.sleep(seconds)
    c_after = report.cpu_times()
    c2 = proc_cpu_s(pids)
    return report.busy_share(c_before, c_after), (c2 - c1) / (time.monotonic() - w1)


def load_share(emu, seconds: float) -> tuple[tuple[float, float], float]:
    """CPU while every host sends TCP at its shaped rate to a partner on the same leaf (plane 0):
    no fabric link is shared, so a shortfall is the machine's, not the network's."""
    hosts = emu.hosts
    pairs = [(hosts[i], hosts[i + 1]) for i in range(0, len(hosts) - 1, 2)]
    servers, clients = [], []
    for _, dst in pairs:
        servers.append(emu.popen(dst, ["iperf3", "-s", "-1", "-B", emu.ip(dst), "-p", "5301"]))
    time.sleep(0.5)
    for src, dst in pairs:
        clients.append(emu.popen(src, ["iperf3", "-c", emu.ip(dst), "-B", emu.ip(src), "-p", "5301",
                                       "-t", f"{seconds + 2:g}", "-J"]))
    time.sleep(1.0)
    busy = busy_share(seconds, fabric_pids(emu))
    total = 0.0
    for c in clients:
        out, _ = c.communicate(timeout=seconds + 30)
        try:
            total += json.loads(out.decode())["end"]["sum_received"]["bits_per_second"] / 1e6
        except (ValueError, KeyError):
            pass
    for s in servers:
        s.wait(timeout=10)
    return busy, total


def shaping_ratios(emu, repeat: int, seconds: float = 3.0) -> None:
    """Delivered / shaped rate of one host link, TCP and UDP at 3x, ``repeat`` times each."""
    rate = emulated_mbps(emu.scenario, emu.scenario.host_rate_gbps)
    rows: dict[str, list[float]] = {"tcp h1->h2": [], "udp 3x h3->h4": []}
    load = [os.getloadavg()[0]]
    for _ in range(repeat):
        rows["tcp h1->h2"].append(iperf3(emu, "h1", "h2", plane=0, seconds=seconds)["received_mbps"] / rate)
        rows["udp 3x h3->h4"].append(iperf3(emu, "h3", "h4", plane=1, seconds=seconds,
                                            udp_mbps=3 * rate)["received_mbps"] / rate)
        load.append(os.getloadavg()[0])
    print(f"shaped host link ({rate:g} Mbit/s), delivered / shaped over {repeat} runs of {seconds:g} s; "
          f"load average (1 min) {min(load):.2f}..{max(load):.2f} on {os.cpu_count()} cores")
    for name, ratios in rows.items():
        spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        print(f"  {name:<14} mean {statistics.mean(ratios):.3f}  min {min(ratios):.3f}  max {max(ratios):.3f}  "
              f"stdev {spread:.3f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("presets", nargs="*", default=["mini-hpn", "small-hpn"],
                    help="presets or scenario files, each optionally PRESET:FIELD=VALUE,... (overrides)")
    ap.add_argument("--goal-s", type=float, default=60.0)
    ap.add_argument("--load-s", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each shaping measurement (first preset)")
    args = ap.parse_args()
    caps = kernel.probe(deep=False)
    if not caps.root or not caps.ovs_running or not caps.mininet:
        print("bench_emulation: needs root, a running Open vSwitch and Mininet; nothing measured")
        return 0
    print(f"machine: {caps.cpus} cores, datapath {caps.datapath}, load average {os.getloadavg()[0]:.2f}; "
          f"goal: up in < {args.goal_s:g} s")
    ok = True
    header = False
    for i, arg in enumerate(args.presets):
        preset, _, sets = arg.partition(":")
        try:
            overrides = spec.parse_overrides([x for x in sets.split(",") if x])
            scenario = prepare(preset, overrides, size=False).scenario     # the scenario's own rates
            emu = Emulation(scenario, EmulationOptions(
                supervision=SupervisionOptions(lock_wait_s=300)), log=None)
            emu.start()
        except UserError as exc:
            print(f"{arg}: not emulated: {exc}", flush=True)
            ok = False
            continue
        try:
            if i == 0 and args.repeat > 0:
                shaping_ratios(emu, args.repeat)
            if not header:
                header = True
                print(f"{'preset':<12} {'hosts':>5} {'ports':>5} {'switches':>8} {'ctl':>6} {'built':>6} "
                      f"{'conn':>6} {'up':>6} {'up/goal':>7} {'stop':>5} {'idle busy':>9} {'load busy':>9} "
                      f"{'fabric cores':>12} {'headroom':>8} {'TCP Mb/s':>8} {'of shaped':>9}")
            idle, _ = busy_share(2.0)
            (busy, fabric_cores), mbps = load_share(emu, args.load_s)
        finally:
            t = time.monotonic()
            emu.stop()
            stop_s = time.monotonic() - t
        tm = emu.timings
        s = emu.scenario
        ratio = tm["up_s"] / args.goal_s
        ok &= ratio < 1.0
        print(f"{arg:<12} {s.hosts:>5} {s.hosts * s.ports_per_host:>5} "
              f"{emu.graph.number_of_nodes() - s.hosts:>8} {tm['controller_s']:>6.1f} {tm['built_s']:>6.1f} "
              f"{tm['connected_s']:>6.1f} {tm['up_s']:>6.1f} {ratio:>7.2f} {stop_s:>5.1f} {idle:>9.0%} "
              f"{busy:>9.0%} {fabric_cores:>12.2f} {1 - fabric_cores / caps.cpus:>8.0%} {mbps:>8.1f} "
              f"{mbps / (s.hosts // 2 * s.emulation.host_mbps):>9.0%}", flush=True)
        print(f"{'':<12} load: {s.hosts // 2} TCP flows, one per same-leaf host pair, "
              f"{s.hosts // 2 * s.emulation.host_mbps:g} Mbit/s shaped in total", flush=True)
    print("columns: seconds from start to controller ready / network built / switches connected / all pairs "
          "verified; busy = share of all CPUs in use machine-wide (idle fabric, then every host pair on a leaf "
          "running one TCP flow at its shaped rate; other work on the machine counts too); fabric cores = "
          "CPU used by ovs-vswitchd + controller under that load; headroom = 1 - fabric cores / cores; "
          "of shaped = TCP delivered / sum of the senders' shaped rates")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
