"""Reliability at the sender: acknowledgements, retransmission (selective, or go-back-N as a
classic RoCE NIC does) and the retransmission timer.

The decisions are pure functions (:func:`timeout_resends`, :func:`nack_resends`,
:func:`bdp_window`, :func:`rto_estimate`, :func:`backoff`); :class:`Recovery` applies them to a
flow's state (:class:`.flows.TxFlow`) and queues what must go again, which the NIC scheduler
(:mod:`.sender`) sends before anything new. It sends nothing itself.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

from ..entropy import EntropyPolicy
from ..paths import PathParams, rtt_update
from .dcqcn import RateControl
from .failover import Failover
from .flows import TxFlow
from .wire import PSEQ_MASK

SELECTIVE, GOBACKN = "selective", "gobackn"
RECOVERIES = (SELECTIVE, GOBACKN)


def rto_estimate(srtt: float, rttvar: float, min_rto_s: float) -> float:
    """RFC 6298's retransmission timeout, at least ``min_rto_s``."""
    return max(min_rto_s, srtt + 4 * rttvar)


def rto_bounds(min_rto_s: float, max_rto_s: float, lossless: bool, lossless_min_rto_s: float | None
               ) -> tuple[float, float]:
    """The timer's (minimum, maximum): on a lossless fabric (priority flow control) the minimum is at
    least ``lossless_min_rto_s`` (None: no floor) and the maximum at least that minimum; a packet there is
    held behind pauses, not dropped, and the timer is the last resort for the rare loss."""
    if lossless and lossless_min_rto_s is not None:
        min_rto_s = max(min_rto_s, lossless_min_rto_s)
        max_rto_s = max(max_rto_s, min_rto_s)
    return min_rto_s, max_rto_s


def backoff(rto_s: float, max_rto_s: float) -> float:
    """The timeout after one more expiry: doubled, capped low (a dead path is left, not waited out)."""
    return min(max_rto_s, rto_s * 2)


def bdp_window(rate_bps: float, base_rtt_s: float, packet_bytes: int, factor: float, ack_every: int,
               most: int) -> int:
    """Packets in flight a flow may have: ``factor`` x its bandwidth-delay product (top rate x
    the smallest RTT seen, in packets of ``packet_bytes`` on the wire) plus one ACK batch, within
    [8, ``most``]. Like IRN's BDP-based flow control (Mittal et al., SIGCOMM'18): it bounds the
    queue a flow can build, which a network without PFC needs, without slowing a lone flow."""
    bdp = rate_bps * base_rtt_s / (8 * packet_bytes)
    return int(max(8, min(most, math.ceil(factor * bdp) + ack_every)))


def timer_held(hold_in_pause: bool, port_paused: bool) -> bool:
    """Whether a flow's retransmission timer stands still now: while the NIC port its oldest
    unacknowledged packet left by is paused (priority flow control), if ``hold_in_pause``. A paused
    port holds that packet's followers, and pause travels hop by hop back from the congested
    switch, so a pause at the NIC says the fabric is holding the flow's packets, not losing them (a
    lossless fabric drops none but for headroom overflow); the timer restarts from zero once the
    pause ends. As a NIC that stops scheduling a paused priority stops its queue pairs' clocks."""
    return hold_in_pause and port_paused


def timeout_resends(mode: str, una: int, psn: int, tail_probe: bool) -> list[int]:
    """The PSNs to send again when the retransmission timer fires (``una``: the oldest
    unacknowledged, ``psn``: the next new one). Go-back-N: everything from ``una``. Selective:
    ``una``, and with ``tail_probe`` (a one-path connection) the newest packet sent as well. A
    lost tail leaves the receiver nothing after the hole to NACK from, so each of its packets
    would otherwise cost a timeout of its own; once the newest arrives, the receiver NACKs the
    hole before it (3 packets past a hole on one path). Not the window: most timeouts on a busy
    machine are late ACKs, and re-sending the window multiplied the retransmissions
    (bench_defaults' all-reduce 13 -> 287). Not on sprayed connections: their receiver waits
    out a reordering allowance first, so the probe does not save the timeouts, and with it the
    sprayed all-reduce of bench_defaults measured 0.73-0.75 of line where it measured
    0.82-0.83 without."""
    if mode == GOBACKN:
        return list(range(una, psn))
    if tail_probe and psn - 1 > una:
        return [una, psn - 1]
    return [una]


def nack_resends(mode: str, psn: int, count: int, next_psn: int) -> range:
    """The PSNs a NACK of ``count`` packets from ``psn`` asks for again (``next_psn``: the next
    new one): go-back-N resends everything from ``psn``, selective only the hole (at least one)."""
    if mode == GOBACKN:
        return range(psn, next_psn)
    return range(psn, min(psn + max(1, count), next_psn))


