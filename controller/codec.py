"""OpenFlow 1.3 in and out: the reconciler's messages encoded for os-ken, switches' replies decoded back
into the reconciler's values, and the frames the controller sends and catches itself (LLDP, the staged
rollout's probes, proxy ARP replies), with the few flow-mods and packet-outs its collaborators send
outside the reconciler (the LLDP rule, the probe-catching rules, packet-outs).

No decision is made here: plain values in, os-ken messages out (and back). Groups: fast-failover groups
(OFPGT_FF, each bucket watching its port, watch_group OFPG_ANY; the switch must support the type, as
Open vSwitch does), indirect, all and select (every bucket weight 1); a flow sends to one with an
apply-action group. Metadata writes are full 64-bit values (mask all ones); metadata matches may be
masked. The ARP responders' move action is Open vSwitch's NXM move (``NXActionRegMove``).
"""
from __future__ import annotations

import functools
import logging
import struct
from typing import Any

from hpnlab.controller import reconcile, rollout
from hpnlab.fabric.routing import compiler, ofdecode, telemetry
from hpnlab.fabric.scenario.addressing import ip_str

from .ofp import arp, ether_types, ethernet, ipv4, lldp, packet, tcp, udp

COOKIE = 0x68706E6C61620000  # "hpnlab" in the top bytes: the flows this app owns
LLDP_COOKIE = 0x68706E6C6C647000   # the LLDP rule (not the reconciler's: its read-back skips it)
PRIO_LLDP = 65535
LLDP_TTL_S = 120
PROBE_COOKIE = 0x68706E6C70726F00  # the staged rollout's temporary probe-catching rules
PRIO_PROBE = 65534
ALL_COOKIE_BITS = 0xFFFFFFFFFFFFFFFF
OUT_OF_BAND_COOKIES = frozenset({LLDP_COOKIE, PROBE_COOKIE})   # not the reconciler's: left out of read-backs
METADATA_MASK = 0xFFFFFFFFFFFFFFFF   # write-metadata: the compiler's values are whole 64-bit words
GROUP_KINDS = ("ff", "indirect", "all", "select")

LOG = logging.getLogger("hpnlab.controller")


# ---- encoding: reconciler messages -> OpenFlow 1.3 ------------------------------------------

@functools.lru_cache(maxsize=1 << 16)
def encode_match(parser, match: tuple):
    """os-ken's OFPMatch of a canonical match, one object per match (os-ken only reads it when it
    serialises a message): the same routes and entropy matches recur on every switch of a plane, and
    building the OFPMatch was 17 s of a 360-switch cold start's 21 s of encoding (issue 53)."""
    fields = {}
    for name, value in match:
        if name in compiler.IPV4_FIELDS:
            value = (ip_str(value[0]), ip_str(value[1])) if isinstance(value, tuple) else ip_str(value)
        fields[name] = value
    return parser.OFPMatch(**fields)


def _group_type(ofp, kind: str) -> int:
    types = {"ff": ofp.OFPGT_FF, "indirect": ofp.OFPGT_INDIRECT, "all": ofp.OFPGT_ALL, "select": ofp.OFPGT_SELECT}
    if kind not in types:
        raise ValueError(f"unknown group kind {kind!r}: one of {', '.join(GROUP_KINDS)}")
    return types[kind]


def encode_action(ofp, parser, act: tuple):
    """One apply-action (output, controller, group, set_field, move), or None for the actions that are instructions."""
    if act[0] == "output":
        return parser.OFPActionOutput(act[1])
    if act[0] == "controller":
        return parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)
    if act[0] == "group":
        return parser.OFPActionGroup(act[1])
    if act[0] == "set_field" and act[1] == "in_port":
        # Open vSwitch refuses OpenFlow 1.3's set-field on in_port (OFPBAC_BAD_SET_ARGUMENT for
        # port 0) but takes its NXM load, load:0->NXM_OF_IN_PORT[]: what lets a detour bucket
        # send a packet back to the switch it came from (compiler's _Protection.detour)
        return parser.NXActionRegLoad(ofs_nbits=15, dst="in_port_nxm", value=act[2])
    if act[0] == "set_field":
        return parser.OFPActionSetField(**{act[1]: ip_str(act[2]) if act[1] in compiler.IPV4_FIELDS else act[2]})
    if act[0] == "move":       # a whole field into another of the same width (Open vSwitch's NXM move)
        return parser.NXActionRegMove(src_field=act[1], dst_field=act[2], n_bits=ofdecode.FIELD_BITS[act[1]])
    return None


