"""The os-ken app on fake datapaths, without root or a switch (the idea of Faucet's app smoke test).

The app class is instantiated as the launcher does (from its configuration file), fed real os-ken event
objects (built with os-ken's own ofproto_v1_3 and ofproto_v1_3_parser) around a fake datapath that
records every message the app sends (each is serialised, as on the wire): tests/support/fake_switch.py.
"""
from __future__ import annotations

import pytest

pytest.importorskip("os_ken")

from os_ken.controller import ofp_event
from os_ken.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from support.fake_switch import (
    FakeDatapath,
    answer_barriers,
    answer_flow_stats,
    answer_group_desc,
    connect_all,
    dpids,
    features,
    group_desc,
    parsed_match,
    stats_entry,
)

from hpnlab.controller import codec, reconcile
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph, spec


def flow_mods(msgs) -> list:
    return [m for m in msgs if isinstance(m, parser.OFPFlowMod)]


def test_switch_features_read_what_the_switch_holds_then_its_flows_follow(app):
    dp = FakeDatapath(dpids()["p0l0"])
    sent = features(app, dp)
    kinds = [type(m).__name__ for m in sent]
    assert kinds == ["OFPPortDescStatsRequest", "OFPFlowStatsRequest", "OFPGroupDescStatsRequest",
                     "OFPGroupFeaturesStatsRequest"]
    assert sent[1].table_id == ofp.OFPTT_ALL and sent[1].cookie_mask == 0     # every flow, whoever made it
    answer_flow_stats(app, dp, sent[1], [])
    assert dp.take() == []
    answer_group_desc(app, dp, sent[2], [])
    install = dp.take()
    assert install and isinstance(install[-1], parser.OFPBarrierRequest)
    dp.sent = install
    install = [m for _dp, m in answer_barriers(app, {"p0l0": dp})]
    adds = flow_mods(install)
    groups = [m for m in install if isinstance(m, parser.OFPGroupMod)]
    expected = compiler.compile_fabric(graph.build(spec.load("mini-hpn")))["p0l0"]
    assert len(adds) == expected.flow_count and {m.command for m in adds} == {ofp.OFPFC_ADD}
    assert len(groups) == len(expected.groups) and {m.command for m in groups} == {ofp.OFPGC_ADD}
    assert app.reconciler.settled


def test_flows_count_as_installed_only_once_the_switch_answers_the_barrier(app):
    dp = FakeDatapath(dpids()["p0l0"])
    first = features(app, dp)
    answer_flow_stats(app, dp, first[1], [])
    answer_group_desc(app, dp, first[2], [])
    sent = dp.take()
    assert flow_mods(sent)
    assert app.reconciler.confirmed["p0l0"] == {}
    dp.sent = sent              # now the switch answers the barriers sent after the flows
    answer_barriers(app, {"p0l0": dp})
    assert app.reconciler.confirmed["p0l0"] == app.reconciler.desired["p0l0"]


def _port_down(dps, g, sw: str, other: str):
    """``sw``'s port towards ``other`` reported down (a PortStatus event from its datapath)."""
    desc = parser.OFPPort(port_no=g.edges[sw, other, 0]["ports"][sw], hw_addr="00:00:00:00:00:01",
                          name=f"{sw}-eth".encode(), config=0, state=ofp.OFPPS_LINK_DOWN, curr=0, advertised=0,
                          supported=0, peer=0, curr_speed=0, max_speed=0)
    return ofp_event.EventOFPPortStatus(parser.OFPPortStatus(dps[sw], ofp.OFPPR_MODIFY, desc))


def test_a_port_going_down_updates_exactly_the_switches_whose_tables_change(app):
    dps = connect_all(app)
    g = app.graph
    app.on_port_status(_port_down(dps, g, "p0l0", "p0s0"))
    sent = answer_barriers(app, dps)
    changed = {dp_name for dp_name, dp in dps.items() for d, m in sent if d is dp and isinstance(m, parser.OFPFlowMod)}
    healthy = compiler.compile_fabric(g)
    failed = compiler.compile_fabric(g, compiler.Failures.of([("p0l0", "p0s0", 0)]))
    expected = {sw for sw in healthy if reconcile.switch_table(healthy[sw]) != reconcile.switch_table(failed[sw])}
    assert changed == expected and "p0l0" in changed
    assert all(sw.startswith("p0") for sw in changed)
    assert app.reconciler.settled


