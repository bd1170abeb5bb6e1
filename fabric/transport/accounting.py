"""Per-packet accounting of a flow in bounded memory, and the loss window of a failure (pure).

The roce transport records, per flow:

receiver (``rx`` record)
    ``gaps``: the largest gaps between consecutive arrivals of new data (not duplicates, not
    probes) above ``gap_threshold_s``, as ``[start, end, psn_before, psn_after, busy]`` with
    wall-clock times; ``busy`` is true when a message was partly received at the time (a
    stall, not an idle flow between steps). At most ``max_gaps`` are kept: the largest.
    ``hol_gaps``: the same for advances of the in-order point (head-of-line stalls: what
    the application waits, which with spraying can be longer than any arrival gap, since the
    other paths keep delivering behind a hole).
    ``app_bytes_delivered`` and ``app_crc_delivered``: every byte handed to the application
    and a CRC-32 chained over those messages in order.
sender (``tx`` record)
    ``retx_bursts``: retransmissions grouped into bursts (a retransmission within
    ``burst_join_s`` of the burst's last joins it) as ``[first, last, count, reasons]``; at
    most ``max_bursts`` kept, the largest. ``app_bytes_sent`` and ``app_crc_sent``: what the
    application posted, chained the same way. ``slowest_msgs``: the longest message
    completions as ``[posted, done, bytes]`` (posting to the last byte acknowledged).

Equal bytes and equal CRCs at both ends of a flow prove every byte arrived exactly once and
in order. :func:`failure_windows` turns these records and a failure timeline into the figures
of each event: the loss window (last delivery before the failure to the first after), the
packets lost (retransmitted because of a loss near the event) and the completion time of the
message under way.
"""
from __future__ import annotations

import heapq
import zlib
from collections.abc import Collection, Sequence
from typing import Any


class Largest:
    """The ``n`` largest items by key (a min-heap): bounded whatever the run's length."""
    __slots__ = ("heap", "n", "seen")

    def __init__(self, n: int):
        self.n, self.seen = n, 0
        self.heap: list[tuple[float, int, Any]] = []

    def add(self, key: float, item: Any) -> None:
        self.seen += 1
        entry = (key, self.seen, item)
        if len(self.heap) < self.n:
            heapq.heappush(self.heap, entry)
        elif key > self.heap[0][0]:
            heapq.heapreplace(self.heap, entry)

    def items(self) -> list:
        """Kept items in time order (the order they were added)."""
        return [item for _, _, item in sorted(self.heap, key=lambda e: e[1])]


class GapLog:
    """Arrival gaps above a threshold (receiver side)."""
    __slots__ = ("keep", "last_psn", "last_t", "threshold")

    def __init__(self, threshold_s: float = 0.002, max_gaps: int = 32):
        self.threshold = threshold_s
        self.keep = Largest(max_gaps)
        self.last_t = 0.0
        self.last_psn = -1

    def arrival(self, now: float, psn: int, busy: bool) -> None:
        if self.last_t and now - self.last_t >= self.threshold:
            self.keep.add(now - self.last_t, (self.last_t, now, self.last_psn, psn, busy))
        self.last_t, self.last_psn = now, psn

    def export(self, wall_offset: float) -> list[list]:
        return [[a + wall_offset, b + wall_offset, p0, p1, busy] for a, b, p0, p1, busy in self.keep.items()]


class BurstLog:
    """Retransmissions grouped into bursts (sender side)."""
    __slots__ = ("cur", "join_s", "keep")

    def __init__(self, join_s: float = 0.02, max_bursts: int = 32):
        self.join_s = join_s
        self.keep = Largest(max_bursts)
        self.cur: list | None = None          # [first, last, count, {reason: count}]

    def retx(self, now: float, reason: str) -> None:
        c = self.cur
        if c is not None and now - c[1] <= self.join_s:
            c[1] = now
            c[2] += 1
            c[3][reason] = c[3].get(reason, 0) + 1
            return
        self._close()
        self.cur = [now, now, 1, {reason: 1}]

    def _close(self) -> None:
        if self.cur is not None:
            self.keep.add(self.cur[2], self.cur)
            self.cur = None

    def export(self, wall_offset: float) -> list[list]:
        items = self.keep.items() + ([self.cur] if self.cur is not None else [])
        return [[a + wall_offset, b + wall_offset, n, dict(why)] for a, b, n, why in items]


