"""The pure reconciler, event by event: link state, what it recompiles, what counts as
installed, the order of its messages, and resynchronisation (no switch, no os-ken)."""
from __future__ import annotations

import pytest
from support.fabrics import answer, fabric, installed

from hpnlab.controller import reconcile
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.scenario.addressing import prefix_int


@pytest.fixture(scope="module")
def mini_hpn():
    return graph.build(spec.load("mini-hpn"))


def port(g, a: str, b: str, at: str) -> int:
    return g.edges[a, b, 0]["ports"][at]


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


def spine_ports_down(g, spine: str) -> list[reconcile.PortStatus]:
    """A spine's failure as its neighbours report it: one PortStatus each, every one but the last with more
    behind it."""
    neighbours = sorted(g[spine])
    return [reconcile.PortStatus(nb, {port(g, nb, spine, nb): False}, more=i < len(neighbours) - 1)
            for i, nb in enumerate(neighbours)]


def test_port_statuses_that_come_together_are_recompiled_once(mini_hpn):
    rec = installed(mini_hpn)
    for ev in spine_ports_down(mini_hpn, "p0s0"):
        rec.handle(ev)
    assert rec.counters["recompiles"] == 1
    assert rec.failures.links == {(min(nb, "p0s0"), max(nb, "p0s0"), 0) for nb in mini_hpn["p0s0"]}


def test_nothing_is_sent_while_more_port_statuses_are_waiting(mini_hpn):
    rec = installed(mini_hpn)
    *waiting, last = spine_ports_down(mini_hpn, "p0s0")
    assert all(rec.handle(ev) == [] for ev in waiting)
    assert not rec.settled and rec.counters["recompiles"] == 0
    assert any(isinstance(m, reconcile.FlowMod | reconcile.GroupMod) for m in rec.handle(last))


def test_a_recompile_left_waiting_runs_at_the_next_event_of_any_kind(mini_hpn):
    rec = installed(mini_hpn)
    *waiting, _last = spine_ports_down(mini_hpn, "p0s0")
    for ev in waiting:
        rec.handle(ev)
    answer(rec, rec.handle(reconcile.Tick(), now=1.0), now=1.0)
    assert rec.counters["recompiles"] == 1 and rec.settled
    assert rec.confirmed == {sw: reconcile.switch_table(st) for sw, st in compiler.compile_fabric(
        mini_hpn, rec.failures, "aggregate").items()}


def test_a_switch_that_connects_is_asked_what_it_holds_before_anything_else(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn)
    msgs = rec.handle(reconcile.SwitchUp("p0l0"))
    assert [type(m) for m in msgs] == [reconcile.FlowStatsRequest, reconcile.GroupDescRequest]


def read_requests(msgs: list) -> tuple[reconcile.FlowStatsRequest, reconcile.GroupDescRequest]:
    """The two requests that read a switch back, and nothing else."""
    flows, groups = msgs
    assert isinstance(flows, reconcile.FlowStatsRequest) and isinstance(groups, reconcile.GroupDescRequest)
    return flows, groups


def connect_empty(rec: reconcile.Reconciler, sw: str, now: float = 0.0) -> list:
    """``sw`` connects and reports that it holds nothing: what the reconciler sends then."""
    flows, groups = read_requests(rec.handle(reconcile.SwitchUp(sw), now))
    assert rec.handle(reconcile.FlowStatsReply(sw, flows.xid), now) == []
    return rec.handle(reconcile.GroupDescReply(sw, groups.xid), now)


def test_flows_count_as_installed_only_once_their_barrier_is_answered(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn)
    install = connect_empty(rec, "p0l0")
    assert any(isinstance(m, reconcile.FlowMod) for m in install)
    assert rec.confirmed["p0l0"] == {}
    answer(rec, install)
    assert rec.confirmed["p0l0"] == rec.desired["p0l0"]


def test_an_unknown_barrier_reply_confirms_nothing(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn)
    install = connect_empty(rec, "p0l0")
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


def test_a_repair_returns_every_leaf_to_the_healthy_set_at_once_since_the_spine_kept_its_route(mini_hpn):
    """p0s0's route to p0l0 goes through a fast-failover group that detoured while the link was
    down and forwards on it again as soon as its port is live: nothing downstream has to change
    first, so the other leaves drop their "avoid p0s0" route in the first step."""
    rec = installed(mini_hpn)
    p = port(mini_hpn, "p0l0", "p0s0", "p0l0")
    answer(rec, rec.handle(reconcile.PortStatus("p0l0", {p: False})))
    first = rec.handle(reconcile.PortStatus("p0l0", {p: True}))
    mods = [m for m in first if isinstance(m, reconcile.FlowMod)]
    assert not any(m.switch == "p0s0" for m in mods)
    assert any(m.switch == "p0l1" and m.command == "delete" for m in mods)
    answer(rec, first)
    assert rec.settled and not rec.failures


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
    have = {k: a for k, a in rec.desired["p0l1"].items() if not reconcile.is_group(k)}
    held = tuple(g for k, g in rec.desired["p0l1"].items() if reconcile.is_group(k))
    lost = max(have)
    del have[lost]
    have[(1, 1100, (("eth_type", 0x800),))] = (("output", 9),)      # a stray entry
    flows = tuple(reconcile.FlowEntry(k[0], k[1], k[2], a) for k, a in have.items())
    part1 = rec.handle(reconcile.FlowStatsReply("p0l1", request.xid, flows[:3], more=True))
    assert part1 == []
    assert rec.handle(reconcile.GroupDescReply("p0l1", groups.xid, held)) == []
    fix = rec.handle(reconcile.FlowStatsReply("p0l1", request.xid, flows[3:]))
    mods = [m for m in fix if isinstance(m, reconcile.FlowMod)]
    assert [(m.command, m.key) for m in mods if m.command != "delete"] == [("add", lost)]
    answer(rec, fix)
    answer(rec, [])
    assert rec.settled and rec.counters["resyncs"] == 1


