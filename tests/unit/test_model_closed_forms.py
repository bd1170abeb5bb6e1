"""The flow model against closed forms and against the generators' schedules (pure, no root).

* Balls into bins: n connections hashed per flow onto n equal uplinks. Max-min gives every
  used uplink's capacity c to the connections on it, so a trial's mean connection rate is
  c x (uplinks used) / n, whose expectation is c (1 - (1 - 1/n)^n) and whose variance is the
  occupancy variance of n balls in n bins. The mean over T independent hashings must land
  within 4 standard errors (derived from that variance) of the expectation.
* Schedules: every collective's steps in the model are the generator's (``collectives.build``),
  pair for pair and byte for byte, with the same concurrency (all-to-all: every pair in one step).
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from support.fabrics import fabric, random_sharing

from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph
from hpnlab.fabric.workload import collectives

N_UPLINKS = 4


def balls_into_bins_fabric():
    """One plane, 4 spines, 5 leaves of 4 hosts, every link 200G: leaf p0l0's 4 hosts send one
    connection each to a host on each other leaf, so only p0l0's 4 uplinks can collide."""
    return fabric("mini-hpn", planes=1, spines_per_plane=N_UPLINKS, segments_per_pod=N_UPLINKS + 1,
                  leaf_spine_rate_gbps=200)


def test_per_flow_hashing_of_n_connections_on_n_uplinks_loses_what_balls_into_bins_predict():
    g = balls_into_bins_fabric()
    net = model.Network(g)
    assert net.entropy_values % N_UPLINKS == 0      # each uplink equally likely for a uniform hash
    c = g.graph["scenario"].host_rate_gbps
    leaf_of = {h: graph.host_ports(g, h)[0]["leaf"] for h in graph.hosts(g)}
    src = [h for h in graph.hosts(g) if leaf_of[h] == "p0l0"]
    dst = [next(h for h in graph.hosts(g) if leaf_of[h] == f"p0l{i}") for i in range(1, N_UPLINKS + 1)]
    job = model.Job(ranks=[(h, 0) for h in src + dst])
    pairs = [(i, N_UPLINKS + i) for i in range(N_UPLINKS)]
    trials = 400
    means = [model.run_step(net, job, pairs, 1e6, "flow", 1, seed).rate_gbps_mean for seed in range(trials)]
    n = N_UPLINKS
    q = (1 - 1 / n) ** n
    expected = c * (1 - q)
    var_occupied = n * (n - 1) * (1 - 2 / n) ** n + n * q - (n * q) ** 2
    stderr = c / n * math.sqrt(var_occupied / trials)
    assert abs(float(np.mean(means)) - expected) <= 4 * stderr, (np.mean(means), expected, stderr)


def test_spraying_the_same_connections_loses_nothing():
    g = balls_into_bins_fabric()
    net = model.Network(g)
    c = g.graph["scenario"].host_rate_gbps
    leaf_of = {h: graph.host_ports(g, h)[0]["leaf"] for h in graph.hosts(g)}
    src = [h for h in graph.hosts(g) if leaf_of[h] == "p0l0"]
    dst = [next(h for h in graph.hosts(g) if leaf_of[h] == f"p0l{i}") for i in range(1, N_UPLINKS + 1)]
    job = model.Job(ranks=[(h, 0) for h in src + dst])
    r = model.run_step(net, job, [(i, N_UPLINKS + i) for i in range(N_UPLINKS)], 1e6, "spray", 1, 0)
    assert r.rate_gbps_min == pytest.approx(c, rel=1e-9)


@pytest.mark.parametrize("routing", ["spray", "adaptive"])
def test_a_ring_on_a_non_blocking_fabric_reaches_the_nics_line_rate(routing):
    g = fabric("mini-hpn")
    s = g.graph["scenario"]
    r = model.run_collective(g, "all_reduce", 1 << 26, routing=routing, placement="packed", switch_latency_us=0.0)
    n = len(graph.hosts(g))
    nic_bps = s.planes * s.host_rate_gbps * 1e9
    assert r.time_s == pytest.approx(2 * (n - 1) * ((1 << 26) / n) * 8 / nic_bps, rel=1e-9)
    assert r.efficiency == pytest.approx(1.0, rel=1e-9)


def test_one_connection_on_one_link_runs_at_the_links_rate():
    """mini-spine-leaf: two hosts on one leaf, one connection: only the two host links carry it."""
    g = fabric("mini-spine-leaf")
    s = g.graph["scenario"]
    hosts = graph.hosts(g)
    job = model.Job(ranks=[(hosts[0], 0), (hosts[1], 0)])
    assert graph.host_ports(g, hosts[0])[0]["leaf"] == graph.host_ports(g, hosts[1])[0]["leaf"]
    r = model.run_step(model.Network(g), job, [(0, 1)], 1e6, "flow", 1, 0)
    assert r.time_s == pytest.approx(1e6 * 8 / (s.host_rate_gbps * 1e9), rel=1e-9)
    assert r.rate_gbps_min == pytest.approx(s.host_rate_gbps, rel=1e-9)


# ---- the schedules the generators run ------------------------------------------------------------

def schedule_steps(collective: str, n: int, size: int, seed: int) -> Counter:
    perm = collectives.random_perm(n, seed) if collective == "permutation" else None
    sched = collectives.build(collective, n, size, perm=perm)
    out: Counter = Counter()
    for step in sched.steps:
        out[tuple(sorted((t.src, t.dst, float(t.nbytes)) for t in step))] += 1
    return out


def model_steps(collective: str, job: model.Job, size: int, seed: int) -> Counter:
    out: Counter[tuple] = Counter()
    for st in model.steps(collective, job, size, max_steps=10_000, seed=seed, rails=1, routing="flow"):
        key = tuple(sorted(zip(st.src.tolist(), st.dst.tolist(), st.nbytes.tolist(), strict=True)))
        out[key] += int(st.multiplicity)
    return out


