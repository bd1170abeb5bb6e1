"""The loss window seen at receivers, from per-packet arrival records (pure: numpy in, dicts out).

Input is what ``hpnlab.fabric.emulation.udp flowrecv`` records for paced flows that differ
only in their source port: per received packet its flow, sequence number, send time and
arrival time (nanoseconds, CLOCK_REALTIME, the clock of ``time.time()`` and of a timeline's
``wall`` records). Events are failure/repair times in the same clock (seconds).

Per flow and per event:

- a **loss gap** is two consecutive received packets (in sequence order) with sequence numbers
  missing between them. It belongs to the last event that started (``slack_ms`` allowed for
  clock reads) before the middle of the gap, in arrival time: a gap that lasts from a gray
  failure to its repair counts once, for the failure, and packets already queued when the
  failure came (sent before it, lost by it) still count for it;
- the **loss window** is the time from the arrival of the last packet before the event's
  first loss gap to the arrival of the first packet after its last one: "last packet
  delivered before the failure to the first after", at the receiver;
- ``lost`` counts the missing sequence numbers of those gaps;
- the **largest gap** is the longest time between two consecutive arrivals of the flow whose
  middle falls in ``[event, event + horizon)`` (before the next event), lost packets or not,
  with the send-time gap of the same two packets beside it (a gap the sender made itself is not
  the network's); the **network gap** is the largest arrival gap minus send gap there: how
  long the path itself held packets back;
- with the sender's count per flow (``sent_per_flow``), the packets sent after a flow's last
  arrival are lost too: a **tail** that no later packet closes. It belongs to the event in which
  its last packet arrived, and its loss window runs to the capture's end (``open``: the flow never
  delivered again). Before 2026-12-04 a tail was not seen at all: a probe repetition whose flows
  all stopped for good read "0 flows affected" with two thirds of its packets lost. A tail that
  began before the first event is no event's: ``stopped_before_events`` names those flows, and
  ``never_heard`` the flows of which nothing arrived at all;
- a flow is **affected** when it lost packets in the event; an unaffected flow whose largest
  gap exceeds ``stall_ms`` is **stalled**: it never lost a packet but its path stopped;
- a packet is **late** when it arrives more than ``late_ms`` after a packet of its flow with a
  higher sequence number: it counts as lost where it was missing (its gap, ``lost``, the loss
  window), and ``late`` says how many of the lost did arrive after all. A switch can hold
  packets instead of dropping them: Open vSwitch's AF_XDP ports keep what they could not send
  to a port without carrier in the socket's ring and send it when the carrier returns, a
  second later in the failover probe; to the application such a packet is as lost as a
  dropped one (a transport retransmits it long before).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

NS = 1_000_000_000
#: a lost packet sent this long before an event still counts for it (queueing, clock read)
SLACK_MS = 2.0
#: a packet arriving this long after a later packet of its flow is late: lost to the application
LATE_MS = 10.0


def per_flow(arrivals: Mapping[str, np.ndarray], late_ms: float = LATE_MS) -> dict[int, dict[str, np.ndarray]]:
    """Split arrival records by flow, sorted by sequence number, duplicates dropped (the first
    arrival kept); packets that arrived more than ``late_ms`` after a higher sequence number of
    their flow are moved out of the flow's packets into ``late_seq``."""
    flow = np.asarray(arrivals["flow"], dtype=np.int64)
    seq = np.asarray(arrivals["seq"], dtype=np.int64)
    sent = np.asarray(arrivals["sent_ns"], dtype=np.int64)
    arr = np.asarray(arrivals["arrival_ns"], dtype=np.int64)
    out: dict[int, dict[str, np.ndarray]] = {}
    for f in np.unique(flow):
        m = flow == f
        order = np.lexsort((arr[m], seq[m]))          # by sequence number, earliest arrival first
        s_all, first = np.unique(seq[m][order], return_index=True)
        idx = order[first]
        a = arr[m][idx]
        # the earliest arrival of any higher sequence number, per packet
        after = np.append(np.minimum.accumulate(a[::-1])[::-1][1:], np.iinfo(np.int64).max)
        late = a - after > int(late_ms * 1e6)
        keep = ~late
        out[int(f)] = {"seq": s_all[keep], "sent_ns": sent[m][idx][keep], "arrival_ns": a[keep],
                       "late_seq": s_all[late]}
    return out


