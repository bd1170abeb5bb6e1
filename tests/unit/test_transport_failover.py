"""Host-side failover of the roce transport over loopback, with real sockets.

Two ranks talk through one UDP relay per plane and direction (as in test_transport.py). A
relay forwards everything except what comes from the *blocked* source addresses (a sending
socket is one path: one source port of one plane), or everything while ``down``; a failure
starts when a chosen source has had ``fail_after`` data packets forwarded, and a repair when
``repair_after_probes`` probes from it were dropped (hpnlab.fabric.transport.relay). The
relay parses each packet's header and logs it, so the tests check causally what the transport
did: no data leaves on a path after the moment the transport itself logged it dead (the
header's send timestamp), no ACK carries an echo of data sent after its plane was found dead,
and so on. No test asserts a speed.
"""
import errno
import threading
import time

from support.ports import port_block

from hpnlab.fabric.transport import make
from hpnlab.fabric.transport.accounting import exactly_once
from hpnlab.fabric.transport.relay import PathRelay
from hpnlab.fabric.transport.roce import ACK, DATA

# per process; clear of test_transport (17400s), run_local (22000s) and the benchmarks (23000-24999)
BASE = port_block(25000, 27, 40)
MSG = 12_000
US = 1 << 32


def _pair(base, planes=1, ports=4, rank1=None, **opts):
    """Rank 0 on 127.0.p.2, rank 1 on 127.0.p.3; every packet between them crosses a relay:
    fwd[p] (rank 0 -> 1, on 127.0.p.50) and back[p] (rank 1 -> 0, on 127.0.p.51). ``rank1``:
    options for rank 1 only."""
    fwd = [PathRelay((f"127.0.{p}.50", base + 1), (f"127.0.{p}.3", base + 1)) for p in range(planes)]
    back = [PathRelay((f"127.0.{p}.51", base), (f"127.0.{p}.2", base)) for p in range(planes)]
    for r in fwd + back:
        r.start()
    a0 = [f"127.0.{p}.2" for p in range(planes)]
    a1 = [f"127.0.{p}.3" for p in range(planes)]
    opts.setdefault("line_rate_bps", 100e6)
    t0 = make("roce", 0, [a0, [f"127.0.{p}.50" for p in range(planes)]], base_port=base, ports_per_nic=ports, **opts)
    t1 = make("roce", 1, [[f"127.0.{p}.51" for p in range(planes)], a1], base_port=base, ports_per_nic=ports,
              **{**opts, **(rank1 or {})})
    t0.start()
    t1.start()
    return t0, t1, fwd, back


def _run(t0, t1, fn0, fn1, relays):
    out, errors = {}, []

    def wrap(key, t, fn):
        try:
            out[key] = fn(t)
            t.close(linger_s=1.0, quiet_s=0.2)
        except Exception as exc:
            errors.append(exc)

    th = threading.Thread(target=wrap, args=(1, t1, fn1))
    th.start()
    try:
        wrap(0, t0, fn0)
        th.join(30)
    finally:
        for r in relays:
            r.close()
    if errors:
        raise errors[0]
    return out


def _stream(until, limit=400):
    """A sender of MSG-byte messages (byte 0: 1 on the last) until ``until()`` or ``limit``."""
    def fn(t):
        sent = []
        for i in range(limit):
            last = until() or i == limit - 1
            m = bytes([1 if last else 0]) + bytes((i + k) % 251 for k in range(MSG - 1))
            t.exchange([(1, m)], [])
            sent.append(m)
            if last:
                break
        return sent, t.flow_stats()
    return fn


def _sink(t):
    got = []
    while True:
        m = bytes(t.exchange([], [(0, MSG)])[0])
        got.append(m)
        if m[0] == 1:
            return got, t.flow_stats()


def _flow(stats, side, src, dst):
    return next(f for f in stats if f["side"] == side and f["src"] == src and f["dst"] == dst)


