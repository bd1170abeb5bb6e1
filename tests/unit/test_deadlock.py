"""Deadlock freedom under PFC (fabric/routing/deadlock.py): buffer dependencies read off the compiled
tables, healthy and under every single failure; bounced detours in a priority of their own."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from hpnlab.fabric.routing import compiler, deadlock
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec


def test_only_marked_packets_take_the_bounce_priority_and_only_when_it_exists():
    assert deadlock.priority_of(compiler.BOUNCE_MAC, bounce=True) == 1
    assert deadlock.priority_of(compiler.DEEP_MAC, bounce=True) == 1
    assert deadlock.priority_of("02:00:00:00:00:01", bounce=True) == 0
    assert deadlock.priority_of(compiler.BOUNCE_MAC, bounce=False) == 0


@dataclass
class _Walk:
    hops: list
    result: str = "delivered"


@dataclass
class _Net:
    """Just what ``dependencies`` reads of a FabricTables: one walk per (src, dst)."""
    g: object
    walks: dict
    set_mark_at: set = field(default_factory=set)

    def live(self, host, plane, rail):
        return True

    def send_branches(self, src, dst, plane, **kw):
        return [(0xC000, 0, _Walk(self.walks[src, dst]))] if (src, dst) in self.walks else []

    def packet(self, src, dst, plane, **kw):
        return {}, {"eth_src": "02:00:00:00:00:01"}

    def _pipeline(self, sw, pkt):
        return None, ((("eth_src", compiler.BOUNCE_MAC),) if sw in self.set_mark_at else ())


def _net(walks, set_mark_at=()):
    g = fgraph.build(spec.load("mini-spine-leaf"))
    return _Net(g, walks, set(set_mark_at))


def _two_hosts() -> tuple[str, str]:
    """Two hosts whose ports stand for their leaves (``deadlock.representatives``)."""
    reps = sorted({h for h, _ in deadlock.representatives(_net({}), 0)})
    return reps[0], reps[-1]


def test_walks_that_chase_each_other_round_two_switches_close_a_cycle():
    # each walk goes from one switch's ingress queue into the one the other walk leaves
    # h1 and h5 sit under different leaves; each walk goes through the other's ingress queue
    a, b = _two_hosts()
    net = _net({(a, b): [("s1", 1, 2), ("s2", 1, 2)], (b, a): [("s2", 1, 3), ("s1", 1, 3)]})
    edges, _ = deadlock.dependencies(net, bounce=False)
    assert deadlock._find_cycle(edges)


def test_the_same_walks_with_the_second_one_bounced_form_no_cycle_with_a_bounce_priority():
    a, b = _two_hosts()
    walks = {(a, b): [("s1", 1, 2), ("s2", 1, 2)], (b, a): [("s3", 9, 1), ("s2", 1, 3), ("s1", 1, 3)]}
    net = _net(walks, set_mark_at={"s3"})         # s3 bounces: the packet arrives at s2 and s1 marked
    assert deadlock._find_cycle(deadlock.dependencies(net, bounce=False)[0])
    assert not deadlock._find_cycle(deadlock.dependencies(net, bounce=True)[0])


def test_a_two_tier_fabric_has_no_cyclic_buffer_dependency_healthy_or_under_any_single_failure():
    proof = deadlock.prove(fgraph.build(spec.load("mini-hpn")))
    assert proof.exhaustive and proof.ok, deadlock.summary(proof)
    assert len(proof.states) == 1 + len(fgraph.build(spec.load("mini-hpn")).edges) + 12


def test_every_cycle_comes_from_bounced_detours_and_a_bounce_priority_breaks_it():
    g = fgraph.build(spec.load("mini-cross-campus"))
    one = deadlock.prove(g)
    for state in one.cycles:
        assert any("(bounced)" in w for w in state.witness), state.witness
    assert deadlock.prove(g, bounce=True).ok


def test_the_summary_names_a_cycle_and_the_state_it_is_in():
    proof = deadlock.DeadlockProof(False, True, [deadlock.StateProof("switch x", 3, 5, [("a", 1, 0), ("b", 2, 0)])],
                                   0.1)
    assert "switch x" in deadlock.summary(proof) and "a:1/p0 -> b:2/p0" in deadlock.summary(proof)


def test_needs_bounce_priority_is_computed_once_per_graph(monkeypatch):
    g = fgraph.build(spec.load("mini-hpn"))
    calls = []

    def prove(g, bounce=False):
        calls.append(1)
        return deadlock.DeadlockProof(bounce, True, [], 0.0)

    monkeypatch.setattr(deadlock, "prove", prove)
    assert deadlock.needs_bounce_priority(g) is False and deadlock.needs_bounce_priority(g) is False
    assert calls == [1]


@pytest.mark.parametrize("name", ["mini-spine-leaf", "fat-tree-4"])
def test_failures_are_every_link_and_switch_on_small_fabrics(name):
    g = fgraph.build(spec.load(name))
    failures, exhaustive = deadlock.failures_to_prove(g)
    assert exhaustive and len(failures) == g.number_of_edges() + len(fgraph.switches(g))


# ---- hpnlab check's rule -----------------------------------------------------------------------

def _rule(name: str, **lossless):
    from hpnlab.fabric.checks import rules
    ctx = rules.context(spec.load(name, {"emulation": {"lossless": lossless}} if lossless else None))
    return rules.run_checks(ctx, only=["deadlock-freedom"], rules={"deadlock-freedom": {"max_pairs": 10_000}})


def test_the_check_fails_a_cycle_when_bounced_detours_share_the_priority():
    rows = _rule("mini-cross-campus", bounce_priority="off")
    assert len(rows) == 1 and not rows[0].ok and "cyclic" in rows[0].figure


def test_the_check_passes_a_cycle_that_a_bounce_priority_breaks_and_says_so():
    rows = _rule("mini-cross-campus")
    assert [r.subject for r in rows] == ["one lossless priority", "bounced detours in priority 1"]
    assert all(r.ok for r in rows) and "priority of their own" in rows[0].detail


def test_a_fabric_beyond_the_budget_is_not_proved_and_says_so():
    from hpnlab.fabric.checks import rules
    rows = rules.run_checks(rules.context("mini-hpn"), only=["deadlock-freedom"],
                            rules={"deadlock-freedom": {"max_pairs": 10}})
    assert rows[0].figure == rules.NOT_AVAILABLE and "max_pairs" in rows[0].detail
