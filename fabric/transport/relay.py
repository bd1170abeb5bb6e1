"""A UDP relay on loopback that fails one path on cue, for the roce transport's host-side
failover (tests/unit/test_transport_failover.py, tools/bench/bench_transport.py); its base,
:class:`UdpRelay`, is also the impairing relay's of tests/unit/test_transport.py.

One relay forwards one plane and direction (``listen`` -> ``forward``). It forwards
everything except what comes from its *blocked* source addresses (a sending socket is one path:
one source port of one plane), or everything while ``down``. A failure starts when a chosen
source has had ``after`` data packets through (that one is the first dropped), and a repair
when ``repair_after_probes`` probes from it were dropped. Each packet's roce header is parsed
and logged (source, type, path, psn, send timestamp, dropped), so a caller can check causally
what the transport did; ``first_lost_ts`` is the send timestamp of the first data packet dropped.
"""
from __future__ import annotations

import select
import socket
import threading

from .roce.wire import DATA, HDR, PROBE


class UdpRelay(threading.Thread):
    """A thread that receives on ``listen`` and sends on to ``forward`` (what it forwards, and how, is
    its subclass's ``run``); ``recv_tos``: the TOS byte of every packet comes with it (``recvmsg``)."""

    def __init__(self, listen: tuple[str, int], forward: tuple[str, int], recv_tos: bool = False):
        super().__init__(daemon=True)
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.bind(listen)
        if recv_tos:
            self.rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.forward = forward
        self.stop = False

    def close(self) -> None:
        self.stop = True
        self.join(2)
        self.rx.close()
        self.tx.close()


class PathRelay(UdpRelay):
    def __init__(self, listen: tuple[str, int], forward: tuple[str, int]):
        super().__init__(listen, forward)
        self.blocked: set = set()
        self.down = False
        self.whole = False
        self.watch: tuple | None = None     # (source, fail after data packets, repair after probes)
        self.watched_data = 0
        self.dropped_probes = 0
        self.first_lost_ts: int | None = None
        self.log: list[tuple] = []          # (source, type, path, psn, ts, dropped)

    def fail(self, source: tuple, after: int, repair_after_probes: int | None = None, whole: bool = False) -> None:
        """Once ``source`` had ``after`` data packets, drop what it sends from that one on
        (``whole``: drop everything: the plane fails)."""
        self.watch = (source, after, repair_after_probes)
        self.whole = whole

    def run(self) -> None:
        while not self.stop:
            r, _, _ = select.select([self.rx], [], [], 0.05)
            if not r:
                continue
            data, src = self.rx.recvfrom(65536)
            typ, path, _s, _d, psn, _m, _o, _l, ts, _q = HDR.unpack_from(data)
            if self.watch is not None and src == self.watch[0]:
                source, after, _repair = self.watch
                if typ == DATA and not self.blocked:
                    self.watched_data += 1
                    if self.watched_data == after:
                        self.blocked = {source}
                        self.down = self.whole
                elif typ == PROBE and src in self.blocked:
                    self.dropped_probes += 1
            dropped = self.down or src in self.blocked
            if self.watch is not None and self.watch[2] is not None and self.dropped_probes >= self.watch[2]:
                self.blocked, self.watch = set(), None      # repaired after this probe was dropped
            if dropped and typ == DATA and self.first_lost_ts is None:
                self.first_lost_ts = ts
            self.log.append((src, typ, path, psn, ts, dropped))
            if not dropped:
                self.tx.sendto(data, self.forward)
