"""The loss window at receivers (hpnlab.fabric.emulation.losswindow), on synthetic arrival records."""
from __future__ import annotations

import numpy as np
import pytest

from hpnlab.fabric.emulation import losswindow

MS = 1_000_000
T0 = 1_700_000_000 * 1_000_000_000          # a wall clock, in ns


def _flow(flow: int, n: int = 1000, every_ms: float = 1.0, latency_ms: float = 0.5,
          missing: range | None = None, stall: tuple[int, float] | None = None) -> dict[str, np.ndarray]:
    """Packets 0..n-1 sent every ``every_ms`` from T0; ``missing`` never arrive; ``stall`` =
    (seq, ms): from that sequence number on, arrivals are ``ms`` later until the queue drains."""
    seq = np.arange(n)
    sent = T0 + (seq * every_ms * MS).astype(np.int64)
    arr = sent + int(latency_ms * MS)
    if stall is not None:
        at, ms = stall
        held = (seq >= at) & (sent < sent[at] + ms * MS)
        arr[held] = sent[at] + int(ms * MS)      # held back, then released at once
    keep = np.ones(n, bool) if missing is None else ~np.isin(seq, np.asarray(missing))
    return {"flow": np.full(keep.sum(), flow, np.uint32), "seq": seq[keep].astype(np.uint64),
            "sent_ns": sent[keep].astype(np.uint64), "arrival_ns": arr[keep].astype(np.uint64)}


def _merge(*flows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([f[k] for f in flows]) for k in flows[0]}


def _events(*at_ms: float) -> list[dict]:
    return [{"wall": (T0 + ms * MS) / 1e9, "action": f"e{i}"} for i, ms in enumerate(at_ms)]


def test_the_loss_window_runs_from_the_last_packet_before_to_the_first_after():
    arrivals = _merge(_flow(0, missing=range(300, 350)), _flow(1))
    ev = losswindow.analyse(arrivals, _events(300, 800))["events"][0]
    assert ev["affected"] == [0]
    assert ev["flows"][0]["lost"] == 50
    # packet 299 arrived at 299.5 ms, packet 350 at 350.5 ms
    assert ev["flows"][0]["loss_window_ms"] == pytest.approx(51.0)
    assert ev["loss_window_ms"] == pytest.approx(51.0)


def test_a_flow_that_lost_nothing_is_not_affected_and_its_gap_is_its_packet_interval():
    arrivals = _merge(_flow(0, missing=range(300, 350)), _flow(1))
    ev = losswindow.analyse(arrivals, _events(300, 800))["events"][0]
    assert ev["flows"][1]["lost"] == 0
    assert ev["flows"][1]["max_gap_ms"] == pytest.approx(1.0)
    assert ev["stalled"] == []


def test_a_gap_from_a_failure_to_its_repair_counts_once_for_the_failure():
    arrivals = _merge(_flow(0, missing=range(300, 800)), _flow(1))
    failure, repair = losswindow.analyse(arrivals, _events(300, 800))["events"]
    assert failure["lost"] == 500 and failure["loss_window_ms"] == pytest.approx(501.0)
    assert repair["lost"] == 0 and repair["affected"] == []


def test_loss_before_the_first_event_belongs_to_no_event():
    arrivals = _merge(_flow(0, missing=range(100, 105)), _flow(1))
    events = losswindow.analyse(arrivals, _events(300, 800))["events"]
    assert [e["lost"] for e in events] == [0, 0]


def test_a_flow_held_back_without_loss_is_stalled_not_affected():
    arrivals = _merge(_flow(0), _flow(1, stall=(305, 20.0)))
    ev = losswindow.analyse(arrivals, _events(300, 800), stall_ms=5.0)["events"][0]
    assert ev["affected"] == [] and ev["stalled"] == [1]
    assert ev["flows"][1]["max_gap_ms"] == pytest.approx(20.5)
    assert ev["flows"][1]["max_gap_send_ms"] == pytest.approx(1.0)   # the sender did not pause: the path did
    assert ev["max_gap_unaffected_ms"] == pytest.approx(20.5)
    assert ev["max_gap_unaffected_send_ms"] == pytest.approx(1.0)
    assert ev["max_network_gap_unaffected_ms"] == pytest.approx(19.5)


def test_a_gap_the_sender_made_shows_as_a_send_gap():
    f = _flow(0, missing=range(400, 420))
    f["seq"] = np.where(f["seq"] >= 420, f["seq"] - 20, f["seq"]).astype(np.uint64)   # not sent at all: no seq skipped
    ev = losswindow.analyse(f, _events(380, 800), stall_ms=5.0)["events"][0]
    assert ev["lost"] == 0
    assert ev["flows"][0]["max_gap_ms"] == pytest.approx(21.0)
    assert ev["flows"][0]["max_gap_send_ms"] == pytest.approx(21.0)
    assert ev["flows"][0]["max_network_gap_ms"] == pytest.approx(0.0)      # the path held nothing back


def test_the_default_stall_threshold_is_three_packet_intervals():
    result = losswindow.analyse(_merge(_flow(0, every_ms=2.0), _flow(1, every_ms=2.0)), _events(300))
    assert result["nominal_interval_ms"] == pytest.approx(2.0)
    assert result["stall_ms"] == pytest.approx(6.0)


