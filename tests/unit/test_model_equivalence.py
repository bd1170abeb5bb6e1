"""The model's fast paths give what its plain formulation gives (pure, no root).

The 130k-rank runs take the shortcuts below; each is held here against the plain
computation it replaced, on small fabrics:

* max-min rates: the earlier progressive filling (the bottleneck test by ``np.minimum.at``
  over every link, all links every round), copied below as the reference, against
  :func:`model.max_min_rates` (bottlenecks by comparison, only the links still shared, links
  that can never fill left out): equal bit for bit on random instances, to rounding (rel
  1e-9) on sprayed steps, where leaving links out may group the rounds differently;
* spraying: one entry per path (host links repeated once per path, weight 1/L) against the
  aggregated entries :func:`model.route_step` builds (a plane's host links once, weight n/L):
  the same link loads, so the same drain times and max-min rates (to rounding: rel 1e-9);
* path flows (per-flow hashing's connections, adaptive routing's sub-flows) as a hops x flows
  array: :func:`model.max_min_path_rates` against the earlier progressive filling over the same
  flows as entries (to rounding), :func:`model.path_drain_times` against :func:`model.drain_times`
  (bit for bit), on random paths and on the small presets' steps, healthy and failed.
"""
from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
from support.fabrics import random_sharing

from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.workload import collectives

EXACT: dict[str, Any] = dict(rel=1e-9)      # sums in another order: rounding only


@cache
def fabric(name: str):
    return graph.build(spec.load(name))


def earlier_max_min_rates(flow_idx, link_idx, weight, cap, n_flows):
    """The progressive filling of the previous revision, verbatim in its arithmetic."""
    rates = np.full(n_flows, np.inf)
    if not len(flow_idx):
        return rates
    order = np.argsort(flow_idx, kind="stable")
    f, lk, w = flow_idx[order], link_idx[order], weight[order].astype(float)
    residual = cap.astype(float).copy()
    n_links = len(cap)
    for _ in range(n_flows + 1):
        if not len(f):
            break
        load = np.bincount(lk, weights=w, minlength=n_links)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 0, np.maximum(residual, 0.0) / load, np.inf)
        e_share = share[lk]
        starts = np.flatnonzero(np.r_[True, f[1:] != f[:-1]])
        fmin = np.minimum.reduceat(e_share, starts)
        owner = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(f)]))
        lmin = np.full(n_links, np.inf)
        np.minimum.at(lmin, lk, fmin[owner])
        bottleneck = share <= lmin * (1 + 1e-12)
        hit = np.zeros(len(starts), dtype=bool)
        hit[owner[bottleneck[lk] & (w > 0)]] = True
        if not hit.any():
            break
        ids = f[starts]
        rates[ids[hit]] = fmin[hit]
        frozen = hit[owner]
        residual -= np.bincount(lk[frozen], weights=w[frozen] * fmin[owner[frozen]], minlength=n_links)
        keep = ~frozen
        f, lk, w = f[keep], lk[keep], w[keep]
    return rates


@pytest.mark.parametrize("seed", range(12))
def test_max_min_rates_equal_the_earlier_progressive_filling_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    n_flows, n_links = 300, 80
    f, lk, w = random_sharing(rng, n_flows, n_links, 7, [1.0, 0.5, 0.25, 1 / 3])
    cap = rng.choice([0.0, 10.0, 40.0, 100.0], size=n_links, p=[0.05, 0.35, 0.3, 0.3])
    order = rng.permutation(len(f)) if seed % 2 else np.arange(len(f))     # grouped by flow, or not
    args = (np.array(f)[order], np.array(lk)[order], np.array(w)[order], cap, n_flows + 3)
    assert np.array_equal(model.max_min_rates(*args), earlier_max_min_rates(*args))


