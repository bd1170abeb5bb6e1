"""A port counts as up for routing only when it is up, has carrier and is live: Open vSwitch
clears OFPPS_LIVE (carrier kept) when BFD on the port stops forwarding (a gray failure)."""
from __future__ import annotations

import pytest

pytest.importorskip("os_ken")

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from hpnlab.controller.codec import port_is_up


def _desc(state: int, config: int = 0):
    return parser.OFPPort(port_no=5, hw_addr="00:00:00:00:00:05", name=b"p0l0-eth5", config=config, state=state,
                          curr=0, advertised=0, supported=0, peer=0, curr_speed=0, max_speed=0)


def test_a_live_port_with_carrier_is_up():
    assert port_is_up(ofp, _desc(ofp.OFPPS_LIVE))


def test_a_port_that_is_not_live_is_down_though_it_keeps_its_carrier():
    assert not port_is_up(ofp, _desc(0))


def test_a_port_without_carrier_or_set_down_is_down():
    assert not port_is_up(ofp, _desc(ofp.OFPPS_LINK_DOWN))
    assert not port_is_up(ofp, _desc(ofp.OFPPS_LIVE, config=ofp.OFPPC_PORT_DOWN))
