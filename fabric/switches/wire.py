"""OpenFlow 1.3 on the wire for the simulated switches, with os-ken's parser and serializer.

What os-ken parses (FlowMod, Hello, Echo, matches, instructions, buckets, actions) is parsed with its
classes; the few controller-to-switch messages it has no message parser for (GroupMod, multipart
requests, SetConfig, PacketOut) are unpacked with os-ken's own layouts (``ofproto_v1_3.*_PACK_STR``) and
element parsers (``OFPMatch.parser``, ``OFPBucket.parser``, ``OFPAction.parser``). Replies are built the
same way: os-ken's message classes where they serialise (Hello, EchoReply, ErrorMsg, BarrierReply), else
its layouts and ``msg_pack_into`` with os-ken's match serialiser. No decision is made here.
"""
from __future__ import annotations

import struct
from typing import Any

from os_ken.lib import addrconv
from os_ken.lib.pack_utils import msg_pack_into
from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from hpnlab.fabric.routing import ofdecode

from . import tables

HEADER = ofp.OFP_HEADER_SIZE
MAX_MSG = 0xFFFF
#: OpenFlow's group types by the compiler's names
GROUP_KINDS = {ofp.OFPGT_FF: "ff", ofp.OFPGT_INDIRECT: "indirect", ofp.OFPGT_ALL: "all", ofp.OFPGT_SELECT: "select"}
FLOW_COMMANDS = {ofp.OFPFC_ADD: "add", ofp.OFPFC_MODIFY: "modify", ofp.OFPFC_MODIFY_STRICT: "modify_strict",
                 ofp.OFPFC_DELETE: "delete", ofp.OFPFC_DELETE_STRICT: "delete_strict"}
GROUP_COMMANDS = {ofp.OFPGC_ADD: "add", ofp.OFPGC_MODIFY: "modify", ofp.OFPGC_DELETE: "delete"}
#: tables' error names -> (OpenFlow error type, code)
ERROR_CODES = {
    "table_full": (ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_TABLE_FULL),
    "bad_table_id": (ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_BAD_TABLE_ID),
    "bad_out_group": (ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_GROUP),
    "group_exists": (ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_GROUP_EXISTS),
    "unknown_group": (ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_UNKNOWN_GROUP),
    "out_of_groups": (ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_OUT_OF_GROUPS),
    "bad_command": (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_TYPE),
    "bad_type": (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_TYPE),
    "bad_multipart": (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_MULTIPART),
}


#: values many flows share (their instructions, the ports and groups they send to), kept once: most of a
#: switch's memory is its entries. Bounded: past the bound, new values are kept per flow.
_SHARED: dict = {}
SHARED_MAX = 1 << 18


def shared(value: Any) -> Any:
    """``value``, or an equal one already kept (one object for every flow that has it)."""
    kept = _SHARED.get(value)
    if kept is not None:
        return kept
    if len(_SHARED) < SHARED_MAX:
        _SHARED[value] = value
    return value


class _Dp:
    """What os-ken's message classes ask of a datapath when they serialise."""
    ofproto = ofp
    ofproto_parser = parser
    id = 0


DP = _Dp()


def header(buf: bytes) -> tuple[int, int, int, int]:
    """(version, type, length, xid) of the message at the start of ``buf``."""
    return ofproto_parser.header(buf)


# ---- decoding ---------------------------------------------------------------------------------------

def canonical_match(match: Any) -> tuple:
    """An os-ken OFPMatch as the tables' canonical match: the compiler's fields (routing/ofdecode.py)."""
    return ofdecode.match(match.items())


def _targets(actions: Any, outputs: set, groups: set) -> None:
    for act in actions:
        if isinstance(act, parser.OFPActionOutput):
            outputs.add(act.port)
        elif isinstance(act, parser.OFPActionGroup):
            groups.add(act.group_id)


