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
    * Failures: failed links carry nothing. After convergence, routes are the controller
      compiler's: valley-free shortest paths per destination leaf over the live links
      (:meth:`Network.ecmp_path`), so a switch hashes only over next hops that still reach
      the destination, and a connection hashes only over the planes on which it has a path
      (both host links up, the leaves joined). Before convergence, the connections hashed
      onto a failed link stall for the detection + convergence time (see :func:`failure_impact`).
      Sprayed connections use the same planes; a bundle's capacity is its live links'.
    * Stalls: a connection with no path on any plane is never dropped silently: the result
      counts it (``stalled_connections``), lists its rank pair (``stalled_pairs``), and the
      collective never completes (``time_s`` is inf, busbw 0). Valley paths (down to a third
      leaf and up again) are not routed, as the compiler does not route them.

Not modelled: congestion control dynamics (DCQCN), PFC, buffers, packet reordering cost,
intra-host (NVLink) transfers, NIC processing; a step's flows start together.
"""
from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import networkx as nx
import numpy as np

from .collectives import busbw_factor, canonical
from .errors import UserError

MODEL_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permutation", "incast")
ROUTINGS = ("ecmp", "spray")
RING_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


# ---- the network as directed links ----------------------------------------------------

class _Dest(NamedTuple):
    """A destination leaf's routing class: leaves with equal sets route alike."""
    id: int
    adjacent: frozenset     # spines with a live link down to the leaf
    above: frozenset        # cores with a live link down to one of those spines
    far: frozenset          # other cores with a live long-haul link to a core above
    pod: tuple              # (campus, pod) of the leaf


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
        # spine -> leaf -> link ids; core -> (campus, pod) -> link ids
        self.down: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
        self.peer: dict[str, dict[int, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
        self.host_port: dict[tuple[str, int], tuple[str, int, int]] = {}   # (host, intf) -> leaf, up id, down id
        self.leaf_spines: dict[str, set[str]] = defaultdict(set)   # leaf -> spines with a live link to it
        self._dest_cache: dict[str, _Dest] = {}
        self._dest_intern: dict[tuple, _Dest] = {}
        self._spine_cores_cache: dict[str, frozenset] = {}
        self._hops_cache: dict[tuple[str, int], list[tuple[int, str]]] = {}
        # spray bundles: name -> capacity; each directed link belongs to at most one bundle
        self.bundle_cap: dict[tuple, float] = defaultdict(float)
        bundle_member: dict[int, tuple] = {}
        lid = 0
        for u, v, k, d in g.edges(keys=True, data=True):
            dead = self._norm(u, v, k) in failed
            cap = 0.0 if dead else d["rate_gbps"]
            ids = []
            for _direction in ((u, v), (v, u)):
                caps.append(cap)
                delays.append(d["delay_us"])
                if dead:
                    self.failed_ids.add(lid)
                ids.append(lid)
                lid += 1
            for (a, b), i in zip(((u, v), (v, u)), ids, strict=True):
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
                        if tb == 1:
                            self.leaf_spines[b].add(a)
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
    # Routing after convergence is the controller compiler's rule (hpnlab.controller.compiler):
    # valley-free shortest paths per destination leaf, from the live links. For a
    # destination leaf d:
    #   adjacent spines  the spines with a live link down to d                  (distance 1)
    #   cores above      the cores with a live link down to an adjacent spine   (distance 2)
    #   far cores        other cores with a live long-haul link to a core above (distance 3)
    # and a spine that is not adjacent is at distance 3 (a live uplink to a core above) or
    # 4 (to a far core). Every switch hashes over the next hops at the least distance, so
    # every hop lowers the distance: no loops, and a switch is never offered a next hop
    # that cannot reach d (the model used to send a connection up to a spine that had lost
    # its link to d, and counted it as stalled although the fabric still connected it).

    def _dest(self, dst_leaf: str) -> _Dest:
        """What a destination leaf's routes depend on (cached per leaf, interned by value)."""
        r = self._dest_cache.get(dst_leaf)
        if r is None:
            a2 = frozenset(self.leaf_spines.get(dst_leaf, ()))
            a3 = frozenset(c for s in a2 for c in self._spine_cores(s))
            a3l = frozenset(c for c3 in a3 for peers in self.peer[c3].values() for _, c in peers
                            if c not in a3)
            node = self.g._node[dst_leaf]
            key = (a2, a3, a3l, node["campus"], node["pod"])
            r = self._dest_intern.get(key)
            if r is None:
                r = self._dest_intern[key] = _Dest(len(self._dest_intern), a2, a3, a3l,
                                                   (node["campus"], node["pod"]))
            self._dest_cache[dst_leaf] = r
        return r

    def _spine_cores(self, spine: str) -> frozenset:
        cores = self._spine_cores_cache.get(spine)
        if cores is None:
            cores = self._spine_cores_cache[spine] = frozenset(c for _, c in self.up.get(spine, ()))
        return cores

    def _spine_distance(self, spine: str, r: _Dest) -> int | None:
        if spine in r.adjacent:
            return 1
        cores = self._spine_cores(spine)
        if not cores.isdisjoint(r.above):
            return 3
        if not cores.isdisjoint(r.far):
            return 4
        return None

    def _next_hops(self, switch: str, r: _Dest) -> list[tuple[int, str]]:
        """(directed link id, neighbour) pairs ``switch`` hashes over towards ``r``'s leaf,
        for a leaf, a spine not adjacent to it, or a core (memoised per destination class)."""
        key = (switch, r.id)
        hops = self._hops_cache.get(key)
        if hops is not None:
            return hops
        tier = self.g._node[switch]["tier"]
        hops = []
        if tier == 1:
            best = None
            for i, spine in self.up.get(switch, ()):
                dist = self._spine_distance(spine, r)
                if dist is None:
                    continue
                if best is None or dist < best:
                    best, hops = dist, [(i, spine)]
                elif dist == best:
                    hops.append((i, spine))
        elif tier == 2:
            cores = self._spine_cores(switch)
            target = r.above if not cores.isdisjoint(r.above) else r.far
            hops = [(i, c) for i, c in self.up.get(switch, ()) if c in target]
        elif switch in r.above:
            heads = self._heads
            hops = [(i, heads[i]) for i in self.down[switch].get(r.pod, ()) if heads[i] in r.adjacent]
        elif switch in r.far:
            hops = [(i, c) for peers in self.peer[switch].values() for i, c in peers if c in r.above]
        self._hops_cache[key] = hops
        return hops

    def leaf_reaches(self, src_leaf: str, dst_leaf: str) -> bool:
        """Whether the converged routes lead from one leaf to another (same plane)."""
        return src_leaf == dst_leaf or bool(self._next_hops(src_leaf, self._dest(dst_leaf)))

    def ecmp_path(self, src_leaf: str, dst_leaf: str, rnd: random.Random) -> list[int] | None:
        """Directed link ids from leaf to leaf, hashing at every choice; None if the source leaf
        has no route to the destination (a dead end further on is a bug, and raises)."""
        if src_leaf == dst_leaf:
            return []
        r = self._dest(dst_leaf)
        path: list[int] = []
        cur = src_leaf
        for _ in range(6):          # leaf, spine, core, far core, spine: at most 5 hops up to d
            if cur in r.adjacent:
                downs = self.down[cur][dst_leaf]
                path.append(downs[rnd.randrange(len(downs))])
                return path
            hops = self._next_hops(cur, r)
            if not hops:
                if cur == src_leaf:
                    return None
                raise AssertionError(f"routing bug: {src_leaf} -> {dst_leaf} dead-ends at {cur}")
            i, cur = hops[rnd.randrange(len(hops))]
            path.append(i)
        raise AssertionError(f"no path from {src_leaf} to {dst_leaf} within 6 hops: a routing loop")

    def link_ends(self, link_id: int) -> tuple[str, str]:
        """(tail, head) of a directed link id (ids 2j and 2j + 1 are the two directions of a link)."""
        heads = self._heads
        return heads[link_id ^ 1], heads[link_id]

    @property
    def _heads(self) -> list[str]:
        heads = getattr(self, "_heads_cache", None)
        if heads is None:
            heads = [""] * self.n_links
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
    time_s: float                # inf when a connection has no path: the step never completes
    latency_s: float
    flows: int                   # connections routed
    stalled: int                 # connections with no path on any plane
    hit: int
    rate_gbps_min: float
    rate_gbps_mean: float
    stalled_pairs: list[tuple[int, int]] = field(default_factory=list)   # (src rank, dst rank)


def _rank_ports(net: Network, rank: tuple[str, int]) -> list[tuple[str, int, int]]:
    host, rail = rank
    planes = net.s.planes
    return [net.host_port[(host, rail * planes + p)] for p in range(planes)]


def usable_planes(net: Network, src_ports, dst_ports) -> list[int]:
    """Planes on which a connection between two NICs has a path after convergence: both
    host links up and the source leaf's routes reach the destination leaf."""
    cap = net.cap
    return [p for p, ((sleaf, s_up, _), (dleaf, _, d_down)) in enumerate(zip(src_ports, dst_ports, strict=True))
            if cap[s_up] > 0 and cap[d_down] > 0 and net.leaf_reaches(sleaf, dleaf)]


def _ecmp_links(net: Network, sp, dp, rnd: random.Random) -> list[int] | None:
    """One connection's directed links: hashed onto a plane, then onto a next hop at every
    switch. A plane without a path is left out of the hash (its routes were withdrawn), so
    the plane is uniform over the usable ones: take the hashed plane if usable, else pick
    among the other usable ones."""
    p = rnd.randrange(len(sp))
    (sleaf, s_up, _), (dleaf, _, d_down) = sp[p], dp[p]
    mid = net.ecmp_path(sleaf, dleaf, rnd) if net.cap[s_up] > 0 and net.cap[d_down] > 0 else None
    if mid is None:
        rest = [q for q in usable_planes(net, sp, dp) if q != p]
        if not rest:
            return None
        p = rest[rnd.randrange(len(rest))]
        (sleaf, s_up, _), (dleaf, _, d_down) = sp[p], dp[p]
        mid = net.ecmp_path(sleaf, dleaf, rnd)
        assert mid is not None, "usable_planes and ecmp_path disagree"
    return [s_up, *mid, d_down]


@dataclass
class RoutedStep:
    """A step's connections on the network: entries (flow, link, weight) grouped by flow."""
    flow_idx: np.ndarray
    link_idx: np.ndarray
    weight: np.ndarray
    size_bits: np.ndarray      # per routed connection
    latency_us: float          # the longest path's
    stalled: int
    stalled_pairs: list[tuple[int, int]]
    hit: int


def route_step(net: Network, job: Job, pairs, bytes_per_pair: float, routing: str, qps: int,
               rnd: random.Random, switch_latency_us: float = 0.0, watch: AbstractSet[int] = frozenset()) -> RoutedStep:
    """Route one step's connections. ``watch``: directed link ids whose failure is being
    studied; ``hit`` counts the connections whose path (or, sprayed, whose bundles) include
    one. A connection with no path on any plane is counted and its pair listed."""
    f_idx: list[int] = []
    l_idx: list[int] = []
    w: list[float] = []
    sizes: list[float] = []
    lat = 0.0
    stalled = 0
    stalled_pairs: list[tuple[int, int]] = []
    hit = 0
    flow = 0
    watched_bundles = {net.bundle_of[i] for i in watch if i in net.bundle_of}
    for src, dst in pairs:
        if job.ranks[src][0] == job.ranks[dst][0]:
            continue  # same host: NVLink, not the network
        sp = _rank_ports(net, job.ranks[src])
        dp = _rank_ports(net, job.ranks[dst])
        if routing == "spray":
            planes = usable_planes(net, sp, dp)
            if not planes:
                stalled += qps
                stalled_pairs.append((src, dst))
                continue
        for _ in range(qps):
            if routing == "ecmp":
                links = _ecmp_links(net, sp, dp, rnd)
                if links is None:
                    stalled += 1
                    if not stalled_pairs or stalled_pairs[-1] != (src, dst):
                        stalled_pairs.append((src, dst))
                    continue
                hit += bool(watch) and not watch.isdisjoint(links)
                f_idx.extend([flow] * len(links))
                l_idx.extend(links)
                w.extend([1.0] * len(links))
                hops = len(links) - 1
                lat = max(lat, float(net.delay_all[links].sum()) + hops * switch_latency_us)
            else:
                for p in planes:
                    (sleaf, s_up, _), (dleaf, _, d_down) = sp[p], dp[p]
                    mid = net.spray_path(sleaf, dleaf)
                    links = [s_up, *mid, d_down]
                    if watched_bundles and not watched_bundles.isdisjoint(mid):
                        hit += 1
                    f_idx.extend([flow] * len(links))
                    l_idx.extend(links)
                    w.extend([1.0 / len(planes)] * len(links))
                    hops = len(links) - 1
                    lat = max(lat, float(net.delay_all[links].sum()) + hops * switch_latency_us)
            sizes.append(bytes_per_pair * 8 / qps)
            flow += 1
    return RoutedStep(np.array(f_idx, dtype=int), np.array(l_idx, dtype=int), np.array(w, dtype=float),
                      np.array(sizes, dtype=float), lat, stalled, stalled_pairs, hit)


def run_step(net: Network, job: Job, pairs, bytes_per_pair: float, routing: str, qps: int,
             rnd: random.Random, switch_latency_us: float, watch: AbstractSet[int] = frozenset()) -> StepResult:
    """Model one step (:func:`route_step`, then :func:`drain_times`). A stalled connection is
    never dropped from the timing silently: the step then never completes (``time_s`` inf)."""
    r = route_step(net, job, pairs, bytes_per_pair, routing, qps, rnd, switch_latency_us, watch)
    flows = len(r.size_bits)
    if flows == 0:
        return StepResult(math.inf if r.stalled else 0.0, 0.0, 0, r.stalled, r.hit, math.inf, math.inf,
                          r.stalled_pairs)
    finish = drain_times(r.flow_idx, r.link_idx, r.weight, net.cap_all, r.size_bits)
    rates = r.size_bits / np.maximum(finish, 1e-30) / 1e9
    time_s = math.inf if r.stalled else float(finish.max()) + r.latency_us * 1e-6
    return StepResult(time_s=time_s, latency_s=r.latency_us * 1e-6, flows=flows, stalled=r.stalled, hit=r.hit,
                      rate_gbps_min=float(rates.min()), rate_gbps_mean=float(rates.mean()),
                      stalled_pairs=r.stalled_pairs)


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
    stalled_connections: int  # connections with no path (summed over the modelled steps); then time_s is inf
    steps_modelled: int        # distinct steps computed
    steps_distinct: int        # distinct steps the collective has (all-to-all: n-1; rings: 1)
    steps_total: float
    detail: dict[str, Any] = field(default_factory=dict)
    stalled_pairs: list[tuple[tuple[str, int], tuple[str, int]]] = field(default_factory=list)
    """Rank pairs ((host, rail) -> (host, rail)) with a stalled connection, each listed once."""


def run_collective(g: nx.MultiGraph, collective: str, size_bytes: int, *, routing: str = "ecmp",
                   hosts: int | None = None, placement: str = "packed", qps: int = 4, seed: int = 1,
                   failed: set | None = None, max_steps: int = 16, switch_latency_us: float = 1.0,
                   network: Network | None = None, watch: AbstractSet[int] = frozenset()) -> ModelResult:
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
    stalled_pairs: dict[tuple, None] = {}
    details = []
    for mult, pairs, nbytes in steps(collective, job, size_bytes, max_steps=max_steps, seed=seed,
                                     rails=s.rails):
        r = run_step(net, job, pairs, nbytes, routing, qps, rnd, switch_latency_us, watch)
        hits += r.hit
        total += mult * r.time_s
        n_steps += mult
        modelled += 1
        stalled += r.stalled
        for a, b in r.stalled_pairs:
            stalled_pairs[job.ranks[a], job.ranks[b]] = None
        details.append({"multiplicity": mult, "time_us": r.time_s * 1e6, "latency_us": r.latency_s * 1e6,
                        "flows": r.flows, "rate_gbps_min": r.rate_gbps_min, "rate_gbps_mean": r.rate_gbps_mean})
    n = ranks_in_collective(collective, job, s.rails)
    algbw = size_bytes / total / 1e9 if total > 0 else math.inf     # 0 when a connection stalled
    busbw = algbw * busbw_factor(collective, n)
    nic_gbps = s.planes * s.host_rate_gbps     # one NIC: a port in every plane
    line = nic_gbps / 8                        # GB/s
    return ModelResult(collective=collective, routing=routing, ranks=job.n, size_bytes=size_bytes, time_s=total,
                       algbw_gbs=algbw, busbw_gbs=busbw, nic_gbps=nic_gbps, efficiency=busbw / line,
                       stalled_connections=stalled, steps_modelled=modelled,
                       steps_distinct=job.n - 1 if collective == "all_to_all" else 1, steps_total=n_steps,
                       detail={"steps": details[:4], "qps": qps, "placement": placement,
                               "hosts": len({h for h, _ in job.ranks}), "connections_on_watched_links": hits},
                       stalled_pairs=list(stalled_pairs))


def random_fabric_links(g: nx.MultiGraph, count: int, seed: int) -> set[tuple[str, str, int]]:
    links = [(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] == "fabric"]
    if count > len(links):
        raise UserError(f"--fail-links {count}: the fabric has only {len(links)} leaf-spine links")
    return set(random.Random(seed).sample(links, count))


def failure_impact(g: nx.MultiGraph, collective: str, size_bytes: int, failed: set, *,
                   detect_ms: dict[str, float], **kw) -> dict[str, Any]:
    """Collective time with links failing at its start, for several detection + convergence
    times: if any connection's path crosses a failed link, the synchronous collective stalls
    until the failure is handled, then runs on the repaired routing (failed links removed).
    Connections the repaired routing cannot carry are reported (``stalled_after_repair``);
    the collective then never completes (inf)."""
    watch = Network(g, failed).failed_ids
    healthy = run_collective(g, collective, size_bytes, watch=watch, **kw)
    after = run_collective(g, collective, size_bytes, failed=failed, **kw)
    hit = healthy.detail["connections_on_watched_links"]
    out = {"healthy_s": healthy.time_s, "after_repair_s": after.time_s, "connections_hit": hit,
           "stalled_after_repair": after.stalled_connections, "stalled_pairs_after_repair": after.stalled_pairs,
           "by_detection": {}}
    for name, ms in detect_ms.items():
        total = (ms / 1e3 if hit else 0.0) + after.time_s
        out["by_detection"][name] = {"detect_ms": ms, "time_s": total, "slowdown": total / healthy.time_s}
    return out