def _merged(tx_stats, rx_stats, src=0, dst=1):
    return {**_flow(tx_stats, "tx", src, dst), **_flow(rx_stats, "rx", src, dst)}


def _mono_us(t, wall):
    """A wall-clock event time of transport ``t`` as its header timestamp (us, 32 bits)."""
    return int((wall - t.wall_offset) * 1e6) % US


def _after(ts, ref_us):
    """True if header timestamp ``ts`` is later than ``ref_us`` (32-bit us clock arithmetic)."""
    return 0 < (ts - ref_us) % US < US // 2


def _events(stats, what):
    return [(t, idx) for t, w, idx in stats["paths"]["events"] if w == what]


# No NACKs (a hole is never called a loss) and a timeout later than any run here: what is
# lost on a dead path can only be recovered by the failover re-send.
NO_NACK_NO_RTO = dict(reorder_threshold=10**6, reorder_time_s=10.0, min_rto_s=2.0, max_rto_s=2.0)
# Ranks and relays are threads of one process here, and the machine is shared: a relay can
# stall for several milliseconds, which the 5 ms default would rightly call a dead path. The
# tests that name exactly which paths die give a path 20 ms.
SLOW_FLOOR = dict(dead_floor_s=0.02)


def test_a_dead_path_is_left_its_in_flight_packets_resent_at_once_and_it_comes_back_after_repair():
    t0, t1, fwd, back = _pair(BASE, planes=1, ports=4, entropy="spray",
                              paths=dict(probe_interval_s=0.04, **SLOW_FLOOR), **NO_NACK_NO_RTO)
    bad = t0.tx_socks[2].getsockname()
    fwd[0].fail(bad, after=20, repair_after_probes=2)
    back_on_path = []

    def repaired_and_used():
        alive = [e for e in t0.tx[1].paths.events if e[1] == "alive"]
        if alive:
            back_on_path.append(any(s == bad and typ == DATA and not drop for s, typ, *_, drop in fwd[0].log[-40:]))
        return bool(back_on_path) and back_on_path[-1]

    out = _run(t0, t1, _stream(repaired_and_used), _sink, fwd + back)
    (sent, tx_stats), (got, rx_stats) = out[0], out[1]
    assert got == sent
    tx = _flow(tx_stats, "tx", 0, 1)
    assert exactly_once(_merged(tx_stats, rx_stats)) is True
    assert _events(tx, "dead") == [(_events(tx, "dead")[0][0], 2)]          # that path, and only it
    t_dead = _mono_us(t0, _events(tx, "dead")[0][0])
    t_alive = _mono_us(t0, _events(tx, "alive")[0][0])
    data_on_bad = [(ts, drop) for s, typ, _p, _psn, ts, drop in fwd[0].log if s == bad and typ == DATA]
    assert any(drop for _, drop in data_on_bad)                            # the failure bit
    first_lost = next(ts for ts, drop in data_on_bad if drop)
    assert _after(t_dead, (first_lost + int(t0.path_params.dead_floor_s * 1e6)) % US)   # never early
    assert not any(_after(ts, t_dead) and not _after(ts, t_alive) for ts, _ in data_on_bad)
    assert any(_after(ts, t_alive) and not drop for ts, drop in data_on_bad)   # traffic came back
    assert tx["timeouts"] == 0 and tx["nacks"] == 0
    assert tx["failover_retx"] > 0
    assert sum(n for *_, n, why in tx["retx_bursts"] if "failover" in why) >= tx["failover_retx"]
    assert tx["probes"] >= 3 and tx["paths"]["dead_now"] == []