def flow_mod(buf: bytes) -> tables.FlowMod:
    """A FlowMod message as the tables' value (ValueError: not one the tables know)."""
    version, msg_type, length, xid = header(buf)
    msg = parser.OFPFlowMod.parser(DP, version, msg_type, length, xid, buf)
    command = FLOW_COMMANDS.get(msg.command)
    if command is None:
        raise ValueError(f"flow-mod command {msg.command}")
    outputs: set[int] = set()
    groups: set[int] = set()
    for inst in msg.instructions:
        if isinstance(inst, parser.OFPInstructionActions):
            _targets(inst.actions, outputs, groups)
    start = ofp.OFP_FLOW_MOD_SIZE - ofp.OFP_MATCH_SIZE
    end = start + (msg.match.length + 7) // 8 * 8
    return tables.FlowMod(
        command, None if msg.table_id == ofp.OFPTT_ALL else msg.table_id, msg.priority, canonical_match(msg.match),
        msg.cookie, msg.cookie_mask, None if msg.out_port == ofp.OFPP_ANY else msg.out_port,
        None if msg.out_group == ofp.OFPG_ANY else msg.out_group, shared(frozenset(outputs)),
        shared(frozenset(groups)), bytes(buf[start:end]), shared(bytes(buf[end:length])))


def buckets(buf: bytes, offset: int, end: int) -> list:
    out = []
    while offset < end:
        b = parser.OFPBucket.parser(buf, offset)
        out.append(b)
        offset += b.len
    return out


def group_mod(buf: bytes) -> tables.GroupMod:
    _v, _t, length, _x = header(buf)
    command, type_, group_id = struct.unpack_from(ofp.OFP_GROUP_MOD_PACK_STR, buf, HEADER)
    name = GROUP_COMMANDS.get(command)
    if name is None:
        raise ValueError(f"group-mod command {command}")
    start = ofp.OFP_GROUP_MOD_SIZE
    refs: set[int] = set()
    for b in buckets(buf, start, length):
        outs: set[int] = set()
        _targets(b.actions, outs, refs)
        if b.watch_group != ofp.OFPG_ANY:
            refs.add(b.watch_group)
    return tables.GroupMod(name, None if group_id == ofp.OFPG_ALL else group_id,
                           GROUP_KINDS.get(type_, "all"), frozenset(refs), bytes(buf[start:length]))


def multipart_request(buf: bytes) -> tuple[int, int]:
    """(multipart type, flags)."""
    return struct.unpack_from(ofp.OFP_MULTIPART_REQUEST_PACK_STR, buf, HEADER)


def flow_stats_request(buf: bytes) -> dict:
    """The selection of a flow stats request: table (None: all), out_port, out_group, cookie, cookie_mask,
    match."""
    off = ofp.OFP_MULTIPART_REQUEST_SIZE
    table, out_port, out_group, cookie, cookie_mask = struct.unpack_from(ofp.OFP_FLOW_STATS_REQUEST_0_PACK_STR,
                                                                         buf, off)
    match = parser.OFPMatch.parser(buf, off + ofp.OFP_FLOW_STATS_REQUEST_0_SIZE)
    return {"table": None if table == ofp.OFPTT_ALL else table,
            "out_port": None if out_port == ofp.OFPP_ANY else out_port,
            "out_group": None if out_group == ofp.OFPG_ANY else out_group,
            "cookie": cookie, "cookie_mask": cookie_mask, "match": canonical_match(match)}


def packet_out(buf: bytes) -> tuple[int, list[int], bytes]:
    """(in_port, output ports, frame) of a PacketOut."""
    _v, _t, length, _x = header(buf)
    _buffer_id, in_port, actions_len = struct.unpack_from(ofp.OFP_PACKET_OUT_PACK_STR, buf, HEADER)
    off = ofp.OFP_PACKET_OUT_SIZE
    ports = []
    end = off + actions_len
    while off < end:
        act = parser.OFPAction.parser(buf, off)
        if isinstance(act, parser.OFPActionOutput):
            ports.append(act.port)
        off += act.len
    return in_port, ports, bytes(buf[end:length])


# ---- decoding what a switch holds into the compiler's values (for dumps and proofs) -------------------

def compiler_match(match_body: bytes) -> tuple:
    return canonical_match(parser.OFPMatch.parser(match_body, 0))


