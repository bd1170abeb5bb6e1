#!/usr/bin/env python3
"""Benchmark: what one link failure and its recovery cost the controller core (goal: recompile +
diff under 100 ms on hpn-130k, issue 10).

For each preset, the pure reconciler of the failed link's plane (the reconciler recompiles only
the planes an event touches; the others are not set up, to keep the set-up short) starts with
every switch connected and holding its healthy state (set directly, with the indexes an
installation leaves: installing 130k-port fabrics message by message is not what is measured
here); then the first leaf-spine link fails and one end reports it (one PortStatus), the update
is driven to the end (every barrier answered at once), and the link recovers the same way.
Repeated ``--repeat`` times; printed as median [min-max] in milliseconds of CPU time (the
machine may be busy):
    compile   recompiling the plane (compiler.compile_fabric, switches=that plane): patched from
              the healthy plane (only the switches whose next-hop sets or routes change)
    compare   finding the switches whose compiled state changed (identity first, then the tuples)
              and making their desired tables and indexes (patched from the previous ones)
    diff      diffing only those switches against what they confirmed
    plan      ordering the first step (downstream first, groups, entropy; see reconcile.plan);
              with ``--plan-before REV``, beside it the plan of that revision on the same inputs;
              and first, a cold start's first plan (every switch of the plane connected, empty)
and the messages each update sends, by kind, counted on what the reconciler sends. Side by side,
in the same run: the same with the full recompile of the plane (compile_fabric(...,
incremental=False), what the reconciler did before the patch).
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections import Counter
from types import ModuleType

from gitrev import module_at

from hpnlab.controller import reconcile
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.stats import median_range

LOAD_NOTE = "(load average {:.1f} on {} CPUs: wall times stretch with it, CPU times less)"


def installed(g, policy: str = "aggregate", plane: int | None = None,
              compile_fn: reconcile.CompileFn = compiler.compile_fabric) -> reconcile.Reconciler:
    """A reconciler whose switches (those of ``plane`` only, when given) are all connected and
    hold their healthy state."""
    if plane is not None:
        ix = compiler.index_of(g)
        only = [sw.name for sw in ix.planes[plane]]
        compile_fn = functools.partial(_plane_only, compile_fn, only)
    rec = reconcile.Reconciler(g, policy, compile_fn=compile_fn)
    rec.connected = set(rec.desired)
    rec.confirmed = {sw: dict(table) for sw, table in rec.desired.items()}
    # what an installation through the reconciler leaves behind: every desired table indexed
    # (its routes, its entropy entries by metadata) and the plane's addresses sorted
    for sw, table in rec.desired.items():
        rec._index[sw] = reconcile.TableIndex(table)
        rec._index[sw].meta_index(compiler.TABLE_ENTROPY)
    reconcile._plane_addresses(rec.ix)
    assert rec.settled
    return rec


def _plane_only(compile_fn, only: list[str], g, failures=None, policy: str = "aggregate", switches=None, **kw):
    return compile_fn(g, failures, policy, switches=only if switches is None else switches, **kw)


def reconcile_of(rev: str) -> ModuleType:
    """controller/reconcile.py of git revision ``rev`` of this checkout, loaded under another name
    (its plan is measured on the same inputs as today's: same signature)."""
    return module_at(rev, "controller/reconcile.py", "reconcile_before", who="bench_reconcile",
                     edit=lambda text: text.replace("from . import compiler", "from hpnlab.controller import compiler"))


class PlanRecorder:
    """Wraps reconcile.plan while in use and keeps the arguments of its first call."""

    def __init__(self) -> None:
        self.args: tuple | None = None
        self._plan = reconcile.plan

    def __enter__(self) -> PlanRecorder:
        def recording(*args):
            if self.args is None:
                self.args = args
            return self._plan(*args)
        reconcile.plan = recording
        return self

    def __exit__(self, *exc) -> None:
        reconcile.plan = self._plan


def plan_cpu(module: ModuleType, args: tuple) -> float:
    """CPU seconds of ``module.plan`` on recorded arguments (ix, confirmed, desired, items, failures,
    indexes); its items and table indexes are made with that module's classes first (not timed)."""
    ix, confirmed, desired, items, failures, _indexes = args
    def key(k):
        return module.GroupKey(*k) if reconcile.is_group(k) else k
    mine = [module.Item(it.switch, key(it.key), it.actions) for it in items]
    # the tables of the items' switches (all plan reads) with that module's group keys: its own code
    # tells groups from flows by their class
    switches = {it.switch for it in items}
    confirmed = {sw: {key(k): v for k, v in confirmed.get(sw, {}).items()} for sw in switches}
    desired = {sw: {key(k): v for k, v in desired.get(sw, {}).items()} for sw in switches}
    indexes = {}
    for sw in switches:
        indexes[sw] = [module.TableIndex(confirmed[sw]), module.TableIndex(desired[sw])]
    module._plane_addresses(ix)
    c = time.process_time()
    module.plan(ix, confirmed, desired, mine, failures, indexes)
    return time.process_time() - c


def kind(m) -> str:
    return type(m).__name__ + (":" + m.command if hasattr(m, "command") else "")


def settle(rec: reconcile.Reconciler, first: list) -> tuple[Counter, int, float, set[str]]:
    """Drive an update to the end, every barrier answered at once: (messages by kind, steps,
    plan CPU seconds over all steps, switches that got a flow-mod or group-mod)."""
    counts: Counter = Counter(kind(m) for m in first)
    switches = {m.switch for m in first if isinstance(m, (reconcile.FlowMod, reconcile.GroupMod))}
    steps, plan_s, queue = 1, rec.timings["plan_s"], list(first)
    while queue:
        barriers = [m for m in queue if isinstance(m, reconcile.Barrier)]
        queue = []
        for b in barriers:
            more = rec.handle(reconcile.BarrierReply(b.switch, b.xid))
            if more:
                steps += 1
                plan_s += rec.timings["plan_s"]
                counts.update(kind(m) for m in more)
                switches.update(m.switch for m in more if isinstance(m, (reconcile.FlowMod, reconcile.GroupMod)))
                queue += more
    assert rec.settled
    return counts, steps, plan_s, switches


def first_leaf_spine_link(g) -> tuple[str, str, int]:
    """(leaf, spine, the leaf's port) of the first leaf's first uplink."""
    leaf = next(n for n in graph.switches(g) if g.nodes[n]["tier"] == 1)
    spine = next(n for n in g.adj[leaf] if g.nodes[n]["tier"] == 2)
    return leaf, spine, g.edges[leaf, spine, 0]["ports"][leaf]


def spread(values: list[float]) -> str:
    """Seconds of CPU as milliseconds, median [min-max]."""
    return median_range(values, "{:.1f}", scale=1000)


def mods(counts: Counter) -> str:
    m = {k: v for k, v in sorted(counts.items()) if k != "Barrier"}
    return f"{sum(m.values()):,} messages ({', '.join(f'{k} {v:,}' for k, v in m.items())})"


def measure(rec: reconcile.Reconciler, leaf: str, port: int, repeat: int, before: ModuleType | None = None) -> dict:
    """Per event ("failure", "recovery"): CPU seconds per part over the repetitions, and the
    messages of the last repetition; with ``before`` (an older reconcile module) also its plan's CPU
    seconds on the same first step (``plan_before``)."""
    out: dict = {ev: {"compile": [], "compare": [], "diff": [], "core": [], "plan": [], "event": [],
                      "plan_before": []} for ev in ("failure", "recovery")}
    for _ in range(repeat):
        for ev, up in (("failure", False), ("recovery", True)):
            c = time.process_time()
            with PlanRecorder() as recorded:
                first = rec.handle(reconcile.PortStatus(leaf, {port: up}))
            took = time.process_time() - c
            if before is not None and recorded.args is not None:
                out[ev]["plan_before"].append(plan_cpu(before, recorded.args))
            t = dict(rec.timings)
            row = out[ev]
            row["compile"].append(t["compile_s"])
            row["compare"].append(t["compare_s"])
            row["diff"].append(t["diff_s"])
            row["core"].append(t["compile_s"] + t["compare_s"] + t["diff_s"])
            row["plan"].append(t["plan_s"])
            row["event"].append(took)
            row["messages"], row["steps"], _plan, _switches = settle(rec, first)
    return out


def cold_start(g, policy: str, plane: int, repeat: int, before: ModuleType | None, before_rev: str) -> None:
    """The first plan of a cold start (every switch of the plane connected, every table empty: the
    step that sends everything), CPU seconds over the repetitions; with ``before`` side by side."""
    ix = compiler.index_of(g)
    only = [sw.name for sw in ix.planes[plane]]
    rec = reconcile.Reconciler(g, policy, compile_fn=functools.partial(_plane_only, compiler.compile_fabric, only))
    items = [it for sw in only for it in reconcile.diff({}, rec.desired[sw], sw)]
    args: tuple = (rec.ix, {}, rec.desired, items, None, {})
    now = [plan_cpu(reconcile, args) for _ in range(repeat)]
    line = f"  cold start, first plan: {len(items):,} items on {len(only)} switches, {spread(now)} ms"
    if before is not None:
        line += f"; with reconcile.py of {before_rev}: {spread([plan_cpu(before, args) for _ in range(repeat)])} ms"
    print(line)


def bench(name: str, policy: str, target_s: float, repeat: int, full: bool, before: ModuleType | None = None,
          before_rev: str = "") -> bool:
    g = graph.build(spec.load(name))
    leaf, spine, port = first_leaf_spine_link(g)
    plane = g.nodes[leaf].get("plane", 0)
    rows = [("patched", compiler.compile_fabric)]
    if full:
        rows.append(("full", functools.partial(compiler.compile_fabric, incremental=False)))
    ok = True
    results = {}
    for label, fn in rows:
        t = time.perf_counter()
        rec = installed(g, policy, plane, fn)
        t_init = time.perf_counter() - t
        if label == "patched":
            print(f"\n== {name} ({policy}), plane {plane}: {len(rec.desired):,} switches, "
                  f"{sum(len(t) for t in rec.desired.values()):,} flows and groups (set up in {t_init:.1f} s); "
                  f"{leaf}-{spine} fails and recovers, {leaf} reports it; {repeat} repetitions, "
                  f"CPU ms median [min-max]")
        results[label] = measure(rec, leaf, port, repeat, before if label == "patched" else None)
        del rec
    cold_start(g, policy, plane, repeat, before, before_rev)
    print(f"  {'':9} {'event':9} {'compile':>22} {'compare':>22} {'diff':>22} {'recompile + diff':>22}")
    for label, res in results.items():
        for ev, row in res.items():
            flag = ""
            if label == "patched":
                met = statistics.median(row["core"]) < target_s
                ok &= met
                flag = "" if met else f"  ABOVE GOAL {1000 * target_s:.0f} ms"
            print(f"  {label:9} {ev:9} {spread(row['compile']):>22} {spread(row['compare']):>22} "
                  f"{spread(row['diff']):>22} {spread(row['core']):>22}{flag}")
    for label, res in results.items():
        for ev, row in res.items():
            print(f"  {label:9} {ev:9} update: {row['steps']} steps, {mods(row['messages'])}; "
                  f"first step's plan {spread(row['plan'])} ms, whole event {spread(row['event'])} ms")
            if row["plan_before"]:
                print(f"  {'':9} {ev:9} the same plan with reconcile.py of {before_rev}: "
                      f"{spread(row['plan_before'])} ms")
    print(f"  goal: recompile + diff under {1000 * target_s:.0f} ms (median): {'met' if ok else 'NOT MET'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("presets", nargs="*", default=["alibaba-hpn", "hpn-130k"])
    ap.add_argument("--policy", default="aggregate", choices=compiler.ROUTING_POLICIES)
    ap.add_argument("--target-ms", type=float, default=100.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-full", dest="full", action="store_false",
                    help="skip the side-by-side full recompile")
    ap.add_argument("--plan-before", metavar="REV",
                    help="also time reconcile.plan of this git revision on the same first step (e.g. 6d1b126, "
                         "before plan decided once per route instead of once per address)")
    args = ap.parse_args()
    before = reconcile_of(args.plan_before) if args.plan_before else None
    print(LOAD_NOTE.format(os.getloadavg()[0], os.cpu_count()))
    ok = True
    for name in args.presets:
        ok &= bench(name, args.policy, args.target_ms / 1000, args.repeat, args.full, before, args.plan_before or "")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
