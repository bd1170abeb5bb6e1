"""The flow-level model against expectations computed independently in each test (pure, no root).

* Timing: hand-computable cases — one flow on one link (time = bits / rate), N flows
  sharing a link (equal max-min shares, all finishing when the link has drained), an
  incast, a permutation and a ring on a non-blocking Clos (line rate), an oversubscribed
  leaf, and a leaf that loses half its uplinks. Each expected figure is derived in the test
  from the scenario's rates and the traffic, never from the model's own formulas.
* Routing under failure: the model's reachability against networkx connectivity of the
  failed graph (switches only: hosts do not forward) and against the valley-free oracle of
  tests/oftable.py (the controller compiler's proofs use it; read only here); stalled
  connections are counted and listed, and a step with one never completes.

Tolerance: times and rates are compared with ``rel=1e-9``. The model and the test compute
the same quantity with different floating-point operations (sums in another order), so
only rounding may differ, by a few ulps; 1e-9 is far above that and far below any modelling
difference (the smallest one these cases could show is one flow more on a link: >= 1/16).
"""
from __future__ import annotations

import math
import random
from functools import cache
from typing import Any

import networkx as nx
import numpy as np
import pytest

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import valley_free_reachable
from hpnlab.fabric.scenario import graph, spec

EXACT: dict[str, Any] = dict(rel=1e-9)     # rounding only: see the module docstring
SIZE = 1 << 26             # bytes per rank


@cache
def fabric(name: str, **over):
    return graph.build(spec.load(name, over))


def fabric_links(g) -> list[tuple[str, str, int]]:
    return [(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] != "host"]


def links_between(g, a: str, b: str) -> set[tuple[str, str, int]]:
    return {(u, v, k) for u, v, k in fabric_links(g) if {u, v} == {a, b}}


def uplinks(g, leaf: str) -> set[tuple[str, str, int]]:
    return {(u, v, k) for u, v, k, d in g.edges(leaf, keys=True, data=True) if d["kind"] != "host"}


def host_rate_gbps(g) -> float:
    return g.graph["scenario"].host_rate_gbps


# ---- the oracle: connectivity of the failed graph, independent of the model ----------

def plane_graph(g, plane: int, failed: set) -> nx.Graph:
    """The switches of one plane joined by their live links (hosts do not forward)."""
    dead = {frozenset((u, v, k)) for u, v, k in failed}
    h = nx.Graph()
    h.add_nodes_from(n for n, d in g.nodes(data=True) if d["tier"] > 0 and d.get("plane", 0) == plane)
    h.add_edges_from((u, v) for u, v, k in fabric_links(g) if frozenset((u, v, k)) not in dead
                     and u in h and v in h)
    return h


def oracle_disconnected(g, failed: set, ranks: list[tuple[str, int]]) -> set[tuple]:
    """Ordered rank pairs on different hosts that no plane connects in the failed graph."""
    s = g.graph["scenario"]
    planes = {p: plane_graph(g, p, failed) for p in range(s.planes)}
    leaf = {(h, p["rail"], p["plane"]): p["leaf"] for h in graph.hosts(g) for p in graph.host_ports(g, h)}
    out = set()
    for a in ranks:
        for b in ranks:
            if a[0] == b[0]:
                continue
            if not any(nx.has_path(planes[p], leaf[(a[0], a[1], p)], leaf[(b[0], b[1], p)]) for p in range(s.planes)):
                out.add((a, b))
    return out


def leaves_by_plane(g) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for n, d in g.nodes(data=True):
        if d["tier"] == 1:
            out.setdefault(d["plane"], []).append(n)
    return out


# ---- max-min fairness and the two timing methods, by hand ----------------------------