def per_path_spray_entries(net, job, src, dst):
    """One entry per link of every live path of each pair, weight 1 / (the pair's live paths)."""
    leaf, up, down, _host = net.rank_table(job)
    planes, nv = net.s.planes, net.entropy_values
    n_paths = planes * nv
    a, b = np.repeat(src, n_paths), np.repeat(dst, n_paths)
    j = np.tile(np.arange(n_paths), len(src))
    links, live, _mid, _lat = model._paths(net, leaf, up, down, a, b, j // nv, j % nv)
    per_pair = live.reshape(len(src), n_paths).sum(axis=1)
    owner = np.repeat(np.arange(len(src)), n_paths)
    f, lk, w = [], [], []
    for row in np.flatnonzero(live):
        for link in links[:, row][links[:, row] != net.n_links]:
            f.append(owner[row])
            lk.append(link)
            w.append(1.0 / per_pair[owner[row]])
    return np.array(f), np.array(lk), np.array(w)


def random_step(preset: str, failed: bool):
    """A preset's network (one random fabric link down when ``failed``), a random job on it and a
    random permutation of its ranks: (net, job, src, dst)."""
    g = fabric(preset)
    net = model.Network(g, model.random_fabric_links(g, 1, 2) if failed else None)
    job = model.make_job(g, None, "random", 3)
    return net, job, np.arange(job.n), np.array(collectives.random_perm(job.n, 3))


@pytest.mark.parametrize("preset,failed", [("mini-hpn", False), ("mini-hpn", True), ("mini-rail", False),
                                           ("mini-cross-campus", False)])
def test_aggregated_spray_entries_load_and_share_links_as_one_entry_per_path(preset, failed):
    net, job, src, dst = random_step(preset, failed)
    host = net.rank_table(job)[3]
    keep = host[src] != host[dst]
    src, dst = src[keep], dst[keep]
    r = model.route_step(net, job, (src, dst), 1e6, "spray", 1)
    assert r.stalled == 0
    f, lk, w = per_path_spray_entries(net, job, src, dst)
    size = np.full(len(src), 8e6)
    want_load = np.bincount(lk, weights=w * size[f], minlength=net.n_links)
    got_load = np.bincount(r.link_idx, weights=r.weight * r.size_bits[r.flow_idx], minlength=net.n_links)
    assert got_load == pytest.approx(want_load, **EXACT)
    assert model.drain_times(r.flow_idx, r.link_idx, r.weight, net.cap, r.size_bits) == pytest.approx(
        model.drain_times(f, lk, w, net.cap, size), **EXACT)
    assert model.max_min_rates(r.flow_idx, r.link_idx, r.weight, net.cap, len(src)) == pytest.approx(
        earlier_max_min_rates(f, lk, w, net.cap, len(src)), **EXACT)


def test_a_link_that_cannot_fill_is_left_out_and_the_rates_stay():
    # flows 0 and 1 share link 0 (10 Gbit/s); flow 0 also crosses link 1 (100): at most 10 on it
    lk, w = np.array([0, 1, 0]), np.ones(3)
    cap = np.array([10.0, 100.0])
    starts, owner, lb = np.array([0, 2]), np.array([0, 0, 1]), np.array([5.0, 5.0, 5.0])   # lb: cap / load
    assert model._slack_entries(lk, w, cap, starts, owner, lb).tolist() == [False, True, False]
    f = np.array([0, 0, 1])
    assert model.max_min_rates(f, lk, w, cap, 2).tolist() == [5.0, 5.0]


@pytest.mark.parametrize("preset", ["mini-hpn", "mini-rail"])
def test_sprayed_steps_leave_links_out_and_keep_the_earlier_rates(preset):
    g = fabric(preset)
    net = model.Network(g)
    job = model.make_job(g, None, "random", 5)
    src = np.arange(job.n)
    dst = np.array(collectives.random_perm(job.n, 5))
    r = model.route_step(net, job, (src, dst), 1e6, "spray", 1)
    f, lk, w = r.flow_idx, r.link_idx, r.weight
    starts = np.flatnonzero(np.r_[True, f[1:] != f[:-1]])
    owner = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(f)]))
    load = np.bincount(lk, weights=w, minlength=net.n_links)
    lb = np.minimum.reduceat(net.cap[lk] / load[lk], starts)[owner]
    assert model._slack_entries(lk, w, net.cap, starts, owner, lb).any()
    n = len(r.size_bits)
    assert model.max_min_rates(r.flow_idx, r.link_idx, r.weight, net.cap, n) == pytest.approx(
        earlier_max_min_rates(r.flow_idx, r.link_idx, r.weight, net.cap, n), **EXACT)


def random_paths(rng, n_flows: int, n_links: int, hops: int):
    """Each flow 1..hops distinct links, padded with n_links; and the same flows as entries."""
    paths = np.full((hops, n_flows), n_links, dtype=np.int64)
    for f in range(n_flows):
        k = int(rng.integers(1, hops + 1))
        paths[:k, f] = rng.choice(n_links, size=k, replace=False)
    by_flow = paths.T
    flows, cols = np.nonzero(by_flow < n_links)
    return paths, (flows, by_flow[flows, cols])


@pytest.mark.parametrize("seed", range(12))
def test_path_max_min_rates_equal_the_earlier_progressive_filling(seed):
    rng = np.random.default_rng(seed)
    n_flows, n_links = 300, 80
    paths, (f, lk) = random_paths(rng, n_flows, n_links, 4)
    cap = rng.choice([0.0, 10.0, 40.0, 100.0], size=n_links, p=[0.05, 0.35, 0.3, 0.3])
    weight = [1.0, 0.5, 3.0][seed % 3]
    want = earlier_max_min_rates(f, lk, np.full(len(f), weight), cap, n_flows)
    assert model.max_min_path_rates(paths, cap, weight) == pytest.approx(want, **EXACT)


@pytest.mark.parametrize("seed", range(4))
def test_path_drain_times_equal_the_entry_drain_times_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    paths, (f, lk) = random_paths(rng, 200, 50, 5)
    cap = rng.choice([10.0, 40.0, 100.0], size=50)
    size = rng.uniform(1e3, 1e9, size=200)
    want = model.drain_times(f, lk, np.ones(len(f)), cap, size)
    assert np.array_equal(model.path_drain_times(paths, cap, size), want)


@pytest.mark.parametrize("routing", ["flow", "adaptive"])
@pytest.mark.parametrize("preset,failed", [("mini-hpn", False), ("mini-hpn", True), ("small-hpn", False),
                                           ("mini-cross-campus", True), ("fat-tree", False)])
def test_path_flows_of_a_step_share_links_as_their_entries_do(preset, failed, routing):
    net, job, src, dst = random_step(preset, failed)
    r = model.route_step(net, job, (src, dst), 1e6, routing, 4)
    assert r.paths is not None
    n = r.paths.shape[1]
    want = earlier_max_min_rates(r.flow_idx, r.link_idx, r.weight, net.cap, n)
    assert model.flow_rates(r, net.cap) == pytest.approx(want, **EXACT)
    size = np.full(n, 8e6)
    assert np.array_equal(model.path_drain_times(r.paths, net.cap, size),
                          model.drain_times(r.flow_idx, r.link_idx, r.weight, net.cap, size))