def encode_instructions(ofp, parser, actions: tuple) -> list:
    instructions, apply = [], []
    for act in actions:
        if act[0] == "metadata":
            instructions.append(parser.OFPInstructionWriteMetadata(act[1], METADATA_MASK))
        elif act[0] == "goto":
            instructions.append(parser.OFPInstructionGotoTable(act[1]))
        else:
            action = encode_action(ofp, parser, act)
            if action is not None:
                apply.append(action)
    if apply:
        instructions.insert(0, parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, apply))
    return instructions


def encode_buckets(ofp, parser, kind: str, buckets: tuple) -> list:
    """A group's buckets: a fast-failover bucket watches its port (no group); a select bucket has
    weight 1; the others neither watch nor weigh."""
    out = []
    for watch, actions in buckets:
        acts = [a for a in (encode_action(ofp, parser, act) for act in actions) if a is not None]
        port = watch if isinstance(watch, int) else ofp.OFPP_ANY
        group = watch[1] if isinstance(watch, tuple) else ofp.OFPG_ANY
        out.append(parser.OFPBucket(weight=1 if kind == "select" else 0,
                                    watch_port=port, watch_group=group, actions=acts))
    return out


def encode(dp, msg: reconcile.Message | telemetry.PortStatsRequest) -> list:
    """The OpenFlow 1.3 messages for one reconciler message (xids of barriers and stats
    requests are the reconciler's, so that replies can be matched)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    if isinstance(msg, reconcile.FlowMod):
        command = ofp.OFPFC_DELETE_STRICT if msg.command == "delete" else ofp.OFPFC_ADD
        instructions = [] if msg.command == "delete" else encode_instructions(ofp, parser, msg.actions)
        return [parser.OFPFlowMod(
            datapath=dp, cookie=COOKIE, cookie_mask=0, table_id=msg.table, command=command,
            priority=msg.priority, match=encode_match(parser, msg.match), instructions=instructions,
            out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, buffer_id=ofp.OFP_NO_BUFFER)]
    if isinstance(msg, reconcile.GroupMod):
        if msg.command == "delete":
            return [parser.OFPGroupMod(datapath=dp, command=ofp.OFPGC_DELETE, type_=ofp.OFPGT_ALL,
                                       group_id=msg.group_id, buckets=[])]
        command = ofp.OFPGC_MODIFY if msg.command == "modify" else ofp.OFPGC_ADD
        return [parser.OFPGroupMod(datapath=dp, command=command, type_=_group_type(ofp, msg.kind),
                                   group_id=msg.group_id, buckets=encode_buckets(ofp, parser, msg.kind, msg.buckets))]
    if isinstance(msg, reconcile.WipeTables):
        return [parser.OFPFlowMod(datapath=dp, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
                                  out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch()),
                parser.OFPGroupMod(datapath=dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL)]
    if isinstance(msg, reconcile.Barrier):
        out = parser.OFPBarrierRequest(dp)
    elif isinstance(msg, reconcile.FlowStatsRequest):
        out = parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY,
                                         COOKIE, 0, parser.OFPMatch())     # cookie mask 0: every flow
    elif isinstance(msg, reconcile.GroupDescRequest):
        out = parser.OFPGroupDescStatsRequest(dp, 0)
    elif isinstance(msg, telemetry.PortStatsRequest):
        out = parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY)
    else:
        raise TypeError(f"cannot encode {msg!r}")
    out.set_xid(msg.xid)
    return [out]


# ---- decoding: OpenFlow 1.3 -> reconciler values -----------------------------------------------

def decode_match(match) -> tuple:
    """A match back into compiler fields (routing/ofdecode.py: a masked field whose mask is all ones, as a
    switch may report it, is the exact value), in the reconciler's canonical order."""
    return ofdecode.match(match.items())


def decode_action(ofp, parser, act) -> tuple | None:
    return ofdecode.action(ofp, parser, act)


def decode_actions(ofp, parser, instructions) -> tuple:
    """Instructions back into compiler actions (routing/ofdecode.py)."""
    return ofdecode.instructions(ofp, parser, instructions)


def decode_flow_stats(dp, body) -> tuple:
    """Every flow of a flow stats reply, as reconciler entries (every flow of a fabric switch counts
    as the controller's: one it did not make is not desired, and is deleted; see reconcile's
    docstring) -- but the app's own out-of-band rules (LLDP, rollout probes), which the app keeps
    itself under their own cookies."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return tuple(reconcile.FlowEntry(st.table_id, st.priority, decode_match(st.match),
                             decode_actions(ofp, parser, st.instructions))
                 for st in body if st.cookie not in OUT_OF_BAND_COOKIES)


def decode_group_desc(dp, body) -> tuple:
    """Every group of a group description reply, as compiler.Group values (every group on a fabric
    switch is the controller's: see reconcile's docstring)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    kinds = {_group_type(ofp, k): k for k in GROUP_KINDS}
    out = []
    for st in body:
        kind = kinds.get(st.type)
        if kind is None:
            LOG.warning("group %d of unknown type %d ignored", st.group_id, st.type)
            continue
        out.append(compiler.Group(st.group_id, kind, ofdecode.buckets(ofp, parser, kind, st.buckets)))
    return tuple(out)