def compiler_actions(instructions_body: bytes) -> tuple:
    """Instructions as the compiler's actions (routing/ofdecode.py: apply-actions in order, then
    write-metadata, then goto)."""
    insts = []
    off = 0
    while off < len(instructions_body):
        insts.append(parser.OFPInstruction.parser(instructions_body, off))
        _t, ilen = struct.unpack_from("!HH", instructions_body, off)
        off += ilen
    return ofdecode.instructions(ofp, parser, insts)


def compiler_buckets(kind: str, body: bytes) -> tuple:
    return ofdecode.buckets(ofp, parser, kind, buckets(body, 0, len(body)))


# ---- encoding replies --------------------------------------------------------------------------------

def _finish(buf: bytearray, msg_type: int, xid: int) -> bytes:
    msg_pack_into(ofp.OFP_HEADER_PACK_STR, buf, 0, ofp.OFP_VERSION, msg_type, len(buf), xid)
    return bytes(buf)


def hello() -> bytes:
    msg = parser.OFPHello(DP)
    msg.serialize()
    return bytes(msg.buf)


def echo_reply(xid: int, data: bytes) -> bytes:
    msg = parser.OFPEchoReply(DP, data=data)
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def barrier_reply(xid: int) -> bytes:
    msg = parser.OFPBarrierReply(DP)
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def error(xid: int, name: str, request: bytes) -> bytes:
    """The error ``name`` (ERROR_CODES) in answer to ``request`` (its first 64 bytes, as a switch sends)."""
    type_, code = ERROR_CODES[name]
    msg = parser.OFPErrorMsg(DP, type_=type_, code=code, data=bytes(request[:64]))
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def features_reply(xid: int, dpid: int) -> bytes:
    buf = bytearray(ofp.OFP_SWITCH_FEATURES_SIZE)
    caps = ofp.OFPC_FLOW_STATS | ofp.OFPC_TABLE_STATS | ofp.OFPC_PORT_STATS | ofp.OFPC_GROUP_STATS
    msg_pack_into(ofp.OFP_SWITCH_FEATURES_PACK_STR, buf, HEADER, dpid, 0, tables.N_TABLES, 0, caps, 0)
    return _finish(buf, ofp.OFPT_FEATURES_REPLY, xid)


def get_config_reply(xid: int, flags: int, miss_send_len: int) -> bytes:
    buf = bytearray(ofp.OFP_SWITCH_CONFIG_SIZE)
    msg_pack_into(ofp.OFP_SWITCH_CONFIG_PACK_STR, buf, HEADER, flags, miss_send_len)
    return _finish(buf, ofp.OFPT_GET_CONFIG_REPLY, xid)


def port(number: int, name: str, mac: str, up: bool) -> tuple:
    """One port description's fields, in OFP_PORT_PACK_STR's order (100 Gbit/s, as a fabric port)."""
    state = ofp.OFPPS_LIVE if up else ofp.OFPPS_LINK_DOWN
    speed = ofp.OFPPF_100GB_FD
    return (number, addrconv.mac.text_to_bin(mac), name.encode()[:ofp.OFP_MAX_PORT_NAME_LEN - 1], 0, state,
            speed, speed, speed, 0, 100_000_000, 100_000_000)


def port_status(reason: int, desc: tuple) -> bytes:
    buf = bytearray(ofp.OFP_PORT_STATUS_SIZE)
    msg_pack_into(ofp.OFP_PORT_STATUS_PACK_STR, buf, HEADER, reason, *desc)
    return _finish(buf, ofp.OFPT_PORT_STATUS, 0)