def test_a_confirmation_that_does_not_arrive_in_time_resynchronises_the_switch(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0)
    barrier = connect_empty(rec, "p0l0", now=10.0)[-1]
    assert isinstance(barrier, reconcile.Barrier)
    assert rec.handle(reconcile.Tick(), now=11.0) == []
    request, groups = rec.handle(reconcile.Tick(), now=12.5)
    assert isinstance(request, reconcile.FlowStatsRequest) and request.switch == "p0l0"
    assert isinstance(groups, reconcile.GroupDescRequest) and groups.switch == "p0l0"
    assert rec.handle(reconcile.BarrierReply("p0l0", barrier.xid)) == []     # too late: the resync decides


def test_the_time_to_confirm_counts_from_when_the_messages_left_not_from_when_they_were_decided(mini_hpn):
    """A plan and its encoding that take the controller 30 s are not the switch's silence."""
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0)
    barrier = connect_empty(rec, "p0l0", now=10.0)[-1]
    rec.sent(40.0)
    assert rec.handle(reconcile.Tick(), now=41.5) == []
    request, groups = rec.handle(reconcile.Tick(), now=42.5)
    assert isinstance(request, reconcile.FlowStatsRequest) and request.switch == "p0l0"
    assert isinstance(groups, reconcile.GroupDescRequest) and groups.switch == "p0l0"
    assert rec.handle(reconcile.BarrierReply("p0l0", barrier.xid)) == []


def test_a_read_back_also_counts_from_when_its_requests_left(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0)
    rec.handle(reconcile.SwitchUp("p0l0"), now=10.0)
    rec.sent(20.0)
    assert rec.handle(reconcile.Tick(), now=21.0) == []
    assert [type(m) for m in rec.handle(reconcile.Tick(), now=22.5)] == [reconcile.FlowStatsRequest,
                                                                         reconcile.GroupDescRequest]


def test_sent_restamps_only_what_the_last_handle_returned(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0)
    connect_empty(rec, "p0l0", now=10.0)
    rec.sent(10.0)
    rec.handle(reconcile.SwitchUp("p0l1"), now=11.0)
    rec.sent(30.0)               # p0l1's read-back left late; p0l0's barrier had left at 10
    request, groups = rec.handle(reconcile.Tick(), now=12.5)
    assert (request.switch, groups.switch) == ("p0l0", "p0l0")


def test_while_the_controller_has_events_waiting_a_timeout_runs_ten_times_longer(mini_hpn):
    """The barrier's answer may be one of the events not yet handled; a switch that is really silent is
    still found, later."""
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0)
    connect_empty(rec, "p0l0", now=10.0)
    assert rec.handle(reconcile.Tick(backlog=40), now=29.0) == []
    assert [m.switch for m in rec.handle(reconcile.Tick(backlog=40), now=30.5)] == ["p0l0", "p0l0"]


def test_while_the_controller_uses_up_its_cpu_a_timeout_runs_ten_times_longer(mini_hpn):
    """os-ken parses a reply before it becomes an event: a controller at full CPU may hold the answer."""
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0)
    connect_empty(rec, "p0l0", now=10.0)
    assert rec.handle(reconcile.Tick(busy=True), now=29.0) == []
    assert rec.handle(reconcile.Tick(busy=False), now=29.0) != []


def test_a_switch_that_answers_its_barriers_one_by_one_is_not_timed_out(mini_hpn):
    """Silence counts from its last answer: a long step confirms barrier by barrier."""
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0)
    barriers = [m for m in connect_empty(rec, "p0l0", now=10.0) if isinstance(m, reconcile.Barrier)]
    assert len(barriers) >= 2
    rec.handle(reconcile.BarrierReply("p0l0", barriers[0].xid), now=11.9)
    assert rec.handle(reconcile.Tick(), now=13.5) == []
    assert [m.switch for m in rec.handle(reconcile.Tick(), now=14.0)] == ["p0l0", "p0l0"]


def test_each_timeout_of_a_switch_doubles_its_next_one(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0)
    connect_empty(rec, "p0l0", now=10.0)
    assert len(rec.handle(reconcile.Tick(), now=12.5)) == 2           # 2 s: read back
    assert rec.handle(reconcile.Tick(), now=16.0) == []               # the read-back's: 4 s
    assert len(rec.handle(reconcile.Tick(), now=16.6)) == 2
    assert rec.handle(reconcile.Tick(), now=24.5) == []               # then 8 s
    assert len(rec.handle(reconcile.Tick(), now=24.7)) == 2


def test_a_switch_that_answered_everything_again_has_a_shorter_timeout(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0)
    connect_empty(rec, "p0l0", now=10.0)
    read = rec.handle(reconcile.Tick(), now=12.5)                     # timed out once: 4 s now
    answer(rec, read, now=13.0)                                       # read back, installed, confirmed: 2 s
    assert rec.settled
    rec.handle(reconcile.PortStatus("p0l0", {port(mini_hpn, "p0l0", "p0s0", "p0l0"): False}), now=20.0)
    assert [m.switch for m in rec.handle(reconcile.Tick(), now=22.5)].count("p0l0") == 2


