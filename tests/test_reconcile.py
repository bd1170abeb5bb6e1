"""The pure reconciler, event by event: link state, what it recompiles, what counts as
installed, the order of its messages, and resynchronisation (no switch, no os-ken)."""
from __future__ import annotations

import pytest

from hpnlab.controller import compiler, reconcile
from hpnlab.fabric import graph, spec


@pytest.fixture(scope="module")
def mini_hpn():
    return graph.build(spec.load("mini-hpn"))


def port(g, a: str, b: str, at: str) -> int:
    return g.edges[a, b, 0]["ports"][at]


def answer(rec: reconcile.Reconciler, msgs: list, now: float = 0.0) -> list:
    """Answer every barrier (and the barriers of what follows) until the reconciler is quiet;
    return every message it sent on the way."""
    sent = list(msgs)
    queue = list(msgs)
    while queue:
        m = queue.pop(0)
        if isinstance(m, reconcile.Barrier):
            more = rec.handle(reconcile.BarrierReply(m.switch, m.xid), now)
            sent += more
            queue += more
    return sent


def installed(g, policy: str = "aggregate") -> reconcile.Reconciler:
    rec = reconcile.Reconciler(g, policy)
    msgs = []
    for sw in graph.switches(g):
        msgs += rec.handle(reconcile.SwitchUp(sw))
    answer(rec, msgs)
    assert rec.settled
    return rec


def test_a_link_counts_down_as_soon_as_one_end_reports_it(mini_hpn):
    rec = installed(mini_hpn)
    msgs = rec.handle(reconcile.PortStatus("p0l0", {port(mini_hpn, "p0l0", "p0s0", "p0l0"): False}))
    assert rec.failures.links == {("p0l0", "p0s0", 0)}
    assert any(isinstance(m, reconcile.FlowMod) for m in msgs)


def test_the_other_end_reporting_the_same_link_down_changes_nothing(mini_hpn):
    rec = installed(mini_hpn)
    answer(rec, rec.handle(reconcile.PortStatus("p0l0", {port(mini_hpn, "p0l0", "p0s0", "p0l0"): False})))
    recompiles = rec.counters["recompiles"]
    assert rec.handle(reconcile.PortStatus("p0s0", {port(mini_hpn, "p0l0", "p0s0", "p0s0"): False})) == []
    assert rec.counters["recompiles"] == recompiles


def test_a_link_is_up_again_only_once_both_ends_report_it_up(mini_hpn):
    rec = installed(mini_hpn)
    a, b = port(mini_hpn, "p0l0", "p0s0", "p0l0"), port(mini_hpn, "p0l0", "p0s0", "p0s0")
    answer(rec, rec.handle(reconcile.PortStatus("p0l0", {a: False})))
    answer(rec, rec.handle(reconcile.PortStatus("p0s0", {b: False})))
    assert rec.handle(reconcile.PortStatus("p0l0", {a: True})) == []
    assert rec.failures.links == {("p0l0", "p0s0", 0)}
    answer(rec, rec.handle(reconcile.PortStatus("p0s0", {b: True})))
    assert not rec.failures and rec.settled
    assert rec.desired == {sw: reconcile.switch_table(st) for sw, st in rec.healthy.items()}


def test_a_port_that_is_no_link_recompiles_nothing(mini_hpn):
    rec = installed(mini_hpn)
    assert rec.handle(reconcile.PortStatus("p0l0", {999: False})) == []
    assert rec.counters["recompiles"] == 0


def test_a_link_failure_recompiles_only_its_plane(mini_hpn):
    rec = installed(mini_hpn)
    plane1 = {sw: rec.states[sw] for sw in rec.states if sw.startswith("p1")}
    rec.handle(reconcile.PortStatus("p0l0", {port(mini_hpn, "p0l0", "p0s0", "p0l0"): False}))
    assert rec.last_recompiled_planes == (0,)
    assert all(rec.states[sw] is st for sw, st in plane1.items())


def test_a_switch_that_connects_is_wiped_before_anything_else(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn)
    msgs = rec.handle(reconcile.SwitchUp("p0l0"))
    assert [type(m) for m in msgs] == [reconcile.WipeTables, reconcile.Barrier]


