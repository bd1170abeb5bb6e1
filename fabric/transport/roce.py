"""A userspace UDP transport modelled on RoCEv2 (reliable connection over UDP port 4791).

What is modelled
    * Packets carry a per-flow packet sequence number (PSN), the message id, its offset and
      length; a flow is one direction of a rank pair (a QP).
    * Receiver: places every packet at its offset (a reordering / reassembly buffer, as NICs
      that accept sprayed packets do), delivers messages in order, sends a cumulative ACK
      (coalesced: one per received batch), and a NACK naming the first missing PSN: on a
      one-path connection once ``reorder_threshold`` (3) packets beyond the hole have
      arrived; on a multi-path one only once the hole outlives the reordering allowance
      (``reorder_time_s`` at first, widened to 1.25x the age of any hole that a late first
      copy filled, and doubled after a NACK that turned out spurious; at most 0.2 s; once a
      re-send has filled a hole, the next one is timed from the first packet past it that
      arrived, so a run of losses is NACKed hole after hole, not one hole per timeout). Every
      data packet also carries its number on its path (a 16-bit path sequence); packets on
      one path arrive in the order they were sent (one route, FIFO queues), so a jump in it
      is a loss on that path, reported at once (PATH_LOSS: the path and the numbers missing)
      and re-sent by the sender, where a sprayed flow's PSN hole says nothing until it
      outlives the reordering allowance that paths of different delay need. Such a loss cuts
      the DCQCN rate at most once per smoothed RTT (an overflowing queue drops a run of
      packets).
      ``recovery="gobackn"`` models a classic RoCE NIC instead: it drops every
      out-of-order packet and NACKs the expected PSN (the sender resends from there).
    * Sender: a window of unacknowledged packets, selective retransmission of NACKed PSNs
      (go-back-N from the NACKed PSN in gobackn mode), a retransmission timeout
      (RTO = srtt + 4 rttvar, at least ``min_rto_s``; on a multi-path connection a packet's
      timer is at least its own path's srtt + 4 rttvar, ``PathParams.path_rto``, so that a
      slow path's packets are not overdue at the flow's mixed estimate) for tail losses, which re-sends the
      oldest unacknowledged packet and, on a one-path (``flow``) connection, the newest one
      sent as a tail-loss probe (the receiver then NACKs a lost tail's hole instead of the
      sender timing out once per packet), and message completion
      when every packet of the message is acknowledged (RDMA send completion).
    * Control packets (ACK, NACK, CNP, PLANE) leave with DSCP 48 (``CONTROL_TOS``), which RoCE
      fabrics give a strict-priority queue (here ``emulation.control_priority``); data with DSCP 0.
    * ECN: data packets leave with ECT(0) (IP_TOS); the receiver reads the TOS byte of
      every packet (IP_RECVTOS) and answers a CE mark with a CNP to the sender, at most one
      per ``cnp_interval_s`` per flow (RoCEv2's ECN-Echo).
    * DCQCN (Zhu et al., SIGCOMM 2015) at the sender, the reaction point: see
      :class:`DcqcnParams`. There is no PFC in the emulation, so a NACK (a loss the
      receiver detected) also cuts the rate, as a CNP does. Packets are paced per flow at
      DCQCN's current rate and per NIC port at the port's line rate (the NIC's port scheduler).
    * Entropy: each packet's (plane, UDP source port) comes from the entropy policy
      (:mod:`.entropy`): ``flow`` fixes both per flow (hash of the rank pair: the ECMP
      baseline), ``ecmp`` one hashed connection per plane (NCCL's QPs), ``flowlet`` the same
      connections, each moving to its plane's next entropy value after an idle gap longer
      than ``flowlet_gap_us`` (default: 4 packet times at line rate, at least 500 us), ``spray``
      rotates per packet over every plane of the rank and ``ports_per_nic`` source ports
      per plane (several sockets bound to different source ports on each interface),
      ``adaptive`` sprays weighted by each path's own evidence (its RTT against the flow's
      best path's, its CNPs, path losses and timeouts; :class:`.adaptive.WeightedPaths`) and
      ``reps`` recycles the paths whose packets are acknowledged cleanly (REPS,
      :class:`.adaptive.AdaptivePaths`), both fed per path. With ``entropy_map`` (the
      controller's, :class:`hpnlab.fabric.routing.entropy.EntropyMap`) the source ports are bound to the map's
      entropy values (at most as many per plane as the map has distinct paths), so N paths
      are N known, distinct ways through the fabric; each connection (rank pair and plane)
      takes its own N values, :func:`hpnlab.fabric.routing.entropy.connection_values` (the flow model takes the
      same), so different connections use different uplinks, as real NICs' queue pairs do. Without a map the
      kernel assigns the ports (a real fabric whose hashing is unknown), one set per rank.

    * Host-side failover (:mod:`.paths` states the rules): the receiver reports, in every
      ACK and NACK, which of the sender's paths delivered (the echoed data packet's path and
      send time, plus up to three (path, send time) reports), so the sender knows per path
      the newest packet delivered. A path whose oldest packet in flight outlives
      ``max(K x srtt, floor)`` while another path delivered a later one is dead: nothing new
      goes there, what was in flight there is re-sent at once on live paths, and one probe per
      ``probe_interval_s`` tests it until it delivers again. A NIC port the kernel refuses to
      send on (``ENETUNREACH``, ``ENETDOWN``...), or whose carrier is lost (polled every
      ``link_poll_s`` through rtnetlink, :mod:`.nic`), takes its plane out at once; the rank
      also tells every peer, on a live plane (PLANE), so that their flows to it leave that
      plane at once too (and probe it at once when the port is back). The last live path is
      never given up.
    * Path migration (NCCL/UEC-style): a one-path (``flow``) connection whose retransmission
      timer fires ``migrate_after_rtos`` times in a row (default 2) moves to a new entropy
      value: another source port, on another plane if the rank has several (with a single
      path, its socket is re-bound to a new source port). The timer backs off at most to
      ``max_rto_s`` (default 100 ms, not 1 s), so a dead path costs about three RTOs before
      the move: ~30 ms at ``min_rto_s=0.01`` (measured by tools/bench/bench_transport.py), ~120 ms
      at the default 40 ms minimum (chosen for a loaded 2-core machine, where a shorter one
      fires spuriously); not seconds.
    * Answers (ACK, NACK, CNP) go on a plane that delivered data from the peer within
      ``ack_fresh_s``, that this rank's own sending to the peer does not find dead, and whose
      answers do not seem lost (the peer re-sent data already acknowledged there): not
      merely the plane of the last data packet.

Every flow counts packets, bytes, retransmissions, timeouts, NACKs, CE marks (receiver),
CNPs (sender), duplicates, the deepest reordering seen (PSN distance beyond the next
expected one) and samples (time, bytes acknowledged, DCQCN rate) every ``sample_s``; and,
in bounded memory, what a failure's loss window is made of (:mod:`.accounting`): arrival
and in-order gaps, retransmission bursts with their cause (nack, timeout, failover,
migrate), the slowest message completions, the path events, and the bytes and CRC-32 of
every message posted (sender) and handed to the application (receiver), which must match.
"""
from __future__ import annotations

import errno
import math
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from hpnlab.fabric.routing.entropy import FIRST_FREE_PORT, EntropyMap, connection_values, first_high, flow_hash

from .accounting import BurstLog, GapLog, Largest, crc_chain
from .base import PeerLost, Transport, TransportError
from .entropy import ENTROPY_POLICIES, FlowEntropy
from .nic import interface_of, link_up, netlink_socket
from .paths import PathParams, PathTable, ack_plane, rtt_update