def reads(msgs: list) -> list[str]:
    """The switches a batch of messages asks to read back (each once)."""
    return [m.switch for m in msgs if isinstance(m, reconcile.FlowStatsRequest)]


def test_no_more_switches_are_read_back_at_once_than_allowed(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, reads_at_once=2)
    asked = [reads(rec.handle(reconcile.SwitchUp(sw))) for sw in ("p0l0", "p0l1", "p0s0")]
    assert asked == [["p0l0"], ["p0l1"], []]
    assert len(rec.resyncing) == 2 and rec.counters["reads_queued"] == 1


def test_a_switch_waiting_its_turn_is_read_back_once_another_read_completes(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, reads_at_once=1)
    flows, groups = read_requests(rec.handle(reconcile.SwitchUp("p0l0")))
    rec.handle(reconcile.SwitchUp("p0l1"))
    assert rec.handle(reconcile.FlowStatsReply("p0l0", flows.xid)) == []
    assert reads(rec.handle(reconcile.GroupDescReply("p0l0", groups.xid))) == ["p0l1"]


def test_a_switch_waiting_its_turn_does_not_time_out(mini_hpn):
    """Its timeout starts when its requests leave, not when it was queued."""
    rec = reconcile.Reconciler(mini_hpn, confirm_timeout_s=2.0, reads_at_once=1)
    rec.handle(reconcile.SwitchUp("p0l0"), now=0.0)
    rec.handle(reconcile.SwitchUp("p0l1"), now=0.0)
    assert reads(rec.handle(reconcile.Tick(), now=2.5)) == ["p0l0"]     # the one being read, again
    assert "p0l1" not in rec.resyncing and rec.counters["resyncs"] == 1


def test_a_switch_that_disconnects_while_waiting_its_turn_is_not_read_back(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, reads_at_once=1)
    flows, groups = read_requests(rec.handle(reconcile.SwitchUp("p0l0")))
    rec.handle(reconcile.SwitchUp("p0l1"))
    rec.handle(reconcile.SwitchDown("p0l1"))
    rec.handle(reconcile.FlowStatsReply("p0l0", flows.xid))
    assert reads(rec.handle(reconcile.GroupDescReply("p0l0", groups.xid))) == []


def test_a_disconnect_frees_its_read_back_slot_for_the_next_switch(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, reads_at_once=1)
    rec.handle(reconcile.SwitchUp("p0l0"))
    rec.handle(reconcile.SwitchUp("p0l1"))
    assert reads(rec.handle(reconcile.SwitchDown("p0l0"))) == ["p0l1"]


def test_nothing_is_installed_while_switches_wait_to_be_read_back(mini_hpn):
    """A step needs every connected switch read back: no half-known fabric is planned for."""
    rec = reconcile.Reconciler(mini_hpn, reads_at_once=1)
    flows, groups = read_requests(rec.handle(reconcile.SwitchUp("p0l0")))
    rec.handle(reconcile.SwitchUp("p0l1"))
    rec.handle(reconcile.FlowStatsReply("p0l0", flows.xid))
    msgs = rec.handle(reconcile.GroupDescReply("p0l0", groups.xid))
    assert not any(isinstance(m, (reconcile.FlowMod, reconcile.GroupMod)) for m in msgs)


def test_with_one_read_at_a_time_a_whole_fabric_still_ends_installed(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, reads_at_once=1)
    msgs = [m for sw in graph.switches(mini_hpn) for m in rec.handle(reconcile.SwitchUp(sw))]
    answer(rec, msgs)
    assert rec.settled and rec.confirmed == rec.desired


def test_reads_at_once_below_one_is_refused(mini_hpn):
    with pytest.raises(ValueError, match="reads_at_once"):
        reconcile.Reconciler(mini_hpn, reads_at_once=0)


def test_a_switch_that_goes_down_is_routed_around_and_forgotten(mini_hpn):
    rec = installed(mini_hpn)
    answer(rec, rec.handle(reconcile.SwitchDown("p0s0")))
    assert rec.failures.switches == {"p0s0"} and "p0s0" not in rec.desired and "p0s0" not in rec.confirmed
    assert rec.settled


def test_every_event_type_is_handled_and_anything_else_is_refused(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn)
    with pytest.raises(TypeError):
        rec.handle("switch up")  # type: ignore[arg-type]


@pytest.mark.parametrize("rebuild_above", [0.5, 0.0, float("inf")])
@pytest.mark.parametrize("policy", compiler.ROUTING_POLICIES)
def test_after_any_sequence_the_confirmed_state_is_the_compilers(mini_hpn, policy, rebuild_above):
    """Whether changed switches get their tables patched (and diffed on the touched keys) or built anew."""
    rec = installed(mini_hpn, policy)
    rec.rebuild_above = rebuild_above
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


# ---- groups ------------------------------------------------------------------------------------