def multipart_replies(xid: int, mp_type: int, entries: list[bytes]) -> list[bytes]:
    """A multipart reply of ``entries`` (each one encoded body entry), split so that no message is longer than
    OpenFlow allows (every part but the last flagged REPLY_MORE)."""
    parts: list[list[bytes]] = [[]]
    size = ofp.OFP_MULTIPART_REPLY_SIZE
    room = MAX_MSG - ofp.OFP_MULTIPART_REPLY_SIZE
    for e in entries:
        if parts[-1] and size + len(e) > MAX_MSG:
            parts.append([])
            size = ofp.OFP_MULTIPART_REPLY_SIZE
        if len(e) > room:
            raise ValueError("one multipart entry longer than a message")
        parts[-1].append(e)
        size += len(e)
    out = []
    for i, part in enumerate(parts):
        buf = bytearray(ofp.OFP_MULTIPART_REPLY_SIZE)
        flags = ofp.OFPMPF_REPLY_MORE if i < len(parts) - 1 else 0
        msg_pack_into(ofp.OFP_MULTIPART_REPLY_PACK_STR, buf, HEADER, mp_type, flags)
        out.append(_finish(buf + b"".join(part), ofp.OFPT_MULTIPART_REPLY, xid))
    return out


def port_desc_entry(desc: tuple) -> bytes:
    buf = bytearray(ofp.OFP_PORT_SIZE)
    msg_pack_into(ofp.OFP_PORT_PACK_STR, buf, 0, *desc)
    return bytes(buf)


def flow_stats_entry(table: int, priority: int, e: tables.Entry) -> bytes:
    length = ofp.OFP_FLOW_STATS_0_SIZE + len(e.match_body) + len(e.instructions_body)
    buf = bytearray(ofp.OFP_FLOW_STATS_0_SIZE)
    msg_pack_into(ofp.OFP_FLOW_STATS_0_PACK_STR, buf, 0, length, table, 0, 0, priority, 0, 0, 0, e.cookie, 0, 0)
    return bytes(buf) + e.match_body + e.instructions_body


def group_desc_entry(group_id: int, kind: str, body: bytes) -> bytes:
    types = {v: k for k, v in GROUP_KINDS.items()}
    buf = bytearray(ofp.OFP_GROUP_DESC_STATS_SIZE)
    msg_pack_into(ofp.OFP_GROUP_DESC_STATS_PACK_STR, buf, 0, ofp.OFP_GROUP_DESC_STATS_SIZE + len(body),
                  types[kind], group_id)
    return bytes(buf) + body


def group_stats_entry(group_id: int, flows: int, n_buckets: int) -> bytes:
    size = ofp.OFP_GROUP_STATS_SIZE + n_buckets * ofp.OFP_BUCKET_COUNTER_SIZE
    buf = bytearray(size)
    msg_pack_into(ofp.OFP_GROUP_STATS_PACK_STR, buf, 0, size, group_id, flows, 0, 0, 0, 0)
    return bytes(buf)


def group_features_body() -> bytes:
    buf = bytearray(ofp.OFP_GROUP_FEATURES_SIZE)
    types = sum(1 << t for t in GROUP_KINDS)
    caps = ofp.OFPGFC_SELECT_WEIGHT | ofp.OFPGFC_SELECT_LIVENESS | ofp.OFPGFC_CHAINING
    acts = (1 << ofp.OFPAT_OUTPUT) | (1 << ofp.OFPAT_GROUP) | (1 << ofp.OFPAT_SET_FIELD)
    msg_pack_into(ofp.OFP_GROUP_FEATURES_PACK_STR, buf, 0, types, caps, 65536, 65536, 65536, 65536,
                  acts, acts, acts, acts)
    return bytes(buf)


def packet_in(in_port: int, frame: bytes, cookie: int, table: int = 0) -> bytes:
    buf = bytearray(ofp.OFP_PACKET_IN_SIZE - ofp.OFP_MATCH_SIZE)
    msg_pack_into(ofp.OFP_PACKET_IN_PACK_STR, buf, HEADER, ofp.OFP_NO_BUFFER, len(frame), ofp.OFPR_ACTION,
                  table, cookie)
    match = parser.OFPMatch(in_port=in_port)
    off = len(buf)
    length = match.serialize(buf, off)
    buf += b"\0" * (((off + length + 7) // 8 * 8) - len(buf))
    buf += b"\0\0" + frame
    return _finish(buf, ofp.OFPT_PACKET_IN, 0)
