"""Benchmark: is the generator, not the emulated link, the bottleneck? (loopback, no root)

Measured side by side on this machine, two rank processes exchanging 4 MB each way
(permutation, one step):
  1. the roce transport unpaced (line rate 10 Gbit/s, no DCQCN): the most it can push;
  2. kernel TCP, for reference;
  3. the roce transport paced at the demo's per-rank rate (mini-hpn: 2 ports x 10 Mbit/s):
     the CPU one rank uses at that rate, i.e. the headroom left.
Prints the ratios: generator capacity / demo rate per rank, and the CPU share per rank, each
measured ``--repeat`` times (min/median/max), with the machine's load average beside them.

Then host-side failover (``--failover-repeat`` times each, min/median/max): two roce ranks on
loopback stream 12 KB messages through one UDP relay per plane; once the failing path has
carried some data the relay drops everything from it (one source port; or a whole plane).
Reported: the time to move off (from the send time of the first packet lost to the moment
the transport declares the path dead or migrates), the loss window the receiver saw (last
arrival before to first after) and its in-order stall, packets re-sent, and whether every
byte arrived exactly once (byte count and CRC at both ends); "early" counts paths declared
dead before the failure (a path slowed by the loaded machine, revived by its probe). Cases: spray over 1 plane x 4
ports with one port failing; spray over 2 planes x 2 ports with plane 1 failing; flow
entropy over 2 planes x 2 ports whose path fails (migration after two timeouts).

With ``--netns`` (root): two rank processes in two network namespaces joined by one veth
pair per plane run an all-to-all (spray, 2 x 50 Mbit/s); one port of plane 1 is set down
and up again mid-run: when rank 0 saw its port lose the carrier, the worst flow's loss
window and in-order stall, packets re-sent, and bytes exactly once, from the run's JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from hpnlab.fabric.scenario.spec import load
from hpnlab.fabric.transport import ranks
from hpnlab.fabric.transport.accounting import exactly_once, failure_windows
from hpnlab.fabric.transport.entropy import FlowEntropy, SprayEntropy
from hpnlab.fabric.transport.relay import PathRelay
from hpnlab.fabric.transport.roce import RoceTransport
from hpnlab.fabric.workload import report

SIZE = 4 << 20


def measure(transport: str, rate_bps: float, planes: int = 1, entropy: str = FlowEntropy.name, dcqcn: bool = True,
            port: int = 23000) -> dict:
    addrs = [[f"127.0.{p}.{2 + r}" for p in range(planes)] for r in range(2)]
    opts = {"dcqcn": dcqcn} if transport == "roce" else {}
    job = ranks.Job("permutation", addrs, [SIZE], iters=3, warmup=1, transport=transport, entropy=entropy,
                    line_rate_bps=rate_bps, base_port=port, inplace=False, options=opts)
    [res] = ranks.run_jobs([job], ranks.LocalSpawner(), progress=False)
    cell = res["rows"][0]["oop"]
    goodput = cell["algbw_gbs"] * 8e9
    return {"goodput_bps": goodput, "cpu_share": res["cpu"]["max_rank_share"],
            "pps": sum(f.get("packets", 0) for f in res["flows"]) / 2 / max(1e-9, (cell["time_us"] * 1e-6) * 4),
            "fraction": report.largest_fraction(res)}


def _spread(xs: list[float], scale: float = 1.0, fmt: str = ".1f") -> str:
    xs = [x / scale for x in xs]
    return f"{min(xs):{fmt}}/{statistics.median(xs):{fmt}}/{max(xs):{fmt}}"


# ---- host-side failover ----------------------------------------------------------------------

def failover_once(case: str, port: int, msgs: int = 120, size: int = 12_000) -> dict:
    """One failure under a stream of ``msgs`` messages; the figures of that failure."""
    planes, ports, entropy, fail_path, whole = {
        "spray-port": (1, 4, SprayEntropy.name, 2, False),
        "spray-plane": (2, 2, SprayEntropy.name, 2, True),
        "flow-migrate": (2, 2, FlowEntropy.name, None, False)}[case]
    fwd = [PathRelay((f"127.0.{p}.50", port + 1), (f"127.0.{p}.3", port + 1)) for p in range(planes)]
    back = [PathRelay((f"127.0.{p}.51", port), (f"127.0.{p}.2", port)) for p in range(planes)]
    def endpoint(rank: int, addrs: list[list[str]]) -> RoceTransport:
        return RoceTransport(rank, addrs, base_port=port, ports_per_nic=ports, entropy=entropy,
                             line_rate_bps=100e6, min_rto_s=0.01, max_rto_s=0.05)
    t0 = endpoint(0, [[f"127.0.{p}.2" for p in range(planes)], [f"127.0.{p}.50" for p in range(planes)]])
    t1 = endpoint(1, [[f"127.0.{p}.51" for p in range(planes)], [f"127.0.{p}.3" for p in range(planes)]])
    t0.start()
    t1.start()
    if fail_path is None:
        fail_path = t0.policy.path(t0.tx[1], 0)
    relay = fwd[fail_path // ports]
    relay.fail(t0.tx_socks[fail_path].getsockname(), 26, whole=whole)     # 25 data packets through
    for r in fwd + back:
        r.start()
    payload = [bytes((i + k) % 251 for k in range(size)) for i in range(msgs)]
    out: dict = {}

    def receiver() -> None:
        out["got"] = [bytes(t1.exchange([], [(0, size)])[0]) for _ in range(msgs)]
        out["rx"] = t1.flow_stats()
        t1.close(linger_s=1.0, quiet_s=0.2)

    th = threading.Thread(target=receiver)
    th.start()
    try:
        for m in payload:
            t0.exchange([(1, m)], [])
        tx_stats = t0.flow_stats()
        t0.close(linger_s=1.0, quiet_s=0.2)
        th.join(30)
    finally:
        for r in fwd + back:
            r.close()
    tx = next(f for f in tx_stats if f["side"] == "tx" and f["dst"] == 1)
    rx = next(f for f in out["rx"] if f["side"] == "rx" and f["src"] == 0)
    flow = {**tx, **rx}
    if relay.first_lost_ts is None:
        raise RuntimeError(f"{case}: the relay never failed the path (too few messages?)")
    # the first lost packet's send time, on the wall clock (the header's 32-bit microseconds)
    lost_wall = _ts_to_wall(relay.first_lost_ts, t0.wall_offset)
    moved = [t for t, what, _ in tx["paths"]["events"] if what in ("dead", "migrated_from", "plane_down")]
    [w] = failure_windows([flow], [(case, lost_wall)], horizon_s=1.0)
    after = [t for t in moved if t >= lost_wall]
    return {"move_off_s": (min(after) - lost_wall) if after else float("nan"),
            "early": len(moved) - len(after),
            "loss_window_s": w["loss_window_s"], "stall_s": w["stall_s"],
            "resent": tx["retransmissions"], "failover_retx": tx["failover_retx"], "timeouts": tx["timeouts"],
            "exactly_once": bool(exactly_once(flow)) and out["got"] == payload,
            "bytes": tx["app_bytes_sent"]}


def _ts_to_wall(ts_us: int, wall_offset: float) -> float:
    """A header timestamp (monotonic microseconds, low 32 bits) as a wall-clock time, taken
    as the latest such time not in the future."""
    now = time.monotonic()
    age = ((int(now * 1e6) - ts_us) % (1 << 32)) / 1e6
    return now - age + wall_offset


def failover(repeat: int, port: int = 24000) -> int:
    cases = ("spray-port", "spray-plane", "flow-migrate")
    # both ranks and the relays are threads of this process: let them take turns at the
    # interpreter every 0.5 ms rather than Python's default 5 ms, which would otherwise show
    # up in every figure below as whole multiples of 5 ms
    sys.setswitchinterval(0.0005)
    print(f"\nhost-side failover over loopback (min/median/max of {repeat}; 100 Mbit/s, min RTO 10 ms, "
          f"max RTO 50 ms, dead after max(4 x srtt, 5 ms); ranks and relays are threads of one process)")
    print(f"{'case':<14} {'move off (ms)':>18} {'loss window (ms)':>18} {'stall (ms)':>18} "
          f"{'resent':>12} {'early':>6} {'exactly once':>13}")
    bad = 0
    for ci, case in enumerate(cases):
        runs = [failover_once(case, port + 40 * (ci * repeat + i)) for i in range(repeat)]
        once = sum(r["exactly_once"] for r in runs)
        bad += repeat - once

        def col(key: str, runs=runs) -> list[float]:
            return [r[key] for r in runs]
        print(f"{case:<14} {_spread(col('move_off_s'), 1e-3):>18} {_spread(col('loss_window_s'), 1e-3):>18} "
              f"{_spread(col('stall_s'), 1e-3):>18} {_spread(col('resent'), fmt='.0f'):>12} "
              f"{sum(col('early')):>6.0f} {once:>5}/{repeat} ({runs[0]['bytes']:,} B)")
    return bad


# ---- a NIC port going down under a running collective (root: two network namespaces) ----------

class _NetnsSpawner:
    """Rank r runs in network namespace ``names[r]`` (``ip netns exec``)."""
    name = "netns"

    def __init__(self, names: list[str]):
        self.names = names

    def check(self, job) -> None:
        pass

    def spawn(self, job, rank: int) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.names[rank], *ranks.worker_argv(job, rank)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _rx_bytes(ns: str, dev: str) -> int:
    out = subprocess.run(["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev], capture_output=True,
                         text=True).stdout
    return int(json.loads(out)[0]["stats64"]["rx"]["bytes"]) if out.strip() else 0


def netns_port_down_once(i: int, down_after_s: float = 0.5, up_after_s: float = 1.1) -> dict:
    """Two ranks in two namespaces joined by one veth pair per plane (2 planes); an all-to-all
    of spray traffic runs; rank 1's port of plane 1 is set down (rank 0's loses its carrier),
    then up. The figures from the run's JSON: when rank 0 saw its port go down, the loss
    window and in-order stall per flow, packets re-sent, bytes exactly once, the slowdown."""
    ns = [f"hpnlab-bt{i}a", f"hpnlab-bt{i}b"]
    made: list[str] = []
    try:
        for n in ns:
            _ip("netns", "add", n)
            made.append(n)
        for p in range(2):
            a, b = f"hbt{i}a{p}", f"hbt{i}b{p}"
            _ip("link", "add", a, "netns", ns[0], "type", "veth", "peer", "name", b, "netns", ns[1])
            for n, dev, host in ((ns[0], a, 1), (ns[1], b, 2)):
                _ip("-n", n, "addr", "add", f"10.77.{p}.{host}/24", "dev", dev)
                _ip("-n", n, "link", "set", dev, "up")
        addrs = [[f"10.77.{p}.{h}" for p in range(2)] for h in (1, 2)]
        job = ranks.Job("all_to_all", addrs, [2 << 20], iters=12, warmup=0, transport="roce",
                        entropy=SprayEntropy.name, line_rate_bps=50e6, inplace=False, base_port=24900,
                        options={"ports_per_nic": 4, "min_rto_s": 0.02})
        marks: dict[str, float] = {}

        def fail_and_repair(_procs) -> None:
            def run() -> None:
                deadline = time.monotonic() + 30
                while _rx_bytes(ns[1], f"hbt{i}b0") < 1 << 20 and time.monotonic() < deadline:
                    time.sleep(0.02)            # the collective is under way (1 MB on plane 0)
                time.sleep(down_after_s)
                marks["down"] = time.time()
                _ip("-n", ns[1], "link", "set", f"hbt{i}b1", "down")
                time.sleep(up_after_s - down_after_s)
                marks["up"] = time.time()
                _ip("-n", ns[1], "link", "set", f"hbt{i}b1", "up")
            threading.Thread(target=run, daemon=True).start()

        [res] = ranks.run_jobs([job], _NetnsSpawner(ns), progress=False, on_started=fail_and_repair)
    finally:
        for n in made:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
    flows = [f for f in res["flows"] if f.get("app_bytes_sent", 0) > 1000]
    acked = [s[0] for f in flows for s in f.get("samples", [])]
    if "up" not in marks or not acked or not min(acked) < marks["down"] < marks["up"] < max(acked):
        raise RuntimeError("the port did not fail and come back while data flowed; lengthen the run")
    wins = failure_windows(flows, [("port_down", marks["down"])], horizon_s=0.5)
    seen = [t for t, plane, what in res["transport_info"].get("link_events", []) if what == "down"]
    return {"detect_s": (min(seen) - marks["down"]) if seen else float("nan"),
            "loss_window_s": max(w["loss_window_s"] for w in wins),
            "stall_s": max(w["stall_s"] for w in wins),
            "lost": sum(w["packets_lost"] for w in wins),
            "exactly_once": all(w["exactly_once"] for w in wins) and len(wins) == 2,
            "wrong": report.wrong_total([res])}


def netns_port_down(repeat: int) -> int:
    if os.geteuid() != 0:
        print("\n(--netns needs root: skipped)")
        return 0
    print(f"\na NIC port down under an all-to-all, 2 ranks in 2 network namespaces, 2 planes x 50 Mbit/s, "
          f"spray (min/median/max of {repeat})")
    runs = [netns_port_down_once(i) for i in range(repeat)]

    def col(key: str) -> list[float]:
        return [r[key] for r in runs]
    print(f"  port down seen by the rank (ms)      {_spread(col('detect_s'), 1e-3)}")
    print(f"  loss window, worst flow (ms)         {_spread(col('loss_window_s'), 1e-3)}")
    print(f"  in-order stall, worst flow (ms)      {_spread(col('stall_s'), 1e-3)}")
    print(f"  packets re-sent near the failure     {_spread(col('lost'), fmt='.0f')}")
    once = sum(r["exactly_once"] for r in runs)
    print(f"  every byte exactly once              {once}/{repeat}; wrong elements {sum(col('wrong')):.0f}")
    return repeat - once


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="measurements of each kind (default 3)")
    ap.add_argument("--failover-repeat", type=int, default=5, help="failures of each case (default 5)")
    ap.add_argument("--only", choices=("generator", "failover"), help="run one of the two parts")
    ap.add_argument("--netns", action="store_true",
                    help="also fail a NIC port under a collective between two network namespaces (root)")
    args = ap.parse_args()
    if args.only != "generator":
        bad = failover(args.failover_repeat)
        if args.netns:
            bad += netns_port_down(args.failover_repeat)
        if bad:
            print(f"{bad} failover runs did not deliver every byte exactly once")
            return 1
        if args.only == "failover":
            return 0
    s = load("mini-hpn")
    demo_port_bps = s.emulation.host_mbps * 1e6
    demo_rank_bps = demo_port_bps * s.planes
    print(f"demo rate per rank: {s.planes} ports x {demo_port_bps / 1e6:g} Mbit/s = {demo_rank_bps / 1e6:g} Mbit/s")
    runs: dict[str, list[dict]] = {"top": [], "tcp": [], "paced": []}
    loads = []
    for i in range(args.repeat):
        runs["top"].append(measure("roce", 10e9, dcqcn=False, port=23000 + 300 * i))
        runs["tcp"].append(measure("tcp", 10e9, port=23100 + 300 * i))
        runs["paced"].append(measure("roce", demo_port_bps, planes=s.planes, entropy=SprayEntropy.name,
                                     port=23200 + 300 * i))
        loads.append(os.getloadavg()[0])

    def col(kind: str, key: str) -> list[float]:
        return [r[key] for r in runs[kind]]
    print(f"min/median/max of {args.repeat}; 1-minute load average during the runs: {_spread(loads)}")
    print(f"{'what':<44} {'goodput Mbit/s':>20} {'CPU/rank':>16}")
    for kind, what in (("top", "roce unpaced (generator ceiling)"), ("tcp", "kernel tcp (reference)"),
                       ("paced", "roce spray paced at the demo rate")):
        goodput, cpu = _spread(col(kind, "goodput_bps"), 1e6), _spread(col(kind, "cpu_share"), fmt=".2f")
        print(f"{what:<44} {goodput:>20} {cpu:>16}")
    top, tcp = statistics.median(col("top", "goodput_bps")), statistics.median(col("tcp", "goodput_bps"))
    print(f"ratio roce ceiling / demo rate per rank : {top / demo_rank_bps:.1f}x (medians)")
    print(f"ratio roce ceiling / kernel tcp         : {top / tcp:.2f} (medians)")
    print(f"paced at the demo rate: goodput / line rate {_spread(col('paced', 'fraction'), fmt='.3f')}, "
          f"CPU headroom per rank {1 - statistics.median(col('paced', 'cpu_share')):.2f} of a core (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
