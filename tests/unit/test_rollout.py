"""Staged rollout, pure (controller/rollout.py): stages, probes, and what a stage's result is."""
from __future__ import annotations

import pytest

from hpnlab.controller import rollout
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec


@pytest.fixture(scope="module")
def g():
    return fgraph.build(spec.load("mini-hpn"))


def test_one_plane_per_stage_in_plane_order():
    assert rollout.stages([1, 0, 1]) == [0, 1]
    assert rollout.Rollout.of([]).phase == "done"


def test_every_leaf_probes_the_next_leaves_of_its_plane_on_every_branch(g):
    probes = rollout.probes(g, 1, fanout=3, branches=8)
    leaves = rollout.leaves(g, 1)
    assert {(p.src_leaf, p.dst_leaf) for p in probes} == {(a, b) for a in leaves for b in leaves if a != b}
    assert len(probes) == 4 * 3 * 8
    assert {p.sport for p in probes} == set(range(49152, 49160))
    assert len({p.probe_id for p in probes}) == len(probes)
    p = probes[0]
    assert g.nodes[p.src_host]["tier"] == 0 and g.edges[p.src_leaf, p.src_host, 0]["ports"][p.src_leaf] == p.in_port
    assert all(g.nodes[x.src_leaf]["plane"] == 1 == g.nodes[x.dst_leaf]["plane"] for x in probes)


def test_pairs_the_tables_do_not_deliver_are_not_probed(g):
    failures = compiler.Failures.of([("p0l0", "p0s0", 0), ("p0l1", "p0s1", 0)])   # p0l0 and p0l1: no way left
    net = FabricTables(g, compiler.compile_fabric(g, failures), failures)
    probes = rollout.probes(g, 0, lambda s, d, _ip, sport: net.send(s, d, plane=0, sport=sport).result == "delivered")
    pairs = {(p.src_leaf, p.dst_leaf) for p in probes}
    assert ("p0l0", "p0l1") not in pairs and ("p0l1", "p0l0") not in pairs and ("p0l0", "p0l2") in pairs


def test_leaf_probes_reach_the_destination_leaf_on_an_uplink_in_the_compiled_tables(g):
    """What the controller's leaf probes rely on: injected at the source leaf as from the source host, a probe
    walks to the destination leaf, which it enters on one of the uplinks the catching rules watch."""
    net = FabricTables(g, compiler.compile_fabric(g))
    catch = rollout.catch_points(g, 0)
    for p in rollout.probes(g, 0, mode="leaves"):
        walk = net.send(p.src_host, p.dst_host, plane=0, sport=p.sport)
        assert walk.result == "delivered"
        entered = [(sw, port) for sw, port, _out in walk.hops if sw == p.dst_leaf]
        assert entered and entered[0][1] in catch[p.dst_leaf]


def test_host_probes_reach_the_destination_host_and_its_answer_enters_the_source_leaf_on_an_uplink(g):
    """Host probes end at the host: the probe is delivered to the destination host's own port (through the
    destination leaf's last hop), and the host's answer (from PROBE_PORT) walks back to the source leaf,
    entering it on an uplink the catching rules watch."""
    net = FabricTables(g, compiler.compile_fabric(g))
    catch = rollout.catch_points(g, 0)
    probes = rollout.probes(g, 0)
    assert probes and {p.mode for p in probes} == {"hosts"}
    for p in probes:
        there = net.send(p.src_host, p.dst_host, plane=0, sport=p.sport)
        assert there.result == "delivered" and there.delivered_to is not None and there.delivered_to[0] == p.dst_host
        back = net.send(p.dst_host, p.src_host, plane=0, sport=rollout.PROBE_PORT)
        entered = [(sw, port) for sw, port, _out in back.hops if sw == p.src_leaf]
        assert back.result == "delivered" and entered and entered[0][1] in catch[p.src_leaf]


def test_host_probes_leave_out_pairs_whose_answer_has_no_way_back(g):
    one_way = lambda s, d, _ip, sport: sport != rollout.PROBE_PORT or d != "h1"  # noqa: E731  (answers to h1 lost)
    probes = rollout.probes(g, 0, one_way)
    assert probes and all(p.src_host != "h1" for p in probes)
    assert any(p.src_host == "h1" for p in rollout.probes(g, 0, one_way, mode="leaves"))


def test_a_host_probe_carries_its_id_in_the_sequence_number_its_answer_acknowledges(g):
    p = rollout.probes(g, 0)[5]
    assert rollout.probe_id_of_ack(p.seq + 1) == p.probe_id
    assert rollout.probe_id_of_ack(1) is None and rollout.probe_id_of_ack(rollout.PROBE_SEQ_BASE + 1) is None


def test_each_probe_mode_is_caught_by_its_own_match():
    assert dict(rollout.catch_match("hosts"))["tcp_src"] == rollout.PROBE_PORT
    assert dict(rollout.catch_match("leaves"))["udp_dst"] == rollout.PROBE_PORT


def test_a_host_probe_stage_passes_only_when_every_answer_arrived_at_its_source_leaf(g):
    probes = rollout.probes(g, 0, branches=2)
    assert rollout.evaluate(0, probes, {p.probe_id: p.src_leaf for p in probes}).ok
    assert not rollout.evaluate(0, probes, {p.probe_id: p.dst_leaf for p in probes}).ok


def test_a_stage_passes_only_when_every_probe_arrived_at_its_destination_leaf(g):
    probes = rollout.probes(g, 0, branches=2, mode="leaves")
    everywhere = {p.probe_id: p.dst_leaf for p in probes}
    assert rollout.evaluate(0, probes, everywhere).ok
    lost = dict(everywhere)
    lost.pop(probes[3].probe_id)
    result = rollout.evaluate(0, probes, lost)
    assert not result.ok and result.missing == (probes[3].probe_id,) and result.arrived == len(probes) - 1
    wrong = {**everywhere, probes[0].probe_id: probes[0].src_leaf}
    assert rollout.evaluate(0, probes, wrong).misdelivered == ((probes[0].probe_id, probes[0].src_leaf),)


def test_a_stage_with_nothing_to_probe_does_not_pass(g):
    assert not rollout.evaluate(0, [], {}).ok


def test_the_rollout_allows_the_passed_planes_and_the_current_one():
    r = rollout.Rollout.of([0, 1, 2])
    assert r.allowed() == {0}
    r.finish(rollout.StageResult(0, 4, 4))
    assert r.allowed() == {0, 1} and r.phase == "install"
    r.finish(rollout.StageResult(1, 4, 3, missing=(9,)))
    assert r.allowed() == {0, 2} and r.rolled_back == [1]
    r.finish(rollout.StageResult(2, 4, 4))
    assert r.phase == "done" and r.as_dict()["passed"] == [0, 2]


def test_a_probe_payload_carries_its_id():
    assert rollout.probe_id_of(b"hpnlab-probe:42") == 42
    assert rollout.probe_id_of(b"hello") is None and rollout.probe_id_of(b"hpnlab-probe:x") is None
