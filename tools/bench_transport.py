"""Benchmark: is the generator, not the emulated link, the bottleneck? (loopback, no root)

Measured side by side on this machine, two rank processes exchanging 4 MB each way
(permutation, one step):
  1. the roce transport unpaced (line rate 10 Gbit/s, no DCQCN): the most it can push;
  2. kernel TCP, for reference;
  3. the roce transport paced at the demo's per-rank rate (mini-hpn: 2 ports x 10 Mbit/s):
     the CPU one rank uses at that rate, i.e. the headroom left.
Prints the ratios: generator capacity / demo rate per rank, and the CPU share per rank, each
measured ``--repeat`` times (min/median/max), with the machine's load average beside them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from hpnlab.fabric import ranks, report
from hpnlab.fabric.spec import load
from hpnlab.fabric.transport.entropy import FlowEntropy, SprayEntropy

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="measurements of each kind (default 3)")
    args = ap.parse_args()
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