def test_a_whole_plane_that_stops_delivering_is_avoided():
    t0, t1, fwd, back = _pair(BASE + 3, planes=2, ports=2, entropy="spray", paths=SLOW_FLOOR, **NO_NACK_NO_RTO)
    done = []

    def plane_dead():
        if 1 in t0.tx[1].paths.dead_planes():
            done.append(len(fwd[1].log))
        return len(done) > 5

    fwd[1].fail(t0.tx_socks[2].getsockname(), after=10, whole=True)   # once plane 1 carried data
    out = _run(t0, t1, _stream(plane_dead), _sink, fwd + back)
    (sent, tx_stats), (got, rx_stats) = out[0], out[1]
    assert got == sent and exactly_once(_merged(tx_stats, rx_stats)) is True
    tx = _flow(tx_stats, "tx", 0, 1)
    dead = _events(tx, "dead")
    # both of the plane's paths, each maybe twice: on a loaded machine a starved receiver can get a
    # live path found dead before the plane fails; its probe brings it back, and it dies with the plane
    assert {idx for _, idx in dead} == {2, 3}
    t_plane = _mono_us(t0, max(t for t, _ in dead))
    assert not any(typ == DATA and _after(ts, t_plane) for _s, typ, _p, _psn, ts, _d in fwd[1].log)
    assert tx["timeouts"] == 0 and tx["failover_retx"] > 0


def test_a_plane_that_stops_delivering_is_found_dead_even_when_timeouts_fire_faster_than_the_dead_limit():
    # the timer (5-10 ms) fires well inside the 20 ms dead limit, again and again: a timeout
    # restarts the timer, not the send times the dead-path rule judges the plane's packets by
    t0, t1, fwd, back = _pair(BASE + 24, planes=2, ports=2, entropy="spray", paths=SLOW_FLOOR,
                              reorder_threshold=10**6, reorder_time_s=10.0, min_rto_s=0.005, max_rto_s=0.01)
    done = []

    def plane_dead():
        if 1 in t0.tx[1].paths.dead_planes():
            done.append(len(fwd[1].log))
        return len(done) > 5

    fwd[1].fail(t0.tx_socks[2].getsockname(), after=10, whole=True)
    out = _run(t0, t1, _stream(plane_dead), _sink, fwd + back)
    (sent, tx_stats), (got, rx_stats) = out[0], out[1]
    assert got == sent and exactly_once(_merged(tx_stats, rx_stats)) is True
    tx = _flow(tx_stats, "tx", 0, 1)
    assert {idx for _, idx in _events(tx, "dead")} == {2, 3}     # each maybe twice on a loaded machine (above)
    assert tx["timeouts"] > 0                  # the timer did fire before the plane was found dead


def test_a_flow_entropy_connection_migrates_to_another_plane_and_port_after_two_timeouts():
    t0, t1, fwd, back = _pair(BASE + 6, planes=2, ports=2, entropy="flow", min_rto_s=0.01, max_rto_s=0.02,
                              paths=dict(migrate_after_rtos=2))
    names = [s.getsockname() for s in t0.tx_socks]
    first = names[t0.policy.path(t0.tx[1], 0)]
    fwd[first[0] == "127.0.1.2"].fail(first, after=15)
    out = _run(t0, t1, _stream(lambda: t0.tx[1].stats["migrations"] > 0 and t0.tx[1].una > t0.tx[1].psn - 2,
                               limit=200), _sink, fwd + back)
    (sent, tx_stats), (got, rx_stats) = out[0], out[1]
    assert got == sent and exactly_once(_merged(tx_stats, rx_stats)) is True
    tx = _flow(tx_stats, "tx", 0, 1)
    assert tx["migrations"] == 1
    [(_, old)] = _events(tx, "migrated_from")
    [(_, new)] = _events(tx, "migrated_to")
    assert names[old] == first
    assert new // 2 != old // 2 and names[new][1] != first[1]      # another plane, another port
    assert tx["timeouts"] >= 2                                    # the rule: two, then a new path
    sources = {s for r in fwd for s, typ, *_ in r.log if typ == DATA}
    assert sources == {first, names[new]}


