"""The transports over loopback: bytes arrive complete and in order under loss, duplication
and reordering (a fault-injecting UDP relay between the ranks), the roce transport answers
CE marks with CNPs and a lower DCQCN rate, and spraying really changes the entropy.

Every roce run also checks the DCQCN invariant that holds whether or not the rate was cut
(:func:`assert_rate_follows_its_cuts`); the two branches are forced deterministically by
the relay (a CE mark on a chosen packet; no impairment with go-back-N, where only a CNP can
cut). No test here asserts a speed: those figures are in tools/bench/bench_transport.py."""
import errno
import random
import select
import socket
import threading
import time

import pytest
from support.ports import port_block

from hpnlab.fabric.routing.entropy import connection_values, first_high, lay_out
from hpnlab.fabric.transport import ENTROPIES, ENTROPY_POLICIES, PeerLost, TransportError, make
from hpnlab.fabric.transport.entropy import (
    AdaptiveEntropy,
    EcmpEntropy,
    FlowEntropy,
    FlowletEntropy,
    RepsEntropy,
    SprayEntropy,
)
from hpnlab.fabric.transport.relay import UdpRelay
from hpnlab.fabric.transport.roce import (
    ACK,
    CE,
    CNP,
    CONTROL_TOS,
    DATA,
    ECT0,
    HDR,
    NACK,
    Dcqcn,
    DcqcnParams,
    RoceTransport,
    path_gap,
)
from hpnlab.fabric.transport.tcp import EPHEMERAL, source_port

# held by this process (support.ports), so that runs in other checkouts on this machine bind other ports (17400-21399,
# clear of test_run_local's 22000s and the benchmarks' 23000s)
BASE = port_block(17400, 100, 40)


class Relay(UdpRelay):
    """UDP relay that impairs what it forwards: drop, duplicate, reorder (hold a packet and
    send it after the next one) and CE-mark (rewrite the ECN bits of the TOS byte), at random
    (``ce``) or exactly the ECT packets numbered in ``ce_packets`` (0 = the first); and drop
    the roce data packets whose PSNs are in ``drop_data``, the first time each comes through."""

    def __init__(self, listen, forward, *, drop=0.0, dup=0.0, reorder=0.0, ce=0.0, ce_packets=(), drop_data=(),
                 seed=1):
        super().__init__(listen, forward, recv_tos=True)
        self.p = dict(drop=drop, dup=dup, reorder=reorder, ce=ce)
        self.ce_packets = frozenset(ce_packets)
        self.drop_data = set(drop_data)
        self.rng = random.Random(seed)
        self.sources = set()
        self.counts = dict(forwarded=0, dropped=0, duplicated=0, reordered=0, marked=0, ect=0)
        self.tos_of: dict[int, set[int]] = {}      # roce packet type -> the TOS bytes it came with

    def _send(self, data, tos):
        self.tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        self.tx.sendto(data, self.forward)

    def run(self):
        held = None
        while not self.stop:
            r, _, _ = select.select([self.rx], [], [], 0.05)
            if not r:
                if held:
                    self._send(*held)
                    held = None
                continue
            data, anc, _, src = self.rx.recvmsg(65536, 64)
            self.sources.add(src)
            tos = anc[0][2][0] if anc else 0
            if data:
                self.tos_of.setdefault(data[0], set()).add(tos)
            ect_index = self.counts["ect"] if (tos & 3) == 2 else -1
            self.counts["ect"] += (tos & 3) == 2
            rnd = self.rng.random
            if self.drop_data:
                typ, _path, _src, _dst, psn, *_ = HDR.unpack_from(data)
                if typ == DATA and psn in self.drop_data:
                    self.drop_data.discard(psn)
                    self.counts["dropped"] += 1
                    continue
            if rnd() < self.p["drop"]:
                self.counts["dropped"] += 1
                continue
            if (tos & 3) and (rnd() < self.p["ce"] or ect_index in self.ce_packets):
                tos = (tos & ~3) | CE
                self.counts["marked"] += 1
            if held is None and rnd() < self.p["reorder"]:
                held = (data, tos)
                self.counts["reordered"] += 1
                continue
            self._send(data, tos)
            self.counts["forwarded"] += 1
            if rnd() < self.p["dup"]:
                self._send(data, tos)
                self.counts["duplicated"] += 1
            if held:
                self._send(*held)
                held = None


def _pair(kind, faults_fwd=None, faults_back=None, base=BASE, planes=1, **opts):
    """Two ranks (0 on 127.0.0.2, 1 on 127.0.0.3); rank 0's packets to rank 1 pass through
    a relay on 127.0.0.50 and rank 1's packets to rank 0 through one on 127.0.0.51."""
    real = [[f"127.0.{p}.2" for p in range(planes)], [f"127.0.{p}.3" for p in range(planes)]]
    relays = []
    view0 = [real[0], real[1]]
    view1 = [real[0], real[1]]
    if faults_fwd is not None:
        view0 = [real[0], [f"127.0.{p}.50" for p in range(planes)]]
        for p in range(planes):
            relays.append(Relay((f"127.0.{p}.50", base + 1), (real[1][p], base + 1), **faults_fwd))
    if faults_back is not None:
        view1 = [[f"127.0.{p}.51" for p in range(planes)], real[1]]
        for p in range(planes):
            relays.append(Relay((f"127.0.{p}.51", base), (real[0][p], base), seed=7, **faults_back))
    for r in relays:
        r.start()
    t0 = make(kind, 0, view0, base_port=base, **opts)
    t1 = make(kind, 1, view1, base_port=base, **opts)
    return t0, t1, relays


