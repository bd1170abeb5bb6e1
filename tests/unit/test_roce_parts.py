"""The roce transport's parts, each on its own and without sockets: the NIC scheduler (sender),
the receiver, recovery, DCQCN's rate control and path choice, fed plain values and flow records.

Sending sockets are stand-ins that record what they were given or refuse as the kernel would
(a full buffer, a port that is down); answers go to a list. The same parts on real sockets are
tests/unit/test_transport.py and test_transport_failover.py."""
from __future__ import annotations

import errno
import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpnlab.fabric.transport.entropy import ENTROPY_POLICIES, FlowEntropy, SprayEntropy
from hpnlab.fabric.transport.paths import PathParams, PathTable
from hpnlab.fabric.transport.roce.dcqcn import DcqcnParams, RateControl
from hpnlab.fabric.transport.roce.endpoint import Endpoint, socket_drops
from hpnlab.fabric.transport.roce.failover import Failover
from hpnlab.fabric.transport.roce.flows import RxFlow, TxFlow
from hpnlab.fabric.transport.roce.receiver import (
    NO_COUNT,
    Receiver,
    ack_now,
    hole_is_loss,
    hole_length,
    sent_after,
    take_reports,
)
from hpnlab.fabric.transport.roce.recovery import (
    GOBACKN,
    SELECTIVE,
    Recovery,
    backoff,
    bdp_window,
    nack_resends,
    rto_bounds,
    timeout_resends,
    timer_held,
)
from hpnlab.fabric.transport.roce.sender import NicScheduler, next_packet, port_next
from hpnlab.fabric.transport.roce.wire import ACK, CE, CNP, HDR, NACK, NO_REPORT, PATH_LOSS, report

PAYLOAD = 1000
LINE = 10e6                       # bit/s per port: a 1000-byte packet takes about 0.85 ms


class Socket:
    """A sending socket that records (header, payload) of what it sent; ``refuse(n, exc)``
    makes its next ``n`` sends raise ``exc`` instead, as the kernel would."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.refusals: list[OSError] = []

    def refuse(self, n: int, exc: OSError) -> None:
        self.refusals += [exc] * n

    def sendmsg(self, parts, _anc, _flags, _addr) -> int:
        if self.refusals:
            raise self.refusals.pop(0)
        self.sent.append((HDR.unpack(bytes(parts[0])), bytes(parts[1])))
        return len(parts[0]) + len(parts[1])

    def sendto(self, data, _addr) -> int:
        self.sent.append((HDR.unpack(bytes(data)), b""))
        return len(data)


class Parts:
    """A rank's parts wired as RoceTransport wires them, its flows on stand-in sockets."""

    def __init__(self, peers: int = 1, planes: int = 1, ports: int = 1, entropy: str = FlowEntropy.name,
                 mode: str = SELECTIVE, dcqcn: DcqcnParams | None = None, window: int = 64) -> None:
        addrs = [[f"10.0.{p}.{r + 1}" for p in range(planes)] for r in range(peers + 1)]
        self.policy = ENTROPY_POLICIES[entropy](planes, ports)
        self.endpoint = Endpoint(0, addrs, 4791, ports, True, None)
        for r in range(peers + 1):
            for p in range(planes):
                self.endpoint.peer_addr[r, p] = (addrs[r][p], 4791 + r)
        self.tx: dict[int, TxFlow] = {}
        self.rx: dict[int, RxFlow] = {}
        params = PathParams()
        self.rate = RateControl(dcqcn, burst_s=0.004, nack_cuts=self.policy.per_flow and mode == SELECTIVE)
        self.failover = Failover(self.policy, self.endpoint, self.tx, self.rx, params, watch_links=False)
        self.recovery = Recovery(mode, self.policy, self.failover, self.rate, params, min_rto_s=0.01,
                                 max_rto_s=0.1, window_pkts=window, bdp_factor=6.0, flow_max_bps=LINE,
                                 packet_bytes=PAYLOAD + 70, ack_every=8, sample_s=0.025)
        self.now = 0.0                            # the scheduler's clock: still while it serves
        self.sender = NicScheduler(0, self.endpoint, self.failover, self.rate, payload=PAYLOAD, line_rate_bps=LINE,
                                   pace=1.0, burst_s=0.004, lookahead_s=0.0, clock=lambda: self.now)
        self.answers: list[tuple] = []
        self.receiver = Receiver(self.rx, self.tx, lambda *a: self.answers.append(a), mode=mode,
                                 reorder_threshold=3 if self.policy.per_flow else NO_COUNT, ack_every=8,
                                 ack_delay_s=0.004, ack_fresh_s=0.02, cnp_interval_s=50e-6, suspect_s=0.05)
        self.socks: list[Any] = [Socket() for _ in range(planes * ports)]   # stand-ins for socket.socket
        for r in range(1, peers + 1):
            f = self.tx[r] = TxFlow(0, r, 0.0, self.rate.start(0.0), PathTable(planes, ports, params))
            f.window = window
            f.socks = self.socks                  # as without an entropy map: the rank's shared sockets
            self.rx[r] = RxFlow(r, planes)
        self.sender.start()

    def post(self, peer: int, nbytes: int, mid: int = 0) -> None:
        self.tx[peer].queue.append((mid, memoryview(bytes(nbytes))))

    def serve(self, now: float) -> float:
        self.now = now
        return self.sender.serve(list(self.tx.values()), now, now + 0.005)

    def sent(self, path: int = 0) -> list[tuple]:
        """(dst, psn, path sequence) of the data packets sent on ``path``."""
        return [(h[3], h[4], h[9]) for h, _ in self.socks[path].sent]