def test_port_statuses_queued_together_in_the_app_are_recompiled_once(app):
    dps = connect_all(app)
    first, second = (_port_down(dps, app.graph, leaf, "p0s0") for leaf in ("p0l0", "p0l1"))
    app.events.put((second, MAIN_DISPATCHER))       # the second waits in os-ken's queue behind the first
    app.on_port_status(first)
    assert app.reconciler.counters["recompiles"] == 0 and not answer_barriers(app, dps)
    app.events.get()
    app.on_port_status(second)
    answer_barriers(app, dps)
    assert app.reconciler.counters["recompiles"] == 1 and app.reconciler.settled
    assert app.reconciler.failures.links == {("p0l0", "p0s0", 0), ("p0l1", "p0s0", 0)}


def _refused(app, dp, type_: int, code: int) -> list:
    """``dp`` answers one of the app's messages with an OpenFlow error: what the app sends it then."""
    error = parser.OFPErrorMsg(dp, type_=type_, code=code, data=b"")
    error.set_xid(99)
    app.on_error(ofp_event.EventOFPErrorMsg(error))
    return dp.take()


def test_an_openflow_error_resynchronises_the_switch_from_its_flow_stats(app):
    dp = connect_all(app)["p0l1"]
    request, groups_request = _refused(app, dp, ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_TABLE_FULL)
    assert isinstance(request, parser.OFPFlowStatsRequest)
    assert request.cookie == codec.COOKIE and request.table_id == ofp.OFPTT_ALL
    assert isinstance(groups_request, parser.OFPGroupDescStatsRequest)
    # the switch reports every flow but one, and every group: exactly that flow is sent again
    from hpnlab.controller.codec import encode
    desired = app.reconciler.desired["p0l1"]
    flows = {k: a for k, a in desired.items() if not reconcile.is_group(k)}
    groups = [group_desc(encode(dp, reconcile.GroupMod("p0l1", "add", g.group_id, g.kind, g.buckets))[0])
              for k, g in desired.items() if reconcile.is_group(k)]
    lost = max(flows)
    body = [stats_entry(key, actions) for key, actions in flows.items() if key != lost]
    reply = parser.OFPFlowStatsReply(dp, type_=ofp.OFPMP_FLOW, flags=0, body=body)
    reply.set_xid(request.xid)
    app.on_flow_stats(ofp_event.EventOFPFlowStatsReply(reply))
    greply = parser.OFPGroupDescStatsReply(dp, type_=ofp.OFPMP_GROUP_DESC, flags=0, body=groups)
    greply.set_xid(groups_request.xid)
    app.on_group_desc(ofp_event.EventOFPGroupDescStatsReply(greply))
    resent = dp.take()
    mods = flow_mods(resent)
    assert len(mods) == 1 and mods[0].table_id == lost[0] and mods[0].priority == lost[1]
    assert isinstance(resent[-1], parser.OFPBarrierRequest)


def test_a_switch_that_disconnects_counts_as_failed_and_the_others_route_around_it(app):
    dps = connect_all(app)
    ev = ofp_event.EventOFPStateChange(dps["p0s0"])
    ev.state = DEAD_DISPATCHER
    app.on_state_change(ev)
    sent = answer_barriers(app, {n: d for n, d in dps.items() if n != "p0s0"})
    assert app.reconciler.failures.switches == {"p0s0"}
    assert {d for d, m in sent if isinstance(m, parser.OFPFlowMod)} == {dps["p0l0"], dps["p0l1"], dps["p0l2"],
                                                                         dps["p0l3"]}


def test_a_switch_of_another_scenario_gets_nothing(app):
    dp = FakeDatapath(0xDEAD)
    assert features(app, dp) == []


def compiled(scenario: str, switch: str, failed: tuple | None = None) -> dict:
    g = graph.build(spec.load(scenario))
    failures = compiler.Failures.of([failed]) if failed else compiler.Failures()
    return reconcile.switch_table(compiler.compile_fabric(g, failures)[switch])


# every flow and group of a leaf, a spine and a core (healthy, and next to a failed link: bounce
# entries matching in_port and eth_src, set_field eth_src, masked avoid-one-port metadata)
COMPILED = [("mini-hpn", "p0l0", None), ("mini-hpn", "p0s0", None), ("mini-hpn", "p0s0", ("p0l0", "p0s0", 0)),
            ("fat-tree-4", "e0", None), ("fat-tree-4", "a0", ("e0", "a0", 0)), ("fat-tree-4", "c0", ("e0", "a0", 0)),
            ("fat-tree-4", "e1", ("e0", "a0", 0))]


@pytest.mark.parametrize(("scenario", "switch", "failed"), COMPILED)
def test_every_compiled_flow_decodes_back_from_flow_stats_to_the_same_entry(scenario, switch, failed):
    from hpnlab.controller.codec import decode_flow_stats
    flows = {k: a for k, a in compiled(scenario, switch, failed).items() if not reconcile.is_group(k)}
    decoded = decode_flow_stats(FakeDatapath(1), [stats_entry(k, a) for k, a in flows.items()])
    assert {(e.table, e.priority, e.match): e.actions for e in decoded} == flows


