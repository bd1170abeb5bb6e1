"""What the emulation makes of a scenario's links: their real rates and delays scaled to what
this machine can carry (``emulation.host_mbps``, ``max_mbps``, ``delay_scale``), pure.

The emulation shapes links with these figures; the controller's telemetry, the web view, the
experiments and the fidelity comparison read them to know a port's emulated rate."""
from __future__ import annotations

from hpnlab.fabric.scenario.spec import Scenario

#: what an emulated link carries on top of an IP packet, as the shapers (htb), the port buffers and the
#: ECN stage count a frame: the 14-byte Ethernet header (a veth carries no preamble, FCS or gap)
ETH_HEADER = 14


def frame_bytes(mtu: int) -> int:
    """One MTU-sized frame on an emulated link: MTU + :data:`ETH_HEADER` bytes."""
    return mtu + ETH_HEADER


def emulated_mbps(scenario: Scenario, rate_gbps: float) -> float:
    """The emulated rate (Mbit/s) of a link whose real rate is ``rate_gbps``."""
    emu = scenario.emulation
    scaled = emu.host_mbps * rate_gbps / scenario.host_rate_gbps
    return round(min(scaled, emu.max_mbps), 3)


def emulated_delay_us(scenario: Scenario, delay_us: float) -> float:
    """The emulated one-way delay (µs) of a link whose real delay is ``delay_us``."""
    return delay_us * scenario.emulation.delay_scale
