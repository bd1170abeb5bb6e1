"""Failure-tolerance proofs (hpnlab.fabric.routing.proofs): the symmetry reduction against the
exhaustive proof, the set walker against the table interpreter, and a single point of failure
caught and named.

tests/unit/test_oftable_reachability.py already walks the small presets exhaustively with the
interpreter; here the interpreter is asked only where the set walker's answer must be checked.
"""
from __future__ import annotations

import pytest

from hpnlab.fabric.checks import rules as check
from hpnlab.fabric.routing import compiler, proofs
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph, spec

SMALL = ["mini-hpn", "fat-tree-4", "mini-rail", "mini-cross-campus", "mini-spine-leaf"]
_GRAPHS: dict = {}


def fabric(name: str, overrides: dict | None = None):
    key = (name, repr(sorted((overrides or {}).items())))
    if key not in _GRAPHS:
        _GRAPHS[key] = graph.build(spec.load(name, overrides))
    return _GRAPHS[key]


def one_spine_per_plane():
    """mini-hpn with one spine per plane: that spine and each leaf's only uplink are single
    points of failure."""
    return fabric("mini-hpn", {"spines_per_plane": 1, "oversubscription": 2.0})


def verdict_of(v: proofs.Verdict) -> tuple:
    return v.ok, v.kinds


@pytest.mark.parametrize("name", SMALL)
def test_the_reduced_proof_gives_the_exhaustive_verdict_for_every_failure_class(name):
    """Every single link, every single switch and every whole plane (pairs of links: the
    benchmark compares them, too slow for a test)."""
    g = fabric(name)
    reduced = proofs.prove(g, plane=True)
    exhaustive = proofs.prove(g, plane=True, exhaustive=True)
    assert [c.cls.key for c in reduced.classes] == [c.cls.key for c in exhaustive.classes]
    assert verdict_of(reduced.healthy) == verdict_of(exhaustive.healthy)
    for r, e in zip(reduced.classes, exhaustive.classes, strict=True):
        assert verdict_of(r.verdict) == verdict_of(e.verdict), r.cls.label
        assert r.pair_classes < e.pair_classes


@pytest.mark.parametrize("name", SMALL)
def test_the_pair_classes_hold_a_pair_of_every_orbit_key(name):
    """Every pair of ports (same plane, different hosts) has the key of one of the pairs the
    reduced proof walks, for every failure class representative."""
    g = fabric(name)
    sym = proofs.symmetry_of(g)
    pairs = list(sym.all_pairs())
    for c in proofs.failure_classes(g):
        anchors = sym.anchors(c.representative)
        walked = sym.pair_classes(anchors)
        assert {sym.pair_key(s, d, anchors) for s, d in pairs} == set(walked)


@pytest.mark.parametrize("name", SMALL)
def test_the_failure_classes_cover_every_link_and_switch_exactly_once(name):
    g = fabric(name)
    classes = proofs.failure_classes(g)
    members = [f.failures for c in classes for f in c.members or ()]
    expected = ([compiler.Failures(frozenset([lid])) for lid in proofs.all_links(g)]
                + [compiler.Failures(switches=frozenset([s])) for s in graph.switches(g)])
    assert sorted(members, key=repr) == sorted(expected, key=repr)
    assert sum(c.size for c in classes) == len(expected)
    assert all(c.representative in (c.members or ()) for c in classes)


def test_the_pair_of_links_classes_cover_every_unordered_pair_once():
    g = fabric("mini-spine-leaf")
    n = len(proofs.all_links(g))
    pairs = proofs.failure_classes(g, links=False, switches=False, pairs=True)
    assert sum(c.size for c in pairs) == n * (n - 1) // 2
    seen = [f.failures.links for c in pairs for f in c.members or ()]
    assert len(set(seen)) == len(seen) == n * (n - 1) // 2


def test_without_members_the_pair_of_links_classes_count_the_same():
    """At scale the classes keep no member lists and count from one representative per
    single-link class: the same classes and sizes."""
    g = fabric("mini-spine-leaf")
    listed = proofs.failure_classes(g, links=False, switches=False, pairs=True, keep_members=True)
    counted = proofs.failure_classes(g, links=False, switches=False, pairs=True, keep_members=False)
    assert {c.key: c.size for c in listed} == {c.key: c.size for c in counted}


def test_a_whole_plane_is_one_class_and_the_other_plane_carries_everything():
    g = fabric("mini-hpn")
    proof = proofs.prove(g, links=False, switches=False, plane=True)
    (plane,) = proof.classes
    assert plane.cls.size == 2
    assert plane.verdict.ok and plane.verdict.live > 0