@pytest.mark.parametrize(("scenario", "switch", "failed"), COMPILED)
def test_every_compiled_group_decodes_back_from_its_description(scenario, switch, failed):
    from hpnlab.controller.codec import decode_group_desc, encode
    dp = FakeDatapath(1)
    groups = [g for k, g in compiled(scenario, switch, failed).items() if reconcile.is_group(k)]
    mods = [encode(dp, reconcile.GroupMod(switch, "add", g.group_id, g.kind, g.buckets))[0] for g in groups]
    for mod in mods:
        mod.serialize()
    assert [reconcile.canonical_group(g) for g in decode_group_desc(dp, [group_desc(m) for m in mods])] == groups


def test_the_compiled_states_cover_every_action_and_match_the_compiler_emits():
    """The round trips above see set_field, groups, metadata writes, in_port, eth_src and masked metadata."""
    actions, fields, masked = set(), set(), False
    for scenario, switch, failed in COMPILED:
        for k, a in compiled(scenario, switch, failed).items():
            if not reconcile.is_group(k):
                actions |= {x[0] for x in a}
                fields |= {name for name, _v in k[2]}
                masked |= any(name == "metadata" and isinstance(v, tuple) for name, v in k[2])
    assert {"set_field", "group", "metadata", "goto"} <= actions
    assert {"in_port", "eth_src", "metadata"} <= fields and masked


# ---- groups, group actions, 64-bit metadata ----------------------------------------------------

FF = compiler.Group(7, "ff", ((3, (("output", 3),)), (4, (("output", 4),)), (5, (("output", 5), ("group", 9)))))


@pytest.mark.parametrize("group", [
    FF,
    compiler.Group(8, "indirect", ((None, (("output", 2),)),)),
    compiler.Group(9, "all", ((None, (("output", 2),)), (None, (("output", 6),)))),
    compiler.Group(10, "select", ((None, (("output", 2),)), (None, (("controller",),)))),
    compiler.Group(11, "ff", ((3, (("output", 3),)), (4, (("set_field", "in_port", 0), ("output", 4))))),
], ids=lambda g: g.kind + ("-detour" if g.group_id == 11 else ""))
def test_a_group_encodes_to_a_group_mod_and_decodes_back_from_its_description(group):
    from hpnlab.controller.codec import decode_group_desc, encode
    dp = FakeDatapath(1)
    (mod,) = encode(dp, reconcile.GroupMod("s", "add", group.group_id, group.kind, group.buckets))
    mod.serialize()
    assert mod.command == ofp.OFPGC_ADD
    assert decode_group_desc(dp, [group_desc(mod)]) == (group,)


def test_a_fast_failover_bucket_watches_its_port_and_no_group():
    from hpnlab.controller.codec import encode
    (mod,) = encode(FakeDatapath(1), reconcile.GroupMod("s", "modify", FF.group_id, FF.kind, FF.buckets))
    assert mod.type == ofp.OFPGT_FF and mod.command == ofp.OFPGC_MODIFY
    assert [(b.watch_port, b.watch_group) for b in mod.buckets] == [(3, ofp.OFPG_ANY), (4, ofp.OFPG_ANY),
                                                                    (5, ofp.OFPG_ANY)]


def test_a_detour_bucket_clears_in_port_with_an_nxm_load_which_open_vswitch_takes():
    """OpenFlow 1.3's set-field on in_port with port 0 is refused by Open vSwitch
    (OFPBAC_BAD_SET_ARGUMENT); its NXM load, load:0->NXM_OF_IN_PORT[], is taken."""
    from hpnlab.controller.codec import encode_action
    act = encode_action(ofp, parser, ("set_field", "in_port", 0))
    assert isinstance(act, parser.NXActionRegLoad) and act.dst == "in_port_nxm" and act.value == 0
    assert act.ofs_nbits == 15                          # bits 0-15: the whole 16-bit NXM in_port


def test_a_group_deletion_names_only_the_group():
    from hpnlab.controller.codec import encode
    (mod,) = encode(FakeDatapath(1), reconcile.GroupMod("s", "delete", 7))
    mod.serialize()
    assert mod.command == ofp.OFPGC_DELETE and mod.group_id == 7 and mod.buckets == []


def test_a_flow_with_a_group_a_64_bit_metadata_write_and_a_masked_metadata_match_decodes_back():
    from hpnlab.controller.codec import METADATA_MASK, decode_flow_stats, encode_instructions
    key = (2, 300, (("eth_type", 0x800), ("metadata", (0x1234_0000_0000_0000, 0xFFFF_0000_0000_0000))))
    actions = (("group", 7), ("metadata", 0xFEDC_BA98_7654_3210), ("goto", 3))
    assert METADATA_MASK == (1 << 64) - 1
    instructions = encode_instructions(ofp, parser, actions)
    (write,) = [i for i in instructions if isinstance(i, parser.OFPInstructionWriteMetadata)]
    assert write.metadata_mask == METADATA_MASK
    (entry,) = decode_flow_stats(FakeDatapath(1), [stats_entry(key, actions)])
    assert ((entry.table, entry.priority, entry.match), entry.actions) == (key, actions)


