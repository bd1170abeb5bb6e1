"""The state of one flow at each end (plain records; the parts of the transport act on them).

A *flow* is one direction of a rank pair (a queue pair): :class:`TxFlow` at the sender (what
the application posted, the packets in flight, the timers, the rate, the paths),
:class:`RxFlow` at the receiver (the reassembly and reordering buffer, what to acknowledge,
where to answer). Every packet in flight is one list in ``TxFlow.unacked``, indexed by PSN:
``[msg id, offset, message length, payload view, send time, path, times re-sent, why it is
queued again, path sequence]`` (lists, not objects: the send path touches it per packet).
"""
from __future__ import annotations

import socket
from collections import deque
from typing import Any

from hpnlab.fabric.routing.entropy import flow_hash

from ..accounting import BurstLog, GapLog, Largest
from ..paths import PathTable
from .dcqcn import Dcqcn


class TxFlow:
    """The sending end of a flow."""
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

    def __init__(self, src: int, dst: int, now: float, dcqcn: Dcqcn | None, paths: PathTable):
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
                      "link_errors": 0, "path_losses": 0, "send_refused": 0, "send_blocked": 0,
                      "plane_notices": 0, "pause_waits": 0,
                      "retx_timeout": 0, "retx_nack": 0, "retx_failover": 0, "retx_migrate": 0,
                      "timeouts_paused": 0}
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
        self.min_rtt: float | None = None
        self.window = 0
        self.held_path: int | None = None   # chosen for the next packet, which waited for its port
        self.socks: list[socket.socket] = []     # per path: the sending socket (its source port)
        self.values: list[int] | None = None     # per path: its entropy value in the map (None: no map)

    def requeue(self, psn: int, why: str) -> bool:
        """Queue packet ``psn`` to be sent again (``why``: nack, timeout, failover, migrate),
        unless it is acknowledged or queued already; whether it was queued."""
        e = self.unacked.get(psn)
        if e is None or psn in self.retx:
            return False
        e[7] = why
        self.retx.append(psn)
        return True

    def can_send(self) -> bool:
        """Whether the flow has a packet to send: one queued to be sent again, or a new one that
        the window allows (drops the queued re-sends acknowledged meanwhile)."""
        retx = self.retx
        while retx and retx[0] not in self.unacked:
            retx.popleft()
        if retx:
            return True
        return self.psn - self.una < self.window and (self.cur is not None or bool(self.queue))


class RxFlow:
    """The receiving end of a flow."""
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

    def __init__(self, src: int, planes: int = 1, gap_threshold_s: float = 0.002):
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
