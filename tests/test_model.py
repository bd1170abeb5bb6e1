"""The flow-level model: fairness, its drain-time estimate vs exact fluid simulation, routing,
failures and latency (pure, no root)."""
import random

import numpy as np
import pytest

from hpnlab.fabric import graph, model, spec
from hpnlab.fabric.errors import UserError


def fabric(name, **over):
    return graph.build(spec.load(name, over))


def test_max_min_shares_a_link_equally_and_gives_the_rest_to_the_unconstrained_flow():
    # flows 0 and 1 share link 0 (cap 10); flow 1 also crosses link 1 (cap 2); flow 2 only link 1.
    f = np.array([0, 1, 1, 2])
    l = np.array([0, 0, 1, 1])
    rates = model.max_min_rates(f, l, np.ones(4), np.array([10.0, 2.0]), 3)
    assert rates == pytest.approx([9.0, 1.0, 1.0])


def test_weighted_entries_split_a_flow_over_parallel_links():
    # one flow sprayed half/half over two links of 5 -> rate 10
    rates = model.max_min_rates(np.array([0, 0]), np.array([0, 1]), np.array([0.5, 0.5]),
                                np.array([5.0, 5.0]), 1)
    assert rates == pytest.approx([10.0])


def test_drain_time_estimate_matches_exact_fluid_simulation_on_a_small_fabric():
    g = fabric("mini-hpn")
    net = model.Network(g)
    job = model.make_job(g, None, "random", seed=3)
    (_, pairs, nbytes), = model.steps("permutation", job, 1 << 20, max_steps=4, seed=3, rails=1)
    rnd = random.Random(3)
    f, l, w, sizes = [], [], [], []
    for i, (src, dst) in enumerate(pairs):
        sp, dp = model._rank_ports(net, job.ranks[src]), model._rank_ports(net, job.ranks[dst])
        p = rnd.randrange(2)
        links = [sp[p][1], *net.ecmp_path(sp[p][0], dp[p][0], rnd), dp[p][2]]
        f += [i] * len(links)
        l += links
        w += [1.0] * len(links)
        sizes.append(nbytes * 8)
    args = (np.array(f), np.array(l), np.array(w), net.cap_all, np.array(sizes, dtype=float))
    exact = model.flow_times(*args, group=0.0).max()
    estimate = model.drain_times(*args).max()
    assert estimate <= exact * (1 + 1e-9)          # a lower bound of the makespan ...
    assert estimate == pytest.approx(exact, rel=0.15)  # ... and a close one


def test_spray_reaches_line_rate_on_a_non_blocking_clos():
    r = model.run_collective(fabric("mini-hpn"), "permutation", 1 << 26, routing="spray", placement="random")
    assert r.efficiency == pytest.approx(1.0, rel=0.02)


def test_spray_efficiency_is_capped_by_leaf_oversubscription():
    g = fabric("mini-hpn", spines_per_plane=1, oversubscription=None)
    r = model.run_collective(g, "permutation", 1 << 26, routing="spray", placement="random", seed=5)
    assert r.efficiency <= 0.5 + 1e-9     # 2:1 at the leaf


def test_per_flow_hashing_collides_and_loses_to_spraying():
    g = fabric("alibaba-hpn")
    net = model.Network(g)
    kw = dict(placement="random", qps=4, network=net, hosts=256)
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


def test_ring_all_reduce_busbw_uses_the_nccl_factor():
    g = fabric("mini-hpn")
    r = model.run_collective(g, "all_reduce", 1 << 24, routing="spray")
    n = 16  # one ring per rail through all 16 hosts
    assert r.busbw_gbs == pytest.approx(r.algbw_gbs * 2 * (n - 1) / n)
    assert r.steps_total == 2 * (n - 1)


@pytest.mark.parametrize("routing", model.ROUTINGS)
def test_cross_campus_steps_pay_the_long_haul_delay(routing):
    g = fabric("mini-cross-campus")
    r = model.run_collective(g, "all_to_all", 1 << 20, routing=routing, max_steps=7)
    worst = max(step["latency_us"] for step in r.detail["steps"])
    assert worst >= 100.0  # 20 km at 5 us/km


def test_failure_stalls_for_the_detection_time_and_then_runs_on_repaired_routes():
    g = fabric("mini-hpn")
    links = [(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] == "fabric"]
    out = model.failure_impact(g, "permutation", 1 << 24, set(links[:2]), routing="ecmp", qps=8,
                               placement="random", detect_ms={"dpfr": 1, "control-plane": 2000})
    assert out["connections_hit"] > 0
    fast, slow = out["by_detection"]["dpfr"], out["by_detection"]["control-plane"]
    assert slow["time_s"] - fast["time_s"] == pytest.approx(1.999)
    assert out["after_repair_s"] >= out["healthy_s"] * 0.99


def test_unreachable_routes_are_counted_not_crashed():
    g = fabric("mini-hpn")
    leaf_links = {(u, v, k) for u, v, k, d in g.edges(keys=True, data=True)
                  if d["kind"] == "fabric" and "p0l0" in (u, v)}
    r = model.run_collective(g, "permutation", 1 << 20, failed=leaf_links, qps=4, placement="packed")
    assert r.stalled_connections > 0


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
        model.run_collective(fabric("mini-hpn"), "broadcast", 1 << 20)
