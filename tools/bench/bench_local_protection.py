#!/usr/bin/env python3
"""Benchmark: local protection proved over many scenario shapes (``hpnlab.fabric.routing.protection``).

The larger sweep beside tests/unit/test_local_protection.py: the small presets, then ``--shapes``
shapes drawn (seeded, the same every run) from ``hpnlab.fabric.scenario.shapes.SWEEP`` -- planes,
rails, leaves per segment, hosts, segments, spines, pods, cores, campuses, parallel links of each
kind, a fat-tree's k -- up to ``--max-cost`` estimated walks each. For each: every event of every
kind (a link down at both ends, at one end with and without BFD, a switch down, a switch coming
back, a link coming back at one end first) on plane 0, every pair walked and every entropy branch,
through the healthy tables with only port liveness changed; its events, pairs, branches, the
black holes, loops and double bounces (more than one down-up turn) outside the named exceptions,
and the branches those exceptions excuse. ``--before REV`` proves the same shapes with the compiler
of git revision REV too (the tables as they were), side by side. Wall and CPU seconds and the load
average are printed: the machine may be busy.

    python tools/bench/bench_local_protection.py                          # presets + 20 shapes
    python tools/bench/bench_local_protection.py --shapes 100 --max-cost 300000 --json out.json
    python tools/bench/bench_local_protection.py --before main --shapes 20
    python tools/bench/bench_local_protection.py --only-issue-shapes --before main --kinds switch-down,switch-back
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from hpnlab.fabric.routing import protection
from hpnlab.fabric.scenario import graph, shapes, spec

PRESETS = ["mini-hpn", "mini-spine-leaf", "mini-rail", "mini-cross-campus", "fat-tree-4", "small-hpn"]
#: the odd shapes issue 54's holes were found on (``--issue-shapes``)
ISSUE_SHAPES: list[tuple[str, dict[str, int]]] = [
    ("hpn", {"planes": 2, "campuses": 3, "cores_per_plane": 2, "long_haul_links": 2, "segments_per_pod": 2}),
    ("hpn", {"planes": 3, "leaf_spine_links": 2, "spines_per_plane": 3, "segments_per_pod": 2}),
    ("hpn", {"planes": 2, "pods": 2, "cores_per_plane": 2, "spines_per_plane": 2, "segments_per_pod": 2}),
    ("hpn", {"planes": 2, "campuses": 2, "cores_per_plane": 2, "long_haul_links": 1, "segments_per_pod": 2,
             "hosts_per_segment": 2}),
    ("fat-tree", {"k": 6}),
]


def prove(g, kinds: list[str], compile_fabric=None) -> tuple[protection.LocalProof, float, float]:
    t, c = time.perf_counter(), time.process_time()
    healthy = compile_fabric(g) if compile_fabric is not None else None
    if compile_fabric is not None:
        g.graph.pop("_controller_index", None)      # the other compiler's index is not this one's
    proof = protection.prove(g, kinds, healthy=healthy)
    return proof, time.perf_counter() - t, time.process_time() - c


def row_of(proof: protection.LocalProof) -> dict[str, Any]:
    excepted: dict[str, int] = {}
    for r in proof.rows.values():
        for k, n in r.excepted.items():
            excepted[k] = excepted.get(k, 0) + n
    return {"events": proof.events, "pairs": proof.pairs, "branches": proof.branches,
            "black_holes": sum(r.black_holes for r in proof.rows.values()),
            "loops": sum(r.loops for r in proof.rows.values()),
            "double_bounces": sum(r.double_bounces for r in proof.rows.values()), "excepted": excepted,
            "failing": {k: [v.event.name for v in r.failing[:3]] for k, r in proof.rows.items() if r.failing},
            "examples": [str(p) for r in proof.rows.values() for v in r.failing[:1] for p in v.problems[:1]]}


def holes_text(r: dict[str, Any]) -> str:
    return f"{r['black_holes']:>7,d} {r['loops']:>5,d} {r['double_bounces']:>6,d}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", type=int, default=20, help="generated shapes (default 20)")
    ap.add_argument("--seed", type=int, default=54, help="the shapes' seed (default 54)")
    ap.add_argument("--max-cost", type=int, default=150_000, help="most estimated walks per shape (default 150,000)")
    ap.add_argument("--presets", nargs="*", default=PRESETS, help="presets proved first (default the small ones)")
    ap.add_argument("--issue-shapes", action="store_true", help="also the odd shapes issue 54 was found on "
                                                                     "(a 6-ary fat-tree among them: slow)")
    ap.add_argument("--only-issue-shapes", action="store_true", help="those alone (no presets, no drawn shapes)")
    ap.add_argument("--kinds", default=",".join(protection.EVENT_KINDS),
                    help=f"event kinds, comma list of {', '.join(protection.EVENT_KINDS)} (default all)")
    ap.add_argument("--before", metavar="REV", help="also prove each with the compiler of git revision REV")
    ap.add_argument("--json", metavar="FILE", help="write every row here")
    args = ap.parse_args(argv)
    old = None
    if args.before:
        from gitrev import module_at
        old = module_at(args.before, "fabric/routing/compiler.py", "hpnlab.fabric.routing._compiler_before",
                        who="bench_local_protection")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in protection.EVENT_KINDS]
    if bad:
        print(f"bench_local_protection: unknown event kind {bad[0]!r}")
        return 2
    targets: list[tuple[str, Any]] = []
    if not args.only_issue_shapes:
        targets += [(name, lambda n=name: spec.load(n)) for name in args.presets]
        targets += [(shapes.name_of(c, k), lambda k=k, c=c: shapes.scenario(k, **c))
                    for k, c in shapes.sweep(args.shapes, args.seed, max_cost=args.max_cost)]
    if args.issue_shapes or args.only_issue_shapes:
        targets += [(shapes.name_of(c, k), lambda k=k, c=c: shapes.scenario(k, **c)) for k, c in ISSUE_SHAPES]
    head = f"{'shape':38s} {'events':>7s} {'pairs':>8s} {'branches':>10s} {'holes':>7s} {'loops':>5s} {'double':>6s}"
    head += f" {'excepted':>9s} {'wall s':>7s}"
    head += f"   before: {'holes':>7s} {'loops':>5s} {'double':>6s}" if old else ""
    print(head, flush=True)
    rows = []
    t0, c0 = time.perf_counter(), time.process_time()
    for name, make in targets:
        s = make()
        proof, wall, cpu = prove(graph.build(s), kinds)
        r = {"shape": name, **row_of(proof), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
             "load": round(os.getloadavg()[0], 2)}
        line = (f"{name:38s} {r['events']:>7,d} {r['pairs']:>8,d} {r['branches']:>10,d} {holes_text(r)}"
                f" {sum(r['excepted'].values()):>9,d} {wall:>7.1f}")
        if old is not None:
            before, _w, _c = prove(graph.build(s), kinds, old.compile_fabric)
            r["before"] = row_of(before)
            line += f"           {holes_text(r['before'])}"
        rows.append(r)
        print(line, flush=True)
        for ex in r["examples"][:2]:
            print(f"    {ex}", flush=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    total = {k: sum(r[k] for r in rows) for k in ("events", "pairs", "branches", "black_holes", "loops",
                                                  "double_bounces")}
    excused = sum(sum(r["excepted"].values()) for r in rows)
    print(f"{len(rows)} shapes: {total['events']:,} events, {total['pairs']:,} pairs, {total['branches']:,} branches; "
          f"{total['black_holes']:,} black holes, {total['loops']:,} loops, "
          f"{total['double_bounces']:,} double bounces; "
          f"{excused:,} branches excused (unaware-end); {wall:.0f} s wall, {cpu:.0f} s CPU, "
          f"load {os.getloadavg()[0]:.1f}")
    if old is not None:
        b = {k: sum(r["before"][k] for r in rows) for k in ("black_holes", "loops", "double_bounces")}
        hit = sum(1 for r in rows if r["before"]["black_holes"] + r["before"]["loops"] + r["before"]["double_bounces"])
        print(f"before ({args.before}): {b['black_holes']:,} black holes, {b['loops']:,} loops, "
              f"{b['double_bounces']:,} double bounces, on {hit} of {len(rows)} shapes")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seed": args.seed, "max_cost": args.max_cost, "before": args.before, "kinds": kinds,
                       "rows": rows,
                       "wall_s": wall, "cpu_s": cpu, "cpus": os.cpu_count()}, fh, indent=1)
        print(f"wrote {args.json}")
    return 1 if total["black_holes"] or total["loops"] or total["double_bounces"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
