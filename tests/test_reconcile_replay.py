"""Replay proofs: the reconciler's messages applied one at a time to interpreted tables
(tests/replay.py, tests/oftable.py), with every host pair on every plane walked on every
entropy branch after every single table change.

Invariants, for a link failure, a switch failure and the repair of each, on three fabric
shapes, both routing policies and two interleavings of the switches' message queues (each
switch keeps its own order):
- no packet ever loops;
- no (pair, branch) that was delivered stops being delivered at the next message (for a
  repair: nothing that worked before is ever black-holed; for a failure: what the failure
  broke is only ever repaired);
- at the end every pair the live fabric connects is delivered on every branch, and the
  reconciler's confirmed state is exactly what the switches hold.
"""
from __future__ import annotations

import functools

import pytest
from replay import Replay, reverse_switch_by_switch, switch_by_switch

from hpnlab.controller import compiler, reconcile
from hpnlab.fabric import graph, spec

INTERLEAVINGS = {"switch-by-switch": switch_by_switch, "reverse": reverse_switch_by_switch}
LINKS = {"mini-hpn": [("p0l0", "p0s0")],
         "fat-tree-4": [("a0", "c0"), ("e0", "a0")],
         "mini-cross-campus": [("p0c0", "p0s0"), ("p0c0", "p0c1")]}
SWITCHES = {"mini-hpn": ["p0s0", "p0l1"], "fat-tree-4": ["a0", "c0"], "mini-cross-campus": ["p0s0", "p0c0"]}
_GRAPHS: dict = {}


def fabric(name: str):
    if name not in _GRAPHS:
        _GRAPHS[name] = graph.build(spec.load(name))
    return _GRAPHS[name]


def problems(replay: Replay) -> str:
    return f"{len(replay.counts.problems)} problems, e.g.:\n" + "\n".join(replay.counts.problems[:5])


@pytest.mark.parametrize("interleaving", INTERLEAVINGS)
@pytest.mark.parametrize("policy", compiler.ROUTING_POLICIES)
@pytest.mark.parametrize("name", LINKS)
def test_a_link_failure_and_its_repair_never_loop_or_lose_a_delivered_branch(name, policy, interleaving):
    g = fabric(name)
    replay = Replay(g, policy, INTERLEAVINGS[interleaving])
    replay.start()
    for a, b in LINKS[name]:
        lid = compiler.link_id(a, b, 0)
        _first, second = replay.fail_link(lid)
        assert second == [], "the second end's report of a link already down must change nothing"
        assert not replay.counts.problems, problems(replay)
        first, _second = replay.repair_link(lid)
        assert first == [], "a link that one end still reports down must stay down"
        assert not replay.counts.problems, problems(replay)
    assert replay.counts.states > 0 and replay.counts.pair_branches > 0


@pytest.mark.parametrize("interleaving", INTERLEAVINGS)
@pytest.mark.parametrize("policy", compiler.ROUTING_POLICIES)
@pytest.mark.parametrize("name", SWITCHES)
def test_a_switch_failure_and_its_repair_never_loop_or_lose_a_delivered_branch(name, policy, interleaving):
    g = fabric(name)
    replay = Replay(g, policy, INTERLEAVINGS[interleaving])
    replay.start()
    for sw in SWITCHES[name]:
        replay.fail_switch(sw)
        assert not replay.counts.problems, problems(replay)
        replay.repair_switch(sw)
        assert not replay.counts.problems, problems(replay)
    assert replay.counts.states > 0


def test_walks_cover_every_entropy_branch_of_the_tables():
    """fat-tree-4: edges split on one source-port bit, aggregation switches on another (bit 5):
    four branches per pair, each leaving its edge and aggregation switch by a different port pair."""
    g = fabric("fat-tree-4")
    replay = Replay(g, "aggregate")
    replay.start()
    sports = replay.net.entropy_ports()
    assert len(sports) == 4
    paths = {tuple((h[0], h[2]) for h in replay.net.send("h1", "h16", 0, sport=s).hops) for s in sports}
    assert len(paths) == 4


def test_sending_every_switch_its_changes_at_once_black_holes_traffic_during_a_failure(monkeypatch):
    """The order the old app used (all switches at once) loses delivered branches mid-update:
    when e0-a0 fails, a2 (whose cores can no longer reach e0) drops e0's prefix while e2 still
    sends there (through c0 and a0's detour the branch was still delivered). The replay must
    see it (this is what the upstream-first order of a drop fixes)."""
    def everything_at_once(ix, confirmed, desired, items, failures=None, indexes=None):
        return items, 0, False

    monkeypatch.setattr(reconcile, "plan", everything_at_once)
    replay = Replay(fabric("fat-tree-4"), "aggregate", switch_by_switch)
    replay.start()
    replay.fail_link(compiler.link_id("e0", "a0", 0))
    assert any(p.startswith("LOST") for p in replay.counts.problems)


# ---- local protection: fast-failover groups ------------------------------------------------

GROUP_LINKS = {"mini-hpn": ("p0l0", "p0s0"), "fat-tree-4": ("e0", "a0")}


def source_leaf(g, pair: tuple) -> str:
    src, _dst, plane, rail, _ = pair
    return next(p["leaf"] for p in graph.host_ports(g, src) if p["plane"] == plane and p["rail"] == rail)


@pytest.mark.parametrize("name", GROUP_LINKS)
def test_before_the_controller_reacts_the_leaf_next_to_a_failure_already_delivers_every_branch(name):
    """The real compiler's fast-failover groups: before the controller hears of the failure the leaf
    next to it already sends every packet up another uplink; the update and the repair then
    lose nothing (every GroupMod checked by the interpreted switch)."""
    g = fabric(name)
    replay = Replay(g, "aggregate", switch_by_switch)
    replay.start()
    leaf, spine = GROUP_LINKS[name]
    lid = compiler.link_id(leaf, spine, 0)
    replay.fail_link(lid)
    assert not replay.counts.problems, problems(replay)
    from_leaf = {k: r for k, (r, _crossed) in replay.at_fault.items() if source_leaf(g, k[0]) == leaf}
    assert from_leaf and set(from_leaf.values()) == {"delivered"}, "local protection failed at the leaf"
    replay.repair_link(lid)
    assert not replay.counts.problems, problems(replay)


def test_without_fast_failover_the_leaf_next_to_a_failure_loses_traffic_until_the_controller_reacts():
    """The counterpart of the test above: the controller-only baseline (every group cut to its
    primary bucket) black-holes the branches hashed onto the dead uplink until the update arrives."""
    g = fabric("mini-hpn")
    replay = Replay(g, "aggregate", compile_fn=functools.partial(compiler.compile_fabric, fast_failover=False))
    replay.start()
    replay.fail_link(compiler.link_id("p0l0", "p0s0", 0))
    from_leaf = [r for k, (r, _crossed) in replay.at_fault.items() if source_leaf(g, k[0]) == "p0l0"]
    assert "dropped" in from_leaf


@pytest.mark.parametrize("rebuild_above", [0.0, float("inf")])
def test_patched_or_rebuilt_tables_make_the_same_safe_update(rebuild_above):
    """Changed switches' tables patched and diffed on the touched keys only, or built anew and diffed whole."""
    g = fabric("fat-tree-4")
    replay = Replay(g, "aggregate", switch_by_switch)
    replay.reconciler.rebuild_above = rebuild_above
    replay.start()
    for a, b in (("e0", "a0"), ("a0", "c0")):
        lid = compiler.link_id(a, b, 0)
        replay.fail_link(lid)
        replay.repair_link(lid)
    assert not replay.counts.problems, problems(replay)
