"""Kernel TCP: one connection per pair of ranks, messages framed by a small header.

Rank i listens on port ``base_port + i`` on each of its addresses and connects to every
lower rank (so each pair has exactly one connection, in both directions). A pair uses
plane ``(i + j) mod planes``: like per-flow ECMP across planes, fixed for the pair; the
kernel chooses the source port. ECN is whatever the host's ``net.ipv4.tcp_ecn`` says
(reported in ``info()``); the kernel's own counters (TCP_INFO: retransmissions, CE-marked
deliveries, bytes acked) are the per-flow counters.
"""
from __future__ import annotations

import errno
import select
import selectors
import socket
import struct
import time

from .base import PeerLost, Transport, TransportError

HDR = struct.Struct("!IQ")          # magic, message length
MAGIC = 0x48504E4C                  # "HPNL"
SAMPLE_S = 0.025


def tcp_ecn_setting() -> str:
    try:
        with open("/proc/sys/net/ipv4/tcp_ecn") as fh:
            return fh.read().strip()
    except OSError:
        return "unknown"


def tcp_info(sock: socket.socket) -> dict:
    """A few fields of struct tcp_info (linux/tcp.h) by their fixed offsets."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    except OSError:
        return {}
    out = {}
    if len(raw) >= 104:
        out["retransmissions"] = struct.unpack_from("I", raw, 100)[0]   # tcpi_total_retrans
        out["rtt_us"] = struct.unpack_from("I", raw, 68)[0]             # tcpi_rtt
    if len(raw) >= 128:
        out["bytes_acked"] = struct.unpack_from("Q", raw, 120)[0]
    if len(raw) >= 144:
        out["segs_out"] = struct.unpack_from("I", raw, 136)[0]
    if len(raw) >= 200:
        out["ce_marks"] = struct.unpack_from("I", raw, 196)[0]          # tcpi_delivered_ce
    return out


class _Conn:
    __slots__ = (
        "addr",
        "cur",
        "cur_pos",
        "hdr",
        "inq",
        "last_sample",
        "out",
        "out_pos",
        "peer",
        "samples",
        "sent_bytes",
        "sock",
    )

    def __init__(self, peer, sock, addr):
        self.peer, self.sock, self.addr = peer, sock, addr
        self.out = []        # pending outgoing buffers (memoryviews)
        self.out_pos = 0
        self.inq = []        # expected incoming message lengths, in order
        self.cur = None      # bytearray being filled
        self.cur_pos = 0
        self.hdr = bytearray()
        self.sent_bytes = 0
        self.samples = []
        self.last_sample = 0.0


class TcpTransport(Transport):
    name = "tcp"

    def __init__(self, rank: int, addrs: list[list[str]], *, base_port: int = 29500,
                 timeout_s: float = 10.0, sndbuf: int = 0):
        self.rank, self.nranks, self.addrs = rank, len(addrs), addrs
        self.base_port = base_port
        self.timeout_s = timeout_s
        self.sndbuf = sndbuf
        self.conns: dict[int, _Conn] = {}
        self.sel = selectors.DefaultSelector()
        self.listeners: list[socket.socket] = []

    def info(self) -> dict:
        return {"transport": "tcp", "tcp_ecn": tcp_ecn_setting(), "base_port": self.base_port}

    def _plane(self, a: int, b: int) -> int:
        return (a + b) % min(len(self.addrs[a]), len(self.addrs[b]))

    def start(self) -> None:
        for ip in self.addrs[self.rank]:
            ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                ls.bind((ip, self.base_port + self.rank))
            except OSError as exc:
                ls.close()
                raise TransportError(f"rank {self.rank}: cannot listen on {ip}:"
                                     f"{self.base_port + self.rank}: {exc.strerror}") from None
            ls.listen(self.nranks)
            ls.setblocking(False)
            self.listeners.append(ls)
        deadline = time.monotonic() + self.timeout_s
        to_connect = list(range(self.rank))
        while to_connect or len(self.conns) < self.nranks - 1:
            if time.monotonic() > deadline:
                missing = [r for r in range(self.nranks) if r != self.rank and r not in self.conns]
                r = missing[0]
                raise PeerLost(r, self.addrs[r][self._plane(self.rank, r)],
                               f"did not connect within {self.timeout_s:g} s (unreachable or not started)")
            for r in list(to_connect):
                ip = self.addrs[r][self._plane(self.rank, r)]
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind((self.addrs[self.rank][self._plane(self.rank, r)], 0))
                s.settimeout(0.5)
                try:
                    s.connect((ip, self.base_port + r))
                    s.sendall(struct.pack("!II", MAGIC, self.rank))
                except OSError:
                    s.close()
                    continue
                to_connect.remove(r)
                self._add(r, s, ip)
            for ls in self.listeners:
                while True:
                    try:
                        s, (ip, _) = ls.accept()
                    except BlockingIOError:
                        break
                    s.settimeout(2.0)
                    try:
                        magic, peer = struct.unpack("!II", _recv_exact(s, 8))
                    except (OSError, ConnectionError):
                        s.close()
                        continue
                    if magic != MAGIC or not 0 <= peer < self.nranks:
                        s.close()
                        continue
                    self._add(peer, s, ip)
            if to_connect or len(self.conns) < self.nranks - 1:
                time.sleep(0.02)

    def _add(self, peer: int, s: socket.socket, ip: str) -> None:
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.sndbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)
        self.conns[peer] = _Conn(peer, s, ip)

    def exchange(self, sends, recvs, wait_sends: bool = True):
        """See ``hpnlab.fabric.transport``; with ``wait_sends=False`` the sends are copied and written
        in the background of later calls (``flush`` finishes them)."""
        results: list = [None] * len(recvs)
        done_at = [0.0] * len(recvs)          # when each receive completed (monotonic s)
        slots: dict[int, list[int]] = {}
        for i, (peer, nbytes) in enumerate(recvs):
            c = self.conns[peer]
            c.inq.append(nbytes)
            slots.setdefault(peer, []).append(i)
        for peer, data in sends:
            c = self.conns[peer]
            mv = memoryview(data).cast("B")
            if not wait_sends:
                mv = memoryview(bytes(mv))
            c.out.append(memoryview(HDR.pack(MAGIC, len(mv))))
            c.out.append(mv)
        mine = {peer for peer, _ in sends} if wait_sends else set()
        active = {c.peer for c in self.conns.values() if c.out or c.inq}
        for peer in active:
            c = self.conns[peer]
            ev = (selectors.EVENT_READ if c.inq else 0) | (selectors.EVENT_WRITE if c.out else 0)
            self.sel.register(c.sock, ev, c)
        pending_recv = len(recvs)
        last_progress = time.monotonic()
        try:
            while pending_recv or any(self.conns[p].out for p in mine):
                events = self.sel.select(timeout=0.2)
                now = time.monotonic()
                if not events and now - last_progress > self.timeout_s:
                    c = next(self.conns[p] for p in active if self.conns[p].out or self.conns[p].inq)
                    raise PeerLost(c.peer, c.addr, f"made no progress for {self.timeout_s:g} s")
                for key, mask in events:
                    c = key.data
                    if mask & selectors.EVENT_WRITE and c.out:
                        self._write(c)
                    if mask & selectors.EVENT_READ and c.inq:
                        for data in self._read(c):
                            slot = slots[c.peer].pop(0)
                            results[slot] = data
                            done_at[slot] = now
                            pending_recv -= 1
                    ev = (selectors.EVENT_READ if c.inq else 0) | (selectors.EVENT_WRITE if c.out else 0)
                    if ev:
                        self.sel.modify(c.sock, ev, c)
                    else:
                        self.sel.unregister(c.sock)
                    last_progress = now
                    if now - c.last_sample >= SAMPLE_S:
                        self._sample(c, now)
        finally:
            for peer in active:
                try:
                    self.sel.unregister(self.conns[peer].sock)
                except (KeyError, ValueError):
                    pass
        if recvs:
            self.recv_done = done_at
        return results

    def flush(self) -> None:
        """Write out everything still queued (the kernel then delivers it)."""
        last = time.monotonic()
        while True:
            pending = [c for c in self.conns.values() if c.out]
            if not pending:
                return
            _, writable, _ = select.select([], [c.sock for c in pending], [], 0.2)
            for c in pending:
                if c.sock in writable:
                    before = c.sent_bytes
                    self._write(c)
                    if c.sent_bytes != before:
                        last = time.monotonic()
            if time.monotonic() - last > self.timeout_s:
                c = pending[0]
                raise PeerLost(c.peer, c.addr, f"took nothing for {self.timeout_s:g} s")

    def _write(self, c: _Conn) -> None:
        while c.out:
            buf = c.out[0][c.out_pos:]
            try:
                sent = c.sock.send(buf)
            except BlockingIOError:
                return
            except OSError as exc:
                raise PeerLost(c.peer, c.addr, f"closed the connection ({exc.strerror})") from None
            c.sent_bytes += sent
            c.out_pos += sent
            if c.out_pos == len(c.out[0]):
                c.out.pop(0)
                c.out_pos = 0
            else:
                return

    def _read(self, c: _Conn):
        done: list[bytearray] = []
        while c.inq:
            try:
                if c.cur is None:
                    chunk = c.sock.recv(HDR.size - len(c.hdr))
                    if not chunk:
                        raise PeerLost(c.peer, c.addr, "closed the connection (rank gone)")
                    c.hdr += chunk
                    if len(c.hdr) < HDR.size:
                        return done
                    magic, length = HDR.unpack(c.hdr)
                    c.hdr = bytearray()
                    if magic != MAGIC or length != c.inq[0]:
                        raise TransportError(f"rank {self.rank}: rank {c.peer} sent a {length} B "
                                             f"message where {c.inq[0]} B were expected (out of step)")
                    c.cur = bytearray(length)
                    c.cur_pos = 0
                if c.cur_pos < len(c.cur):
                    n = c.sock.recv_into(memoryview(c.cur)[c.cur_pos:])
                    if n == 0:
                        raise PeerLost(c.peer, c.addr, "closed the connection (rank gone)")
                    c.cur_pos += n
                if c.cur_pos == len(c.cur):
                    done.append(c.cur)
                    c.cur = None
                    c.inq.pop(0)
            except BlockingIOError:
                return done
            except ConnectionError as exc:
                raise PeerLost(c.peer, c.addr, f"reset the connection ({exc.strerror})") from None
        return done

    def _sample(self, c: _Conn, now: float) -> None:
        c.last_sample = now
        info = tcp_info(c.sock)
        c.samples.append([time.time(), info.get("bytes_acked", c.sent_bytes), 0])

    def flow_stats(self) -> list[dict]:
        out = []
        for peer, c in sorted(self.conns.items()):
            info = tcp_info(c.sock)
            out.append({"side": "tx", "src": self.rank, "dst": peer, "bytes": c.sent_bytes,
                        "packets": info.get("segs_out", 0),
                        "retransmissions": info.get("retransmissions", 0),
                        "ce_marks": info.get("ce_marks", 0), "rtt_us": info.get("rtt_us", 0),
                        "samples": c.samples})
        return out

    def close(self) -> None:
        for c in self.conns.values():
            try:
                c.sock.close()
            except OSError:
                pass
        for ls in self.listeners:
            ls.close()
        self.sel.close()


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(errno.ECONNRESET, "closed")
        buf += chunk
    return buf