def test_flows_count_as_installed_only_once_their_barrier_is_answered(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn)
    (_wipe, barrier) = rec.handle(reconcile.SwitchUp("p0l0"))
    assert isinstance(barrier, reconcile.Barrier)
    install = rec.handle(reconcile.BarrierReply("p0l0", barrier.xid))
    assert any(isinstance(m, reconcile.FlowMod) for m in install)
    assert rec.confirmed["p0l0"] == {}
    answer(rec, install)
    assert rec.confirmed["p0l0"] == rec.desired["p0l0"]


def test_an_unknown_barrier_reply_confirms_nothing(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn)
    (_wipe, barrier) = rec.handle(reconcile.SwitchUp("p0l0"))
    assert isinstance(barrier, reconcile.Barrier)
    install = rec.handle(reconcile.BarrierReply("p0l0", barrier.xid))
    rec.handle(reconcile.BarrierReply("p0l0", 123456))
    assert rec.confirmed["p0l0"] == {} and install


def test_each_switch_gets_additions_and_deletions_in_separate_barriered_groups(mini_hpn):
    """Make before break inside a switch: a group between two barriers either adds/changes or
    deletes, never both; additions go entropy table first (before the routes that use it),
    deletions route table first (entropy entries go once no route uses them)."""
    rec = installed(mini_hpn)
    p = port(mini_hpn, "p0l0", "p0s0", "p0l0")
    steps = [rec.handle(reconcile.PortStatus("p0l0", {p: False}))]
    while steps[-1]:
        steps.append(answer_once(rec, steps[-1]))
    steps.append(rec.handle(reconcile.PortStatus("p0l0", {p: True})))
    while steps[-1]:
        steps.append(answer_once(rec, steps[-1]))
    saw_delete = False
    for step in steps:
        for sw in graph.switches(mini_hpn):
            groups = _segments([m for m in step if m.switch == sw])
            kinds = [{m.command == "delete" for m in g} for g in groups]
            assert all(len(k) == 1 for k in kinds), f"{sw}: additions and deletions without a barrier between"
            order = [k.pop() for k in kinds]
            assert order == sorted(order), f"{sw}: a deletion group before an addition group"
            for g in groups:
                tables = [m.table for m in g]
                assert tables == sorted(tables, reverse=g[0].command != "delete")
            saw_delete |= any(order)
    assert saw_delete


def answer_once(rec: reconcile.Reconciler, msgs: list) -> list:
    """Answer the barriers of one step; return the next step."""
    out = []
    for m in msgs:
        if isinstance(m, reconcile.Barrier):
            out += rec.handle(reconcile.BarrierReply(m.switch, m.xid))
    return out


def _segments(msgs: list) -> list[list]:
    out: list[list] = []
    cur: list = []
    for m in msgs:
        if isinstance(m, reconcile.Barrier):
            if cur:
                out.append(cur)
            cur = []
        elif isinstance(m, reconcile.FlowMod):
            cur.append(m)
    if cur:
        out.append(cur)
    return out


def test_a_repair_updates_the_switch_next_to_the_destination_before_the_switches_that_send_to_it(mini_hpn):
    """p0s0 must hold its route to p0l0 again before the other leaves drop their detour."""
    rec = installed(mini_hpn)
    p = port(mini_hpn, "p0l0", "p0s0", "p0l0")
    answer(rec, rec.handle(reconcile.PortStatus("p0l0", {p: False})))
    first = rec.handle(reconcile.PortStatus("p0l0", {p: True}))
    assert {m.switch for m in first if isinstance(m, reconcile.FlowMod)} <= {"p0s0", "p0l0"}
    assert any(m.switch == "p0s0" for m in first if isinstance(m, reconcile.FlowMod))
    later = answer(rec, first)
    assert any(m.switch == "p0l1" and m.command == "delete" for m in later if isinstance(m, reconcile.FlowMod))


def test_nothing_new_is_sent_while_a_confirmation_is_outstanding(mini_hpn):
    rec = installed(mini_hpn)
    first = rec.handle(reconcile.PortStatus("p0l0", {port(mini_hpn, "p0l0", "p0s0", "p0l0"): False}))
    assert first
    assert rec.handle(reconcile.PortStatus("p1l0", {port(mini_hpn, "p1l0", "p1s0", "p1l0"): False})) == []
    answer(rec, first)
    assert rec.settled and rec.failures.links == {("p0l0", "p0s0", 0), ("p1l0", "p1s0", 0)}


