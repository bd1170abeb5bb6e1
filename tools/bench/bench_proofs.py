#!/usr/bin/env python3
"""Benchmark: failure-tolerance proofs (hpnlab.fabric.routing.proofs), reduced by symmetry against
exhaustive (goal: hpn-130k and alibaba-hpn, every single link and switch, within a few minutes
on 2 cores).

For each preset: the graph build (not part of the proof), then the proof of every single link
and every single switch failure -- one failure per symmetry class, one pair per pair class --
with its classes, the failures they stand for and the pairs walked; on the small presets the
exhaustive proof too (every failure, every pair), its time and whether both give the same
verdict per class. Wall and CPU seconds are both printed (the machine may be busy).

    python tools/bench/bench_proofs.py                        # the small presets, alibaba-hpn, hpn-130k
    python tools/bench/bench_proofs.py mini-hpn alibaba-hpn   # some presets
    python tools/bench/bench_proofs.py --pairs --plane mini-hpn
"""
from __future__ import annotations

import argparse
import time

from hpnlab.fabric.routing import proofs
from hpnlab.fabric.scenario import graph, spec

SMALL = ["mini-hpn", "fat-tree-4", "mini-rail", "mini-cross-campus", "mini-spine-leaf"]
LARGE = ["alibaba-hpn", "hpn-130k"]


def timed(fn, *args, **kw):
    t, c = time.perf_counter(), time.process_time()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t, time.process_time() - c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("presets", nargs="*", default=SMALL + LARGE)
    ap.add_argument("--pairs", action="store_true", help="also every pair of links")
    ap.add_argument("--plane", action="store_true", help="also a whole plane")
    ap.add_argument("--verbose", "-v", action="store_true", help="one line per failure class")
    args = ap.parse_args(argv)
    print(f"{'preset':18s} {'build s':>8s} {'classes':>7s} {'failures':>9s} {'pairs':>6s} {'reduced s':>10s} "
          f"{'cpu s':>7s} {'exhaustive s':>12s} {'same':>5s}  verdict")
    for name in args.presets:
        g, build, _c = timed(graph.build, spec.load(name))
        kw = {"pairs": args.pairs, "plane": args.plane}
        red, wall, cpu = timed(proofs.prove, g, **kw)
        walked = red.healthy.pairs + sum(c.pair_classes for c in red.classes)
        ex_s, same = "-", "-"
        if name in SMALL:
            ex, ex_wall, _ = timed(proofs.prove, g, exhaustive=True, **kw)
            ex_s = f"{ex_wall:.1f}"
            same = "yes" if [(c.verdict.ok, c.verdict.kinds) for c in red.classes] == \
                [(c.verdict.ok, c.verdict.kinds) for c in ex.classes] else "NO"
        bad = [f"{c.cls.label} ({c.verdict.failure.name}: {', '.join(sorted(c.verdict.kinds))})"
               for c in red.classes if not c.verdict.ok]
        verdict = "every failure tolerated" if red.ok else "NOT tolerated: " + "; ".join(bad)
        print(f"{name:18s} {build:8.1f} {len(red.classes):7d} {red.failures:9,d} {walked:6d} {wall:10.1f} "
              f"{cpu:7.1f} {ex_s:>12s} {same:>5s}  {verdict}", flush=True)
        if args.verbose:
            for c in red.classes:
                print(f"    {c.cls.label:24s} represents {c.cls.size:9,d}  pairs {c.pair_classes:4d}  "
                      f"{c.verdict.seconds:6.1f} s  {proofs.figure(c.verdict)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
