"""Link shaping: htb at the emulated rate on every sending interface, netem where it exists.

Every link is shaped once per direction, at the sender's egress: a host's interface (in
the host's namespace) for host -> leaf, the switch-side veth for switch -> anything.
The tree on an interface is::

    root htb (default 1:1) ── class 1:1 rate R ceil R ── leaf qdisc 10: (bfifo, the port buffer)
                                                          or netem delay D limit N (when delay > 0
                                                          and the kernel has netem)

The port buffer (bfifo limit) is ``queue_ms`` of the emulated rate, at least ``buffer_frames``
MTU-sized frames (the scenario's ``emulation.buffer_frames``, default 32), so a queue can build
beyond the ECN stage's Kmax. Without netem a requested delay is *not*
applied; ``plan`` returns it in ``missing_delay`` so the run can say so and record it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..spec import Emulation

#: the least frames a port buffer holds unless the scenario says otherwise (the scenario's default)
BUFFER_FRAMES: int = Emulation.buffer_frames


@dataclass(frozen=True)
class Shape:
    dev: str
    rate_mbps: float
    delay_us: float = 0.0
    mtu: int = 1500
    queue_ms: float = 50.0
    buffer_frames: int = BUFFER_FRAMES

    @property
    def rate_bytes_per_s(self) -> float:
        return self.rate_mbps * 1e6 / 8

    @property
    def queue_bytes(self) -> int:
        return int(max(self.buffer_frames * (self.mtu + 14), self.rate_bytes_per_s * self.queue_ms / 1000))


def port_shape(port: dict, mtu: int, delay: bool = True) -> Shape:
    """The shape of one switch egress port (a ``nodes.switch_ports`` entry) at this MTU (pure)."""
    return Shape(port["intf"], port["rate_mbps"], port["delay_us"] if delay else 0.0, mtu,
                 buffer_frames=port.get("buffer_frames", BUFFER_FRAMES))


def tc_lines(shape: Shape, netem: bool) -> list[str]:
    """`tc -batch` lines (without the leading 'tc') that shape one interface."""
    rate = f"{shape.rate_mbps:g}mbit"
    # burst: at least one MTU-sized frame plus a little; quantum = one frame
    frame = shape.mtu + 14
    burst = max(2 * frame, int(shape.rate_bytes_per_s / 1000))  # ~1 ms of traffic
    lines = [
        f"qdisc replace dev {shape.dev} root handle 1: htb default 1 r2q 1",
        f"class add dev {shape.dev} parent 1: classid 1:1 htb rate {rate} ceil {rate} "
        f"burst {burst} cburst {burst} quantum {frame}",
    ]
    if netem and shape.delay_us > 0:
        limit = max(64, shape.queue_bytes // frame)
        lines.append(f"qdisc add dev {shape.dev} parent 1:1 handle 10: netem delay {shape.delay_us:g}us "
                     f"limit {limit}")
    else:
        lines.append(f"qdisc add dev {shape.dev} parent 1:1 handle 10: bfifo limit {shape.queue_bytes}")
    return lines