class Recovery:
    """Acknowledgements, NACKs, path losses and timeouts of a rank's sending flows.

    ``failover`` learns what they say about paths (and moves a one-path flow whose timer keeps
    firing); ``rate`` hears of the losses that cut the rate."""

    def __init__(self, mode: str, policy: EntropyPolicy, failover: Failover, rate: RateControl,
                 path_params: PathParams, *, min_rto_s: float, max_rto_s: float, window_pkts: int,
                 bdp_factor: float, flow_max_bps: float, packet_bytes: int, ack_every: int, sample_s: float):
        self.mode = mode
        self.policy = policy
        self.failover = failover
        self.rate = rate
        self.path_params = path_params
        self.min_rto_s, self.max_rto_s = min_rto_s, max_rto_s
        self.window = window_pkts
        self.bdp_factor = bdp_factor
        self.flow_max_bps = flow_max_bps
        self.packet_bytes = packet_bytes
        self.ack_every = ack_every
        self.sample_s = sample_s
        #: priority flow control: plane -> is that NIC port's lossless priority paused now (None: nothing
        #: pauses this rank's NIC); ``hold_in_pause``: whether a flow's timer stands still while its port is
        self.paused: Callable[[int], bool] | None = None
        self.ports_per_nic = 1
        self.hold_in_pause = True

    # ---- the timer -----------------------------------------------------------------------
    def rto(self, f: TxFlow) -> float:
        return f.rto or min(self.max_rto_s, max(self.min_rto_s, 0.2))

    def rto_of(self, f: TxFlow, path: int) -> float:
        """The timeout of a packet sent on ``path``: the flow's; with ``path_rto`` on a multi-path
        flow, at least the path's own srtt + 4 rttvar (a slow path's packet is not overdue at the
        flow's mixed estimate; the dead-path rule, not the timer, finds a path that stopped)."""
        base = self.rto(f)
        if not self.path_params.path_rto or self.policy.per_flow or path >= len(f.paths):
            return base
        own = f.paths.rto(path)
        return base if own is None else max(base, own)

    def rto_due(self, f: TxFlow) -> float | None:
        """When the retransmission timer of ``f``'s oldest unacknowledged packet fires: from its
        send time or the timer's last restart (``timer_from``), whichever is later (None: no
        packet sent and unacknowledged)."""
        oldest = f.unacked.get(f.una)
        if oldest is None or not oldest[4]:
            return None
        return max(oldest[4], f.timer_from) + self.rto_of(f, oldest[5])

    def on_timers(self, flows: list[TxFlow], now: float) -> None:
        """Fire the retransmission timers that are due; with ``hold_in_pause`` a flow whose oldest
        unacknowledged packet's NIC port is paused has its timer held instead (:func:`timer_held`)."""
        for f in flows:
            due = self.rto_due(f)
            if due is None:
                continue
            port_paused = self.port_paused(f)
            if timer_held(self.hold_in_pause, port_paused):
                f.timer_from = now                # the timer runs again, from the start, once the pause ends
                continue
            if now > due:
                if port_paused:
                    f.stats["timeouts_paused"] += 1
                self.timeout(f, now)

    def port_paused(self, f: TxFlow) -> bool:
        """Whether the NIC port of ``f``'s oldest unacknowledged packet has its lossless priority paused."""
        if self.paused is None:
            return False
        oldest = f.unacked.get(f.una)
        return oldest is not None and self.paused(oldest[5] // self.ports_per_nic)

    def next_due(self, flows: list[TxFlow], wake: float) -> float:
        """``wake``, or earlier if a retransmission timer fires before."""
        for f in flows:
            due = self.rto_due(f)
            if due is not None:
                wake = min(wake, due)
        return wake

    def timeout(self, f: TxFlow, now: float) -> None:
        f.stats["timeouts"] += 1
        f.rto_streak += 1
        e = f.unacked.get(f.una)
        if e is not None:
            self.policy.on_feedback(f, e[5], "timeout", now)
            self.failover.on_timeout(f, e[5], e[4], now)
        for psn in timeout_resends(self.mode, f.una, f.psn, self.policy.per_flow):
            f.requeue(psn, "timeout")
        f.timer_from = now                     # restart the timer (not the packets' send times)
        # backoff, capped low: a dead path is left (below) rather than waited out
        f.rto = backoff(self.rto(f), self.max_rto_s)
        if self.policy.per_flow and f.rto_streak >= self.path_params.migrate_after_rtos:
            self.failover.migrate(f, now)
            f.rto_streak = 0
            f.rto = rto_estimate(f.srtt, f.rttvar, self.min_rto_s) if f.srtt is not None else None
            for psn in range(f.una, f.psn):
                f.requeue(psn, "migrate")

    # ---- what the receiver says ----------------------------------------------------------
    def on_ack(self, f: TxFlow, cum: int, ts: int, path: int, now: float) -> None:
        """A cumulative ACK of everything before ``cum``; ``ts`` (non-zero): the echoed send
        timestamp of the data packet that triggered it, an RTT sample."""
        f.stats["acks"] += 1
        if ts:
            rtt = ((int(now * 1e6) & 0xFFFFFFFF) - ts) % (1 << 32) / 1e6
            if rtt < 10:
                if f.min_rtt is None or rtt < f.min_rtt:
                    f.min_rtt = rtt
                    f.window = bdp_window(self.flow_max_bps, rtt, self.packet_bytes, self.bdp_factor,
                                          self.ack_every, self.window)
                f.srtt, f.rttvar = rtt_update(f.srtt, f.rttvar, rtt)
                f.rto = rto_estimate(f.srtt, f.rttvar, self.min_rto_s)
                if path < len(f.paths):
                    f.paths.on_rtt(path, rtt)
                self.policy.on_feedback(f, path, "rtt", now, rtt)
        if cum <= f.una:
            return
        f.rto_streak = 0
        acked = 0
        for p in range(f.una, min(cum, f.psn)):
            e = f.unacked.pop(p, None)
            if e is not None:
                acked += len(e[3])
                if not e[6]:                 # sent once: it arrived on that path
                    f.paths.on_delivered(e[5], e[4], now)
                    self.policy.on_feedback(f, e[5], "ack", now)
        f.una = min(cum, f.psn)
        f.acked_bytes += acked
        f.last_progress = now
        for mid, last in list(f.msg_last_psn.items()):
            if last < f.una:
                f.done_msgs.add(mid)
                del f.msg_last_psn[mid]
                posted = f.msg_posted.pop(mid, None)
                if posted is not None:
                    f.slowest.add(now - posted[0], (posted[0], now, posted[1]))
        if now - f.last_sample >= self.sample_s:
            f.last_sample = now
            f.samples.append([time.time(), f.acked_bytes, f.dcqcn.rc if f.dcqcn else 0])

    def on_nack(self, f: TxFlow, psn: int, count: int, path: int, now: float) -> None:
        """The receiver misses ``count`` packets from ``psn`` (and has everything before it)."""
        f.stats["nacks"] += 1
        # A loss (rare with PFC, ``--pfc on``) is congestion the ECN marks did not prevent (a queue overflowed
        # or the emulated switch dropped), so on a one-path connection a NACK (a hole three
        # packets old) cuts the rate as a CNP would. On a sprayed one a PSN hole that outlived
        # the reordering allowance may still be a packet late on a slower path: it is re-sent,
        # but the rate cut and the path's penalty come from the path's own sequence numbers
        # (PATH_LOSS), which only a loss can break. Cutting on every such NACK held the sprayed
        # all-to-all of --compare routing at 0.54-0.63 of line where it reached 0.92 without
        # (mini-hpn, 20 Mbit/s: 430-490 NACKs a run, no packet dropped anywhere). Timeouts do
        # not cut either: on a busy machine most are a late ACK, not a loss. (A one-path
        # policy takes no per-path feedback, so the NACK tells the policy nothing.)
        self.rate.on_nack(f, now)
        if psn > f.una:                       # a NACK acknowledges everything before it
            self.on_ack(f, psn, 0, path, now)
        if self.mode == GOBACKN:
            f.retx.clear()
        for p in nack_resends(self.mode, psn, count, f.psn):
            f.requeue(p, "nack")

    def on_path_loss(self, f: TxFlow, path: int, first: int, count: int, now: float) -> None:
        """The receiver found ``count`` packets missing on ``path`` from path sequence
        ``first``: those still unacknowledged whose last copy went there are re-sent. The
        loss cuts the rate as a NACK does, but at most once per smoothed RTT (an overflowing
        queue drops a run of packets, which the sender caused with the rate it had then)."""
        f.stats["path_losses"] += 1
        hit = False
        for psn in range(f.una, f.psn):
            e = f.unacked.get(psn)
            if e is not None and e[5] == path and ((e[8] - first) & PSEQ_MASK) < count:
                hit = f.requeue(psn, "nack") or hit
        if not hit:
            return
        self.policy.on_feedback(f, path, "loss", now)
        self.rate.on_path_loss(f, now)