def crc_chain(crc: int, data) -> int:
    """The running CRC-32 of a flow's messages (data: bytes-like)."""
    return zlib.crc32(data, crc)


# ---- figures of a failure --------------------------------------------------------------------

def exactly_once(flow: dict) -> bool | None:
    """True when a merged flow record (tx and rx joined) shows every byte delivered exactly
    once and in order: the same byte count and CRC at both ends. None if either side is missing."""
    if "app_bytes_sent" not in flow or "app_bytes_delivered" not in flow:
        return None
    return (flow["app_bytes_sent"] == flow["app_bytes_delivered"]
            and flow["app_crc_sent"] == flow["app_crc_delivered"])


def _largest_gap(gaps: list, t: float, until: float, containing: bool = True) -> tuple[float, float] | None:
    """The largest busy gap containing ``t`` (unless not ``containing``) or starting in ``(t, until]``."""
    found = None
    for start, end, _p0, _p1, busy in gaps:
        if busy and ((containing and start <= t <= end) or t <= start <= until) \
                and (found is None or end - start > found[1] - found[0]):
            found = (start, end)
    return found


#: a flow's recovery from an event: its re-send bursts from the event on, each beginning within
#: this many of the run's longest retransmission timeouts of the event or of the previous burst's
#: end; a later re-send is not the event's
RECOVERY_JOIN_RTOS = 2.5
#: the join for the roce transport's default longest timeout, 100 ms
RECOVERY_JOIN_S = 0.25


def recovery_join_s(max_rto_s: float | None) -> float:
    """How far apart a flow's re-sends may be and still be one recovery (pure): 2.5 times the
    run's longest retransmission timeout, so that a timer backing off to it keeps its rounds in
    one recovery (``Plan(host_failover=False)`` lets it back off to 1 s: 2.5 s); the default's
    0.25 s where the run does not say. Before 2026-12-05 it was 0.25 s for every run, and a
    recovery whose timer had backed off past 250 ms was cut short."""
    if max_rto_s is None or not max_rto_s > 0:
        return RECOVERY_JOIN_S
    return RECOVERY_JOIN_RTOS * max_rto_s


def recovery(bursts: list, t: float, end: float, join_s: float = RECOVERY_JOIN_S, begun: bool = True) -> list:
    """The re-send bursts (``[first, last, count, reasons]``) of a flow's recovery from an event at
    ``t`` that lasts until ``end`` (pure): from the first burst that ends at or after ``t`` and
    begins within ``join_s`` of it, each next one beginning within ``join_s`` of the previous
    end, none beginning at or after ``end`` (nor, unless ``begun``, before ``t``: a burst under way
    at a repair is the failure's). A flow re-sends now and then without any failure
    (0-3 packets in a 4-second all-reduce here, a NACK for a reordered packet); such a re-send
    half a second after the failure is not its recovery (before 2026-12-04 any re-send until the
    next event made a flow hurt, and its largest gap until then the loss window)."""
    chain, reach = [], t
    for b in sorted((b for b in bursts if b[1] >= t and b[0] < end and (begun or b[0] >= t)), key=lambda b: b[0]):
        if b[0] > reach + join_s:
            break
        chain.append(b)
        reach = max(reach, b[1])
    return chain