def test_an_error_resynchronises_the_switch_from_its_flow_stats(mini_hpn):
    rec = installed(mini_hpn)
    request, groups = rec.handle(reconcile.Error("p0l1", xid=7, type=5, code=1))
    assert isinstance(request, reconcile.FlowStatsRequest) and request.switch == "p0l1"
    assert isinstance(groups, reconcile.GroupDescRequest) and groups.switch == "p0l1"
    assert "p0l1" not in rec.confirmed
    have = dict(rec.desired["p0l1"])
    lost = max(have)
    del have[lost]
    have[(1, 1100, (("eth_type", 0x800),))] = (("output", 9),)      # a stray entry
    flows = tuple(reconcile.FlowEntry(k[0], k[1], k[2], a) for k, a in have.items())
    part1 = rec.handle(reconcile.FlowStatsReply("p0l1", request.xid, flows[:3], more=True))
    assert part1 == []
    assert rec.handle(reconcile.GroupDescReply("p0l1", groups.xid, ())) == []
    fix = rec.handle(reconcile.FlowStatsReply("p0l1", request.xid, flows[3:]))
    mods = [m for m in fix if isinstance(m, reconcile.FlowMod)]
    assert [(m.command, m.key) for m in mods if m.command != "delete"] == [("add", lost)]
    answer(rec, fix)
    answer(rec, [])
    assert rec.settled and rec.counters["resyncs"] == 1


def test_a_confirmation_that_does_not_arrive_in_time_resynchronises_the_switch(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0)
    (_wipe, barrier) = rec.handle(reconcile.SwitchUp("p0l0"), now=10.0)
    assert isinstance(barrier, reconcile.Barrier)
    assert rec.handle(reconcile.Tick(), now=11.0) == []
    request, groups = rec.handle(reconcile.Tick(), now=12.5)
    assert isinstance(request, reconcile.FlowStatsRequest) and request.switch == "p0l0"
    assert isinstance(groups, reconcile.GroupDescRequest) and groups.switch == "p0l0"
    assert rec.handle(reconcile.BarrierReply("p0l0", barrier.xid)) == []     # too late: the resync decides


def test_a_switch_that_goes_down_is_routed_around_and_forgotten(mini_hpn):
    rec = installed(mini_hpn)
    answer(rec, rec.handle(reconcile.SwitchDown("p0s0")))
    assert rec.failures.switches == {"p0s0"} and "p0s0" not in rec.desired and "p0s0" not in rec.confirmed
    assert rec.settled


def test_every_event_type_is_handled_and_anything_else_is_refused(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn)
    with pytest.raises(TypeError):
        rec.handle("switch up")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", compiler.ROUTING_POLICIES)
def test_after_any_sequence_the_confirmed_state_is_the_compilers(mini_hpn, policy):
    rec = installed(mini_hpn, policy)
    failures = compiler.Failures.of([("p0l0", "p0s0", 0)], ["p1s1"])
    answer(rec, rec.handle(reconcile.PortStatus("p0l0", {port(mini_hpn, "p0l0", "p0s0", "p0l0"): False})))
    answer(rec, rec.handle(reconcile.SwitchDown("p1s1")))
    want = compiler.compile_fabric(mini_hpn, failures, policy)
    assert rec.confirmed == {sw: reconcile.switch_table(st) for sw, st in want.items()}


def test_a_switch_that_reconnects_keeps_its_ports_last_known_state_until_it_reports_them(mini_hpn):
    rec = installed(mini_hpn)
    p = port(mini_hpn, "p0l0", "p0s0", "p0l0")
    answer(rec, rec.handle(reconcile.PortStatus("p0l0", {p: False})))
    answer(rec, rec.handle(reconcile.SwitchDown("p0l0")))
    answer(rec, rec.handle(reconcile.SwitchUp("p0l0")))
    assert rec.failures.links == {("p0l0", "p0s0", 0)} and not rec.failures.switches
    answer(rec, rec.handle(reconcile.SwitchUp("p0l0", {p: True})))
    assert not rec.failures and rec.settled