def test_one_flow_on_one_link_takes_its_size_over_the_rate():
    bits, gbps = 8e9, 100.0
    args = (np.array([0]), np.array([0]), np.array([1.0]), np.array([gbps]))
    assert model.max_min_rates(*args, 1) == pytest.approx([gbps], **EXACT)
    assert model.drain_times(*args, np.array([bits])) == pytest.approx([bits / (gbps * 1e9)], **EXACT)
    assert model.flow_times(*args, np.array([bits]), group=0.0) == pytest.approx([bits / (gbps * 1e9)], **EXACT)


def test_n_flows_on_one_link_get_equal_shares_and_finish_when_it_has_drained():
    n, bits, gbps = 5, 1e9, 100.0
    args = (np.arange(n), np.zeros(n, dtype=int), np.ones(n), np.array([gbps]))
    assert model.max_min_rates(*args, n) == pytest.approx([gbps / n] * n, **EXACT)
    drained = n * bits / (gbps * 1e9)
    assert model.drain_times(*args, np.full(n, bits)) == pytest.approx([drained] * n, **EXACT)
    assert model.flow_times(*args, np.full(n, bits), group=0.0) == pytest.approx([drained] * n, **EXACT)


def test_a_short_flow_leaves_its_share_to_the_long_one_when_it_ends():
    # 1 Gbit and 3 Gbit on a 1 Gbit/s link: both at 0.5 until the short one ends at 2 s,
    # then the long one alone at 1 Gbit/s for its remaining 2 Gbit: ends at 4 s.
    args = (np.array([0, 1]), np.array([0, 0]), np.ones(2), np.array([1.0]), np.array([1e9, 3e9]))
    assert model.flow_times(*args, group=0.0) == pytest.approx([2.0, 4.0], **EXACT)


def test_max_min_shares_a_link_equally_and_gives_the_rest_to_the_unconstrained_flow():
    # flows 0 and 1 share link 0 (cap 10); flow 1 also crosses link 1 (cap 2); flow 2 only link 1:
    # link 1 saturates first at 1 each, then flow 0 takes the 9 left on link 0.
    rates = model.max_min_rates(np.array([0, 1, 1, 2]), np.array([0, 0, 1, 1]), np.ones(4),
                                np.array([10.0, 2.0]), 3)
    assert rates == pytest.approx([9.0, 1.0, 1.0], **EXACT)


def test_weighted_entries_split_a_flow_over_parallel_links():
    # one flow sprayed half/half over two links of 5: each link carries rate/2 <= 5 -> rate 10
    rates = model.max_min_rates(np.array([0, 0]), np.array([0, 1]), np.array([0.5, 0.5]),
                                np.array([5.0, 5.0]), 1)
    assert rates == pytest.approx([10.0], **EXACT)


def test_drain_time_never_exceeds_the_exact_fluid_makespan():
    """No schedule beats the busiest link's load / capacity, so the drain estimate is a
    lower bound of the max-min fluid makespan (how close it is: tools/bench/bench_model.py)."""
    g = fabric("mini-hpn")
    net = model.Network(g)
    job = model.make_job(g, None, "random", seed=3)
    (step,) = model.steps("permutation", job, 1 << 20, max_steps=4, seed=3, rails=1)
    r = model.route_step(net, job, (step.src, step.dst), step.nbytes, "flow", 1, 3)
    args = (r.flow_idx, r.link_idx, r.weight, net.cap, r.size_bits)
    exact = model.flow_times(*args, group=0.0).max()
    estimate = model.drain_times(*args).max()
    assert estimate <= exact * (1 + 1e-12)     # a bound, up to the rounding of the fluid simulation's sums


# ---- whole collectives, by hand ---------------------------------------------------------