# ---- the NIC scheduler -----------------------------------------------------------------------

def test_a_message_is_cut_into_payload_sized_packets():
    p = Parts()
    p.post(1, 2500)
    p.sender.lookahead_s = 1.0
    p.serve(0.0)
    f = p.tx[1]
    assert [len(payload) for _, payload in p.socks[0].sent] == [1000, 1000, 500]
    assert f.msg_last_psn == {0: 2} and f.cur is None and sorted(f.unacked) == [0, 1, 2]


def test_the_next_packet_is_the_same_until_it_has_left():
    f = TxFlow(0, 1, 0.0, None, PathTable(1, 1))
    f.window = 8
    f.queue.append((0, memoryview(bytes(2500))))
    first, again = next_packet(f, PAYLOAD), next_packet(f, PAYLOAD)
    assert first is not None and again is not None
    assert (first[0], again[0], first[2], f.psn, f.unacked) == (0, 0, False, 0, {})


def test_a_queued_resend_goes_before_new_data():
    p = Parts()
    p.post(1, 2 * PAYLOAD)
    p.post(1, PAYLOAD, mid=1)
    p.sender.lookahead_s = 1.0
    f = p.tx[1]
    f.window = 2
    p.serve(0.0)                                         # two packets in flight; the window is full
    assert f.requeue(0, "nack")
    assert not f.requeue(0, "nack")                      # queued once
    pkt = next_packet(f, PAYLOAD)
    assert pkt is not None and (pkt[0], pkt[2]) == (0, True)


def test_the_window_stops_new_packets_not_resends():
    p = Parts(window=2)
    p.post(1, 5 * PAYLOAD)
    p.sender.lookahead_s = 1.0
    p.serve(0.0)
    f = p.tx[1]
    assert f.psn == 2 and next_packet(f, PAYLOAD) is None and not f.can_send()
    f.requeue(1, "timeout")
    pkt = next_packet(f, PAYLOAD)
    assert pkt is not None and pkt[0] == 1


@pytest.mark.parametrize(("free_at", "now", "expect"), [
    (0.010, 0.0, 0.010 + 0.0008),        # the port is busy until 10 ms: one packet time after that
    (0.0, 1.0, 1.0 - 0.004 + 0.0008),    # it was idle long: credit of at most burst_s (4 ms), no more
])
def test_a_port_is_free_again_one_packet_time_later_with_bounded_credit_for_a_late_wake_up(free_at, now, expect):
    assert port_next(free_at, now, 8000, LINE, 1.0, 0.004) == pytest.approx(expect)


