#!/usr/bin/env python3
"""Benchmark: build + analyse the largest presets (target: hpn-130k under 10 s on 2 cores).

Prints, per preset, the time to load the scenario, build the graph and run the analyses,
and the speed-up of the project's raw-adjacency link insertion over networkx's
add_edges_from, both measured in this run on the same links.
"""
from __future__ import annotations

import argparse
import gc
import time

import networkx as nx

from hpnlab.fabric.scenario import analysis, graph, spec


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("presets", nargs="*", default=["alibaba-hpn", "cross-campus", "hpn-130k"])
    parser.add_argument("--target-s", type=float, default=10.0)
    args = parser.parse_args()
    ok = True
    print(f"{'preset':<14} {'accel':>8} {'links':>10} {'build s':>8} {'analyse s':>9} {'total s':>8}")
    for name in args.presets:
        s = spec.load(name)
        g, t_build = timed(graph.build, s)
        report, t_analyse = timed(analysis.inspect, g)
        total = t_build + t_analyse
        flag = "" if total < args.target_s else f"  ABOVE TARGET {args.target_s:g} s"
        ok &= total < args.target_s
        print(f"{name:<14} {report['accelerators']:>8,} {report['links']['total']:>10,} "
              f"{t_build:>8.2f} {t_analyse:>9.2f} {total:>8.2f}{flag}")
    # Side by side: the builder's link insertion vs networkx's public API, same links.
    g = graph.build(spec.load("alibaba-hpn"))
    links = [(u, v, dict(d)) for u, v, d in g.edges(data=True)]
    bare = nx.MultiGraph()
    bare.add_nodes_from(g.nodes)
    gc.disable()
    try:
        ref = bare.copy()
        _, t_nx = timed(ref.add_edges_from, links)
        ours = bare.copy()
        _, t_ours = timed(graph.add_links, ours, links)
    finally:
        gc.enable()
    print(f"link insertion, {len(links):,} links: networkx add_edges_from {t_nx:.3f} s, "
          f"graph.add_links {t_ours:.3f} s ({t_nx / t_ours:.1f}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