@pytest.mark.parametrize("routing", model.ROUTINGS)
def test_incast_time_is_the_victims_link_draining_every_senders_bytes(routing):
    """mini-spine-leaf has one plane: every byte for rank 0 crosses its one 200G port."""
    g = fabric("mini-spine-leaf")
    s = g.graph["scenario"]
    qps = 4
    r = model.run_collective(g, "incast", SIZE, routing=routing, qps=qps, placement="packed",
                             switch_latency_us=0.0)
    ranks = len(graph.hosts(g)) * s.rails
    senders = ranks - s.rails                   # rank 0's own host uses NVLink
    per_sender = SIZE / ranks                   # incast: S/n from every rank
    assert r.time_s == pytest.approx(senders * per_sender * 8 / (host_rate_gbps(g) * 1e9), **EXACT)
    fair = host_rate_gbps(g) / (senders * qps)  # every connection gets an equal share of the port
    step = r.detail["steps"][0]
    assert (step["rate_gbps_min"], step["rate_gbps_mean"]) == pytest.approx((fair, fair), **EXACT)


def test_spray_runs_a_permutation_at_nic_line_rate_on_a_non_blocking_clos():
    """mini-hpn is 1:1: a leaf's hosts (4 x 200G per plane) can all leave over its uplinks
    (2 x 400G), so the NIC (2 planes x 200G) is the only limit."""
    g = fabric("mini-hpn")
    s = g.graph["scenario"]
    r = model.run_collective(g, "permutation", SIZE, routing="spray", placement="random",
                             switch_latency_us=0.0)
    nic_bps = s.planes * host_rate_gbps(g) * 1e9
    assert r.time_s == pytest.approx(SIZE * 8 / nic_bps, **EXACT)
    assert r.efficiency == pytest.approx(1.0, **EXACT)


def test_ring_all_reduce_on_a_non_blocking_clos_has_busbw_equal_to_the_nic_line_rate():
    """A ring of n ranks moves S/n per rank in each of 2(n-1) steps at the NIC's rate; nccl-tests'
    busbw = S/time * 2(n-1)/n is then the NIC's line rate in bytes/s."""
    g = fabric("mini-hpn")
    s = g.graph["scenario"]
    n = len(graph.hosts(g))                    # one ring per rail through every host
    nic_bps = s.planes * host_rate_gbps(g) * 1e9
    r = model.run_collective(g, "all_reduce", SIZE, routing="spray", placement="packed", switch_latency_us=0.0)
    assert r.time_s == pytest.approx(2 * (n - 1) * (SIZE / n) * 8 / nic_bps, **EXACT)
    assert r.busbw_gbs == pytest.approx(nic_bps / 8 / 1e9, **EXACT)


def _shift_job(g, shift: int) -> tuple[model.Job, list[tuple[int, int]]]:
    """Every rank (host i, rail r) sends to (host i + shift, rail r): a permutation."""
    hosts = graph.hosts(g)
    rails = g.graph["scenario"].rails
    job = model.Job(ranks=[(h, r) for r in range(rails) for h in hosts])
    n = len(hosts)
    pairs = [(r * n + i, r * n + (i + shift) % n) for r in range(rails) for i in range(n)]
    return job, pairs


def test_an_oversubscribed_leaf_caps_spray_at_its_uplink_share():
    """One spine per plane: a leaf has 4 hosts x 200G below and one 400G link above. A
    permutation that sends every rank off its leaf puts 4 flows x S/2 (per plane) on that link."""
    g = fabric("mini-hpn", spines_per_plane=1, oversubscription=None)
    s = g.graph["scenario"]
    (up,) = uplinks(g, "p0l0")
    up_gbps = g.edges[up]["rate_gbps"]
    per_leaf = s.hosts_per_segment
    job, pairs = _shift_job(g, shift=per_leaf)
    r = model.run_step(model.Network(g), job, pairs, SIZE, "spray", 4, random.Random(1), 0.0)
    expected = per_leaf * (SIZE / s.planes) * 8 / (up_gbps * 1e9)
    assert expected > SIZE / s.planes * 8 / (host_rate_gbps(g) * 1e9)   # the uplink, not the NIC, limits
    assert r.time_s == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize("routing", model.ROUTINGS)
