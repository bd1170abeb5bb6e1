"""A simulated switch message by message (fabric/switches/endpoint.py): the controller's own encoding in
(controller/codec.py), replies parsed back with os-ken's parser, as the controller reads them. No socket."""
from __future__ import annotations

import pytest

pytest.importorskip("os_ken")

from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from support.fabrics import fabric as build

from hpnlab.controller import codec, reconcile
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.switches import dump, endpoint

G = build("mini-hpn")


class Dp:
    """What codec.encode needs of a datapath."""
    ofproto = ofp
    ofproto_parser = parser
    id = 1


def wire(msg, xid: int = 1) -> bytes:
    if msg.xid is None:
        msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def sent(sw: endpoint.Switch, *msgs) -> list:
    """Every message encoded as the controller encodes it, given to ``sw``; its replies parsed by os-ken."""
    out = []
    for i, m in enumerate(msgs):
        for ofmsg in codec.encode(Dp(), m) if not hasattr(m, "serialize") else [m]:
            for reply in sw.receive(wire(ofmsg, 100 + i)):
                out.append(ofproto_parser.msg(Dp(), *ofproto_parser.header(reply), reply))
    return out


def fabric() -> endpoint.Fabric:
    return endpoint.Fabric.of(G)


def test_features_reply_carries_the_scenario_s_datapath_id():
    sw = fabric().switches["p0l0"]
    (reply,) = sent(sw, parser.OFPFeaturesRequest(Dp()))
    assert isinstance(reply, parser.OFPSwitchFeatures)
    assert reply.datapath_id == G.nodes["p0l0"]["dpid"]


def test_port_descriptions_list_every_port_the_graph_cables_live():
    sw = fabric().switches["p0s0"]
    (reply,) = sent(sw, parser.OFPPortDescStatsRequest(Dp(), 0))
    want = sorted(d["ports"]["p0s0"] for _u, _v, d in G.edges("p0s0", data=True))
    assert [p.port_no for p in reply.body] == want
    assert all(codec.port_is_up(ofp, p) for p in reply.body)


def test_a_barrier_is_answered_after_the_error_of_the_message_before_it():
    sw = fabric().switches["p0l0"]
    bad = reconcile.FlowMod("p0l0", "add", 1, 10, (("eth_type", 0x800),), (("group", 99),))
    replies = sent(sw, bad, reconcile.Barrier("p0l0", 7))
    assert [type(r).__name__ for r in replies] == ["OFPErrorMsg", "OFPBarrierReply"]
    assert (replies[0].type, replies[0].code) == (ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_GROUP)
    assert replies[1].xid == 7


def test_a_flow_beyond_the_limit_is_answered_with_table_full():
    sw = endpoint.Switch("s", 1, {1: "s-eth1"}, flow_limit=1)
    a = reconcile.FlowMod("s", "add", 1, 10, (("eth_type", 0x800), ("ipv4_dst", 1)), (("output", 1),))
    b = reconcile.FlowMod("s", "add", 1, 10, (("eth_type", 0x800), ("ipv4_dst", 2)), (("output", 1),))
    (err,) = sent(sw, a, b)
    assert (err.type, err.code) == (ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_TABLE_FULL)


def test_a_group_added_twice_is_answered_with_group_exists():
    sw = endpoint.Switch("s", 1, {1: "s-eth1"})
    g = reconcile.GroupMod("s", "add", 5, "ff", ((1, (("output", 1),)),))
    (err,) = sent(sw, g, g)
    assert (err.type, err.code) == (ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_GROUP_EXISTS)


def test_what_the_controller_installs_reads_back_as_the_compiler_s_state():
    state = compiler.compile_fabric(G)["p0s0"]
    sw = fabric().switches["p0s0"]
    msgs: list = [reconcile.GroupMod("p0s0", "add", g.group_id, g.kind, g.buckets) for g in state.groups]
    msgs += [reconcile.FlowMod("p0s0", "add", t, p, m, a) for (t, p, m), a in state.expanded().items()]
    assert sent(sw, *msgs) == []
    got = dump.expanded({"p0s0": sw.state()})
    assert got == dump.expanded({"p0s0": state})