@pytest.mark.parametrize("collective", model.MODEL_COLLECTIVES)
def test_the_models_steps_are_the_generators_schedule(collective):
    """8 ranks, a size every chunk divides evenly: the same transfers in the same steps."""
    n, seed = 8, 5
    size = n * 4 * (4 * (n - 1)) * 16
    job = model.Job(ranks=[(f"h{i}", 0) for i in range(n)])
    assert model_steps(collective, job, size, seed) == schedule_steps(collective, n, size, seed)


# ---- max-min: the many-bottlenecks-per-round filling against one-bottleneck-at-a-time -----------

def progressive_filling(flow_idx, link_idx, weight, cap, n_flows) -> np.ndarray:
    """The textbook algorithm: raise every unfrozen flow together until a link saturates."""
    rates = np.zeros(n_flows)
    active = np.ones(n_flows, dtype=bool)
    residual = cap.astype(float).copy()
    while active.any():
        load = np.bincount(link_idx, weights=weight * active[flow_idx], minlength=len(cap))
        used = load > 0
        inc = (residual[used] / load[used]).min()
        rates[active] += inc
        residual -= inc * load
        full = used & (residual <= 1e-9 * cap)
        active[np.unique(flow_idx[full[link_idx] & active[flow_idx]])] = False
    return rates


@pytest.mark.parametrize("seed", range(20))
def test_max_min_rates_equal_textbook_progressive_filling(seed):
    rng = np.random.default_rng(seed)
    n_flows, n_links = 40, 12
    f, lk, w = random_sharing(rng, n_flows, n_links, 5, [1.0, 0.5, 0.25])
    cap = rng.choice([10.0, 40.0, 100.0], size=n_links)
    args = (np.array(f), np.array(lk), np.array(w), cap, n_flows)
    assert model.max_min_rates(*args) == pytest.approx(progressive_filling(*args), rel=1e-9)


# ---- several jobs at once ------------------------------------------------------------------------

def test_jobs_on_separate_hosts_of_a_non_blocking_fabric_do_not_slow_each_other():
    g = fabric("mini-hpn")
    hosts = graph.hosts(g)
    a = model.JobSpec("all_reduce", 1 << 24, hosts[:8], routing="spray")
    b = model.JobSpec("all_to_all", 1 << 24, hosts[8:], routing="spray")
    together = model.run_jobs(g, [a, b], switch_latency_us=0.0)
    alone = [model.run_jobs(g, [x], switch_latency_us=0.0)[0] for x in (a, b)]
    assert [r.time_s for r in together] == pytest.approx([r.time_s for r in alone], rel=1e-9)


@pytest.mark.parametrize("background_bytes", [1 << 24, 1 << 30])
def test_background_traffic_on_the_same_nics_halves_a_jobs_rate_whatever_its_size(background_bytes):
    """Two hosts exchange S each way; a background job doing the same on the same NICs takes half
    of every host link for the whole step: the job's step takes twice as long, whether the
    background sends as much or 64 times as much (it used to wait for the elephant's bytes)."""
    g = fabric("mini-hpn")
    pair = graph.hosts(g)[:2]
    job = model.JobSpec("permutation", 1 << 24, pair, routing="spray")
    noise = model.JobSpec("permutation", background_bytes, pair, routing="spray", background=True)
    (alone,) = model.run_jobs(g, [job], switch_latency_us=0.0)
    (shared,) = model.run_jobs(g, [job, noise], switch_latency_us=0.0)
    assert shared.time_s == pytest.approx(2 * alone.time_s, rel=1e-9)


def test_adaptive_jobs_run_together_move_off_a_half_rate_uplink():
    """Two all-to-all jobs, one host of each on every leaf (2 planes, 2 spines a plane, 200G links):
    leaf p0l0's two hosts fill its four uplinks exactly (2 x 200G up and down per plane). With one
    of them at half rate, the leaf has 700G of the 800G it needs: adaptive routing, which moves
    bytes by their max-min rates as it does for one collective (run_collective), takes 8/7 of the
    symmetric time. Spraying's even split keeps a quarter of each of the leaf's pairs on the slow
    link, as much as on a full-rate one: twice the time (adaptive used to be timed as spray here)."""
    g = fabric("mini-hpn", leaf_spine_rate_gbps=200, oversubscription=2)
    slow = g.copy()
    slow.edges["p0s0", "p0l0", 0]["rate_gbps"] *= 0.5
    hosts = ["h1", "h5", "h9", "h13", "h2", "h6", "h10", "h14"]

    def times(fab, routing):
        jobs = [model.JobSpec("all_to_all", 1 << 21, h, routing, qps=2) for h in (hosts[:4], hosts[4:])]
        return [r.time_s for r in model.run_jobs(fab, jobs, switch_latency_us=0.0)]

    even = times(g, "adaptive")
    assert times(g, "spray") == pytest.approx(even, rel=1e-9)
    assert times(slow, "adaptive") == pytest.approx([t * 8 / 7 for t in even], rel=1e-6)
    assert times(slow, "spray") == pytest.approx([t * 2 for t in even], rel=1e-9)
    # one job alone: run_jobs times adaptive routing as run_collective does
    (alone,) = model.run_jobs(slow, [model.JobSpec("all_to_all", 1 << 21, hosts[:4], "adaptive", qps=2)],
                              switch_latency_us=0.0)
    single = model.run_collective(slow, "all_to_all", 1 << 21, routing="adaptive", hosts=hosts[:4], qps=2,
                                  switch_latency_us=0.0)
    assert alone.time_s == pytest.approx(single.time_s, rel=1e-9)
