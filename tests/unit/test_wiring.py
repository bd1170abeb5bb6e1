"""The wiring check (controller/wiring.py): LLDP's observations held against the scenario's graph,
and what may be installed. Cablings are made with hpnlab.fabric.emulation.rewire, as the emulated
test makes them."""
from __future__ import annotations

import pytest

from hpnlab.controller import wiring
from hpnlab.fabric.emulation.rewire import Rewire, physical
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec

SWAP = (("p0l0", "p0s0"), ("p0l1", "p0s1"))
DROP = ("p0l2", "p0s0")


@pytest.fixture(scope="module")
def g():
    return fgraph.build(spec.load("mini-hpn"))


def lldp_of(g, rewire: Rewire) -> dict:
    return wiring.heard(physical(g, rewire))


def test_cabling_as_planned_has_no_finding(g):
    report = wiring.compare(g, lldp_of(g, Rewire()))
    assert report.clean
    assert report.links_ok == report.links_expected == 16


def test_a_link_heard_from_one_end_only_counts_as_planned(g):
    heard = lldp_of(g, Rewire())
    del heard["p0l0", 5]          # p0s0 port 1's frames lost, p0l0's arrive
    assert wiring.compare(g, heard).clean


def test_a_dropped_cable_is_missing_at_both_ends(g):
    report = wiring.compare(g, lldp_of(g, Rewire(drop=[DROP])))
    assert [(f.kind, f.switch, f.port) for f in report.findings] == [("missing", "p0l2", 5), ("missing", "p0s0", 3)]
    assert report.findings[0].expected == ("p0s0", 3)


def test_two_swapped_cables_are_four_miswired_ports_naming_both_cables(g):
    report = wiring.compare(g, lldp_of(g, Rewire(swap=[SWAP])))
    miswired = {(f.switch, f.port): f for f in report.findings}
    assert set(miswired) == {("p0l0", 5), ("p0l1", 6), ("p0s0", 1), ("p0s1", 2)}
    assert {f.kind for f in report.findings} == {"miswired"}
    leaf = miswired["p0l0", 5]
    assert (leaf.expected, leaf.observed) == (("p0s0", 1), ("p0s1", 2))
    assert leaf.swapped_with == (("p0l1", 6), ("p0s1", 2))
    assert "p0l0 port 5" in leaf.line() and "p0l1 port 6" in leaf.line() and "swapped" in leaf.line()


def test_swap_and_drop_are_reported_together_by_port(g):
    report = wiring.compare(g, lldp_of(g, Rewire(swap=[SWAP], drop=[DROP])))
    assert report.counts() == {"missing": 2, "miswired": 4, "unexpected": 0}
    assert report.links_ok == 16 - 3
    assert len(report.lines()) == 6


def test_a_switch_cabled_to_a_host_port_is_unexpected(g):
    heard = lldp_of(g, Rewire())
    heard["p0l0", 1] = ("p0s1", 9)       # a spine cable plugged where the scenario puts h1
    report = wiring.compare(g, heard)
    assert [(f.kind, f.switch, f.port) for f in report.findings] == [("unexpected", "p0l0", 1)]
    assert "host" in report.findings[0].line()


def test_a_datapath_outside_the_scenario_on_a_fabric_port_is_miswired(g):
    heard = lldp_of(g, Rewire())
    heard["p1l3", 6] = ("dpid:00000000000000aa", 1)
    report = wiring.compare(g, heard)
    assert ("p1l3", 6) in {(f.switch, f.port) for f in report.findings if f.kind == "miswired"}
    assert "dpid:00000000000000aa" in report.lines()[0] or "dpid:00000000000000aa" in " ".join(report.lines())


def test_refuse_installs_every_plane_and_holds_the_bad_cables_down(g):
    report = wiring.compare(g, lldp_of(g, Rewire(swap=[SWAP], drop=[DROP])))
    decision = wiring.decide(g, report, "refuse")
    assert decision.planes == (0, 1) and decision.blocked_planes == ()
    assert decision.held_down == {("p0l0", 5), ("p0s0", 1), ("p0l1", 6), ("p0s1", 2), ("p0l2", 5), ("p0s0", 3)}


def test_planes_installs_only_the_planes_that_check_out(g):
    report = wiring.compare(g, lldp_of(g, Rewire(swap=[SWAP], drop=[DROP])))
    decision = wiring.decide(g, report, "planes")
    assert decision.planes == (1,) and decision.blocked_planes == (0,)
    assert decision.held_down == frozenset()


def test_a_missing_cable_alone_blocks_no_plane(g):
    report = wiring.compare(g, lldp_of(g, Rewire(drop=[DROP])))
    decision = wiring.decide(g, report, "planes")
    assert decision.planes == (0, 1)
    assert decision.held_down == {("p0l2", 5), ("p0s0", 3)}