def test_flow_stats_come_back_as_the_controller_decodes_them():
    state = compiler.compile_fabric(G)["p0l0"]
    sw = fabric().switches["p0l0"]
    sent(sw, *[reconcile.GroupMod("p0l0", "add", g.group_id, g.kind, g.buckets) for g in state.groups])
    entries = {(t, p, tuple(sorted(m))): a for (t, p, m), a in state.expanded().items()}
    sent(sw, *[reconcile.FlowMod("p0l0", "add", t, p, m, a) for (t, p, m), a in entries.items()])
    replies = sent(sw, reconcile.FlowStatsRequest("p0l0", 9), reconcile.GroupDescRequest("p0l0", 10))
    flows = {(e.table, e.priority, e.match): e.actions
             for r in replies if isinstance(r, parser.OFPFlowStatsReply) for e in codec.decode_flow_stats(Dp(), r.body)}
    groups = {g.group_id: g for r in replies if isinstance(r, parser.OFPGroupDescStatsReply)
              for g in codec.decode_group_desc(Dp(), r.body)}
    assert flows == {(t, p, reconcile.canonical_match(m)): a for (t, p, m), a in entries.items()}
    assert groups == {g.group_id: reconcile.canonical_group(g) for g in state.groups}


def test_a_long_flow_stats_reply_is_split_with_reply_more_on_all_but_the_last_part():
    sw = endpoint.Switch("s", 1, {1: "s-eth1"})
    sent(sw, *[reconcile.FlowMod("s", "add", 1, 10, (("eth_type", 0x800), ("ipv4_dst", i)), (("output", 1),))
               for i in range(2000)])
    replies = sent(sw, reconcile.FlowStatsRequest("s", 9))
    assert len(replies) > 1
    assert [bool(r.flags & ofp.OFPMPF_REPLY_MORE) for r in replies] == [True] * (len(replies) - 1) + [False]
    assert sum(len(r.body) for r in replies) == 2000


def test_the_controller_s_wipe_empties_the_switch():
    sw = endpoint.Switch("s", 1, {1: "s-eth1"})
    sent(sw, reconcile.GroupMod("s", "add", 5, "indirect", ((None, (("output", 1),)),)),
         reconcile.FlowMod("s", "add", 1, 10, (("eth_type", 0x800),), (("group", 5),)))
    sent(sw, reconcile.WipeTables("s"))
    assert not sw.tables.flows and not sw.tables.groups


def test_a_strict_delete_as_the_controller_sends_it_takes_that_entry_only():
    sw = endpoint.Switch("s", 1, {1: "s-eth1"})
    m = (("eth_type", 0x800), ("ipv4_dst", (0x0A000000, 0xFFFFFF00)))
    sent(sw, reconcile.FlowMod("s", "add", 1, 10, m, (("output", 1),)),
         reconcile.FlowMod("s", "add", 1, 11, m, (("output", 1),)),
         reconcile.FlowMod("s", "delete", 1, 10, m))
    assert [k[1] for k in sw.tables.flows] == [11]


def test_an_echo_request_is_answered_with_its_data():
    (reply,) = sent(endpoint.Switch("s", 1, {}), parser.OFPEchoRequest(Dp(), data=b"abc"))
    assert isinstance(reply, parser.OFPEchoReply) and reply.data == b"abc"


def test_a_link_taken_down_raises_port_status_at_both_ends():
    fab = fabric()
    out = fab.command("link down p0l0 p0s0")[0]
    assert sorted(name for name, _m in out) == ["p0l0", "p0s0"]
    for name, raw in out:
        msg = ofproto_parser.msg(Dp(), *ofproto_parser.header(raw), raw)
        assert isinstance(msg, parser.OFPPortStatus)
        assert msg.desc.port_no == G.edges["p0l0", "p0s0", 0]["ports"][name]
        assert not codec.port_is_up(ofp, msg.desc)


