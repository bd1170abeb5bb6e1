"""The lossless switch model: a shared buffer with per-ingress-port, per-priority accounting and
the priority-flow-control (PFC, IEEE 802.1Qbb) decisions made on it. Pure (standard library).

The emulation's data path (``fabric/emulation/bpf/pfc.bpf.c``) makes these same decisions per
packet in tc BPF; this module states them in plain values so that they are tested on recorded
packet sequences, both sides of every threshold, and so that the flow model and the reports
can name the settings a run used.

Accounting (the semantics of HPCC's and SimAI's ns-3 ``switch-mmu.cc``)
    Every lossless packet is charged, while it is in the switch, to the ingress port it came
    in by and its priority. The first ``reserved`` bytes of an (ingress port, priority) are
    its own; above them it draws on the switch's **shared** buffer; once its shared use would
    pass **Xoff** its packets go to its **headroom** (``headroom`` bytes of its own). A packet
    that finds the headroom full too is dropped: a *headroom drop*, never silent.
    Xoff is static (``xoff`` bytes) or dynamic: ``alpha`` x the free shared buffer
    (Broadcom's dynamic threshold; HPCC's ``(buffer - headroom - reserve - shared used) >> 3``
    is alpha 1/8).
Pause and resume
    An (ingress port, priority) asks its upstream transmitter to **pause** that priority when
    anything sits in its headroom or its shared use reaches Xoff, and to **resume** once its
    headroom is empty and its shared use is ``resume_offset`` below Xoff (or zero).
Watchdog (as SONiC's and Arista's PFC watchdogs)
    A transmitter that stays paused ``detect_s`` stops honouring pause for ``restore_s``
    (its queue drains into the downstream headroom, which may then drop: counted), then
    honours it again. A storm that does not end is cut again and again.

The settings of one switch come from a named real switch scaled to the emulated rates
(:func:`switch_buffer`, the rule in its docstring), or from the scenario's
``emulation.lossless`` block where it gives a size.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario.spec import Lossless
from hpnlab.fabric.workload.ecn import frame_bytes, preset

# ---- the reference switch and the scaling rule ---------------------------------------------------


@dataclass(frozen=True)
class ReferenceSwitch:
    """A real switch whose buffer the emulated switches are scaled from."""
    name: str
    ports: int
    rate_gbps: float
    buffer_bytes: int
    #: the ECN Kmax recommended for that switch and rate (the DCQCN paper's setting)
    kmax_bytes: int

    @property
    def port_share_bytes(self) -> float:
        """The buffer per port when every port takes an equal share."""
        return self.buffer_bytes / self.ports

    @property
    def port_share_of_kmax(self) -> float:
        """The buffer per port in units of the recommended Kmax: what the emulation keeps."""
        return self.port_share_bytes / self.kmax_bytes


#: DCQCN's testbed switch (Zhu et al., SIGCOMM 2015): an Arista 7050QX-32, Broadcom Trident II,
#: 32 x 40 GbE and a 12 MB shared packet buffer, with ECN Kmax 200 KB at 40 Gbit/s
REFERENCE = ReferenceSwitch("Broadcom Trident II (Arista 7050QX-32, DCQCN's testbed switch: 32 x 40 GbE, "
                            "12 MB shared buffer)", ports=32, rate_gbps=40.0, buffer_bytes=12_000_000,
                            kmax_bytes=200_000)
#: HPCC's and SimAI's switch-mmu.cc: alpha 1/8, 4 KB reserved and a 3 KB resume offset with 1 KB packets
ALPHA = 0.125
RESERVED_FRAMES = 4
RESUME_OFFSET_FRAMES = 3
#: how long the pause path may take on a loaded 2-core machine, and a port's headroom holds at its rate beyond the
#: frames in flight: the feasibility probe saw stalls of 5-32 ms at loads of 3-14; under loads of 10-20 the frames
#: a transmitter sent before its gate closed still sat in the receiving CPU's backlog (the "cable" between a veth
#: and the next tc hook) for longer, and 32 ms of headroom overflowed (docs/results/2026-12-07-lossless.md)
REACTION_BUDGET_S = 0.1
#: lossless priorities: the RoCE data priority, and the bounced detours' own when they need one
DATA_PRIORITY, BOUNCED_PRIORITY = 0, 1
#: the DSCP of lossless RoCEv2 data (priority 3 in most RoCE deployments)
LOSSLESS_DSCP = 26


def htb_burst_bytes(rate_mbps: float, mtu: int) -> int:
    """The burst a shaped port may send at once (``shaping.tc_lines``: ~1 ms of its rate, at least 2 frames)."""
    return max(2 * frame_bytes(mtu), int(rate_mbps * 1e6 / 8 / 1000))


def port_share_bytes(rate_mbps: float, mtu: int, reference: ReferenceSwitch = REFERENCE) -> int:
    """A port's share of its switch's shared buffer: the reference switch's buffer per port in units
    of its recommended ECN Kmax, times the emulation's default Kmax at this port's rate
    (``hpnlab.fabric.workload.ecn``, preset ``default``)."""
    return int(reference.port_share_of_kmax * preset("default", rate_mbps, mtu).kmax)


def headroom_bytes(rate_mbps: float, mtu: int) -> int:
    """Headroom an ingress port needs at this rate: the upstream's htb burst, two frames (one leaking
    through the closing gate, one on the wire) and ``REACTION_BUDGET_S`` of the port's rate."""
    return htb_burst_bytes(rate_mbps, mtu) + 2 * frame_bytes(mtu) + int(rate_mbps * 1e6 / 8 * REACTION_BUDGET_S)