def test_a_single_path_flow_migrates_to_a_new_source_port():
    t0, t1, fwd, back = _pair(BASE + 9, planes=1, ports=1, entropy="flow", min_rto_s=0.01, max_rto_s=0.02)
    first = t0.tx_socks[0].getsockname()
    fwd[0].fail(first, after=15)
    out = _run(t0, t1, _stream(lambda: t0.tx[1].stats["migrations"] > 0, limit=100), _sink, fwd + back)
    (sent, tx_stats), (got, rx_stats) = out[0], out[1]
    assert got == sent and exactly_once(_merged(tx_stats, rx_stats)) is True
    sources = {s for s, typ, *_ in fwd[0].log if typ == DATA}
    assert len(sources) == 2 and first in sources
    assert {ip for ip, _ in sources} == {first[0]}


def test_acks_avoid_a_plane_the_receiver_cannot_send_on_even_while_data_still_arrives_on_it():
    """A gray failure one way: plane 1 carries rank 0's packets to rank 1 but drops all of
    rank 1's. Both ranks send to each other. Rank 1 finds plane 1 dead for its own data, and
    from then on answers rank 0 on plane 0 although rank 0's data keeps arriving on plane 1."""
    t0, t1, fwd, back = _pair(BASE + 12, planes=2, ports=2, entropy="spray", paths=SLOW_FLOOR)
    back[1].fail(t1.tx_socks[2].getsockname(), after=5, whole=True)
    rounds = 60

    def both(t):
        peer = 1 - t.rank
        got = []
        for i in range(rounds):
            m = bytes((i + k + t.rank) % 251 for k in range(MSG))
            got.append(bytes(t.exchange([(peer, m)], [(peer, MSG)])[0]))
        return got, t.flow_stats()

    out = _run(t0, t1, both, both, fwd + back)
    (got0, s0), (got1, s1) = out[0], out[1]
    assert got1 == [bytes((i + k) % 251 for k in range(MSG)) for i in range(rounds)]
    assert got0 == [bytes((i + k + 1) % 251 for k in range(MSG)) for i in range(rounds)]
    assert exactly_once(_merged(s0, s1, 0, 1)) and exactly_once(_merged(s1, s0, 1, 0))
    tx1 = _flow(s1, "tx", 1, 0)
    assert 1 in {idx // 2 for _, idx in _events(tx1, "dead")}
    t_plane = max(t for t, idx in _events(tx1, "dead") if idx // 2 == 1)
    ref = _mono_us(t0, t_plane)       # the same clock: rank 0 stamps its data, rank 1 echoes it
    acks_lost = [ts for _s, typ, _p, _psn, ts, drop in back[1].log if typ == ACK and drop]
    assert not any(_after(ts, ref) for ts in acks_lost)
    data_on_1 = [ts for _s, typ, _p, _psn, ts, _d in fwd[1].log if typ == DATA]
    assert any(_after(ts, ref) for ts in data_on_1)         # rank 0's data still came that way


class _PortDown:
    """A sending socket whose NIC port went down: the kernel refuses every send."""

    def __init__(self, real):
        self.real = real

    def sendmsg(self, *args):
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

    def sendto(self, *args):
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

    def getsockname(self):
        return self.real.getsockname()

    def close(self):
        self.real.close()


def test_a_nic_port_the_kernel_refuses_to_send_on_takes_its_plane_out_at_once():
    t0, t1, fwd, back = _pair(BASE + 15, planes=2, ports=2, entropy="spray", paths=SLOW_FLOOR, **NO_NACK_NO_RTO)
    t0.tx_socks[2:4] = [_PortDown(s) for s in t0.tx_socks[2:4]]
    msgs = [bytes((i + k) % 251 for k in range(MSG)) for i in range(5)]

    def send(t):
        for m in msgs:
            t.exchange([(1, m)], [])
        return t.flow_stats()

    def recv(t):
        return [bytes(t.exchange([], [(0, MSG)])[0]) for _ in msgs], t.flow_stats()

    out = _run(t0, t1, send, recv, fwd + back)
    tx = _flow(out[0], "tx", 0, 1)
    assert out[1][0] == msgs and exactly_once(_merged(out[0], out[1][1])) is True
    assert [(w, idx) for _, w, idx in tx["paths"]["events"]][:1] == [("plane_down", 1)]
    assert tx["link_errors"] >= 1 and tx["timeouts"] == 0
    assert tx["failover_retx"] >= 1                 # the refused packet went out on plane 0 at once


def _port1_down_then_up(link, fwd, back):
    """A sender of MSG-byte messages during which plane 1's port (``link["port1"]``, and the
    relays of plane 1) goes down at message 10 and comes back at 30; it stops once data
    crossed plane 1 again and its own watch, if it has one, saw the port up. (The receiver watches the same
    port and may tell the sender of the plane first: before 2026-12-04 the sender could stop
    before its own watch had polled, and the test failed now and then under load.) Returns
    (sent, flow_stats, info)."""
    sent_up = []

    def script(t):
        out = []
        for i in range(400):
            if i == 10:                      # the port goes down: nothing crosses plane 1
                fwd[1].down = back[1].down = True
                link["port1"] = False
            if i == 30:
                link["port1"] = True
                fwd[1].down = back[1].down = False
                sent_up.append(len(fwd[1].log))
            watch = t.failover
            last = (i >= 30 and any(typ == DATA for _s, typ, *_ in fwd[1].log[sent_up[0]:])
                    and (not watch.nics or any(what == "up" for _t, _p, what in watch.link_events))) or i == 399
            m = bytes([1 if last else 0]) + bytes((i + k) % 251 for k in range(MSG - 1))
            t.exchange([(1, m)], [])
            out.append(m)
            if last:
                return out, t.flow_stats(), t.info()
        raise AssertionError("unreachable")
    return script


def test_a_nic_port_whose_link_goes_down_takes_its_plane_out_and_brings_it_back_when_up():
    """The transport watches each plane's port (here two named ports whose state the test
    sets: the kernel's answer to SIOCGIFFLAGS); plane 1's port goes down mid-stream, then up."""
    link = {"port0": True, "port1": True}
    t0, t1, fwd, back = _pair(BASE + 18, planes=2, ports=2, entropy="spray", nic_names=["port0", "port1"],
                              link_state=link.get, paths=SLOW_FLOOR, **NO_NACK_NO_RTO)
    out = _run(t0, t1, _port1_down_then_up(link, fwd, back), _sink, fwd + back)
    (sent, tx_stats, info), (got, rx_stats) = out[0], out[1]
    assert got == sent and exactly_once(_merged(tx_stats, rx_stats)) is True
    assert [(p, what) for _, p, what in info["link_events"]] == [(1, "down"), (1, "up")]
    tx = _flow(tx_stats, "tx", 0, 1)
    kinds = [(w, idx) for _, w, idx in tx["paths"]["events"]]
    # both ends watch the one link: whichever saw it down first took the plane out
    assert kinds[0] in (("plane_down", 1), ("peer_plane_down", 1)) and {("alive", 2), ("alive", 3)} <= set(kinds)
    t_down = _mono_us(t0, info["link_events"][0][0])
    # back when this rank saw its port up, or earlier, when a probe got through (the peer,
    # watching its own end of the link, may see it up first and say so)
    t_up = _mono_us(t0, min(info["link_events"][1][0], _events(tx, "alive")[0][0]))
    on_1 = [ts for _s, typ, _p, _psn, ts, _d in fwd[1].log if typ == DATA]
    assert not any(_after(ts, t_down) and not _after(ts, t_up) for ts in on_1)
    assert any(_after(ts, t_up) for ts in on_1)
    assert tx["timeouts"] == 0



def test_a_receiver_whose_port_goes_down_tells_its_sender_which_leaves_the_plane_and_probes_it_when_told_it_is_back():
    """Only the receiver watches its ports here (the sender's are fine), and the sender's
    dead-path rule and timer cannot fire within the run: the sender leaves the plane, and
    comes back to it, on the receiver's word alone (PLANE notices)."""
    link = {"port0": True, "port1": True}
    never = dict(dead_floor_s=60.0, probe_interval_s=60.0)
    t0, t1, fwd, back = _pair(BASE, planes=2, ports=2, entropy="spray", paths=never,
                              rank1=dict(nic_names=["port0", "port1"], link_state=link.get), **NO_NACK_NO_RTO)
    out = _run(t0, t1, _port1_down_then_up(link, fwd, back), _sink, fwd + back)
    (sent, tx_stats, _info), (got, rx_stats) = out[0], out[1]
    assert got == sent and exactly_once(_merged(tx_stats, rx_stats)) is True
    tx = _flow(tx_stats, "tx", 0, 1)
    kinds = [(w, idx) for _, w, idx in tx["paths"]["events"]]
    assert kinds[0] == ("peer_plane_down", 1) and {("alive", 2), ("alive", 3)} <= set(kinds)
    assert tx["plane_notices"] == 2 and tx["timeouts"] == 0
    t_down = _mono_us(t0, tx["paths"]["events"][0][0])
    on_1 = [ts for _s, typ, _p, _psn, ts, _d in fwd[1].log if typ == DATA]
    assert not any(_after(ts, t_down) and not _after(ts, _mono_us(t0, _events(tx, "alive")[0][0])) for ts in on_1)
    # what plane 1 lost before the notice came back by the failover re-send alone (NACKs and the timer
    # are off); whether anything was in flight when the port went down is timing, so not asserted
    lost_on_1 = [e for e in fwd[1].log if e[1] == DATA and e[5]]
    assert tx["failover_retx"] > 0 or not lost_on_1


def test_a_pause_between_messages_is_an_idle_gap_not_a_stall():
    """The loss window and the stall count only gaps while the flow had data under way: the
    wait before a new message (a collective's step) ends with that message's first packet,
    which must not make the wait look busy."""
    t0, t1, fwd, back = _pair(BASE + 3, planes=1, ports=1, entropy="flow")

    def two_with_a_pause(t):
        sent = []
        for i in (0, 1):
            if i:
                time.sleep(0.06)
            m = bytes([i]) + bytes((i + k) % 251 for k in range(MSG - 1))
            t.exchange([(1, m)], [])
            sent.append(m)
        return sent, t.flow_stats()

    out = _run(t0, t1, two_with_a_pause, _sink, fwd + back)
    (sent, _tx_stats), (got, rx_stats) = out[0], out[1]
    assert got == sent
    rx = _flow(rx_stats, "rx", 0, 1)
    for kind in ("gaps", "hol_gaps"):
        pauses = [g for g in rx[kind] if g[1] - g[0] >= 0.05]
        assert len(pauses) == 1 and pauses[0][4] is False, (kind, rx[kind])


def test_a_receiver_that_sees_its_port_go_down_answers_again_at_once_on_a_live_plane():
    """Answers sent on a plane between its port going down and the receiver's next look at its
    ports are lost; a sender that waits for them (nothing more to send) would wait for its
    timeout. So a receiver that sees the port down owes the peer a fresh ACK, on another plane."""
    link = {"port0": True, "port1": True}
    t0, t1, fwd, back = _pair(BASE + 21, planes=2, ports=1, entropy="spray", nic_names=["port0", "port1"],
                              link_state=link.get, **NO_NACK_NO_RTO)
    try:
        r = t1.rx[0]
        r.plane, r.expected, r.ack_due = 1, 7, False        # its last answers went out on plane 1,
        r.plane_t = [time.monotonic() - 0.001] * 2           # where data came a moment ago, as on plane 0
        link["port1"] = False
        t1.failover.poll_links(time.monotonic())
        assert r.ack_due
        assert t1.receiver.answer_plane(r, time.monotonic()) == 0
    finally:
        for x in (t0, t1):
            x.close(linger_s=0.0, quiet_s=0.0)
        for relay in fwd + back:
            relay.close()