def regrouping(g) -> reconcile.CompileFn:
    """The real compiler, with groups that change with the failures (its own are precomputed: no
    failure of these presets changes one): under any failure every group of even id is renumbered
    (what sends to it follows: an add and a delete) and every other group gets its first bucket
    again as its last (a modify that moves no traffic)."""
    def renumber(actions: tuple) -> tuple:
        return tuple(("group", a[1] ^ 0x80000000) if a[0] == "group" and a[1] % 2 == 0 else a for a in actions)

    def compile_fn(graph_, failures=None, policy="aggregate", switches=None) -> dict:
        states = compiler.compile_fabric(graph_, failures, policy, switches=switches)
        if not failures:
            return states
        out = {}
        for name, st in states.items():
            groups = tuple(
                compiler.Group(x.group_id ^ 0x80000000, x.kind, tuple((w, renumber(a)) for w, a in x.buckets))
                if x.group_id % 2 == 0 else
                compiler.Group(x.group_id, x.kind, tuple((w, renumber(a)) for w, a in x.buckets + x.buckets[:1]))
                for x in st.groups)
            flows = tuple(f._replace(actions=renumber(f.actions)) for f in st.flows)
            out[name] = compiler.SwitchState(st.name, st.dpid, flows, groups)
        return out
    return compile_fn


def protected(g) -> reconcile.Reconciler:
    """Installed, with a compiler whose groups change with the failures."""
    rec = reconcile.Reconciler(g, compile_fn=regrouping(g))
    msgs = []
    for sw in graph.switches(g):
        msgs += rec.handle(reconcile.SwitchUp(sw))
    drive(rec, msgs, [])
    assert rec.settled
    return rec


def drive(rec: reconcile.Reconciler, msgs: list, log: list) -> None:
    """Answer barriers one by one until quiet; log (message, copy of the confirmed table of its switch
    when it was sent, the desired table then) for every message."""
    def entry(m):
        return m, dict(rec.confirmed.get(m.switch, {})), dict(rec.desired.get(m.switch, {}))  # copies

    queue = list(msgs)
    log += [entry(m) for m in msgs]
    while queue:
        m = queue.pop(0)
        more = []
        if isinstance(m, reconcile.Barrier):
            more = rec.handle(reconcile.BarrierReply(m.switch, m.xid))
        elif isinstance(m, reconcile.FlowStatsRequest):        # a fresh switch: it holds nothing
            more = rec.handle(reconcile.FlowStatsReply(m.switch, m.xid))
        elif isinstance(m, reconcile.GroupDescRequest):
            more = rec.handle(reconcile.GroupDescReply(m.switch, m.xid))
        log += [entry(x) for x in more]
        queue += more


def fail_and_repair(rec: reconcile.Reconciler, g, a: str, b: str) -> list:
    log: list = []
    p = port(g, a, b, a)
    drive(rec, rec.handle(reconcile.PortStatus(a, {p: False})), log)
    drive(rec, rec.handle(reconcile.PortStatus(a, {p: True})), log)
    assert rec.settled
    return log


def test_a_group_is_confirmed_with_its_buckets_before_any_flow_that_sends_to_it_is_sent(mini_hpn):
    rec = protected(mini_hpn)
    log = fail_and_repair(rec, mini_hpn, "p0l0", "p0s0")
    sends = 0
    for m, confirmed, desired in log:
        if isinstance(m, reconcile.FlowMod) and m.command != "delete":
            for gid in reconcile.groups_referenced(m.actions):
                sends += 1
                group = confirmed.get(reconcile.GroupKey(gid))
                assert group is not None, f"{m.switch}: {m} sent before group {gid} was confirmed"
                assert group == desired[reconcile.GroupKey(gid)]
    adds = [m for m, _, _ in log if isinstance(m, reconcile.GroupMod) and m.command == "add"]
    modifies = [m for m, _, _ in log if isinstance(m, reconcile.GroupMod) and m.command == "modify"]
    assert sends and adds and modifies


def test_a_group_is_deleted_only_once_no_confirmed_flow_sends_to_it(mini_hpn):
    rec = protected(mini_hpn)
    log = fail_and_repair(rec, mini_hpn, "p0l0", "p0s0")
    deletes = [(m, confirmed) for m, confirmed, _ in log if isinstance(m, reconcile.GroupMod) and m.command == "delete"]
    assert deletes
    for m, confirmed in deletes:
        users = [k for k, v in confirmed.items() if m.group_id in reconcile.groups_referenced(v)]
        assert not users, f"{m.switch}: group {m.group_id} deleted while {users[:3]} send to it"


def test_a_resync_rebuilds_the_groups_from_what_the_switch_reports(mini_hpn):
    """The switch lost one group, holds one with other buckets, and a stray group that a stray flow
    sends to: the lost one is added, the changed one modified, the stray flow deleted and only then
    the stray group."""
    rec = protected(mini_hpn)
    request, groups_request = rec.handle(reconcile.Error("p0l1", xid=7))
    assert isinstance(request, reconcile.FlowStatsRequest) and isinstance(groups_request, reconcile.GroupDescRequest)
    want = rec.desired["p0l1"]
    lost, changed = sorted(k for k in want if reconcile.is_group(k))[:2]
    stray_flow = (1, 1100, (("eth_type", 0x800), ("ipv4_dst", (0x0A000000, 0xFFFFFF00))))
    flows = [reconcile.FlowEntry(k[0], k[1], k[2], a) for k, a in want.items() if not reconcile.is_group(k)]
    flows.append(reconcile.FlowEntry(*stray_flow, (("group", 999),)))
    other = compiler.Group(changed.group_id, "ff", tuple(reversed(want[changed].buckets)))
    groups = [want[k] for k in want if reconcile.is_group(k) and k not in (lost, changed)]
    groups += [other, compiler.Group(999, "ff", ((5, (("output", 5),)),))]
    assert rec.handle(reconcile.GroupDescReply("p0l1", groups_request.xid, tuple(groups))) == []
    log: list = []
    drive(rec, rec.handle(reconcile.FlowStatsReply("p0l1", request.xid, tuple(flows))), log)
    sent = [m for m, _, _ in log if isinstance(m, (reconcile.FlowMod, reconcile.GroupMod))]
    group_mods = [(m.command, m.group_id) for m in sent if isinstance(m, reconcile.GroupMod)]
    assert sorted(group_mods) == sorted([("add", lost.group_id), ("modify", changed.group_id), ("delete", 999)])
    flow_mods = [(m.command, m.key) for m in sent if isinstance(m, reconcile.FlowMod)]
    assert flow_mods == [("delete", stray_flow)]
    assert sent.index(next(m for m in sent if isinstance(m, reconcile.FlowMod))) < \
        sent.index(next(m for m in sent if isinstance(m, reconcile.GroupMod) and m.command == "delete"))
    assert rec.settled and rec.confirmed["p0l1"] == want