def test_losing_half_a_leafs_uplinks_doubles_a_permutation_that_needs_them_all(routing):
    """mini-spine-leaf: each leaf has 2 hosts below and 2 x 200G uplinks. Every rank sends S to
    the same rail of a host in the other group, so each leaf sends 2 flows up and takes 2 down.
    With p0l0-p0s0 down, both of p0l0's flows share its one 200G uplink and both flows into
    p0l0 its one 200G downlink (other leaves must send them via p0s1): 2 S over 200G, twice the
    time of one S over a host's 200G port. ECMP's hashing cannot change that: after the failure
    no link carries more than 2 flows, and p0l0's last uplink carries exactly 2."""
    g = fabric("mini-spine-leaf")
    job, pairs = _shift_job(g, shift=2)
    one_flow = SIZE * 8 / (host_rate_gbps(g) * 1e9)
    failed = links_between(g, "p0l0", "p0s0")
    after = model.run_step(model.Network(g, failed), job, pairs, SIZE, routing, 4, random.Random(1), 0.0)
    assert after.stalled == 0
    assert after.time_s == pytest.approx(2 * one_flow, **EXACT)
    if routing in ("spray", "adaptive"):    # every path used: the healthy fabric runs at the ports' rate
        healthy = model.run_step(model.Network(g), job, pairs, SIZE, routing, 4, random.Random(1), 0.0)
        assert healthy.time_s == pytest.approx(one_flow, **EXACT)


@pytest.mark.parametrize("routing", model.ROUTINGS)
def test_a_failure_the_collective_does_not_need_costs_only_the_detection_time(routing):
    """Packed ring all-reduce on mini-spine-leaf: per rail, the ring h1 h2 h3 h4 crosses between
    the two groups' leaves once each way, so leaf p0l0 sends one flow up (h2 -> h3) and takes
    one down (h4 -> h1); one 200G link each way suffices. Losing p0l0-p0s0 leaves the time
    on repaired routes unchanged: the collective pays only the detection + convergence time."""
    g = fabric("mini-spine-leaf")
    qps, detect = 4, {"fast": 1.0, "slow": 2000.0}
    out = model.failure_impact(g, "all_reduce", SIZE, links_between(g, "p0l0", "p0s0"), detect_ms=detect,
                               routing=routing, qps=qps, placement="packed", switch_latency_us=0.0)
    hosts = len(graph.hosts(g))
    step = (SIZE / hosts) * 8 / (host_rate_gbps(g) * 1e9)
    assert out["healthy_s"] == pytest.approx(2 * (hosts - 1) * step, **EXACT)
    assert out["after_repair_s"] == pytest.approx(out["healthy_s"], **EXACT)
    crossing = 2 * qps        # the connections of h2 -> h3 and h4 -> h1 on rail 0
    if routing in ("spray", "adaptive"):    # every sprayed connection through p0l0 uses the failed link
        assert out["connections_hit"] == crossing
    else:                     # a hashed one only if it was hashed onto it
        assert 0 <= out["connections_hit"] <= crossing
    for name, ms in detect.items():
        expected = (ms / 1e3 if out["connections_hit"] else 0.0) + out["after_repair_s"]
        assert out["by_detection"][name]["time_s"] == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize("routing", model.ROUTINGS)
def test_cross_campus_steps_pay_the_long_haul_delay_and_every_switch_on_the_way(routing):
    """leaf, spine, core | long haul | core, spine, leaf: 6 switches and one long-haul link."""
    g = fabric("mini-cross-campus")
    (lh_delay,) = {d["delay_us"] for _, _, d in g.edges(data=True) if d["kind"] == "long-haul"}
    switch_us = 0.5
    r = model.run_collective(g, "all_to_all", 1 << 20, routing=routing, max_steps=7, switch_latency_us=switch_us)
    worst = max(step["latency_us"] for step in r.detail["steps"])
    assert worst == pytest.approx(lh_delay + 6 * switch_us, **EXACT)


# ---- routing under failure: against the oracle --------------------------------------------

