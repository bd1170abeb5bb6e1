#!/usr/bin/env python3
"""Benchmark: the flow model at full scale, and what it says about ECMP vs per-packet spray.

1. For each preset: time to build and index the fabric, time to model one permutation step
   (one elephant flow per rank, random placement) under ECMP and under spray, repeated
   (``--repeat``; min / median / max), and the busbw ratio spray/ECMP measured side by side.
2. Accuracy of the drain-time estimate: its makespan / the exact max-min fluid makespan on
   small fabrics over several seeds (the estimate is a lower bound; how close it is, is a
   measurement, so it lives here and not in a test).
3. Routing under failure on small presets: connections left without a path over every single
   fabric-link failure (must be 0; tests/test_model.py holds it), and, under random triple
   failures, leaf pairs the graph connects only through a valley (which the model, like the
   controller compiler, does not route).
The machine's load average is printed beside every timing.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import networkx as nx

from hpnlab.fabric import graph, model, spec


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def spread(xs: list[float]) -> str:
    return f"{min(xs):.1f}/{statistics.median(xs):.1f}/{max(xs):.1f}"


def scale(presets: list[str], qps: int, repeat: int) -> None:
    print(f"## permutation of 256 MiB per rank, random placement, {qps} QPs; times min/median/max of {repeat}")
    print(f"{'preset':<12} {'ranks':>8} {'index s':>8} {'ecmp s':>15} {'spray s':>15} "
          f"{'ecmp busbw':>10} {'spray busbw':>11} {'ratio':>6} {'ecmp mean conn.':>15}  load")
    for name in presets:
        t = time.perf_counter()
        g = graph.build(spec.load(name))
        net = model.Network(g)
        t_index = time.perf_counter() - t
        out: dict[str, tuple[model.ModelResult, list[float]]] = {}
        for routing in model.ROUTINGS:
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                r = model.run_collective(g, "permutation", 1 << 28, routing=routing, placement="random",
                                         qps=qps, network=net)
                times.append(time.perf_counter() - t)
            out[routing] = (r, times)
        (e, te), (s, ts) = out["ecmp"], out["spray"]
        line = e.detail["steps"][0]["rate_gbps_mean"] / (e.nic_gbps / qps)
        print(f"{name:<12} {e.ranks:>8,} {t_index:>8.1f} {spread(te):>15} {spread(ts):>15} {e.efficiency:>10.1%} "
              f"{s.efficiency:>11.1%} {s.busbw_gbs / e.busbw_gbs:>5.2f}x {line:>15.1%}  {load()}")
    print("busbw as a fraction of one NIC's line rate; 'ecmp mean conn.' is the mean connection rate "
          "as a fraction of its fair share of the NIC")


def drain_accuracy(presets: list[str], seeds: int) -> None:
    print(f"\n## drain-time makespan / exact max-min fluid makespan (permutation, ECMP, 1 QP, {seeds} seeds)")
    for name in presets:
        g = graph.build(spec.load(name))
        net = model.Network(g)
        ratios = []
        for seed in range(seeds):
            job = model.make_job(g, None, "random", seed=seed)
            (_, pairs, nbytes), = model.steps("permutation", job, 1 << 20, max_steps=1, seed=seed,
                                              rails=g.graph["scenario"].rails)
            r = model.route_step(net, job, pairs, nbytes, "ecmp", 1, random.Random(seed))
            args = (r.flow_idx, r.link_idx, r.weight, net.cap_all, r.size_bits)
            ratios.append(model.drain_times(*args).max() / model.flow_times(*args, group=0.0).max())
        print(f"{name:<12} min {min(ratios):.3f}  mean {statistics.mean(ratios):.3f}  max {max(ratios):.3f}")


def failures(presets: list[str], trials: int) -> None:
    print("\n## routing under failure (all-to-all, every step, 4 QPs)")
    for name in presets:
        g = graph.build(spec.load(name))
        links = [(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] != "host"]
        n = len(graph.hosts(g)) * g.graph["scenario"].rails
        stalled = dict.fromkeys(model.ROUTINGS, 0)
        for link in links:
            for routing in model.ROUTINGS:
                r = model.run_collective(g, "all_to_all", 1 << 20, routing=routing, failed={link}, qps=4,
                                         max_steps=n, placement="packed")
                stalled[routing] += r.stalled_connections
        valley = pairs = 0
        rnd = random.Random(1)
        leaves = [(x, d["plane"]) for x, d in g.nodes(data=True) if d["tier"] == 1]
        for _ in range(trials):
            failed = set(rnd.sample(links, min(3, len(links))))
            net = model.Network(g, failed)
            dead = {frozenset(f) for f in failed}
            for plane in {p for _, p in leaves}:
                h = nx.Graph()
                h.add_edges_from((u, v) for u, v, k in links if frozenset((u, v, k)) not in dead
                                 and g.nodes[u].get("plane") == plane and g.nodes[v].get("plane") == plane)
                for a, pa in leaves:
                    for b, pb in leaves:
                        if a != b and pa == pb == plane:
                            pairs += 1
                            valley += (a in h and b in h and nx.has_path(h, a, b)) and not net.leaf_reaches(a, b)
        print(f"{name:<12} {len(links)} single failures: stalled connections ecmp {stalled['ecmp']}, "
              f"spray {stalled['spray']}; {trials} random triple failures: {valley} of {pairs} leaf pairs "
              f"connected only through a valley")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("presets", nargs="*", default=["alibaba-hpn", "hpn-130k"])
    ap.add_argument("--qps", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing (default 3)")
    ap.add_argument("--small", default="mini-hpn,small-hpn,mini-cross-campus",
                    help="presets for the accuracy and failure sections")
    args = ap.parse_args()
    small = [p for p in args.small.split(",") if p]
    scale(args.presets, args.qps, args.repeat)
    drain_accuracy(small, seeds=10)
    failures(small, trials=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