def _route(g, leaf: str) -> tuple:
    net, length = prefix_int(g.nodes[leaf]["prefix"])
    mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
    return (compiler.TABLE_ROUTE, compiler.PRIO_ROUTE_BASE + length,
            (("eth_type", compiler.ETH_IPV4), ("ipv4_dst", (net, mask))))


def _ff(gid: int, *ports: int) -> compiler.Group:
    return compiler.Group(gid, "ff", tuple((p, (("output", p),)) for p in ports))


def test_a_fast_failover_group_that_moves_traffic_waits_for_the_switch_it_moves_it_to(mini_hpn):
    """p0l1 sends p0l0's prefix through group 1; its live bucket moves from p0s0 to p0s1, which does
    not route that prefix yet: p0s1 goes first, then the group."""
    ix = compiler.index_of(mini_hpn)
    to_s0, to_s1 = port(mini_hpn, "p0l1", "p0s0", "p0l1"), port(mini_hpn, "p0l1", "p0s1", "p0l1")
    route = _route(mini_hpn, "p0l0")
    confirmed: dict[str, dict] = {"p0l1": {route: (("group", 1),), reconcile.GroupKey(1): _ff(1, to_s0, to_s1)},
                                  "p0s1": {}}
    desired: dict[str, dict] = {"p0l1": {route: (("group", 1),), reconcile.GroupKey(1): _ff(1, to_s1, to_s0)},
               "p0s1": {route: (("output", port(mini_hpn, "p0l0", "p0s1", "p0s1")),)}}
    ready, left, cycle = reconcile.plan_step(ix, confirmed, desired, ["p0l1", "p0s1"])
    assert [(it.switch, it.key) for it in ready] == [("p0s1", route)] and left == 1 and not cycle
    confirmed["p0s1"] = dict(desired["p0s1"])
    ready, left, _ = reconcile.plan_step(ix, confirmed, desired, ["p0l1", "p0s1"])
    assert [(it.switch, it.key) for it in ready] == [("p0l1", reconcile.GroupKey(1))] and left == 0


def test_a_fast_failover_group_whose_live_bucket_stays_goes_at_once(mini_hpn):
    """Only the backup bucket changes (p0s0 stays live): where p0l1 sends traffic does not change."""
    ix = compiler.index_of(mini_hpn)
    to_s0, to_s1 = port(mini_hpn, "p0l1", "p0s0", "p0l1"), port(mini_hpn, "p0l1", "p0s1", "p0l1")
    route = _route(mini_hpn, "p0l0")
    held = {_route(mini_hpn, "p0l2"): (("output", port(mini_hpn, "p0l2", "p0s1", "p0s1")),)}   # not a switch anew
    confirmed: dict[str, dict] = {"p0l1": {route: (("group", 1),), reconcile.GroupKey(1): _ff(1, to_s0, to_s1)},
                                  "p0s1": dict(held)}
    desired: dict[str, dict] = {"p0l1": {route: (("group", 1),), reconcile.GroupKey(1): _ff(1, to_s0)},
                                "p0s1": {**held, route: (("output", port(mini_hpn, "p0l0", "p0s1", "p0s1")),)}}
    ready, left, _ = reconcile.plan_step(ix, confirmed, desired, ["p0l1", "p0s1"])
    assert len(ready) == 2 and left == 0


def test_the_live_bucket_is_read_from_the_link_state(mini_hpn):
    """With p0l1-p0s0 down, group 1 already sends by p0s1 before and after: nothing to wait for."""
    ix = compiler.index_of(mini_hpn)
    to_s0, to_s1 = port(mini_hpn, "p0l1", "p0s0", "p0l1"), port(mini_hpn, "p0l1", "p0s1", "p0l1")
    route = _route(mini_hpn, "p0l0")
    held = {_route(mini_hpn, "p0l2"): (("output", port(mini_hpn, "p0l2", "p0s1", "p0s1")),)}   # not a switch anew
    confirmed: dict[str, dict] = {"p0l1": {route: (("group", 1),), reconcile.GroupKey(1): _ff(1, to_s0, to_s1)},
                                  "p0s1": dict(held)}
    desired: dict[str, dict] = {"p0l1": {route: (("group", 1),), reconcile.GroupKey(1): _ff(1, to_s1, to_s0)},
                                "p0s1": {**held, route: (("output", port(mini_hpn, "p0l0", "p0s1", "p0s1")),)}}
    down = compiler.Failures.of([("p0l1", "p0s0", 0)])
    ready, left, _ = reconcile.plan_step(ix, confirmed, desired, ["p0l1", "p0s1"], down)
    assert len(ready) == 2 and left == 0


