"""controller/codec.py's matches: one os-ken OFPMatch per canonical match, reused by every message
that carries it (issue 53: building them was most of a large cold start's encoding)."""
from __future__ import annotations

from os_ken.ofproto import ofproto_v1_3_parser as parser

from hpnlab.controller import codec
from hpnlab.fabric.scenario.addressing import ip_int

ROUTE = (("eth_type", 0x0800), ("ipv4_dst", (ip_int("10.1.2.0"), ip_int("255.255.255.0"))), ("metadata", (5, 0xFF)))


def _wire(match) -> bytes:
    buf = bytearray()
    match.serialize(buf, 0)
    return bytes(buf)


def test_one_match_is_encoded_once_and_the_same_object_serves_every_message():
    assert codec.encode_match(parser, ROUTE) is codec.encode_match(parser, tuple(ROUTE))


def test_a_reused_match_serialises_to_the_bytes_of_a_freshly_built_one_every_time():
    fresh = parser.OFPMatch(eth_type=0x0800, ipv4_dst=("10.1.2.0", "255.255.255.0"), metadata=(5, 0xFF))
    shared = codec.encode_match(parser, ROUTE)
    assert _wire(shared) == _wire(fresh) == _wire(shared)


def test_different_matches_get_different_objects():
    other = (("eth_type", 0x0800), ("ipv4_dst", (ip_int("10.1.3.0"), ip_int("255.255.255.0"))))
    assert codec.encode_match(parser, other) is not codec.encode_match(parser, ROUTE)
    assert _wire(codec.encode_match(parser, other)) != _wire(codec.encode_match(parser, ROUTE))