def failure_windows(flows: list[dict], events: list[tuple[str, float]], horizon_s: float = 2.0,
                    boundaries: Sequence[float] = (), join_s: float = RECOVERY_JOIN_S,
                    repairs: Collection[str] = ()) -> list[dict]:
    """Per failure event (name, wall-clock time) and per flow: the loss window and its cost.

    ``flows`` are merged flow records (``report.merge_flows``: tx and rx counters of one
    directed flow in one dict). An event at ``t`` lasts until ``t + horizon_s``, the next event
    or the next of ``boundaries`` (other changes of the timeline that end it without figures of
    their own), whichever comes first. For each event and each flow: packets lost are the
    retransmissions of the flow's :func:`recovery` from it (``resent_by_cause``: nack, timeout,
    failover, migrate; a failover re-send may repeat a packet that was only late, so this is
    an upper bound). A flow that re-sent nothing there
    lost nothing: it was not hurt (loss window 0), whatever pauses it had. Otherwise the loss
    window is the largest arrival gap, while the flow had a message in flight (``busy``), that
    contains ``t`` or starts after it and before the recovery's last re-send. A link taken
    down shows at ``t``; a gray failure, which drops a path's packets silently while the
    others deliver, stalls the flow later, once its window is spent (before 2026-12-03 the
    first busy gap after ``t`` was taken, often a pause of a few ms that any flow has, not the
    failure's). Events named in ``repairs`` take only what begins at or after them: a pause or
    a re-send under way when a link comes back is the failure's, not the repair's (before
    2026-12-04 a dead plane's timer-paced recovery, 40-45 ms pauses, read as the repair's).
    ``stall_s`` is the same for the in-order point (``hol_gaps``);
    ``completion_s`` is the slowest message under way at ``t``; ``exactly_once`` checks bytes
    and CRC of the whole flow.
    """
    out = []
    times = sorted([t for _name, t in events] + list(boundaries))
    for name, t in events:
        later = [u for u in times if u > t]
        end = min([t + horizon_s] + later[:1])
        fresh = name in repairs
        for f in flows:
            near = recovery(f.get("retx_bursts", []), t, end, join_s, begun=not fresh)
            causes: dict[str, int] = {}
            for _first, _last, _n, why in near:
                for k, v in why.items():
                    causes[k] = causes.get(k, 0) + v
            until = min(end, max((b[1] for b in near), default=t))
            gap = _largest_gap(f.get("gaps", []), t, until, not fresh) if near else None
            hol = _largest_gap(f.get("hol_gaps", []), t, until, not fresh) if near else None
            under_way = [done - posted for posted, done, _nb in f.get("slowest_msgs", []) if posted <= t <= done]
            out.append({"event": name, "t": t, "src": f["src"], "dst": f["dst"],
                        "loss_window_s": (gap[1] - gap[0]) if gap else 0.0,
                        "stall_s": (hol[1] - hol[0]) if hol else 0.0,
                        "last_before": gap[0] if gap else None, "first_after": gap[1] if gap else None,
                        "packets_lost": sum(b[2] for b in near), "resent_by_cause": causes,
                        "completion_s": max(under_way) if under_way else None,
                        "bytes_sent": f.get("app_bytes_sent"), "bytes_delivered": f.get("app_bytes_delivered"),
                        "exactly_once": exactly_once(f)})
    return out


def summarize_windows(windows: list[dict]) -> list[dict]:
    """Per event of :func:`failure_windows`' output: flows hurt (a loss window above zero) of
    all, the largest and median loss window and in-order stall over the hurt flows (ms),
    packets re-sent near the event, and whether every flow got every byte exactly once."""
    by_event: dict[tuple, list[dict]] = {}
    for w in windows:
        by_event.setdefault((w["event"], w["t"]), []).append(w)
    out = []
    for (event, t), ws in by_event.items():
        hurt = sorted(w["loss_window_s"] * 1e3 for w in ws if w["loss_window_s"] > 0)
        stalls = [w["stall_s"] * 1e3 for w in ws if w["loss_window_s"] > 0]
        out.append({"event": event, "t": t, "flows": len(ws), "flows_hurt": len(hurt),
                    "loss_window_ms_max": hurt[-1] if hurt else 0.0,
                    "loss_window_ms_median": hurt[len(hurt) // 2] if hurt else 0.0,
                    "stall_ms_max": max(stalls, default=0.0),
                    "packets_lost": sum(w["packets_lost"] for w in ws),
                    "exactly_once": all(w["exactly_once"] is not False for w in ws)})
    return out