DATA, ACK, NACK, CNP, ABORT, PROBE, PATH_LOSS, PLANE = 1, 2, 3, 4, 5, 6, 7, 8
#: reorder_threshold of a multi-path connection: no count of packets past a hole makes it a loss
NO_COUNT = 1 << 30
#: the longest a hole waits for a late packet before the receiver NACKs it (the reordering allowance's cap)
REORDER_TIME_MAX_S = 0.2
# type, path, src rank, dst rank, psn, msg id, msg offset, msg length, timestamp (us), path
# sequence (DATA: the packet's number on its path, 16 bits, wrapping; PATH_LOSS: psn = the
# first path sequence missing, msg id = how many; PLANE: path = the plane, psn = 1 up, 0 down);
# an ACK carries in (msg id, offset, length) and a NACK in (offset, length) delivery
# reports, each path << 24 | the low 24 bits of the send timestamp of the newest packet
# that arrived on that path (NO_REPORT: none); with the echoed (path, timestamp) of an ACK,
# the sender learns which of its paths deliver
HDR = struct.Struct("!BBHHIIIIIH")
PSEQ_MASK = 0xFFFF
NO_REPORT = 0xFFFFFFFF
MAX_PATHS = 255
LINK_ERRNOS = frozenset((errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL))
IP_UDP = 28          # IPv4 + UDP headers
ETH = 14             # what an htb shaper counts on top of the IP packet
ECT0, CE = 0x02, 0x03
#: the TOS byte of control packets (ACK, NACK, CNP, PLANE): DSCP 48 (CS6), not ECN-capable, the class
#: RoCE fabrics give CNPs a strict-priority queue for (``emulation.control_priority`` does so here)
CONTROL_TOS = 48 << 2
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)


def serve_order(dsts: list[int], after: int) -> list[int]:
    """Indexes into ``dsts`` (ascending peer ranks) in the order a NIC serves their queue pairs:
    round robin, starting with the first peer past ``after`` (the last one served; at first the
    rank itself, so that rank r starts with r+1, as NCCL orders its peers). A fixed order would
    give the lowest-numbered peer every free slot of the port: in an all-to-all every rank would
    send to rank 0 first, a 7-to-1 incast, then to rank 1, and so on."""
    k = next((i for i, d in enumerate(dsts) if d > after), 0)
    return list(range(k, len(dsts))) + list(range(k))


def path_gap(last: int, pseq: int) -> int | None:
    """How many packets are missing on a path between its newest path sequence ``last`` and a
    packet that arrives with ``pseq`` (16 bits, wrapping; pure): 0 in order, None for a
    duplicate or an older packet (half the number space behind)."""
    d = (pseq - last) & PSEQ_MASK
    if d == 0 or d > PSEQ_MASK // 2:
        return None
    return d - 1


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


# ---- per-flow state ----------------------------------------------------------------------

class _TxFlow:
    __slots__ = (
        "acked_bytes",
        "app_bytes",
        "app_crc",
        "bursts",
        "cur",
        "cur_off",
        "cur_path",
        "dcqcn",
        "done_msgs",
        "dst",
        "gbn_resend_to",
        "hash",
        "held_path",
        "last_progress",
        "last_sample",
        "min_rtt",
        "msg_last_psn",
        "msg_next",
        "msg_posted",
        "next_check",
        "next_t",
        "paths",
        "pseq",
        "psn",
        "queue",
        "retx",
        "rto",
        "rto_streak",
        "rttvar",
        "samples",
        "seq",
        "slowest",
        "socks",
        "srtt",
        "stats",
        "timer_from",
        "una",
        "unacked",
        "values",
        "window",
    )

    def __init__(self, src, dst, now, dcqcn, paths: PathTable):
        self.dst = dst
        self.hash = flow_hash(src, dst)
        self.queue: deque[tuple[int, memoryview]] = deque()          # (msg_id, memoryview)
        self.cur: tuple[int, memoryview] | None = None
        self.cur_off = 0
        self.psn = 0
        self.una = 0
        self.unacked: dict[int, list] = {}   # psn -> [msg_id, off, mlen, view, sent_t, path, retx, why, pseq]
        self.retx: deque[Any] = deque()
        self.msg_next = 0
        self.msg_last_psn: dict[int, int] = {}   # msg id -> last psn (set when fully packetised)
        self.done_msgs: set[int] = set()
        self.next_t = now
        self.dcqcn = dcqcn
        self.last_progress = now
        self.rto: float | None = None
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.stats = {"packets": 0, "bytes": 0, "retransmissions": 0, "timeouts": 0, "nacks": 0,
                      "cnps": 0, "acks": 0, "failover_retx": 0, "probes": 0, "migrations": 0,
                      "link_errors": 0, "path_losses": 0, "send_refused": 0, "plane_notices": 0}
        self.paths = paths
        self.pseq = [0] * len(paths)       # per path: the sequence number of its last data packet
        self.next_check = 0.0              # when to look for dead paths next
        self.cur_path: int | None = None   # one-path (flow entropy) flows: where they are now
        self.rto_streak = 0                # consecutive timeouts without progress
        # when the retransmission timer last restarted (a timeout): the oldest packet's timer
        # runs from its send time or this, whichever is later. Not written into the packets'
        # send times: the dead-path rule and the delivery reports read those, and a restart
        # there made a path that lost everything look freshly sent after every timeout
        self.timer_from = 0.0
        self.bursts = BurstLog()
        self.app_bytes = 0                 # what the application posted, and its running CRC
        self.app_crc = 0
        self.msg_posted: dict[int, tuple[float, int]] = {}    # msg id -> (posted, bytes)
        self.slowest = Largest(8)
        self.samples: list[list[float]] = []
        self.acked_bytes = 0
        self.last_sample = 0.0
        self.seq = 0
        self.gbn_resend_to = -1
        self.min_rtt: float | None = None
        self.window = 0
        self.held_path: int | None = None   # chosen for the next packet, which waited for its port
        self.socks: list[socket.socket] = []     # per path: the sending socket (its source port)
        self.values: list[int] | None = None     # per path: its entropy value in the map (None: no map)


class _RxFlow:
    __slots__ = (
        "ack_at",
        "ack_due",
        "ack_path",
        "ack_ts",
        "app_bytes",
        "app_crc",
        "complete",
        "deliver_next",
        "expected",
        "gaps",
        "hol",
        "hole_psn",
        "hole_since",
        "hole_ts",
        "last_cnp",
        "last_nack",
        "msgs",
        "ooo",
        "path_seq",
        "pending",
        "plane",
        "plane_t",
        "probed",
        "ready",
        "reorder_time",
        "reports",
        "src",
        "stats",
        "suspect_until",
    )

    def __init__(self, src, planes: int = 1, gap_threshold_s: float = 0.002):
        self.src = src
        self.expected = 0
        # PSNs received beyond the next expected one -> (arrival time, send timestamp): once a
        # re-send fills a hole, the next is timed from the first arrival past it
        self.ooo: dict[int, tuple[float, int]] = {}
        self.msgs: dict[int, list] = {}   # msg id -> [bytearray, received bytes]
        self.complete: dict[int, bytearray] = {}   # msg id -> bytearray (complete, not yet delivered)
        self.deliver_next = 0
        self.ready: deque[Any] = deque()          # delivered in order, waiting for a posted receive
        self.ack_due = False
        self.pending = 0              # packets received since the last ACK
        self.hole_psn = -1            # the missing PSN being timed, and since when
        self.hole_since = 0.0
        self.hole_ts = 0              # the send timestamp of the packet that showed the hole
        self.reorder_time = 0.0       # set by the transport; grows with late fills and spurious NACKs
        self.ack_at = 0.0             # when a delayed ACK is due (0: none)
        self.ack_path = 0
        self.ack_ts = 0
        self.last_cnp = -1.0
        self.last_nack = (-1, -1.0)
        self.plane = 0
        self.stats = {"packets_received": 0, "ce_marks": 0, "cnps_sent": 0, "duplicates": 0,
                      "max_reorder": 0, "nacks_sent": 0, "dropped_out_of_order": 0, "probes_received": 0,
                      "ack_plane_switches": 0, "path_losses_sent": 0}
        self.plane_t = [0.0] * planes      # per plane: last data (or probe) from the peer
        self.suspect_until = [0.0] * planes   # per plane: our ACKs there seem lost until then
        self.reports: dict[int, int] = {}  # path -> newest send timestamp, not yet reported
        self.path_seq: dict[int, int] = {}  # path -> sequence number of its newest data packet
        self.probed = False                # a probe arrived since the last ACK
        self.gaps = GapLog(gap_threshold_s)   # between arrivals of new data (the wire's view)
        self.hol = GapLog(gap_threshold_s)    # between advances of the in-order point (the app's view)
        self.app_bytes = 0                 # what was handed to the application, and its CRC
        self.app_crc = 0


