"""Kernel TCP: one connection per ordered pair of ranks, messages framed by a small header.

Rank i listens on port ``base_port + i`` on each of its addresses and connects to every
other rank; it sends on the connections it opened and receives on those it accepted (as
NCCL's socket transport: the sender connects). A pair uses plane ``(i + j) mod planes``:
like per-flow ECMP across planes, fixed for the pair.

The source port is the fabric's entropy (the switches match its bits), so each connection
binds one drawn from a hash of its addresses and destination port (:func:`source_port`), as
a switch's 5-tuple hash would spread it. Left to the kernel, every flow of a host would take
the same path on any fabric whose entropy map reads bit 0: Linux gives ``connect()`` even
ports only (``bind()`` keeps the odd ones), and the accepting side of a connection sends from
its one listening port. ECN is whatever the host's ``net.ipv4.tcp_ecn`` says and the congestion
control whatever its ``tcp_congestion_control`` says (both reported in ``info()``); the
kernel's own counters (TCP_INFO: retransmissions, CE-marked deliveries, bytes acked) are the
per-flow counters.
"""
from __future__ import annotations

import errno
import select
import selectors
import socket
import struct
import time
import zlib

from .base import PeerLost, Transport, TransportError

HDR = struct.Struct("!IQ")          # magic, message length
MAGIC = 0x48504E4C                  # "HPNL"
SAMPLE_S = 0.025
EPHEMERAL = (32768, 61000)          # Linux's default ip_local_port_range, end exclusive
BIND_TRIES = 16


def source_port(src_ip: str, dst_ip: str, dst_port: int, attempt: int = 0) -> int:
    """The source port a connection binds: a CRC-32 of its addresses, destination port and
    ``attempt`` (the next one if that port is taken) over the ephemeral range, so the bits the
    switches match are spread as a 5-tuple hash spreads flows, and a run is repeatable (pure)."""
    lo, hi = EPHEMERAL
    key = f"{src_ip} {dst_ip} {dst_port} {attempt}".encode()
    return lo + zlib.crc32(key) % (hi - lo)


def tcp_setting(name: str) -> str | None:
    """A ``net.ipv4`` sysctl of the network namespace this process runs in (None: unreadable)."""
    try:
        with open(f"/proc/sys/net/ipv4/{name}") as fh:
            return fh.read().strip()
    except OSError:
        return None


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
        self.conns: dict[int, _Conn] = {}       # the connections this rank opened: it sends on them
        self.rconns: dict[int, _Conn] = {}      # the ones it accepted: it receives on them
        self.sel = selectors.DefaultSelector()
        self.listeners: list[socket.socket] = []

    def info(self) -> dict:
        # the congestion control a new namespace inherits from the machine (BBR on some, CUBIC
        # on a stock Debian): the same experiment differs with it, so every run records it
        return {"transport": "tcp", "tcp_ecn": tcp_setting("tcp_ecn") or "unknown",
                "tcp_congestion_control": tcp_setting("tcp_congestion_control") or "unknown",
                "base_port": self.base_port}

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
        to_connect = [r for r in range(self.nranks) if r != self.rank]
        attempts = dict.fromkeys(to_connect, 0)    # a failed connect tries the next source port
        while to_connect or len(self.rconns) < self.nranks - 1:
            if time.monotonic() > deadline:
                missing = to_connect or [r for r in range(self.nranks) if r != self.rank and r not in self.rconns]
                r = missing[0]
                raise PeerLost(r, self.addrs[r][self._plane(self.rank, r)],
                               f"did not connect within {self.timeout_s:g} s (unreachable or not started)")
            for r in list(to_connect):
                ip = self.addrs[r][self._plane(self.rank, r)]
                s, attempts[r] = self._bound_socket(self.addrs[self.rank][self._plane(self.rank, r)], ip,
                                                    self.base_port + r, attempts[r])
                s.settimeout(0.5)
                try:
                    s.connect((ip, self.base_port + r))
                    s.sendall(struct.pack("!II", MAGIC, self.rank))
                except OSError:
                    s.close()
                    attempts[r] += 1
                    continue
                to_connect.remove(r)
                self.conns[r] = self._conn(r, s, ip)
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
                    if magic != MAGIC or not 0 <= peer < self.nranks or peer == self.rank:
                        s.close()
                        continue
                    self.rconns[peer] = self._conn(peer, s, ip)
            if to_connect or len(self.rconns) < self.nranks - 1:
                time.sleep(0.02)

    @staticmethod
    def _bound_socket(src_ip: str, dst_ip: str, dst_port: int, attempt: int) -> tuple[socket.socket, int]:
        """A socket bound to ``src_ip`` and the connection's :func:`source_port` for ``attempt``
        (the next candidates while one is taken; the kernel's choice after ``BIND_TRIES``), and
        the attempt that bound."""
        for a in range(attempt, attempt + BIND_TRIES + 1):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            port = source_port(src_ip, dst_ip, dst_port, a) if a < attempt + BIND_TRIES else 0
            try:
                s.bind((src_ip, port))
                return s, a
            except OSError:
                s.close()
                if port == 0:
                    raise
        raise AssertionError("unreachable")

    def _conn(self, peer: int, s: socket.socket, ip: str) -> _Conn:
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.sndbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)
        return _Conn(peer, s, ip)

    def exchange(self, sends, recvs, wait_sends: bool = True):
        """See ``hpnlab.fabric.transport``; with ``wait_sends=False`` the sends are copied and written
        in the background of later calls (``flush`` finishes them)."""
        results: list = [None] * len(recvs)
        done_at = [0.0] * len(recvs)          # when each receive completed (monotonic s)
        slots: dict[int, list[int]] = {}
        for i, (peer, nbytes) in enumerate(recvs):
            c = self.rconns[peer]
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
        active = [c for c in (*self.conns.values(), *self.rconns.values()) if c.out or c.inq]
        for c in active:
            ev = (selectors.EVENT_READ if c.inq else 0) | (selectors.EVENT_WRITE if c.out else 0)
            self.sel.register(c.sock, ev, c)
        pending_recv = len(recvs)
        last_progress = time.monotonic()
        try:
            while pending_recv or any(self.conns[p].out for p in mine):
                events = self.sel.select(timeout=0.2)
                now = time.monotonic()
                if not events and now - last_progress > self.timeout_s:
                    c = next(c for c in active if c.out or c.inq)
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
                    if mask & selectors.EVENT_WRITE and now - c.last_sample >= SAMPLE_S:
                        self._sample(c, now)
        finally:
            for c in active:
                try:
                    self.sel.unregister(c.sock)
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
        for c in (*self.conns.values(), *self.rconns.values()):
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
