#!/usr/bin/env python3
"""Benchmark: the flow model against UEC's htsim (a packet-level simulator) side by side.

Needs an htsim binary built from its public source (github.com/ultraethernet/uet-htsim); this
repository carries none of its code. Give its path with ``--htsim PATH`` or ``$HTSIM``, or let
``--build-htsim [SRC]`` build it: SRC is a checkout of uet-htsim or a git URL (default the
public repository at :data:`HTSIM_COMMIT`, the commit measured here), cloned and built with
``cmake -S htsim/sim -B build && cmake --build build --target htsim_uec`` under
``~/.cache/hpnlab/htsim`` (reused on the next run). Where the machine cannot fetch it (no
network, no git, cmake or a C++ compiler), the benchmark says which and skips, as it does
without a binary.

Cases, on the same 100 Gbit/s three-tier k-ary fat-tree (hpnlab's ``fat-tree`` preset with
``k`` from ``--hosts`` = k^3/4; htsim's default 3-tier fat-tree of the same size, whose host i
sits under ToR i // (k/2), as hpnlab's host h(i+1)):

    permutation  hpnlab's derangement (``collectives.random_perm``, the generators'), one flow
                 of ``--perm-bytes`` per host, all at once
    all_to_all   the pairwise exchange: step s, host i sends ``--a2a-bytes`` to i + s, steps
                 separated by a barrier (htsim: a barrier trigger on every flow's completion)

Modes: ``ecmp`` (htsim: one entropy value per flow, ``-paths 1``; model: per-flow hashing),
``spray`` (htsim's default load balancing, mixed, 64 entropy values; model: perfectly even),
``reps`` (htsim REPS), ``oblivious`` (htsim oblivious spraying over 64 values; model: the same
64 hashed values, ``model_corrections.finite_entropy_routing``). The model forwards over the
compiler's tables of the fat-tree and hashes a connection over ``--entropy-values`` values (default
every path between pods, as htsim's entropy reaches them all). Per case and mode: htsim's
and the model's makespan and efficiency, the error, and the model corrected by
``model_corrections`` (``--fit``: constants fitted on these runs, printed with their inputs;
otherwise ``model_corrections.HTSIM_100G``). JSON first (``--json FILE``), then the table.
The machine's load average is printed beside every timing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hpnlab.fabric.experiments import fidelity
from hpnlab.fabric.model import corrections as model_corrections
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.workload import collectives as col

LINK_GBPS = 100.0
#: htsim modes -> its flags, and the model's (routing, connections per pair)
MODES: dict[str, tuple[list[str], tuple[str, int]]] = {
    "ecmp": (["-paths", "1"], ("ecmp", 1)),
    "spray": ([], ("spray", 1)),
    "reps": (["-load_balancing_algo", "reps"], ("spray", 1)),
    "oblivious": (["-load_balancing_algo", "oblivious", "-paths", "64"], ("spray", 1)),
}
FINITE_ENTROPY = {"oblivious": 64}
END_US = 10_000_000
HTSIM_URL = "https://github.com/ultraethernet/uet-htsim"
#: the uet-htsim commit the README's figures were measured with
HTSIM_COMMIT = "40ccb05"
FINISHED = re.compile(r"finished at ([0-9.eE+-]+)")
SUMMARY = re.compile(r"New: (\d+) Rtx: (\d+)")


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def fat_tree_k(hosts: int) -> int:
    k = round((4 * hosts) ** (1 / 3))
    if k % 2 or k ** 3 // 4 != hosts:
        raise SystemExit(f"--hosts must be k^3/4 for an even k (16, 128, 432, 1024, ...), got {hosts}")
    return k


# ---- the workloads, as hpnlab defines them --------------------------------------------------

def permutation_steps(n: int, nbytes: int, seed: int) -> list[tuple[list[tuple[int, int]], float]]:
    perm = col.random_perm(n, seed)
    return [([(i, perm[i]) for i in range(n)], float(nbytes))]


def all_to_all_steps(n: int, nbytes: int) -> list[tuple[list[tuple[int, int]], float]]:
    return [([(i, (i + s) % n) for i in range(n)], float(nbytes)) for s in range(1, n)]


def connection_matrix(n: int, steps: list[tuple[list[tuple[int, int]], float]]) -> str:
    """An htsim connection matrix: step 0 starts at 0; step s + 1 starts when every flow of step
    s has completed at its sender, every byte acknowledged (a barrier trigger counting them;
    htsim's UEC sink never fires a recv_done_trigger)."""
    lines = []
    triggers = []
    fid = 0
    for s, (pairs, nbytes) in enumerate(steps):
        for src, dst in pairs:
            fid += 1
            start = "start 0" if s == 0 else f"trigger {s}"
            done = f" send_done_trigger {s + 1}" if s + 1 < len(steps) else ""
            lines.append(f"{src}->{dst} id {fid} {start} size {int(nbytes)}{done}")
        if s + 1 < len(steps):
            triggers.append(f"trigger id {s + 1} barrier count {len(pairs)}")
    head = [f"Nodes {n}", f"Connections {len(lines)}"] + ([f"Triggers {len(triggers)}"] if triggers else [])
    return "\n".join(head + lines + triggers) + "\n"


# ---- htsim ------------------------------------------------------------------------------------

def run_htsim(binary: str, n: int, cm: str, flags: list[str], timeout_s: float, workdir: Path) -> dict[str, Any]:
    path = workdir / "case.cm"
    path.write_text(cm)
    # -end: htsim stops at 1 ms of simulated time by default; give it room (it ends when the flows do)
    cmd = [binary, "-tm", str(path), "-nodes", str(n), "-tiers", "3", "-linkspeed", str(int(LINK_GBPS * 1000)),
           "-end", str(END_US), *flags]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=workdir)
    wall = time.monotonic() - t0
    finishes = [float(m.group(1)) for m in FINISHED.finditer(proc.stdout)]
    summary = SUMMARY.search(proc.stdout)
    new, rtx = (int(summary.group(1)), int(summary.group(2))) if summary else (0, 0)
    expected = cm.count("->")
    if proc.returncode != 0 or len(finishes) < expected:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise RuntimeError(f"htsim: {len(finishes)} of {expected} flows finished, rc {proc.returncode}: {tail}")
    return {"makespan_s": max(finishes) * 1e-6, "new_packets": new, "retx_packets": rtx,
            "retx_fraction": rtx / new if new else 0.0, "wall_s": wall, "cmd": " ".join(cmd[1:])}