def decode_port_stats(body) -> list[telemetry.OfPortStats]:
    """A port statistics reply's entries as telemetry values."""
    return [telemetry.OfPortStats(st.port_no, st.tx_bytes, st.tx_packets, st.tx_dropped, st.rx_bytes,
                                  st.rx_packets, st.rx_dropped) for st in body]


# ---- LLDP (discovery, controller/wiring.py) ------------------------------------------------------

def lldp_frame(dpid: int, port: int, src_mac: str) -> bytes:
    """The LLDP frame sent out of ``port`` of ``dpid``: chassis id ``dpid:<16 hex digits>`` (locally
    assigned, as Ryu's topology app sends it), port id the OpenFlow port number (4 bytes)."""
    tlvs = (lldp.ChassisID(subtype=lldp.ChassisID.SUB_LOCALLY_ASSIGNED, chassis_id=b"dpid:%016x" % dpid),
            lldp.PortID(subtype=lldp.PortID.SUB_PORT_COMPONENT, port_id=struct.pack("!I", port)),
            lldp.TTL(ttl=LLDP_TTL_S), lldp.End())
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst=lldp.LLDP_MAC_NEAREST_BRIDGE, src=src_mac,
                                       ethertype=ether_types.ETH_TYPE_LLDP))
    pkt.add_protocol(lldp.lldp(tlvs))
    pkt.serialize()
    return bytes(pkt.data)


def parse_lldp(data: bytes) -> tuple[int, int] | None:
    """(datapath id, port) of one of our LLDP frames; None for anything else (another sender's LLDP)."""
    pkt = packet.Packet(bytes(data))
    frame = pkt.get_protocol(lldp.lldp)
    if frame is None or len(frame.tlvs) < 2:
        return None
    chassis, port = frame.tlvs[0], frame.tlvs[1]
    chassis_id = getattr(chassis, "chassis_id", b"")
    port_id = getattr(port, "port_id", b"")
    if not chassis_id.startswith(b"dpid:") or len(port_id) != 4:
        return None
    return int(chassis_id[5:], 16), struct.unpack("!I", port_id)[0]


def probe_frame(p: rollout.Probe) -> bytes:
    """A staged rollout's probe from the source host to the destination host: a TCP SYN to PROBE_PORT with
    the probe id in its sequence number (hosts mode: the host answers), or UDP to PROBE_PORT (leaves mode)."""
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst=p.dst_mac, src=p.src_mac, ethertype=ether_types.ETH_TYPE_IP))
    if p.mode == "hosts":
        pkt.add_protocol(ipv4.ipv4(src=p.src_ip, dst=p.dst_ip, proto=rollout.IP_TCP, ttl=64))
        pkt.add_protocol(tcp.tcp(src_port=p.sport, dst_port=rollout.PROBE_PORT, seq=p.seq, bits=tcp.TCP_SYN,
                                 window_size=1024))
    else:
        pkt.add_protocol(ipv4.ipv4(src=p.src_ip, dst=p.dst_ip, proto=rollout.IP_UDP, ttl=64))
        pkt.add_protocol(udp.udp(src_port=p.sport, dst_port=rollout.PROBE_PORT))
        pkt.add_protocol(p.payload)
    pkt.serialize()
    return bytes(pkt.data)


def probe_caught(data: bytes) -> int | None:
    """The probe id of a caught frame: a UDP probe (leaves mode) or a host's TCP answer to one (hosts mode,
    acknowledging the SYN's sequence number); None for anything else."""
    pkt = packet.Packet(bytes(data))
    seg = pkt.get_protocol(tcp.tcp)
    if seg is not None:
        return rollout.probe_id_of_ack(seg.ack) if seg.src_port == rollout.PROBE_PORT and seg.bits & tcp.TCP_ACK \
            else None
    dgram = pkt.get_protocol(udp.udp)
    if dgram is None or dgram.dst_port != rollout.PROBE_PORT:
        return None
    payload = pkt.protocols[-1] if isinstance(pkt.protocols[-1], (bytes, bytearray)) else b""
    return rollout.probe_id_of(bytes(payload))


def is_lldp(data: bytes) -> bool:
    return len(data) >= 14 and struct.unpack("!H", data[12:14])[0] == ether_types.ETH_TYPE_LLDP


