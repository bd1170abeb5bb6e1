"""Flow-level model: collective time and bandwidth on a fabric at full scale (130k ranks).

The emulator answers questions at tens of Mbit/s on one machine; this model answers the same
questions at real rates and real scale, from the same scenario and fabric graph.

Model
    * Ranks: one per NIC (host, rail). A rank's NIC has one port per plane.
    * Traffic: a collective is a sequence of *steps*; in a step every rank sends to its
      peer(s) at once (ring: to the next rank; all-to-all, pairwise exchange: to rank + k;
      permutation: one elephant flow per rank; incast: all ranks to one). Each rank pair
      uses ``qps`` connections (queue pairs), as NCCL and RDMA NICs do.
    * Routing, per connection:
        ``ecmp``  the connection hashes onto one plane (one NIC port) and, at every switch
                  with several equal-cost next hops, onto one of them (per-flow hashing).
        ``spray`` per-packet spraying (host-side adaptive routing): the connection is split
                  evenly over every plane and every equal-cost next hop. A plane's spread is
                  modelled exactly by bundles: a leaf's uplinks, the links into a leaf from
                  all spines, a pod's core links and the long-haul links between two
                  campuses each act as one link of their summed capacity.
    * Time: every directed link drains the bytes routed over it at its capacity; a flow
      ends when the busiest link on its path has drained, a step when its last flow has
      (:func:`drain_times`, vectorised: seconds at 130k). The exact fluid alternative —
      max-min fair rates re-shared each time flows complete (:func:`flow_times`) — is kept
      for small fabrics, and the tests check the two agree there.
    * Latency: per step, the longest path's propagation delay (links' ``delay_us``) plus
      ``switch_latency_us`` per switch traversed.
    * Failures: failed links carry nothing and are removed from the hash choices after
      convergence; before convergence, the connections hashed onto a failed link stall for
      the detection + convergence time (see :func:`failure_impact`).

Not modelled: congestion control dynamics (DCQCN), PFC, buffers, packet reordering cost,
intra-host (NVLink) transfers, NIC processing; a step's flows start together.
"""
from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from .collectives import busbw_factor, canonical
from .errors import UserError

MODEL_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permutation", "incast")
ROUTINGS = ("ecmp", "spray")
RING_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


# ---- the network as directed links ----------------------------------------------------

