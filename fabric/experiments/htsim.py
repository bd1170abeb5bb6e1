"""The flow model against UEC's htsim (a packet-level simulator): fit on some cells, validate on others.

Needs an htsim binary built from its public source (github.com/ultraethernet/uet-htsim); this
repository carries none of its code. Give its path with ``--htsim PATH`` or ``$HTSIM``, or let
``--build-htsim [SRC]`` build it: SRC is a checkout of uet-htsim or a git URL (default the
public repository at :data:`HTSIM_COMMIT`, the commit measured here), cloned and built with
``cmake -S htsim/sim -B build && cmake --build build --target htsim_uec`` under
``~/.cache/hpnlab/htsim`` (reused on the next run). Where the machine cannot fetch it (no
network, no git, cmake or a C++ compiler), the benchmark says which and skips, as it does
without a binary.

A *cell* is one workload on one fabric under one of htsim's load-balancing modes, over one or
more seeds (:class:`Cell`). Fabrics: the 100 Gbit/s three-tier k-ary fat-tree (hpnlab's
``fat-tree`` preset, every link 1 us as htsim's hops; htsim's own fat-tree of the same size,
host i under ToR i // (k/2) as hpnlab's h(i+1)), 128 hosts (k=8), 432 (k=12) and 1,024 (k=16). Workloads:

    permutation  hpnlab's derangement (``collectives.random_perm`` of the seed), one flow of
                 the cell's bytes per host, all at once: one large step
    all_to_all   the pairwise exchange: step s, host i sends the cell's bytes to i + s, steps
                 separated by a barrier (htsim: a barrier trigger on every flow's completion);
                 every offset 1 .. n-1, or the cell's ``offsets`` alone: many small steps

Modes (:data:`MODES`): every load balancing htsim_uec has, each run by the model as its own
routing policy: ``ecmp`` (one entropy value per flow, ``-paths 1``: the model hashes each flow
onto one path, its hash salted by the seed as htsim salts each switch's), ``oblivious`` (64
values in turn: the model hashes 64 values per flow and gives each 1/64 of the bytes),
``mixed`` (htsim's default: REPS-legacy's recycling of values that came back clean, the bitmap's
skipping of marked ones), ``bitmap``, ``reps``, ``reps_legacy`` (values recycled or skipped by
their feedback: the bytes move to the paths that are free, in the fluid limit the even split)
and ``ar`` (switches' per-packet adaptive routing, ``-strat ecmp_ar``: the even split). What
tells the modes apart beyond their split is their congestion cost, each mode's own efficiency.
ECMP is a distribution: each cell runs 10 seeds in htsim, against the model's mean over
:data:`MODEL_SEEDS` seeds (its expectation), and so does a hashed mode's permutation.

Each cell's model time is corrected mechanism by mechanism (``hpnlab.fabric.model.corrections``:
headers, the last packet's round trip, the first window's overflow from htsim's configuration;
per mode a burst and an efficiency, and for ECMP the share of the re-sent bytes it pays, fitted);
the constants are fitted on :data:`FIT_CELLS` only and reported on the disjoint
:data:`VALIDATION_CELLS` and on :data:`HOLDOUT_CELLS` (named after the structure was frozen),
beside the corrections of the earlier revision (:func:`before`, fitted on the runs it was reported
on). htsim's runs are cached (``--cache``, default
``~/.cache/hpnlab/htsim-runs``: one file per binary, workload, mode and seed), so a rerun only
runs the model. JSON first (``--json FILE``), then the table; the machine's load and htsim's CPU
seconds beside every run.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from hpnlab.fabric.model import corrections as mc
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.workload import collectives as col

LINK_GBPS = 100.0
HOP_LATENCY_US = 1.0          # htsim's default per hop (and no switch latency)
EVS = 64                      # htsim's default entropy values per flow (-paths)
#: htsim's load-balancing modes: its flags, and the model's policy for it
MODES: dict[str, tuple[list[str], str]] = {
    "ecmp": (["-paths", "1"], "flow_hash"),
    "oblivious": (["-load_balancing_algo", "oblivious"], "ev_equal"),
    "mixed": ([], "even"),
    "bitmap": (["-load_balancing_algo", "bitmap"], "even"),
    "reps": (["-load_balancing_algo", "reps"], "even"),
    "reps_legacy": (["-load_balancing_algo", "reps_legacy"], "even"),
    "ar": (["-strat", "ecmp_ar"], "even"),
}
END_US = 10_000_000
HTSIM_URL = "https://github.com/ultraethernet/uet-htsim"
#: the uet-htsim commit measured here
HTSIM_COMMIT = "40ccb05"
FINISHED = re.compile(r"finished at ([0-9.eE+-]+)")
SUMMARY = re.compile(r"New: (\d+) Rtx: (\d+)")
#: htsim's transport as ``corrections`` needs it (its defaults at 100 Gbit/s, 3 tiers: an MTU of
#: 4150 B with 64 B of header, 64 B ACKs, NSCC's window 1.5 BDP, queues of 1 BDP with trimming,
#: RTT 2 x 6 us + 6 MTUs and 6 ACKs serialised = 14.02 us)
TRANSPORT = mc.Transport(rate_gbps=LINK_GBPS, base_rtt_us=12.0 + 6 * (4150 + 64) * 8 / (LINK_GBPS * 1e3))


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


def all_to_all_steps(n: int, nbytes: int,
                     offsets: Sequence[int] | None = None) -> list[tuple[list[tuple[int, int]], float]]:
    """The pairwise exchange: step s, rank i sends to i + s; every offset 1 .. n-1, or these."""
    return [([(i, (i + s) % n) for i in range(n)], float(nbytes)) for s in (offsets or range(1, n))]


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


# ---- the cells -------------------------------------------------------------------------------

SEEDS_ECMP = tuple(range(1, 11))


@dataclass(frozen=True)
class Cell:
    """One workload on one fabric in one mode, over ``seeds`` (both sides run each)."""
    hosts: int
    case: str                      # "permutation" | "all_to_all"
    nbytes: int                    # per flow (permutation) or per pair and step (all_to_all)
    mode: str
    seeds: tuple[int, ...] = (1,)
    offsets: tuple[int, ...] | None = None     # all_to_all: these offsets only

    @property
    def name(self) -> str:
        size = f"{self.nbytes / 1e6:g}M" if self.nbytes >= 1_000_000 else f"{self.nbytes / 1e3:g}k"
        case = "perm" if self.case == "permutation" else \
            ("a2a" if self.offsets is None else f"a2a{len(self.offsets)}")
        return f"k{fat_tree_k(self.hosts)}-{case}-{size}-{self.mode}"

    def steps(self, seed: int) -> list[tuple[list[tuple[int, int]], float]]:
        if self.case == "permutation":
            return permutation_steps(self.hosts, self.nbytes, seed)
        return all_to_all_steps(self.hosts, self.nbytes, self.offsets)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "hosts": self.hosts, "case": self.case, "bytes": self.nbytes, "mode": self.mode,
                "seeds": list(self.seeds), "offsets": list(self.offsets) if self.offsets else None}


def _cells(hosts: int, case: str, nbytes: int, sprayed_seeds: tuple[int, ...], modes: Sequence[str] = tuple(MODES),
           offsets: tuple[int, ...] | None = None) -> list[Cell]:
    return [Cell(hosts, case, nbytes, m, SEEDS_ECMP if m == "ecmp" else sprayed_seeds, offsets) for m in modes]


#: the cells the policies' constants are fitted on: the 128-host fat-tree, a 1 MB and a 4 MB
#: permutation and the 64 kB pairwise all-to-all, every mode
FIT_CELLS: list[Cell] = (_cells(128, "permutation", 1_000_000, (1, 2, 3))
                         + _cells(128, "permutation", 4_000_000, (1, 2))
                         + _cells(128, "all_to_all", 64_000, (1,))
                         + _cells(128, "permutation", 2_000_000, (), ("ecmp",)))
#: the cells reported on, none of them fitted on: other sizes (16 kB steps to 16 MB), 1,024 hosts,
#: every mode, ECMP over 10 seeds
VALIDATION_CELLS: list[Cell] = (_cells(128, "permutation", 256_000, (1, 2, 3))
                                + _cells(128, "permutation", 16_000_000, (1, 2))
                                + _cells(128, "all_to_all", 16_000, (1,))
                                + _cells(1024, "permutation", 256_000, (1, 2))
                                + _cells(1024, "permutation", 1_000_000, (1,))
                                + _cells(1024, "all_to_all", 64_000, (1,),
                                         offsets=tuple(1 + i * 1023 // 8 for i in range(8))))
#: fresh cells, named after the policies' structure and constants were frozen (commit 427b545, whose
#: validation table had been seen while the structure was chosen) and run once against
#: ``corrections.HTSIM_100G`` as it stands: sizes neither set has (512 kB, 8 MB, 32 kB steps), a
#: fabric size neither has (432 hosts, k=12), every mode, ECMP over 10 seeds
HOLDOUT_CELLS: list[Cell] = (_cells(128, "permutation", 512_000, (1, 2))
                             + _cells(128, "permutation", 8_000_000, (1,))
                             + _cells(128, "all_to_all", 32_000, (1,))
                             + _cells(432, "permutation", 1_000_000, (1,)))
assert not {c.name for c in FIT_CELLS} & {c.name for c in VALIDATION_CELLS}
assert not {c.name for c in HOLDOUT_CELLS} & {c.name for c in FIT_CELLS + VALIDATION_CELLS}


# ---- htsim ------------------------------------------------------------------------------------

def run_htsim(binary: str, n: int, cm: str, flags: list[str], timeout_s: float, workdir: Path) -> dict[str, Any]:
    """One htsim run: {makespan_s, new_packets, retx_packets, retx_fraction, wall_s, cpu_s, cmd}."""
    path = workdir / "case.cm"
    path.write_text(cm)
    # -end: htsim stops at 1 ms of simulated time by default; give it room (it ends when the flows do)
    cmd = [binary, "-tm", str(path), "-nodes", str(n), "-tiers", "3", "-linkspeed", str(int(LINK_GBPS * 1000)),
           "-end", str(END_US), *flags]
    t0 = time.monotonic()
    with open(workdir / "out.txt", "w+") as out_f, open(workdir / "err.txt", "w+") as err_f:
        proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, cwd=workdir)
        while True:              # wait4: this run's own CPU seconds, whatever else runs beside it
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout_s:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise RuntimeError(f"htsim: no result within {timeout_s:g} s")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    wall = time.monotonic() - t0
    cpu = usage.ru_utime + usage.ru_stime
    finishes = [float(m.group(1)) for m in FINISHED.finditer(out)]
    summary = SUMMARY.search(out)
    new, rtx = (int(summary.group(1)), int(summary.group(2))) if summary else (0, 0)
    expected = cm.count("->")
    if proc.returncode != 0 or len(finishes) < expected:
        tail = (out + err).strip().splitlines()[-3:]
        raise RuntimeError(f"htsim: {len(finishes)} of {expected} flows finished, rc {proc.returncode}: {tail}")
    return {"makespan_s": max(finishes) * 1e-6, "new_packets": new, "retx_packets": rtx,
            "retx_fraction": rtx / new if new else 0.0, "wall_s": wall, "cpu_s": cpu, "cmd": " ".join(cmd[1:])}


@lru_cache(maxsize=8)
def binary_id(binary: str) -> str:
    """The binary's identity for the run cache: a hash of its bytes."""
    return hashlib.sha256(Path(binary).read_bytes()).hexdigest()[:16]