def test_duplicates_are_counted_once():
    f = _flow(0, missing=range(300, 310))
    dup = {k: np.concatenate([v, v[:5]]) for k, v in f.items()}
    ev = losswindow.analyse(dup, _events(300))["events"][0]
    assert ev["lost"] == 10


def test_an_event_uses_the_time_its_change_began_when_recorded():
    arrivals = _flow(0, missing=range(300, 350))
    late = [{"wall": (T0 + 360 * MS) / 1e9, "start_wall": (T0 + 295 * MS) / 1e9, "action": "link_drop"}]
    assert losswindow.analyse(arrivals, late)["events"][0]["lost"] == 50


def test_delivering_again_is_when_the_last_affected_flow_received_its_first_packet_after_the_loss():
    arrivals = _merge(_flow(0, missing=range(300, 320)), _flow(1, missing=range(300, 340)), _flow(2))
    ev = losswindow.analyse(arrivals, _events(300, 800))["events"][0]
    # flow 1's packet 340 arrived at 340.5 ms, 40.5 ms after the event
    assert ev["delivering_again_ms"] == pytest.approx(40.5)


def test_no_affected_flow_means_no_time_of_delivering_again():
    ev = losswindow.analyse(_merge(_flow(0), _flow(1)), _events(300, 800))["events"][0]
    assert ev["delivering_again_ms"] is None


def _held(f: dict[str, np.ndarray], seqs: range, until_ms: float) -> dict[str, np.ndarray]:
    """The packets ``seqs`` of ``f`` arrive only at ``until_ms`` (held by a switch, then sent)."""
    out = {k: v.copy() for k, v in f.items()}
    out["arrival_ns"][np.isin(out["seq"], np.asarray(seqs))] = T0 + int(until_ms * MS)
    return out


def test_packets_held_until_the_repair_count_as_lost_and_late():
    # an AF_XDP port keeps what it could not send without carrier and sends it on repair
    arrivals = _merge(_held(_flow(0), range(300, 312), 800.0), _flow(1))
    failure, repair = losswindow.analyse(arrivals, _events(300, 800))["events"]
    assert failure["affected"] == [0]
    assert failure["lost"] == 12 and failure["late"] == 12
    assert failure["loss_window_ms"] == pytest.approx(13.0)    # packet 299 at 299.5 ms, 312 at 312.5 ms
    assert repair["lost"] == 0


def test_a_packet_reordered_by_less_than_the_late_threshold_is_delivered():
    arrivals = _held(_flow(0), range(300, 301), 303.0)           # 2 ms behind packet 301
    ev = losswindow.analyse(arrivals, _events(300, 800))["events"][0]
    assert ev["lost"] == 0 and ev["late"] == 0 and ev["affected"] == []


def test_late_and_never_arrived_packets_are_told_apart():
    arrivals = _held(_flow(0, missing=range(305, 310)), range(300, 305), 900.0)
    result = losswindow.analyse(arrivals, _events(300, 800))
    ev = result["events"][0]
    assert ev["lost"] == 10 and ev["late"] == 5
    assert result["late"] == 5


def _flow_until(flow: int, stop_ms: float, n: int = 1000) -> dict[str, np.ndarray]:
    """A flow whose packets stop arriving for good from ``stop_ms`` on (n were sent)."""
    return _flow(flow, n=n, missing=range(int(stop_ms), n))


def test_a_flow_that_never_delivers_again_is_lost_to_the_capture_s_end():
    """Its lost packets have no later packet to close a gap: the sender's count tells them."""
    end_s = (T0 + 1000 * MS) / 1e9
    result = losswindow.analyse(_merge(_flow_until(0, 300), _flow(1)), _events(300, 800), end_s=end_s,
                                sent_per_flow=[1000, 1000])
    failure, repair = result["events"]
    assert failure["affected"] == [0] and failure["open"] == [0]
    assert failure["lost"] == 700
    assert failure["loss_window_ms"] == pytest.approx(700, abs=2)
    assert repair["affected"] == [] and result["received"] == 1300 and result["sent"] == 2000


def test_without_the_sender_s_counts_a_tail_is_not_seen():
    ev = losswindow.analyse(_merge(_flow_until(0, 300), _flow(1)), _events(300, 800))["events"][0]
    assert ev["affected"] == [] and "sent" not in losswindow.analyse(_flow(1), _events(300))


def test_a_flow_that_stopped_before_the_first_event_is_named_not_counted_for_it():
    result = losswindow.analyse(_merge(_flow_until(0, 100), _flow(1)), _events(300, 800),
                                end_s=(T0 + 1000 * MS) / 1e9, sent_per_flow=[1000, 1000])
    assert result["stopped_before_events"] == [0]
    assert [e["affected"] for e in result["events"]] == [[], []]


def test_a_flow_of_which_nothing_arrived_is_named():
    result = losswindow.analyse(_flow(1), _events(300), end_s=(T0 + 1000 * MS) / 1e9, sent_per_flow=[1000, 1000])
    assert result["never_heard"] == [0] and result["received"] == 1000 and result["sent"] == 2000
