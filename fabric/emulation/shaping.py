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

With ``control_priority`` (the scenario's ``emulation.control_priority``) the class splits in two,
as RoCE fabrics give CNPs a queue of their own with strict priority::

    root htb (default 1:11) ── class 1:1 rate R ── class 1:10 prio 0 (DSCP 48) ── 11: pfifo or netem
                                                └─ class 1:11 prio 1 (the rest) ── 10: the port buffer

A u32 filter sends packets whose DSCP is 48 (the roce transport's ACKs, NACKs, CNPs and notices)
to 1:10. Both classes may use the whole rate R; 1:10 is assured ``CONTROL_SHARE`` of it, and htb
serves a class within its assured rate before any that borrows, the higher priority first, so a
control packet waits for at most the frame on the wire, not for the data queued ahead of it.

With priority flow control (the scenario's ``emulation.lossless.pfc``; :mod:`.pfc`) every sending
interface, switch port and host NIC alike, has three kinds of class, and the lossless ones a *gate*::

    root htb (default 1:12) ── class 1:1 rate R ── 1:10 prio 0 (high: CNPs, ACKs, ARP, LLDP, BFD) ── 10: pfifo
                                                ├─ 1:11 prio 1 (lossless data) ── 20: tbf (the gate) ── 30: bfifo
                                                ├─ 1:13 prio 1 (lossless, bounced) ── 21: tbf (gate) ── 31: bfifo
                                                └─ 1:12 prio 1 (lossy: TCP, other UDP, ICMP) ── 40: the port buffer

The data path's egress BPF program puts each packet in its class (``skb->priority``: no tc
classifier is needed). A gate is open (``GATE_OPEN_BPS``) until the pause agent closes it (rate
1 B/s, one frame of burst) for the downstream's pause; the lossless queues behind it never drop
(``LOSSLESS_LIMIT_BYTES``: the shared buffer model drops, at its headroom, and counts).
"""
from __future__ import annotations

from dataclasses import dataclass

from hpnlab.fabric.scenario.rates import frame_bytes
from hpnlab.fabric.scenario.spec import Emulation

#: the least frames a port buffer holds unless the scenario says otherwise (the scenario's default)
BUFFER_FRAMES: int = Emulation.buffer_frames
#: the share of a port's rate assured to its control class (strict priority within it)
CONTROL_SHARE = 0.1
#: the DSCP that goes to the control class (CS6: what the roce transport marks its control packets)
CONTROL_DSCP = 48
#: priority flow control's tree: the classes (hex minors under 1:), the gates and the queues behind them
PFC_HIGH_CLASS, PFC_LOSSY_CLASS = 0x10, 0x12
PFC_LOSSLESS_CLASSES = (0x11, 0x13)          # per lossless priority: data, bounced detours
PFC_GATES = (0x20, 0x21)                     # the gates' qdisc handles (20:, 21:)
PFC_FIFOS = (0x30, 0x31)
#: an open gate: far above any emulated port's rate, a burst of 64 KiB (the htb class above it shapes)
GATE_OPEN_BPS = 1_000_000_000
GATE_OPEN_BURST = 65_536
#: a lossless queue (and a gate's own limit) never binds: the shared buffer model decides drops
LOSSLESS_LIMIT_BYTES = 64 << 20


@dataclass(frozen=True)
class Shape:
    dev: str
    rate_mbps: float
    delay_us: float = 0.0
    mtu: int = 1500
    queue_ms: float = 50.0
    buffer_frames: int = BUFFER_FRAMES
    control_priority: bool = False
    #: priority flow control: the gated tree (see the module docstring)
    pfc: bool = False
    #: the most lossless bytes this port may hold at once (its switch's whole buffer; 0: a host, or no PFC)
    lossless_bytes: int = 0

    @property
    def rate_bytes_per_s(self) -> float:
        return self.rate_mbps * 1e6 / 8

    @property
    def queue_bytes(self) -> int:
        return int(max(self.buffer_frames * frame_bytes(self.mtu), self.rate_bytes_per_s * self.queue_ms / 1000))

    @property
    def max_queued_bytes(self) -> int:
        """The most this interface's queues may hold at once: the port buffer, and with PFC the lossless
        bytes its switch's buffer may put there."""
        return self.queue_bytes + (self.lossless_bytes if self.pfc else 0)


def port_shape(port: dict, mtu: int, delay: bool = True) -> Shape:
    """The shape of one switch egress port (a ``nodes.switch_ports`` entry) at this MTU (pure)."""
    return Shape(port["intf"], port["rate_mbps"], port["delay_us"] if delay else 0.0, mtu,
                 buffer_frames=port.get("buffer_frames", BUFFER_FRAMES),
                 control_priority=port.get("control_priority", False), pfc=port.get("pfc", False),
                 lossless_bytes=port.get("lossless_bytes", 0))


def htb_burst(rate_mbps: float, mtu: int) -> int:
    """An htb class's burst at this rate: about 1 ms of traffic, at least two MTU-sized frames."""
    return max(2 * frame_bytes(mtu), int(rate_mbps * 1e6 / 8 / 1000))


def rate_change_lines(shape: Shape) -> list[str]:
    """`tc -batch` lines (without the leading 'tc') that change a shaped interface's rate live to
    ``shape.rate_mbps``: every htb class of the tree :func:`tc_lines` built (pure). Not the parent
    1:1 alone: beside a control class (``control_priority``) or under priority flow control the
    classes below it keep their own assured rate and ceiling, and htb lets a class send at its
    assured rate whatever its parent's, so a port slowed through 1:1 alone would still send at the
    old rate's data share. The leaves (the port buffer, the gates) stay as they are."""
    return ["class change" + line.removeprefix("class add") for line in tc_lines(shape, netem=False, leaf=False)
            if line.startswith("class add")]


def data_class(shape: Shape) -> str:
    """The htb class whose leaf is the port buffer (where the ECN stage's RED goes; with PFC the lossy class)."""
    if shape.pfc:
        return f"1:{PFC_LOSSY_CLASS:x}"
    return "1:11" if shape.control_priority else "1:1"


def pfc_tc_lines(shape: Shape, netem: bool) -> list[str]:
    """The gated tree of one interface under priority flow control (module docstring)."""
    rate = f"{shape.rate_mbps:g}mbit"
    frame = frame_bytes(shape.mtu)
    burst = max(2 * frame, int(shape.rate_bytes_per_s / 1000))
    dev = shape.dev
    data_share = (1 - CONTROL_SHARE) / (len(PFC_LOSSLESS_CLASSES) + 1)
    delayed = netem and shape.delay_us > 0

    def klass(classid: int, assured_mbps: float, prio: int) -> str:
        return (f"class add dev {dev} parent 1:1 classid 1:{classid:x} htb rate {assured_mbps:g}mbit ceil {rate} "
                f"burst {burst} cburst {burst} quantum {frame} prio {prio}")

    def leaf(parent: str, handle: int, fifo: str) -> str:
        if delayed:
            return f"qdisc add dev {dev} parent {parent} handle {handle:x}: netem delay {shape.delay_us:g}us {fifo}"
        return f"qdisc add dev {dev} parent {parent} handle {handle:x}: {fifo}"

    lines = [f"qdisc replace dev {dev} root handle 1: htb default {PFC_LOSSY_CLASS:x} r2q 1",
             f"class add dev {dev} parent 1: classid 1:1 htb rate {rate} ceil {rate} burst {burst} cburst {burst} "
             f"quantum {frame}",
             klass(PFC_HIGH_CLASS, shape.rate_mbps * CONTROL_SHARE, 0),
             leaf(f"1:{PFC_HIGH_CLASS:x}", PFC_HIGH_CLASS, "limit 256" if delayed else "pfifo limit 256")]
    for classid, gate, fifo in zip(PFC_LOSSLESS_CLASSES, PFC_GATES, PFC_FIFOS, strict=True):
        lines += [klass(classid, shape.rate_mbps * data_share, 1),
                  f"qdisc add dev {dev} parent 1:{classid:x} handle {gate:x}: tbf rate {GATE_OPEN_BPS}bit "
                  f"burst {GATE_OPEN_BURST} limit {LOSSLESS_LIMIT_BYTES}",
                  leaf(f"{gate:x}:1", fifo, f"limit {LOSSLESS_LIMIT_BYTES // frame}" if delayed
                       else f"bfifo limit {LOSSLESS_LIMIT_BYTES}")]
    lossy_limit = max(64, shape.queue_bytes // frame)
    lines += [klass(PFC_LOSSY_CLASS, shape.rate_mbps * data_share, 1),
              leaf(f"1:{PFC_LOSSY_CLASS:x}", 0x40, f"limit {lossy_limit}" if delayed
                   else f"bfifo limit {shape.queue_bytes}")]
    return lines


def tc_lines(shape: Shape, netem: bool, leaf: bool = True) -> list[str]:
    """`tc -batch` lines (without the leading 'tc') that shape one interface. ``leaf=False``: without
    the port buffer's qdisc under :func:`data_class` (a caller that puts RED there). With ``shape.pfc``
    the gated tree (:func:`pfc_tc_lines`)."""
    if shape.pfc:
        return pfc_tc_lines(shape, netem)
    rate = f"{shape.rate_mbps:g}mbit"
    # burst: at least one MTU-sized frame plus a little; quantum = one frame
    frame = frame_bytes(shape.mtu)
    burst = htb_burst(shape.rate_mbps, shape.mtu)
    dev = shape.dev

    def klass(parent: str, classid: str, assured_mbps: float) -> str:
        """An htb class assured ``assured_mbps`` that may borrow up to the port's rate."""
        return (f"class add dev {dev} parent {parent} classid {classid} htb rate {assured_mbps:g}mbit ceil {rate} "
                f"burst {burst} cburst {burst} quantum {frame}")

    delayed = netem and shape.delay_us > 0
    lines = [f"qdisc replace dev {dev} root handle 1: htb default {11 if shape.control_priority else 1} r2q 1",
             klass("1:", "1:1", shape.rate_mbps)]
    if shape.control_priority:
        lines += [klass("1:1", "1:10", shape.rate_mbps * CONTROL_SHARE) + " prio 0",
                  klass("1:1", "1:11", shape.rate_mbps * (1 - CONTROL_SHARE)) + " prio 1",
                  # the control class's own queue: small packets, the link's delay as the data's
                  f"qdisc add dev {dev} parent 1:10 handle 11: "
                  + (f"netem delay {shape.delay_us:g}us limit 256" if delayed else "pfifo limit 256"),
                  f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip tos {CONTROL_DSCP << 2:#x} 0xfc "
                  f"flowid 1:10"]
    if leaf:
        parent = data_class(shape)
        if delayed:
            limit = max(64, shape.queue_bytes // frame)
            lines.append(f"qdisc add dev {dev} parent {parent} handle 10: netem delay {shape.delay_us:g}us "
                         f"limit {limit}")
        else:
            lines.append(f"qdisc add dev {dev} parent {parent} handle 10: bfifo limit {shape.queue_bytes}")
    return lines
