"""Scenario shapes (``hpnlab.fabric.scenario.shapes``): the generated scenarios the local-protection
proof runs over are valid scenarios, carry the counts they are named for, and the sweep is the same
every run."""
from __future__ import annotations

import pytest

from hpnlab.fabric.scenario import graph, shapes

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

hpn_counts = st.fixed_dictionaries({d: st.sampled_from(shapes.DIMENSIONS[d]) for d in shapes.HPN_FIELDS})


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(counts=hpn_counts)
def test_any_drawn_hpn_counts_make_a_valid_scenario_with_those_counts(counts):
    fixed = shapes.fixed(counts)
    s = shapes.scenario("hpn", **counts)
    assert s.name == shapes.name_of(fixed)
    assert shapes.counts_of(s) == ("hpn", fixed)


@hypothesis.settings(max_examples=15, deadline=None, derandomize=True)
@hypothesis.given(counts=hpn_counts)
def test_a_shapes_graph_has_the_leaves_per_plane_its_counts_give(counts):
    g = graph.build(shapes.scenario("hpn", **counts))
    leaves = [n for n, a in g.nodes(data=True) if a.get("role") == "leaf" and a.get("plane") == 0]
    assert len(leaves) == shapes.leaves_per_plane(counts)


@pytest.mark.parametrize("counts, changed", [
    ({"rails": 1, "leaves_per_plane_per_segment": 2}, {"leaves_per_plane_per_segment": 1}),
    ({"pods": 2, "cores_per_plane": 0}, {"cores_per_plane": 1}),
    ({"campuses": 2, "cores_per_plane": 0}, {"cores_per_plane": 1}),
    ({"campuses": 1, "long_haul_links": 2}, {"long_haul_links": 1}),
    ({"cores_per_plane": 0, "spine_core_links": 2}, {"spine_core_links": 1}),
])
def test_fixed_repairs_only_the_counts_the_schema_would_refuse(counts, changed):
    assert shapes.fixed(counts) == {**shapes.DEFAULTS, **counts, **changed}


def test_a_fat_tree_shape_is_named_by_its_k_and_has_k_squared_halves_edges_per_plane():
    s = shapes.scenario("fat-tree", k=4)
    assert s.name == "fat-tree-k4" and shapes.counts_of(s) == ("fat-tree", {"k": 4})
    assert shapes.leaves_per_plane({"k": 4}) == 8


def test_the_sweep_is_the_same_every_run_distinct_and_within_its_cost():
    first = list(shapes.sweep(25, seed=7, max_cost=200_000))
    assert first == list(shapes.sweep(25, seed=7, max_cost=200_000))
    names = [shapes.name_of(c, k) for k, c in first]
    assert len(names) == len(set(names)) == 25
    assert all(shapes.walk_cost(k, c) <= 200_000 for k, c in first)
    assert len([k for k, _c in first if k == "fat-tree"]) <= len(shapes.SWEEP["k"])


def test_another_seed_draws_other_shapes():
    assert list(shapes.sweep(10, seed=1)) != list(shapes.sweep(10, seed=2))


@pytest.mark.parametrize("dimension", ["spines_per_plane", "leaf_spine_links", "pods", "campuses", "segments_per_pod"])
def test_a_shapes_walk_cost_grows_with_each_structural_dimension(dimension):
    base = {"pods": 2, "cores_per_plane": 2}
    assert shapes.walk_cost("hpn", {**base, dimension: 3}) > shapes.walk_cost("hpn", {**base, dimension: 1})
