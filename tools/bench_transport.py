"""Benchmark: is the generator, not the emulated link, the bottleneck? (loopback, no root)

Measured side by side on this machine, two rank processes exchanging 4 MB each way
(permutation, one step):
  1. the roce transport unpaced (line rate 10 Gbit/s, no DCQCN): the most it can push;
  2. kernel TCP, for reference;
  3. the roce transport paced at the demo's per-rank rate (mini-hpn: 2 ports x 10 Mbit/s):
     the CPU one rank uses at that rate, i.e. the headroom left.
Prints the ratios: generator capacity / demo rate per rank, and the CPU share per rank.
"""
from __future__ import annotations

import os
import sys


from hpnlab.fabric import ranks, report  # noqa: E402
from hpnlab.fabric.spec import load  # noqa: E402

SIZE = 4 << 20


def measure(transport: str, rate_bps: float, planes: int = 1, entropy: str = "flow", dcqcn: bool = True,
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


def main() -> int:
    s = load("mini-hpn")
    demo_port_bps = s.emulation.host_mbps * 1e6
    demo_rank_bps = demo_port_bps * s.planes
    print(f"demo rate per rank: {s.planes} ports x {demo_port_bps / 1e6:g} Mbit/s = {demo_rank_bps / 1e6:g} Mbit/s")
    top = measure("roce", 10e9, dcqcn=False, port=23000)
    tcp = measure("tcp", 10e9, port=23100)
    paced = measure("roce", demo_port_bps, planes=s.planes, entropy="spray", port=23200)
    print(f"{'what':<44} {'goodput Mbit/s':>15} {'CPU/rank':>9}")
    print(f"{'roce unpaced (generator ceiling)':<44} {top['goodput_bps'] / 1e6:>15.1f} {top['cpu_share']:>9.2f}")
    print(f"{'kernel tcp (reference)':<44} {tcp['goodput_bps'] / 1e6:>15.1f} {tcp['cpu_share']:>9.2f}")
    print(f"{'roce spray paced at the demo rate':<44} {paced['goodput_bps'] / 1e6:>15.2f} {paced['cpu_share']:>9.2f}")
    print(f"ratio roce ceiling / demo rate per rank : {top['goodput_bps'] / demo_rank_bps:.1f}x")
    print(f"ratio roce ceiling / kernel tcp         : {top['goodput_bps'] / tcp['goodput_bps']:.2f}")
    print(f"paced at the demo rate: goodput / line rate {paced['fraction']:.3f}, "
          f"CPU headroom per rank {1 - paced['cpu_share']:.2f} of a core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