def fast_failover_supported(ofp, features) -> bool:
    """Does a group features reply (its body) list the fast-failover group type?"""
    return bool(features.types & (1 << ofp.OFPGT_FF))


def port_is_up(ofp, desc) -> bool:
    """A port carries traffic when it is up, has carrier and is live. Open vSwitch clears
    OFPPS_LIVE (and sends a PortStatus) when BFD on the port stops forwarding while the
    carrier stays up: a gray failure (see hpnlab.fabric.emulation.ovsdb)."""
    return not (desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN
                or not desc.state & ofp.OFPPS_LIVE)


# ---- what the collaborators send outside the reconciler ----------------------------------------------

def send(dp, msg: reconcile.Message | telemetry.PortStatsRequest) -> None:
    """Encode one reconciler (or telemetry) message and send it to ``dp``."""
    for ofmsg in encode(dp, msg):
        dp.send_msg(ofmsg)


def lldp_rule(dp):
    """The table-0 rule that sends LLDP to the controller (cookie ``LLDP_COOKIE``)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                         [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])]
    return parser.OFPFlowMod(datapath=dp, cookie=LLDP_COOKIE, table_id=0, command=ofp.OFPFC_ADD,
                             priority=PRIO_LLDP, match=parser.OFPMatch(eth_type=ether_types.ETH_TYPE_LLDP),
                             instructions=inst, buffer_id=ofp.OFP_NO_BUFFER)


def lldp_rule_request(dp):
    """The question whether ``dp`` holds the LLDP rule (a flow stats request for its cookie, table 0)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowStatsRequest(dp, 0, 0, ofp.OFPP_ANY, ofp.OFPG_ANY, LLDP_COOKIE, ALL_COOKIE_BITS,
                                      parser.OFPMatch())


def holds_lldp_rule(body) -> bool:
    """Does a flow stats reply's body hold the LLDP rule?"""
    return any(st.cookie == LLDP_COOKIE for st in body)


def probe_catchers(dp, ports, match: tuple) -> list:
    """The table-0 rules that send what matches ``match`` (rollout.catch_match) arriving at ``ports`` to the
    controller (cookie ``PROBE_COOKIE``)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [
        parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])]
    return [parser.OFPFlowMod(datapath=dp, cookie=PROBE_COOKIE, table_id=0, command=ofp.OFPFC_ADD,
                              priority=PRIO_PROBE, match=parser.OFPMatch(in_port=port, **dict(match)),
                              instructions=inst, buffer_id=ofp.OFP_NO_BUFFER)
            for port in ports]


def probe_catchers_removal(dp):
    """The deletion of every probe-catching rule of ``dp``."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowMod(datapath=dp, cookie=PROBE_COOKIE, cookie_mask=ALL_COOKIE_BITS, table_id=ofp.OFPTT_ALL,
                             command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                             match=parser.OFPMatch())


def packet_out(dp, data: bytes, out_port: int, in_port: int | None = None):
    """``data`` sent out of ``out_port`` (``OFPP_TABLE``: through the switch's tables) as if it arrived on
    ``in_port`` (default: from the controller)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPPacketOut(datapath=dp, buffer_id=ofp.OFP_NO_BUFFER,
                               in_port=ofp.OFPP_CONTROLLER if in_port is None else in_port,
                               actions=[parser.OFPActionOutput(out_port)], data=data)


def arp_request_of(data: bytes) -> tuple[Any, Any] | None:
    """(ethernet, arp) of a frame that is an ARP packet, else None."""
    pkt = packet.Packet(bytes(data))
    eth = pkt.get_protocol(ethernet.ethernet)
    req = pkt.get_protocol(arp.arp)
    if eth is None or req is None or eth.ethertype != ether_types.ETH_TYPE_ARP:
        return None
    return eth, req


def is_arp_request(req) -> bool:
    return bool(req.opcode == arp.ARP_REQUEST)


def arp_reply_frame(eth, req, mac: str) -> bytes:
    """The reply to ARP request ``req`` (in frame ``eth``): ``req``'s target address is at ``mac``."""
    reply = packet.Packet()
    reply.add_protocol(ethernet.ethernet(ethertype=ether_types.ETH_TYPE_ARP, dst=eth.src, src=mac))
    reply.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=mac, src_ip=req.dst_ip,
                               dst_mac=req.src_mac, dst_ip=req.src_ip))
    reply.serialize()
    return bytes(reply.data)


def source_mac(data: bytes) -> str | None:
    """The source MAC of an Ethernet frame (None: not one)."""
    eth = packet.Packet(bytes(data)).get_protocol(ethernet.ethernet)
    return None if eth is None else eth.src
