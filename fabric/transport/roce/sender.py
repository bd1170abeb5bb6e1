"""The NIC's send side: a scheduler over the rank's queue pairs (its sending flows).

Each round serves the flows round robin (:func:`serve_order`), each at its own pace (DCQCN's
pacer, :mod:`.dcqcn`: ``TxFlow.next_t``) and each NIC port at its line rate x ``pace``
(:func:`port_next`); a packet's path is chosen before its port is checked, and kept while the
port is busy (``TxFlow.held_path``: the choice waits, no token is lost). Re-sends that recovery
queued go first, then the next piece of the current message (:func:`next_packet`), as the window
allows. The packet is built (the header, the path's sequence number) and sent from the path's
socket, whose source port is its entropy. A socket whose buffer is full (``BlockingIOError``)
is backpressure, not loss: the packet stays the flow's next one, on the same path, and the port
counts as busy for a packet time (``send_blocked`` counts these); nothing is recorded as sent.

With priority flow control (``--pfc on``) a port whose lossless priority is paused offers nothing
until the pause ends (:class:`PortPause`, a memory read of the emulation's pinned map): the flow's
path choice waits (``pause_waits`` counts these), DCQCN's timers and the other ports run on.

The scheduler only serves; the timers (DCQCN's, the retransmission timer, the dead-path rule)
run before it, for every flow with data, whether or not the scheduler may serve it.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from hpnlab.fabric.bpf import MappedArray

from ..base import TransportError
from .dcqcn import RateControl
from .endpoint import Endpoint
from .failover import Failover
from .flows import TxFlow
from .wire import DATA, ETH, HDR, IP_UDP, LINK_ERRNOS, PSEQ_MASK

#: bytes a data packet takes on the link on top of its payload
OVERHEAD = HDR.size + IP_UDP + ETH
#: how soon a NIC whose port is paused looks again (the pause agent reacts in tens of microseconds)
PAUSE_POLL_S = 0.0002


def serve_order(dsts: list[int], after: int) -> list[int]:
    """Indexes into ``dsts`` (ascending peer ranks) in the order a NIC serves their queue pairs:
    round robin, starting with the first peer past ``after`` (the last one served; at first the
    rank itself, so that rank r starts with r+1, as NCCL orders its peers). A fixed order would
    give the lowest-numbered peer every free slot of the port: in an all-to-all every rank would
    send to rank 0 first, a 7-to-1 incast, then to rank 1, and so on."""
    k = next((i for i, d in enumerate(dsts) if d > after), 0)
    return list(range(k, len(dsts))) + list(range(k))


def port_next(free_at: float, now: float, bits: int, line_rate_bps: float, pace: float, burst_s: float) -> float:
    """When a NIC port that was free from ``free_at`` is free again after a packet of ``bits``
    left at ``now`` (pure). Credit for a late wake-up (a busy CPU): the port catches up by at
    most max(2 packets, ``burst_s`` at line rate), which its buffer absorbs."""
    burst = max(2 * bits / line_rate_bps, burst_s)
    return max(free_at, now - burst) + bits / (line_rate_bps * pace)


def next_packet(f: TxFlow, payload: int) -> tuple[int, list, bool] | None:
    """(psn, entry, is_retx) of the flow's next packet: a retransmission first, else the next
    piece (at most ``payload`` bytes) of the current message if the window allows (None:
    nothing to send). A new packet enters the flight only once it has left
    (:meth:`NicScheduler.send`): one that could not leave is taken again, the same, next time."""
    while f.retx:
        psn = f.retx.popleft()
        e = f.unacked.get(psn)
        if e is not None:
            return psn, e, True
    if f.psn - f.una >= f.window:
        return None
    if f.cur is None:
        if not f.queue:
            return None
        f.cur = f.queue.popleft()
        f.cur_off = 0
    mid, mv = f.cur
    off = f.cur_off
    n = min(payload, len(mv) - off)
    return f.psn, [mid, off, len(mv), mv[off:off + n], 0.0, 0, 0, "", 0], False


class PortPause:
    """Whether each of a rank's NIC ports (one per plane, on ``ips``) has its lossless priority paused:
    ``pause`` names the emulation's pinned array of host NICs' paused priorities (``map``, its
    ``entries``) and each NIC's place in it by address (``index``); bit 0 of a NIC's entry is the
    lossless data priority. Called per packet: a memory read."""

    def __init__(self, rank: int, pause: dict, ips: list[str]):
        try:
            self.array = MappedArray(pause["map"], int(pause["entries"]))
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise TransportError(f"rank {rank}: cannot read the NICs' pause state ({pause.get('map')}): "
                                 f"{exc}") from None
        index = pause.get("index") or {}
        self.at: list[int | None] = [index.get(ip) for ip in ips]

    def __call__(self, plane: int) -> bool:
        at = self.at[plane]
        return at is not None and bool(self.array.u32(at) & 1)

    def close(self) -> None:
        self.array.close()


class NicScheduler:
    """The send side of ``rank``'s NIC: ``planes`` ports of ``line_rate_bps``, each paced at
    ``pace`` of it; a packet may leave up to ``lookahead_s`` before its slot (the port's queue
    holds at most that), so that one wake-up sends a few packets instead of one. ``clock``: the
    time after each round (monotonic seconds)."""

    def __init__(self, rank: int, endpoint: Endpoint, failover: Failover, rate: RateControl, *,
                 payload: int, line_rate_bps: float, pace: float, burst_s: float, lookahead_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.rank = rank
        self.clock = clock
        self.failover = failover
        self.rate = rate
        self.ports_per_nic = endpoint.ports_per_nic
        self.hdr_buf = endpoint.hdr_buf
        self.peer_addr = endpoint.peer_addr
        self.payload = payload
        self.line_rate_bps = line_rate_bps
        self.pace = pace
        self.burst_s = burst_s
        self.lookahead_s = lookahead_s
        self.nic_next = [0.0] * endpoint.planes      # per plane: next free time of the port
        self.last_served = -1                        # the peer whose flow the NIC served last (serve_order)
        #: plane -> is that port's lossless priority paused now (priority flow control; None: never)
        self.paused: Callable[[int], bool] | None = None

    def start(self) -> None:
        self.last_served = self.rank

    def serve(self, flows: list[TxFlow], now: float, wake: float) -> float:
        """Send what ``flows`` (ascending peers) may send now, round after round until none
        may; return ``wake`` or, if earlier, when a flow's pacer or a port is next free."""
        la = self.lookahead_s
        nic_next = self.nic_next
        paused = self.paused
        dsts = [f.dst for f in flows]
        progressed = True
        while progressed:
            progressed = False
            for i in serve_order(dsts, self.last_served):
                f = flows[i]
                if f.next_t > now + la:               # the flow's pacer (DCQCN's rate)
                    wake = min(wake, f.next_t - la)
                    continue
                # the path (and so the NIC port) is chosen before checking that port's pacer
                if not f.can_send():
                    continue
                held = f.held_path
                path = held if held is not None and f.paths.live(held) else self.failover.choose_path(f)
                plane = path // self.ports_per_nic
                if paused is not None and paused(plane):
                    # the port's lossless priority is paused (PFC): the NIC offers nothing of it until
                    # the pause ends; the choice waits, DCQCN's timers and the other ports run on
                    f.held_path = path
                    f.stats["pause_waits"] += 1
                    wake = min(wake, now + PAUSE_POLL_S)
                    continue
                if nic_next[plane] > now + la:
                    f.held_path = path            # the choice waits for its port (a token is not lost)
                    wake = min(wake, nic_next[plane] - la)
                    continue
                f.held_path = None
                pkt = next_packet(f, self.payload)
                assert pkt is not None            # can_send() said there is one
                psn, e, is_retx = pkt
                bits = (len(e[3]) + OVERHEAD) * 8
                if not self.send(f, psn, e, path, now, is_retx):
                    # backpressure: the socket's buffer is full. The packet waits for its next
                    # turn on the same path, the port is busy for a packet time; nothing is lost
                    if is_retx:
                        f.retx.appendleft(psn)
                    f.held_path = path
                    nic_next[plane] = max(nic_next[plane], now + la) + bits / self.line_rate_bps
                    wake = min(wake, nic_next[plane] - la)
                    continue
                self.last_served = f.dst
                f.seq += 1
                nic_next[plane] = port_next(nic_next[plane], now, bits, self.line_rate_bps, self.pace, self.burst_s)
                self.rate.on_sent(f, now, bits, len(e[3]))
                progressed = True
            if progressed:
                now = self.clock()
        return wake

    def send(self, f: TxFlow, psn: int, e: list, path: int, now: float, is_retx: bool) -> bool:
        """Build packet ``psn`` (entry ``e``) for ``path`` and send it from the path's socket.
        False: the socket's buffer is full (backpressure): the packet did not leave and nothing
        was recorded, not even a loss. A packet the kernel refused (ICMP) or that its NIC port
        cannot send (down) left, as far as the flow knows: it is lost, and recovery re-sends it."""
        mid, off, mlen, view = e[0], e[1], e[2], e[3]
        plane = path // self.ports_per_nic
        pseq = (f.pseq[path] + 1) & PSEQ_MASK
        HDR.pack_into(self.hdr_buf, 0, DATA, path, self.rank, f.dst, psn, mid, off, mlen,
                      int(now * 1e6) & 0xFFFFFFFF, pseq)      # wire.timestamp, inline: once per packet
        refused = link_down = False
        try:
            f.socks[path].sendmsg([self.hdr_buf, view], (), 0, self.peer_addr[f.dst, plane])
        except BlockingIOError:
            f.stats["send_blocked"] += 1
            return False
        except ConnectionRefusedError:
            refused = True
        except OSError as exc:
            if exc.errno not in LINK_ERRNOS:
                raise
            link_down = True
        f.pseq[path] = pseq
        e[4] = now
        e[5] = path
        e[8] = pseq
        if not is_retx:                   # a new packet: now in flight
            f.unacked[psn] = e
            f.psn += 1
            f.cur_off += len(view)
            if f.cur_off >= mlen:
                f.msg_last_psn[mid] = psn
                f.cur = None
        st = f.stats
        st["packets"] += 1
        st["bytes"] += len(view)
        if is_retx:
            e[6] += 1
            st["retransmissions"] += 1
            why = e[7] or "loss"
            key = "retx_" + why
            st[key] = st.get(key, 0) + 1
            f.bursts.retx(now, why)
        if refused:
            st["send_refused"] += 1     # ICMP: the packet counts as lost
        elif link_down:
            # the NIC port cannot send (its link is down, its address gone): avoid the plane
            st["link_errors"] += 1
            self.failover.port_refused(plane, now)
        return True