@dataclass(frozen=True)
class SwitchBuffer:
    """The buffer of one switch as the data path uses it (bytes)."""
    shared_bytes: int                     # the shared pool
    alpha: float | None                   # dynamic Xoff = alpha x free shared; None: static
    xoff_bytes: int                       # the static Xoff (alpha None)
    resume_offset_bytes: int
    reserved_bytes: int                   # per (ingress port, priority)
    headroom_bytes: Mapping[int, int]     # per ingress port (each priority has this much)
    priorities: int = 1

    @property
    def total_bytes(self) -> int:
        """Shared pool + every (port, priority)'s headroom and reserve: the switch's whole buffer."""
        return self.shared_bytes + self.priorities * (sum(self.headroom_bytes.values())
                                                      + self.reserved_bytes * len(self.headroom_bytes))

    @property
    def alpha_q8(self) -> int:
        """alpha in 1/256ths, as the data path computes it (0: static Xoff)."""
        return 0 if self.alpha is None else max(1, round(self.alpha * 256))

    def xoff(self, shared_used: int) -> int:
        """Xoff of any (ingress port, priority) when the switch's shared use is ``shared_used``."""
        if self.alpha is None:
            return self.xoff_bytes
        return max(0, self.shared_bytes - shared_used) * self.alpha_q8 >> 8

    def as_dict(self) -> dict[str, Any]:
        return {"shared_bytes": self.shared_bytes, "alpha": self.alpha, "xoff_bytes": self.xoff_bytes,
                "resume_offset_bytes": self.resume_offset_bytes, "reserved_bytes": self.reserved_bytes,
                "headroom_bytes": dict(self.headroom_bytes), "priorities": self.priorities,
                "total_bytes": self.total_bytes}


def switch_buffer(settings: Lossless, port_rates_mbps: Mapping[int, float], mtu: int,
                  priorities: int = 1, reference: ReferenceSwitch = REFERENCE) -> SwitchBuffer:
    """The buffer of a switch whose ingress ports (number -> the emulated rate arriving there) are
    given, from the scenario's ``emulation.lossless`` settings; what they leave null is derived:

    - shared pool: the sum of the ports' shares (:func:`port_share_bytes`: the reference switch's
      buffer per port is 1.875 of its Kmax, so a 10 Mbit/s port with Kmax 24,224 B brings 45,420 B);
    - Xoff: dynamic, alpha 1/8 of the free shared buffer (static Xoff when alpha is null: 1/8 of the pool);
    - reserved: 4 frames, resume offset: 3 frames (HPCC's 4 KB and 3 KB were 4 and 3 of its 1 KB packets);
    - headroom: :func:`headroom_bytes`, the emulator's reaction, not the real switch's cable delay.
    """
    if not port_rates_mbps:
        raise UserError("a lossless switch needs at least one port")
    if priorities not in (1, 2):
        raise UserError(f"a lossless switch has 1 or 2 lossless priorities, got {priorities}")
    frame = frame_bytes(mtu)
    shared = settings.buffer_bytes or sum(port_share_bytes(r, mtu, reference) for r in port_rates_mbps.values())
    alpha = settings.alpha
    xoff = settings.xoff_bytes if settings.xoff_bytes is not None else int(ALPHA * shared)
    reserved = settings.reserved_bytes if settings.reserved_bytes is not None else RESERVED_FRAMES * frame
    resume = settings.resume_offset_bytes if settings.resume_offset_bytes is not None else RESUME_OFFSET_FRAMES * frame
    headroom = {p: settings.headroom_bytes if settings.headroom_bytes is not None else headroom_bytes(r, mtu)
                for p, r in sorted(port_rates_mbps.items())}
    return SwitchBuffer(int(shared), alpha, int(xoff), int(resume), int(reserved), headroom, priorities)


def frame_time_s(rate_mbps: float, mtu: int) -> float:
    """The time one MTU-sized frame takes on a port of this rate (a pause's reaction in frame times)."""
    return frame_bytes(mtu) * 8 / (rate_mbps * 1e6)