SINGLE_FAILURE_PRESETS = ["mini-hpn", "small-hpn", "mini-cross-campus", "mini-rail", "fat-tree-4"]


@pytest.mark.parametrize("name", SINGLE_FAILURE_PRESETS)
def test_leaf_reachability_equals_connectivity_of_the_graph_under_every_single_link_failure(name):
    g = fabric(name)
    planes = leaves_by_plane(g)
    checked = 0
    for link in fabric_links(g):
        net = model.Network(g, {link})
        for plane, leaves in planes.items():
            h = plane_graph(g, plane, {link})
            for a in leaves:
                for b in leaves:
                    assert net.leaf_reaches(a, b) == nx.has_path(h, a, b), (link, a, b)
                    checked += 1
    assert checked == len(fabric_links(g)) * sum(len(v) ** 2 for v in planes.values())


# flowlet takes flow's paths, adaptive spray's: the two path sets cover every policy's
PATH_SETS = ("flow", "spray")


@pytest.mark.parametrize("routing", PATH_SETS)
@pytest.mark.parametrize("name", ["mini-hpn", "small-hpn"])
def test_no_connection_stalls_under_any_single_link_failure(name, routing):
    """Every rank pair (all-to-all, every step) under every single fabric-link failure: the
    failed graph still connects them all (oracle), so none may stall. (Before this was
    fixed, mini-hpn with p0l0-p0s0 down left 46 ECMP connections stalled.)"""
    g = fabric(name)
    n = len(graph.hosts(g)) * g.graph["scenario"].rails
    for link in fabric_links(g):
        r = model.run_collective(g, "all_to_all", 1 << 20, routing=routing, failed={link}, qps=4,
                                 max_steps=n, placement="packed", switch_latency_us=0.0)
        job = model.make_job(g, None, "packed", 1)
        assert oracle_disconnected(g, {link}, job.ranks) == set()
        assert (r.stalled_connections, r.stalled_pairs) == (0, []), link
        assert math.isfinite(r.time_s)


@pytest.mark.parametrize("name", ["mini-hpn", "mini-cross-campus", "fat-tree-4"])
def test_every_path_runs_over_live_links_from_leaf_to_leaf_without_revisiting_a_switch(name):
    g = fabric(name)
    planes = leaves_by_plane(g)
    for link in fabric_links(g):
        net = model.Network(g, {link})
        dead = net.failed_ids
        for leaves in planes.values():
            for a in leaves:
                for b in leaves:
                    if a == b or not net.leaf_reaches(a, b):
                        continue
                    for sport in net.fwd.sports:         # every entropy value the transport uses
                        path = net.fwd.leaf_path(a, b, sport)
                        assert path is not None
                        hops = [net.link_ends(i) for i in path]
                        assert not dead.intersection(path), (link, a, b, hops)
                        assert [u for u, _ in hops] + [hops[-1][1]] == [a, *[v for _, v in hops]], hops
                        visited = [a] + [v for _, v in hops]
                        assert len(set(visited)) == len(visited), hops


@pytest.mark.parametrize("name", ["mini-hpn", "mini-cross-campus", "fat-tree-4", "mini-rail"])
def test_reachability_under_several_failures_is_the_valley_free_oracles_and_never_claims_too_much(name):
    """With several links down the fabric may connect two leaves only through a valley (down
    to a third leaf and up again), which neither the compiler nor the model routes: the model
    must agree with the valley-free oracle, and never claim a path the graph does not have."""
    g = fabric(name)
    links = fabric_links(g)
    planes = leaves_by_plane(g)
    rnd = random.Random(11)
    for _ in range(30):
        failed = set(rnd.sample(links, 3))
        net = model.Network(g, failed)
        failures = compiler.Failures.of(failed)
        for plane, leaves in planes.items():
            h = plane_graph(g, plane, failed)
            for a in leaves:
                for b in leaves:
                    if a == b:
                        continue
                    reaches = net.leaf_reaches(a, b)
                    assert reaches == valley_free_reachable(g, failures, a, b), (failed, a, b)
                    assert not reaches or nx.has_path(h, a, b)


