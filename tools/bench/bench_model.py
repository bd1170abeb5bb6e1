#!/usr/bin/env python3
"""Benchmark: the flow model at full scale, beside the model it replaced.

1. Scale: for each preset (default hpn-130k, 131,072 ranks), the time to build the fabric
   graph, to index it (the model's :class:`Network`: links, the compiler's routes and entropy
   tables as arrays), then a permutation (256 MiB per rank, random placement) and a ring
   all-reduce, each with per-flow hashing (``flow``), spraying (``spray``) and, for today's
   model, host-side adaptive routing (``adaptive``), and one
   all-to-all step sampled (its relative standard error printed). Wall and CPU time
   (``resource.getrusage``) beside each other, with the load average: the machine is shared.
2. The same runs with the model as it was before (``--baseline REV``: ``fabric/model/flow.py`` of
   that git revision, loaded beside the current package; ``ecmp`` is its name for ``flow``).
3. Accuracy of the drain-time estimate on small fabrics: its makespan / the exact max-min
   fluid makespan over several seeds (a lower bound; how close, is measured here, not tested).
4. Routing under failure on small presets: connections left without a path over every single
   fabric-link failure (must be 0; tests/test_model*.py hold it).
5. Results against the model at ``--equal REV`` (default: main) on the small presets: every
   collective x routing, healthy and with one fabric link failed, the largest relative
   difference of the collective's time and of the per-connection rates (a speed-up must leave
   them unchanged to rounding, ~1e-12).
6. ``--cli REV``: the command a user runs, ``hpnlab model hpn-130k -c permutation -b 256M
   --routing ecmp,spray`` (``--cli-args``), as this checkout and as the checkout of REV (a
   temporary git worktree, imported first on PYTHONPATH) side by side: from an empty model cache
   (cold) and again with the cache it left (warm), ``--repeat`` times each, the two versions
   alternating so that they share the machine's load; wall and CPU seconds and peak memory
   (each run's own, ``os.wait4``), median [min-max], with the load average, and their ratios. The
   full run (``make bench``) ends with it beside ``--cli-rev`` (default main), 3 runs each.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gitrev import module_at

from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph, spec

ROOT = Path(__file__).resolve().parent.parent
SIZE = 1 << 28


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn: Callable[..., Any], *args: Any, **kw: Any) -> tuple[Any, float, float]:
    t, c = time.perf_counter(), cpu_s()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t, cpu_s() - c


def baseline_module(rev: str):
    """``fabric/model/flow.py`` at git revision ``rev``, imported as a module of hpnlab.fabric, with the
    ``fabric/model/forwarding.py`` of the same revision where it had one (the model as it was)."""
    edit = None
    try:
        module_at(rev, "fabric/model/forwarding.py", "hpnlab.fabric._model_forwarding_baseline", who="bench_model")
        edit = lambda text: text.replace("from .model_forwarding import", "from ._model_forwarding_baseline import")  # noqa: E731 (one use)
    except SystemExit:           # no model_forwarding.py at that revision
        pass
    return module_at(rev, "fabric/model/flow.py", "hpnlab.fabric._model_baseline", who="bench_model", edit=edit)


def spread(values: list[float]) -> str:
    """median [min-max] of a few timings."""
    return f"{statistics.median(values):5.1f} [{min(values):.1f}-{max(values):.1f}]"


def scale(presets: list[str], qps: int, rev: str | None, repeat: int = 1, routings: tuple[str, ...] = ()) -> None:
    print(f"## {SIZE >> 20} MiB per rank, random placement, {qps} QPs; wall s / CPU s (median [min-max] of {repeat}), "
          "busbw of line")
    for name in presets:
        g, t_build, c_build = timed(graph.build, spec.load(name))
        print(f"{name}: graph built in {t_build:.1f} s wall / {c_build:.1f} s CPU  {load()}", flush=True)
        versions: list[tuple[str, Any, dict[str, str]]] = [
            ("now", model, {"flow": "flow", "spray": "spray", "adaptive": "adaptive"})]
        if rev:
            old = baseline_module(rev)
            has = getattr(old, "ROUTINGS", ("ecmp", "spray"))
            versions.append((f"at {rev[:10]}", old, {k: ("ecmp" if k == "flow" and "flow" not in has else k)
                                                     for k in ("flow", "spray", "adaptive")
                                                     if k in has or (k == "flow" and "ecmp" in has)}))
        for label, mod, names in versions:
            net, t_ix, c_ix = timed(mod.Network, g)
            print(f"  {label:<14} index {t_ix:6.1f} s wall {c_ix:6.1f} s CPU  {load()}", flush=True)
            for coll in ("permutation", "all_reduce"):
                for routing in names:
                    if routings and routing not in routings:
                        continue
                    walls, cpus = [], []
                    for _ in range(repeat):
                        r, t, c = timed(mod.run_collective, g, coll, SIZE, routing=names[routing],
                                        placement="random", qps=qps, network=net)
                        walls.append(t)
                        cpus.append(c)
                    print(f"  {label:<14} {coll:<12} {routing:<8} {spread(walls)} s wall {spread(cpus)} s CPU  "
                          f"busbw {r.efficiency:6.1%}  {load()}", flush=True)
            if label == "now":
                r, t, c = timed(model.run_collective, g, "all_to_all", SIZE, routing="flow", placement="random",
                                qps=1, network=net)
                print(f"  {label:<14} all_to_all   flow   {t:6.1f} s wall {c:6.1f} s CPU  busbw {r.efficiency:6.1%}  "
                      f"sampled: each pair for {r.steps[0].sampled:,.0f}, relative standard error "
                      f"{r.sampling_error:.2%}  {load()}", flush=True)
            del net
        print(f"  peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")


def drain_accuracy(presets: list[str], seeds: int) -> None:
    print(f"\n## drain-time makespan / exact max-min fluid makespan (permutation, flow, 1 QP, {seeds} seeds)")
    for name in presets:
        g = graph.build(spec.load(name))
        net = model.Network(g)
        ratios = []
        for seed in range(seeds):
            job = model.make_job(g, None, "random", seed=seed)
            (st,) = model.steps("permutation", job, 1 << 20, max_steps=1, seed=seed, rails=g.graph["scenario"].rails)
            r = model.route_step(net, job, (st.src, st.dst), st.nbytes, "flow", 1, seed)
            args = (r.flow_idx, r.link_idx, r.weight, net.cap, r.size_bits)
            ratios.append(model.drain_times(*args).max() / model.flow_times(*args, group=0.0).max())
        print(f"{name:<18} min {min(ratios):.3f}  mean {statistics.mean(ratios):.3f}  max {max(ratios):.3f}")


def failures(presets: list[str]) -> None:
    print("\n## routing under every single fabric-link failure (all-to-all, 4 QPs): stalled connections")
    for name in presets:
        g = graph.build(spec.load(name))
        links = [(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] != "host"]
        stalled = dict.fromkeys(model.ROUTINGS, 0)
        for link in links:
            net = model.Network(g, {link})
            for routing in model.ROUTINGS:
                r = model.run_collective(g, "all_to_all", 1 << 20, routing=routing, qps=4, placement="packed",
                                         network=net)
                stalled[routing] += r.stalled_connections
        print(f"{name:<18} {len(links)} failures: " + ", ".join(f"{k} {v}" for k, v in stalled.items()))


def relative_difference(a: Any, b: Any) -> float:
    """The largest |a - b| / |b| over two results' times and per-connection rates (0 where both are
    equal, inf included; inf where only one is inf)."""
    import numpy as np
    got = np.r_[a.time_s, np.concatenate([st.rates_gbps for st in a.steps] or [np.zeros(0)])]
    want = np.r_[b.time_s, np.concatenate([st.rates_gbps for st in b.steps] or [np.zeros(0)])]
    if got.shape != want.shape:
        return float("inf")
    same = got == want
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(same, 0.0, np.abs(got - want) / np.abs(want))
    return float(np.nan_to_num(rel, nan=float("inf")).max(initial=0.0))


def equal(presets: list[str], rev: str) -> float:
    """Today's results against ``fabric/model/flow.py`` at ``rev``: the largest relative difference per preset."""
    old = baseline_module(rev)
    print(f"\n## results against fabric/model/flow.py at {rev}: largest relative difference of time and "
          "per-connection rates (every collective x routing, healthy and one link failed)")
    worst = 0.0
    for name in presets:
        g = graph.build(spec.load(name))
        failed = model.random_fabric_links(g, 1, 2)
        row = []
        for fail in (None, failed):
            now_net, old_net = model.Network(g, fail), old.Network(g, fail)
            diff = 0.0
            for coll in model.MODEL_COLLECTIVES:
                for routing in model.ROUTINGS:
                    kw: dict[str, Any] = dict(routing=routing, placement="random", qps=4, seed=3, max_steps=4)
                    try:
                        a = model.run_collective(g, coll, 1 << 20, network=now_net, **kw)
                        b = old.run_collective(g, coll, 1 << 20, network=old_net, **kw)
                    except model.UserError:          # halving-doubling on a rank count it cannot take
                        continue
                    diff = max(diff, relative_difference(a, b))
            row.append(f"{'healthy' if fail is None else 'one link failed'} {diff:.1e}")
            worst = max(worst, diff)
        print(f"{name:<18} " + ", ".join(row), flush=True)
    return worst