def nominal_interval_ms(flows: Mapping[int, Mapping[str, np.ndarray]]) -> float:
    """The median time between consecutive packets of a flow, over every flow (ms)."""
    gaps = [np.diff(f["arrival_ns"]) / (np.diff(f["seq"])) for f in flows.values() if len(f["seq"]) > 1]
    return float(np.median(np.concatenate(gaps))) / 1e6 if gaps else 0.0


def flow_event(f: Mapping[str, np.ndarray], t0_ns: int, t1_ns: int, horizon_ns: int,
               slack_ns: int, tail: tuple[int, int] | None = None) -> dict[str, Any]:
    """One flow during one event that started at ``t0`` (the next at ``t1``): loss window,
    packets lost, largest gap. ``tail``: (packets lost after the flow's last arrival, the
    capture's end in ns), when the sender sent more than arrived."""
    seq, sent, arr = f["seq"], f["sent_ns"], f["arrival_ns"]
    res: dict[str, Any] = {"lost": 0, "late": 0, "loss_window_ms": 0.0, "loss_gaps": 0, "max_gap_ms": 0.0,
                           "max_gap_send_ms": 0.0, "max_gap_at_ms": None, "max_network_gap_ms": 0.0}
    if len(seq) < 2:
        return res
    dseq = np.diff(seq)
    darr = np.diff(arr)
    middle = arr[:-1] + (arr[1:] - arr[:-1]) // 2
    loss = (dseq > 1) & (middle >= t0_ns - slack_ns) & (middle < t1_ns - slack_ns)
    if loss.any():
        i = np.flatnonzero(loss)
        res["lost"] = int((dseq[i] - 1).sum())
        late = f.get("late_seq")
        if late is not None and len(late):
            pos = np.searchsorted(seq, late)          # the gap each late packet is missing from
            res["late"] = int(np.isin(pos - 1, i).sum())
        res["loss_gaps"] = len(i)
        res["loss_window_ms"] = float(arr[i[-1] + 1] - arr[i[0]]) / 1e6
        res["loss_window_start_ms"] = float(arr[i[0]] - t0_ns) / 1e6
        res["loss_window_end_ms"] = float(arr[i[-1] + 1] - t0_ns) / 1e6
    if tail is not None and tail[0] > 0 and t0_ns - slack_ns <= arr[-1] < t1_ns - slack_ns:
        start = arr[np.flatnonzero(loss)[0]] if loss.any() else arr[-1]
        res["lost"] += tail[0]
        res["loss_gaps"] += 1
        res["loss_window_ms"] = float(tail[1] - start) / 1e6
        res["loss_window_start_ms"] = float(start - t0_ns) / 1e6
        res["loss_window_end_ms"] = float(tail[1] - t0_ns) / 1e6
        res["open"] = True
    end = min(t1_ns, t0_ns + horizon_ns)
    overlap = (middle >= t0_ns - slack_ns) & (middle < end - slack_ns)
    if overlap.any():
        j = np.flatnonzero(overlap)
        k = j[np.argmax(darr[j])]
        res["max_gap_ms"] = float(darr[k]) / 1e6
        res["max_gap_send_ms"] = float(sent[k + 1] - sent[k]) / 1e6
        res["max_gap_at_ms"] = float(arr[k] - t0_ns) / 1e6
        # the network's own share: how much longer two packets took to arrive than to be sent
        res["max_network_gap_ms"] = float(np.max(darr[j] - np.diff(sent)[j])) / 1e6
    return res