def test_a_recompiled_switch_whose_state_did_not_change_is_not_diffed(mini_hpn):
    rec = installed(mini_hpn)
    before = {sw: rec.desired[sw] for sw in rec.desired}
    contents = {sw: dict(table) for sw, table in before.items()}
    rec.handle(reconcile.PortStatus("p0l0", {port(mini_hpn, "p0l0", "p0s0", "p0l0"): False}))
    same = [sw for sw in before if sw.startswith("p0") and rec.desired[sw] is before[sw]
            and rec.desired[sw] == contents[sw]]
    changed = [sw for sw in before if rec.desired[sw] != contents[sw]]
    assert same and changed
    assert set(changed) == rec.dirty
    assert all(reconcile.switch_table(rec.states[sw]) == before[sw] for sw in same)


@pytest.mark.parametrize("policy", compiler.ROUTING_POLICIES)
@pytest.mark.parametrize("name", ["mini-hpn", "fat-tree-4", "mini-cross-campus"])
def test_a_desired_table_patched_from_the_previous_one_is_the_compiled_table(name, policy):
    """The reconciler touches only the flows that are new objects; the result is the same table as
    one built from scratch, and the keys it reports cover every key whose value changed."""
    g = graph.build(spec.load(name))
    healthy = compiler.compile_fabric(g, None, policy)
    for failures in (compiler.Failures.of([next(iter(g.edges(keys=True)))]),
                     compiler.Failures.of((), [next(n for n in graph.switches(g) if g.nodes[n]["tier"] == 2)])):
        after = compiler.compile_fabric(g, failures, policy)
        for sw, new in after.items():
            before = reconcile.switch_table(healthy[sw])
            table, keys = reconcile.patched_table(healthy[sw], new, before, rebuild_above=float("inf"))
            assert table == reconcile.switch_table(new) and keys is not None
            assert {k for k in table.keys() | before.keys() if table.get(k) != before.get(k)} <= keys
            old_index = reconcile.TableIndex(before)
            old_index.meta_index(compiler.TABLE_ENTROPY)
            patched, scratch = old_index.patched(table, keys), reconcile.TableIndex(table)
            assert patched.routes == scratch.routes and patched.groups == scratch.groups
            assert patched.meta_index(compiler.TABLE_ENTROPY) == scratch.meta_index(compiler.TABLE_ENTROPY)


def test_a_patched_index_meets_the_entries_its_table_holds_not_those_it_remembered(mini_hpn):
    """What a metadata meets in table 2 is kept per index, and a patched index keeps it only
    for the metadata values that no changed entry matches."""
    before = reconcile.switch_table(compiler.compile_fabric(mini_hpn)["p0l0"])
    old = reconcile.TableIndex(before)
    metas = {meta for values in old.meta_index(compiler.TABLE_ENTROPY).values() for meta in values}
    remembered = {meta: old.met(compiler.TABLE_ENTROPY, meta) for meta in metas}
    key = next(k for k in before if not reconcile.is_group(k) and k[0] == compiler.TABLE_ENTROPY)
    table = dict(before)
    table[key] = (("output", 4242),)
    patched = old.patched(table, [key])
    scratch = reconcile.TableIndex(table)
    assert any(patched.met(compiler.TABLE_ENTROPY, m) != remembered[m] for m in metas)
    assert all(patched.met(compiler.TABLE_ENTROPY, m) == scratch.met(compiler.TABLE_ENTROPY, m) for m in metas)
    unchanged = old.patched(dict(before), [key])
    assert all(unchanged.met(compiler.TABLE_ENTROPY, m) == remembered[m] for m in metas)


def entropy_metas(index: reconcile.TableIndex) -> set[int]:
    return {meta for values in index.meta_index(compiler.TABLE_ENTROPY).values() for meta in values}


def walk(index: reconcile.TableIndex, meta: int, dead: frozenset = frozenset()) -> tuple:
    """The ports and groups the entries a metadata meets in table 2 lead to, under ``dead`` ports."""
    hit = reconcile._Forwarding(index, lambda port: port not in dead, dead).goto(compiler.TABLE_ENTROPY, meta, 1)
    return hit.ports, hit.groups


@pytest.mark.parametrize("policy", compiler.ROUTING_POLICIES)
@pytest.mark.parametrize("name", ["mini-hpn", "fat-tree-4", "mini-cross-campus"])
def test_every_walk_a_patched_index_kept_is_the_walk_of_its_own_table(name, policy):
    """The walk of a goto (the entries a metadata meets in table 2, the groups on their way) is kept in
    the index, and by a patched index unless a changed entry or group could alter it: every walk of a
    patched index, kept or walked anew, is that of an index built from its table."""
    g = graph.build(spec.load(name))
    switches = set(graph.switches(g))
    link = next((u, v, k) for u, v, k in g.edges(keys=True) if u in switches and v in switches)
    healthy = compiler.compile_fabric(g, None, policy)
    after = compiler.compile_fabric(g, compiler.Failures.of([link]), policy)
    kept = 0
    for sw, new in after.items():
        before = reconcile.switch_table(healthy[sw])
        table, keys = reconcile.patched_table(healthy[sw], new, before, rebuild_above=float("inf"))
        assert keys is not None
        old = reconcile.TableIndex(before)
        for meta in entropy_metas(old):
            walk(old, meta)
        patched, scratch = old.patched(table, keys), reconcile.TableIndex(table)
        kept += len(patched.gotos)
        for meta in entropy_metas(old) | entropy_metas(scratch):
            assert walk(patched, meta) == walk(scratch, meta)
    assert kept > 0


