"""Flow-level model: collective time and bandwidth on a fabric at full scale (130k ranks).

The emulator answers questions at tens of Mbit/s on one machine; this model answers the same
questions at real rates and real scale, from the same scenario, fabric graph and controller.

Model
    * Ranks: one per NIC (host, rail). A rank's NIC has one port per plane.
    * Forwarding: the controller compiler's, read as data (:mod:`.model_forwarding`): the
      next-hop sets its routes encode (longest prefix, de-aggregated after failures), and
      each switch's masked-bit selection of the UDP source port (the entropy map), with the
      fast-failover groups. A path is named by (source rank, destination rank, plane, i):
      the i-th of the connection's ``entropy_values`` (= min(8, the map's path count) per
      plane, as the transport's ``ports_per_nic``) entropy values, the same values the RoCE
      transport binds its source ports to (``routing.entropy.connection_value``: a hash
      of (src, dst, plane) places each connection's values in the map's value space, so
      different connections use different uplinks; source port ``EntropyMap.low_bits(k)``).
      tests/unit/test_model_forwarding.py proves the paths equal the table interpreter's walks of
      the compiled tables, with and without failures.
    * Entropy policies (``routing``), per rank pair with ``qps`` connections. Where per-flow
      hashing puts a connection is the transport's own rule, one shared function
      (``routing.entropy.flow_hash`` of the rank pair, ``routing.entropy.connection_path``):
        ``flow``     (alias ``ecmp``) each connection on one path for every step of the job:
                     with ``qps`` 1 the transport's ``flow`` policy (the pair's hash picks one
                     path over every plane and value), else its ``ecmp`` policy (connection c
                     pinned to plane c mod planes, its value on that plane hashed).
        ``flowlet``  as ``flow``, but a connection moves to its plane's next value at each step
                     (the transport's flowlets move after an idle gap longer than the flowlet
                     gap, as between steps; inside a bulk step there is no such gap).
        ``spray``    every packet the next path in rotation over every plane and entropy
                     value: the pair's bytes split evenly over its live paths.
        ``adaptive`` a fluid approximation of REPS-like host-side adaptive routing: every
                     live path is its own sub-flow and the sub-flows share the links max-min
                     fairly (load moves off congested paths onto free ones); the pair's rate
                     is the sum, its time its bytes over that rate (rates held for the step).
      A connection whose hashed path is dead takes the next live one in rotation (the
      transport's migration to the next entropy value); a pair with no live path on any plane
      is never dropped silently: counted (``stalled_connections``), listed (``stalled_pairs``),
      and the collective never completes (``time_s`` inf, busbw 0).
    * Time: every directed link drains the bytes routed over it at its capacity; a flow ends
      when the busiest link on its path has drained, a step when its last flow has
      (:func:`drain_times`, vectorised). Per-connection rates are max-min fair
      (:func:`max_min_rates`); the exact fluid makespan (:func:`flow_times`, max-min re-shared
      as flows end) is kept for small fabrics (tools/bench/bench_model.py measures the gap).
    * Latency: per step, the longest path's propagation delay (links' ``delay_us``) plus
      ``switch_latency_us`` per switch traversed.
    * Collectives: the eight of :mod:`.collectives`, with the schedules the generators run
      (:func:`steps`; tests/unit/test_model.py checks them against ``collectives.build``): ring
      collectives per rail (NCCL's rail-aligned rings), halving-doubling, the pipelined
      broadcast chain, all-to-all as ONE step with every rank sending to every peer at once
      (sampled above ``exact_pairs`` pairs: a random subset of peer offsets, scaled, with the
      sampling error stated), incast, and a random derangement for permutation.
    * Failures: failed links carry nothing; after convergence the routes are the compiler's
      for the failed fabric. Failover is a chain per mode (:func:`failover_chain`, times
      :data:`FAILOVER_CHAIN_MS` or the failover comparison's JSON): detection (the failed links'
      traffic lost), the detour over the fast-failover backups until convergence, then the
      converged routes. :func:`failure_impact` keeps the earlier flat stall (detection +
      convergence added once, :data:`FAILOVER_DEFAULT_MS`) for the studies.
    * Switch weights: ``ecmp`` (every pattern of a set's field counts the same) or ``weighted``
      (:func:`weighted_network`: the controller's load-following policy, fabric/routing/weights.py,
      iterated over the model's own loads to a fixed point, the widened sets dealt as it decides).
    * Max-min over path flows (:func:`max_min_path_rates`): the flows' links as a hops x flows
      array (per-flow hashing's connections, adaptive routing's sub-flows); sprayed pairs keep
      entries (flow, link, weight) (:func:`max_min_rates`).

Lossless: every byte is drained at the links' capacity and none is lost or re-sent: the fabric the
model stands for is lossless, as RoCEv2 fabrics run with priority flow control. The emulation is
lossless only with ``--pfc on`` (``emulation.lossless``, docs/guides/lossless.md); without it its
switch ports drop and its transports time out, which the model does not count.

Not modelled: congestion control dynamics (DCQCN), PFC's pauses and the head-of-line blocking they
cause, buffers, packet reordering cost, intra-host (NVLink) transfers, NIC processing; a step's flows
start together.
"""
from __future__ import annotations

import copy
import gc
import hashlib
import math
import os
import pickle
import random
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.model.forwarding import Forwarding
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing import weights as cw
from hpnlab.fabric.routing.entropy import connection_offset, connection_path, connection_value, first_high, flow_hash
from hpnlab.fabric.routing.telemetry import PortTelemetry
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.workload.collectives import busbw_factor, canonical, random_perm

MODEL_COLLECTIVES = ("all_reduce", "all_reduce_hd", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                     "incast", "permutation")
ROUTINGS = ("flow", "flowlet", "spray", "adaptive")
ROUTING_ALIASES = {"ecmp": "flow"}
RING_COLLECTIVES = ("all_reduce", "all_reduce_hd", "all_gather", "reduce_scatter", "broadcast")
ENTROPY_VALUES = 8          # the RoCE transport's ports_per_nic default
EXACT_PAIRS = 1 << 18       # all-to-all: pairs modelled exactly up to this many, sampled above

#: Detection + convergence time per failover mode (ms), used when no failover benchmark's JSON
#: (tools/bench/bench_failover.py --json) is given: ``local`` the switches' fast-failover groups
#: (DPFR-style local repair, milliseconds, China Mobile's report), ``local+host`` the host-side
#: dead-path rule of the transport on top (tens of ms: its timers), ``controller`` route
#: convergence through the controller (seconds, as the field reports for control planes).
FAILOVER_DEFAULT_MS = {"local": 1.0, "local+host": 50.0, "controller": 2000.0}


def routing_name(routing: str) -> str:
    r = ROUTING_ALIASES.get(routing, routing)
    if r not in ROUTINGS:
        raise UserError(f"routing must be one of {', '.join(ROUTINGS)} (or ecmp = flow), got {routing!r}")
    return r


# ---- the network as directed links ----------------------------------------------------

def _norm(u, v, k=0):
    return (u, v, k) if u <= v else (v, u, k)


def graph_edges(g: nx.MultiGraph) -> list[tuple[str, str, int, dict]]:
    """``list(g.edges(keys=True, data=True))``, in its order (networkx's: nodes in order, each
    edge from the end met first, parallel edges by key), read off the adjacency directly: the
    edge view's per-edge calls cost seconds at a million links. Edge j is the model's link pair j."""
    out = []
    seen: set[str] = set()
    for u, nbrs in g._adj.items():
        for v, keydict in nbrs.items():
            if v not in seen:
                for k, d in keydict.items():
                    out.append((u, v, k, d))
        seen.add(u)
    return out


