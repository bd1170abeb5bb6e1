"""The receive side of a rank's flows: data placed and delivered in order, and the answers
(ACK, NACK, PATH_LOSS, CNP) it sends back.

Every packet is placed at its offset (a reordering / reassembly buffer, as NICs that accept
sprayed packets do) and messages are delivered in order. ACKs are cumulative and coalesced
(:func:`ack_now`). A PSN hole is NACKed once it is a loss (:func:`hole_is_loss`): past
``reorder_threshold`` packets on a one-path connection, or older than the flow's reordering
allowance, which grows from what arrived late. A jump in a path's own sequence numbers
(:func:`path_gap`) is a loss on that path, reported at once (PATH_LOSS). A CE mark is answered by
a CNP, at most one per ``cnp_interval_s`` per flow. Answers go on a plane that delivers
(:func:`.paths.ack_plane`). Go-back-N mode drops every out-of-order packet and NACKs the
expected PSN. The decisions are the pure functions here; :class:`Receiver` applies them to a
flow's state (:class:`.flows.RxFlow`) and sends through one callable, so that it runs without sockets.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Container

from ..paths import ack_plane
from .flows import RxFlow, TxFlow
from .wire import ACK, CE, CNP, HDR, NACK, NO_REPORT, PATH_LOSS, PSEQ_MASK

#: reorder_threshold of a multi-path connection: no count of packets past a hole makes it a loss
NO_COUNT = 1 << 30
#: the longest a hole waits for a late packet before the receiver NACKs it (the reordering allowance's cap)
REORDER_TIME_MAX_S = 0.2
#: the same hole is NACKed again only after this long
NACK_REPEAT_S = 0.05
#: a NACK names at most this many missing PSNs
NACK_MAX = 64

#: sends one control packet: (type, peer, plane, path, psn, extra, ts, reports)
Control = Callable[..., None]


def path_gap(last: int, pseq: int) -> int | None:
    """How many packets are missing on a path between its newest path sequence ``last`` and a
    packet that arrives with ``pseq`` (16 bits, wrapping; pure): 0 in order, None for a
    duplicate or an older packet (half the number space behind)."""
    d = (pseq - last) & PSEQ_MASK
    if d == 0 or d > PSEQ_MASK // 2:
        return None
    return d - 1


def hole_is_loss(beyond: int, age_s: float, threshold: int, reorder_time_s: float, by_age: bool = True) -> bool:
    """Whether a hole with ``beyond`` packets received past it, ``age_s`` old, is a loss: once
    ``threshold`` packets passed it, or (RACK-like, for sprayed packets whose paths differ in
    delay; ``by_age``) once it is older than the reordering allowance with at least 3 packets past it.
    Not by age on a lossless fabric (priority flow control): a pause holds one path's packets while the
    others deliver, for as long as the pauses last (hundreds of milliseconds here), so an old hole is a
    held packet; a real loss (a headroom drop) breaks its path's own sequence numbers, which
    PATH_LOSS reports at once (on a sprayed connection with PFC, NACKs by age re-sent 2,300-2,700
    packets of mini-hpn's all-to-all, every one of which also arrived)."""
    return beyond >= threshold or (by_age and beyond >= 3 and age_s >= reorder_time_s)


def hole_length(expected: int, ooo: Container[int]) -> int:
    """How many PSNs are missing from ``expected`` up to the first received beyond it (at most
    :data:`NACK_MAX`)."""
    hole = 1
    while expected + hole not in ooo and hole < NACK_MAX:
        hole += 1
    return hole


def sent_after(ts: int, other: int) -> bool:
    """Whether send timestamp ``ts`` is later than ``other`` (32-bit microseconds, wrapping)."""
    return (other - ts) & 0xFFFFFFFF >= 1 << 31


def ack_now(completed: bool, reordering: bool, pending: int, ack_every: int) -> bool:
    """ACK coalescing (as NICs do): an ACK at once when a message completes, on reordering, or
    every ``ack_every`` packets; otherwise within the ACK delay."""
    return completed or reordering or pending >= ack_every


def take_reports(reports: dict[int, int], n: int) -> list[int]:
    """Up to ``n`` delivery reports (oldest first, :func:`.wire.report`), removed from
    ``reports`` (path -> newest send timestamp not yet reported); NO_REPORT fills the rest."""
    out = [NO_REPORT] * n
    for i in range(n):
        if not reports:
            break
        path = next(iter(reports))
        out[i] = path << 24 | (reports.pop(path) & 0xFFFFFF)
    return out


class Receiver:
    """The flows ``rx`` arriving at a rank; answers go out through ``control`` (``tx``: this
    rank's sending flows, whose dead planes the answers avoid)."""

    def __init__(self, rx: dict[int, RxFlow], tx: dict[int, TxFlow], control: Control, *, mode: str,
                 reorder_threshold: int, ack_every: int, ack_delay_s: float, ack_fresh_s: float,
                 cnp_interval_s: float, suspect_s: float, lossless: bool = False):
        self.rx, self.tx = rx, tx
        self.control = control
        self.selective = mode == "selective"
        self.reorder_threshold = reorder_threshold
        self.ack_every = ack_every
        self.ack_delay_s = ack_delay_s
        self.ack_fresh_s = ack_fresh_s
        self.cnp_interval_s = cnp_interval_s
        self.suspect_s = suspect_s          # our ACKs on a plane seem lost for this long after a re-send
        #: the fabric is lossless (priority flow control): a hole's age is no loss (:func:`hole_is_loss`)
        self.lossless = lossless

    def on_data(self, r: RxFlow, data, tos, path, psn, mid, off, mlen, ts, now, plane, pseq) -> None:
        """A data packet of flow ``r`` (the header's fields; ``data``: the whole packet)."""
        st = r.stats
        if self.selective:
            self.path_order(r, path, pseq, now)
        st["packets_received"] += 1
        r.plane_t[plane] = now                # answers go on a plane that delivers (answer_plane)
        r.reports[path] = ts
        if tos & 0x03 == CE:
            st["ce_marks"] += 1
            if now - r.last_cnp >= self.cnp_interval_s:
                r.last_cnp = now
                st["cnps_sent"] += 1
                self.control(CNP, r.src, self.answer_plane(r, now), path, 0, 0)
        if psn < r.expected or psn in r.ooo:
            st["duplicates"] += 1
            if psn < r.expected:
                # the peer re-sent what we acknowledged: our ACKs on this plane may be lost
                r.suspect_until[r.plane] = now + self.suspect_s
            if r.last_nack[0] >= 0 and psn >= r.last_nack[0] and r.reorder_time:
                # the NACKed packet came twice: it was late, not lost (like RACK's reo_wnd
                # growing on a DSACK) - wait longer before calling a hole a loss
                r.reorder_time = min(REORDER_TIME_MAX_S, r.reorder_time * 2)
                r.last_nack = (-1, r.last_nack[1])
            r.ack_due, r.ack_ts, r.ack_path = True, ts, path
            return
        if psn != r.expected and not self.selective:
            st["dropped_out_of_order"] += 1
            if r.last_nack[0] != r.expected or now - r.last_nack[1] > NACK_REPEAT_S:
                r.last_nack = (r.expected, now)
                st["nacks_sent"] += 1
                self.control(NACK, r.src, self.answer_plane(r, now), path, r.expected, 1, 0, take_reports(r.reports, 2))
            return
        # busy: part of a message, or data past a hole, was waiting before this packet came;
        # a gap that a new message's first packet ends was idle (the collective's own wait)
        busy = bool(r.msgs or r.ooo)
        r.gaps.arrival(now, psn, busy)
        # place the payload (a reassembly buffer keyed by message); deliver what is complete, in order
        completed = False
        if mid >= r.deliver_next and mid not in r.complete:
            m = r.msgs.get(mid)
            if m is None:
                m = r.msgs[mid] = [bytearray(mlen), 0]
            payload = memoryview(data)[HDR.size:]
            m[0][off:off + len(payload)] = payload
            m[1] += len(payload)
            if m[1] >= mlen:
                completed = True
                r.complete[mid] = m[0]
                del r.msgs[mid]
                while r.deliver_next in r.complete:
                    r.ready.append(r.complete.pop(r.deliver_next))
                    r.deliver_next += 1
        if mlen == 0 and mid == r.deliver_next:
            r.ready.append(bytearray())
            r.deliver_next += 1
        if psn == r.expected:
            at_hole = bool(r.ooo) and psn == r.hole_psn
            # a copy sent after the packet that showed the hole: a re-send, so the hole was a loss
            resent_fill = at_hole and sent_after(ts, r.hole_ts)
            if at_hole and not resent_fill and r.reorder_time and r.last_nack[0] != psn:
                # the hole filled without a NACK, by a packet sent before the one that showed
                # the hole (late, not re-sent): paths differ in delay by at least the hole's
                # age, so a hole must be older than that (with a quarter more) before it counts
                # as a loss (RACK's reordering window, learnt from what arrived late, not only
                # from a NACK that turned out spurious)
                r.reorder_time = min(REORDER_TIME_MAX_S, max(r.reorder_time, 1.25 * (now - r.hole_since)))
            r.hol.arrival(now, psn, busy)
            r.expected += 1
            while r.expected in r.ooo:
                del r.ooo[r.expected]
                r.expected += 1
            if resent_fill and r.ooo:
                # the next hole is as old as the first packet past it that arrived: a run of
                # losses on a path (a gray link, before BFD finds it) shows its holes together,
                # and once a re-send fills the first, the next is no new reordering to wait out.
                # Timing it from now left each further hole to the sender's retransmission
                # timer, one hole per RTO while the window stood still. Only after a re-send:
                # holes that late first copies fill keep a fresh clock each (timed from the
                # first arrival past them, the same run of sprayed packets on paths of unequal
                # delay NACKed 6-64 packets a run where it NACKed 0-4 and lost up to 0.35 of
                # the all-reduce's busbw on bench_failover's mini-hpn)
                r.hole_psn = r.expected
                r.hole_since, r.hole_ts = min(r.ooo.values())
        else:
            r.ooo[psn] = (now, ts)
            depth = psn - r.expected
            if depth > st["max_reorder"]:
                st["max_reorder"] = depth
        r.ack_ts, r.ack_path = ts, path
        r.pending += 1
        if ack_now(completed, bool(r.ooo), r.pending, self.ack_every):
            r.ack_due = True
        elif not r.ack_at:
            r.ack_at = now + self.ack_delay_s
        if r.ooo and self.selective:
            beyond = max(r.ooo) - r.expected
            if r.hole_psn != r.expected:
                r.hole_psn, r.hole_since, r.hole_ts = r.expected, now, ts
            lost = hole_is_loss(beyond, now - r.hole_since, self.reorder_threshold, r.reorder_time,
                                by_age=not self.lossless)
            if lost and (r.last_nack[0] != r.expected or now - r.last_nack[1] > NACK_REPEAT_S):
                r.last_nack = (r.expected, now)
                st["nacks_sent"] += 1
                self.control(NACK, r.src, self.answer_plane(r, now), path, r.expected,
                             hole_length(r.expected, r.ooo), 0, take_reports(r.reports, 2))

    def on_probe(self, r: RxFlow, plane: int, path: int, ts: int, now: float) -> None:
        """A probe down one of the sender's dead paths: report it delivered at once."""
        r.stats["probes_received"] += 1
        r.plane_t[plane] = now
        r.reports[path] = ts
        r.probed = r.ack_due = True

    def path_order(self, r: RxFlow, path: int, pseq: int, now: float) -> None:
        """Packets on one path arrive in the order they were sent (one route through FIFO
        queues), so a jump in a path's sequence numbers is a loss on that path: reported at
        once (PATH_LOSS), not after the reordering allowance that spraying over paths of
        different delay needs (a hole in the PSNs says nothing until it is that old)."""
        last = r.path_seq.get(path)
        if last is not None:
            missing = path_gap(last, pseq)
            if missing is None:
                return                          # a duplicate or an older packet
            if missing:
                r.stats["path_losses_sent"] += 1
                self.control(PATH_LOSS, r.src, self.answer_plane(r, now), path, (last + 1) & PSEQ_MASK,
                             missing, 0, take_reports(r.reports, 2))
        r.path_seq[path] = pseq

    def flush_acks(self, now: float = 0.0, force: bool = False) -> float:
        """Send the ACKs that are due; return when the next delayed one is (0: none)."""
        nxt = 0.0
        now = now or time.monotonic()
        for r in self.rx.values():
            if r.ack_due or (r.ack_at and (force or now >= r.ack_at)):
                r.ack_due = False
                r.pending = 0
                r.ack_at = 0.0
                if not r.ooo and not r.probed:
                    r.reports.clear()                # in order: the cumulative ACK says it all
                elif r.reports.get(r.ack_path) == r.ack_ts:
                    del r.reports[r.ack_path]        # the echo reports it
                r.probed = False
                a, b, c = take_reports(r.reports, 3)
                self.control(ACK, r.src, self.answer_plane(r, now), r.ack_path, r.expected, c, r.ack_ts, (a, b))
                r.ack_ts = 0                         # echo (and time) each data packet once
                if r.reports:
                    r.ack_due = True                 # more paths to report: another ACK next round
                    nxt = now
            elif r.ack_at and (not nxt or r.ack_at < nxt):
                nxt = r.ack_at
        return nxt

    def answer_plane(self, r: RxFlow, now: float) -> int:
        """The plane to answer the peer on (see :func:`.paths.ack_plane`)."""
        tx = self.tx.get(r.src)
        dead = tx.paths.dead_planes() if tx is not None else set()
        pl = ack_plane(r.plane_t, dead, r.suspect_until, r.plane, now, self.ack_fresh_s)
        if pl != r.plane:
            r.plane = pl
            r.stats["ack_plane_switches"] += 1
        return pl
