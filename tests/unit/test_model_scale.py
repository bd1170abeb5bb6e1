"""The shortcuts that make the 130k model fast give what the plain computation gives (pure, no root).

* a multi-plane fabric's model network is built from plane 0's graph and routes and copied to
  the other planes (``Network.planes_copied``): array for array the network built from the
  whole graph, so every result on it is the same;
* the graph's edges are read off its adjacency (``flow.graph_edges``) in networkx's order;
* spraying is routed a chunk of sub-paths at a time (``flow.SPRAY_CHUNK_PATHS``): the same
  entries in the same order as all at once.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.spy import spy

from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph, spec

MULTI_PLANE = ["mini-hpn", "small-hpn", "mini-cross-campus", "mini-rail", "mini-hpn-wide"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _whole_and_copied(scenario) -> tuple[model.Network, model.Network]:
    whole = model.Network(graph.build(scenario))
    copied = model.Network(graph.build(scenario, planes=(0,))).planes_copied(scenario.planes)
    assert copied is not None
    return whole, copied


def _differences(whole: model.Network, copied: model.Network) -> list[str]:
    skip = {"g", "fwd", "s", "_rank_tables"}
    out = [k for k in whole.__dict__ if k not in skip and not _same(whole.__dict__[k], copied.__dict__[k])]
    out += [f"fwd.{k}" for k in whole.fwd.__dict__ if k not in ("g", "ix", "failures")
            and not _same(whole.fwd.__dict__[k], copied.fwd.__dict__[k])]
    return out


@pytest.mark.parametrize("preset", MULTI_PLANE)
def test_a_plane_copied_to_every_plane_is_the_network_of_the_whole_graph(preset):
    whole, copied = _whole_and_copied(spec.load(preset))
    assert _differences(whole, copied) == []


@pytest.mark.parametrize("planes", [3, 4, 11])
def test_copies_hold_for_more_planes_than_the_presets_have(planes):
    # 11 planes: names sort p0, p1, p10, p2 ... and host interfaces outnumber a switch's ports
    whole, copied = _whole_and_copied(spec.load("mini-hpn", {"planes": planes}))
    assert _differences(whole, copied) == []


@pytest.mark.parametrize("routing", model.ROUTINGS)
def test_every_routing_gives_the_same_results_on_the_copied_network(routing):
    s = spec.load("small-hpn")
    whole, copied = _whole_and_copied(s)
    for collective in ("all_to_all", "all_reduce", "permutation"):
        kw: dict[str, Any] = dict(routing=routing, placement="random", qps=4, seed=3, max_steps=4)
        a = model.run_collective(None, collective, 1 << 20, network=whole, **kw)
        b = model.run_collective(None, collective, 1 << 20, network=copied, **kw)
        assert a.time_s == b.time_s
        for x, y in zip(a.steps, b.steps, strict=True):
            assert np.array_equal(x.rates_gbps, y.rates_gbps)


def _planes_built(monkeypatch) -> list[Any]:
    """The planes every graph.build is asked for (None: all of them)."""
    return spy(monkeypatch, graph, "build", lambda scenario, planes=None: planes)


def test_the_healthy_network_builds_only_plane_zero_of_a_multi_plane_fabric(monkeypatch):
    real = graph.build
    built = _planes_built(monkeypatch)
    net = model.healthy_network(spec.load("mini-hpn"))
    assert built == [(0,)] and net.g is None
    assert _differences(model.Network(real(spec.load("mini-hpn"))), net) == []


@pytest.mark.parametrize("preset", ["fat-tree", "mini-spine-leaf"])
def test_a_one_plane_fabric_is_built_whole(preset, monkeypatch):
    built = _planes_built(monkeypatch)
    model.healthy_network(spec.load(preset))
    assert built == [None]


def test_a_network_with_failed_links_is_not_copied():
    s = spec.load("mini-hpn")
    g0 = graph.build(s, planes=(0,))
    link = next((u, v, k) for u, v, k, d in g0.edges(keys=True, data=True) if d["kind"] == "fabric")
    assert model.Network(g0, {link}).planes_copied(s.planes) is None


@pytest.mark.parametrize("preset", ["mini-hpn", "mini-cross-campus", "fat-tree"])
def test_the_graphs_edges_read_off_its_adjacency_are_networkx_edges_in_order(preset):
    g = graph.build(spec.load(preset))
    mine = model.graph_edges(g)
    assert [e[:3] for e in mine] == list(g.edges(keys=True))
    assert all(a[3] is b[3] for a, b in zip(mine, g.edges(keys=True, data=True), strict=True))


@pytest.mark.parametrize("preset", ["mini-hpn", "mini-cross-campus"])
def test_spraying_routed_chunk_by_chunk_gives_the_entries_made_all_at_once(preset, monkeypatch):
    g = graph.build(spec.load(preset))
    net = model.Network(g, model.random_fabric_links(g, 2, 3))     # dead paths and stalled pairs too
    job = model.make_job(g, None, "random", 1)
    (st,) = model.steps("all_to_all", job, 1 << 20, max_steps=1, seed=1, rails=net.s.rails)
    monkeypatch.setattr(model, "SPRAY_CHUNK_PATHS", 7)             # many chunks, pairs cut across none
    chunked = model.route_step(net, job, (st.src, st.dst), st.nbytes, "spray", 4, 0, 1.0)
    at_once = model.route_step(net, job, (st.src, st.dst), st.nbytes, "spray", 4, 0, 1.0, watch={-1})
    assert chunked.entries is not None and at_once.entries is not None
    assert all(np.array_equal(a, b) for a, b in zip(chunked.entries, at_once.entries, strict=True))
    assert (chunked.latency_us, chunked.stalled, chunked.stalled_pairs, chunked.hops) == \
        (at_once.latency_us, at_once.stalled, at_once.stalled_pairs, at_once.hops)
    assert np.array_equal(chunked.size_bits, at_once.size_bits)