@pytest.mark.parametrize(("next_t", "expect"), [
    (0.0, 1.0 - 0.004 + 0.008),           # a flow that fell behind: at most burst_s (4 ms) of credit
    (2.0, 2.008),                         # ahead of now: one packet time after its slot
])
def test_the_flow_pacer_spaces_packets_at_the_current_rate_with_bounded_credit(next_t, expect):
    rate = RateControl(DcqcnParams.scaled(LINE, PAYLOAD), burst_s=0.004, nack_cuts=False)
    f = TxFlow(0, 1, 0.0, rate.start(0.0), PathTable(1, 1))
    assert f.dcqcn is not None
    f.dcqcn.rc, f.next_t = 1e6, next_t
    rate.on_sent(f, 1.0, 8000, 1000)
    assert f.next_t == pytest.approx(expect)


def test_the_scheduler_serves_peers_round_robin_one_packet_each_per_round():
    p = Parts(peers=3)
    for r in (1, 2, 3):
        p.post(r, 3 * PAYLOAD)
    p.sender.lookahead_s = 1.0                           # the port takes everything at once
    p.serve(0.0)
    assert [dst for dst, _, _ in p.sent()] == [1, 2, 3] * 3


def test_a_busy_port_holds_the_chosen_path_and_wakes_the_scheduler_when_it_is_free():
    p = Parts(planes=1, ports=4, entropy=SprayEntropy.name)
    p.post(1, 3 * PAYLOAD)
    wake = p.serve(0.0)
    f = p.tx[1]
    held = f.held_path
    assert f.psn == 1 and held is not None               # one packet; the next one's path waits for the port
    assert wake == pytest.approx((PAYLOAD + 70) * 8 / LINE, rel=0.05)
    p.serve(wake)
    assert f.psn == 2 and p.socks[held].sent[-1][0][4] == 1   # it took the path chosen for it


def test_a_flow_paced_below_line_rate_waits_for_its_pacer_while_the_port_is_free():
    p = Parts(peers=1, dcqcn=DcqcnParams.scaled(LINE, PAYLOAD))
    f = p.tx[1]
    assert f.dcqcn is not None
    f.dcqcn.rc = LINE / 4
    p.post(1, 4 * PAYLOAD)
    p.sender.lookahead_s = 0.0
    wake = p.serve(0.0)
    assert f.psn == 1
    assert wake == pytest.approx(f.next_t) and f.next_t > p.sender.nic_next[0]