CLI_ARGS = "model hpn-130k -c permutation -b 256M --routing ecmp,spray"


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MB, exit code) of one command, its own (``os.wait4``)."""
    import subprocess
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (time.perf_counter() - t, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
            proc.returncode)


def cli_side_by_side(rev: str, cli_args: str, repeat: int) -> dict[str, Any]:
    """``hpnlab CLI_ARGS`` cold and warm, this checkout and ``rev``'s, alternating (see section 6)."""
    import subprocess
    import sys
    import tempfile
    # the commits measured, named before the runs (a branch may move while they run)
    commits = {label: subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True,
                                     text=True).stdout.strip() for label, ref in (("now", "HEAD"), (f"at {rev}", rev))}
    results: dict[str, dict[str, list[tuple[float, float, float]]]] = {}
    loads: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hpnlab-bench-model-") as tmp:
        base = Path(tmp) / "checkout"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(base),
                        commits[f"at {rev}"] or rev], check=True)
        try:
            ns = Path(tmp) / "ns" / "hpnlab"       # hpnlab.* from the baseline's folders, ahead of the install
            ns.mkdir(parents=True)
            for d in ("fabric", "cli", "controller", "topologies"):
                (ns / d).symlink_to(base / d)
            versions = {"now": {}, f"at {rev}": {"PYTHONPATH": str(ns.parent)}}
            cmd = [sys.executable, "-m", "hpnlab.cli", *cli_args.split()]
            for i in range(repeat):
                for label, extra in versions.items():
                    cache = Path(tmp) / f"cache-{label.replace(' ', '-')}-{i}"
                    env = {**os.environ, **extra, "HPNLAB_CACHE": str(cache)}
                    for phase in ("cold", "warm"):
                        wall, cpu, mb, rc = run_measured(cmd, env)
                        if rc:
                            raise SystemExit(f"bench_model: {label} {phase} run failed (exit {rc}): {' '.join(cmd)}")
                        results.setdefault(label, {}).setdefault(phase, []).append((wall, cpu, mb))
                        loads.append(f"{label} {phase}: {load()}")
                        print(f"  {label:<14} {phase}: {wall:6.1f} s wall {cpu:6.1f} s CPU {mb:7.0f} MB  {load()}",
                              flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    print(f"\n## hpnlab {cli_args}: median [min-max] of {repeat}")
    print(f"{'':<14} {'phase':<5} {'wall s':>18} {'CPU s':>18} {'peak MB':>22}")
    out: dict[str, Any] = {"args": cli_args, "rev": rev, "repeat": repeat, "commits": commits, "runs": results,
                           "loads": loads}
    for label, phases in results.items():
        for phase, runs in phases.items():
            walls, cpus, mbs = ([r[k] for r in runs] for k in range(3))
            print(f"{label:<14} {phase:<5} {spread(walls):>18} {spread(cpus):>18} "
                  f"{statistics.median(mbs):>7.0f} [{min(mbs):.0f}-{max(mbs):.0f}]")
    now, old = results["now"], results[f"at {rev}"]
    for phase in ("cold", "warm"):
        ratio = statistics.median(r[0] for r in old[phase]) / statistics.median(r[0] for r in now[phase])
        mem = statistics.median(r[2] for r in old[phase]) / statistics.median(r[2] for r in now[phase])
        cpu = statistics.median(r[1] for r in old[phase]) / statistics.median(r[1] for r in now[phase])
        print(f"# {phase}: {ratio:.2f}x faster (wall, medians), {cpu:.2f}x less CPU, {mem:.2f}x less memory "
              f"than at {rev}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("presets", nargs="*", default=["hpn-130k"])
    ap.add_argument("--qps", type=int, default=4)
    ap.add_argument("--baseline", default="6d1b126",
                    help="git revision of the model to run beside (default 6d1b126, main before issue 13); "
                         "'' to skip")
    ap.add_argument("--small", default="mini-hpn,small-hpn,mini-cross-campus",
                    help="presets for the accuracy and failure sections")
    ap.add_argument("--equal", default="main", metavar="REV",
                    help="git revision whose results today's must equal on the small presets (default main; "
                         "'' to skip)")
    ap.add_argument("--only-equal", action="store_true", help="run only the results-against-REV section")
    ap.add_argument("--only-scale", action="store_true", help="run only the scale section")
    ap.add_argument("--repeat", type=int, default=1, help="scale: runs of each timing (median [min-max]), default 1")
    ap.add_argument("--routings", default="", help="scale: comma list of the routings to time (default every one)")
    ap.add_argument("--cli", metavar="REV", help="only section 6: the CLI cold and warm beside REV's (e.g. main)")
    ap.add_argument("--cli-args", default=CLI_ARGS, help=f"section 6's hpnlab arguments (default: {CLI_ARGS})")
    ap.add_argument("--json", metavar="FILE", help="section 6: write its runs here")
    ap.add_argument("--cli-rev", default="main", metavar="REV",
                    help="the full run's section 6 beside REV (default main, 3 runs each; '' or a REV git does not "
                         "know: skipped)")
    args = ap.parse_args()
    if args.cli:
        cli_section(args.cli, args.cli_args, max(1, args.repeat), args.json)
        return 0
    small = [p for p in args.small.split(",") if p]
    if not args.only_equal:
        scale(args.presets, args.qps, args.baseline or None, max(1, args.repeat),
              tuple(r for r in args.routings.split(",") if r))
    if args.only_scale:
        return 0
    if not args.only_equal:
        drain_accuracy(small, seeds=10)
        failures(small)
    if args.equal:
        equal(small + ["mini-rail", "mini-spine-leaf", "fat-tree"], args.equal)
    if not args.only_equal and args.cli_rev:
        import subprocess
        known = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", args.cli_rev + "^{commit}"],
                               capture_output=True).returncode == 0
        if known:
            cli_section(args.cli_rev, args.cli_args, max(3, args.repeat), args.json)
        else:
            print(f"\n## hpnlab {args.cli_args} cold and warm: skipped (git knows no revision {args.cli_rev!r})")
    return 0


def cli_section(rev: str, cli_args: str, repeat: int, json_path: str | None) -> None:
    doc = cli_side_by_side(rev, cli_args, repeat)
    if json_path:
        import json
        Path(json_path).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