def test_a_kept_walk_follows_a_changed_entry_and_a_changed_group(mini_hpn):
    before = reconcile.switch_table(compiler.compile_fabric(mini_hpn)["p0l0"])
    old = reconcile.TableIndex(before)
    metas = entropy_metas(old)
    walked = {meta: walk(old, meta) for meta in metas}
    entry = next(k for k in before if not reconcile.is_group(k) and k[0] == compiler.TABLE_ENTROPY)
    gid = next(g for meta in metas for g in walked[meta][1])
    group = before[reconcile.GroupKey(gid)]
    for key, value in ((entry, (("output", 4242),)),
                       (reconcile.GroupKey(gid), group._replace(buckets=((None, (("output", 4343),)),), kind="all"))):
        table = dict(before)
        table[key] = value
        patched = old.patched(table, [key])
        assert any(walk(patched, meta) != walked[meta] for meta in metas)
        assert all(walk(patched, meta) == walk(reconcile.TableIndex(table), meta) for meta in metas)


def test_a_kept_walk_is_walked_again_under_other_dead_ports(mini_hpn):
    table = reconcile.switch_table(compiler.compile_fabric(mini_hpn)["p0l0"])
    index = reconcile.TableIndex(table)
    meta = next(m for m in entropy_metas(index) if len(walk(index, m)[0]) > 1)
    ports = walk(index, meta)[0]
    port = min(ports)
    assert walk(index, meta, frozenset([port])) == walk(reconcile.TableIndex(table), meta, frozenset([port]))
    assert walk(index, meta) == (ports, walk(reconcile.TableIndex(table), meta)[1])


def route_met(index: reconcile.TableIndex, address: int) -> tuple:
    """The route an address meets, looked up alone: the first of the index's routes (by priority) whose
    prefix covers it, (None, ()) for none."""
    for _prio, mask, nets in index.routes:
        hit = nets.get(address & mask)
        if hit is not None:
            return hit
    return None, ()


def runs_after_a_failure(g, policy: str) -> tuple[int, int]:
    """Every plane-0 switch's table after a link failure, walked run by run: (runs, addresses walked);
    asserts that every address of a run meets what its first address meets."""
    ix = compiler.index_of(g)
    addresses = reconcile._plane_addresses(ix)[0]
    failed = compiler.compile_fabric(g, compiler.Failures.of([("p0l0", "p0s0", 0)]), policy)
    runs = walked = 0
    for sw in sorted(s for s in failed if ix.sw[s].plane == 0):
        fwd = reconcile._Forwarding(reconcile.TableIndex(reconcile.switch_table(failed[sw])), lambda port: True)
        k = 0
        while k < len(addresses):
            key, actions, end = fwd.run(addresses[k])
            following = [a for a in addresses[k:] if a <= end]
            assert following and all(route_met(fwd.index, a) == (key, actions) for a in following)
            k += len(following)
            runs += 1
        walked += len(addresses)
    return runs, walked


@pytest.mark.parametrize("policy", compiler.ROUTING_POLICIES)
def test_every_address_of_a_run_meets_the_entry_its_first_address_meets(mini_hpn, policy):
    """A plan decides once per run of addresses: a run may not cross a route's end or the start
    of a route that comes first (after a failure, more specific routes sit inside aggregates)."""
    runs_after_a_failure(mini_hpn, policy)


def test_with_aggregated_routes_a_run_spans_several_addresses(mini_hpn):
    runs, walked = runs_after_a_failure(mini_hpn, "aggregate")
    assert runs < walked / 2


def test_a_switch_whose_flows_mostly_changed_gets_its_table_built_anew(mini_hpn):
    healthy = compiler.compile_fabric(mini_hpn)
    failed = compiler.compile_fabric(mini_hpn, compiler.Failures.of([("p0l0", "p0s0", 0)]))
    table, keys = reconcile.patched_table(healthy["p0l0"], failed["p0l0"], reconcile.switch_table(healthy["p0l0"]),
                                          rebuild_above=0.0)
    assert keys is None and table == reconcile.switch_table(failed["p0l0"])


def test_a_patched_index_follows_groups_added_changed_and_deleted(mini_hpn):
    compile_fn = regrouping(mini_hpn)
    healthy = compile_fn(mini_hpn, None, "aggregate")
    failed = compile_fn(mini_hpn, compiler.Failures.of([("p0l0", "p0s0", 0)]), "aggregate")
    for a, b in ((healthy["p0l0"], failed["p0l0"]), (failed["p0l0"], healthy["p0l0"])):
        before = reconcile.switch_table(a)
        table, keys = reconcile.patched_table(a, b, before, rebuild_above=float("inf"))
        assert keys is not None
        patched, scratch = reconcile.TableIndex(before).patched(table, keys), reconcile.TableIndex(table)
        assert patched.groups == scratch.groups and patched.routes == scratch.routes
        assert {g.group_id for g in a.groups} != {g.group_id for g in b.groups}