def test_a_link_brought_back_raises_port_status_up():
    fab = fabric()
    fab.command("link down p0l0 p0s0")
    out = fab.command("link up p0l0 p0s0")[0]
    for _name, raw in out:
        assert codec.port_is_up(ofp, ofproto_parser.msg(Dp(), *ofproto_parser.header(raw), raw).desc)


def test_a_failed_switch_drops_its_connection_and_its_neighbours_ports_towards_it_go_down():
    fab = fabric()
    out, connections = fab.command("switch down p0s0")
    assert connections == {"p0s0": False}
    assert sorted(name for name, _m in out) == sorted(set(G["p0s0"]) & set(fab.switches))


def test_an_unknown_command_is_one_line():
    with pytest.raises(UserError, match="unknown command"):
        fabric().command("link sideways a b")


def test_a_link_that_does_not_exist_is_one_line():
    with pytest.raises(UserError, match="no link between"):
        fabric().command("link down p0l0 p1s0")


def test_lldp_sent_out_of_a_port_reaches_the_peer_that_holds_the_lldp_rule():
    fab = fabric()
    a, b = fab.switches["p0l0"], fab.switches["p0s0"]
    sent(b, codec.lldp_rule(Dp()))
    port = G.edges["p0l0", "p0s0", 0]["ports"]
    sent(a, codec.packet_out(Dp(), codec.lldp_frame(a.dpid, port["p0l0"], "02:00:00:00:00:01"), port["p0l0"]))
    ((name, raw),) = fab.deliver("p0l0")
    msg = ofproto_parser.msg(Dp(), *ofproto_parser.header(raw), raw)
    assert name == "p0s0" and msg.match["in_port"] == port["p0s0"]
    assert codec.parse_lldp(msg.data) == (a.dpid, port["p0l0"])


def test_lldp_is_not_delivered_to_a_peer_without_the_lldp_rule():
    fab = fabric()
    a = fab.switches["p0l0"]
    port = G.edges["p0l0", "p0s0", 0]["ports"]["p0l0"]
    sent(a, codec.packet_out(Dp(), codec.lldp_frame(a.dpid, port, "02:00:00:00:00:01"), port))
    assert fab.deliver("p0l0") == []


def test_a_subset_of_planes_keeps_only_their_switches():
    names = endpoint.select(G, planes=[1])
    assert names and all(G.nodes[n]["plane"] == 1 for n in names)


def test_a_subset_with_no_switch_is_one_line():
    with pytest.raises(UserError, match="no switch"):
        endpoint.select(G, planes=[9])


@pytest.mark.parametrize("text", ["a", "3-1", "-2"])
def test_a_bad_number_list_is_one_line(text):
    with pytest.raises(UserError):
        endpoint.parse_numbers(text, "planes")


def test_a_dump_reads_back_as_it_was_written(tmp_path):
    states = compiler.compile_fabric(G)
    dump.write(tmp_path, states)
    assert dump.expanded(dump.read(tmp_path)) == dump.expanded(states)


def test_the_proofs_pass_on_the_compiled_tables_and_fail_on_empty_ones():
    states = compiler.compile_fabric(G)
    assert dump.prove_installed(G, states).ok
    empty = {n: compiler.SwitchState(n, st.dpid, ()) for n, st in states.items()}
    assert not dump.prove_installed(G, empty).ok


@pytest.mark.parametrize("argv, says", [
    (["switches", "mini-hpn", "--controller", "nope"], "HOST:PORT"),
    (["switches", "mini-hpn", "--planes", "7"], "no switch of mini-hpn"),
    (["switches", "--send", "stats"], "--run-dir"),
])
def test_bad_input_to_hpnlab_switches_is_one_line(argv, says, capsys):
    from hpnlab.cli.main import main
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err
