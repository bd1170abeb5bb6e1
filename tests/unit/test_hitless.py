"""A connecting switch is read back, and only what differs from what it holds is sent: a controller
that restarts changes nothing that is already right (pure reconciler, no switch)."""
from __future__ import annotations

import pytest
from support.fabrics import answer, fabric, installed

from hpnlab.controller import reconcile
from hpnlab.fabric.routing import compiler


@pytest.fixture(scope="module")
def mini_hpn():
    return fabric("mini-hpn")


def reconnect(rec: reconcile.Reconciler, sw: str, held: dict) -> list:
    """``sw`` connects and reports that it holds ``held`` (a SwitchTable, split into flow stats
    in two parts and group descriptions): every message sent up to the end of the update."""
    flows_req, groups_req = rec.handle(reconcile.SwitchUp(sw))
    assert isinstance(flows_req, reconcile.FlowStatsRequest) and isinstance(groups_req, reconcile.GroupDescRequest)
    flows = [reconcile.FlowEntry(k[0], k[1], k[2], a) for k, a in held.items() if not reconcile.is_group(k)]
    groups = tuple(g for k, g in held.items() if reconcile.is_group(k))
    assert rec.handle(reconcile.FlowStatsReply(sw, flows_req.xid, tuple(flows[:2]), more=True)) == []
    assert rec.handle(reconcile.GroupDescReply(sw, groups_req.xid, groups)) == []
    return answer(rec, rec.handle(reconcile.FlowStatsReply(sw, flows_req.xid, tuple(flows[2:]))))


def restarted(g) -> reconcile.Reconciler:
    """A new controller (nothing known) beside switches that hold the healthy state."""
    return reconcile.Reconciler(g)


def mods(msgs: list) -> list:
    return [m for m in msgs if isinstance(m, (reconcile.FlowMod, reconcile.GroupMod))]


def test_a_switch_that_holds_its_desired_state_gets_no_change(mini_hpn):
    rec = restarted(mini_hpn)
    for sw in rec.desired:
        assert mods(reconnect(rec, sw, dict(rec.desired[sw]))) == [], sw
    assert rec.settled and rec.counters["reads"] == len(rec.desired)


def test_a_switch_that_holds_its_state_with_groups_sends_no_barrier_either(mini_hpn):
    rec = restarted(mini_hpn)
    sw = next(s for s, t in rec.desired.items() if any(reconcile.is_group(k) for k in t))
    assert reconnect(rec, sw, dict(rec.desired[sw])) == []


def test_one_flow_that_differs_is_the_one_message_sent(mini_hpn):
    rec = restarted(mini_hpn)
    held = dict(rec.desired["p0l1"])
    key = next(k for k in held if not reconcile.is_group(k) and k[0] == compiler.TABLE_ROUTE)
    held[key] = (("output", 99),)
    sent = mods(reconnect(rec, "p0l1", held))
    assert [(m.command, m.key, m.actions) for m in sent] == [("modify", key, rec.desired["p0l1"][key])]


def test_a_lost_flow_is_added_and_nothing_else(mini_hpn):
    rec = restarted(mini_hpn)
    held = dict(rec.desired["p0s0"])
    key = max(k for k in held if not reconcile.is_group(k))
    del held[key]
    sent = mods(reconnect(rec, "p0s0", held))
    assert [(m.command, m.key) for m in sent] == [("add", key)]


def test_a_group_whose_buckets_differ_gets_one_group_modify(mini_hpn):
    rec = restarted(mini_hpn)
    held = dict(rec.desired["p0l0"])
    gkey = min(k for k in held if reconcile.is_group(k) and len(set(held[k].buckets)) > 1)
    group = held[gkey]
    held[gkey] = compiler.Group(group.group_id, group.kind, tuple(reversed(group.buckets)))
    assert held[gkey] != group
    sent = mods(reconnect(rec, "p0l0", held))
    assert [(type(m).__name__, m.command, m.group_id) for m in sent] == [("GroupMod", "modify", gkey.group_id)]
    assert sent[0].group == group


def test_stale_flows_and_groups_are_deleted_flows_first(mini_hpn):
    """Entries the switch kept from another state (or someone added by hand) go; a stale group only
    after the stale flow that sends to it."""
    rec = restarted(mini_hpn)
    held = dict(rec.desired["p0l0"])
    stale_flow = (compiler.TABLE_ROUTE, 1100, (("eth_type", 0x800), ("ipv4_dst", (0x0B000000, 0xFF000000))))
    held[stale_flow] = (("group", 4242),)
    held[reconcile.GroupKey(4242)] = compiler.Group(4242, "ff", ((1, (("output", 1),)),))
    sent = reconnect(rec, "p0l0", held)
    deleted = [(type(m).__name__, m.key) for m in mods(sent)]
    assert deleted == [("FlowMod", stale_flow), ("GroupMod", reconcile.GroupKey(4242))]
    assert all(m.command == "delete" for m in mods(sent))
    between = sent[sent.index(mods(sent)[0]):sent.index(mods(sent)[1])]
    assert any(isinstance(m, reconcile.Barrier) for m in between)
    assert rec.settled and rec.confirmed["p0l0"] == rec.desired["p0l0"]


def test_a_switch_that_holds_nothing_is_installed_whole(mini_hpn):
    rec = restarted(mini_hpn)
    sent = mods(reconnect(rec, "p0l0", {}))
    assert {m.key for m in sent} == set(rec.desired["p0l0"])
    assert {m.command for m in sent} == {"add"}


def test_a_restarted_controller_beside_a_fabric_that_was_rerouted_changes_only_what_the_port_state_does(mini_hpn):
    """The switches hold the tables of a failed link; the new controller learns the link is down
    before it compares (the app asks for port descriptions first): nothing to send."""
    failed = compiler.Failures.of([("p0l0", "p0s0", 0)])
    held = {sw: reconcile.switch_table(st) for sw, st in compiler.compile_fabric(mini_hpn, failed).items()}
    rec = restarted(mini_hpn)
    port = mini_hpn.edges["p0l0", "p0s0", 0]["ports"]["p0l0"]
    answer(rec, rec.handle(reconcile.PortStatus("p0l0", {port: False})))
    for sw in sorted(held):
        assert mods(reconnect(rec, sw, held[sw])) == [], sw
    assert rec.settled


def test_the_restart_of_an_installed_fabric_sends_no_flow_mod_at_all(mini_hpn):
    """installed(): the switches got their tables through the reconciler; a second reconciler
    (the restarted controller) reads them back and sends nothing."""
    first = installed(mini_hpn)
    second = restarted(mini_hpn)
    sent = []
    for sw in sorted(first.confirmed):
        sent += reconnect(second, sw, dict(first.confirmed[sw]))
    assert mods(sent) == [] and second.settled