class Network:
    """Directed links of a fabric graph (ids 2j and 2j + 1: the two directions of edge j), their
    capacities (Gbit/s; 0 when failed) and delays, the hosts' ports, and the compiler's
    forwarding over them (:class:`.model_forwarding.Forwarding`)."""

    def __init__(self, g: nx.MultiGraph, failed: set | None = None, *, entropy_values: int = ENTROPY_VALUES,
                 converged: bool = True):
        self.g = g
        self.s = g.graph["scenario"]
        node = g._node
        sw_names = sorted(n for n, d in node.items() if d["tier"] > 0)
        sw_index = {n: i for i, n in enumerate(sw_names)}
        failed = {_norm(*f) for f in (failed or set())}
        edges = graph_edges(g)                           # edge j: directed links 2j (u -> v), 2j + 1
        m = len(edges)
        us = [e[0] for e in edges]
        vs = [e[1] for e in edges]
        ds = [e[3] for e in edges]
        rate = np.fromiter((d["rate_gbps"] for d in ds), float, m)
        self.delay_us = self.delay_all = np.repeat(np.fromiter((d["delay_us"] for d in ds), float, m), 2)
        pu = np.fromiter((d["ports"][u] for u, d in zip(us, ds, strict=True)), np.int64, m)
        pv = np.fromiter((d["ports"][v] for v, d in zip(vs, ds, strict=True)), np.int64, m)
        iu = np.fromiter((sw_index.get(u, -1) for u in us), np.int64, m)
        iv = np.fromiter((sw_index.get(v, -1) for v in vs), np.int64, m)
        self.failed_ids: set[int] = set()
        if failed:
            for j, (u, v, k, _d) in enumerate(edges):
                if _norm(u, v, k) in failed:
                    rate[j] = 0.0
                    self.failed_ids.update((2 * j, 2 * j + 1))
        self.cap = self.cap_all = np.repeat(rate, 2)
        self.n_links = 2 * m
        head = np.empty(2 * m, dtype=np.int64)
        head[0::2], head[1::2] = iv, iu
        j2 = 2 * np.arange(m)
        port_link = np.full((len(sw_names), int(max(pu.max(), pv.max())) + 1), -1, dtype=np.int32)
        on_u, on_v = iu >= 0, iv >= 0
        port_link[iu[on_u], pu[on_u]] = j2[on_u]
        port_link[iv[on_v], pv[on_v]] = j2[on_v] + 1
        self.port_link = port_link
        self.sw_index = sw_index
        # hosts (in graph order, as make_job lists them) and per host and interface: leaf index,
        # up link (host -> leaf), down link
        self.hosts = [n for n, d in node.items() if d["tier"] == 0]
        self.host_index = {h: i for i, h in enumerate(self.hosts)}
        self.emap = emap = compiler.entropy_map(g)
        self.entropy_space = emap.path_count()          # the values a connection's are taken from
        self.entropy_values = max(1, min(entropy_values, self.entropy_space))
        self.fwd = Forwarding(g, port_link, head, failed, converged=converged)
        assert self.fwd.switches == sw_names
        n_intf = int(max(pu[~on_u].max(initial=0), pv[~on_v].max(initial=0))) + 1
        self.host_leaf = np.full((len(self.hosts), n_intf), -1, dtype=np.int64)
        self.host_up = np.full((len(self.hosts), n_intf), -1, dtype=np.int64)
        self.host_down = np.full((len(self.hosts), n_intf), -1, dtype=np.int64)
        li, hi = self.fwd.leaf_index, self.host_index
        for side, far, ports, own in ((us, vs, pu, ~on_u), (vs, us, pv, ~on_v)):
            js = np.flatnonzero(own)
            h = np.fromiter((hi[side[j]] for j in js.tolist()), np.int64, len(js))
            lf = np.fromiter((li[far[j]] for j in js.tolist()), np.int64, len(js))
            first = side is us                  # the host is u: 2j leaves it, 2j + 1 comes in
            self.host_leaf[h, ports[js]] = lf
            self.host_up[h, ports[js]] = 2 * js + (0 if first else 1)
            self.host_down[h, ports[js]] = 2 * js + (1 if first else 0)
        self._rank_tables: dict[int, tuple] = {}

    def planes_copied(self, planes: int) -> Network | None:
        """This network of plane 0 alone (built from ``graph.build(s, planes=(0,))``) made the
        network of all ``planes`` planes, as :class:`Network` builds it from the whole graph,
        array for array (tests/unit/test_model_planes.py holds them equal on every multi-plane
        preset), without building the other planes' graphs and routes: the graph builder makes
        every plane alike (the same switches, ports and links under the names ``p<plane>...``),
        and the compiler routes a plane from its own switches alone. None when this network is
        not laid out as a plane of such a graph (a fat-tree, failed links, or links in another
        order): build the whole graph then.

        Link ids follow the whole graph's edge order (:func:`graph_edges`): every host's links
        first, host by host, its links in plane 0 then plane 1 ...; then plane 0's switch links,
        plane 1's ... The plane's own graph has the same order with one plane: host h's R links
        are its edges h R .. h R + R - 1, then the switch links."""
        fwd = self.fwd
        names = fwd.switches
        hosts = len(self.hosts)
        host_links = hosts and int((self.host_up >= 0).sum())
        edges = self.n_links // 2
        if (planes < 1 or self.failed_ids or fwd.dead_ports or fwd.bounce is not None or hosts == 0
                or host_links % hosts or any(not (n.startswith("p0") and n[2:3].isalpha()) for n in names)):
            return None
        per_host = host_links // hosts
        # the layout: host h's links are edges h R .. h R + R - 1, both ends of every later edge are switches
        up = self.host_up[self.host_up >= 0].reshape(hosts, per_host) if per_host else np.zeros((hosts, 0), int)
        want = np.arange(hosts * per_host).reshape(hosts, per_host)
        if not (np.array_equal(np.sort(up // 2, axis=1), want)
                and (fwd.head[2 * hosts * per_host:] >= 0).all()):
            return None
        switch_edges = edges - hosts * per_host
        # plane p's copy of plane 0's edge j: its id in the whole graph
        j = np.arange(edges)
        host_j = j < hosts * per_host

        def edge_map(p: int) -> np.ndarray:
            return np.where(host_j, (j // max(per_host, 1)) * per_host * planes + p * per_host + j % max(per_host, 1),
                            hosts * per_host * planes + p * switch_edges + (j - hosts * per_host))

        link_map = np.empty((planes, 2 * edges), dtype=np.int64)
        for p in range(planes):
            e = edge_map(p)
            link_map[p, 0::2], link_map[p, 1::2] = 2 * e, 2 * e + 1
        named = sorted((f"p{p}{n[2:]}", n) for p in range(planes) for n in names)   # (name, its plane-0 twin)
        all_names = [n for n, _twin in named]
        sw_index = {n: i for i, n in enumerate(all_names)}
        sw_map = np.array([[sw_index[f"p{p}{n[2:]}"] for n in names] for p in range(planes)], dtype=np.int64)
        leaf_names = set(fwd.leaves)
        all_leaves = [n for n, twin in named if twin in leaf_names]
        leaf_index = {n: i for i, n in enumerate(all_leaves)}
        leaf_map = np.array([[leaf_index[f"p{p}{n[2:]}"] for n in fwd.leaves] for p in range(planes)], dtype=np.int64)

        out = object.__new__(Network)           # not copy.copy: __getstate__ leaves the graph out
        out.__dict__.update(self.__dict__)
        n_links = 2 * edges * planes
        out.n_links = n_links
        order = np.argsort(link_map.ravel())          # whole-graph link id -> (plane, plane-0 link)
        src_link = np.tile(np.arange(2 * edges), planes)[order]
        src_plane = np.repeat(np.arange(planes), 2 * edges)[order]
        out.cap = out.cap_all = self.cap_all[src_link]
        out.delay_us = out.delay_all = self.delay_all[src_link]
        head0 = fwd.head[src_link]
        head = np.where(head0 >= 0, sw_map[src_plane, np.maximum(head0, 0)], -1)
        n_intf = self.host_leaf.shape[1]
        rails = (n_intf - 1) // planes + 1            # plane 0's interfaces: rail x planes
        # as wide as the largest port number of any link end, a host's interface numbers included
        port_link = np.full((len(all_names), max(self.port_link.shape[1], rails * planes)), -1,
                            dtype=self.port_link.dtype)
        for p in range(planes):
            on = self.port_link >= 0
            rows = np.broadcast_to(sw_map[p][:, None], self.port_link.shape)
            port_link[rows[on], np.nonzero(on)[1]] = link_map[p, self.port_link[on]]
        out.port_link = port_link
        out.sw_index = sw_index
        host_leaf = np.full((hosts, rails * planes), -1, dtype=np.int64)
        host_up, host_down = host_leaf.copy(), host_leaf.copy()
        cols = np.arange(rails) * planes
        for p in range(planes):
            for dst, src, mapped in ((host_leaf, self.host_leaf, leaf_map[p]), (host_up, self.host_up, link_map[p]),
                                     (host_down, self.host_down, link_map[p])):
                part = src[:, cols]
                dst[:, cols + p] = np.where(part >= 0, mapped[np.maximum(part, 0)], -1)
        out.host_leaf, out.host_up, out.host_down = host_leaf, host_up, host_down
        out.failed_ids = set()
        out._rank_tables = {}
        out.g = None
        out.fwd = fwd.planes_copied(all_names, all_leaves, sw_map, leaf_map, link_map, head, port_link)
        return out

    def __getstate__(self) -> dict:
        """What a cached model network keeps: arrays and names, not the graph or the compiler's index."""
        state = dict(self.__dict__)
        state.pop("g", None)
        state.pop("_edge_of", None)
        state["_rank_tables"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.g = None

    def link_at(self, switch: str, port: int) -> int:
        """The directed link id out of ``switch`` by ``port``."""
        return int(self.port_link[self.sw_index[switch], port])

    @property
    def edge_of(self) -> list[tuple[str, str, int]]:
        got = getattr(self, "_edge_of", None)
        if got is None:
            got = self._edge_of = list(self.g.edges(keys=True))
        return got

    def link_ends(self, link_id: int) -> tuple[str, str]:
        """(tail, head) of a directed link id."""
        u, v, _k = self.edge_of[link_id // 2]
        return (u, v) if link_id % 2 == 0 else (v, u)

    def leaf_reaches(self, src_leaf: str, dst_leaf: str) -> bool:
        """Whether the compiled routes lead from one leaf to another (same plane)."""
        return src_leaf == dst_leaf or self.fwd.reaches(src_leaf, dst_leaf)

    def rank_table(self, job: Job) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per rank and plane: leaf index, host up link, host down link; per rank: host id."""
        key = id(job)
        got = self._rank_tables.get(key)
        if got is not None and got[0] is job:
            return got[1]
        planes = self.s.planes
        hi = self.host_index
        host = np.fromiter((hi[h] for h, _ in job.ranks), np.int64, job.n)
        rail = np.fromiter((r for _, r in job.ranks), np.int64, job.n)
        intf = rail[:, None] * planes + np.arange(planes)[None, :]
        out = (self.host_leaf[host[:, None], intf], self.host_up[host[:, None], intf],
               self.host_down[host[:, None], intf], host)
        self._rank_tables = {key: (job, out)}
        return out


_CODE = ("model/flow.py", "model/forwarding.py", "scenario/graph.py", "scenario/spec.py", "scenario/addressing.py")


def _fingerprint(scenario: Any, entropy_values: int) -> str:
    """A cache key: the scenario's value and the source of every module the network is made by."""
    h = hashlib.sha256(repr(scenario).encode())
    h.update(str(entropy_values).encode())
    here = Path(__file__).resolve().parents[1]     # fabric/
    for name in _CODE:
        h.update((here / name).read_bytes())
    h.update(Path(compiler.__file__).read_bytes())
    return h.hexdigest()[:20]


def cache_dir() -> Path:
    """Where model networks are cached: $HPNLAB_CACHE, else ~/.cache/hpnlab."""
    return Path(os.environ.get("HPNLAB_CACHE") or Path.home() / ".cache" / "hpnlab")


def healthy_network(scenario: Any, *, entropy_values: int = ENTROPY_VALUES) -> Network:
    """The healthy fabric's model network, its ``g`` None (run_collective and make_job take the
    network instead). Several planes: plane 0's graph and routes alone, copied to the others
    (:meth:`Network.planes_copied`, the same arrays as from the whole graph at a quarter of the
    time and memory on hpn-130k); else, or where the plane is not laid out as expected, the
    whole graph."""
    was_enabled = gc.isenabled()
    gc.disable()          # millions of small dicts and no garbage: the collector would rescan them again and again
    try:
        net = None
        if scenario.kind != "fat-tree" and scenario.planes > 1:
            g = fgraph.build(scenario, planes=(0,))
            net = Network(g, entropy_values=entropy_values).planes_copied(scenario.planes)
            g.graph.pop("_controller_index", None)      # the index refers to the graph: let both go now
        if net is None:
            g = fgraph.build(scenario)
            net = Network(g, entropy_values=entropy_values)
            g.graph.pop("_controller_index", None)
        net.g = None
        net.fwd.g = None
        net.fwd.ix = None
        del g
    finally:
        if was_enabled:
            gc.enable()
    return net


def cached_network(scenario: Any, *, entropy_values: int = ENTROPY_VALUES) -> tuple[Network, bool]:
    """The healthy fabric's model network (:func:`healthy_network`), from the cache when an earlier
    run built it for the same scenario and code (building the graph and the compiler's routes is
    most of a 130k run's time), else built and cached. (network, whether it came from the cache).
    Its ``g`` is None: run_collective and make_job take the network instead."""
    path = cache_dir() / f"model-{scenario.name}-{_fingerprint(scenario, entropy_values)}.pickle"
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh), True
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError):
        pass
    net = healthy_network(scenario, entropy_values=entropy_values)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            pickle.dump(net, fh, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)
    except OSError:
        pass          # a read-only home: no cache, same results
    return net, False


# ---- max-min fair rates ---------------------------------------------------------------

def max_min_rates(flow_idx: np.ndarray, link_idx: np.ndarray, weight: np.ndarray, cap: np.ndarray,
                  n_flows: int) -> np.ndarray:
    """Max-min fair rates. Flow f puts weight w on link l for every entry (f, l, w): the link
    carries sum(w * rate_f) <= cap_l. Flows with no entries get inf.

    Progressive filling, many bottlenecks per round: a link's *share* is the rate at which it
    saturates if all its unfrozen flows rise together (residual / their weights). A link whose
    share is the least among the links its flows cross is a local bottleneck: freezing its
    flows elsewhere first could only raise the other links' shares, so progressive filling
    freezes them at exactly that share. Every round freezes the flows of every local bottleneck
    at once (exact; a few rounds where one-bottleneck-at-a-time filling took thousands).

    First, links that can never fill are left out (:func:`_slack_entries`): the max-min
    allocation is unique and a link it leaves unsaturated is nobody's bottleneck, so without
    its constraint the allocation is the same (to rounding: the rounds may group differently)."""
    rates = np.full(n_flows, np.inf)
    if not len(flow_idx):
        return rates
    w = np.asarray(weight, dtype=float)
    if (flow_idx[1:] >= flow_idx[:-1]).all():     # already grouped by flow (the callers' entries are)
        f, lk = flow_idx, link_idx
    else:
        order = np.argsort(flow_idx, kind="stable")
        f, lk, w = flow_idx[order], link_idx[order], w[order]
    # only the links the entries cross, renumbered (and again as they drain): every per-link
    # array of a round is as short as the links still shared; per-entry indices as int32 (a
    # 130k sprayed step has 9.4 million entries: half the memory of int64, the same values)
    counted = np.bincount(lk, minlength=len(cap))
    used = np.flatnonzero(counted)
    if len(used) > 0.9 * len(cap):             # nearly every link shared (a 130k sprayed step): no renumbering
        lk = lk.astype(np.int32, copy=False)   # (a link no entry crosses has load 0, share inf: never chosen)
        residual = cap.astype(float)
    else:
        local = np.zeros(len(cap), dtype=np.int32)
        local[used] = np.arange(len(used), dtype=np.int32)
        lk = local[lk]
        del local
        residual = cap[used].astype(float)
    del counted
    n_links = len(residual)
    starts = np.flatnonzero(np.r_[True, f[1:] != f[:-1]])
    counts = np.diff(np.r_[starts, len(f)])
    fid = f[starts]                               # per unfrozen flow (in flow order): its id
    owner = np.repeat(np.arange(len(starts), dtype=np.int32), counts)     # per entry: its flow's position
    positive = w > 0
    entries_then = len(lk)
    cap_used = residual.copy()
    for round_ in range(n_flows + 1):
        if not len(lk):
            break
        load = np.bincount(lk, weights=w, minlength=n_links)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 0, np.maximum(residual, 0.0) / load, np.inf)
        e_share = share[lk]
        fmin = np.minimum.reduceat(e_share, starts)           # per unfrozen flow: its least share
        # a link is a bottleneck when no flow crossing it has a smaller share elsewhere:
        # share <= min(fmin) (1 + 1e-12) over its flows, i.e. no entry with fmin (1 + 1e-12) < share
        below = (fmin * (1 + 1e-12))[owner]
        not_bottleneck = np.zeros(n_links, dtype=bool)
        not_bottleneck[lk[below < e_share]] = True
        del e_share, below
        at_bottleneck = ~not_bottleneck[lk]
        at_bottleneck &= positive
        hit = np.logical_or.reduceat(at_bottleneck, starts)   # a flow with an entry on a bottleneck
        del at_bottleneck
        if not hit.any():
            break
        rates[fid[hit]] = fmin[hit]
        frozen = np.repeat(hit, counts)
        residual -= np.bincount(lk[frozen], weights=w[frozen] * fmin[owner[frozen]], minlength=n_links)
        keep = ~frozen
        del frozen
        if round_ == 0:      # the first round's shares bound every flow's rate from below
            keep &= ~_slack_entries(lk, w, cap_used, starts, owner, fmin)
        lk, w, positive = lk[keep], w[keep], positive[keep]
        left = ~hit
        owner = (np.cumsum(left, dtype=np.int32) - 1)[owner[keep]]
        fid, counts = fid[left], counts[left]
        if round_ == 0:
            counts = np.bincount(owner, minlength=len(fid))
        starts = np.r_[0, np.cumsum(counts)[:-1]]
        if 4 * len(lk) < 3 * entries_then:          # a quarter of the entries gone: drop the drained links
            on = np.bincount(lk, minlength=n_links) > 0
            local = np.cumsum(on, dtype=np.int32) - 1
            lk, residual, n_links = local[lk], residual[on], int(on.sum())
            entries_then = len(lk)
    return rates


def max_min_path_rates(paths: np.ndarray, cap: np.ndarray, weight: float = 1.0) -> np.ndarray:
    """Max-min fair rates of flows given as paths: ``paths[h, f]`` the directed link of flow f's
    h-th hop, padded with ``len(cap)`` (no link); every flow puts ``weight`` on each of its links.
    Flows with no link get inf.

    The same progressive filling as :func:`max_min_rates` (every local bottleneck's flows frozen
    at once, a round at a time), laid out for flows of a few links each (per-flow hashing and
    adaptive routing's sub-flows: a 130k adaptive step is 4.2 million sub-flows of 4 links):
    a flow's least share is the least of a few columns rather than a segmented reduction, a
    link's flow count is kept up to date from the flows frozen (an exact integer) instead of
    summed again over every flow each round, and no link is left out (a link that can never
    fill is never a bottleneck; leaving it out saved work only in the entry layout). Equal to
    :func:`max_min_rates` to rounding (tests/unit/test_model_equivalence.py)."""
    n_flows = paths.shape[1]
    rates = np.full(n_flows, np.inf)
    if not n_flows or weight <= 0:
        return rates
    nolink = len(cap)                              # the padding: a link of its own, never shared
    flows = np.arange(n_flows)
    residual = np.r_[cap.astype(float), np.inf]
    count = np.bincount(paths.ravel(), minlength=nolink + 1)
    renumbered = n_flows
    for _round in range(n_flows + 1):
        if not paths.shape[1]:
            break
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, np.maximum(residual, 0.0) / (count * weight), np.inf)
        share[nolink] = np.inf
        e_share = share[paths]
        fmin = np.minimum.reduce(e_share, axis=0)       # per flow: its least share
        # a link is a bottleneck when no flow crossing it has a smaller share elsewhere
        not_bottleneck = np.zeros(nolink + 1, dtype=bool)
        not_bottleneck[paths[fmin * (1 + 1e-12) < e_share]] = True
        not_bottleneck[nolink] = True
        hit = ~np.logical_and.reduce(not_bottleneck[paths], axis=0)
        if not hit.any():
            break
        rates[flows[hit]] = fmin[hit]
        frozen = paths[:, hit]
        residual -= np.bincount(frozen.ravel(), weights=np.broadcast_to(weight * fmin[hit], frozen.shape).ravel(),
                                minlength=nolink + 1)
        residual[nolink] = np.inf
        count -= np.bincount(frozen.ravel(), minlength=nolink + 1)
        keep = ~hit
        paths, flows = paths[:, keep], flows[keep]
        if 4 * paths.shape[1] < renumbered and nolink > 4096:    # most flows frozen: drop the drained links
            on = count[:nolink] > 0
            n_on = int(on.sum())
            local = np.full(nolink + 1, n_on, dtype=paths.dtype)
            local[:nolink][on] = np.arange(n_on)
            paths = local[paths]
            residual = np.r_[residual[:nolink][on], np.inf]
            count = np.r_[count[:nolink][on], count[nolink]]
            nolink, renumbered = n_on, paths.shape[1]
    return rates


def path_drain_times(paths: np.ndarray, cap: np.ndarray, size_bits: np.ndarray,
                     per_link_out: list | None = None) -> np.ndarray:
    """:func:`drain_times` of flows given as paths (``paths[h, f]``, padded with ``len(cap)``):
    the same sums in the same order (flow by flow), so the same times bit for bit."""
    nolink = len(cap)
    k = paths.shape[0]
    load = np.bincount(paths.T.ravel(), weights=np.repeat(size_bits, k), minlength=nolink + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_link = np.where(load > 0, load / (np.r_[cap, np.inf] * 1e9), 0.0)
    per_link[nolink] = 0.0
    if per_link_out is not None:
        per_link_out.append(per_link[:nolink])
    return np.maximum.reduce(per_link[paths], axis=0)


def _slack_entries(lk: np.ndarray, w: np.ndarray, cap: np.ndarray, starts: np.ndarray, owner: np.ndarray,
                   lb: np.ndarray) -> np.ndarray:
    """Per entry (grouped by flow, ``starts``/``owner``): whether its link can never fill,
    whatever max-min gives.

    Bounds on every flow's max-min rate: at least ``lb`` (per flow: the least
    cap / load over its links, the first round's shares: progressive filling raises every flow
    together and a link cannot fill below cap / load); at most ``ub`` = the least (cap - what
    the link's other flows take at their ``lb``) / w. A link whose flows at their ``ub`` sum to
    less than its capacity (with a 1e-9 margin for rounding) never fills. A flow keeps every
    entry when all of its links would go (it has a bottleneck, so that cannot happen but by
    rounding)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        e_lb = lb[owner]
        take = w * e_lb
        take[~np.isfinite(e_lb)] = 0.0
        del e_lb
        others = np.bincount(lk, weights=take, minlength=len(cap))[lk]
        others -= take                                 # what the link's other flows take at their lb
        del take
        room = cap[lk]
        room -= others
        del others
        np.maximum(room, 0.0, out=room)
        positive = w > 0
        np.divide(room, w, out=room, where=positive)
        room[~positive] = np.inf
        ub = np.minimum.reduceat(room, starts)
        del room
        demand = np.bincount(lk, weights=w * ub[owner], minlength=len(cap))
    slack = (demand < cap * (1 - 1e-9))[lk]
    kept = np.add.reduceat(~slack, starts) > 0
    return slack & kept[owner]


def drain_times(flow_idx: np.ndarray, link_idx: np.ndarray, weight: np.ndarray, cap: np.ndarray,
                size_bits: np.ndarray, per_link_out: list | None = None) -> np.ndarray:
    """Completion time (s) of each flow if every link drains the bytes routed over it at full
    capacity: a flow ends when the busiest link on its path has drained. The largest of these
    is the step's makespan under any work-conserving sharing of the busiest link; the
    tests compare it with the event-driven max-min simulation (:func:`flow_times`).
    Entries must be grouped by flow (flow_idx non-decreasing)."""
    load = np.bincount(link_idx, weights=weight * size_bits[flow_idx], minlength=len(cap))
    with np.errstate(divide="ignore", invalid="ignore"):
        per_link = np.where(load > 0, load / (cap * 1e9), 0.0)
    if per_link_out is not None:            # each link's drain time, for the caller's busiest link
        per_link_out.append(per_link)
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


def make_job(g: nx.MultiGraph | None, hosts: int | list[str] | None, placement: str, seed: int,
             network: Network | None = None) -> Job:
    """The job's ranks: ``hosts`` (a count, or the host names), placed ``packed`` or ``random``.
    ``g`` may be None when ``network`` (a cached one) is given."""
    if g is not None:
        s = g.graph["scenario"]
        names = [n for n, d in g._node.items() if d["tier"] == 0]
    elif network is not None:
        s, names = network.s, network.hosts
    else:
        raise ValueError("make_job needs the fabric graph or its model network")
    if isinstance(hosts, list):
        unknown = [h for h in hosts if h not in set(names)]
        if unknown or len(hosts) < 2:
            raise UserError(f"a job needs at least 2 hosts of {s.name}; unknown: {', '.join(unknown[:3]) or 'none'}")
        return Job(ranks=[(h, r) for r in range(s.rails) for h in hosts])
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


@dataclass
class Step:
    """``multiplicity`` identical steps: ``src[i]`` sends ``nbytes[i]`` to ``dst[i]``, all at once.
    ``salt`` varies a flowlet's hash from step to step; ``scale`` > 1: a sample of a larger step
    (each pair stands for ``scale`` pairs: all-to-all above ``exact_pairs``)."""
    multiplicity: float
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    salt: int = 0
    scale: float = 1.0


def _ring_next(n: int, rails: int) -> tuple[np.ndarray, int]:
    per = n // rails
    i = np.arange(n)
    return (i // per) * per + (i % per + 1) % per, per


def steps(collective: str, job: Job, size_bytes: int, *, max_steps: int, seed: int, rails: int,
          routing: str = "flow", exact_pairs: int = EXACT_PAIRS) -> list[Step]:
    """The distinct steps of a collective, as the generators run it (:mod:`.collectives`).

    Ring collectives (all-reduce, all-gather, reduce-scatter, the broadcast chain,
    halving-doubling) run one schedule per rail over that rail's H ranks, all rails at once.
    all-reduce 2(H-1) steps of S/H; all-gather, reduce-scatter H-1 of S/H (S = the whole
    array); halving-doubling 2 log2 H steps with partners r xor d and S/2, S/4 ... then back;
    broadcast: S in 4(H-1) pieces down the chain from rank 0, piece c crossing link i at step
    c + i (pieces + H - 2 steps, every one modelled up to ``max_steps`` of them, else the
    full-chain step stands for each: an upper bound for the ramp steps). all-to-all: ONE step,
    every rank sends S/n to every other rank at once. incast: every rank S/n to rank 0.
    permutation: S from r to perm[r] (``collectives.random_perm(n, seed)``).
    With per-step hashing (``flowlet``) repeated steps get up to ``max_steps`` different salts."""
    n = job.n
    salts = max(1, max_steps) if routing == "flowlet" else 1

    def repeated(count: int, src, dst, nbytes) -> list[Step]:
        k = max(1, min(count, salts))
        return [Step(count / k, src, dst, np.full(len(src), float(nbytes)), salt=s) for s in range(k)]

    if collective in RING_COLLECTIVES:
        nxt, per = _ring_next(n, rails)
        src = np.arange(n)
        if collective == "all_reduce":
            return repeated(2 * (per - 1), src, nxt, size_bytes / per)
        if collective in ("all_gather", "reduce_scatter"):
            return repeated(per - 1, src, nxt, size_bytes / per)
        if collective == "all_reduce_hd":
            if per & (per - 1):
                raise UserError(f"halving-doubling all-reduce needs a power-of-two number of ranks per rail, got {per}")
            k = per.bit_length() - 1
            base = (src // per) * per
            out = []
            for j in range(k):                    # recursive halving: d = H/2 ... 1, S/2 ... S/H
                d = per >> (j + 1)
                out.append(Step(1, src, base + ((src - base) ^ d), np.full(n, size_bytes / (2 << j)), salt=j))
            for j in range(k):                    # recursive doubling: d = 1 ... H/2, S/H ... S/2
                d = 1 << j
                out.append(Step(1, src, base + ((src - base) ^ d), np.full(n, size_bytes / (per >> j)),
                                salt=k + j))
            return out
        # broadcast: chain ring[i] -> ring[i+1] from rank 0 of each rail, 4(H-1) pieces
        pieces = 4 * (per - 1)
        total = pieces + per - 2
        pos = src % per
        chain = pos < per - 1
        piece = size_bytes / pieces
        if total <= max_steps:
            out = []
            for s in range(total):
                active = chain & (s - pos >= 0) & (s - pos < pieces)
                out.append(Step(1, src[active], nxt[active], np.full(int(active.sum()), piece), salt=s))
            return out
        return repeated(total, src[chain], nxt[chain], piece)
    if collective == "all_to_all":
        per_pair = size_bytes / n
        pairs = n * (n - 1)
        src = np.arange(n)
        if pairs <= exact_pairs:
            off = np.arange(1, n)
            a2a_src = np.repeat(src, n - 1)
            a2a_dst = (a2a_src + np.tile(off, n)) % n
            return [Step(1, a2a_src, a2a_dst, np.full(len(a2a_src), per_pair))]
        m = max(1, exact_pairs // n)              # sampled peer offsets: every rank sends to m peers
        offs = np.sort(np.random.default_rng(seed).choice(np.arange(1, n), size=min(m, n - 1), replace=False))
        a2a_src = np.repeat(src, len(offs))
        a2a_dst = (a2a_src + np.tile(offs, n)) % n
        return [Step(1, a2a_src, a2a_dst, np.full(len(a2a_src), per_pair), scale=(n - 1) / len(offs))]
    if collective == "permutation":
        perm = np.array(random_perm(n, seed))
        return [Step(1, np.arange(n), perm, np.full(n, float(size_bytes)))]
    if collective == "incast":
        src = np.arange(1, n)
        return [Step(1, src, np.zeros(n - 1, dtype=np.int64), np.full(n - 1, size_bytes / n))]
    raise UserError(f"the model runs {', '.join(MODEL_COLLECTIVES)}; got {collective!r}")


def ranks_in_collective(collective: str, job: Job, rails: int) -> int:
    """n for the busbw factor: ranks of one rail's schedule for ring collectives, else all ranks."""
    return job.n // rails if collective in RING_COLLECTIVES else job.n


# ---- one step on the network -----------------------------------------------------------

@dataclass
class StepResult:
    time_s: float                # inf when a connection has no path: the step never completes
    latency_s: float
    flows: int                   # connections routed
    stalled: int                 # connections with no path on any plane
    hit: int
    rate_gbps_min: float         # per connection, max-min fair
    rate_gbps_mean: float
    stalled_pairs: list[tuple[int, int]] = field(default_factory=list)   # (src rank, dst rank)
    multiplicity: float = 1.0    # how many steps of the collective this one stands for
    bytes: float = 0.0           # bytes this step moves (every pair, sampled steps scaled)
    rates_gbps: np.ndarray = field(default_factory=lambda: np.zeros(0))   # per connection, max-min
    sampled: float = 1.0         # > 1: a sample, each modelled pair standing for this many
    hops: int = 0                # links on the step's longest path (host links included)
    fan_in: float = 0.0          # connections' worth of traffic on its busiest link (``corrections``)
    links: int = 0               # links its traffic crosses (``corrections``)


@dataclass
class RoutedStep:
    """A step's flows on the network. A flow is a connection (``flow``, ``flowlet``), a rank
    pair's sprayed bytes (``spray``) or one path of a pair (``adaptive``: ``conn`` maps it to
    its pair). Path flows carry ``paths`` (hops x flows: directed link ids, padded with the
    network's ``n_links``); sprayed ones their entries (flow, link, weight) grouped by flow.
    ``flow_idx``, ``link_idx`` and ``weight`` are the entries either way (made from the paths
    when first asked for: one entry of weight 1 per link of a path, flow by flow)."""
    size_bits: np.ndarray      # per flow
    latency_us: float          # the longest path's
    stalled: int
    stalled_pairs: list[tuple[int, int]]
    hit: int
    paths: np.ndarray | None = None
    nolink: int = -1           # the padding of ``paths`` (the network's n_links)
    entries: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    conn: np.ndarray | None = None
    per_flow_connections: int = 1   # connections one flow stands for (spray, adaptive: qps)
    hops: int = 0              # links on the longest live path, host links included

    def _entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.entries is None:
            assert self.paths is not None
            self.entries = _path_entries(self.paths, self.nolink)
        return self.entries

    @property
    def flow_idx(self) -> np.ndarray:
        return self._entries()[0]

    @property
    def link_idx(self) -> np.ndarray:
        return self._entries()[1]

    @property
    def weight(self) -> np.ndarray:
        return self._entries()[2]


def _pair_arrays(pairs) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(pairs, tuple) and len(pairs) == 2 and isinstance(pairs[0], np.ndarray):
        return pairs[0].astype(np.int64), pairs[1].astype(np.int64)
    arr = np.array(list(pairs), dtype=np.int64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def entropy_sports(net: Network, a, b, plane, value) -> np.ndarray:
    """The source ports (switch-read bits) of sub-flows rank a -> rank b on ``plane`` with the
    connection's entropy value number ``value`` (< ``entropy_values``): the values the RoCE
    transport binds (``routing.entropy.connection_value``, the same function)."""
    u64 = np.uint64
    shape = np.broadcast(a, b, plane, value).shape
    k = connection_value(net.entropy_space, *(np.broadcast_to(np.asarray(x, dtype=np.int64), shape).astype(u64)
                                              for x in (a, b, plane, value)))
    return with_high_bits(net, np.asarray(net.emap.low_bits(k.astype(np.int64)), dtype=np.int64), a)


def with_high_bits(net: Network, low: np.ndarray, src) -> np.ndarray:
    """Source ports: the switch-read bits ``low`` with the bits above them that rank ``src``'s
    transport sets (its first choice, ``routing.entropy.first_high``, the same function) when the
    network's switches read them (weighted mode's widened sets, :func:`weighted_network`), else 0."""
    if not getattr(net.fwd, "reads_high", False):
        return low
    return low | first_high(net.emap, low, np.asarray(src, dtype=np.int64)) << net.emap.width


def connection_planes(net: Network, a, b, conn, qps: int, moves: int = 0,
                      hash_salt: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-flow hashing of connection ``conn`` (of ``qps``) from rank a to rank b, as the RoCE
    transport does it (``routing.entropy.flow_hash`` and ``connection_path``, the same
    functions; ``hash_salt`` 0): (plane, number of the connection's entropy value on that
    plane, below ``entropy_values``), int64 arrays. ``moves``: a flowlet's moves so far."""
    u64 = np.uint64
    shape = np.broadcast(a, b, conn).shape
    a, b, conn = (np.broadcast_to(np.asarray(x, dtype=np.int64), shape).astype(u64) for x in (a, b, conn))
    h = flow_hash(a, b, u64(hash_salt))
    plane, j = connection_path(h, conn, qps, net.s.planes, net.entropy_values, moves)
    return np.asarray(plane, dtype=np.int64), np.asarray(j, dtype=np.int64)


def _paths(net: Network, leaf, up, down, a, b, plane, value, switch_latency_us: float = 0.0, *,
           sports: np.ndarray | None = None, full: bool = True,
           hops_max: int | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    """Full paths (host up link, leaf to leaf, host down link) of sub-flows (rank a -> rank b on
    ``plane`` with the connection's entropy value number ``value``, :func:`entropy_sports`):
    (links (hops, m): the directed link of each hop, padded with ``net.n_links``, as many hops
    as the longest path or ``hops_max`` + 2; live (m,); the leaf-to-leaf links alone (m, ``net.fwd.max_hops``),
    -1 padded; latency (m,): propagation delay plus ``switch_latency_us`` per switch).
    ``sports``: the sub-flows' :func:`entropy_sports`, when the caller has them; ``full=False``:
    no full paths (None)."""
    sl, dl = leaf[a, plane], leaf[b, plane]
    if sports is None:
        sports = entropy_sports(net, a, b, plane, value)
    # every sub-flow walked (vectorised per hop): at scale nearly every (leaf pair, source port)
    # is distinct, and sorting them out first cost more than the walk it saved
    mid, ok = net.fwd.walk(sl, dl, sports)
    by_hop = mid.T                                 # (max_hops, m), rows contiguous
    hops = np.zeros(len(a), dtype=np.int64)        # a walk's links come first
    delay = np.zeros(len(a))
    deepest = 0
    for on in by_hop:
        used = on >= 0
        if not used.any():
            break
        deepest += 1
        hops += used
        delay += np.where(used, net.delay_us[on], 0.0)
    u, d = up[a, plane], down[b, plane]
    links = None
    if full:
        width = (deepest if hops_max is None else hops_max) + 2
        links = np.full((width, len(a)), net.n_links, dtype=np.int64)
        links[0] = u
        links[1:deepest + 1] = np.where(by_hop[:deepest] >= 0, by_hop[:deepest], net.n_links)
        links[hops + 1, np.arange(len(a))] = d
    live = ok & (net.cap[u] > 0) & (net.cap[d] > 0)
    latency = net.delay_us[u] + delay + net.delay_us[d] + (hops + 1) * switch_latency_us
    return links, live, mid, latency


def _path_entries(paths: np.ndarray, nolink: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries (flow, link, weight 1) of flows given as paths (hops x flows, padded with
    ``nolink``), grouped by flow, each flow's links in path order."""
    by_flow = paths.T
    flows, hops = np.nonzero(by_flow != nolink)
    return flows, by_flow[flows, hops], np.ones(len(flows))


def _spray_entries(up: np.ndarray, down: np.ndarray, src: np.ndarray, dst: np.ndarray, live: np.ndarray,
                   mid: np.ndarray, planes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries (pair, link, weight) of pairs spraying evenly over their live paths (``live``, ``mid``:
    per pair, plane and value; every pair has one at least): a path's leaf-to-leaf links carry
    1/L of the pair (L its live paths); a plane's host links, shared by its n live paths, are
    one entry of weight n/L each (the same loads as one entry per path, fewer entries)."""
    m = len(src)
    if not m:                                              # every pair stalled: no entries
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    mid = mid[:, :int((mid >= 0).any(axis=0).sum())]       # the hops some walk took (walks fill from the left)
    lv = live.reshape(m, planes, -1)
    cnt = lv.sum(axis=2)                                   # (pair, plane): live paths
    total = cnt.sum(axis=1).astype(float)
    host = np.concatenate([up[src], down[dst]], axis=1)   # (pair, 2 planes)
    host = np.where(np.tile(cnt, 2) > 0, host, -1)
    inner = np.where(lv.reshape(m, -1, 1), mid.reshape(m, lv.shape[1] * lv.shape[2], -1), -1).reshape(m, -1)
    table = np.concatenate([host, inner], axis=1)
    rows, cols = np.nonzero(table >= 0)
    share = np.where(cols < 2 * planes, cnt[rows, cols % planes], 1) / total[rows]
    return rows, table[rows, cols].astype(np.int64), share


def _longest(paths: np.ndarray, nolink: int) -> int:
    """Links on the longest of these paths (hops x flows, padded with ``nolink``)."""
    return int((paths != nolink).sum(axis=0).max(initial=0))


def busiest_fan_in(r: RoutedStep, cap: np.ndarray, per_link: np.ndarray | None = None) -> float:
    """Connections' worth of traffic on the step's busiest link (its bits over its rate the most;
    ``per_link``: every link's drain time, where the caller has them): a connection on a path
    counts one there, a sprayed pair its share of the link times its connections, an adaptive
    pair's sub-flow its share of the pair (its sub-flows share it evenly)."""
    k = r.per_flow_connections
    if per_link is not None and r.conn is None and len(per_link):
        busiest = int(np.argmax(per_link))
        if r.paths is not None:
            return float(np.count_nonzero(r.paths == busiest))
        return float(r.weight[r.link_idx == busiest].sum()) * k
    if r.paths is not None:
        hops = r.paths.shape[0]
        if r.conn is None:
            share, bits = np.ones(r.paths.shape[1]), r.size_bits
        else:
            per = np.bincount(r.conn)[r.conn]
            share, bits = k / per, r.size_bits[r.conn] / per
        flat = r.paths.ravel()
        load = np.bincount(flat, weights=np.tile(bits, hops), minlength=len(cap) + 1)[:len(cap)]
        fan = np.bincount(flat, weights=np.tile(share, hops), minlength=len(cap) + 1)[:len(cap)]
    else:
        load = np.bincount(r.link_idx, weights=r.weight * r.size_bits[r.flow_idx], minlength=len(cap))
        fan = np.bincount(r.link_idx, weights=r.weight * k, minlength=len(cap))
    if not len(load):
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        per_link = np.where(load > 0, load / cap, 0.0)
    return float(fan[int(np.argmax(per_link))])


#: spraying is routed this many sub-paths at a time (a 130k permutation has 4.2 million: their walks and
#: entries made all at once held a gigabyte)
SPRAY_CHUNK_PATHS = 1 << 20


def _spray_step(net: Network, leaf: np.ndarray, up: np.ndarray, down: np.ndarray, src: np.ndarray, dst: np.ndarray,
                nbytes: np.ndarray, qps: int, switch_latency_us: float) -> RoutedStep:
    """:func:`route_step`'s sprayed pairs (no watched links), routed ``SPRAY_CHUNK_PATHS`` sub-paths
    at a time: every (plane, entropy value) path of each pair walked, then its entries
    (:func:`_spray_entries`), chunk by chunk in pair order: the same entries in the same order as
    all at once, in a fraction of the memory."""
    planes, nv = net.s.planes, net.entropy_values
    n_paths = planes * nv
    m = len(src)
    u64 = np.uint64           # the pair's values on a plane: consecutive from one offset (connection_value)
    per = max(1, SPRAY_CHUNK_PATHS // n_paths)
    dead = np.zeros(m, dtype=bool)
    lat, done, hops = 0.0, 0, 0
    fs, lks, ws = [], [], []
    j = np.tile(np.arange(n_paths), min(per, m))
    for lo in range(0, m, per):
        s_, d_ = src[lo:lo + per], dst[lo:lo + per]
        mc = len(s_)
        a, b, jc = np.repeat(s_, n_paths), np.repeat(d_, n_paths), j[:mc * n_paths]
        offset = connection_offset(net.entropy_space, s_[:, None].astype(u64), d_[:, None].astype(u64),
                                   np.arange(planes, dtype=u64)[None, :])
        k = (offset[:, :, None] + np.arange(nv, dtype=u64)) % u64(net.entropy_space)
        sports = with_high_bits(net, np.asarray(net.emap.low_bits(k.reshape(-1).astype(np.int64)), dtype=np.int64), a)
        _links, live, mid, lat_all = _paths(net, leaf, up, down, a, b, jc // nv, jc % nv, switch_latency_us,
                                            sports=sports, full=False)
        dead_c = live.reshape(mc, n_paths).sum(axis=1) == 0
        dead[lo:lo + mc] = dead_c
        ok = ~dead_c
        rows = np.repeat(ok, n_paths)
        lat = max(lat, float(lat_all[live & rows].max(initial=0.0)))
        hops = max(hops, 2 + int((mid[live] >= 0).sum(axis=1).max(initial=0)))
        f, lk, ww = _spray_entries(up[:, :planes], down[:, :planes], s_[ok], d_[ok], live[rows], mid[rows], planes)
        fs.append((f + done).astype(np.int32))         # int32: half the memory of 9.4 million entries at 130k
        lks.append(lk.astype(np.int32))
        ws.append(ww)
        done += int(ok.sum())
        del a, b, sports, live, mid, lat_all
    stalled_pairs = sorted({(int(x), int(y)) for x, y in zip(src[dead], dst[dead], strict=True)})
    entries = (np.concatenate(fs), np.concatenate(lks), np.concatenate(ws)) if fs else \
        (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0))
    return RoutedStep(nbytes[~dead] * 8, lat, int(dead.sum()) * qps, stalled_pairs, 0, entries=entries,
                      per_flow_connections=qps, hops=hops)


def route_step(net: Network, job: Job, pairs, bytes_per_pair, routing: str, qps: int,
               rnd: random.Random | int = 0, switch_latency_us: float = 0.0, watch: AbstractSet[int] = frozenset(),
               salt: int = 0) -> RoutedStep:
    """Route one step's connections (see the module docstring for the entropy policies).
    ``rnd``: the flow-hash salt (0: the RoCE transport's own hash, ``routing.entropy.flow_hash``).
    ``watch``: directed link ids whose failure is being studied; ``hit`` counts the connections
    with a path over one of them. A pair with no live path on any plane is counted and listed."""
    routing = routing_name(routing)
    seed = rnd.getrandbits(32) if isinstance(rnd, random.Random) else int(rnd)
    src, dst = _pair_arrays(pairs)
    nbytes = np.broadcast_to(np.asarray(bytes_per_pair, dtype=float), src.shape).astype(float)
    leaf, up, down, host = net.rank_table(job)
    keep = host[src] != host[dst]                 # same host: NVLink, not the network
    src, dst, nbytes = src[keep], dst[keep], nbytes[keep]
    planes, nv = net.s.planes, net.entropy_values
    n_paths = planes * nv
    watch_arr = np.fromiter(watch, dtype=np.int64) if watch else None
    if routing in ("flow", "flowlet"):
        a, b = np.repeat(src, qps), np.repeat(dst, qps)
        conn = np.tile(np.arange(qps), len(src))
        size = np.repeat(nbytes, qps) * 8 / qps
        plane, j = connection_planes(net, a, b, conn, qps, salt if routing == "flowlet" else 0, seed)
        idx = plane * nv + j
        links, live, _mid, lat_row = _paths(net, leaf, up, down, a, b, idx // nv, idx % nv, switch_latency_us,
                                            hops_max=net.fwd.max_hops)
        for t in range(1, n_paths):               # a dead path: the next live one in rotation
            bad = np.flatnonzero(~live)
            if not len(bad):
                break
            j = (idx[bad] + t) % n_paths
            lk, lv, _m, lt = _paths(net, leaf, up, down, a[bad], b[bad], j // nv, j % nv, switch_latency_us,
                                    hops_max=net.fwd.max_hops)
            links[:, bad], live[bad], lat_row[bad] = lk, lv, lt
        dead = ~live
        stalled_pairs = sorted({(int(x), int(y)) for x, y in zip(a[dead], b[dead], strict=True)})
        links, size = links[:, live], size[live]
        links = links[:int((links != net.n_links).any(axis=1).sum())]   # the hops some path takes
        hit = int(np.isin(links, watch_arr).any(axis=0).sum()) if watch_arr is not None else 0
        return RoutedStep(size, float(lat_row[live].max(initial=0.0)), int(dead.sum()), stalled_pairs, hit,
                          paths=links, nolink=net.n_links, hops=_longest(links, net.n_links))
    if routing == "spray" and watch_arr is None:
        return _spray_step(net, leaf, up, down, src, dst, nbytes, qps, switch_latency_us)
    # spray / adaptive: every (plane, entropy value) path of each pair
    m = len(src)
    a, b = np.repeat(src, n_paths), np.repeat(dst, n_paths)
    j = np.tile(np.arange(n_paths), m)
    u64 = np.uint64           # the pair's values on a plane: consecutive from one offset (connection_value)
    offset = connection_offset(net.entropy_space, src[:, None].astype(u64), dst[:, None].astype(u64),
                               np.arange(planes, dtype=u64)[None, :])
    k = (offset[:, :, None] + np.arange(nv, dtype=u64)) % u64(net.entropy_space)
    sports = with_high_bits(net, np.asarray(net.emap.low_bits(k.reshape(-1).astype(np.int64)), dtype=np.int64), a)
    links, live, mid, lat_all = _paths(net, leaf, up, down, a, b, j // nv, j % nv, switch_latency_us,
                                       sports=sports, full=routing == "adaptive" or watch_arr is not None)
    per_pair = live.reshape(m, n_paths).sum(axis=1)
    dead_pair = per_pair == 0
    stalled_pairs = sorted({(int(x), int(y)) for x, y in zip(src[dead_pair], dst[dead_pair], strict=True)})
    pair_idx = np.repeat(np.arange(m), n_paths)
    ok_pair = ~dead_pair
    renum = np.cumsum(ok_pair) - 1               # live pairs renumbered 0..
    sel = live & ok_pair[pair_idx]
    lat = float(lat_all[sel].max(initial=0.0))
    size_pair = nbytes[ok_pair] * 8
    hit = 0
    if watch_arr is not None:
        on = np.isin(links[:, sel], watch_arr).any(axis=0)
        hit = int(np.unique(renum[pair_idx[sel]][on]).size) * qps
    if routing == "spray":
        rows = np.repeat(ok_pair, n_paths)
        f, lk, ww = _spray_entries(up[:, :planes], down[:, :planes], src[ok_pair], dst[ok_pair], live[rows],
                                   mid[rows], planes)
        return RoutedStep(size_pair, lat, int(dead_pair.sum()) * qps, stalled_pairs, hit, entries=(f, lk, ww),
                          per_flow_connections=qps, hops=2 + int((mid[live] >= 0).sum(axis=1).max(initial=0)))
    assert links is not None
    return RoutedStep(size_pair, lat, int(dead_pair.sum()) * qps, stalled_pairs, hit, paths=links[:, sel],
                      nolink=net.n_links, conn=renum[pair_idx[sel]],
                      per_flow_connections=qps, hops=_longest(links[:, sel], net.n_links))


def flow_rates(r: RoutedStep, cap: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Max-min fair rates of a routed step's flows (sub-flows for adaptive routing), each pair
    standing for ``scale`` (a sampled step): :func:`max_min_path_rates` over path flows,
    :func:`max_min_rates` over sprayed entries."""
    if r.paths is not None:
        return max_min_path_rates(r.paths, cap, scale)
    return max_min_rates(r.flow_idx, r.link_idx, r.weight * scale, cap, len(r.size_bits))


def run_step(net: Network, job: Job, pairs, bytes_per_pair, routing: str, qps: int,
             rnd: random.Random | int = 0, switch_latency_us: float = 0.0, watch: AbstractSet[int] = frozenset(),
             salt: int = 0, scale: float = 1.0, rates: bool = True) -> StepResult:
    """Model one step (:func:`route_step`, then the drain time; ``adaptive``: max-min sub-flow
    rates). A stalled connection is never dropped from the timing silently: the step then never
    completes (``time_s`` inf). ``scale`` > 1: the pairs are a sample, each standing for
    ``scale`` pairs (their bytes are scaled for the link loads; rates are per real connection).
    ``rates=False``: the time only (no max-min per-connection rates, which cost the most)."""
    r = route_step(net, job, pairs, bytes_per_pair, routing, qps, rnd, switch_latency_us, watch, salt)
    flows = len(r.size_bits)
    k = r.per_flow_connections
    moved = float(r.size_bits.sum()) / 8 * scale
    if flows == 0:
        return StepResult(math.inf if r.stalled else 0.0, 0.0, 0, r.stalled, r.hit, math.inf, math.inf,
                          r.stalled_pairs, bytes=moved, sampled=scale)
    per_link: list[np.ndarray] = []
    if r.conn is None:
        if r.paths is not None:
            finish = path_drain_times(r.paths, net.cap, r.size_bits * scale, per_link)
        else:
            finish = drain_times(r.flow_idx, r.link_idx, r.weight, net.cap, r.size_bits * scale, per_link)
        span = float(finish.max())
        if not rates:
            return StepResult(math.inf if r.stalled else span + r.latency_us * 1e-6, r.latency_us * 1e-6,
                              flows * k, r.stalled, r.hit, math.nan, math.nan, r.stalled_pairs, bytes=moved,
                              sampled=scale, hops=r.hops, fan_in=busiest_fan_in(r, net.cap, per_link[0]),
                              links=int(np.count_nonzero(per_link[0])))
        conn_rates = flow_rates(r, net.cap, scale)
    else:                                         # adaptive: sub-flows max-min, a pair's rate their sum
        sub = flow_rates(r, net.cap, scale)
        conn_rates = np.bincount(r.conn, weights=sub, minlength=flows)
        span = float((r.size_bits / np.maximum(conn_rates * 1e9, 1e-30)).max())
    conn_rates = np.repeat(conn_rates / k, k) if k > 1 else conn_rates
    time_s = math.inf if r.stalled else span + r.latency_us * 1e-6
    return StepResult(time_s=time_s, latency_s=r.latency_us * 1e-6, flows=flows * k, stalled=r.stalled, hit=r.hit,
                      rate_gbps_min=float(conn_rates.min()), rate_gbps_mean=float(conn_rates.mean()),
                      stalled_pairs=r.stalled_pairs, bytes=moved, rates_gbps=conn_rates, sampled=scale,
                      hops=r.hops, fan_in=busiest_fan_in(r, net.cap, per_link[0] if per_link else None),
                      links=int(np.count_nonzero(per_link[0])) if per_link else 0)


# ---- given steps on given ranks (fidelity, htsim comparisons, studies) -------------------

def _job_of(ranks: Sequence[tuple[str, int]] | Job) -> Job:
    return ranks if isinstance(ranks, Job) else Job(ranks=[(str(h), int(r)) for h, r in ranks])


def run_steps(g: nx.MultiGraph | Network, ranks: Sequence[tuple[str, int]] | Job, steps: Sequence[Any],
              routing: str = "flow", qps: int = 4, *, seed: int = 1, switch_latency_us: float = 1.0,
              failed: set | None = None, entropy_values: int = ENTROPY_VALUES,
              hash_salt: int = 0) -> list[StepResult]:
    """Run these synchronous steps on these ranks: one :class:`StepResult` per step, in order.

    ``g``: the fabric graph (a :class:`Network` is built with ``failed`` and ``entropy_values``)
    or a network; ``ranks``: (host, rail) per rank index, or a :class:`Job`; each step a
    :class:`Step` (its salt, scale and multiplicity kept) or (rank pairs, bytes per pair).
    Hashing as in a collective: ``flow`` keeps a connection's path for every step (one
    ``hash_salt``; 0: the transport's hash), ``flowlet`` moves each connection to its plane's next
    value each step (the Step's salt, else the step's index), as the transport's flowlets do
    after the idle gap between steps. ``seed`` is unused (kept for callers).
    A step repeated exactly (same pairs, bytes and salt) is computed once."""
    net = g if isinstance(g, Network) else Network(g, failed, entropy_values=entropy_values)
    job = _job_of(ranks)
    routing = routing_name(routing)
    done: dict[tuple, StepResult] = {}
    out = []
    for i, st in enumerate(steps):
        if isinstance(st, Step):
            src, dst, nbytes, salt, scale, mult = st.src, st.dst, st.nbytes, st.salt, st.scale, st.multiplicity
        else:
            src, dst = _pair_arrays(list(st[0]))
            nbytes, salt, scale, mult = np.full(len(src), float(st[1])), i, 1.0, 1.0
        salt = salt if routing == "flowlet" else 0
        key = (np.asarray(src).tobytes(), np.asarray(dst).tobytes(), np.asarray(nbytes).tobytes(), salt, scale)
        if key not in done:
            done[key] = run_step(net, job, (np.asarray(src), np.asarray(dst)), nbytes, routing, qps, hash_salt,
                                 switch_latency_us, salt=salt, scale=scale)
        out.append(replace(done[key], multiplicity=mult))
    return out


def step_link_bytes(net: Network, ranks: Sequence[tuple[str, int]] | Job, pairs, bytes_per_pair, routing: str,
                    qps: int, *, seed: int = 1, salt: int = 0, hash_salt: int = 0) -> np.ndarray:
    """The bytes one step puts on every directed link (index: link id, ``net.link_ends`` names
    it), routed as :func:`run_steps` routes it. ``adaptive``: a pair's bytes split over its
    paths in proportion to their max-min sub-flow rates (what its rates, held for the step, carry)."""
    job = _job_of(ranks)
    routing = routing_name(routing)
    r = route_step(net, job, pairs, bytes_per_pair, routing, qps, hash_salt,
                   salt=salt if routing == "flowlet" else 0)
    if r.conn is None:
        bits = r.weight * r.size_bits[r.flow_idx]
    else:
        sub = flow_rates(r, net.cap)
        pair_rate = np.bincount(r.conn, weights=sub, minlength=len(r.size_bits))
        sub_bits = r.size_bits[r.conn] * sub / np.maximum(pair_rate[r.conn], 1e-30)
        bits = r.weight * sub_bits[r.flow_idx]
    return np.bincount(r.link_idx, weights=bits, minlength=net.n_links) / 8


# ---- weighted switches: the controller's policy iterated over the model's own loads ----------

SWITCH_WEIGHTS = ("ecmp", "weighted")
WEIGHT_ITERATIONS = 16       # weighted mode: at most this many re-weightings before giving up on a fixed point


def weighted_network(net: Network, job: Job, step: Step, routing: str, qps: int, *, hash_salt: int = 0,
                     switch_latency_us: float = 0.0, max_iterations: int = WEIGHT_ITERATIONS,
                     params: Any = None) -> tuple[Network, dict[str, Any]]:
    """The network with weighted switches (``--routing-weights weighted``) at the fixed point of
    their policy on this step's own loads: the controller's decision (``controller.weights.Weights``,
    the same code) is fed, as one telemetry interval each, the utilisation of every port of every
    multipath set that the model gives for ``step`` routed with ``routing``; the sets it re-weights
    are re-dealt (``Forwarding.reweight``: each pattern of the widened sets, ``compiler.weighted_masks``,
    to the port the new assignment names) and the step is routed again, until an interval changes
    nothing (the fixed point) or ``max_iterations`` intervals. The clock advances past the policy's
    hold time between intervals. Returns (network, {iterations, converged, sets, changes}).
    With equal loads nothing changes: the widened sets deal every source port as ecmp does."""
    # the model's intervals are noiseless steady states: the controller's persistence and slow smoothing
    # (which keep bursty queues from re-weighting an emulated fabric) would only delay the fixed point
    params = params or cw.WeightParams(ewma=0.5, persist=1)
    wnet = copy.copy(net)
    wnet.fwd = fwd = copy.copy(net.fwd)
    fwd.wide, fwd.assignments = {}, {}
    rows = fwd.weighted_sets(compiler.weighted_masks(net.emap))
    sets: dict[str, dict[int, Any]] = {}
    dead: dict[str, list[int]] = {}
    for r, (sw, full, wide) in rows.items():
        n, bits = len(full), int(fwd.row_mask[r]).bit_length()
        base = tuple(full[(p & ((1 << bits) - 1)) % n] for p in range(1 << bin(wide).count("1")))
        sets.setdefault(sw, {})[r] = compiler.EntropySet(r, wide, full, tuple(() for _ in full), base)
        links = fwd.sets[r][3]
        dead.setdefault(sw, []).extend(p for p, lk in zip(full, links.tolist(), strict=True) if lk < 0)
    policy = cw.Weights(params)
    now, changed, iterations, converged = 0.0, 0, 0, not sets
    while sets and iterations < max_iterations:
        iterations += 1
        res = run_step(wnet, job, (step.src, step.dst), step.nbytes, routing, qps, hash_salt, switch_latency_us,
                       salt=step.salt, scale=step.scale, rates=False)
        link_bytes = step_link_bytes(wnet, job, (step.src, step.dst), step.nbytes, routing, qps, salt=step.salt,
                                     hash_salt=hash_salt) * step.scale
        span = res.time_s if math.isfinite(res.time_s) and res.time_s > 0 else 1.0
        samples = {}
        for sw, by_meta in sets.items():
            si = fwd.sw_index[sw]
            for es in by_meta.values():
                for port in es.ports:
                    lk = int(fwd.port_link[si, port])
                    rate = float(net.cap[lk]) * 1e9
                    tx = float(link_bytes[lk]) * 8 / span
                    samples[sw, port] = PortTelemetry(t=now, rate_bps=rate, tx_bps=tx,
                                                      utilisation=tx / rate if rate > 0 else 0.0)
        changes = policy.decide(now, samples, sets, dead)
        if not changes:
            converged = True
            break
        changed += len(changes)
        fwd.reweight({c.meta: c.assignment for c in changes})
        now += params.hold_s + 1.0
    return wnet, {"iterations": iterations, "converged": converged, "sets": sum(len(v) for v in sets.values()),
                  "changes": changed}


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
    steps_distinct: int        # distinct steps the collective has
    steps_total: float
    detail: dict[str, Any] = field(default_factory=dict)
    stalled_pairs: list[tuple[tuple[str, int], tuple[str, int]]] = field(default_factory=list)
    """Rank pairs ((host, rail) -> (host, rail)) with a stalled connection, each listed once."""
    steps: list[StepResult] = field(default_factory=list)
    """Every distinct step modelled, with its multiplicity, bytes, time and per-connection rates."""
    rate_gbps_mean: float = 0.0     # per connection, max-min, over every step (weighted by multiplicity)
    rate_gbps_min: float = 0.0      # the lowest connection rate of any step
    sampling_error: float = 0.0     # relative standard error of time_s when a step is sampled (else 0)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON): per-connection rate arrays summarised as min / mean / max."""
        out = {k: v for k, v in self.__dict__.items() if k != "steps"}
        out["steps"] = [{k: v for k, v in s.__dict__.items() if k != "rates_gbps"}
                        | {"rates_gbps_max": float(s.rates_gbps.max()) if len(s.rates_gbps) else 0.0}
                        for s in self.steps]
        return out


def _checked(routing: str, qps: int, size_bytes: int, collective: str) -> tuple[str, str]:
    routing = routing_name(routing)
    if qps < 1:
        raise UserError(f"--qps must be at least 1, got {qps}")
    if size_bytes <= 0:
        raise UserError(f"size must be positive, got {size_bytes}")
    collective = canonical(collective)
    if collective not in MODEL_COLLECTIVES:
        raise UserError(f"the model runs {', '.join(MODEL_COLLECTIVES)}; got {collective!r}")
    return routing, collective


def run_collective(g: nx.MultiGraph | None, collective: str, size_bytes: int, *, routing: str = "flow",
                   hosts: int | list[str] | None = None, placement: str = "packed", qps: int = 4, seed: int = 1,
                   failed: set | None = None, max_steps: int = 16, switch_latency_us: float = 1.0,
                   network: Network | None = None, watch: AbstractSet[int] = frozenset(),
                   exact_pairs: int = EXACT_PAIRS, job: Job | None = None,
                   entropy_values: int = ENTROPY_VALUES, hash_salt: int = 0, switch_weights: str = "ecmp",
                   weight_iterations: int = WEIGHT_ITERATIONS) -> ModelResult:
    """Model one collective. ``routing``: flow (= ecmp), flowlet, spray or adaptive; ``max_steps``:
    distinct steps computed where a collective repeats one (flowlet salts, broadcast);
    ``exact_pairs``: all-to-all is sampled above this many rank pairs (the error is stated);
    ``seed``: the placement, the permutation and the all-to-all sample; ``hash_salt``: the flow
    hash's salt (0, the default: the RoCE transport's own per-connection planes and values);
    ``switch_weights``: ecmp (equal shares) or weighted (the controller's load-following weights at
    their fixed point on the collective's first step, :func:`weighted_network`)."""
    routing, collective = _checked(routing, qps, size_bytes, collective)
    if switch_weights not in SWITCH_WEIGHTS:
        raise UserError(f"switch weights must be one of {', '.join(SWITCH_WEIGHTS)}, got {switch_weights!r}")
    if network is None:
        if g is None:
            raise ValueError("run_collective needs the fabric graph or its model network")
        network = Network(g, failed, entropy_values=entropy_values)
    net = network
    s = net.s
    job = job or make_job(g, hosts, placement, seed, network=net)
    distinct = steps(collective, job, size_bytes, max_steps=max_steps, seed=seed, rails=s.rails,
                     routing=routing, exact_pairs=exact_pairs)
    weighting = None
    if switch_weights == "weighted" and distinct:
        net, weighting = weighted_network(net, job, distinct[0], routing, qps, hash_salt=hash_salt,
                                          switch_latency_us=switch_latency_us, max_iterations=weight_iterations)
    results = [run_step(net, job, (st.src, st.dst), st.nbytes, routing, qps, hash_salt, switch_latency_us, watch,
                        salt=st.salt, scale=st.scale) for st in distinct]
    error = 0.0
    if distinct and distinct[0].scale > 1:     # a sampled all-to-all: the error from independent samples
        more = [run_step(net, job, (x.src, x.dst), x.nbytes, routing, qps, hash_salt, switch_latency_us, watch,
                         scale=x.scale, rates=routing == "adaptive")
                for k in (1, 2, 3)
                for x in steps(collective, job, size_bytes, max_steps=max_steps, seed=seed + k, rails=s.rails,
                               routing=routing, exact_pairs=exact_pairs)]
        times = np.array([r.time_s for r in results + more])
        error = float(times.std(ddof=1) / math.sqrt(len(times)) / times.mean()) if np.isfinite(times).all() else 0.0
    total = sum(st.multiplicity * r.time_s for st, r in zip(distinct, results, strict=True))
    for st, r in zip(distinct, results, strict=True):
        r.multiplicity = st.multiplicity
    n_steps = sum(st.multiplicity for st in distinct)
    stalled = sum(r.stalled for r in results)
    hits = results[0].hit if results else 0      # a failure at the start hits the first step's connections
    stalled_pairs: dict[tuple, None] = {}
    for r in results:
        for a, b in r.stalled_pairs:
            stalled_pairs[job.ranks[a], job.ranks[b]] = None
    n = ranks_in_collective(collective, job, s.rails)
    algbw = size_bytes / total / 1e9 if total > 0 else math.inf     # 0 when a connection stalled
    busbw = algbw * busbw_factor(collective, n)
    nic_gbps = s.planes * s.host_rate_gbps     # one NIC: a port in every plane
    line = nic_gbps / 8                        # GB/s
    routed = [r for r in results if r.flows]
    weights = np.array([r.multiplicity * r.flows for r in routed])
    mean = float(np.dot(weights, [r.rate_gbps_mean for r in routed]) / weights.sum()) if routed else 0.0
    details = [{"multiplicity": r.multiplicity, "time_us": r.time_s * 1e6, "latency_us": r.latency_s * 1e6,
                "flows": r.flows, "rate_gbps_min": r.rate_gbps_min, "rate_gbps_mean": r.rate_gbps_mean}
               for r in results]
    return ModelResult(collective=collective, routing=routing, ranks=job.n, size_bytes=size_bytes, time_s=total,
                       algbw_gbs=algbw, busbw_gbs=busbw, nic_gbps=nic_gbps, efficiency=busbw / line,
                       stalled_connections=stalled, steps_modelled=len(results),
                       steps_distinct=len(distinct), steps_total=n_steps,
                       detail={"steps": details[:4], "qps": qps, "placement": placement,
                               "hosts": len({h for h, _ in job.ranks}), "connections_on_watched_links": hits,
                               "entropy_values": net.entropy_values, "switch_weights": switch_weights,
                               "weighting": weighting},
                       stalled_pairs=list(stalled_pairs), steps=results, rate_gbps_mean=mean,
                       rate_gbps_min=min((r.rate_gbps_min for r in routed), default=0.0), sampling_error=error)


@dataclass
class JobSpec:
    """One job of several sharing the fabric: a collective on a set of hosts, with its routing.
    ``background``: elephant flows that run for the whole of every other job's steps."""
    collective: str
    size_bytes: int
    hosts: list[str]
    routing: str = "flow"
    qps: int = 4
    background: bool = False


def mix_jobs(g: nx.MultiGraph, jobs: Sequence[Any], background: Sequence[Any] = (), *, routing: str = "flow",
             qps: int = 4, default_size: int, placement: str = "packed", seed: int = 1) -> list[JobSpec]:
    """The ``--jobs`` (and ``--background``) items of ``hpnlab.fabric.workload.jobspec`` -- the syntax
    ``hpnlab run --jobs`` takes -- as the model's jobs on disjoint hosts, in order: ``ranks``
    counts ranks as the model does (every rail of a host is a rank), so a job takes
    ranks / rails hosts (2 hosts without ``ranks``); ``size`` (one size per job) or ``msg`` (incast: msg x ranks) its
    bytes, else ``default_size``. Hosts are taken in the fabric's order (``packed``) or a
    seeded random order (``random``); a job with ``on=`` takes the first hosts of the job it names
    instead. The emulator's ``iters`` and ``warmup`` change nothing
    here (the model times one iteration); ``gap``, ``after`` and ``root`` would, and are refused."""
    s = g.graph["scenario"]
    names = [n for n, d in g._node.items() if d["tier"] == 0]
    if placement == "random":
        names = random.Random(seed).sample(names, len(names))
    elif placement != "packed":
        raise UserError(f"placement must be packed or random, got {placement!r}")
    out: list[JobSpec] = []
    taken = 0
    for flag, specs, is_bg in (("--jobs", jobs, False), ("--background", background, True)):
        for k, spec in enumerate(specs, 1):
            where = f"{flag}: job {k} ({spec.describe()})"
            if spec.gap_s:
                raise UserError(f"{where}: gap is the emulator's pause between iterations; the model times one "
                                f"iteration with every job at once")
            if spec.after_s:
                raise UserError(f"{where}: after is the emulator's start delay; the model times one iteration "
                                f"with every job at once")
            if spec.root:
                raise UserError(f"{where}: the model's rooted collectives use rank 0 as the root")
            if spec.sizes is not None and spec.msg_bytes is None and len(spec.sizes) > 1:
                raise UserError(f"{where}: one size per job in the model")
            ranks = spec.ranks if spec.ranks is not None else 2 * s.rails
            if ranks % s.rails:
                raise UserError(f"{where}: ranks={ranks} is not a whole number of hosts "
                                f"({s.rails} rail(s), a rank on each, per host)")
            nhosts = ranks // s.rails
            if nhosts < 2:
                raise UserError(f"{where}: a job needs at least 2 hosts ({2 * s.rails} ranks)")
            [size] = spec.sizes_for(ranks, (default_size,))
            if spec.on is not None:          # on the hosts of an earlier job: their links shared
                if is_bg:
                    raise UserError(f"{where}: on= is for --jobs; a background job takes hosts of its own")
                shared = out[spec.on].hosts
                if nhosts > len(shared):
                    raise UserError(f"{where}: {nhosts} hosts on job {spec.on + 1}'s {len(shared)}")
                out.append(JobSpec(spec.collective, size, shared[:nhosts], routing, qps, is_bg))
                continue
            if taken + nhosts > len(names):
                raise UserError(f"{where}: the jobs need more than the {len(names)} hosts of {s.name}")
            out.append(JobSpec(spec.collective, size, names[taken:taken + nhosts], routing, qps, is_bg))
            taken += nhosts
    if not any(not j.background for j in out):
        raise UserError("--jobs: no job to time (every job given is background)")
    return out


def run_jobs(g: nx.MultiGraph, jobs: list[JobSpec], *, seed: int = 1, failed: set | None = None,
             max_steps: int = 16, switch_latency_us: float = 1.0, network: Network | None = None,
             exact_pairs: int = EXACT_PAIRS, hash_salt: int = 0) -> list[ModelResult]:
    """Several jobs at once, each with its own ranks, collective and routing, plus background
    traffic. Each step of a job is modelled with the first (steady) step of every other job
    and every background job on the fabric at the same time (jobs of different lengths
    overlap in their steady state: an approximation that is exact for jobs whose steps all
    look alike, the ring and single-step collectives). The others hold their max-min share of
    every link for the whole of the step, and the job's flows drain over what is left; its time
    is its own steps' makespans (the others' flows are not timed)."""
    net = network or Network(g, failed)
    s = g.graph["scenario"]
    if not jobs:
        raise UserError("run_jobs needs at least one job")
    specs = []
    ranks: list[tuple[str, int]] = []
    for spec in jobs:
        routing, collective = _checked(spec.routing, spec.qps, spec.size_bytes, spec.collective)
        job = make_job(g, list(spec.hosts), "packed", seed)
        st = steps(collective, job, spec.size_bytes, max_steps=max_steps, seed=seed, rails=s.rails,
                   routing=routing, exact_pairs=exact_pairs)
        specs.append((spec, routing, collective, job, st, len(ranks)))
        ranks += job.ranks
    union = Job(ranks=ranks)
    out = []
    for i, (spec, routing, collective, job, st, base) in enumerate(specs):
        if spec.background:
            continue
        results = []
        for x in st:
            parts = [(x, routing, spec.qps, base, True)]
            for k, (o, o_routing, _c, _j, o_steps, o_base) in enumerate(specs):
                if k != i:
                    parts.append((o_steps[0], o_routing, o.qps, o_base, False))
            results.append(_shared_step(net, union, parts, hash_salt, switch_latency_us))
        total = sum(x.multiplicity * r.time_s for x, r in zip(st, results, strict=True))
        for x, r in zip(st, results, strict=True):
            r.multiplicity = x.multiplicity
        n = ranks_in_collective(collective, job, s.rails)
        algbw = spec.size_bytes / total / 1e9 if total > 0 else math.inf
        busbw = algbw * busbw_factor(collective, n)
        nic_gbps = s.planes * s.host_rate_gbps
        routed = [r for r in results if r.flows]
        weights = np.array([r.multiplicity * r.flows for r in routed])
        mean = float(np.dot(weights, [r.rate_gbps_mean for r in routed]) / weights.sum()) if routed else 0.0
        out.append(ModelResult(collective=collective, routing=routing, ranks=job.n, size_bytes=spec.size_bytes,
                               time_s=total, algbw_gbs=algbw, busbw_gbs=busbw, nic_gbps=nic_gbps,
                               efficiency=busbw / (nic_gbps / 8), stalled_connections=sum(r.stalled for r in results),
                               steps_modelled=len(results), steps_distinct=len(st),
                               steps_total=sum(x.multiplicity for x in st),
                               detail={"job": i, "hosts": len(spec.hosts), "qps": spec.qps,
                                       "shared_with": len(specs) - 1},
                               steps=results, rate_gbps_mean=mean,
                               rate_gbps_min=min((r.rate_gbps_min for r in routed), default=0.0)))
    return out


def _shared_step(net: Network, union: Job, parts: list, seed: int, switch_latency_us: float) -> StepResult:
    """One step of several jobs' flows on the network at once; timed for the flows marked ``mine``
    as :func:`run_step` times them: flows by their busiest link's drain, adaptive sub-flows by
    their max-min rates (on what the others leave), a pair's rate their sum."""
    routed = []
    for x, routing, qps, base, mine in parts:
        r = route_step(net, union, (x.src + base, x.dst + base), x.nbytes, routing, qps, seed, switch_latency_us,
                       salt=x.salt)
        routed.append((r, mine, x.scale))
    f_all, l_all, w_all, sizes, owner_mine = [], [], [], [], []
    offset = 0
    lat = 0.0
    stalled, stalled_pairs = 0, []
    mine_r, mine_at, mine_n = None, 0, 0
    for r, mine, scale in routed:
        n = len(r.size_bits) if r.conn is None else len(r.conn)
        f_all.append(r.flow_idx + offset)
        l_all.append(r.link_idx)
        w_all.append(r.weight * scale)
        if r.conn is None:
            sizes.append(r.size_bits * scale)
        else:                         # adaptive sub-flows: the pair's bytes split over its paths evenly
            per = np.bincount(r.conn)
            sizes.append(r.size_bits[r.conn] / per[r.conn] * scale)
        owner_mine.append(np.full(n, mine))
        offset += n
        if mine:
            lat, stalled, stalled_pairs = r.latency_us, r.stalled, r.stalled_pairs
            mine_r, mine_at, mine_n = r, offset - n, n
    f, lk, w = np.concatenate(f_all), np.concatenate(l_all), np.concatenate(w_all)
    size, mine_mask = np.concatenate(sizes), np.concatenate(owner_mine)
    all_rates = max_min_rates(f, lk, w, net.cap, offset)
    # the other jobs keep running through this step: each holds its max-min share of every link
    # it crosses, and this job's flows drain over what is left (the others' bytes are not
    # drained: an elephant beside a short step slows it by its share, not by its size)
    theirs = ~mine_mask[f]
    held = np.bincount(lk[theirs], weights=w[theirs] * all_rates[f[theirs]], minlength=len(net.cap))
    left = np.maximum(net.cap - held, net.cap * 1e-9)
    ours = ~theirs
    finish = np.zeros(offset)
    rates = all_rates[mine_mask]
    if ours.any():
        ids = f[ours]
        if mine_r is None or mine_r.conn is None:
            first = ids[np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])]
            finish[first] = drain_times(ids, lk[ours], w[ours], left, size)
        else:                         # adaptive, as run_step: sub-flows max-min, a pair's rate their sum
            sub = max_min_rates(ids - mine_at, lk[ours], w[ours], left, mine_n)
            rates = np.bincount(mine_r.conn, weights=sub, minlength=len(mine_r.size_bits))
            pair_s = mine_r.size_bits / np.maximum(rates * 1e9, 1e-30)
            finish[mine_at:mine_at + mine_n] = pair_s[mine_r.conn]
    flows = int(mine_mask.sum())
    if flows == 0:
        return StepResult(math.inf if stalled else 0.0, 0.0, 0, stalled, 0, math.inf, math.inf, stalled_pairs)
    if mine_r is not None and mine_r.per_flow_connections > 1:     # per connection, as run_step's rates
        k = mine_r.per_flow_connections
        rates = np.repeat(rates / k, k)
    flows = len(rates)
    time_s = math.inf if stalled else float(finish[mine_mask].max()) + lat * 1e-6
    return StepResult(time_s=time_s, latency_s=lat * 1e-6, flows=flows, stalled=stalled, hit=0,
                      rate_gbps_min=float(rates.min()), rate_gbps_mean=float(rates.mean()),
                      stalled_pairs=stalled_pairs, bytes=float(size[mine_mask].sum()) / 8, rates_gbps=rates)


def random_fabric_links(g: nx.MultiGraph, count: int, seed: int) -> set[tuple[str, str, int]]:
    links = [(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] == "fabric"]
    if count > len(links):
        raise UserError(f"--fail-links {count}: the fabric has only {len(links)} leaf-spine links")
    return set(random.Random(seed).sample(links, count))


#: The failover chain's times per mode (ms): (detection: from the failure until the switch next to
#: it moves the failed link's traffic to its fast-failover backups, or, without backups, until the
#: routes converge; convergence: from the failure until every switch has the routes for the failed
#: fabric). Defaults when no failover comparison's JSON is given (``--failover-times``): local
#: detection 1 ms (DPFR-style data-plane detection, China Mobile's report); the controller alone
#: 50 ms to learn of it (one BFD detection time) and 2,000 ms to converge (control-plane
#: convergence in seconds, as the field reports); remote notification converges the switches
#: upstream in 50 ms (tens of ms: 24.5 ms measured on the emulated mini-hpn, README "Benchmarks").
#: The host side adds nothing for a fabric link (its timers are slower than the switch's backups;
#: it matters for a host's own NIC port, which the model does not fail).
FAILOVER_CHAIN_MS = {"controller": (50.0, 2000.0), "local": (1.0, 2000.0), "local+remote": (1.0, 50.0),
                     "local+remote+host": (1.0, 50.0)}
#: modes without the switches' fast-failover backups: the failed link's traffic is lost until convergence
NO_BACKUPS = frozenset({"controller"})


def failover_chain(g: nx.MultiGraph, collective: str, size_bytes: int, failed: set, *,
                   times: dict[str, tuple[float, float]] | None = None, **kw) -> dict[str, Any]:
    """Links failing at the start of a collective, per failover mode, as a chain of three phases:

    1. detection (``times[mode][0]`` ms, or until convergence for a mode without backups): the
       failed links' traffic is lost; the synchronous collective makes no progress (its step
       cannot finish without the connections that crossed them);
    2. detour, until convergence (``times[mode][1]`` ms): the switches' fast-failover groups carry
       it over their backups, the healthy routes with the failed ports dead (the compiler's groups,
       :class:`.model_forwarding.Forwarding` with ``converged=False``; tests/unit/test_model_failover.py
       holds those paths, bounced detours included, against the table interpreter), the
       collective progressing at that forwarding's pace; a connection the backups cannot carry
       (dropped by the tables) takes its next live path, as the transport moves it;
    3. converged: the compiler's routes for the failed fabric, for the rest of the work.

    Time = detection + the detour's share + the rest at the converged pace. No connection on a
    failed link: the healthy time. Returns per mode its phases and time, beside the three
    forwardings' own times (``healthy_s``, ``detour_s``, ``after_repair_s``)."""
    times = FAILOVER_CHAIN_MS if times is None else times
    ev = kw.get("entropy_values", ENTROPY_VALUES)
    watch = Network(g, failed, entropy_values=ev).failed_ids
    healthy = run_collective(g, collective, size_bytes, watch=watch, **kw)
    detour = run_collective(g, collective, size_bytes, network=Network(g, failed, entropy_values=ev,
                                                                      converged=False), **kw)
    after = run_collective(g, collective, size_bytes, failed=failed, **kw)
    hit = healthy.detail["connections_on_watched_links"]
    out: dict[str, Any] = {"healthy_s": healthy.time_s, "detour_s": detour.time_s, "after_repair_s": after.time_s,
                           "stalled_after_repair": after.stalled_connections, "connections_hit": hit,
                           "detour_rate_gbps_mean": detour.rate_gbps_mean, "detour_rate_gbps_min": detour.rate_gbps_min,
                           "by_mode": {}}
    for mode, (detect_ms, converge_ms) in times.items():
        converge_s = max(detect_ms, converge_ms) / 1e3
        if not hit:
            loss_s, window_s = 0.0, 0.0
        elif mode in NO_BACKUPS:
            loss_s, window_s = converge_s, 0.0
        else:
            loss_s, window_s = detect_ms / 1e3, converge_s - detect_ms / 1e3
        if not hit:
            in_detour, done = 0.0, 0.0
        elif math.isfinite(detour.time_s) and detour.time_s > 0:
            in_detour = min(window_s, detour.time_s)
            done = in_detour / detour.time_s
        else:                      # the detour carries nothing: the collective waits for convergence
            in_detour, done = window_s, 0.0
        total = healthy.time_s if not hit else loss_s + in_detour + (1 - done) * after.time_s
        out["by_mode"][mode] = {"detect_ms": detect_ms, "converge_ms": converge_ms, "loss_ms": loss_s * 1e3,
                                "detour_ms": in_detour * 1e3, "detour_share": done, "time_s": total,
                                "slowdown": total / healthy.time_s}
    return out


def failure_impact(g: nx.MultiGraph, collective: str, size_bytes: int, failed: set, *,
                   detect_ms: dict[str, float] | None = None, **kw) -> dict[str, Any]:
    """Collective time with links failing at its start, per failover mode (``detect_ms``: mode ->
    detection + convergence ms; default :data:`FAILOVER_DEFAULT_MS`, or a failover benchmark's
    measured loss windows): if any connection's path crosses a failed link, the synchronous
    collective stalls until the failure is handled, then runs on the compiler's routes for the
    failed fabric. Connections those routes cannot carry are reported (``stalled_after_repair``);
    the collective then never completes (inf)."""
    detect_ms = FAILOVER_DEFAULT_MS if detect_ms is None else detect_ms
    watch = Network(g, failed, entropy_values=kw.get("entropy_values", ENTROPY_VALUES)).failed_ids
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