def run_key(binary_hash: str, n: int, cm: str, flags: Sequence[str]) -> str:
    return hashlib.sha256("\n".join([binary_hash, str(n), " ".join(flags), cm]).encode()).hexdigest()[:24]


def cached_htsim(binary: str, cell: Cell, seed: int, cache: Path, timeout_s: float,
                 reused: dict[tuple[str, int], dict[str, Any]] | None = None) -> tuple[dict[str, Any], bool]:
    """htsim's figures for one cell and seed: (figures, from the cache or an earlier file). Cached
    under ``cache`` by the binary's hash, the connection matrix and the flags."""
    if reused is not None:
        got = reused.get((cell.name, seed))
        if got is None:
            raise SystemExit(f"--htsim-from: no run of {cell.name} seed {seed} in it")
        return got, True
    flags = [*MODES[cell.mode][0], "-seed", str(seed)]
    cm = connection_matrix(cell.hosts, cell.steps(seed))
    path = cache / f"{run_key(binary_id(binary), cell.hosts, cm, flags)}.json"
    try:
        return json.loads(path.read_text()), True
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryDirectory(prefix="hpnlab-htsim-") as tmp:
        out = run_htsim(binary, cell.hosts, cm, flags, timeout_s, Path(tmp))
    out.update(cell=cell.name, seed=seed, load=load())
    cache.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
    tmp_path.write_text(json.dumps(out))
    tmp_path.replace(path)
    return out, False