class Network:
    """Directed links of a fabric graph with capacities (Gbit/s) and next-hop tables."""

    def __init__(self, g: nx.MultiGraph, failed: set[tuple[str, str, int]] | None = None):
        self.g = g
        self.s = g.graph["scenario"]
        node = g._node
        caps: list[float] = []
        delays: list[float] = []
        self.failed_ids: set[int] = set()
        failed = {self._norm(*f) for f in (failed or set())}
        # next hops: switch -> list of (directed link id, neighbour)
        self.up: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self.down: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        self.peer: dict[str, dict[int, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
        self.host_port: dict[tuple[str, int], tuple[str, int, int]] = {}   # (host, intf) -> leaf, up id, down id
        # spray bundles: name -> capacity; each directed link belongs to at most one bundle
        self.bundle_cap: dict[tuple, float] = defaultdict(float)
        bundle_member: dict[int, tuple] = {}
        lid = 0
        for u, v, k, d in g.edges(keys=True, data=True):
            dead = self._norm(u, v, k) in failed
            cap = 0.0 if dead else d["rate_gbps"]
            ids = []
            for a, b in ((u, v), (v, u)):
                caps.append(cap)
                delays.append(d["delay_us"])
                if dead:
                    self.failed_ids.add(lid)
                ids.append(lid)
                lid += 1
            for (a, b), i in zip(((u, v), (v, u)), ids):
                ta, tb = node[a]["tier"], node[b]["tier"]
                if ta == 0:
                    leaf_down = ids[1] if i == ids[0] else ids[0]
                    self.host_port[(a, d["ports"][a])] = (b, i, leaf_down)
                elif tb == 0:
                    continue
                elif tb > ta:
                    bundle_member[i] = self._up_bundle(a)
                    self.bundle_cap[bundle_member[i]] += cap
                    if not dead:
                        self.up[a].append((i, b))
                elif tb < ta:
                    key = b if tb == 1 else (node[b]["campus"], node[b]["pod"])
                    bundle_member[i] = self._down_bundle(a, b)
                    self.bundle_cap[bundle_member[i]] += cap
                    if not dead:
                        self.down[a][key].append(i)
                else:
                    bundle_member[i] = ("lh", node[a]["plane"], node[a]["campus"], node[b]["campus"])
                    self.bundle_cap[bundle_member[i]] += cap
                    if not dead:
                        self.peer[a][node[b]["campus"]].append((i, b))
        self.bundle_of: dict[int, int] = {}
        self.cap = np.array(caps)
        bundle_delay: dict[tuple, float] = defaultdict(float)
        for i, name in bundle_member.items():
            bundle_delay[name] = max(bundle_delay[name], delays[i])
        self.delay_us = np.array(delays)
        self.n_links = lid
        self.bundle_ids = {name: self.n_links + j for j, name in enumerate(self.bundle_cap)}
        for i, name in bundle_member.items():
            self.bundle_of[i] = self.bundle_ids[name]
        self.cap_all = np.concatenate([self.cap, np.array(list(self.bundle_cap.values()))])
        # a bundle's delay is its slowest member's: sprayed paths pay it like any link
        self.delay_all = np.concatenate([self.delay_us, np.array([bundle_delay[n] for n in self.bundle_cap])])

    @staticmethod
    def _norm(u, v, k=0):
        return (u, v, k) if u <= v else (v, u, k)

    def _up_bundle(self, a: str) -> tuple:
        d = self.g._node[a]
        if d["tier"] == 1:
            return ("leaf-up", a)
        return ("pod-up", d["plane"], d["campus"], d["pod"])   # spine -> core links of a pod

    def _down_bundle(self, a: str, b: str) -> tuple:
        db = self.g._node[b]
        if db["tier"] == 1:
            return ("leaf-down", b)
        return ("pod-down", db["plane"], db["campus"], db["pod"])

    # -- paths -----------------------------------------------------------------------
    def ecmp_path(self, src_leaf: str, dst_leaf: str, rnd: random.Random) -> list[int] | None:
        """Directed link ids from leaf to leaf, hashing at every choice; None if unreachable."""
        if src_leaf == dst_leaf:
            return []
        node = self.g._node
        db = node[dst_leaf]
        path: list[int] = []
        cur = src_leaf
        # climb until a switch that has the destination (leaf, pod or campus) below or beside it
        while True:
            dc = node[cur]
            if dc["tier"] == 2 and dst_leaf in self.down[cur]:
                break
            if dc["tier"] == 3:
                break
            choices = self.up.get(cur)
            if dc["tier"] == 2 and dc["pod"] == db["pod"] and dc["campus"] == db["campus"]:
                return None  # a spine of the right pod that lost its link to the leaf
            if not choices:
                return None
            i, nxt = choices[rnd.randrange(len(choices))]
            path.append(i)
            cur = nxt
        if node[cur]["tier"] == 3:
            if node[cur]["campus"] != db["campus"]:
                peers = self.peer[cur].get(db["campus"])
                if not peers:
                    return None
                i, cur = peers[rnd.randrange(len(peers))]
                path.append(i)
            downs = self.down[cur].get((db["campus"], db["pod"]))
            if not downs:
                return None
            # choose a spine of the destination pod that still reaches the leaf
            options = [i for i in downs if dst_leaf in self.down[self._head(i)]]
            if not options:
                return None
            i = options[rnd.randrange(len(options))]
            path.append(i)
            cur = self._head(i)
        downs = self.down[cur][dst_leaf]
        path.append(downs[rnd.randrange(len(downs))])
        return path

    def _head(self, link_id: int) -> str:
        return self._heads[link_id]

    @property
    def _heads(self) -> list[str]:
        heads = getattr(self, "_heads_cache", None)
        if heads is None:
            heads = [None] * self.n_links
            i = 0
            for u, v in self.g.edges():
                heads[i], heads[i + 1] = v, u
                i += 2
            self._heads_cache = heads
        return heads

    def spray_path(self, src_leaf: str, dst_leaf: str) -> list[int]:
        """Bundle ids a sprayed packet stream crosses from leaf to leaf."""
        if src_leaf == dst_leaf:
            return []
        node = self.g._node
        a, b = node[src_leaf], node[dst_leaf]
        ids = [self.bundle_ids[("leaf-up", src_leaf)]]
        if (a["campus"], a["pod"]) != (b["campus"], b["pod"]):
            ids.append(self.bundle_ids[("pod-up", a["plane"], a["campus"], a["pod"])])
            if a["campus"] != b["campus"]:
                ids.append(self.bundle_ids[("lh", a["plane"], a["campus"], b["campus"])])
            ids.append(self.bundle_ids[("pod-down", b["plane"], b["campus"], b["pod"])])
        ids.append(self.bundle_ids[("leaf-down", dst_leaf)])
        return ids


# ---- max-min fair rates ---------------------------------------------------------------

def max_min_rates(flow_idx: np.ndarray, link_idx: np.ndarray, weight: np.ndarray, cap: np.ndarray,
                  n_flows: int) -> np.ndarray:
    """Max-min fair rates by progressive filling. Flow f puts weight w on link l for every
    entry (f, l, w): the link carries sum(w * rate_f) <= cap_l. Flows with no entries get inf."""
    rates = np.zeros(n_flows)
    active = np.ones(n_flows, dtype=bool)
    has_links = np.bincount(flow_idx, minlength=n_flows) > 0
    rates[~has_links] = np.inf
    active &= has_links
    residual = cap.astype(float).copy()
    n_links = len(cap)
    for _ in range(10 * n_flows + 10):
        if not active.any():
            break
        w_active = weight * active[flow_idx]
        load = np.bincount(link_idx, weights=w_active, minlength=n_links)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 1e-15, residual / load, np.inf)
        inc = share.min()
        if not np.isfinite(inc):
            break
        inc = max(inc, 0.0)
        rates[active] += inc
        residual -= inc * load
        saturated = share <= inc * (1 + 1e-9) + 1e-12
        hit = saturated[link_idx] & (w_active > 0)
        active[np.unique(flow_idx[hit])] = False
    return rates


def drain_times(flow_idx: np.ndarray, link_idx: np.ndarray, weight: np.ndarray, cap: np.ndarray,
                size_bits: np.ndarray) -> np.ndarray:
    """Completion time (s) of each flow if every link drains the bytes routed over it at full
    capacity: a flow ends when the busiest link on its path has drained. The largest of these
    is the step's makespan under any work-conserving sharing of the busiest link; the
    tests compare it with the event-driven max-min simulation (:func:`flow_times`).
    Entries must be grouped by flow (flow_idx non-decreasing)."""
    load = np.bincount(link_idx, weights=weight * size_bits[flow_idx], minlength=len(cap))
    with np.errstate(divide="ignore", invalid="ignore"):
        per_link = np.where(load > 0, load / (cap * 1e9), 0.0)
    starts = np.flatnonzero(np.r_[True, flow_idx[1:] != flow_idx[:-1]])
    return np.maximum.reduceat(per_link[link_idx], starts)


def flow_times(flow_idx, link_idx, weight, cap, size_bits: np.ndarray, *, group: float = 0.02) -> np.ndarray:
    """Completion time (s) of each flow, all starting at 0, re-sharing bandwidth whenever a
    group of flows finishes (flows finishing within ``group`` of the earliest finish in a
    round complete together, bounding the rounds)."""
    n = len(size_bits)
    remaining = size_bits.astype(float).copy()
    done = np.zeros(n, dtype=bool)
    finish = np.zeros(n)
    now = 0.0
    keep = np.ones(len(flow_idx), dtype=bool)
    for _ in range(n + 1):
        live = ~done
        if not live.any():
            break
        keep = live[flow_idx]
        rates = max_min_rates(flow_idx[keep], link_idx[keep], weight[keep], cap, n)
        rates[done] = 0
        with np.errstate(divide="ignore", invalid="ignore"):
            ttf = np.where(live & (rates > 0), remaining / (rates * 1e9), np.inf)
        if not np.isfinite(ttf[live]).any():
            finish[live] = np.inf
            break
        t = ttf[live].min()
        closing = live & (ttf <= t * (1 + group))
        dt = ttf[closing].max()
        now += dt
        remaining -= rates * 1e9 * dt
        finish[closing] = now
        done |= closing
        remaining[done] = 0
    return finish


# ---- collectives as steps of (src rank, dst rank) pairs --------------------------------

@dataclass
class Job:
    """Ranks: (host, rail) pairs in ring order."""
    ranks: list[tuple[str, int]]

    @property
    def n(self) -> int:
        return len(self.ranks)


def make_job(g: nx.MultiGraph, hosts: int | None, placement: str, seed: int) -> Job:
    s = g.graph["scenario"]
    names = [n for n, d in g._node.items() if d["tier"] == 0]
    if hosts is not None:
        if not 2 <= hosts <= len(names):
            raise UserError(f"--hosts must be between 2 and {len(names)} for {s.name}, got {hosts}")
    else:
        hosts = len(names)
    if placement == "packed":
        chosen = names[:hosts]
    elif placement == "random":
        chosen = random.Random(seed).sample(names, hosts)
    else:
        raise UserError(f"placement must be packed or random, got {placement!r}")
    # rails are the outer loop: a ring per rail through every host (NCCL's rail-aligned rings)
    return Job(ranks=[(h, r) for r in range(s.rails) for h in chosen])


def steps(collective: str, job: Job, size_bytes: int, *, max_steps: int, seed: int, rails: int):
    """Yield (multiplicity, [(src rank, dst rank)], bytes per pair) for each distinct step.

    Ring collectives run one ring per rail (NCCL's rail-aligned rings), all rails at once:
    each ring has H = hosts ranks; an all-reduce of S bytes moves S/H per step for 2(H-1)
    steps, all-gather and reduce-scatter (S = the whole array) S/H for H-1 steps.
    All-to-all (pairwise exchange: rank i sends to i+k at step k) and the others span all
    ranks; pairs on the same host use NVLink and are left out of the network.
    """
    n = job.n
    per_rail = n // rails
    if collective in RING_COLLECTIVES:
        ring_next = [(i // per_rail) * per_rail + (i % per_rail + 1) % per_rail for i in range(n)]
        count = 2 * (per_rail - 1) if collective == "all_reduce" else per_rail - 1
        yield count, list(enumerate(ring_next)), size_bytes / per_rail
    elif collective == "all_to_all":
        distances = list(range(1, n))
        if len(distances) > max_steps:
            idx = np.linspace(0, len(distances) - 1, max_steps).round().astype(int)
            picked = [distances[i] for i in sorted(set(idx))]
        else:
            picked = distances
        mult = (n - 1) / len(picked)
        for k in picked:
            yield mult, [(i, (i + k) % n) for i in range(n)], size_bytes / n
    elif collective == "permutation":
        perm = list(range(n))
        rnd = random.Random(seed)
        while True:
            rnd.shuffle(perm)
            if all(perm[i] != i for i in range(n)):
                break
        yield 1, [(i, perm[i]) for i in range(n)], size_bytes
    elif collective == "incast":
        yield 1, [(i, 0) for i in range(1, n)], size_bytes / n
    else:
        raise UserError(f"the model runs {', '.join(MODEL_COLLECTIVES)}; got {collective!r}")


def ranks_in_collective(collective: str, job: Job, rails: int) -> int:
    """n for the busbw factor: ranks of one rail ring for ring collectives, else all ranks."""
    return job.n // rails if collective in RING_COLLECTIVES else job.n


# ---- one step on the network -----------------------------------------------------------

@dataclass
class StepResult:
    time_s: float
    latency_s: float
    flows: int
    stalled: int
    hit: int
    rate_gbps_min: float
    rate_gbps_mean: float


def _rank_ports(net: Network, rank: tuple[str, int]) -> list[tuple[str, int, int]]:
    host, rail = rank
    planes = net.s.planes
    return [net.host_port[(host, rail * planes + p)] for p in range(planes)]


def run_step(net: Network, job: Job, pairs, bytes_per_pair: float, routing: str, qps: int,
             rnd: random.Random, switch_latency_us: float, watch: set[int] = frozenset()) -> StepResult:
    """Model one step. ``watch``: directed link ids whose failure is being studied; the result
    counts the connections whose path (or, sprayed, whose bundles) include one."""
    f_idx: list[int] = []
    l_idx: list[int] = []
    w: list[float] = []
    sizes: list[float] = []
    lat = 0.0
    stalled = 0
    hit = 0
    flow = 0
    planes = net.s.planes
    watched_bundles = {net.bundle_of[i] for i in watch if i in net.bundle_of}
    for src, dst in pairs:
        sp = _rank_ports(net, job.ranks[src])
        dp = _rank_ports(net, job.ranks[dst])
        if job.ranks[src][0] == job.ranks[dst][0]:
            continue  # same host: NVLink, not the network
        for _ in range(qps):
            if routing == "ecmp":
                p = rnd.randrange(planes)
                (sleaf, s_up, _), (dleaf, _, d_down) = sp[p], dp[p]
                mid = net.ecmp_path(sleaf, dleaf, rnd)
                if mid is None:
                    stalled += 1
                    continue
                links = [s_up, *mid, d_down]
                hit += bool(watch) and not watch.isdisjoint(links)
                f_idx.extend([flow] * len(links))
                l_idx.extend(links)
                w.extend([1.0] * len(links))
                hops = len(links) - 1
                lat = max(lat, float(net.delay_all[links].sum()) + hops * switch_latency_us)
            else:
                for p in range(planes):
                    (sleaf, s_up, _), (dleaf, _, d_down) = sp[p], dp[p]
                    mid = net.spray_path(sleaf, dleaf)
                    links = [s_up, *mid, d_down]
                    if watched_bundles and not watched_bundles.isdisjoint(mid):
                        hit += 1
                    f_idx.extend([flow] * len(links))
                    l_idx.extend(links)
                    w.extend([1.0 / planes] * len(links))
                    hops = len(links) - 1
                    lat = max(lat, float(net.delay_all[links].sum()) + hops * switch_latency_us)
            sizes.append(bytes_per_pair * 8 / qps)
            flow += 1
    if flow == 0:
        return StepResult(0.0, 0.0, 0, stalled, hit, math.inf, math.inf)
    fi, li, wi = np.array(f_idx), np.array(l_idx), np.array(w)
    finish = drain_times(fi, li, wi, net.cap_all, np.array(sizes))
    rates = np.array(sizes) / np.maximum(finish, 1e-30) / 1e9
    return StepResult(time_s=float(finish.max()) + lat * 1e-6, latency_s=lat * 1e-6, flows=flow,
                      stalled=stalled, hit=hit, rate_gbps_min=float(rates.min()), rate_gbps_mean=float(rates.mean()))


# ---- the collective ---------------------------------------------------------------------

@dataclass
class ModelResult:
    collective: str
    routing: str
    ranks: int
    size_bytes: int
    time_s: float
    algbw_gbs: float
    busbw_gbs: float
    nic_gbps: float
    efficiency: float          # busbw as a fraction of the NIC's line rate
    stalled_connections: int
    steps_modelled: int        # distinct steps computed
    steps_distinct: int        # distinct steps the collective has (all-to-all: n-1; rings: 1)
    steps_total: float
    detail: dict[str, Any] = field(default_factory=dict)


def run_collective(g: nx.MultiGraph, collective: str, size_bytes: int, *, routing: str = "ecmp",
                   hosts: int | None = None, placement: str = "packed", qps: int = 4, seed: int = 1,
                   failed: set | None = None, max_steps: int = 16, switch_latency_us: float = 1.0,
                   network: Network | None = None, watch: set[int] = frozenset()) -> ModelResult:
    if routing not in ROUTINGS:
        raise UserError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    if qps < 1:
        raise UserError(f"--qps must be at least 1, got {qps}")
    if size_bytes <= 0:
        raise UserError(f"size must be positive, got {size_bytes}")
    collective = canonical(collective)
    if collective not in MODEL_COLLECTIVES:
        raise UserError(f"the model runs {', '.join(MODEL_COLLECTIVES)}; got {collective!r}")
    s = g.graph["scenario"]
    net = network or Network(g, failed)
    job = make_job(g, hosts, placement, seed)
    rnd = random.Random(seed)
    total = 0.0
    n_steps = 0.0
    modelled = 0
    stalled = 0
    hits = 0
    details = []
    for mult, pairs, nbytes in steps(collective, job, size_bytes, max_steps=max_steps, seed=seed,
                                     rails=s.rails):
        r = run_step(net, job, pairs, nbytes, routing, qps, rnd, switch_latency_us, watch)
        hits += r.hit
        total += mult * r.time_s
        n_steps += mult
        modelled += 1
        stalled += r.stalled
        details.append({"multiplicity": mult, "time_us": r.time_s * 1e6, "latency_us": r.latency_s * 1e6,
                        "flows": r.flows, "rate_gbps_min": r.rate_gbps_min, "rate_gbps_mean": r.rate_gbps_mean})
    n = ranks_in_collective(collective, job, s.rails)
    algbw = size_bytes / total / 1e9 if total > 0 else math.inf
    busbw = algbw * busbw_factor(collective, n)
    nic_gbps = s.planes * s.host_rate_gbps     # one NIC: a port in every plane
    line = nic_gbps / 8                        # GB/s
    return ModelResult(collective=collective, routing=routing, ranks=job.n, size_bytes=size_bytes, time_s=total,
                       algbw_gbs=algbw, busbw_gbs=busbw, nic_gbps=nic_gbps, efficiency=busbw / line,
                       stalled_connections=stalled, steps_modelled=modelled,
                       steps_distinct=job.n - 1 if collective == "all_to_all" else 1, steps_total=n_steps,
                       detail={"steps": details[:4], "qps": qps, "placement": placement,
                               "hosts": len({h for h, _ in job.ranks}), "connections_on_watched_links": hits})


def random_fabric_links(g: nx.MultiGraph, count: int, seed: int) -> set[tuple[str, str, int]]:
    links = [(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] == "fabric"]
    if count > len(links):
        raise UserError(f"--fail-links {count}: the fabric has only {len(links)} leaf-spine links")
    return set(random.Random(seed).sample(links, count))


def failure_impact(g: nx.MultiGraph, collective: str, size_bytes: int, failed: set, *,
                   detect_ms: dict[str, float], **kw) -> dict[str, Any]:
    """Collective time with links failing at its start, for several detection + convergence
    times: if any connection's path crosses a failed link, the synchronous collective stalls
    until the failure is handled, then runs on the repaired routing (failed links removed)."""
    watch = Network(g, failed).failed_ids
    healthy = run_collective(g, collective, size_bytes, watch=watch, **kw)
    after = run_collective(g, collective, size_bytes, failed=failed, **kw)
    hit = healthy.detail["connections_on_watched_links"]
    out = {"healthy_s": healthy.time_s, "after_repair_s": after.time_s, "connections_hit": hit,
           "by_detection": {}}
    for name, ms in detect_ms.items():
        total = (ms / 1e3 if hit else 0.0) + after.time_s
        out["by_detection"][name] = {"detect_ms": ms, "time_s": total, "slowdown": total / healthy.time_s}
    return out