# ---- the model ---------------------------------------------------------------------------------

def run_model(net: model.Network, steps, mode: str, seed: int, max_steps: int = 0) -> dict[str, Any]:
    """The model (``net``: the fat-tree's model network) on the same steps; with ``max_steps``,
    that many evenly spaced steps stand for all of them (each sampled step's time counted for its
    share of the steps)."""
    routing, qps = MODES[mode][1]
    routing, qps = model_corrections.finite_entropy_routing(routing, FINITE_ENTROPY.get(mode)) \
        if mode in FINITE_ENTROPY else (routing, qps)
    g = net.g
    hosts = sorted((h for h in graph.hosts(g)), key=lambda h: g.nodes[h]["index"])
    picked = steps
    if max_steps and len(steps) > max_steps:
        picked = [steps[round(i * (len(steps) - 1) / (max_steps - 1))] for i in range(max_steps)]
    t0 = time.monotonic()
    out = fidelity.run_schedule(net, [(h, 0) for h in hosts], picked, routing, qps, seed=seed, switch_latency_us=1.0)
    if len(picked) < len(steps):
        out["step_times_s"] = [out["step_times_s"][min(len(picked) - 1, i * len(picked) // len(steps))]
                               for i in range(len(steps))]
        out["time_s"] = float(sum(out["step_times_s"]))
    out["steps_modelled"] = len(picked)
    out["wall_s"] = time.monotonic() - t0
    out["routing"], out["qps"] = routing, qps
    return out


def earlier_htsim_runs(path: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(case, mode) -> an earlier run of this benchmark (its --json), htsim's figures per seed under "htsim"."""
    try:
        doc = json.loads(Path(path).read_text())
        return {(r["case"], r["mode"]): r for r in doc["runs"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--htsim-from {path}: not a bench_htsim --json file ({type(exc).__name__})") from None


def reused_run(runs: dict[tuple[str, str], dict[str, Any]], case: str, mode: str, hosts: int, nbytes: int,
               seed_index: int, path: str) -> dict[str, Any]:
    """htsim's figures for one case, mode and seed from an earlier run; the same workload or a clear error."""
    r = runs.get((case, mode))
    if r is None or r["hosts"] != hosts or r["bytes"] != nbytes:
        raise SystemExit(f"--htsim-from {path}: no {case} {mode} run on {hosts} hosts with {nbytes} B")
    per_seed = r["htsim"] if isinstance(r["htsim"], list) else [r["htsim"]]     # older files: one seed, a dict
    if seed_index >= len(per_seed):
        raise SystemExit(f"--htsim-from {path}: {case} {mode} has {len(per_seed)} seed(s)")
    return per_seed[seed_index]


def efficiency(case: str, n: int, nbytes: int, seconds: float, steps: int) -> float:
    """Goodput per host over the line rate: permutation, bytes / makespan; all-to-all, the bytes
    every host sends ((n - 1) x per pair) over the time (nccl-tests' busbw / line)."""
    sent = nbytes * (steps if case == "all_to_all" else 1)
    return sent * 8 / seconds / (LINK_GBPS * 1e9)


def build_htsim(src: str, cache: Path, say=print) -> str | None:
    """htsim_uec built from ``src`` (a checkout of uet-htsim, or a git URL cloned at
    :data:`HTSIM_COMMIT`) under ``cache``; None, with one line saying why, where it cannot be."""
    missing = [t for t in ("git", "cmake", "c++") if shutil.which(t) is None]
    if missing:
        say(f"bench_htsim: cannot build htsim here: no {', '.join(missing)} on PATH")
        return None
    if Path(src).is_dir():
        tree = Path(src)
    else:
        tree = cache / "src"
        if not (tree / "htsim" / "sim" / "CMakeLists.txt").exists():
            shutil.rmtree(tree, ignore_errors=True)
            cache.mkdir(parents=True, exist_ok=True)
            r = subprocess.run(["git", "clone", "--quiet", src, str(tree)], capture_output=True, text=True,
                               timeout=600)
            if r.returncode != 0:
                say(f"bench_htsim: cannot fetch htsim from {src}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
                return None
            r = subprocess.run(["git", "-C", str(tree), "checkout", "--quiet", HTSIM_COMMIT], capture_output=True,
                               text=True)
            if r.returncode != 0:
                say(f"bench_htsim: {src} has no commit {HTSIM_COMMIT}; building its default branch")
    sim = tree / "htsim" / "sim"
    if not (sim / "CMakeLists.txt").exists():
        say(f"bench_htsim: {tree} is not a uet-htsim checkout (no htsim/sim/CMakeLists.txt)")
        return None
    build = cache / "build"
    for cmd in (["cmake", "-S", str(sim), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build), "--target", "htsim_uec", "-j", str(os.cpu_count() or 1)]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            say(f"bench_htsim: building htsim failed at '{' '.join(cmd[:2])}': "
                f"{(r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or ['?'])[-1]}")
            return None
    found = [p for p in build.rglob("htsim_uec") if p.is_file() and os.access(p, os.X_OK)]
    if not found:
        say(f"bench_htsim: the build left no htsim_uec under {build}")
        return None
    return str(found[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--htsim", default=os.environ.get("HTSIM"), help="path of an htsim_uec binary (or $HTSIM)")
    ap.add_argument("--build-htsim", nargs="?", const=HTSIM_URL, metavar="SRC",
                    help=f"build htsim_uec from a uet-htsim checkout or git URL (default {HTSIM_URL} at "
                         f"{HTSIM_COMMIT}) under ~/.cache/hpnlab/htsim, and use it")
    ap.add_argument("--hosts", type=int, default=128, help="fat-tree hosts, k^3/4 (default 128: k=8)")
    ap.add_argument("--cases", default="permutation,all_to_all")
    ap.add_argument("--modes", default="ecmp,spray,reps,oblivious")
    ap.add_argument("--perm-bytes", type=int, default=4_000_000, help="permutation: bytes per flow")
    ap.add_argument("--a2a-bytes", type=int, default=256_000, help="all-to-all: bytes per pair and step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=1, help="permutation: repeat over this many seeds, both sides")
    ap.add_argument("--model-max-steps", type=int, default=16,
                    help="all-to-all: the model times this many evenly spaced steps for all (0: every step)")
    ap.add_argument("--entropy-values", type=int, default=0,
                    help="entropy values the model hashes a connection over (0: every path of the fat-tree, as "
                         "htsim's 16-bit entropy reaches them all; 8: hpnlab's transport default)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per htsim run")
    ap.add_argument("--fit", action="store_true", help="fit the corrections' constants on these runs")
    ap.add_argument("--corrections", metavar="FILE",
                    help="apply the corrections fitted by an earlier run (its --json file) instead of fitting")
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    ap.add_argument("--htsim-from", metavar="FILE",
                    help="reuse htsim's runs of an earlier --json file (same hosts, cases, modes, bytes and seeds) "
                         "and run only the model: htsim is the slow side, and its figures do not depend on the model")
    args = ap.parse_args()
    reused = earlier_htsim_runs(args.htsim_from) if args.htsim_from else None
    if reused is None and args.build_htsim and not args.htsim:
        args.htsim = build_htsim(args.build_htsim, Path.home() / ".cache" / "hpnlab" / "htsim")
        if args.htsim is None:
            print("bench_htsim: skipped: no htsim binary (see above)")
            return 0
    if reused is None and not args.htsim:
        print("bench_htsim: skipped: no htsim binary given (--htsim PATH or $HTSIM, or --build-htsim to build "
              "htsim_uec from github.com/ultraethernet/uet-htsim)")
        return 0
    if reused is None and not os.access(args.htsim, os.X_OK):
        print(f"bench_htsim: skipped: {args.htsim} is not an executable file")
        return 0
    n = args.hosts
    k = fat_tree_k(n)
    g = graph.build(spec.load("fat-tree", {"k": k, "host_rate_gbps": LINK_GBPS, "leaf_spine_rate_gbps": LINK_GBPS,
                                           "spine_core_rate_gbps": LINK_GBPS, "switch_port_rate_gbps": LINK_GBPS}))
    from hpnlab.fabric.routing import compiler
    values = args.entropy_values or compiler.entropy_map(g).path_count()
    net = model.Network(g, entropy_values=values)
    print(f"# model: {net.entropy_values} entropy values per connection (the fat-tree has "
          f"{compiler.entropy_map(g).path_count()} paths between pods)", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="hpnlab-htsim-") as tmp:
        for case in args.cases.split(","):
            nbytes = args.perm_bytes if case == "permutation" else args.a2a_bytes
            # the permutation is repeated over seeds (a new derangement, new hashes on both sides);
            # the all-to-all's 127 steps average the hashing out themselves
            seeds = range(args.seed, args.seed + (args.seeds if case == "permutation" else 1))
            for mode in args.modes.split(","):
                per_seed = []
                for seed in seeds:
                    steps = permutation_steps(n, nbytes, seed) if case == "permutation" else all_to_all_steps(n, nbytes)
                    if reused is not None:
                        h = reused_run(reused, case, mode, n, nbytes, seed - args.seed, args.htsim_from)
                    else:
                        h = run_htsim(args.htsim, n, connection_matrix(n, steps),
                                      [*MODES[mode][0], "-seed", str(seed)], args.timeout, Path(tmp))
                    m = run_model(net, steps, mode, seed, args.model_max_steps)
                    per_seed.append((h, m))
                    print(f"# {case} {mode} seed {seed}: htsim {h['makespan_s'] * 1e6:.1f} us ({h['wall_s']:.1f} s "
                          f"wall), model {m['time_s'] * 1e6:.1f} us ({m['wall_s']:.2f} s wall), retx "
                          f"{h['retx_fraction']:.2%}; {load()}", flush=True)
                hs, ms = [p[0] for p in per_seed], [p[1] for p in per_seed]
                # the corrections see the traffic as htsim sends it: per-flow for ecmp, sprayed otherwise
                # (the model runs 64 oblivious values as 64 hashed connections, still sprayed traffic)
                runs.append({"case": case, "mode": mode, "hosts": n, "k": k, "bytes": nbytes, "steps": len(steps),
                             "seeds": len(per_seed), "routing": "ecmp" if mode == "ecmp" else "spray",
                             "model_routing": ms[0]["routing"], "qps": ms[0]["qps"],
                             "model_entropy_values": net.entropy_values,
                             "peer_s": statistics.mean(x["makespan_s"] for x in hs),
                             "model_s": statistics.mean(x["time_s"] for x in ms),
                             "model_step_times_s": [statistics.mean(ts) for ts in zip(*(x["step_times_s"] for x in ms),
                                                                                        strict=True)],
                             "retx_fraction": statistics.mean(x["retx_fraction"] for x in hs),
                             "model_steps_modelled": ms[0]["steps_modelled"], "htsim": hs,
                             "model_wall_s": sum(x["wall_s"] for x in ms), "load": load()})
    source = (f"fitted by tools/bench/bench_htsim.py --fit on {n} hosts (k={k}), permutation {args.perm_bytes} B, "
              f"all-to-all {args.a2a_bytes} B per pair, htsim defaults (NSCC, 12 us base RTT)")
    if args.corrections:
        corr = model_corrections.Corrections(**json.loads(Path(args.corrections).read_text())["corrections"])
    elif args.fit:
        corr = model_corrections.fit(runs, 12.0, source)
    else:
        corr = model_corrections.HTSIM_100G
    for r in runs:
        corrected = model_corrections.correct_steps(r["model_step_times_s"], r["routing"], corr)
        r["model_corrected_s"] = corrected
        for key, secs in (("peer", r["peer_s"]), ("model", r["model_s"]), ("corrected", corrected)):
            r[f"{key}_efficiency"] = efficiency(r["case"], n, r["bytes"], secs, r["steps"])
        r["error"] = (r["model_efficiency"] - r["peer_efficiency"]) / r["peer_efficiency"]
        r["error_corrected"] = (r["corrected_efficiency"] - r["peer_efficiency"]) / r["peer_efficiency"]
    doc = {"corrections": corr.as_dict(), "runs": [{k2: v for k2, v in r.items() if k2 != "model_step_times_s"}
                                                   for r in runs], "load": load()}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"## model vs htsim, {n}-host 3-tier fat-tree (k={k}), {LINK_GBPS:g} Gbit/s; efficiency = goodput / line")
    print(f"{'case':<12} {'mode':<10} {'htsim':>7} {'model':>7} {'err':>7} {'corrected':>9} {'err':>7} "
          f"{'retx':>6} {'htsim s':>8} {'model s':>8}")
    for r in runs:
        print(f"{r['case']:<12} {r['mode']:<10} {r['peer_efficiency']:>7.3f} {r['model_efficiency']:>7.3f} "
              f"{r['error']:>+7.1%} {r['corrected_efficiency']:>9.3f} {r['error_corrected']:>+7.1%} "
              f"{r['retx_fraction']:>6.2%} {sum(x['wall_s'] for x in r['htsim']):>8.1f} {r['model_wall_s']:>8.2f}")
    print(f"# corrections: {json.dumps(corr.as_dict())}")
    print(f"# {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
