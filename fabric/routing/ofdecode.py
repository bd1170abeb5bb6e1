"""OpenFlow 1.3 entries, as os-ken parses them, back into the compiler's values: a match's fields, a flow's
instructions, a group's buckets. One decoding for every side that reads a switch: the controller reading
back what a switch holds (controller/codec.py) and the simulated switches keying their tables and dumping
them for the proofs (fabric/switches/wire.py).

Plain functions of os-ken's parsed objects; the caller passes its ``ofproto`` and ``ofproto_parser``
modules, so this module does not import os-ken (an optional dependency). No decision is made here.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpnlab.fabric.scenario.addressing import ip_int

from .compiler import IPV4_FIELDS

#: the width of every field the compiler matches on: a mask of all ones is the exact value
FIELD_BITS = {"metadata": 64, "ipv4_dst": 32, "ipv4_src": 32, "udp_src": 16, "tcp_src": 16, "udp_dst": 16,
              "tcp_dst": 16, "eth_type": 16, "in_port": 32, "arp_spa": 32, "arp_tpa": 32}


def match(fields: Iterable[tuple[str, Any]]) -> tuple:
    """A match's (name, value) pairs (an OFPMatch's ``items()``) in the compiler's form, in name order (so
    decoded and compiled entries compare): IPv4 addresses as ints, a masked field whose mask is all ones
    (as a switch may report it) as the exact value."""
    out = []
    for name, value in fields:
        if isinstance(value, tuple) and name in FIELD_BITS and value[1] == (1 << FIELD_BITS[name]) - 1:
            value = value[0]
        if name in IPV4_FIELDS:
            value = (ip_int(value[0]), ip_int(value[1])) if isinstance(value, tuple) else ip_int(value)
        out.append((name, value))
    return tuple(sorted(out))


def action(ofp: Any, parser: Any, act: Any) -> tuple | None:
    """One action as the compiler writes it; None for one the compiler never writes."""
    if isinstance(act, parser.OFPActionOutput):
        return ("controller",) if act.port == ofp.OFPP_CONTROLLER else ("output", act.port)
    if isinstance(act, parser.OFPActionGroup):
        return ("group", act.group_id)
    if isinstance(act, parser.OFPActionSetField):
        return ("set_field", act.key, ip_int(act.value) if act.key in IPV4_FIELDS else act.value)
    load: Any = getattr(parser, "NXActionRegLoad", ())
    if isinstance(act, load) and act.dst == "in_port_nxm" and act.ofs_nbits == 15:
        return ("set_field", "in_port", act.value)
    move: Any = getattr(parser, "NXActionRegMove", ())
    if isinstance(act, move) and act.src_ofs == act.dst_ofs == 0:
        # Open vSwitch reports the fields by their NXM headers, which os-ken names "arp_tpa_nxm"
        return ("move", act.src_field.removesuffix("_nxm"), act.dst_field.removesuffix("_nxm"))
    return None


def actions(ofp: Any, parser: Any, acts: Iterable[Any]) -> tuple:
    """Actions in their order, those the compiler never writes left out."""
    return tuple(a for a in (action(ofp, parser, act) for act in acts) if a is not None)


def instructions(ofp: Any, parser: Any, insts: Iterable[Any]) -> tuple:
    """A flow's instructions as the compiler's actions: apply-actions (outputs, groups, set_field) in their
    order, then write-metadata, then goto (the order OpenFlow executes instructions in, whatever their order)."""
    apply: list = []
    metadata: list = []
    goto: list = []
    for inst in insts:
        if isinstance(inst, parser.OFPInstructionActions):
            apply += actions(ofp, parser, inst.actions)
        elif isinstance(inst, parser.OFPInstructionWriteMetadata):
            metadata.append(("metadata", inst.metadata))
        elif isinstance(inst, parser.OFPInstructionGotoTable):
            goto.append(("goto", inst.table_id))
    return tuple(apply + metadata + goto)


def watch(ofp: Any, kind: str, bucket: Any) -> Any:
    """A bucket's watch as compiler.Group has it: a port, ("group", id), or None (not a fast-failover group,
    or a bucket that watches nothing)."""
    if kind != "ff":
        return None
    if bucket.watch_port != ofp.OFPP_ANY:
        return bucket.watch_port
    return ("group", bucket.watch_group) if bucket.watch_group != ofp.OFPG_ANY else None


def buckets(ofp: Any, parser: Any, kind: str, bucket_list: Iterable[Any]) -> tuple:
    """A group's buckets as compiler.Group has them: (watch, actions) each."""
    return tuple((watch(ofp, kind, b), actions(ofp, parser, b.actions)) for b in bucket_list)