def test_a_single_point_of_failure_is_caught_and_named():
    proof = proofs.prove(one_spine_per_plane())
    failing = {c.cls.label: c.verdict for c in proof.classes if not c.verdict.ok}
    assert set(failing) == {"switch spine", "link leaf-spine"}
    assert failing["switch spine"].failure.name == "switch p0s0"
    assert failing["switch spine"].kinds == {"cut"}


def test_the_single_point_of_failure_is_caught_by_the_exhaustive_proof_too():
    g = one_spine_per_plane()
    assert ({c.cls.label for c in proofs.prove(g, exhaustive=True).classes if not c.verdict.ok}
            == {"switch spine", "link leaf-spine"})


@pytest.mark.parametrize("name", ["mini-hpn", "fat-tree-4", "mini-cross-campus"])
def test_the_set_walker_finds_exactly_the_interpreters_outcomes(name):
    """For each failure class representative, every pair: the outcomes the set walker says a
    pair may end in are those of the interpreter's walks over every entropy branch."""
    g = fabric(name)
    sym = proofs.symmetry_of(g)
    pairs = list(sym.all_pairs())[::3]
    for c in [None, *proofs.failure_classes(g)]:
        failed = c.representative.failures if c else compiler.Failures()
        net = FabricTables(g, compiler.compile_fabric(g, failed), failed)
        walker = proofs.SetWalker(net)
        for s, d in pairs:
            exact = {w.result for _p, _f, w in net.send_branches(s.host, d.host, s.plane, src_rail=s.rail,
                                                                 dst_rail=d.rail)}
            assert walker.walk(s, d) == exact, (failed, s, d)


def test_the_set_walker_reports_a_black_hole_the_tables_make():
    """A spine's route to a leaf removed from its tables: the walker sees the drop."""
    g = fabric("mini-hpn")
    states = compiler.compile_fabric(g)
    sym = proofs.symmetry_of(g)
    src = next(p for p in sym.ports if p.leaf == "p0l0")
    dst = next(p for p in sym.ports if p.leaf == "p0l1")
    net = FabricTables(g, dict(states))
    spine = states["p0s0"]
    net.load("p0s0", {k: a for k, a in spine.expanded().items() if k[0] != compiler.TABLE_ROUTE}, spine.groups)
    assert "dropped" in proofs.SetWalker(net).walk(src, dst)


def test_the_cost_of_a_spine_is_its_share_of_the_bisection_and_of_each_leafs_uplinks():
    g = fabric("mini-hpn")      # 2 spines per plane, 2 planes: a spine carries a quarter of tier-1 uplinks
    costs = proofs.Costs(g)
    bisection, uplink = costs.loss(compiler.Failures(switches=frozenset(["p0s0"])))
    assert bisection == pytest.approx(1 / 4)
    assert uplink == pytest.approx(1 / 2)


def test_the_check_rule_gives_one_line_per_class_and_a_summary():
    g = one_spine_per_plane()
    ctx = check.CheckContext(name="one-spine", spec=g.graph["scenario"], graph=g, limits={"max_bisection_loss": 0.3})
    results = check.rule_failure_tolerance(ctx)
    assert all(isinstance(r, check.RuleResult) and r.rule == "failure-tolerance" for r in results)
    assert [r.subject for r in results if not r.ok][:2] == ["link leaf-spine (represents 8)",
                                                           "switch spine (represents 2)"]
    assert "switch p0s0" in next(r.detail for r in results if r.subject.startswith("switch spine"))
    assert results[-1].subject == "all failures" and not results[-1].ok


def test_an_interpreter_reloaded_with_another_failures_tables_walks_like_a_fresh_one():
    g = fabric("mini-hpn")
    failed = compiler.Failures(frozenset([compiler.link_id("p0l0", "p0s0")]))
    net = FabricTables(g, compiler.compile_fabric(g))
    healthy = [w.hops for _s, _f, w in net.send_branches("h1", "h5", 0)]     # fills the caches
    net.reload(compiler.compile_fabric(g, failed), failed)
    fresh = FabricTables(g, compiler.compile_fabric(g, failed), failed)
    reloaded = [w.hops for _s, _f, w in net.send_branches("h1", "h5", 0)]
    assert reloaded == [w.hops for _s, _f, w in fresh.send_branches("h1", "h5", 0)]
    assert reloaded != healthy