def test_a_masked_match_reported_with_a_full_mask_decodes_as_the_exact_value():
    from hpnlab.controller.codec import decode_match
    full = parser.OFPMatch(eth_type=0x800, metadata=(5, (1 << 64) - 1))
    assert decode_match(parsed_match(full)) == (("eth_type", 0x800), ("metadata", 5))


def test_a_leaf_gets_its_groups_confirmed_before_the_flows_that_send_to_them(app):
    dp = FakeDatapath(dpids()["p0l0"])
    dp.sent = features(app, dp)
    wire: list = []
    answer_barriers(app, {"p0l0": dp}, wire)
    assert app.reconciler.settled
    groups_added = [i for i, m in enumerate(wire) if isinstance(m, parser.OFPGroupMod) and m.command == ofp.OFPGC_ADD]
    sends_to_group = [i for i, m in enumerate(wire) if isinstance(m, parser.OFPFlowMod) and any(
        isinstance(a, parser.OFPActionGroup) for inst in m.instructions
        if isinstance(inst, parser.OFPInstructionActions) for a in inst.actions)]
    assert groups_added and sends_to_group
    between = wire[max(groups_added):min(sends_to_group)]
    assert any(isinstance(m, parser.OFPBarrierRequest) for m in between)


def test_a_resync_reads_the_groups_back_and_adds_the_one_the_switch_lost(app):
    dp = connect_all(app)["p0l1"]
    flows_req, groups_req = _refused(app, dp, ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_UNKNOWN_GROUP)
    assert isinstance(flows_req, parser.OFPFlowStatsRequest) and isinstance(groups_req, parser.OFPGroupDescStatsRequest)
    desired = app.reconciler.desired["p0l1"]
    flows = [stats_entry(k, a) for k, a in desired.items() if not reconcile.is_group(k)]
    groups = sorted(g for k, g in desired.items() if reconcile.is_group(k))
    assert len(groups) >= 2
    from hpnlab.controller.codec import encode
    reported = [group_desc(encode(dp, reconcile.GroupMod("p0l1", "add", g.group_id, g.kind, g.buckets))[0])
                for g in groups[1:]]
    reply = parser.OFPFlowStatsReply(dp, type_=ofp.OFPMP_FLOW, flags=0, body=flows)
    reply.set_xid(flows_req.xid)
    app.on_flow_stats(ofp_event.EventOFPFlowStatsReply(reply))
    assert dp.take() == []            # the groups are not in yet
    greply = parser.OFPGroupDescStatsReply(dp, type_=ofp.OFPMP_GROUP_DESC, flags=0, body=reported)
    greply.set_xid(groups_req.xid)
    app.on_group_desc(ofp_event.EventOFPGroupDescStatsReply(greply))
    resent = dp.take()
    assert [(type(m).__name__, m.command, m.group_id) for m in resent if not isinstance(m, parser.OFPBarrierRequest)] \
        == [("OFPGroupMod", ofp.OFPGC_ADD, groups[0].group_id)]


@pytest.mark.parametrize(("types", "supported"), [((1 << ofp.OFPGT_ALL) | (1 << ofp.OFPGT_FF), True),
                                                  (1 << ofp.OFPGT_ALL, False)])
def test_a_switch_without_fast_failover_groups_is_reported(app, caplog, types, supported):
    from hpnlab.controller.codec import fast_failover_supported
    dp = FakeDatapath(dpids()["p0l0"])
    features(app, dp)
    body = parser.OFPGroupFeaturesStats(types, 0, [0, 0, 0, 0], [0, 0, 0, 0])
    assert fast_failover_supported(ofp, body) is supported
    reply = parser.OFPGroupFeaturesStatsReply(dp, type_=ofp.OFPMP_GROUP_FEATURES, flags=0, body=body)
    app.on_group_features(ofp_event.EventOFPGroupFeaturesStatsReply(reply))
    assert ("does not support fast-failover groups" in caplog.text) is not supported


def test_a_bad_arp_mode_in_the_configuration_stops_the_app_at_init_in_one_line(tmp_path):
    from support.fake_switch import controller_app

    from hpnlab.fabric.errors import UserError
    with pytest.raises(UserError, match=r"arp: 'per-leaf' is not one of gateway, per-host") as err:
        controller_app(tmp_path, arp="per-leaf")
    assert "\n" not in str(err.value)
