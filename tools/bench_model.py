#!/usr/bin/env python3
"""Benchmark: the flow model at full scale, and what it says about ECMP vs per-packet spray.

For each preset: time to build and index the fabric, time to model one permutation step
(one elephant flow per rank, random placement) under ECMP and under spray, and the busbw
ratio spray/ECMP measured side by side in this run.
"""
from __future__ import annotations

import argparse
import time

from hpnlab.fabric import graph, model, spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("presets", nargs="*", default=["alibaba-hpn", "hpn-130k"])
    ap.add_argument("--qps", type=int, default=4)
    args = ap.parse_args()
    print(f"{'preset':<12} {'ranks':>8} {'index s':>8} {'ecmp s':>7} {'spray s':>8} "
          f"{'ecmp busbw':>10} {'spray busbw':>11} {'ratio':>6} {'ecmp mean conn.':>15}")
    for name in args.presets:
        t = time.perf_counter()
        g = graph.build(spec.load(name))
        net = model.Network(g)
        t_index = time.perf_counter() - t
        out = {}
        for routing in ("ecmp", "spray"):
            t = time.perf_counter()
            r = model.run_collective(g, "permutation", 1 << 28, routing=routing, placement="random",
                                     qps=args.qps, network=net)
            out[routing] = (r, time.perf_counter() - t)
        (e, te), (s, ts) = out["ecmp"], out["spray"]
        line = e.detail["steps"][0]["rate_gbps_mean"] / (e.nic_gbps / args.qps)
        print(f"{name:<12} {e.ranks:>8,} {t_index:>8.1f} {te:>7.1f} {ts:>8.1f} {e.efficiency:>10.1%} "
              f"{s.efficiency:>11.1%} {s.busbw_gbs / e.busbw_gbs:>5.2f}x {line:>15.1%}")
    print("busbw as a fraction of one NIC's line rate; 'ecmp mean conn.' is the mean connection rate "
          "as a fraction of its fair share of the NIC")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
