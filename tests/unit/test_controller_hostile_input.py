"""The controller's inputs from switches, generated and malformed (issue 15): the app never stops.

A switch is an input too: its packet-ins carry whatever a host sent, and its OpenFlow
messages may name ports, xids and error codes the controller never asked about. A seeded
generator builds such messages with os-ken's own classes around the fake datapaths of
tests/support/fake_switch.py and hands them to the app's handlers: none may raise, and a
packet-in gets an ARP reply only when it is a well-formed ARP request for a planned address.
"""
from __future__ import annotations

import random

import pytest

pytest.importorskip("os_ken")

from os_ken.controller import ofp_event
from os_ken.lib.packet import arp, ether_types, ethernet, packet
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from support.fake_switch import FakeDatapath, connect_all

from hpnlab.fabric.scenario import graph

CASES = 300


def _packet_in(dp: FakeDatapath, data: bytes, in_port: int | None) -> ofp_event.EventOFPPacketIn:
    match = parser.OFPMatch(in_port=in_port) if in_port is not None else parser.OFPMatch()
    msg = parser.OFPPacketIn(dp, buffer_id=ofp.OFP_NO_BUFFER, total_len=len(data), reason=ofp.OFPR_ACTION,
                             table_id=0, cookie=0, match=match, data=data)
    return ofp_event.EventOFPPacketIn(msg)


def _arp(rng: random.Random, src_ip: str, dst_ip: str) -> bytes:
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(ethertype=ether_types.ETH_TYPE_ARP, src="02:00:00:00:00:01",
                                       dst="ff:ff:ff:ff:ff:ff"))
    pkt.add_protocol(arp.arp(opcode=rng.choice([arp.ARP_REQUEST, arp.ARP_REQUEST, arp.ARP_REPLY, 7]),
                             src_mac="02:00:00:00:00:01", src_ip=src_ip, dst_mac="00:00:00:00:00:00",
                             dst_ip=dst_ip))
    pkt.serialize()
    return bytes(pkt.data)


def _mutated(rng: random.Random, data: bytes) -> bytes:
    how = rng.randrange(4)
    if how == 0:
        return data[: rng.randrange(len(data) + 1)]                    # truncated
    if how == 1:
        raw = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)            # bytes flipped
        return bytes(raw)
    if how == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(200)))   # noise
    return data + bytes(rng.randrange(256) for _ in range(rng.randrange(64)))  # trailing bytes


def test_generated_packet_ins_never_raise_and_only_a_planned_arp_request_is_answered(app):
    rng = random.Random(15)
    dps = connect_all(app)
    host_ips = [d["ip"] for _, _, d in app.graph.edges(data=True) if d["kind"] == "host"]
    leaves = [n for n in dps if app.graph.nodes[n]["tier"] == 1]
    answered = 0
    for _ in range(CASES):
        leaf = rng.choice(leaves)
        dp = dps[leaf]
        host_port = rng.choice([p for _, _, d in app.graph.edges(leaf, data=True) for p in [d["ports"][leaf]]
                                if d["kind"] == "host"])
        in_port = rng.choice([host_port, host_port, None, 0, 10_000, 0xFFFFFFFF])
        wellformed = _arp(rng, rng.choice(host_ips), rng.choice(host_ips + ["192.0.2.1", "0.0.0.0"]))
        data = wellformed if rng.random() < 0.3 else _mutated(rng, wellformed)
        dp.take()
        app.on_packet_in(_packet_in(dp, data, in_port))
        sent = dp.take()
        assert all(isinstance(m, parser.OFPPacketOut) for m in sent) and len(sent) <= 1
        answered += len(sent)
    assert answered > 0   # the generator reaches the answered side too


def test_a_packet_in_from_a_switch_of_another_scenario_is_ignored(app):
    connect_all(app)
    stranger = FakeDatapath(0xDEAD)
    app.on_packet_in(_packet_in(stranger, b"\xff" * 60, 1))
    assert stranger.take() == []


def test_generated_port_status_error_and_barrier_messages_never_raise(app):
    rng = random.Random(16)
    dps = connect_all(app)
    names = list(dps) + ["stranger"]
    stranger = FakeDatapath(0xDEAD)
    for _ in range(CASES):
        name = rng.choice(names)
        dp = dps.get(name, stranger)
        kind = rng.randrange(3)
        if kind == 0:
            desc = parser.OFPPort(port_no=rng.choice([1, 2, 3, 0, 999, ofp.OFPP_LOCAL, 0xFFFFFFFF]),
                                  hw_addr="02:00:00:00:00:01", name=b"x", config=rng.randrange(1 << 8),
                                  state=rng.randrange(1 << 8), curr=0, advertised=0, supported=0, peer=0,
                                  curr_speed=0, max_speed=0)
            reason = rng.choice([ofp.OFPPR_ADD, ofp.OFPPR_DELETE, ofp.OFPPR_MODIFY, 9])
            app.on_port_status(ofp_event.EventOFPPortStatus(parser.OFPPortStatus(dp, reason=reason, desc=desc)))
        elif kind == 1:
            err = parser.OFPErrorMsg(dp, type_=rng.randrange(1 << 16), code=rng.randrange(1 << 16),
                                     data=bytes(rng.randrange(256) for _ in range(rng.randrange(40))))
            err.xid = rng.randrange(1 << 32)
            app.on_error(ofp_event.EventOFPErrorMsg(err))
        else:
            reply = parser.OFPBarrierReply(dp)
            reply.xid = rng.randrange(1 << 32)
            app.on_barrier_reply(ofp_event.EventOFPBarrierReply(reply))
        for other in dps.values():   # whatever the app sends in answer must encode
            other.take()


def test_every_switch_dpid_of_the_fabric_reaches_the_app_by_name(app):
    g = app.graph
    assert {app.index.by_dpid[g.nodes[n]["dpid"]] for n in graph.switches(g)} == set(graph.switches(g))