@pytest.mark.parametrize("mode", ["refuse", "planes"])
def test_a_plane_held_back_for_its_deployment_is_not_installed_whatever_the_mode(g, mode):
    report = wiring.compare(g, lldp_of(g, Rewire(drop=[DROP])))      # the missing cable is plane 0's
    decision = wiring.decide(g, report, mode, hold_planes={0})
    assert decision.planes == (1,) and decision.blocked_planes == (0,)
    assert decision.held_down == frozenset()        # nothing of plane 0 to hold: it is not installed at all


def test_a_cable_across_planes_blocks_both_planes(g):
    heard = lldp_of(g, Rewire())
    heard["p0l0", 5], heard["p1s0", 1] = ("p1s0", 1), ("p0l0", 5)
    decision = wiring.decide(g, wiring.compare(g, heard), "planes")
    assert decision.planes == ()


def _walks(g, states, cabling, failures=None):
    """Every entropy branch of every host pair on every plane, walked over ``cabling``."""
    from hpnlab.fabric.emulation.reachability import all_pairs
    from hpnlab.fabric.routing.oftable import FabricTables
    net = FabricTables(cabling, states, failures)
    for src, sip, dst, _dip in all_pairs(g):
        plane = next(p["plane"] for p in fgraph.host_ports(g, src) if p["ip"] == sip)
        for sport, _mask, walk in net.send_branches(src, dst, plane):
            yield (src, dst, plane, sport), walk


def test_refused_routes_never_cross_a_held_port_and_deliver_what_the_compiler_expects(g):
    """What refuse installs, walked over the miswired cabling with the table interpreter: no packet
    crosses a held-down port, no packet reaches a wrong host, and every walk ends as it does on the
    scenario's graph with those links failed (delivered where a way is left, dropped at once otherwise)."""
    from hpnlab.fabric.routing import compiler
    rewire = Rewire(swap=[SWAP], drop=[DROP])
    decision = wiring.decide(g, wiring.compare(g, lldp_of(g, rewire)), "refuse")
    ix = compiler.index_of(g)
    failures = compiler.Failures.of(links={ix.link_at(*p) for p in decision.held_down})
    states = compiler.compile_fabric(g, failures, "aggregate")
    planned = dict(_walks(g, states, g, failures))
    results = set()
    for key, walk in _walks(g, states, physical(g, rewire)):
        assert not {(sw, out) for sw, _in, out in walk.hops} & decision.held_down, (key, walk.hops)
        assert walk.result == planned[key].result, key
        assert walk.result != "delivered" or walk.delivered_to[0] == key[1]
        results.add(walk.result)
    assert results == {"delivered", "dropped"}


def test_without_the_gate_packets_cross_the_swapped_cables(g):
    from hpnlab.fabric.routing import compiler
    rewire = Rewire(swap=[SWAP])
    miswired = {(f.switch, f.port) for f in wiring.compare(g, lldp_of(g, rewire)).findings}
    states = compiler.compile_fabric(g, None, "aggregate")
    walks = _walks(g, states, physical(g, rewire))
    assert any({(sw, out) for sw, _in, out in walk.hops} & miswired for _key, walk in walks)


def test_decide_refuses_an_unknown_mode(g):
    with pytest.raises(ValueError, match="refuse, planes"):
        wiring.decide(g, wiring.compare(g, {}), "ignore")


def test_discovery_settles_once_nothing_new_was_learnt_for_the_discovery_time():
    assert not wiring.settled(2.9, 3.0, connected=12, expected=12)
    assert wiring.settled(3.0, 3.0, connected=12, expected=12)


def test_discovery_waits_out_a_switch_reconnect_backoff_while_a_switch_is_absent():
    """After a controller restart a switch may come back only after its reconnect backoff: deciding
    without it would reroute around its links."""
    assert not wiring.settled(3.0 + wiring.SWITCH_WAIT_S - 0.1, 3.0, connected=11, expected=12)
    assert wiring.settled(3.0 + wiring.SWITCH_WAIT_S, 3.0, connected=11, expected=12)


def test_lldp_is_due_per_switch_so_one_that_sends_out_of_turn_puts_off_no_other():
    sent = {"a": 100.0, "b": 104.0}        # b sent out of turn (a port of it came up) at 104
    assert wiring.lldp_due(sent, ["a", "b", "c"], now=105.0, decided=True) == ["a", "c"]   # c never sent
    assert wiring.lldp_due(sent, ["a", "b"], now=104.5, decided=True) == []
    assert wiring.lldp_due(sent, ["a", "b"], now=104.5, decided=False) == ["a"]           # every second before