def analyse(arrivals: Mapping[str, np.ndarray], events: Sequence[Mapping[str, Any]], *,
            horizon_s: float = 0.5, stall_ms: float | None = None, slack_ms: float = SLACK_MS,
            end_s: float | None = None, late_ms: float = LATE_MS,
            sent_per_flow: Sequence[int] | None = None) -> dict[str, Any]:
    """Per event (each a mapping with ``wall``: seconds, same clock as the arrivals, or
    ``start_wall`` when the change began, and ``action``), per flow: loss window, lost,
    largest gap; and the event's summary.

    ``stall_ms`` (default: three times the flows' nominal packet interval) is the gap above
    which an unaffected flow counts as stalled. ``end_s``: the capture's end (default: the
    last arrival). ``late_ms``: see the module's docstring. ``sent_per_flow``: packets the
    sender sent per flow id (tails, see the module's docstring), and then ``sent`` and
    ``received`` (distinct packets, late ones included) for the whole capture."""
    flows = per_flow(arrivals, late_ms)
    nominal = nominal_interval_ms(flows)
    stall = stall_ms if stall_ms is not None else 3 * nominal
    last = int(np.max(arrivals["arrival_ns"])) if len(arrivals["arrival_ns"]) else 0
    end_ns = int(end_s * NS) if end_s is not None else last + 1
    times = [int(float(e.get("start_wall", e["wall"])) * NS) for e in events]
    slack = int(slack_ms * 1e6)
    tails: dict[int, tuple[int, int]] = {}
    if sent_per_flow is not None:
        for fid, f in flows.items():
            got = int(f["seq"][-1]) if len(f["seq"]) else -1
            if fid < len(sent_per_flow) and sent_per_flow[fid] - 1 > got:
                tails[fid] = (int(sent_per_flow[fid]) - 1 - got, end_ns)
    out_events = []
    for n, ev in enumerate(events):
        t0 = times[n]
        t1 = times[n + 1] if n + 1 < len(times) else end_ns
        per = {fid: flow_event(f, t0, t1, int(horizon_s * NS), slack, tails.get(fid)) for fid, f in flows.items()}
        out_events.append({"action": ev.get("action"), "target": ev.get("target"), "side": ev.get("side"),
                           "wall": ev["wall"], **summarise_event(per, stall), "flows": per})
    out: dict[str, Any] = {"flows": len(flows), "nominal_interval_ms": nominal, "stall_ms": stall,
                           "late_ms": late_ms, "packets": len(arrivals["seq"]),
                           "late": int(sum(len(f["late_seq"]) for f in flows.values())), "events": out_events}
    if sent_per_flow is not None:
        out["sent"] = int(sum(sent_per_flow))
        out["received"] = int(sum(len(f["seq"]) + len(f["late_seq"]) for f in flows.values()))
        first = times[0] if times else end_ns
        out["stopped_before_events"] = sorted(fid for fid in tails if flows[fid]["arrival_ns"][-1] < first - slack)
        out["never_heard"] = [fid for fid, n in enumerate(sent_per_flow) if n and fid not in flows]
    return out


def summarise_event(per: Mapping[int, Mapping[str, Any]], stall_ms: float) -> dict[str, Any]:
    """One event over its flows: which were affected, the loss window, stalls of the others."""
    affected = sorted(f for f, r in per.items() if r["lost"])
    healthy = [r for f, r in per.items() if not r["lost"]]
    windows = [per[f]["loss_window_ms"] for f in affected]
    stalled = sorted(f for f, r in per.items() if not r["lost"] and r["max_gap_ms"] > stall_ms)
    widest = max(healthy, key=lambda r: r["max_gap_ms"], default=None)
    return {"affected": affected, "lost": int(sum(per[f]["lost"] for f in affected)),
            # flows whose loss in this event lasted to the capture's end: they never delivered again
            "open": sorted(f for f in affected if per[f].get("open")),
            "late": int(sum(per[f]["late"] for f in affected)),
            "loss_window_ms": max(windows) if windows else 0.0,
            # when the last affected flow delivered again, ms after the event (the repair's end)
            "delivering_again_ms": max((per[f]["loss_window_end_ms"] for f in affected), default=None),
            "loss_window_median_ms": float(np.median(windows)) if windows else 0.0,
            "max_gap_ms": max((r["max_gap_ms"] for r in per.values()), default=0.0),
            "stalled": stalled,
            "max_gap_unaffected_ms": widest["max_gap_ms"] if widest else 0.0,
            # the sender's share of that gap: its two packets' send times apart
            "max_gap_unaffected_send_ms": widest["max_gap_send_ms"] if widest else 0.0,
            "max_network_gap_unaffected_ms": max((r["max_network_gap_ms"] for r in healthy), default=0.0)}