def earlier_htsim_runs(path: str) -> dict[tuple[str, int], dict[str, Any]]:
    """(cell name, seed) -> htsim's figures in an earlier run of this benchmark (its --json)."""
    try:
        doc = json.loads(Path(path).read_text())
        return {(r["cell"]["name"], int(h["seed"])): h for r in doc["cells"] for h in r["htsim"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--htsim-from {path}: not a bench_htsim --json file ({type(exc).__name__})") from None


# ---- the model ---------------------------------------------------------------------------------

@lru_cache(maxsize=4)
def fat_tree_network(hosts: int) -> tuple[model.Network, model.Job]:
    """The model's fat-tree of ``hosts`` hosts at 100 Gbit/s, every link HOP_LATENCY_US long (the
    model's latency is then htsim's propagation: no switch latency), a connection hashed over every
    path between pods; one rank per host in htsim's host order."""
    k = fat_tree_k(hosts)
    g = graph.build(spec.load("fat-tree", {"k": k, "host_rate_gbps": LINK_GBPS, "leaf_spine_rate_gbps": LINK_GBPS,
                                           "spine_core_rate_gbps": LINK_GBPS, "switch_port_rate_gbps": LINK_GBPS}))
    for _u, _v, d in g.edges(data=True):
        d["delay_us"] = HOP_LATENCY_US
    net = model.Network(g, entropy_values=compiler.entropy_map(g).path_count())
    hosts_in_order = sorted(graph.hosts(g), key=lambda h: g.nodes[h]["index"])
    return net, model.Job(ranks=[(h, 0) for h in hosts_in_order])


def _link_loads(paths: np.ndarray, bits: np.ndarray, share: np.ndarray, n_links: int) -> tuple[np.ndarray, np.ndarray]:
    flat = paths.ravel()
    hops = paths.shape[0]
    load = np.bincount(flat, weights=np.tile(bits, hops), minlength=n_links + 1)[:n_links]
    fan = np.bincount(flat, weights=np.tile(share, hops), minlength=n_links + 1)[:n_links]
    return load, fan


def step_shape(net: model.Network, job: model.Job, pairs: Sequence[tuple[int, int]], nbytes: float, policy: str,
               seed: int) -> mc.StepShape:
    """One step as the model routes it under a mode's policy (:data:`MODES`): its fluid drain, the
    longest path, the flow size, and how many flows' first windows meet on its busiest link."""
    src = np.array([a for a, _ in pairs])
    dst = np.array([b for _, b in pairs])
    cap = net.cap
    if policy == "even":                       # per-packet adaptive switches: the even split
        r = model.route_step(net, job, (src, dst), nbytes, "spray", 1, seed)
        per_link: list[np.ndarray] = []
        drain = float(model.drain_times(r.flow_idx, r.link_idx, r.weight, cap, r.size_bits, per_link).max())
        return mc.StepShape(drain, r.latency_us * 1e-6, r.hops, nbytes, model.busiest_fan_in(r, cap, per_link[0]),
                            int(np.count_nonzero(per_link[0])))
    evs = 1 if policy == "flow_hash" else EVS
    r = model.route_step(net, job, (src, dst), nbytes, "ecmp", evs, seed)   # evs hashed values per flow
    assert r.paths is not None
    share = np.full(r.paths.shape[1], 1.0 / evs)      # a value's share of its flow
    load, fan = _link_loads(r.paths, r.size_bits, share, net.n_links)
    with np.errstate(divide="ignore", invalid="ignore"):
        link_drain = np.where(load > 0, load / (cap * 1e9), 0.0)
    busiest = int(np.argmax(link_drain))
    drain = float(link_drain[busiest])
    return mc.StepShape(drain, r.latency_us * 1e-6, r.hops, nbytes, float(fan[busiest]), int(np.count_nonzero(load)))


#: hashed policies' permutations: the model's mean over this many seeds stands for its expectation
#: (htsim's ten seeds against the model's own ten would compare two noisy means; the model is cheap)
MODEL_SEEDS = 100


def model_seeds(cell: Cell) -> tuple[int, ...]:
    """The seeds the model runs a cell over: a hashed policy's permutation over :data:`MODEL_SEEDS`
    (its expectation), else the cell's own."""
    if cell.case == "permutation" and MODES[cell.mode][1] in ("flow_hash", "ev_equal"):
        return tuple(range(1, MODEL_SEEDS + 1))
    return cell.seeds


def model_cell(cell: Cell, seed: int, max_steps: int = 0) -> list[tuple[mc.StepShape, float]]:
    """The cell's steps as the model routes them for one seed: [(shape, multiplicity)]; with
    ``max_steps``, that many evenly spaced steps stand for all of them."""
    net, job = fat_tree_network(cell.hosts)
    policy = MODES[cell.mode][1]
    steps = cell.steps(seed)
    picked = list(range(len(steps)))
    if max_steps and len(steps) > max_steps:
        picked = sorted({round(i * (len(steps) - 1) / (max_steps - 1)) for i in range(max_steps)})
    mult = len(steps) / len(picked)
    return [(step_shape(net, job, steps[i][0], steps[i][1], policy, seed), mult) for i in picked]


def corrected_s(shapes: Sequence[tuple[mc.StepShape, float]], c: mc.Corrections, mode: str) -> float:
    return float(sum(m * mc.step_time(s, c, mode) for s, m in shapes))


def raw_s(shapes: Sequence[tuple[mc.StepShape, float]]) -> float:
    """The uncorrected model: the busiest link's drain plus the one-way latency, per step."""
    return float(sum(m * (s.drain_s + s.latency_s) for s, m in shapes))


# ---- before: the earlier revision's model and corrections, for the same cells ------------------

#: main at c9025e0: ``model_corrections.HTSIM_100G`` (fitted on the 128-host 4 MB permutation and
#: 256 kB all-to-all it was reported on), applied to the model as its benchmark ran it (switch
#: latency 1 us, no link delay; spraying modes perfectly even -- bitmap, reps_legacy and ar, which
#: it did not run, as its spray --, oblivious as 64 hashed connections, ECMP with the transport's
#: own hash whatever the seed; every step's whole time scaled, as its benchmark passed no latencies)
BEFORE_RAMP_RTTS, BEFORE_RTT_US, BEFORE_SPRAY_EFFICIENCY = 1.277, 12.0, 0.8865
BEFORE_RETX = {"per_flow": 0.1231, "sprayed": 0.0}


@lru_cache(maxsize=4)
def _before_network(hosts: int) -> tuple[model.Network, model.Job]:
    k = fat_tree_k(hosts)
    g = graph.build(spec.load("fat-tree", {"k": k, "host_rate_gbps": LINK_GBPS, "leaf_spine_rate_gbps": LINK_GBPS,
                                           "spine_core_rate_gbps": LINK_GBPS, "switch_port_rate_gbps": LINK_GBPS}))
    net = model.Network(g, entropy_values=compiler.entropy_map(g).path_count())
    hosts_in_order = sorted(graph.hosts(g), key=lambda h: g.nodes[h]["index"])
    return net, model.Job(ranks=[(h, 0) for h in hosts_in_order])


def before(cell: Cell, seed: int, max_steps: int = 16) -> float:
    """The cell's time as the earlier revision's benchmark and corrections gave it (``BEFORE_*``)."""
    net, job = _before_network(cell.hosts)
    routing, qps = ("ecmp", 1) if cell.mode == "ecmp" else ("ecmp", 64) if cell.mode == "oblivious" else ("spray", 1)
    kind = "per_flow" if cell.mode == "ecmp" else "sprayed"
    steps = cell.steps(seed)
    picked = list(range(len(steps)))
    if max_steps and len(steps) > max_steps:
        picked = [round(i * (len(steps) - 1) / (max_steps - 1)) for i in range(max_steps)]
    total = 0.0
    for i in picked:
        st = model.run_steps(net, job, [steps[i]], routing, qps, switch_latency_us=1.0)[0]
        drain = st.time_s          # its benchmark gave the corrections no latencies: all of the step is drain
        if kind == "sprayed":
            drain /= BEFORE_SPRAY_EFFICIENCY
        drain *= 1 + BEFORE_RETX[kind]
        total += drain + BEFORE_RAMP_RTTS * BEFORE_RTT_US * 1e-6
    return total * len(steps) / len(picked)


# ---- running cells, fitting, reporting -----------------------------------------------------------

def run_cells(cells: Sequence[Cell], htsim_of: Callable[[Cell, int], tuple[dict[str, Any], bool]],
              jobs: int = 1, say: Callable[[str], None] = print) -> dict[str, list[dict[str, Any]]]:
    """htsim's figures for every cell and seed ({cell name: [per seed]}), ``jobs`` runs at a time."""
    work = [(c, s) for c in cells for s in c.seeds]
    out: dict[str, list[dict[str, Any]]] = {c.name: [] for c in cells}

    def one(item: tuple[Cell, int]) -> tuple[Cell, int, dict[str, Any], bool]:
        c, s = item
        h, cached = htsim_of(c, s)
        return c, s, h, cached

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for c, s, h, cached in pool.map(one, work):
            out[c.name].append(h)
            how = "cached" if cached else f"{h.get('cpu_s', math.nan):.1f} s CPU, {h['wall_s']:.1f} s wall"
            say(f"# htsim {c.name} seed {s}: {h['makespan_s'] * 1e6:.1f} us, re-sent {h['retx_fraction']:.2%} "
                f"({how}); {load()}")
    return out


def model_runs(cells: Sequence[Cell], max_steps: int = 16) -> dict[str, list[list[tuple[mc.StepShape, float]]]]:
    return {c.name: [model_cell(c, s, max_steps) for s in model_seeds(c)] for c in cells}


def fit_corrections(cells: Sequence[Cell], htsim: dict[str, list[dict[str, Any]]],
                    shapes: dict[str, list[list[tuple[mc.StepShape, float]]]]) -> mc.Corrections:
    """A policy per mode fitted on these cells (``corrections.fit``); ECMP keeps no constant."""
    by_mode: dict[str, Sequence[dict[str, Any]]] = {}
    for c in cells:
        peer = statistics.mean(h["makespan_s"] for h in htsim[c.name])
        by_mode[c.mode] = [*by_mode.get(c.mode, ()), {"peer_s": peer, "steps": shapes[c.name]}]
    source = (f"fitted by tools/bench/bench_htsim.py --fit on the {len(cells)} cells of htsim.FIT_CELLS; "
              f"htsim {HTSIM_COMMIT} (htsim_uec defaults: NSCC, trimming, 100 Gbit/s fat-tree)")
    sprayed = {m: v for m, v in by_mode.items() if m != "ecmp"}
    groups: list[tuple[dict[str, Sequence[dict[str, Any]]], tuple[str, ...], tuple[str, ...]]] = [
        # each spraying mode its own policy: its first window's burst and its steady state
        (sprayed, (), ("steady", "burst")),
        # per-flow hashing: whole flows collide, and what overflows is re-sent
        ({"ecmp": by_mode["ecmp"]} if "ecmp" in by_mode else {}, (), ("steady", "burst", "resend"))]
    return mc.fit([g for g in groups if g[0]], TRANSPORT, source, [c.name for c in cells])


def report(cells: Sequence[Cell], htsim: dict[str, list[dict[str, Any]]],
           shapes: dict[str, list[list[tuple[mc.StepShape, float]]]], corr: mc.Corrections,
           with_before: bool = True) -> list[dict[str, Any]]:
    """Per cell: htsim's mean time (and per seed), the model raw and corrected (mean over the same
    seeds), the earlier revision's corrected figure, and their errors (model / htsim - 1 in
    efficiency: htsim's time over the model's, less one)."""
    rows = []
    for c in cells:
        hs = [h["makespan_s"] for h in htsim[c.name]]
        peer = statistics.mean(hs)
        corrected = statistics.mean(corrected_s(s, corr, c.mode) for s in shapes[c.name])
        raw = statistics.mean(raw_s(s) for s in shapes[c.name])
        old = statistics.mean(before(c, seed) for seed in c.seeds) if with_before else math.nan
        terms: dict[str, float] = {}
        for steps in shapes[c.name]:
            for shape, m in steps:
                for k, v in mc.terms(shape, corr, c.mode).items():
                    terms[k] = terms.get(k, 0.0) + m * v / len(shapes[c.name])
        rows.append({"cell": c.as_dict(), "htsim_s": peer, "htsim_seeds_s": hs,
                     "htsim_spread": (max(hs) - min(hs)) / peer if peer else 0.0,
                     "retx_fraction": statistics.mean(h["retx_fraction"] for h in htsim[c.name]),
                     "htsim_cpu_s": sum(h.get("cpu_s", math.nan) for h in htsim[c.name]),
                     "model_raw_s": raw, "model_s": corrected, "before_s": old,
                     "error_raw": peer / raw - 1, "error": peer / corrected - 1,
                     "error_before": peer / old - 1 if with_before else math.nan, "terms_s": terms,
                     "htsim": htsim[c.name]})
    return rows


def within(rows: Sequence[dict[str, Any]], key: str = "error", tol: float = 0.10) -> int:
    return sum(1 for r in rows if abs(r[key]) <= tol)


def table(rows: Sequence[dict[str, Any]], title: str) -> list[str]:
    out = [f"## {title}: error = model efficiency / htsim's - 1 (means over the seeds)",
           f"{'cell':<26} {'seeds':>5} {'htsim us':>10} {'spread':>6} {'re-sent':>7} {'raw':>7} {'before':>7} "
           f"{'after':>7} {'model us':>10}"]
    for r in rows:
        c = r["cell"]
        out.append(f"{c['name']:<26} {len(c['seeds']):>5} {r['htsim_s'] * 1e6:>10.1f} {r['htsim_spread']:>6.0%} "
                   f"{r['retx_fraction']:>7.2%} {r['error_raw']:>+7.1%} {r['error_before']:>+7.1%} "
                   f"{r['error']:>+7.1%} {r['model_s'] * 1e6:>10.1f}")
    n = len(rows)
    out.append(f"# within 10%: after {within(rows)}/{n}, before {within(rows, 'error_before')}/{n}, "
               f"raw {within(rows, 'error_raw')}/{n}")
    return out


def markdown_table(rows: Sequence[dict[str, Any]], title: str) -> list[str]:
    """:func:`table` as a Markdown table (as the records under docs/results/ hold it)."""
    out = [f"## {title}", "", "| cell | seeds | htsim us (mean) | spread | re-sent | model us | raw | before | after |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["cell"]
        out.append(f"| {c['name']} | {len(c['seeds'])} | {r['htsim_s'] * 1e6:.1f} | {r['htsim_spread']:.0%} | "
                   f"{r['retx_fraction']:.1%} | {r['model_s'] * 1e6:.1f} | {r['error_raw']:+.1%} | "
                   f"{r['error_before']:+.1%} | {r['error']:+.1%} |")
    n = len(rows)
    outside = [f"{r['cell']['name']} ({r['error']:+.1%})" for r in rows if abs(r["error"]) > 0.10]
    out += ["", f"Within 10%: after {within(rows)}/{n}, before {within(rows, 'error_before')}/{n}, "
                f"raw {within(rows, 'error_raw')}/{n}." + (f" Outside: {', '.join(outside)}." if outside else ""), ""]
    return out


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


def select(names: str) -> list[Cell]:
    """``fit``, ``validation``, ``holdout``, ``all`` or cell names (comma list)."""
    out: list[Cell] = []
    sets = {"fit": FIT_CELLS, "validation": VALIDATION_CELLS, "holdout": HOLDOUT_CELLS,
            "all": FIT_CELLS + VALIDATION_CELLS + HOLDOUT_CELLS}
    every = {c.name: c for c in sets["all"]}
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name in sets:
            out += sets[name]
        elif name in every:
            out.append(every[name])
        else:
            raise SystemExit(f"--cells: no cell {name!r} (fit, validation, holdout, all, or names from --list)")
    return list(dict.fromkeys(out))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--htsim", default=os.environ.get("HTSIM"), help="path of an htsim_uec binary (or $HTSIM)")
    ap.add_argument("--build-htsim", nargs="?", const=HTSIM_URL, metavar="SRC",
                    help=f"build htsim_uec from a uet-htsim checkout or git URL (default {HTSIM_URL} at "
                         f"{HTSIM_COMMIT}) under ~/.cache/hpnlab/htsim, and use it")
    ap.add_argument("--cells", default="fit,validation,holdout",
                    help="fit, validation, holdout, all, or cell names (see --list)")
    ap.add_argument("--list", action="store_true", help="list the cells and exit")
    ap.add_argument("--fit", action="store_true",
                    help="fit the policies' constants on the fit cells (run first) and report with them; without "
                         "it, corrections.HTSIM_100G's constants")
    ap.add_argument("--corrections", metavar="FILE", help="the corrections of an earlier --json file")
    ap.add_argument("--model-max-steps", type=int, default=16,
                    help="all-to-all: the model times this many evenly spaced steps for all (0: every step)")
    ap.add_argument("--jobs", type=int, default=1, help="htsim runs at a time (default 1)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per htsim run")
    ap.add_argument("--cache", metavar="DIR", help="htsim's runs are cached here (default $HPNLAB_CACHE or "
                                                  "~/.cache/hpnlab, htsim-runs/)")
    ap.add_argument("--htsim-from", metavar="FILE",
                    help="htsim's figures from an earlier --json file instead of running it (the model side alone)")
    ap.add_argument("--no-before", action="store_true", help="leave out the earlier revision's figures")
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    ap.add_argument("--markdown", action="store_true", help="print the tables in Markdown (as the records hold them)")
    args = ap.parse_args(argv)
    if args.list:
        for which, listed in (("fit", FIT_CELLS), ("validation", VALIDATION_CELLS), ("holdout", HOLDOUT_CELLS)):
            for c in listed:
                print(f"{which:<10} {c.name:<26} seeds {','.join(map(str, c.seeds))}")
        return 0
    cells = select(args.cells)
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
    cache = Path(args.cache) if args.cache else model.cache_dir() / "htsim-runs"
    every = list(dict.fromkeys((FIT_CELLS if args.fit else []) + cells))
    t0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    htsim = run_cells(every, lambda c, s: cached_htsim(args.htsim, c, s, cache, args.timeout, reused), args.jobs)
    t1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(h.get("cpu_s", 0.0) for hs in htsim.values() for h in hs if not math.isnan(h.get("cpu_s", math.nan)))
    print(f"# htsim: {sum(len(v) for v in htsim.values())} runs, {cpu:.0f} s of CPU in all (this session "
          f"{t1.ru_utime + t1.ru_stime - t0.ru_utime - t0.ru_stime:.0f} s); {load()}", flush=True)
    t = time.process_time()
    shapes = model_runs(every, args.model_max_steps)
    print(f"# model: {len(every)} cells in {time.process_time() - t:.1f} s of CPU", flush=True)
    if args.corrections:
        corr = mc.Corrections.from_dict(json.loads(Path(args.corrections).read_text())["corrections"])
    elif args.fit:
        corr = fit_corrections(FIT_CELLS, htsim, shapes)
    else:
        corr = mc.HTSIM_100G
    doc: dict[str, Any] = {"htsim_commit": HTSIM_COMMIT, "corrections": corr.as_dict(), "load": load(),
                           "fit_cells": [c.name for c in FIT_CELLS], "cells": []}
    groups: list[tuple[str, list[Cell]]] = [
        ("fit (in sample)", [c for c in every if c in FIT_CELLS]),
        ("validation (out of sample)", [c for c in every if c not in FIT_CELLS and c not in HOLDOUT_CELLS]),
        ("holdout (out of sample, named after the structure was frozen)", [c for c in every if c in HOLDOUT_CELLS])]
    printed = []
    for title, group in groups:
        if not group:
            continue
        rows = report(group, htsim, {c.name: shapes[c.name] for c in group}, corr, not args.no_before)
        for r in rows:
            r["group"] = title.split()[0]
        doc["cells"] += rows
        printed += markdown_table(rows, title) if args.markdown else table(rows, title)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=float) + "\n")
    for line in printed:
        print(line)
    print(f"# corrections: {json.dumps(corr.as_dict())}")
    print(f"# {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