def test_a_full_socket_buffer_is_backpressure_the_packet_leaves_later_and_nothing_counts_as_lost():
    p = Parts()
    p.post(1, 2 * PAYLOAD)
    p.socks[0].refuse(1, BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable"))
    wake = p.serve(0.0)
    f = p.tx[1]
    assert f.stats["send_blocked"] == 1
    assert (f.psn, f.unacked, f.stats["packets"], f.stats["send_refused"]) == (0, {}, 0, 0)
    assert f.held_path == 0 and wake > 0.0               # the port is busy for a packet time
    p.sender.lookahead_s = 1.0
    p.serve(wake)
    # the same packets, the path's sequence numbers unbroken: the receiver sees no loss
    assert p.sent() == [(1, 0, 1), (1, 1, 2)]
    assert (f.stats["packets"], f.stats["retransmissions"]) == (2, 0)


def test_a_resend_refused_by_a_full_buffer_stays_first_in_line_and_counts_once():
    p = Parts()
    p.post(1, 2 * PAYLOAD)
    p.sender.lookahead_s = 1.0
    p.serve(0.0)
    f = p.tx[1]
    f.requeue(0, "nack")
    p.socks[0].refuse(1, BlockingIOError(errno.EAGAIN, "full"))
    p.serve(1.0)
    assert list(f.retx) == [0] and f.stats["retransmissions"] == 0
    p.serve(2.0)
    assert p.sent()[-1] == (1, 0, 3) and f.stats["retransmissions"] == 1


def test_a_paused_port_sends_nothing_and_its_flow_resumes_on_the_path_it_chose_when_the_pause_ends():
    """Priority flow control: a NIC offers nothing of a paused priority; the flow's path choice waits
    (counted), the scheduler looks again soon, and nothing is counted sent or lost."""
    p = Parts(planes=2, ports=1, entropy=SprayEntropy.name)
    paused = {0}
    p.sender.paused = lambda plane: plane in paused
    p.post(1, 4 * PAYLOAD)
    p.sender.lookahead_s = 1.0
    f = p.tx[1]
    f.held_path = 0                                     # the choice fell on the paused port's path
    wake = p.serve(0.0)
    assert p.sent(0) == [] and f.stats["pause_waits"] >= 1 and f.held_path == 0
    assert 0.0 < wake <= 0.001 and f.stats["retransmissions"] == 0
    paused.clear()
    p.serve(wake)
    assert p.sent(0)[0][1] == 0 and f.stats["packets"] == 4   # the first packet left by the path it waited for


def test_a_pause_on_one_plane_leaves_the_other_planes_port_sending():
    p = Parts(peers=2, planes=2, ports=1, entropy=SprayEntropy.name)
    p.sender.paused = lambda plane: plane == 0
    for peer, path in ((1, 0), (2, 1)):
        p.post(peer, 2 * PAYLOAD)
        p.tx[peer].held_path = path
    p.sender.lookahead_s = 1.0
    p.serve(0.0)
    assert p.sent(0) == [] and p.tx[1].stats["pause_waits"] >= 1
    assert [dst for dst, _, _ in p.sent(1)][:1] == [2]


def test_a_packet_the_kernel_refuses_with_icmp_counts_as_sent_and_lost():
    p = Parts()
    p.post(1, PAYLOAD)
    p.socks[0].refuse(1, ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    p.serve(0.0)
    f = p.tx[1]
    assert (f.stats["send_refused"], f.stats["packets"], sorted(f.unacked)) == (1, 1, [0])
    assert f.pseq[0] == 1                                # its path number is spent: the receiver sees the gap


def test_a_port_that_cannot_send_takes_its_plane_out_of_every_flow_and_resends_at_once():
    p = Parts(peers=2, planes=2, ports=1, entropy=SprayEntropy.name)
    p.post(1, PAYLOAD)
    plane = p.policy.path(p.tx[1], 0)                    # one port per plane: path = plane
    p.socks[plane].refuse(1, OSError(errno.ENETUNREACH, "Network is unreachable"))
    p.serve(0.0)
    f = p.tx[1]
    assert f.stats["link_errors"] == 1
    assert all(g.paths.dead_planes() == {plane} for g in p.tx.values())
    assert (f.stats["failover_retx"], f.stats["retransmissions"]) == (1, 1)
    assert p.sent(1 - plane) == [(1, 0, 1)]              # the same packet, on the other plane


# ---- recovery ----------------------------------------------------------------------------

@pytest.mark.parametrize(("mode", "tail_probe", "expect"), [
    (GOBACKN, False, [3, 4, 5, 6]),
    (SELECTIVE, False, [3]),
    (SELECTIVE, True, [3, 6]),            # a one-path connection also re-sends its newest packet
])
def test_a_timeout_resends_the_oldest_packet_or_from_it_in_go_back_n(mode, tail_probe, expect):
    assert timeout_resends(mode, 3, 7, tail_probe) == expect


def test_a_tail_probe_is_not_sent_when_the_oldest_packet_is_the_newest():
    assert timeout_resends(SELECTIVE, 3, 4, True) == [3]


@pytest.mark.parametrize(("mode", "count", "expect"), [
    (GOBACKN, 2, [5, 6, 7, 8, 9]),
    (SELECTIVE, 2, [5, 6]),
    (SELECTIVE, 0, [5]),                  # at least the PSN named
    (SELECTIVE, 64, [5, 6, 7, 8, 9]),     # never past what was sent
])
def test_a_nack_resends_the_hole_or_everything_from_it_in_go_back_n(mode, count, expect):
    assert list(nack_resends(mode, 5, count, 10)) == expect


def test_the_timer_doubles_up_to_its_cap():
    assert backoff(0.02, 0.1) == 0.04 and backoff(0.08, 0.1) == 0.1


@pytest.mark.parametrize(("rtt", "ack_every", "expect"), [
    (1e-6, 1, 8),                         # at least 8
    (0.001, 8, 16),                       # 10 Mbit/s x 1 ms = 1.25 packets of 1000 B: ceil(6 x 1.25) + 8
    (1.0, 8, 64),                         # at most the window asked for
])
def test_the_window_is_a_few_bandwidth_delay_products_within_its_bounds(rtt, ack_every, expect):
    assert bdp_window(10e6, rtt, 1000, 6.0, ack_every, 64) == expect


def _in_flight(p: Parts, n: int) -> TxFlow:
    p.post(1, n * PAYLOAD)
    p.sender.lookahead_s = 1.0
    p.serve(0.0)
    return p.tx[1]


def test_a_cumulative_ack_completes_the_message_and_samples_the_rtt():
    p = Parts()
    f = _in_flight(p, 3)
    p.recovery.on_ack(f, 3, ts=1_000_000, path=0, now=1.002)       # echoed: sent at 1.0 s
    assert (f.una, f.unacked, f.done_msgs) == (3, {}, {0})
    assert f.srtt == pytest.approx(0.002) and f.rto == pytest.approx(0.01)   # min_rto_s
    assert f.window == bdp_window(LINE, 0.002, PAYLOAD + 70, 6.0, 8, 64)


def test_a_nack_acknowledges_what_is_before_it_and_queues_the_hole():
    p = Parts()
    f = _in_flight(p, 5)
    p.recovery.on_nack(f, 2, 2, 0, 0.01)
    assert f.una == 2 and list(f.retx) == [2, 3] and f.unacked[2][7] == "nack"


def test_go_back_n_resends_everything_from_the_nacked_packet_in_order():
    p = Parts(mode=GOBACKN)
    f = _in_flight(p, 5)
    f.requeue(4, "timeout")
    p.recovery.on_nack(f, 1, 1, 0, 0.01)
    assert list(f.retx) == [1, 2, 3, 4]


def test_a_path_loss_resends_only_the_packets_of_that_path_in_the_numbers_missing():
    p = Parts(planes=1, ports=2, entropy=SprayEntropy.name)
    f = _in_flight(p, 6)
    path, first = f.unacked[0][5], f.unacked[0][8]
    p.recovery.on_path_loss(f, path, first, 2, 0.01)
    on_path = [q for q in sorted(f.unacked) if f.unacked[q][5] == path]
    assert len(on_path) == 3 and list(f.retx) == on_path[:2]


@pytest.mark.parametrize(("hold", "paused", "expect"), [(True, True, True), (True, False, False),
                                                         (False, True, False), (False, False, False)])
def test_the_timer_stands_still_only_while_the_port_is_paused_and_holding_is_on(hold, paused, expect):
    assert timer_held(hold, paused) is expect


@pytest.mark.parametrize(("lossless", "floor", "expect"), [
    (False, 0.2, (0.04, 0.1)),               # a lossy fabric keeps its timer
    (True, None, (0.04, 0.1)),               # no floor asked
    (True, 0.2, (0.2, 0.2)),                 # lossless: the floor, and the cap no lower than it
    (True, 0.02, (0.04, 0.1)),               # a floor below the minimum changes nothing
])
def test_on_a_lossless_fabric_the_timer_is_at_least_the_lossless_floor(lossless, floor, expect):
    assert rto_bounds(0.04, 0.1, lossless, floor) == pytest.approx(expect)


def _paused_flow(hold: bool) -> tuple[Parts, TxFlow, list[bool]]:
    p = Parts()
    p.post(1, 3 * PAYLOAD)
    p.sender.lookahead_s = 1.0
    p.serve(1.0)                            # sent at 1.0 s
    f = p.tx[1]
    f.rto = 0.01                            # the timer due 10 ms after
    state = [True]
    p.recovery.paused = lambda plane: state[0]
    p.recovery.hold_in_pause = hold
    return p, f, state


def test_a_flow_whose_port_is_paused_past_its_timeout_resends_nothing_while_the_pause_lasts():
    p, f, _ = _paused_flow(hold=True)
    for now in (1.005, 1.02, 1.05, 1.2):
        p.recovery.on_timers([f], now)
    assert f.stats["timeouts"] == 0 and not f.retx


def test_once_the_pause_ends_the_timer_runs_a_whole_timeout_again_before_it_fires():
    p, f, state = _paused_flow(hold=True)
    p.recovery.on_timers([f], 1.2)
    state[0] = False
    p.recovery.on_timers([f], 1.205)
    assert f.stats["timeouts"] == 0
    p.recovery.on_timers([f], 1.2 + 0.011)
    assert f.stats["timeouts"] == 1 and f.retx[0] == 0


def test_without_holding_a_timeout_in_a_pause_fires_and_is_counted_as_fired_while_paused():
    p, f, _ = _paused_flow(hold=False)
    p.recovery.on_timers([f], 1.02)
    assert f.stats["timeouts"] == 1 and f.stats["timeouts_paused"] == 1 and f.retx[0] == 0


def test_repeated_timeouts_move_a_one_path_flow_and_resend_its_flight():
    p = Parts(planes=2, ports=1)
    f = _in_flight(p, 3)
    start = f.cur_path
    for k in range(2):
        now = 1.0 + k
        p.recovery.timeout(f, now)
    assert f.stats["migrations"] == 1 and f.cur_path != start and f.rto_streak == 0
    assert sorted(f.retx) == [0, 1, 2] and f.unacked[1][7] == "migrate"


# ---- rate control (DCQCN) ----------------------------------------------------------------

def _rated(nack_cuts: bool) -> tuple[RateControl, TxFlow]:
    rate = RateControl(DcqcnParams.scaled(LINE, PAYLOAD), burst_s=0.004, nack_cuts=nack_cuts)
    return rate, TxFlow(0, 1, 0.0, rate.start(0.0), PathTable(1, 1))


@pytest.mark.parametrize("nack_cuts", [True, False])
def test_a_nack_cuts_the_rate_only_where_nacks_cut(nack_cuts):
    rate, f = _rated(nack_cuts)
    assert f.dcqcn is not None
    rate.on_nack(f, 0.001)
    assert (f.dcqcn.rc < LINE) == nack_cuts and f.stats.get("loss_cuts", 0) == int(nack_cuts)


def test_path_losses_cut_the_rate_at_most_once_per_smoothed_rtt():
    rate, f = _rated(False)
    assert f.dcqcn is not None
    f.srtt = 0.01
    for now in (0.100, 0.105, 0.109):                   # one overflowing queue's run of drops
        rate.on_path_loss(f, now)
    rate.on_path_loss(f, 0.111)                          # a smoothed RTT after the first cut
    assert f.stats["loss_cuts"] == 2 and f.dcqcn.cuts == 2


def test_after_a_cnp_the_timers_raise_the_rate_again():
    rate, f = _rated(False)
    assert f.dcqcn is not None
    rate.on_cnp(f, 0.0)
    cut = f.dcqcn.rc
    rate.tick([f], 0.1)
    assert f.stats["cnps"] == 1 and cut < f.dcqcn.rc <= LINE


def test_without_dcqcn_a_flow_is_paced_by_its_port_alone():
    rate = RateControl(None, burst_s=0.004, nack_cuts=True)
    f = TxFlow(0, 1, 0.0, rate.start(0.0), PathTable(1, 1))
    rate.on_cnp(f, 0.0)
    rate.on_sent(f, 0.0, 8000, 1000)
    assert f.dcqcn is None and f.next_t == 0.0 and rate.cnp_interval_s == 50e-6


# ---- the receiver ------------------------------------------------------------------------

def _data(p: Parts, psn: int, now: float, *, path: int = 0, pseq: int | None = None, tos: int = 0,
          mid: int = 0, mlen: int = 100 * PAYLOAD, ts: int | None = None) -> None:
    pkt = HDR.pack(1, path, 1, 0, psn, mid, psn * PAYLOAD, mlen, ts if ts is not None else psn, 0) + bytes(PAYLOAD)
    p.receiver.on_data(p.rx[1], pkt, tos, path, psn, mid, psn * PAYLOAD, mlen, ts if ts is not None else psn,
                       now, 0, psn + 1 if pseq is None else pseq)


def _answers(p: Parts, typ: int) -> list[tuple]:
    return [a for a in p.answers if a[0] == typ]


def test_in_order_data_is_acknowledged_once_per_ack_every_packets():
    p = Parts()
    for psn in range(16):
        now = 1.0 + 1e-5 * psn                           # well within the ACK delay
        _data(p, psn, now)
        p.receiver.flush_acks(now)
    assert [a[4] for a in _answers(p, ACK)] == [8, 16]     # cumulative: everything before it


def test_a_delayed_ack_goes_out_once_its_delay_passed():
    p = Parts()
    _data(p, 0, 1.0)
    assert p.receiver.flush_acks(1.001) == pytest.approx(1.004) and not p.answers
    p.receiver.flush_acks(1.005)
    assert [a[4] for a in _answers(p, ACK)] == [1]


def test_a_completed_message_is_delivered_and_acknowledged_at_once():
    p = Parts()
    _data(p, 0, 1.0, mlen=PAYLOAD)
    p.receiver.flush_acks(1.0)
    assert len(p.rx[1].ready) == 1 and [a[4] for a in _answers(p, ACK)] == [1]


def test_on_a_one_path_connection_the_third_packet_past_a_hole_brings_a_nack_naming_it():
    p = Parts()
    _data(p, 0, 1.0)
    for psn in (2, 3):
        _data(p, psn, 1.001)
    assert not _answers(p, NACK)
    _data(p, 4, 1.002)
    [nack] = _answers(p, NACK)
    assert (nack[4], nack[5]) == (1, 1)                  # PSN 1, one packet


def test_a_ce_mark_is_answered_by_one_cnp_per_interval():
    p = Parts()
    for psn, now in enumerate((1.0, 1.0 + 10e-6, 1.0 + 60e-6)):
        _data(p, psn, now, tos=CE)
    assert len(_answers(p, CNP)) == 2 and p.rx[1].stats["ce_marks"] == 3


def test_a_jump_in_a_paths_sequence_is_reported_at_once_as_a_loss_on_that_path():
    p = Parts()
    _data(p, 0, 1.0, pseq=1)
    _data(p, 1, 1.001, pseq=4)                           # path numbers 2 and 3 never came
    [loss] = _answers(p, PATH_LOSS)
    assert (loss[3], loss[4], loss[5]) == (0, 2, 2)       # path 0, from number 2, two missing


def test_go_back_n_drops_an_out_of_order_packet_and_nacks_the_expected_one():
    p = Parts(mode=GOBACKN)
    _data(p, 0, 1.0)
    _data(p, 2, 1.001)
    assert p.rx[1].stats["dropped_out_of_order"] == 1 and not p.rx[1].ooo
    assert [(a[4], a[5]) for a in _answers(p, NACK)] == [(1, 1)]


def test_a_probe_is_reported_delivered_in_the_next_ack():
    p = Parts()
    p.receiver.on_probe(p.rx[1], 0, 3, 12345, 1.0)
    p.receiver.flush_acks(1.0)
    [ack] = _answers(p, ACK)
    assert report(3, 12345) in (ack[5], *ack[7])


@pytest.mark.parametrize(("beyond", "age", "lost"), [
    (3, 0.0, True),                       # the count: three packets past it
    (2, 1.0, False),                      # too few past it, however old
    (5, 0.0079, False),                   # on a sprayed connection (NO_COUNT): younger than the allowance
    (5, 0.008, True),                     # as old as the allowance
])
def test_a_hole_is_a_loss_by_its_count_or_its_age(beyond, age, lost):
    threshold = 3 if beyond == 3 else NO_COUNT
    assert hole_is_loss(beyond, age, threshold, 0.008) == lost


@pytest.mark.parametrize(("beyond", "threshold", "lost"), [(5, NO_COUNT, False), (3, 3, True)])
def test_on_a_lossless_fabric_a_hole_is_a_loss_by_its_count_never_by_its_age(beyond, threshold, lost):
    assert hole_is_loss(beyond, 10.0, threshold, 0.008, by_age=False) == lost


@pytest.mark.parametrize(("lossless", "nacked"), [(False, True), (True, False)])
def test_a_sprayed_hole_held_past_the_reordering_allowance_is_nacked_only_on_a_lossy_fabric(lossless, nacked):
    p = Parts(planes=1, ports=2, entropy=SprayEntropy.name)
    p.receiver.lossless = lossless
    p.rx[1].reorder_time = 0.008
    _data(p, 0, 1.0, path=0, pseq=1)
    for k, psn in enumerate(range(2, 8)):                # PSN 1 (path 0) is held behind a pause
        _data(p, psn, 1.0 + 0.1 * (k + 1), path=1, pseq=k + 1)
    assert bool(_answers(p, NACK)) == nacked and not _answers(p, PATH_LOSS)


def test_a_nack_names_the_missing_run_up_to_the_next_packet_received():
    assert hole_length(5, {8: None, 9: None}) == 3
    assert hole_length(5, {}) == 64


@given(st.integers(0, (1 << 32) - 1), st.integers(1, (1 << 31) - 1))
def test_a_send_timestamp_is_later_across_the_32_bit_wrap(ts, later):
    assert sent_after((ts + later) & 0xFFFFFFFF, ts) and not sent_after(ts, (ts + later) & 0xFFFFFFFF)


def test_an_ack_goes_at_once_on_completion_reordering_or_a_full_batch():
    assert ack_now(True, False, 1, 8) and ack_now(False, True, 1, 8) and ack_now(False, False, 8, 8)
    assert not ack_now(False, False, 7, 8)


def test_delivery_reports_are_taken_oldest_first_and_filled_with_no_report():
    reports = {2: 0x1000001, 5: 7}
    assert take_reports(reports, 3) == [report(2, 0x1000001), report(5, 7), NO_REPORT] and reports == {}


# ---- path choice -------------------------------------------------------------------------

def test_spraying_skips_a_dead_path_to_the_next_live_one():
    p = Parts(planes=2, ports=1, entropy=SprayEntropy.name)
    f = p.tx[1]
    first = p.failover.choose_path(f)
    f.paths.kill(first, 0.0, "test")
    assert p.failover.choose_path(f) != first


def test_a_one_path_flow_keeps_its_path_until_it_migrates():
    p = Parts(planes=2, ports=2)
    f = p.tx[1]
    path = p.failover.choose_path(f)
    f.seq += 5
    assert p.failover.choose_path(f) == path
    p.failover.migrate(f, 0.0)
    assert f.cur_path != path and p.failover.choose_path(f) == f.cur_path



# ---- the receiving sockets -----------------------------------------------------------------

def test_a_receiving_socket_that_is_not_read_counts_the_packets_its_full_buffer_dropped():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        rx.bind(("127.0.0.1", 0))
        assert socket_drops(rx) == 0
        for _ in range(200):
            tx.sendto(bytes(1000), rx.getsockname())
        assert socket_drops(rx) > 0
