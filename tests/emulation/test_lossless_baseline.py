"""The incast test_lossless.py delivers whole under priority flow control, on the same fabric without
it (the shared mini-hpn: lossy switch ports of 32 frames): switch ports drop, and what they drop
never arrives. Behaviour only (no rate is asserted)."""
from __future__ import annotations

import pytest

from hpnlab.fabric.emulation.traffic import udp_incast
from hpnlab.fabric.experiments.runner import switch_drops

pytestmark = [pytest.mark.emulation, pytest.mark.controller]


def test_without_pfc_the_same_incast_loses_packets_at_the_switch_ports(mini_hpn):
    assert mini_hpn.pfc is None
    ports = [p["intf"] for p in mini_hpn.switch_ports()]
    before = sum(switch_drops(ports).values())
    out = udp_incast(mini_hpn, "h1", {"h5": 9.0, "h9": 9.0, "h13": 9.0}, seconds=3.0, port=9311)
    dropped = sum(switch_drops(ports).values()) - before
    assert dropped > 0
    assert out["received_total"] < out["sent_total"]