def test_a_switch_that_starts_dropping_an_address_waits_for_the_switches_that_stop_sending_it_there():
    """fat-tree-4, e0-a0 down: a2 can no longer reach e0 (its cores reach e0 only through a0) and
    drops e0's prefix, while e2 stops sending it to a2. Until e2 has, a0's detour still delivers
    through a2: e2 goes first, then a2."""
    g = graph.build(spec.load("fat-tree-4"))
    ix = compiler.index_of(g)
    down = compiler.Failures.of([("e0", "a0", 0)])
    healthy, failed = compiler.compile_fabric(g), compiler.compile_fabric(g, down)
    confirmed = {sw: reconcile.switch_table(healthy[sw]) for sw in ("e2", "a2")}
    desired = {sw: reconcile.switch_table(failed[sw]) for sw in ("e2", "a2")}
    ready, left, cycle = reconcile.plan_step(ix, confirmed, desired, ["e2", "a2"], down)
    assert {it.switch for it in ready} == {"e2"} and left == 1 and not cycle
    confirmed["e2"] = desired["e2"]
    ready, left, _ = reconcile.plan_step(ix, confirmed, desired, ["e2", "a2"], down)
    assert {it.switch for it in ready} == {"a2"} and left == 0


def test_a_switch_installed_anew_goes_before_the_others_route_through_it():
    """fat-tree-4, a0 back from a failure with empty tables: the edges that stop avoiding it wait
    until a0 routes (the cores' fast-failover groups already send to it as its ports come up)."""
    g = graph.build(spec.load("fat-tree-4"))
    ix = compiler.index_of(g)
    without, healthy = compiler.compile_fabric(g, compiler.Failures.of((), ["a0"])), compiler.compile_fabric(g)
    switches = ["a0", "e7"]
    confirmed = {"a0": {}, "e7": reconcile.switch_table(without["e7"])}
    desired = {sw: reconcile.switch_table(healthy[sw]) for sw in switches}
    assert confirmed["e7"] != desired["e7"]
    ready, left, cycle = reconcile.plan_step(ix, confirmed, desired, switches)
    assert ready and {it.switch for it in ready} == {"a0"} and left and not cycle


def test_convergence_is_timed_from_the_port_status_to_the_last_confirmation(mini_hpn):
    rec = installed(mini_hpn)
    first = rec.handle(reconcile.PortStatus("p0l0", {port(mini_hpn, "p0l0", "p0s0", "p0l0"): False}), now=10.0)
    assert first and not rec.convergences              # sent, not confirmed yet
    answer(rec, first, now=10.25)
    assert rec.settled and list(rec.convergences)[-1] == pytest.approx(0.25)
    # a report that changes nothing starts no new measurement
    n = len(rec.convergences)
    assert rec.handle(reconcile.PortStatus("p0l0", {port(mini_hpn, "p0l0", "p0s0", "p0l0"): False}), now=11.0) == []
    answer(rec, rec.handle(reconcile.Tick(), now=11.5), now=11.5)
    assert len(rec.convergences) == n


def test_without_fast_failover_the_reconciler_installs_groups_with_only_their_primary_bucket(mini_hpn):
    rec = reconcile.Reconciler(mini_hpn, fast_failover=False)
    groups = [gr for st in rec.states.values() for gr in st.groups]
    assert groups and all(len(gr.buckets) == 1 for gr in groups if gr.kind == "ff")
    assert any(len(gr.buckets) > 1 for st in reconcile.Reconciler(mini_hpn).states.values() for gr in st.groups)


@pytest.mark.parametrize("name", ["mini-hpn", "fat-tree-4"])
def test_after_every_single_link_failure_and_repair_every_switch_holds_what_a_full_compile_gives(name):
    """The reconciler recompiles patched from the healthy plane and sends only to switches whose
    tables change: driven to the end, what every switch confirmed (also those it never wrote to,
    whose next hops may run through changed switches) equals a full compile of that failure, and
    after the repair the healthy compile."""
    g = fabric(name)
    rec = installed(g)
    healthy = {sw: reconcile.switch_table(st) for sw, st in compiler.compile_fabric(g, incremental=False).items()}
    for u, v, k, d in g.edges(keys=True, data=True):
        if d["kind"] == "host":
            continue
        port = d["ports"][u]
        answer(rec, rec.handle(reconcile.PortStatus(u, {port: False})))
        full = compiler.compile_fabric(g, compiler.Failures.of([(u, v, k)]), incremental=False)
        assert {sw: rec.confirmed[sw] for sw in full} == {sw: reconcile.switch_table(st) for sw, st in full.items()}, \
            (u, v, k)
        answer(rec, rec.handle(reconcile.PortStatus(u, {port: True})))
        assert {sw: rec.confirmed[sw] for sw in healthy} == healthy, (u, v, k, "repaired")


def test_the_count_of_routes_there_only_for_failures_follows_each_failure_and_recovery(mini_hpn):
    rec = installed(mini_hpn)
    assert rec.deaggregated() == 0
    p = port(mini_hpn, "p0l0", "p0s0", "p0l0")
    answer(rec, rec.handle(reconcile.PortStatus("p0l0", {p: False})))
    assert rec.deaggregated() == compiler.deaggregated(rec.states, rec.healthy) > 0
    answer(rec, rec.handle(reconcile.PortStatus("p0l0", {p: True})))
    assert rec.deaggregated() == 0