# ---- the decisions, per packet ------------------------------------------------------------------

@dataclass
class IngressQueue:
    """One (ingress port, priority) of a switch: what it holds and what it asked for."""
    bytes: int = 0              # in the switch, charged to this queue (reserve + shared, not headroom)
    headroom: int = 0           # of those beyond Xoff, in its headroom
    paused: bool = False        # it asked the upstream to pause
    pauses: int = 0
    resumes: int = 0
    drops: int = 0              # headroom drops (packets)
    dropped_bytes: int = 0
    peak_bytes: int = 0
    peak_headroom: int = 0

    def shared_used(self, reserved: int) -> int:
        return max(0, self.bytes - reserved)


@dataclass(frozen=True)
class Arrival:
    """What one packet's arrival decided."""
    admitted: bool
    to_headroom: bool
    pause: bool            # this arrival made the queue ask for a pause


@dataclass(frozen=True)
class Departure:
    resume: bool           # this departure made the queue ask to resume


@dataclass
class BufferState:
    """A switch's lossless buffer while packets come and go (the data path's state, in plain values)."""
    config: SwitchBuffer
    shared_used: int = 0
    peak_shared_used: int = 0
    queues: dict[tuple[int, int], IngressQueue] = field(default_factory=dict)

    def queue(self, port: int, priority: int = DATA_PRIORITY) -> IngressQueue:
        if port not in self.config.headroom_bytes:
            raise KeyError(f"no ingress port {port} on this switch")
        if not 0 <= priority < self.config.priorities:
            raise KeyError(f"no lossless priority {priority} on this switch")
        return self.queues.setdefault((port, priority), IngressQueue())

    def threshold(self) -> int:
        return self.config.xoff(self.shared_used)

    def admits(self, port: int, size: int, priority: int = DATA_PRIORITY) -> bool:
        """Would a packet of ``size`` bytes be taken (HPCC's ``CheckIngressAdmission``)? Refused only
        when it overflows the headroom *and* would take the queue's shared use beyond Xoff."""
        q = self.queue(port, priority)
        cfg = self.config
        return not (size + q.headroom > cfg.headroom_bytes[port]
                    and size + q.shared_used(cfg.reserved_bytes) > self.threshold())

    def should_pause(self, q: IngressQueue) -> bool:
        return q.headroom > 0 or q.shared_used(self.config.reserved_bytes) >= self.threshold()

    def should_resume(self, q: IngressQueue) -> bool:
        used = q.shared_used(self.config.reserved_bytes)
        return q.headroom == 0 and (used == 0 or used + self.config.resume_offset_bytes <= self.threshold())

    def arrive(self, port: int, size: int, priority: int = DATA_PRIORITY) -> Arrival:
        """A lossless packet arrives on ``port``: admission, charging (``UpdateIngressAdmission``) and
        the pause decision."""
        q = self.queue(port, priority)
        cfg = self.config
        if not self.admits(port, size, priority):
            q.drops += 1
            q.dropped_bytes += size
            return Arrival(False, False, False)
        new = q.bytes + size
        to_headroom = False
        if new <= cfg.reserved_bytes:
            q.bytes = new
        elif new - cfg.reserved_bytes > self.threshold():
            q.headroom += size
            to_headroom = True
        else:
            q.bytes = new
            self.shared_used += min(size, new - cfg.reserved_bytes)
        q.peak_bytes = max(q.peak_bytes, q.bytes + q.headroom)
        q.peak_headroom = max(q.peak_headroom, q.headroom)
        self.peak_shared_used = max(self.peak_shared_used, self.shared_used)
        pause = not q.paused and self.should_pause(q)
        if pause:
            q.paused = True
            q.pauses += 1
        return Arrival(True, to_headroom, pause)

    def depart(self, port: int, size: int, priority: int = DATA_PRIORITY) -> Departure:
        """An admitted lossless packet leaves the switch (``RemoveFromIngressAdmission``), and the
        resume decision."""
        q = self.queue(port, priority)
        from_headroom = min(q.headroom, size)
        rest = size - from_headroom
        from_shared = min(rest, max(0, q.bytes - self.config.reserved_bytes))
        q.headroom -= from_headroom
        q.bytes = max(0, q.bytes - rest)
        self.shared_used = max(0, self.shared_used - from_shared)
        resume = q.paused and self.should_resume(q)
        if resume:
            q.paused = False
            q.resumes += 1
        return Departure(resume)