def _run_both(t0, t1, fn0, fn1):
    out, errors = {}, []
    # a roce endpoint only binds when it starts: bind both first, so that rank 0's first packet
    # cannot reach rank 1 before it listens (a tcp endpoint connects: each starts in its thread)
    bound = all(isinstance(t, RoceTransport) for t in (t0, t1))
    if bound:
        t1.start()
        t0.start()

    def wrap(key, t, fn):
        try:
            if not bound:
                t.start()
            out[key] = fn(t)
            t.close()              # a rank that is done keeps acknowledging for a while
        except Exception as exc:   # surfaced in the main thread below
            errors.append(exc)

    th = threading.Thread(target=wrap, args=(1, t1, fn1))
    th.start()
    wrap(0, t0, fn0)
    th.join(60)
    if errors:
        raise errors[0]
    return out


def _messages(seed, count=6):
    rng = random.Random(seed)
    sizes = [1, 1399, 1400, 5000, 40_000, 150_000][:count]
    return [bytes(rng.getrandbits(8) for _ in range(min(s, 2048))) * (s // 2048 + 1) for s in sizes]


def _send_all(msgs):
    def fn(t):
        for m in msgs:
            t.exchange([(1, m[: len(m)])], [])
        return t.flow_stats()
    return fn


def _recv_all(msgs):
    def fn(t):
        got = [bytes(t.exchange([], [(0, len(m))])[0]) for m in msgs]
        return got, t.flow_stats()
    return fn


def _close(*things):
    for t in things:
        t.close()


def _deliver(t0, t1, relays, msgs):
    """Rank 0 sends ``msgs`` to rank 1 (through ``relays``); everything is closed after.
    Returns ``_run_both``'s results: ``[0]`` rank 0's flow stats, ``[1]`` (what rank 1 got, its stats)."""
    try:
        return _run_both(t0, t1, _send_all(msgs), _recv_all(msgs))
    finally:
        _close(t0, t1, *relays)


def _tx(stats, dst=1):
    return next(f for f in stats if f["side"] == "tx" and f["dst"] == dst)


def _rx(stats, src=0):
    return next(f for f in stats if f["side"] == "rx" and f["src"] == src)


def assert_rate_follows_its_cuts(tx, line_bps, recovery="selective"):
    """What holds whether or not the rate was cut: every cut has a cause (a CNP, or with
    selective recovery a NACK: there is no PFC); a flow never cut ends at its line rate; a
    flow cut at least once ends between the DCQCN floor and below its line rate (the rate
    climbs back by halving the gap to its target, so it stays below line)."""
    causes = tx["cnps"] + (tx.get("loss_cuts", 0) if recovery == "selective" else 0)
    assert tx["rate_cuts"] == causes
    if tx["rate_cuts"] == 0:
        assert tx["final_rate_bps"] == line_bps
    else:
        assert DcqcnParams.scaled(line_bps).min_rate_bps <= tx["final_rate_bps"] < line_bps


@pytest.mark.parametrize("recovery", ["selective", "gobackn"])
def test_roce_delivers_every_byte_in_order_under_loss_duplication_and_reordering(recovery):
    faults = dict(drop=0.05, dup=0.05, reorder=0.15)
    t0, t1, relays = _pair("roce", faults, dict(drop=0.05, dup=0.05, reorder=0.1), base=BASE + 10,
                           line_rate_bps=100e6, recovery=recovery, min_rto_s=0.01)
    msgs = _messages(11)
    out = _deliver(t0, t1, relays, msgs)
    got, rx_stats = out[1]
    assert got == msgs
    tx, rx = _tx(out[0]), _rx(rx_stats)
    assert relays[0].counts["dropped"] > 0 and relays[0].counts["reordered"] > 0
    assert tx["retransmissions"] > 0
    assert rx["duplicates"] > 0
    assert_rate_follows_its_cuts(tx, 100e6, recovery)
    if recovery == "selective":
        assert rx["max_reorder"] > 0            # held in the reordering buffer
    else:
        assert rx["dropped_out_of_order"] > 0   # a go-back-N receiver discards them


def test_a_lost_tail_on_a_flow_connection_costs_one_timeout_not_one_per_packet():
    """The last 12 of a message's 40 data packets are dropped (once each): nothing follows them
    for the receiver to NACK from, so only the sender's timer can find them. The timeout re-sends
    the oldest and, as a tail-loss probe, the newest packet; the probe's arrival makes the
    receiver NACK the hole, and the rest of the tail follows at once (re-sending only the oldest
    took 12 timeouts, one per packet)."""
    t0, t1, relays = _pair("roce", dict(drop_data=range(28, 40)), None, base=BASE + 15, line_rate_bps=50e6,
                           min_rto_s=0.3, max_rto_s=0.6, entropy="flow")
    msgs = [bytes(random.Random(3).getrandbits(8) for _ in range(40 * t0.payload))]     # PSNs 0-39
    out = _deliver(t0, t1, relays, msgs)
    got, _ = out[1]
    assert got == msgs
    tx = _tx(out[0])
    assert relays[0].counts["dropped"] == 12 and tx["retransmissions"] >= 12 and tx["nacks"] > 0
    # one (the old sender took 12, one per packet); a second only if an ACK came 300 ms late: the
    # timer is set far above any delay a loaded machine adds, so the count is not a timing outcome
    assert tx["timeouts"] <= 2


def test_a_sprayed_packet_lost_mid_message_is_resent_on_its_paths_next_arrival_not_after_a_timeout():
    """Four paths, the receiver's reordering allowance, the sender's timer and its dead-path
    rule all 2 s: only the path sequence can find the drop. Packets on one path arrive in
    order, so the next one on the lost packet's path shows the gap, and the receiver names it
    (PATH_LOSS). (With the dead-path rule at its 5 ms floor, a loaded machine that delayed the
    ACKs past it had the path left and its flight re-sent: a failover, not this rule.)"""
    t0, t1, relays = _pair("roce", dict(drop_data={5, 17}), None, base=BASE + 24, line_rate_bps=50e6,
                           entropy="spray", ports_per_nic=4, reorder_time_s=2.0, min_rto_s=2.0, max_rto_s=2.0,
                           paths={"dead_floor_s": 2.0})
    msgs = [bytes(random.Random(5).getrandbits(8) for _ in range(40 * t0.payload))]
    start = time.monotonic()
    out = _deliver(t0, t1, relays, msgs)
    assert out[1][0] == msgs
    tx, rx = _tx(out[0]), _rx(out[1][1])
    assert relays[0].counts["dropped"] == 2
    assert tx["timeouts"] == 0 and tx["nacks"] == 0
    assert tx["path_losses"] == rx["path_losses_sent"] == 2 and tx["retransmissions"] == 2
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("last,pseq,missing", [
    (7, 8, 0), (7, 11, 3), (0xFFFF, 0, 0), (0xFFFE, 1, 2), (8, 8, None), (8, 7, None), (2, 0xFFF0, None)])
def test_the_path_gap_counts_missing_packets_across_the_16_bit_wrap(last, pseq, missing):
    assert path_gap(last, pseq) == missing


def test_a_duplicated_packet_is_not_a_path_loss():
    t0, t1, relays = _pair("roce", dict(dup=0.3), None, base=BASE + 27, line_rate_bps=50e6,
                           entropy="spray", ports_per_nic=4)
    msgs = [bytes(range(256)) * 400]
    out = _deliver(t0, t1, relays, msgs)
    assert out[1][0] == msgs
    assert relays[0].counts["duplicated"] > 0
    assert _rx(out[1][1])["path_losses_sent"] == 0


def test_roce_answers_ce_marks_with_cnps_and_lowers_its_rate():
    t0, t1, relays = _pair("roce", dict(ce=0.3), None, base=BASE + 20, line_rate_bps=50e6)
    msgs = [bytes(range(256)) * 800]     # 200 KB
    out = _deliver(t0, t1, relays, msgs)
    got, rx_stats = out[1]
    assert got == msgs
    tx, rx = _tx(out[0]), _rx(rx_stats)
    assert relays[0].counts["ect"] > 0            # data leaves as ECT(0)
    assert rx["ce_marks"] == relays[0].counts["marked"] > 0
    assert tx["cnps"] > 0 and tx["rate_cuts"] > 0
    assert_rate_follows_its_cuts(tx, 50e6)


def test_a_flow_that_is_never_marked_and_cannot_lose_ends_at_line_rate():
    """Go-back-N: a NACK does not cut the rate, so without CE marks nothing can cut it."""
    t0, t1, relays = _pair("roce", dict(), None, base=BASE + 30, line_rate_bps=50e6, recovery="gobackn")
    msgs = [bytes(range(256)) * 800]
    out = _deliver(t0, t1, relays, msgs)
    assert out[1][0] == msgs
    tx = _tx(out[0])
    assert relays[0].counts["marked"] == 0
    assert (tx["cnps"], tx["rate_cuts"]) == (0, 0)
    assert tx["final_rate_bps"] == 50e6
    assert_rate_follows_its_cuts(tx, 50e6, "gobackn")


def _rates_after_one_cut(line: float, g: float, periods: int = 8, steps: int = 60) -> set[float]:
    """Every rate DCQCN can end at after exactly one cut: alpha decays by (1 - g) per alpha
    period without a CNP (j periods before the CNP came), the cut is rc = line * (1 - alpha/2)
    with the target left at the line rate, and each increase event sets rc = (line + rc) / 2.
    Computed with the same floating-point operations as the reaction point, so membership is
    exact."""
    out = set()
    alpha = 1.0
    for _ in range(periods):
        rc = line * (1 - alpha / 2)
        for _ in range(steps):
            out.add(rc)
            rc = min(line, (line + rc) / 2)
        out.add(rc)
        alpha = (1 - g) * alpha
    return out


def test_one_ce_mark_cuts_the_rate_once_and_it_climbs_back_by_halving_the_gap():
    """DCQCN: the first CNP cuts the rate by alpha/2 (alpha starts at 1 and decays by 1 - g
    per alpha period until the CNP arrives: on a loaded machine the first CNP can take more
    than one period) and sets the target to the old rate, the line rate; every increase event
    after it sets rc = (target + rc) / 2. So the final rate is one of the few values that
    sequence can reach (exactly, in binary floating point), and below the line rate only
    if it never climbed all the way back."""
    line = 50e6
    t0, t1, relays = _pair("roce", dict(ce_packets={0}), None, base=BASE + 35, line_rate_bps=line,
                           recovery="gobackn")
    msgs = [bytes(range(256)) * 800]     # 200 KB: ~9 byte-counter events after the cut
    out = _deliver(t0, t1, relays, msgs)
    assert out[1][0] == msgs
    tx, rx = _tx(out[0]), _rx(out[1][1])
    assert relays[0].counts["marked"] == rx["ce_marks"] == 1
    assert tx["cnps"] == tx["rate_cuts"] == 1
    assert_rate_follows_its_cuts(tx, line, "gobackn")
    assert tx["final_rate_bps"] in _rates_after_one_cut(line, DcqcnParams.scaled(line).g)
    assert tx["final_rate_bps"] > line * 0.75           # it climbed back at least once


@pytest.mark.parametrize("entropy,paths", [(FlowEntropy.name, 1), (SprayEntropy.name, 2 * 4)])
def test_spray_uses_every_plane_and_source_port_while_flow_uses_one(entropy, paths):
    t0, t1, relays = _pair("roce", dict(), None, base=BASE + 40, planes=2, line_rate_bps=100e6,
                           entropy=entropy, ports_per_nic=4)
    msgs = [bytes(100_000)]
    try:
        _run_both(t0, t1, _send_all(msgs), _recv_all(msgs))
    finally:
        _close(t0, t1, *relays)
    sources = relays[0].sources | relays[1].sources
    data_sources = {s for s in sources if s[1] != BASE + 40}     # not the control port
    assert len(data_sources) == paths
    if entropy == SprayEntropy.name:
        assert {ip for ip, _ in data_sources} == {"127.0.0.2", "127.0.1.2"}


def test_roce_names_the_rank_that_never_answers():
    t = make("roce", 0, [["127.0.0.2"], ["127.0.0.3"]], base_port=BASE + 50, timeout_s=0.5)
    t.start()
    try:
        with pytest.raises(PeerLost, match=r"rank 1 \(127\.0\.0\.3\) stopped acknowledging"):
            t.exchange([(1, b"hello")], [])
    finally:
        t.close()


MAP = lay_out({(1, "up"): [2], (3, "down"): [2]})      # 2 bits: 4 distinct paths


def test_source_ports_are_bound_to_the_maps_entropy_values_one_per_distinct_path():
    t = RoceTransport(0, [["127.0.0.2", "127.0.1.2"], ["127.0.0.3", "127.0.1.3"]], base_port=BASE + 45,
             entropy=SprayEntropy.name, ports_per_nic=8, entropy_map=MAP.as_dict())
    t.start()
    try:
        info = t.info()
    finally:
        t.close(linger_s=0)
    assert info["ports_per_nic"] == MAP.path_count() == 4          # no two sockets of a plane on one path
    ports, values = info["source_ports"], info["entropy_values"]
    assert [p & (1 << MAP.width) - 1 for p in ports] == [MAP.low_bits(k) for k in values]
    for plane in range(2):
        assert sorted(values[plane * 4:(plane + 1) * 4]) == [0, 1, 2, 3]
    assert info["connection_values"][1] == [k for plane in range(2) for k in connection_values(MAP, 0, 1, plane, 4)]
    assert info["entropy_map"]["path_count"] == 4


def test_each_connection_binds_the_values_its_hash_gives_not_the_same_ones_for_every_peer():
    m = lay_out({(1, "up"): [16]})                     # 16 uplinks, 2 values per connection
    ips = [[f"127.0.2.{i + 2}"] for i in range(6)]
    t = RoceTransport(0, ips, base_port=BASE + 47, entropy=SprayEntropy.name, ports_per_nic=2, entropy_map=m)
    t.start()
    try:
        info = t.info()
        bound = {r: [s.getsockname()[1] & 0xF for s in f.socks] for r, f in t.tx.items()}
    finally:
        t.close(linger_s=0)
    want = {r: connection_values(m, 0, r, 0, 2) for r in range(1, 6)}
    assert info["connection_values"] == want
    assert bound == {r: [m.low_bits(k) for k in ks] for r, ks in want.items()}
    assert len({tuple(v) for v in want.values()}) > 1                  # peers do not all share two uplinks


def test_a_taken_source_port_moves_to_other_free_bits_of_the_same_path():
    ip = "127.0.0.2"
    m = lay_out({(1, "up"): [4]})
    taken = m.source_port(2, first_high(m, m.low_bits(2), 1))      # rank 1's first port for path 2
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    second = RoceTransport(1, [["127.0.0.3"], [ip]], base_port=BASE + 56, ports_per_nic=4, entropy_map=m)
    try:
        holder.bind((ip, taken))                          # someone else holds it on the same address
        sock, k = second.endpoint.entropy_socket(ip, 2)
        got = sock.getsockname()[1]
        sock.close()
    finally:
        holder.close()
        second.close(linger_s=0)
    assert k == 2 and got & 0b11 == taken & 0b11 == 2 and got != taken


@pytest.mark.parametrize("entropy", [FlowletEntropy.name, AdaptiveEntropy.name, RepsEntropy.name])
def test_flowlet_and_adaptive_deliver_every_byte_in_order_under_loss_and_marks(entropy):
    faults = dict(drop=0.03, reorder=0.1, ce=0.05)
    t0, t1, relays = _pair("roce", faults, dict(drop=0.03), base=BASE + 65, planes=2, line_rate_bps=100e6,
                           entropy=entropy, ports_per_nic=2, min_rto_s=0.01, flowlet_gap_us=300,
                           entropy_map=MAP.as_dict())
    msgs = _messages(13)
    out = _deliver(t0, t1, relays, msgs)
    got, _rx_stats = out[1]
    assert got == msgs
    tx = _tx(out[0])
    assert tx["retransmissions"] > 0 and tx["cnps"] > 0
    state = tx["entropy_policy"]
    if entropy == AdaptiveEntropy.name:
        assert state["marks"] > 0 and state["cut"] >= state["marks"] and len(state["weights"]) == 4
    elif entropy == RepsEntropy.name:
        assert state["recycled"] > 0 and state["marks"] > 0 and state["explored"] > 0
    else:
        assert state["flowlets"] > 2 and state["gap_us"] == 300          # 2: one per plane at the start


def test_entropy_names_are_the_keys_of_the_one_policy_table():
    assert tuple(ENTROPY_POLICIES) == ENTROPIES
    assert all(ENTROPY_POLICIES[name].name == name for name in ENTROPIES)
    assert {FlowEntropy.name, EcmpEntropy.name, FlowletEntropy.name, SprayEntropy.name,
            AdaptiveEntropy.name, RepsEntropy.name} == set(ENTROPIES)


def test_an_unknown_entropy_is_refused_naming_the_known_ones():
    with pytest.raises(TransportError, match=", ".join(ENTROPIES)):
        make("roce", 0, [["127.0.0.2"], ["127.0.0.3"]], entropy="rainbow")


def test_tcp_delivers_messages_in_order_between_two_ranks():
    t0, t1, _ = _pair("tcp", base=BASE + 60)
    msgs = _messages(5)
    try:
        out = _run_both(t0, t1, _send_all(msgs), _recv_all(msgs))
    finally:
        _close(t0, t1)
    assert out[1][0] == msgs
    assert out[0][0]["bytes"] >= sum(map(len, msgs))


@pytest.mark.parametrize("bit", [0, 1, 2])
def test_tcp_source_ports_spread_each_low_bit_as_a_five_tuple_hash_would(bit):
    # the kernel's connect() ports are all even: bit 0 would send every flow of a host one way
    ports = [source_port("10.0.0.1", f"10.{p}.{i}.9", 29500 + i) for p in range(2) for i in range(128)]
    ones = sum(port >> bit & 1 for port in ports)
    assert 0.35 < ones / len(ports) < 0.65
    assert all(EPHEMERAL[0] <= port < EPHEMERAL[1] for port in ports)


def test_a_tcp_source_port_is_the_same_for_the_same_connection_and_moves_with_the_attempt():
    assert source_port("10.0.0.1", "10.0.0.2", 29501) == source_port("10.0.0.1", "10.0.0.2", 29501)
    assert source_port("10.0.0.1", "10.0.0.2", 29501, 1) != source_port("10.0.0.1", "10.0.0.2", 29501)


def test_tcp_ranks_send_on_connections_they_opened_from_their_hashed_source_ports():
    t0, t1, _ = _pair("tcp", base=BASE + 80)
    msg = _messages(3)[4]

    def both_ways(t):
        peer = 1 - t.rank
        got = t.exchange([(peer, msg)], [(peer, len(msg))])[0]
        s = t.conns[peer].sock
        return bytes(got), s.getsockname()[1], s.getpeername()[1]

    out = _run_both(t0, t1, both_ways, both_ways)
    assert out[0][0] == msg and out[1][0] == msg
    assert (out[0][2], out[1][2]) == (BASE + 81, BASE + 80)     # each sends to the other's listener
    assert out[0][1] in {source_port("127.0.0.2", "127.0.0.3", BASE + 81, a) for a in range(64)}
    assert out[1][1] in {source_port("127.0.0.3", "127.0.0.2", BASE + 80, a) for a in range(64)}


def test_tcp_reports_a_peer_that_closes_mid_run():
    t0, t1, _ = _pair("tcp", base=BASE + 70, timeout_s=5)

    def quitter(t):
        t.close()
        return None

    with pytest.raises(PeerLost, match=r"rank 1 .* closed the connection"):
        _run_both(t0, t1, lambda t: t.exchange([], [(1, 10)]), quitter)
    t0.close()


# ---- DCQCN reaction point (pure) -----------------------------------------------------

def test_dcqcn_first_cnp_halves_the_rate_and_fast_recovery_climbs_back():
    p = DcqcnParams.scaled(10e6)
    d = Dcqcn(p, now=0.0)
    d.on_cnp(0.0)
    assert d.rc == pytest.approx(5e6)      # alpha starts at 1: rc * (1 - 1/2)
    assert d.rt == 10e6
    rates = []
    for k in range(1, 6):                  # five rate-timer events: halve the gap each time
        d.tick(k * p.rate_timer_s + 1e-9)
        rates.append(d.rc)
    assert rates == pytest.approx([10e6 - 5e6 / 2 ** i for i in range(1, 6)], rel=1e-6)


def test_dcqcn_climbs_back_to_exactly_the_line_rate_once_the_cnps_stop():
    """Each increase halves the gap to the target (the line rate after one cut): in binary
    floating point the gap reaches zero after at most 53 halvings (the mantissa's bits)."""
    p = DcqcnParams.scaled(10e6)
    d = Dcqcn(p, now=0.0)
    d.on_cnp(0.0)
    d.tick(60 * p.rate_timer_s + 1e-9)
    assert d.rc == d.rt == p.line_rate_bps


def test_dcqcn_alpha_decays_without_cnps_so_later_cuts_are_gentler():
    p = DcqcnParams.scaled(10e6)
    d = Dcqcn(p, now=0.0)
    d.on_cnp(0.0)
    a1 = d.alpha
    d.tick(200 * p.alpha_timer_s)
    assert d.alpha < a1
    before = d.rc
    d.on_cnp(200 * p.alpha_timer_s)
    assert d.rc > before * 0.5


def test_dcqcn_defaults_scale_with_the_link_rate():
    p = DcqcnParams.scaled(10e6)
    ref = DcqcnParams()
    assert p.rai_bps == pytest.approx(ref.rai_bps * 10e6 / 40e9)
    assert ref.rate_timer_s <= p.rate_timer_s <= 10e-3
    assert DcqcnParams.scaled(40e9) == ref


@pytest.mark.parametrize("kind", ["roce", "tcp"])
def test_background_sends_carry_the_data_as_posted_even_if_the_buffer_changes(kind):
    t0, t1, relays = _pair(kind, dict(drop=0.05) if kind == "roce" else None, None, base=BASE + 80,
                           **({"line_rate_bps": 100e6, "min_rto_s": 0.01} if kind == "roce" else {}))
    buf = bytearray(b"A" * 60_000)

    def sender(t):
        t.exchange([(1, buf)], [], wait_sends=False)     # returns before it is acknowledged
        buf[:] = b"B" * len(buf)                          # the next step reuses the buffer
        t.flush()
        return True

    def receiver(t):
        return bytes(t.exchange([], [(0, len(buf))])[0])

    try:
        out = _run_both(t0, t1, sender, receiver)
    finally:
        _close(t0, t1, *relays)
    assert out[1] == b"A" * 60_000


def test_control_packets_leave_with_dscp_48_and_data_with_dscp_26_and_ect():
    """ACKs, NACKs and CNPs are what a RoCE fabric queues ahead of data (``emulation.control_priority``
    classifies them by this DSCP); data goes in the lossless priority (DSCP 26), ECN-capable."""
    t0, t1, relays = _pair("roce", dict(drop=0.05, ce=0.2), {}, base=BASE + 86, line_rate_bps=50e6)
    fwd, back = relays
    msgs = [bytes(range(256)) * 400]
    out = _deliver(t0, t1, relays, msgs)
    assert out[1][0] == msgs
    assert fwd.tos_of[DATA] == {26 << 2 | ECT0}             # marked CE by the relay only after it read them
    assert back.tos_of[ACK] == {CONTROL_TOS} == {48 << 2}
    assert back.tos_of.get(NACK, {CONTROL_TOS}) == {CONTROL_TOS} and back.tos_of[CNP] == {CONTROL_TOS}


def test_a_loss_the_receiver_reports_cuts_the_rate_because_there_is_no_pfc():
    t0, t1, relays = _pair("roce", dict(drop=0.1), None, base=BASE + 90, line_rate_bps=50e6)
    msgs = [bytes(range(256)) * 800]
    out = _deliver(t0, t1, relays, msgs)
    assert out[1][0] == msgs
    tx = _tx(out[0])
    assert tx["path_losses"] + tx["nacks"] > 0
    assert 0 < tx["loss_cuts"] <= tx["path_losses"] + tx["nacks"]
    assert tx["cnps"] == 0 and tx["rate_cuts"] == tx["loss_cuts"]
    assert_rate_follows_its_cuts(tx, 50e6)


@pytest.mark.parametrize("entropy,cut", [(FlowEntropy.name, True), (SprayEntropy.name, False)])
def test_a_nack_cuts_the_rate_on_a_one_path_connection_only(entropy, cut):
    """On a sprayed connection a PSN hole past the reordering allowance may be a packet late on
    a slower path: it is re-sent, and only the path's own sequence numbers (PATH_LOSS) cut."""
    t0 = RoceTransport(0, [["127.0.0.2"], ["127.0.0.3"]], base_port=BASE + 93, line_rate_bps=50e6,
                       entropy=entropy)
    try:
        t0.start()
        f = t0.tx[1]
        assert f.dcqcn is not None
        t0.recovery.on_nack(f, 0, 1, 0, time.monotonic())
        assert f.stats["nacks"] == 1
        assert (f.stats.get("loss_cuts", 0), f.dcqcn.rc < 50e6) == ((1, True) if cut else (0, False))
    finally:
        t0.close(linger_s=0)


def test_tcp_reports_the_namespaces_ecn_and_congestion_control_as_the_kernel_has_them():
    t = make("tcp", 0, [["127.0.0.2"], ["127.0.0.3"]], base_port=BASE + 49)
    try:
        info = t.info()
    finally:
        t.close()
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as fh:
        assert info["tcp_congestion_control"] == fh.read().strip()
    with open("/proc/sys/net/ipv4/tcp_ecn") as fh:
        assert info["tcp_ecn"] == fh.read().strip()


def test_the_nic_serves_its_queue_pairs_round_robin_starting_past_the_rank_itself():
    from hpnlab.fabric.transport.roce import serve_order
    peers = [0, 1, 2, 4, 5, 6, 7]                       # rank 3's peers
    assert [peers[i] for i in serve_order(peers, after=3)] == [4, 5, 6, 7, 0, 1, 2]
    assert [peers[i] for i in serve_order(peers, after=5)] == [6, 7, 0, 1, 2, 4, 5]
    assert [peers[i] for i in serve_order(peers, after=7)] == peers
    # every rank of an all-to-all starts with a different peer: a permutation, not an incast
    firsts = [[d for d in range(8) if d != r][serve_order([d for d in range(8) if d != r], r)[0]] for r in range(8)]
    assert sorted(firsts) == list(range(8))


def _receiver(entropy: str, base: int) -> RoceTransport:
    """Rank 0, started, for packets fed to it by hand from rank 1."""
    t = RoceTransport(0, [["127.0.0.2"], ["127.0.0.3"]], base_port=base, line_rate_bps=50e6, entropy=entropy)
    t.start()
    return t


def _arrive(t: RoceTransport, psn: int, now: float, ts: int, paths: int = 4) -> None:
    """Data packet ``psn`` of a 100-packet message from rank 1 arrives, sprayed over ``paths``
    paths in turn (each path's own sequence unbroken, so only the PSNs show the hole)."""
    mlen, size = 1000, 10
    data = HDR.pack(DATA, psn % paths, 1, 0, psn, 0, psn * size, mlen, ts, psn // paths + 1) + b"x" * size
    t.receiver.on_data(t.rx[1], data, 0, psn % paths, psn, 0, psn * size, mlen, ts, now, 0, psn // paths + 1)


def test_on_a_sprayed_connection_no_count_of_packets_past_a_hole_makes_it_a_loss():
    t = _receiver(SprayEntropy.name, BASE + 96)
    try:
        r, now = t.rx[1], time.monotonic()
        for psn in range(1, 71):                         # 70 packets past the hole, within the allowance
            _arrive(t, psn, now, ts=1000 + psn)
        assert r.stats["nacks_sent"] == 0
        _arrive(t, 0, now + 0.001, ts=1000)              # the late packet fills it
        assert r.expected == 71 and r.stats["nacks_sent"] == 0
    finally:
        t.close(linger_s=0)


def test_on_a_one_path_connection_three_packets_past_a_hole_make_it_a_loss():
    t = _receiver(FlowEntropy.name, BASE + 96)
    try:
        now = time.monotonic()
        for psn in range(1, 4):
            _arrive(t, psn, now, ts=1000 + psn, paths=1)
        assert t.rx[1].stats["nacks_sent"] == 1
    finally:
        t.close(linger_s=0)


def test_on_a_sprayed_connection_a_hole_older_than_the_reordering_allowance_is_nacked():
    t = _receiver(SprayEntropy.name, BASE + 96)
    try:
        r, now = t.rx[1], time.monotonic()
        for psn in range(1, 4):
            _arrive(t, psn, now, ts=1000 + psn)
        _arrive(t, 4, now + r.reorder_time * 0.9, ts=1004)
        assert r.stats["nacks_sent"] == 0
        _arrive(t, 5, now + r.reorder_time * 1.1, ts=1005)
        assert r.stats["nacks_sent"] == 1
    finally:
        t.close(linger_s=0)


def _two_holes():
    """A sprayed receiver that got PSNs 1, 3, 4 and 5 (holes at 0 and 2), all now: (transport,
    its flow from rank 1, now, the reordering allowance)."""
    t = _receiver(SprayEntropy.name, BASE + 96)
    r, now = t.rx[1], time.monotonic()
    for psn in (1, 3, 4, 5):
        _arrive(t, psn, now, ts=1000 + psn)
    return t, r, now, r.reorder_time


def test_after_a_re_send_fills_a_hole_the_next_is_as_old_as_the_first_packet_that_showed_it():
    """Two packets lost on a path (PSNs 0 and 2): once the first is re-sent and fills its hole,
    the second hole has been showing since packets 3-5 arrived, so it is NACKed at once, not
    timed again from zero (which left it to the sender's retransmission timer)."""
    t, r, now, allowance = _two_holes()
    try:
        assert r.stats["nacks_sent"] == 0
        _arrive(t, 0, now + 2 * allowance, ts=5000)      # PSN 0 re-sent (its timer), sent after the rest
        assert r.expected == 2
        assert r.stats["nacks_sent"] == 1 and r.last_nack[0] == 2
    finally:
        t.close(linger_s=0)


def test_after_a_late_first_copy_fills_a_hole_the_next_gets_a_reordering_allowance_of_its_own():
    """Sprayed packets on paths of unequal delay: holes that late first copies fill are
    reordering, so the next hole is timed afresh (NACKing it at once re-sent many packets that
    were only late, and cost the sprayed all-reduce up to a third of its busbw)."""
    t, r, now, allowance = _two_holes()
    try:
        _arrive(t, 0, now + 0.5 * allowance, ts=1000)    # PSN 0's first copy, late
        assert r.expected == 2 and r.stats["nacks_sent"] == 0
        _arrive(t, 6, now + 1.2 * allowance, ts=1006)     # 1.2 allowances after PSN 3 showed it
        assert r.stats["nacks_sent"] == 0
    finally:
        t.close(linger_s=0)


@pytest.mark.parametrize("late,widens", [(True, True), (False, False)])
def test_a_hole_filled_late_by_its_first_copy_widens_the_reordering_allowance_to_its_age(late, widens):
    """A hole filled by a packet sent before the one that showed it was late on a slower path;
    one filled by a packet sent after it was re-sent (a loss PATH_LOSS found), which says nothing
    of the paths' delays."""
    t = _receiver(SprayEntropy.name, BASE + 96)
    try:
        r, now = t.rx[1], time.monotonic()
        allowance = r.reorder_time
        for psn in range(1, 4):
            _arrive(t, psn, now, ts=1000 + psn)
        _arrive(t, 0, now + 4 * allowance, ts=1000 if late else 5000)
        assert r.expected == 4 and r.stats["nacks_sent"] == 0
        assert r.reorder_time == (pytest.approx(5 * allowance) if widens else allowance)
    finally:
        t.close(linger_s=0)


def _roce(addrs, **opts) -> RoceTransport:
    t = make("roce", 0, addrs, min_rto_s=0.01, **opts)
    assert isinstance(t, RoceTransport)
    return t


def _flow_with_path_rtts(t, rtts):
    from hpnlab.fabric.transport.paths import PathTable
    from hpnlab.fabric.transport.roce import TxFlow

    f = TxFlow(0, 1, 0.0, None, PathTable(t.planes, t.ports_per_nic, t.path_params))
    f.rto = 0.02                                   # the flow's own timer: fast paths' samples
    for path, rtt in rtts.items():
        for _ in range(30):
            f.paths.on_rtt(path, rtt)
    return f


def test_a_sprayed_packet_on_a_slow_path_waits_out_its_own_paths_timeout_not_the_flows():
    addrs = [["127.0.0.2", "127.0.1.2"], ["127.0.0.3", "127.0.1.3"]]
    t = _roce(addrs, entropy="spray", ports_per_nic=2)
    f = _flow_with_path_rtts(t, {0: 0.005, 3: 0.060})
    assert t.recovery.rto_of(f, 3) == pytest.approx(0.060, rel=0.02)       # the slow path's own srtt + 4 rttvar
    assert t.recovery.rto_of(f, 0) == 0.02                                  # never below the flow's
    assert t.recovery.rto_of(f, 1) == 0.02                                  # a path without samples: the flow's
    off = _roce(addrs, entropy="spray", ports_per_nic=2, paths={"path_rto": False})
    assert off.recovery.rto_of(_flow_with_path_rtts(off, {3: 0.060}), 3) == 0.02


def test_a_one_path_connection_keeps_the_flows_timeout():
    t = _roce([["127.0.0.2"], ["127.0.0.3"]], entropy="flow")
    assert t.recovery.rto_of(_flow_with_path_rtts(t, {0: 0.060}), 0) == 0.02


class _FullBuffer:
    """A sending socket whose buffer is full on every ``every``-th send (EAGAIN), as a socket
    is when the port below it cannot drain (a paused priority, a slow qdisc)."""

    def __init__(self, real, every: int = 3):
        self.real, self.every, self.calls = real, every, 0

    def sendmsg(self, *args):
        self.calls += 1
        if self.calls % self.every == 0:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return self.real.sendmsg(*args)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_full_socket_buffer_holds_packets_back_without_a_loss_or_a_rate_cut():
    """Before 2026-12-07: a full buffer counted the packet as sent and lost (``send_refused``): the
    receiver saw its path's sequence jump and reported a loss, which cut the rate."""
    t0, t1, _ = _pair("roce", base=BASE + 98, line_rate_bps=100e6, entropy="flow")
    msgs = _messages(13)

    def send(t):
        t.tx_socks[:] = [_FullBuffer(s) for s in t.tx_socks]     # in place: the flows share this list
        return _send_all(msgs)(t)
    try:
        out = _run_both(t0, t1, send, _recv_all(msgs))
    finally:
        _close(t0, t1)
    got, rx_stats = out[1]
    tx, rx = _tx(out[0]), _rx(rx_stats)
    assert got == msgs
    assert tx["send_blocked"] > 0 and tx["send_refused"] == 0
    assert (tx["path_losses"], rx["path_losses_sent"], tx.get("loss_cuts", 0)) == (0, 0, 0)