def test_pairs_the_failed_graph_disconnects_are_listed_as_stalled_and_the_collective_never_ends():
    """Segment 0's leaves lose every uplink in both planes: its 4 hosts reach nobody else."""
    g = fabric("mini-hpn")
    failed = uplinks(g, "p0l0") | uplinks(g, "p1l0")
    job = model.make_job(g, None, "packed", 1)
    expected = oracle_disconnected(g, failed, job.ranks)
    assert len(expected) == 2 * 4 * 12        # both directions, 4 hosts x the 12 others
    qps = 2
    for routing in model.ROUTINGS:
        r = model.run_collective(g, "all_to_all", 1 << 20, routing=routing, failed=failed, qps=qps,
                                 max_steps=job.n, placement="packed")
        assert set(r.stalled_pairs) == expected
        assert len(r.stalled_pairs) == len(expected)        # each pair listed once
        assert r.stalled_connections == qps * len(expected)
        assert r.time_s == math.inf and r.busbw_gbs == 0.0


@pytest.mark.parametrize("routing", model.ROUTINGS)
def test_a_leaf_cut_off_in_one_plane_sends_over_the_other_plane(routing):
    g = fabric("mini-hpn")
    failed = uplinks(g, "p0l0")
    job = model.make_job(g, None, "packed", 1)
    assert oracle_disconnected(g, failed, job.ranks) == set()
    r = model.run_collective(g, "all_to_all", 1 << 20, routing=routing, failed=failed, qps=4,
                             max_steps=job.n, placement="packed")
    assert (r.stalled_connections, r.stalled_pairs) == (0, [])
    assert math.isfinite(r.time_s)


def test_a_failed_host_link_moves_that_nics_connections_to_its_other_plane():
    g = fabric("mini-hpn")
    host_link = next((u, v, k) for u, v, k, d in g.edges("h1", keys=True, data=True) if d["plane"] == 0)
    r = model.run_collective(g, "all_to_all", 1 << 20, failed={host_link}, qps=4, max_steps=15, placement="packed")
    assert (r.stalled_connections, r.stalled_pairs) == (0, [])


# ---- ECMP vs spray: behaviour that holds for any hashing seed ------------------------------

def test_per_flow_hashing_collides_and_loses_to_spraying():
    g = fabric("alibaba-hpn")
    net = model.Network(g)
    kw: dict[str, Any] = dict(placement="random", qps=4, network=net, hosts=256)
    ecmp = model.run_collective(g, "permutation", 1 << 26, routing="ecmp", **kw)
    spray = model.run_collective(g, "permutation", 1 << 26, routing="spray", **kw)
    assert ecmp.busbw_gbs < spray.busbw_gbs
    assert ecmp.detail["steps"][0]["rate_gbps_min"] < spray.detail["steps"][0]["rate_gbps_min"]


def test_more_queue_pairs_reduce_the_hashing_penalty():
    g = fabric("alibaba-hpn")
    net = model.Network(g)
    few = model.run_collective(g, "permutation", 1 << 26, qps=1, network=net, hosts=256, placement="random")
    many = model.run_collective(g, "permutation", 1 << 26, qps=16, network=net, hosts=256, placement="random")
    assert many.efficiency > few.efficiency


# ---- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    ({"routing": "magic"}, "routing"),
    ({"qps": 0}, "qps"),
    ({"hosts": 1}, "hosts"),
])
def test_bad_model_arguments_raise_one_line_errors(kwargs, match):
    with pytest.raises(UserError, match=match):
        model.run_collective(fabric("mini-hpn"), "all_to_all", 1 << 20, **kwargs)


def test_unknown_collective_is_refused():
    with pytest.raises(UserError):
        model.run_collective(fabric("mini-hpn"), "gossip", 1 << 20)
