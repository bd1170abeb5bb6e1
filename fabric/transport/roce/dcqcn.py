"""DCQCN at the reaction point (pure: times and byte counts in, rates out).

:class:`Dcqcn` is one flow's rate state, driven by CNPs, losses and its two timers;
:class:`RateControl` applies it to a rank's flows: what a CNP or a loss does to a flow's rate,
the timers that raise it again, and the flow's pacer (when its next packet may leave at the
current rate). The NIC scheduler (:mod:`.sender`) only asks the pacer whether a flow may send.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class DcqcnParams:
    """DCQCN reaction-point parameters.

    Defaults are the DCQCN paper's (Zhu et al., SIGCOMM'15, Table 1/§5) and Mellanox's, at
    the 40 Gbit/s they were tuned for: g = 1/256, alpha timer 55 us, rate-increase timer
    55 us, byte counter 10 MB, 5 fast-recovery stages, additive increase 40 Mbit/s, hyper
    increase 10x that, CNP interval 50 us. :meth:`scaled` scales them to a link rate:
    rates and the byte counter in proportion to the rate; timers in inverse proportion
    (a packet takes that much longer), bounded to ``[55 us, 10 ms]`` so that a slow
    emulated link still recovers within a collective step.
    """
    line_rate_bps: float = 40e9
    g: float = 1 / 256
    alpha_timer_s: float = 55e-6
    rate_timer_s: float = 55e-6
    byte_counter: int = 10 * 1024 * 1024
    fast_recovery_stages: int = 5
    rai_bps: float = 40e6
    rhai_bps: float = 400e6
    min_rate_bps: float = 40e6 / 40          # 0.1% of line rate
    cnp_interval_s: float = 50e-6

    @classmethod
    def scaled(cls, line_rate_bps: float, mtu_payload: int = 1400) -> DcqcnParams:
        ref = cls()
        k = line_rate_bps / ref.line_rate_bps

        def timer(t):
            return min(10e-3, max(t, t / k))
        return cls(line_rate_bps=line_rate_bps, g=ref.g,
                   alpha_timer_s=timer(ref.alpha_timer_s), rate_timer_s=timer(ref.rate_timer_s),
                   byte_counter=max(16 * mtu_payload, int(ref.byte_counter * k)),
                   fast_recovery_stages=ref.fast_recovery_stages,
                   rai_bps=ref.rai_bps * k, rhai_bps=ref.rhai_bps * k,
                   min_rate_bps=max(ref.min_rate_bps * k, 8 * mtu_payload / 1.0),
                   cnp_interval_s=timer(ref.cnp_interval_s))


class Dcqcn:
    """Rate state of one flow (current rate rc, target rt, alpha), driven by CNPs and timers."""
    __slots__ = (
        "alpha",
        "alpha_t",
        "byte_events",
        "bytes",
        "cnp_in_period",
        "cuts",
        "last_cut",
        "p",
        "rate_t",
        "rc",
        "rt",
        "timer_events",
    )

    def __init__(self, p: DcqcnParams, now: float):
        self.p = p
        self.rc = self.rt = p.line_rate_bps
        self.alpha = 1.0
        self.cnp_in_period = False
        self.alpha_t = self.rate_t = now
        self.bytes = 0
        self.timer_events = self.byte_events = 0
        self.cuts = 0
        self.last_cut = -math.inf

    def on_cnp(self, now: float, hold_s: float = 0.0) -> bool:
        """A CNP (or a loss) cuts the rate; with ``hold_s``, not again within that long of the
        last cut (alpha still hears of the congestion). Returns whether it cut."""
        p = self.p
        if now - self.last_cut < hold_s:
            self.cnp_in_period = True
            return False
        self.last_cut = now
        self.rt = self.rc
        self.rc = max(p.min_rate_bps, self.rc * (1 - self.alpha / 2))
        self.alpha = (1 - p.g) * self.alpha + p.g
        self.cnp_in_period = True
        self.timer_events = self.byte_events = 0
        self.bytes = 0
        self.rate_t = now
        self.cuts += 1
        return True

    def _increase(self) -> None:
        p = self.p
        f = p.fast_recovery_stages
        if max(self.timer_events, self.byte_events) < f:
            pass                                    # fast recovery: towards rt
        elif min(self.timer_events, self.byte_events) > f:
            self.rt += (min(self.timer_events, self.byte_events) - f) * p.rhai_bps   # hyper
        else:
            self.rt += p.rai_bps                    # additive
        self.rt = min(self.rt, p.line_rate_bps)
        self.rc = min(p.line_rate_bps, (self.rt + self.rc) / 2)

    def on_sent(self, nbytes: int) -> None:
        self.bytes += nbytes
        if self.bytes >= self.p.byte_counter:
            self.bytes = 0
            self.byte_events += 1
            self._increase()

    def tick(self, now: float) -> None:
        p = self.p
        while now - self.alpha_t >= p.alpha_timer_s:
            self.alpha_t += p.alpha_timer_s
            if not self.cnp_in_period:
                self.alpha = (1 - p.g) * self.alpha
            self.cnp_in_period = False
            if self.alpha < 1e-6:
                self.alpha_t = now
                break
        if self.rc >= p.line_rate_bps and self.rt >= p.line_rate_bps:
            self.rate_t = now
            return
        while now - self.rate_t >= p.rate_timer_s:
            self.rate_t += p.rate_timer_s
            self.timer_events += 1
            self._increase()


class RateFlow(Protocol):
    """What rate control reads and writes of a sending flow (:class:`.flows.TxFlow` is one)."""
    dcqcn: Dcqcn | None
    next_t: float
    srtt: float | None
    stats: dict[str, int]


class RateControl:
    """DCQCN for every flow of a rank. ``params`` None: no rate control (flows are paced only
    by the NIC port). ``nack_cuts``: a NACK cuts the rate as a CNP would (a one-path connection
    with selective recovery: a loss, rare with PFC, is congestion that the ECN marks did not
    prevent)."""

    def __init__(self, params: DcqcnParams | None, burst_s: float, nack_cuts: bool):
        self.params = params
        self.burst_s = burst_s
        self.nack_cuts = nack_cuts

    def start(self, now: float) -> Dcqcn | None:
        """A new flow's rate state (None: no rate control)."""
        return Dcqcn(self.params, now) if self.params else None

    @property
    def cnp_interval_s(self) -> float:
        """The shortest time between two CNPs a receiver sends for one flow."""
        return self.params.cnp_interval_s if self.params else 50e-6

    def tick(self, flows: Iterable[RateFlow], now: float) -> None:
        """The alpha and rate-increase timers of ``flows`` up to ``now`` (every flow with data,
        whether or not the NIC scheduler may serve it)."""
        for f in flows:
            if f.dcqcn:
                f.dcqcn.tick(now)

    def on_cnp(self, f: RateFlow, now: float) -> None:
        """A CNP from the receiver (it saw a CE mark): cut the rate."""
        f.stats["cnps"] += 1
        if f.dcqcn:
            f.dcqcn.on_cnp(now)

    def on_nack(self, f: RateFlow, now: float) -> None:
        """A NACK (a hole three packets old on a one-path connection): a cut, if NACKs cut.
        On a sprayed connection a PSN hole that outlived the reordering allowance may still be a
        packet late on a slower path: the cut comes from the path's own sequence numbers
        (:meth:`on_path_loss`), which only a loss can break."""
        if self.nack_cuts and f.dcqcn:
            f.dcqcn.on_cnp(now)
            f.stats["loss_cuts"] = f.stats.get("loss_cuts", 0) + 1

    def on_path_loss(self, f: RateFlow, now: float) -> None:
        """A loss a path's sequence numbers showed: a cut, at most once per smoothed RTT (an
        overflowing queue drops a run of packets, which the sender caused with the rate it had then)."""
        if f.dcqcn and f.dcqcn.on_cnp(now, f.srtt or 0.0):
            f.stats["loss_cuts"] = f.stats.get("loss_cuts", 0) + 1

    def on_sent(self, f: RateFlow, now: float, bits: int, nbytes: int) -> None:
        """A packet of ``nbytes`` payload (``bits`` on the wire) left: the flow's next may leave
        one packet time later at the current rate, and its bytes count towards the
        byte-counter increase. A flow that fell behind (a late wake-up, a busy CPU) catches up
        by at most ``burst_s``, which the sending port's buffer absorbs."""
        if f.dcqcn:
            f.next_t = max(f.next_t, now - self.burst_s) + bits / f.dcqcn.rc
            f.dcqcn.on_sent(nbytes)