def replay(config: SwitchBuffer, events: Iterable[tuple[str, int, int] | tuple[str, int, int, int]]
           ) -> tuple[BufferState, list[tuple[int, str, int, int]]]:
    """Run a recorded sequence through a switch buffer: events ``("in"|"out", port, size[, priority])``;
    a departure names an admitted packet. Returns the state and the pause/resume/drop decisions as
    ``(event index, "pause"|"resume"|"drop", port, priority)``."""
    state = BufferState(config)
    out: list[tuple[int, str, int, int]] = []
    admitted: dict[tuple[int, int], int] = {}
    for i, event in enumerate(events):
        kind, port, size = event[0], event[1], event[2]
        prio = event[3] if len(event) > 3 else DATA_PRIORITY
        if kind == "in":
            a = state.arrive(port, size, prio)
            if not a.admitted:
                out.append((i, "drop", port, prio))
            else:
                admitted[port, prio] = admitted.get((port, prio), 0) + 1
                if a.pause:
                    out.append((i, "pause", port, prio))
        elif kind == "out":
            if admitted.get((port, prio), 0) <= 0:
                raise ValueError(f"event {i}: a departure from port {port} priority {prio} with nothing admitted")
            admitted[port, prio] -= 1
            if state.depart(port, size, prio).resume:
                out.append((i, "resume", port, prio))
        else:
            raise ValueError(f"event {i}: unknown kind {kind!r} (in or out)")
    return state, out


# ---- the PFC watchdog ----------------------------------------------------------------------------

@dataclass
class Watchdog:
    """One paused transmitter's watchdog (pure: the caller passes the time).

    ``on_pause``/``on_resume`` report what the downstream asked; ``honours`` says whether the gate
    obeys now; ``tick`` returns "storm" when a pause has lasted ``detect_s`` (the gate then opens for
    ``restore_s``) and "restored" when that time is over (the gate obeys again: closed if the pause
    still stands)."""
    detect_s: float
    restore_s: float
    paused_since: float | None = None     # the downstream's pause in force since (None: not paused)
    ignoring_until: float | None = None   # the watchdog holds the gate open until then
    storms: int = 0

    def on_pause(self, now: float) -> None:
        if self.paused_since is None:
            self.paused_since = now

    def on_resume(self, now: float) -> None:
        self.paused_since = None

    def honours(self, now: float) -> bool:
        return self.ignoring_until is None or now >= self.ignoring_until

    def gate_closed(self, now: float) -> bool:
        """Is the transmitter's gate closed now: paused, and the watchdog not overriding it?"""
        return self.paused_since is not None and self.honours(now)

    def next_deadline(self) -> float | None:
        if self.ignoring_until is not None:
            return self.ignoring_until
        if self.paused_since is not None and self.detect_s > 0:
            return self.paused_since + self.detect_s
        return None

    def tick(self, now: float) -> str | None:
        if self.ignoring_until is not None:
            if now < self.ignoring_until:
                return None
            self.ignoring_until = None
            if self.paused_since is not None:
                self.paused_since = now         # a pause still standing is timed afresh
            return "restored"
        if self.detect_s > 0 and self.paused_since is not None and now - self.paused_since >= self.detect_s:
            self.ignoring_until = now + self.restore_s
            self.storms += 1
            return "storm"
        return None


def describe(buffers: Mapping[str, SwitchBuffer], mtu: int) -> list[str]:
    """One line per distinct switch buffer (sizes in frames too), for logs and the run's metadata."""
    frame = frame_bytes(mtu)
    seen: dict[tuple, list[str]] = {}
    for name, b in sorted(buffers.items()):
        key = (b.shared_bytes, b.alpha, b.xoff_bytes, tuple(sorted(set(b.headroom_bytes.values()))), b.priorities)
        seen.setdefault(key, []).append(name)
    lines = []
    for (shared, alpha, xoff, headrooms, prios), names in seen.items():
        xo = f"dynamic Xoff alpha {alpha:g} ({int(shared * alpha):,} B at an empty buffer)" if alpha is not None \
            else f"static Xoff {xoff:,} B"
        hd = "/".join(f"{h:,}" for h in headrooms)
        lines.append(f"{len(names)} switch(es) like {names[0]}: shared {shared:,} B ({shared / frame:.0f} frames), "
                     f"{xo}, headroom {hd} B per port, {prios} lossless priorit{'y' if prios == 1 else 'ies'}")
    return lines


def check_sizes(buffer: SwitchBuffer, mtu: int) -> None:
    """Refuse, in one line, settings under which a lossless port cannot work: a headroom below one frame
    (a pause always takes at least the frame on the wire), a shared pool below one frame."""
    frame = frame_bytes(mtu)
    if buffer.shared_bytes < frame:
        raise UserError(f"emulation.lossless.buffer_bytes {buffer.shared_bytes} is below one frame ({frame} B)")
    low = [p for p, h in buffer.headroom_bytes.items() if h < frame]
    if low:
        raise UserError(f"emulation.lossless.headroom_bytes {buffer.headroom_bytes[low[0]]} is below one frame "
                        f"({frame} B): a pause cannot stop the frame already on the wire")