class RoceTransport(Transport):
    name = "roce"

    def __init__(self, rank: int, addrs: list[list[str]], *, base_port: int = 4791,
                 line_rate_bps: float = 20e6, entropy: str = FlowEntropy.name, mtu: int = 1500,
                 recovery: str = "selective", dcqcn: bool | DcqcnParams = True,
                 ports_per_nic: int = 8, window_pkts: int = 64, reorder_threshold: int | None = None,
                 reorder_time_s: float | None = None,
                 ecn: bool = True, timeout_s: float = 10.0, min_rto_s: float = 0.04,
                 sample_s: float = 0.025, burst_s: float = 0.004, pace: float = 1.0,
                 ack_every: int = 8, ack_delay_s: float = 0.004, lookahead_s: float = 0.003,
                 bdp_factor: float = 6.0, max_rto_s: float = 0.1, paths: PathParams | dict | None = None,
                 gap_threshold_s: float = 0.002, ack_fresh_s: float = 0.02, watch_links: bool = True,
                 link_poll_s: float = 0.005, link_state: Callable[[str], bool | None] | None = None,
                 nic_names: list[str | None] | None = None, entropy_map: EntropyMap | dict | None = None,
                 flowlet_gap_us: float | None = None, adaptive: dict | None = None):
        if recovery not in ("selective", "gobackn"):
            raise TransportError(f"recovery must be selective or gobackn, got {recovery!r}")
        if entropy not in ENTROPY_POLICIES:
            raise TransportError(f"unknown entropy {entropy!r} (known: {', '.join(ENTROPY_POLICIES)})")
        self.rank, self.nranks, self.addrs = rank, len(addrs), addrs
        self.planes = len(addrs[rank])
        self.base_port = base_port
        if not 0.1 <= pace <= 1.0:
            raise TransportError(f"pace must be between 0.1 and 1 (a fraction of line rate), got {pace}")
        self.pace = pace
        self.last_served = -1                        # the peer whose flow the NIC served last (serve_order)
        self.line_rate_bps = float(line_rate_bps)    # per NIC port (plane)
        self.payload = mtu - IP_UDP - HDR.size
        if self.payload < 64:
            raise TransportError(f"mtu {mtu} is too small for the roce transport (at least {IP_UDP + HDR.size + 64})")
        self.mtu = mtu
        self.recovery = recovery
        self.entropy_map = EntropyMap.from_dict(entropy_map)
        self.ports_per_nic = max(1, ports_per_nic)
        if self.entropy_map is not None:      # as many source ports per plane as distinct paths, at most
            self.ports_per_nic = min(self.ports_per_nic, self.entropy_map.path_count())
        if self.planes * self.ports_per_nic > MAX_PATHS - 1:
            raise TransportError(f"{self.planes} planes x {self.ports_per_nic} ports per NIC is more than "
                                 f"{MAX_PATHS - 1} paths; use fewer ports_per_nic")
        if flowlet_gap_us is None:            # 4 packet times at line rate, at least 500 us
            flowlet_gap_us = max(500.0, 4 * mtu * 8 / float(line_rate_bps) * 1e6)
        self.flowlet_gap_us = flowlet_gap_us
        self.policy = ENTROPY_POLICIES[entropy](self.planes, self.ports_per_nic, flowlet_gap_s=flowlet_gap_us / 1e6,
                                                adaptive=adaptive)
        self.tx_entropy: list[int | None] = []      # per path: its entropy value number in the map (None: kernel port)
        per_flow = self.policy.per_flow
        self.entropy = entropy
        self.window = window_pkts
        # on a multi-path connection a hole's count says only how far its paths differ in delay
        # (PATH_LOSS finds the losses): a hole is a loss only by its age there (NO_COUNT)
        self.reorder_threshold = reorder_threshold if reorder_threshold is not None else (
            3 if per_flow else NO_COUNT)
        self.reorder_time_s = reorder_time_s if reorder_time_s is not None else (
            0.0 if per_flow else 0.008)
        self.ecn = ecn
        self.timeout_s = timeout_s
        self.min_rto_s = min_rto_s
        if max_rto_s < min_rto_s:
            raise TransportError(f"max_rto_s ({max_rto_s}) must be at least min_rto_s ({min_rto_s})")
        self.max_rto_s = max_rto_s
        try:
            self.path_params = paths if isinstance(paths, PathParams) else PathParams(**(paths or {}))
        except TypeError as exc:
            raise TransportError(f"bad path rules: {exc}") from None
        self.gap_threshold_s = gap_threshold_s
        self.ack_fresh_s = ack_fresh_s
        self.wall_offset = time.time() - time.monotonic()     # monotonic -> wall clock
        self.watch_links = watch_links
        self.link_poll_s = link_poll_s
        self._link_state = link_state                # (interface) -> up?; default: nic.link_up
        self.nics: list[str | None] = list(nic_names or [])   # per plane: the interface owning its address
        self.link_ok: list[bool] = []
        self.next_link_poll = 0.0
        self.link_events: list[list] = []           # [wall time, plane, "down" | "up"], bounded
        self._link_sock: socket.socket | None = None
        self.sample_s = sample_s
        self.burst_s = burst_s
        self.lookahead_s = lookahead_s
        self.bdp_factor = bdp_factor
        self.ack_every = max(1, ack_every)
        self.ack_delay_s = ack_delay_s
        # A flow's top rate is what its paths can carry: one port with flow entropy, every
        # plane's port when it sprays (the NIC pacers still hold each port to line rate).
        self.flow_max_bps = self.line_rate_bps * (1 if per_flow else self.planes)
        if dcqcn is True:
            dcqcn = DcqcnParams.scaled(self.flow_max_bps, self.payload)
        self.dcqcn_params = dcqcn or None
        self.tx: dict[int, _TxFlow] = {}
        self.rx: dict[int, _RxFlow] = {}
        self.rx_socks: list[socket.socket] = []
        self.tx_socks: list[socket.socket] = []     # no map: index plane * ports + k; map: every bound value
        self._value_socks: dict[tuple[int, int], socket.socket] = {}   # map: (plane, value) -> its socket
        self.nic_next: list[float] = []             # per plane: next free time of the port
        self.peer_addr: dict[tuple[int, int], tuple[str, int]] = {}   # (rank, plane) -> (ip, port)
        self.hdr_buf = bytearray(HDR.size)
        self.cpu_busy = 0.0
        self.heard: dict[int, float] = {}
        self._ep = select.epoll()
        self._plane_of_fd: dict[int, tuple] = {}

    # ---- setup ---------------------------------------------------------------------------
    def info(self) -> dict:
        return {"transport": "roce", "entropy": self.entropy, "recovery": self.recovery,
                "mtu": self.mtu, "payload_bytes": self.payload, "line_rate_bps": self.line_rate_bps,
                "flow_max_bps": self.flow_max_bps, "planes": self.planes, "ports_per_nic": self.ports_per_nic,
                "window_pkts": self.window, "bdp_factor": self.bdp_factor, "pace": self.pace,
                "reorder_threshold": self.reorder_threshold, "reorder_time_s": self.reorder_time_s,
                "ecn": self.ecn, "min_rto_s": self.min_rto_s, "max_rto_s": self.max_rto_s,
                "path_rules": asdict(self.path_params), "gap_threshold_s": self.gap_threshold_s,
                "watched_ports": self.nics, "link_events": self.link_events,
                "dcqcn": asdict(self.dcqcn_params) if self.dcqcn_params else None,
                "udp_port": self.base_port + self.rank,
                "source_ports": [s.getsockname()[1] for s in self.tx_socks],
                "entropy_map": self.entropy_map.as_dict() if self.entropy_map else None,
                "entropy_values": self.tx_entropy,
                "connection_values": {r: f.values for r, f in self.tx.items()},
                "flowlet_gap_us": self.flowlet_gap_us if self.entropy == "flowlet" else None}

    def start(self) -> None:
        port = self.base_port + self.rank
        for plane, ip in enumerate(self.addrs[self.rank]):
            rs = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                rs.bind((ip, port))
            except OSError as exc:
                rs.close()
                raise TransportError(f"rank {self.rank}: cannot bind UDP {ip}:{port}: {exc.strerror} "
                                     f"(is {ip} an address of this host?)") from None
            rs.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
            rs.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, CONTROL_TOS)     # what this socket sends: control
            rs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            rs.setblocking(False)
            self.rx_socks.append(rs)
            self._ep.register(rs.fileno(), select.EPOLLIN)
            self._plane_of_fd[rs.fileno()] = (plane, rs)
            if self.entropy_map is None:          # kernel-assigned ports, one set per rank
                for _k in range(self.ports_per_nic):
                    self.tx_socks.append(self._tx_socket(ip))
                    self.tx_entropy.append(None)
            self.nic_next.append(0.0)
        for r, ips in enumerate(self.addrs):
            for p in range(self.planes):
                self.peer_addr[r, p] = (ips[p % len(ips)], self.base_port + r)
        if self.watch_links:
            if not self.nics:
                self.nics = [interface_of(ip) for ip in self.addrs[self.rank]]
            if self._link_state is None:
                sock = self._link_sock = netlink_socket()
                self._link_state = lambda name: link_up(name, sock)
        self.link_ok = [True] * self.planes
        self.last_served = self.rank
        now = time.monotonic()
        for r in range(self.nranks):
            if r != self.rank:
                dc = Dcqcn(self.dcqcn_params, now) if self.dcqcn_params else None
                self.tx[r] = _TxFlow(self.rank, r, now, dc,
                                     PathTable(self.planes, self.ports_per_nic, self.path_params))
                self.tx[r].window = self.window
                self._bind_connection(self.tx[r])
                self.rx[r] = _RxFlow(r, self.planes, self.gap_threshold_s)
                self.rx[r].reorder_time = self.reorder_time_s

    # ---- the step ----------------------------------------------------------------------
    def exchange(self, sends, recvs, wait_sends: bool = True):
        """Post ``sends`` and ``recvs``; return the received payloads once every receive has
        arrived and (``wait_sends``) every send is acknowledged. With ``wait_sends=False`` the
        sends are copied and complete in the background of later calls (as a NIC's send
        queue does), so a rank moves to its next step as soon as its data is in;
        :meth:`flush` waits for them."""
        now = time.monotonic()
        waiting = []                                  # (flow, msg id) not yet acknowledged
        for peer, data in sends:
            f = self.tx[peer]
            mid = f.msg_next
            f.msg_next += 1
            mv = memoryview(data).cast("B")
            if len(mv) == 0:
                continue
            if not wait_sends:
                mv = memoryview(bytes(mv))
            else:
                waiting.append((f, mid))
            f.app_bytes += len(mv)
            f.app_crc = crc_chain(f.app_crc, mv)
            f.msg_posted[mid] = (now, len(mv))
            f.queue.append((mid, mv))
            f.last_progress = now

        def sends_done() -> bool:
            if all(m in f.done_msgs for f, m in waiting):
                for f, m in waiting:
                    f.done_msgs.discard(m)
                return True
            return False
        return self._run(recvs, sends_done)

    def flush(self) -> None:
        """Wait until everything sent so far is acknowledged."""
        def idle() -> bool:
            if any(f.queue or f.cur or f.unacked for f in self.tx.values()):
                return False
            for f in self.tx.values():
                f.done_msgs.clear()
            return True
        self._run([], idle)

    def _run(self, recvs, sends_done):
        now = time.monotonic()
        results: list = [None] * len(recvs)
        done_at = [0.0] * len(recvs)              # when each receive completed (monotonic s)
        want = deque(range(len(recvs)))
        started = now
        for f in self.tx.values():
            if f.queue or f.unacked:
                f.last_progress = now
        busy_t0 = time.process_time()
        ready = None                                   # None: try every socket
        try:
            while True:
                if ready is None or ready:
                    self._poll_rx(ready)
                now = time.monotonic()
                # deliver what has arrived, in posting order per peer
                for i in list(want):
                    peer, nbytes = recvs[i]
                    rxf = self.rx[peer]
                    if rxf.ready and _first_for_peer(want, recvs, i, peer):
                        data = rxf.ready.popleft()
                        if len(data) != nbytes:
                            raise TransportError(f"rank {self.rank}: rank {peer} sent a {len(data)} B "
                                                 f"message where {nbytes} B were expected (out of step)")
                        results[i] = data
                        done_at[i] = now
                        rxf.app_bytes += len(data)
                        rxf.app_crc = crc_chain(rxf.app_crc, data)
                        want.remove(i)
                ack_at = self._flush_acks(now)
                if not want and sends_done():
                    if recvs:
                        self.recv_done = done_at
                    return results
                wake = self._send_and_timers(now)
                if ack_at:
                    wake = min(wake, ack_at)
                wait = min(max(0.0, wake - time.monotonic()), 0.005)
                ready = self._wait_rx(wait)
                self._check_peers(now, want, recvs, started)
        finally:
            self.cpu_busy += time.process_time() - busy_t0

    def _check_peers(self, now, want, recvs, started):
        for f in self.tx.values():
            if (f.unacked or f.queue or f.cur) and now - f.last_progress > self.timeout_s:
                raise PeerLost(f.dst, self.peer_addr[f.dst, 0][0],
                               f"stopped acknowledging for {self.timeout_s:g} s (unreachable or gone)")
        if want:
            peer = recvs[want[0]][0]
            if now - max(self.heard.get(peer, 0.0), started) > self.timeout_s:
                raise PeerLost(peer, self.peer_addr[peer, 0][0],
                               f"sent nothing for {self.timeout_s:g} s (unreachable or gone)")

    # ---- sending -----------------------------------------------------------------------
    def _next_packet(self, f: _TxFlow):
        """(psn, entry, is_retx) of the flow's next packet: a retransmission first, else the
        next piece of the current message if the window allows."""
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
        n = min(self.payload, len(mv) - off)
        f.cur_off += n
        psn = f.psn
        f.psn += 1
        e = [mid, off, len(mv), mv[off:off + n], 0.0, 0, 0, "", 0]
        f.unacked[psn] = e
        if f.cur_off >= len(mv):
            f.msg_last_psn[mid] = psn
            f.cur = None
        return psn, e, False

    def _bdp_window(self, base_rtt: float) -> int:
        """Packets in flight a flow may have: ``bdp_factor`` x its bandwidth-delay product
        (top rate x the smallest RTT seen) plus one ACK batch, within [8, window_pkts]. Like
        IRN's BDP-based flow control (Mittal et al., SIGCOMM'18): it bounds the queue a flow
        can build, which a network without PFC needs, without slowing a lone flow."""
        bdp = self.flow_max_bps * base_rtt / (8 * (self.payload + HDR.size + IP_UDP + ETH))
        return int(max(8, min(self.window, math.ceil(self.bdp_factor * bdp) + self.ack_every)))

    def _peek_ready(self, f: _TxFlow) -> bool:
        while f.retx and f.retx[0] not in f.unacked:
            f.retx.popleft()
        if f.retx:
            return True
        return f.psn - f.una < f.window and (f.cur is not None or bool(f.queue))

    def _rto(self, f: _TxFlow) -> float:
        return f.rto or min(self.max_rto_s, max(self.min_rto_s, 0.2))

    def _rto_of(self, f: _TxFlow, path: int) -> float:
        """The timeout of a packet sent on ``path``: the flow's; with ``path_rto`` on a multi-path
        flow, at least the path's own srtt + 4 rttvar (a slow path's packet is not overdue at the
        flow's mixed estimate; the dead-path rule, not the timer, finds a path that stopped)."""
        base = self._rto(f)
        if not self.path_params.path_rto or self.policy.per_flow or path >= len(f.paths):
            return base
        own = f.paths.rto(path)
        return base if own is None else max(base, own)

    def _rto_due(self, f: _TxFlow) -> float | None:
        """When the retransmission timer of ``f``'s oldest unacknowledged packet fires: from its
        send time or the timer's last restart (``timer_from``), whichever is later (None: no
        packet sent and unacknowledged)."""
        oldest = f.unacked.get(f.una)
        if oldest is None or not oldest[4]:
            return None
        return max(oldest[4], f.timer_from) + self._rto_of(f, oldest[5])

    def _send_and_timers(self, now: float) -> float:
        wake = now + 0.005
        la = self.lookahead_s
        if self.watch_links and self.nics and now >= self.next_link_poll:
            self._poll_links(now)
        flows = [f for f in self.tx.values() if f.retx or f.queue or f.cur or f.unacked]
        for f in flows:
            if f.dcqcn:
                f.dcqcn.tick(now)
            if now >= f.next_check:
                self._check_paths(f, now)
            for path in f.paths.probes_due(now):
                self._probe(f, path, now)
            due = self._rto_due(f)
            if due is not None and now > due:
                self._timeout(f, now)
        dsts = [f.dst for f in flows]
        progressed = True
        while progressed:
            progressed = False
            for i in serve_order(dsts, self.last_served):
                f = flows[i]
                # pacing with a small lookahead: a packet may leave up to `la` before its
                # slot (the sending port's queue holds at most that), so one wake-up sends a
                # few packets instead of one
                if f.next_t > now + la:
                    wake = min(wake, f.next_t - la)
                    continue
                # the path (and so the NIC port) is chosen before checking that port's pacer
                pkt = self._peek_ready(f)
                if not pkt:
                    continue
                held = f.held_path
                path = held if held is not None and f.paths.live(held) else self._choose_path(f)
                plane = path // self.ports_per_nic
                if self.nic_next[plane] > now + la:
                    f.held_path = path            # the choice waits for its port (a token is not lost)
                    wake = min(wake, self.nic_next[plane] - la)
                    continue
                f.held_path = None
                psn, e, is_retx = self._next_packet(f)
                self._send(f, psn, e, path, now, is_retx)
                self.last_served = f.dst
                f.seq += 1
                wire = (len(e[3]) + HDR.size + IP_UDP + ETH) * 8
                # credit for a late wake-up (a busy CPU): catch up by at most max(2 packets,
                # burst_s at line rate), which the sending port's buffer absorbs
                burst = max(2 * wire / self.line_rate_bps, self.burst_s)
                self.nic_next[plane] = (max(self.nic_next[plane], now - burst)
                                        + wire / (self.line_rate_bps * self.pace))
                if f.dcqcn:
                    f.next_t = max(f.next_t, now - self.burst_s) + wire / f.dcqcn.rc
                    f.dcqcn.on_sent(len(e[3]))
                progressed = True
            if progressed:
                now = time.monotonic()
        for f in flows:
            due = self._rto_due(f)
            if due is not None:
                wake = min(wake, due)
            nxt = f.paths.next_probe()
            if nxt is not None:
                wake = min(wake, nxt)
            if f.unacked and not self.policy.per_flow:
                wake = min(wake, f.next_check)
        return wake

    def _poll_links(self, now: float) -> None:
        """A plane whose NIC port went down is left at once by every flow; when the port
        comes back, its paths are probed at once (they return when a probe gets through)."""
        self.next_link_poll = now + self.link_poll_s
        assert self._link_state is not None
        for plane, name in enumerate(self.nics):
            if name is None:
                continue
            up = self._link_state(name)
            if up is None or up == self.link_ok[plane]:
                continue
            self.link_ok[plane] = up
            if len(self.link_events) < 256:     # the moment it was seen (``now`` is the loop's, maybe stale)
                self.link_events.append([time.monotonic() + self.wall_offset, plane, "up" if up else "down"])
            for f in self.tx.values():
                if up:
                    f.paths.probe_plane_now(plane, now)
                else:
                    self._leave_plane(f, plane, now)
            if not up:
                # answers sent on the plane between its port going down and this poll are lost: answer
                # again at once on another plane, so the sender is not left waiting for its timeout
                for r in self.rx.values():
                    if r.plane == plane and r.expected:
                        r.ack_due = True
            self._notify_plane(plane, up)

    def _notify_plane(self, plane: int, up: bool) -> None:
        """Tell every peer, on another plane whose port is up, that this rank's port on ``plane``
        went down (or came back): a peer sending here leaves that plane at once (or probes it
        at once), where its dead-path rule would need its in-flight packets there to age
        ``max(K x srtt, floor)`` (a loaded all-reduce's srtt made that 70-140 ms) and the
        probes of a repaired plane would wait for their interval."""
        via = [q for q in range(self.planes) if q != plane and self.link_ok[q]]
        if not via:
            return
        for peer, r in self.rx.items():
            q = r.plane if r.plane in via else via[0]
            self._control(PLANE, peer, q, plane, int(up), 0)

    def _check_paths(self, f: _TxFlow, now: float) -> None:
        """Apply the dead-path rule (a scan of the packets in flight, a few times per limit)."""
        limit = self.path_params.dead_after(f.srtt)
        f.next_check = now + limit
        if len(f.paths) < 2 or not f.unacked or self.policy.per_flow:
            return                      # one path in use: no other to compare (the RTO rule migrates)
        table = f.paths
        unconfirmed, last_sent = table.silent(((e[5], e[4]) for e in f.unacked.values()), self._peek_ready(f))
        dead = table.check(now, f.srtt, unconfirmed, last_sent)
        if dead:
            self._fail_over(f, dead, now)
        live = [t for p, t in unconfirmed.items() if table.live(p)]
        if live:                         # look again when the oldest silent packet is overdue
            f.next_check = max(now + 0.0005, min(live) + limit + 1e-4)

    def _choose_path(self, f: _TxFlow) -> int:
        """The path of the flow's next packet: the policy's choice, skipping dead paths
        (spraying moves on to the next live one; a one-path flow stays where it migrated)."""
        if self.policy.per_flow:
            if f.cur_path is None:
                f.cur_path = self.policy.path(f, f.seq)
            return f.cur_path
        first = self.policy.path(f, f.seq)
        table = f.paths
        if table.live(first):
            return first
        for k in range(1, len(table)):
            p = self.policy.path(f, f.seq + k)
            if table.live(p):
                f.seq += k
                return p
        return first

    def _requeue(self, f: _TxFlow, psn: int, why: str) -> bool:
        e = f.unacked.get(psn)
        if e is None or psn in f.retx:
            return False
        e[7] = why
        f.retx.append(psn)
        return True

    def _leave_plane(self, f: _TxFlow, plane: int, now: float, why: str = "plane_down") -> None:
        """Every path of ``plane`` dead for ``f`` (:meth:`.paths.PathTable.kill_plane`), and what
        was in flight on them re-sent at once."""
        dead = f.paths.kill_plane(plane, now, why)
        if dead:
            self._fail_over(f, dead, now)

    def _fail_over(self, f: _TxFlow, dead: list[int], now: float) -> None:
        """``dead`` paths were just found dead: what was in flight on them is re-sent at once
        (on live paths, as :meth:`_choose_path` picks), not after a timeout."""
        gone = set(dead)
        if f.cur_path in gone:
            f.cur_path = f.paths.migration_target(f.cur_path)
        for psn in range(f.una, f.psn):
            e = f.unacked.get(psn)
            if e is not None and e[5] in gone and self._requeue(f, psn, "failover"):
                f.stats["failover_retx"] += 1

    def _probe(self, f: _TxFlow, path: int, now: float) -> None:
        """One probe down a dead path; the receiver's delivery report says if it got through."""
        plane = path // self.ports_per_nic
        HDR.pack_into(self.hdr_buf, 0, PROBE, path, self.rank, f.dst, 0, 0, 0, 0, int(now * 1e6) & 0xFFFFFFFF, 0)
        try:
            f.socks[path].sendto(self.hdr_buf, self.peer_addr[f.dst, plane])
        except OSError:
            pass
        f.stats["probes"] += 1

    def _migrate(self, f: _TxFlow, now: float) -> None:
        """Path migration of a one-path flow after repeated timeouts: a new entropy value
        (another source port, another plane if there is one), the timer back to its base."""
        cur = f.cur_path if f.cur_path is not None else self._choose_path(f)
        f.paths.kill(cur, now, "migrated_from")
        target = f.paths.migration_target(cur)
        if target == cur:
            self._rebind(f, cur)                    # one path only: a new source port for it
        f.paths.events.append((now, "migrated_to", target))
        f.cur_path = target
        f.stats["migrations"] += 1
        f.rto_streak = 0
        f.rto = max(self.min_rto_s, f.srtt + 4 * f.rttvar) if f.srtt is not None else None
        for psn in range(f.una, f.psn):
            self._requeue(f, psn, "migrate")

    def _entropy_socket(self, ip: str, k: int, avoid: int = -1) -> tuple[socket.socket, int | None]:
        """A sending socket on ``ip`` for entropy value number ``k`` of the map (a source port
        whose switch-read bits name path k; the free high bits are tried until one binds),
        or, without a map or when none binds, a kernel-assigned port (None)."""
        m = self.entropy_map
        if m is not None:
            highs = m.high_values()
            first = first_high(m, m.low_bits(k), self.rank)      # the flow model's port too
            for h in range(highs):
                high = (first - h) % highs                         # down from there
                sport = m.source_port(k, high)
                if sport < FIRST_FREE_PORT or sport == avoid:
                    continue
                try:
                    return self._tx_socket(ip, sport), k % m.path_count()
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise TransportError(f"rank {self.rank}: cannot bind UDP {ip}:{sport}: "
                                             f"{exc.strerror}") from None
        return self._tx_socket(ip), None

    def _tx_socket(self, ip: str, sport: int = 0) -> socket.socket:
        """A sending socket on ``ip`` with source port ``sport`` (0: kernel-assigned): one path's entropy."""
        ts = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            ts.bind((ip, sport))
        except OSError:
            ts.close()
            raise
        if self.ecn:
            ts.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ECT0)
        ts.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        ts.setblocking(False)
        return ts

    def _bind_connection(self, f: _TxFlow) -> None:
        """The sending sockets of ``f``'s paths. Without a map: the rank's shared,
        kernel-assigned ones (``tx_socks``, the same list). With a map: per plane, the
        connection's own entropy values (:func:`hpnlab.fabric.routing.entropy.connection_values` of (this rank,
        the peer, the plane)), each value's socket bound once per plane and shared by every
        connection that takes the value."""
        m = self.entropy_map
        if m is None:
            f.socks = self.tx_socks
            return
        f.socks, f.values = [], []
        for plane, ip in enumerate(self.addrs[self.rank]):
            for k in connection_values(m, self.rank, f.dst, plane, self.ports_per_nic):
                f.socks.append(self._value_socket(plane, ip, k))
                f.values.append(k)

    def _value_socket(self, plane: int, ip: str, k: int) -> socket.socket:
        """The socket of entropy value ``k`` on ``plane`` (bound on first use)."""
        sock = self._value_socks.get((plane, k))
        if sock is None:
            sock, value = self._entropy_socket(ip, k)
            self._value_socks[plane, k] = sock
            self.tx_socks.append(sock)
            self.tx_entropy.append(value)
        return sock

    def _rebind(self, f: _TxFlow, path: int) -> None:
        """A new entropy value for ``f``'s ``path``: with a map, the value ``ports_per_nic`` on
        from it (past the connection's own values: another path while the map has more),
        else -- or when that is the same path -- a new port; without a map, a new kernel port."""
        old = f.socks[path]
        ip, port = old.getsockname()[:2]
        if f.values is None:
            old.close()
            self.tx_socks[path], self.tx_entropy[path] = self._tx_socket(ip), None
            return
        m = self.entropy_map
        assert m is not None
        plane = path // self.ports_per_nic
        k = (f.values[path] + self.ports_per_nic) % m.path_count()
        if k == f.values[path]:               # every value taken: the same path on another port
            sock, value = self._entropy_socket(ip, k, avoid=port)
            self.tx_socks.append(sock)
            self.tx_entropy.append(value)
        else:
            sock = self._value_socket(plane, ip, k)
        f.socks[path], f.values[path] = sock, k

    def _send(self, f: _TxFlow, psn: int, e: list, path: int, now: float, is_retx: bool) -> None:
        mid, off, mlen, view = e[0], e[1], e[2], e[3]
        plane = path // self.ports_per_nic
        pseq = f.pseq[path] = (f.pseq[path] + 1) & PSEQ_MASK
        HDR.pack_into(self.hdr_buf, 0, DATA, path, self.rank, f.dst, psn, mid, off, mlen,
                      int(now * 1e6) & 0xFFFFFFFF, pseq)
        e[4] = now
        e[5] = path
        e[8] = pseq
        st = f.stats
        st["packets"] += 1
        st["bytes"] += len(view)
        if is_retx:
            e[6] += 1
            st["retransmissions"] += 1
            f.bursts.retx(now, e[7] or "loss")
        try:
            f.socks[path].sendmsg([self.hdr_buf, view], (), 0, self.peer_addr[f.dst, plane])
        except (BlockingIOError, ConnectionRefusedError):
            st["send_refused"] += 1     # a full socket buffer or ICMP: the packet counts as lost
        except OSError as exc:
            if exc.errno not in LINK_ERRNOS:
                raise
            # the NIC port cannot send (its link is down, its address gone): avoid the plane
            st["link_errors"] += 1
            for g in self.tx.values():
                self._leave_plane(g, plane, now)

    def _timeout(self, f: _TxFlow, now: float) -> None:
        f.stats["timeouts"] += 1
        f.rto_streak += 1
        e = f.unacked.get(f.una)
        if e is not None:
            self.policy.on_feedback(f, e[5], "timeout", now)
            if not self.policy.per_flow and f.paths.on_timeout(e[5], e[4], now, f.srtt):
                self._fail_over(f, [e[5]], now)
        if self.recovery == "gobackn":
            for p in range(f.una, f.psn):
                self._requeue(f, p, "timeout")
        else:
            self._requeue(f, f.una, "timeout")
            # a tail-loss probe on a one-path connection: the newest packet sent goes again
            # too. A lost tail leaves the receiver nothing after the hole to NACK from, so each
            # of its packets would otherwise cost a timeout of its own; once the newest arrives,
            # the receiver NACKs the hole before it (3 packets past a hole on one path). Not the
            # window: most timeouts on a busy machine are late ACKs, and re-sending the window
            # multiplied the retransmissions (bench_defaults' all-reduce 13 -> 287). Not on
            # sprayed connections: their receiver waits out a reordering allowance first, so
            # the probe does not save the timeouts, and with it the sprayed all-reduce of
            # bench_defaults measured 0.73-0.75 of line where it measured 0.82-0.83 without.
            if self.policy.per_flow and f.psn - 1 > f.una:
                self._requeue(f, f.psn - 1, "timeout")
        f.timer_from = now                     # restart the timer (not the packets' send times)
        # backoff, capped low: a dead path is left (below) rather than waited out
        f.rto = min(self.max_rto_s, self._rto(f) * 2)
        if self.policy.per_flow and f.rto_streak >= self.path_params.migrate_after_rtos:
            self._migrate(f, now)

    # ---- receiving ---------------------------------------------------------------------
    def _wait_rx(self, timeout: float) -> list:
        """(plane, socket) pairs with packets waiting, after at most ``timeout`` seconds."""
        return [self._plane_of_fd[fd] for fd, _ in self._ep.poll(timeout)]

    def _poll_rx(self, ready=None) -> int:
        got = 0
        for plane, s in (ready if ready is not None else enumerate(self.rx_socks)):
            while True:
                try:
                    data, anc, _, _ = s.recvmsg(65536, 64)
                except BlockingIOError:
                    break
                except ConnectionRefusedError:
                    continue
                tos = anc[0][2][0] if anc else 0
                got += 1
                self._on_packet(data, tos, plane)
        return got

    def _on_packet(self, data: bytes, tos: int, plane: int = 0) -> None:
        if len(data) < HDR.size:
            return
        typ, path, src, dst, psn, mid, off, mlen, ts, pseq = HDR.unpack_from(data)
        if dst != self.rank or src == self.rank or src >= self.nranks:
            return
        now = time.monotonic()
        self.heard[src] = now
        if typ == DATA:
            self._on_data(self.rx[src], data, tos, path, psn, mid, off, mlen, ts, now, plane, pseq)
        elif typ == ACK:
            f = self.tx[src]
            if ts:
                self._delivered(f, path, ts, 32, now)
            self._reports(f, (mid, off, mlen), now)
            self._on_ack(f, psn, ts, path, now)
        elif typ == NACK:
            self._reports(self.tx[src], (off, mlen), now)
            self._on_nack(self.tx[src], psn, mid, path, now)
        elif typ == PATH_LOSS:
            self._reports(self.tx[src], (off, mlen), now)
            self._on_path_loss(self.tx[src], path, psn, mid, now)
        elif typ == PROBE:
            r = self.rx[src]
            r.stats["probes_received"] += 1
            r.plane_t[plane] = now
            r.reports[path] = ts
            r.probed = r.ack_due = True
        elif typ == CNP:
            f = self.tx[src]
            f.stats["cnps"] += 1
            self.policy.on_feedback(f, path, "ce", now)
            if f.dcqcn:
                f.dcqcn.on_cnp(now)
        elif typ == PLANE:
            if path < self.planes:
                self._on_plane_notice(self.tx[src], path, bool(psn), now)
        elif typ == ABORT:
            raise PeerLost(src, self.peer_addr[src, 0][0], "aborted the run")

    def _on_data(self, r: _RxFlow, data, tos, path, psn, mid, off, mlen, ts, now, plane, pseq):
        st = r.stats
        if self.recovery == "selective":
            self._path_order(r, path, pseq, now)
        st["packets_received"] += 1
        r.plane_t[plane] = now                # answers go on a plane that delivers (_answer_plane)
        r.reports[path] = ts
        if tos & 0x03 == CE:
            st["ce_marks"] += 1
            cnp_every = self.dcqcn_params.cnp_interval_s if self.dcqcn_params else 50e-6
            if now - r.last_cnp >= cnp_every:
                r.last_cnp = now
                st["cnps_sent"] += 1
                self._control(CNP, r.src, self._answer_plane(r, now), path, 0, 0)
        if psn < r.expected or psn in r.ooo:
            st["duplicates"] += 1
            if psn < r.expected:
                # the peer re-sent what we acknowledged: our ACKs on this plane may be lost
                r.suspect_until[r.plane] = now + self.path_params.probe_interval_s
            if r.last_nack[0] >= 0 and psn >= r.last_nack[0] and r.reorder_time:
                # the NACKed packet came twice: it was late, not lost (like RACK's reo_wnd
                # growing on a DSACK) - wait longer before calling a hole a loss
                r.reorder_time = min(REORDER_TIME_MAX_S, r.reorder_time * 2)
                r.last_nack = (-1, r.last_nack[1])
            r.ack_due, r.ack_ts, r.ack_path = True, ts, path
            return
        if psn != r.expected and self.recovery == "gobackn":
            st["dropped_out_of_order"] += 1
            if r.last_nack[0] != r.expected or now - r.last_nack[1] > 0.05:
                r.last_nack = (r.expected, now)
                st["nacks_sent"] += 1
                self._control(NACK, r.src, self._answer_plane(r, now), path, r.expected, 1, 0,
                              self._take_reports(r, 2))
            return
        # busy: part of a message, or data past a hole, was waiting before this packet came;
        # a gap that a new message's first packet ends was idle (the collective's own wait)
        busy = bool(r.msgs or r.ooo)
        r.gaps.arrival(now, psn, busy)
        # place the payload (reassembly buffer keyed by message)
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
            resent_fill = at_hole and (r.hole_ts - ts) & 0xFFFFFFFF >= 1 << 31
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
        # ACK coalescing (as NICs do): at once when a message completes, on reordering, or
        # every ack_every packets; otherwise within ack_delay_s
        r.ack_ts, r.ack_path = ts, path
        r.pending += 1
        if completed or r.ooo or r.pending >= self.ack_every:
            r.ack_due = True
        elif not r.ack_at:
            r.ack_at = now + self.ack_delay_s
        if r.ooo and self.recovery == "selective":
            beyond = max(r.ooo) - r.expected
            if r.hole_psn != r.expected:
                r.hole_psn, r.hole_since, r.hole_ts = r.expected, now, ts
            # a hole is a loss once `reorder_threshold` packets passed it, or (RACK-like,
            # for sprayed packets whose paths differ in delay) once it is older than
            # reorder_time_s with at least 3 packets past it
            lost = beyond >= self.reorder_threshold or (
                beyond >= 3 and now - r.hole_since >= r.reorder_time)
            if lost and (
                    r.last_nack[0] != r.expected or now - r.last_nack[1] > 0.05):
                r.last_nack = (r.expected, now)
                hole = 1
                while r.expected + hole not in r.ooo and hole < 64:
                    hole += 1
                st["nacks_sent"] += 1
                self._control(NACK, r.src, self._answer_plane(r, now), path, r.expected, hole, 0,
                              self._take_reports(r, 2))

    def _flush_acks(self, now: float = 0.0, force: bool = False) -> float:
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
                a, b, c = self._take_reports(r, 3)
                self._control(ACK, r.src, self._answer_plane(r, now), r.ack_path, r.expected, c, r.ack_ts, (a, b))
                r.ack_ts = 0                         # echo (and time) each data packet once
                if r.reports:
                    r.ack_due = True                 # more paths to report: another ACK next round
                    nxt = now
            elif r.ack_at and (not nxt or r.ack_at < nxt):
                nxt = r.ack_at
        return nxt

    def _answer_plane(self, r: _RxFlow, now: float) -> int:
        """The plane to answer the peer on (see :func:`.paths.ack_plane`)."""
        tx = self.tx.get(r.src)
        dead = tx.paths.dead_planes() if tx is not None else set()
        pl = ack_plane(r.plane_t, dead, r.suspect_until, r.plane, now, self.ack_fresh_s)
        if pl != r.plane:
            r.plane = pl
            r.stats["ack_plane_switches"] += 1
        return pl

    @staticmethod
    def _take_reports(r: _RxFlow, n: int) -> list[int]:
        """Up to ``n`` delivery reports (oldest first), removed from what is left to report."""
        out = [NO_REPORT] * n
        for i in range(n):
            if not r.reports:
                break
            path = next(iter(r.reports))
            out[i] = path << 24 | (r.reports.pop(path) & 0xFFFFFF)
        return out

    def _control(self, typ, peer, plane, path, psn, extra, ts=0, reports=(NO_REPORT, NO_REPORT)) -> None:
        """One control packet; ``extra`` goes in the msg id field (NACK: how many PSNs)."""
        HDR.pack_into(self.hdr_buf, 0, typ, path, self.rank, peer, psn, extra, reports[0], reports[1], ts, 0)
        try:
            self.rx_socks[plane].sendto(self.hdr_buf, self.peer_addr[peer, plane])
        except OSError:
            pass                        # a full buffer, ICMP, or the port is down: the answer is lost

    def _delivered(self, f: _TxFlow, path: int, ts: int, bits: int, now: float) -> None:
        """The receiver saw a packet sent on ``path`` at timestamp ``ts`` (its low ``bits``)."""
        if path >= len(f.paths):
            return
        age = ((int(now * 1e6) - ts) & ((1 << bits) - 1)) / 1e6
        # + 1.5 us: the timestamp is the send time rounded down to whole microseconds
        if f.paths.on_delivered(path, now - age + 1.5e-6, now):
            f.next_check = 0.0

    def _reports(self, f: _TxFlow, reports: tuple[int, ...], now: float) -> None:
        for rep in reports:
            if rep != NO_REPORT:
                self._delivered(f, rep >> 24, rep & 0xFFFFFF, 24, now)

    def _on_plane_notice(self, f: _TxFlow, plane: int, up: bool, now: float) -> None:
        """The peer says its port on ``plane`` went down (its paths there are left and what was
        in flight on them re-sent) or came back (they are probed at once)."""
        f.stats["plane_notices"] += 1
        if up:
            f.paths.probe_plane_now(plane, now)
        else:
            self._leave_plane(f, plane, now, "peer_plane_down")

    def _on_ack(self, f: _TxFlow, cum: int, ts: int, path: int, now: float) -> None:
        f.stats["acks"] += 1
        if ts:
            rtt = ((int(now * 1e6) & 0xFFFFFFFF) - ts) % (1 << 32) / 1e6
            if rtt < 10:
                if f.min_rtt is None or rtt < f.min_rtt:
                    f.min_rtt = rtt
                    f.window = self._bdp_window(rtt)
                f.srtt, f.rttvar = rtt_update(f.srtt, f.rttvar, rtt)
                f.rto = max(self.min_rto_s, f.srtt + 4 * f.rttvar)
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

    def _path_order(self, r: _RxFlow, path: int, pseq: int, now: float) -> None:
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
                self._control(PATH_LOSS, r.src, self._answer_plane(r, now), path, (last + 1) & PSEQ_MASK,
                              missing, 0, self._take_reports(r, 2))
        r.path_seq[path] = pseq

    def _on_path_loss(self, f: _TxFlow, path: int, first: int, count: int, now: float) -> None:
        """The receiver found ``count`` packets missing on ``path`` from path sequence
        ``first``: those still unacknowledged whose last copy went there are re-sent. The
        loss cuts the rate as a NACK does, but at most once per smoothed RTT (an overflowing
        queue drops a run of packets, which the sender caused with the rate it had then)."""
        f.stats["path_losses"] += 1
        hit = False
        for psn in range(f.una, f.psn):
            e = f.unacked.get(psn)
            if e is not None and e[5] == path and ((e[8] - first) & PSEQ_MASK) < count:
                hit = self._requeue(f, psn, "nack") or hit
        if not hit:
            return
        self.policy.on_feedback(f, path, "loss", now)
        if f.dcqcn and f.dcqcn.on_cnp(now, f.srtt or 0.0):
            f.stats["loss_cuts"] = f.stats.get("loss_cuts", 0) + 1

    def _on_nack(self, f: _TxFlow, psn: int, count: int, path: int, now: float) -> None:
        f.stats["nacks"] += 1
        # No PFC here: a loss is congestion the ECN marks did not prevent (a queue overflowed
        # or the emulated switch dropped), so on a one-path connection a NACK (a hole three
        # packets old) cuts the rate as a CNP would. On a sprayed one a PSN hole that outlived
        # the reordering allowance may still be a packet late on a slower path: it is re-sent,
        # but the rate cut and the path's penalty come from the path's own sequence numbers
        # (PATH_LOSS), which only a loss can break. Cutting on every such NACK held the sprayed
        # all-to-all of --compare routing at 0.54-0.63 of line where it reached 0.92 without
        # (mini-hpn, 20 Mbit/s: 430-490 NACKs a run, no packet dropped anywhere). Timeouts do
        # not cut either: on a busy machine most are a late ACK, not a loss. (A one-path
        # policy takes no per-path feedback, so the NACK tells the policy nothing.)
        if self.policy.per_flow and f.dcqcn and self.recovery == "selective":
            f.dcqcn.on_cnp(now)
            f.stats["loss_cuts"] = f.stats.get("loss_cuts", 0) + 1
        if psn > f.una:                       # a NACK acknowledges everything before it
            self._on_ack(f, psn, 0, path, now)
        if self.recovery == "gobackn":
            f.retx.clear()
            for p in range(psn, f.psn):
                self._requeue(f, p, "nack")
        else:
            for p in range(psn, min(psn + max(1, count), f.psn)):
                self._requeue(f, p, "nack")

    # ---- results ------------------------------------------------------------------------
    def flow_stats(self) -> list[dict]:
        """This rank's view of its flows: "tx" entries (rank -> peer: sender counters, DCQCN,
        rate samples) and "rx" entries (peer -> rank: CE marks, CNPs sent, reordering)."""
        out = []
        for peer in sorted(self.tx):
            f, r = self.tx[peer], self.rx[peer]
            out.append({"side": "tx", "src": self.rank, "dst": peer, **f.stats,
                        "rate_cuts": f.dcqcn.cuts if f.dcqcn else 0,
                        "final_rate_bps": f.dcqcn.rc if f.dcqcn else self.flow_max_bps,
                        "srtt_us": (f.srtt or 0) * 1e6, "min_rtt_us": (f.min_rtt or 0) * 1e6,
                        "window_pkts": f.window, "samples": f.samples,
                        "app_bytes_sent": f.app_bytes, "app_crc_sent": f"{f.app_crc:08x}",
                        "retx_bursts": f.bursts.export(self.wall_offset),
                        "slowest_msgs": [[a + self.wall_offset, b + self.wall_offset, nb]
                                         for a, b, nb in f.slowest.items()],
                        "paths": f.paths.summary(self.wall_offset),
                        "entropy_policy": self.policy.summary(f)})
            out.append({"side": "rx", "src": peer, "dst": self.rank, **r.stats,
                        "reorder_time_ms": r.reorder_time * 1e3,
                        "app_bytes_delivered": r.app_bytes, "app_crc_delivered": f"{r.app_crc:08x}",
                        "gaps": r.gaps.export(self.wall_offset),
                        "hol_gaps": r.hol.export(self.wall_offset)})
        return out

    def abort(self) -> None:
        """Tell every peer to stop (best effort, a few copies)."""
        if len(self.rx_socks) < self.planes:
            return                      # never started: nobody to tell
        for _ in range(3):
            for r in range(self.nranks):
                if r != self.rank:
                    for p in range(self.planes):
                        self._control(ABORT, r, p, 0, 0, 0)

    def close(self, linger_s: float = 3.0, quiet_s: float = 0.5) -> None:
        """Keep answering for a while (like TCP's TIME_WAIT): a peer whose last ACK was lost
        retransmits, and only a rank still listening can acknowledge it. Ends after
        ``quiet_s`` without packets, at most ``linger_s``."""
        if self.rx_socks and linger_s > 0:
            now = time.monotonic()
            deadline, last = now + linger_s, now
            try:
                while now < deadline and now - last < quiet_s:
                    select.select(self.rx_socks, [], [], 0.05)
                    if self._poll_rx():
                        last = time.monotonic()
                    self._flush_acks(force=True)
                    now = time.monotonic()
            except (OSError, TransportError):
                pass
        for s in self.rx_socks + self.tx_socks:
            s.close()
        if self._link_sock is not None:
            self._link_sock.close()
            self._link_sock = None
        self.rx_socks, self.tx_socks = [], []
        self._value_socks = {}
        self._ep.close()


def _first_for_peer(want, recvs, i, peer) -> bool:
    for j in want:
        if recvs[j][0] == peer:
            return j == i
    return False


def wire_bits(payload: int) -> int:
    return (payload + HDR.size + IP_UDP + ETH) * 8


def packets_for(nbytes: int, mtu: int) -> int:
    return max(1, math.ceil(nbytes / (mtu - IP_UDP - HDR.size)))
