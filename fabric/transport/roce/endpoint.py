"""A rank's sockets (side-effecting): one receiving socket per plane, which also sends the
rank's control packets, and the sending sockets of its paths, whose source ports are the
entropy values the fabric hashes (kernel-assigned ones without an entropy map)."""
from __future__ import annotations

import errno
import select
import socket
import sys
from collections.abc import Callable

from hpnlab.fabric.routing.entropy import FIRST_FREE_PORT, EntropyMap, connection_values, first_high

from ..base import TransportError
from .flows import TxFlow
from .wire import CONTROL_TOS, DATA_DSCP, ECT0, HDR, IP_RECVTOS, NO_REPORT, PROBE, timestamp

#: ``getsockopt(SOL_SOCKET, SO_MEMINFO)`` (Linux): the socket's memory figures, u32 each, the last its drops
SO_MEMINFO, SK_MEMINFO_VARS, SK_MEMINFO_DROPS = 55, 9, 8


def socket_drops(sock: socket.socket) -> int:
    """The packets the kernel dropped at ``sock`` since it opened (0 where it cannot say)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 4 * SK_MEMINFO_VARS)
    except OSError:
        return 0
    if len(raw) < 4 * SK_MEMINFO_VARS:
        return 0
    return int.from_bytes(raw[4 * SK_MEMINFO_DROPS:4 * SK_MEMINFO_DROPS + 4], sys.byteorder)


class Endpoint:
    """The sockets of ``rank`` (``addrs[r]``: rank r's address on each plane), bound by :meth:`open`."""

    def __init__(self, rank: int, addrs: list[list[str]], base_port: int, ports_per_nic: int, ecn: bool,
                 entropy_map: EntropyMap | None):
        self.rank, self.addrs, self.base_port = rank, addrs, base_port
        self.planes = len(addrs[rank])
        self.ports_per_nic = ports_per_nic
        self.ecn = ecn
        self.entropy_map = entropy_map
        self.rx_socks: list[socket.socket] = []
        self.tx_socks: list[socket.socket] = []     # no map: index plane * ports + k; map: every bound value
        self.tx_entropy: list[int | None] = []      # per path: its entropy value number in the map (None: kernel port)
        self._value_socks: dict[tuple[int, int], socket.socket] = {}   # map: (plane, value) -> its socket
        self.peer_addr: dict[tuple[int, int], tuple[str, int]] = {}   # (rank, plane) -> (ip, port)
        self.hdr_buf = bytearray(HDR.size)
        self._ep = select.epoll()
        self._plane_of_fd: dict[int, tuple] = {}

    @property
    def port(self) -> int:
        """This rank's UDP port (every plane's receiving socket)."""
        return self.base_port + self.rank

    def open(self) -> None:
        """Bind the receiving socket of every plane (and, without a map, the rank's shared sending
        sockets: ``ports_per_nic`` per plane) and learn the peers' addresses."""
        port = self.port
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
                    self.tx_socks.append(self.tx_socket(ip))
                    self.tx_entropy.append(None)
        for r, ips in enumerate(self.addrs):
            for p in range(self.planes):
                self.peer_addr[r, p] = (ips[p % len(ips)], self.base_port + r)

    @property
    def is_open(self) -> bool:
        return len(self.rx_socks) >= self.planes

    # ---- receiving -----------------------------------------------------------------------
    def wait(self, timeout: float) -> list:
        """(plane, socket) pairs with packets waiting, after at most ``timeout`` seconds."""
        return [self._plane_of_fd[fd] for fd, _ in self._ep.poll(timeout)]

    def receive(self, handle: Callable[[bytes, int, int], None], ready=None) -> int:
        """Hand every packet waiting on ``ready`` (None: every plane) to ``handle(data, tos,
        plane)``; how many there were."""
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
                handle(data, tos, plane)
        return got

    # ---- sending headers -----------------------------------------------------------------
    def control(self, typ, peer, plane, path, psn, extra, ts=0, reports=(NO_REPORT, NO_REPORT)) -> None:
        """One control packet to ``peer`` on ``plane``; ``extra`` goes in the msg id field (NACK:
        how many PSNs)."""
        HDR.pack_into(self.hdr_buf, 0, typ, path, self.rank, peer, psn, extra, reports[0], reports[1], ts, 0)
        try:
            self.rx_socks[plane].sendto(self.hdr_buf, self.peer_addr[peer, plane])
        except OSError:
            pass                        # a full buffer, ICMP, or the port is down: the answer is lost

    def probe(self, f: TxFlow, path: int, now: float) -> None:
        """One probe down ``f``'s ``path`` (from the path's own socket)."""
        HDR.pack_into(self.hdr_buf, 0, PROBE, path, self.rank, f.dst, 0, 0, 0, 0, timestamp(now), 0)
        try:
            f.socks[path].sendto(self.hdr_buf, self.peer_addr[f.dst, path // self.ports_per_nic])
        except OSError:
            pass

    # ---- the paths' sockets (entropy values) ---------------------------------------------
    def tx_socket(self, ip: str, sport: int = 0) -> socket.socket:
        """A sending socket on ``ip`` with source port ``sport`` (0: kernel-assigned): one path's entropy."""
        ts = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            ts.bind((ip, sport))
        except OSError:
            ts.close()
            raise
        ts.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, DATA_DSCP << 2 | (ECT0 if self.ecn else 0))
        ts.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        ts.setblocking(False)
        return ts

    def entropy_socket(self, ip: str, k: int, avoid: int = -1) -> tuple[socket.socket, int | None]:
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
                    return self.tx_socket(ip, sport), k % m.path_count()
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise TransportError(f"rank {self.rank}: cannot bind UDP {ip}:{sport}: "
                                             f"{exc.strerror}") from None
        return self.tx_socket(ip), None

    def bind_connection(self, f: TxFlow) -> None:
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
                f.socks.append(self.value_socket(plane, ip, k))
                f.values.append(k)

    def value_socket(self, plane: int, ip: str, k: int) -> socket.socket:
        """The socket of entropy value ``k`` on ``plane`` (bound on first use)."""
        sock = self._value_socks.get((plane, k))
        if sock is None:
            sock, value = self.entropy_socket(ip, k)
            self._value_socks[plane, k] = sock
            self.tx_socks.append(sock)
            self.tx_entropy.append(value)
        return sock

    def rebind(self, f: TxFlow, path: int) -> None:
        """A new entropy value for ``f``'s ``path``: with a map, the value ``ports_per_nic`` on
        from it (past the connection's own values: another path while the map has more),
        else -- or when that is the same path -- a new port; without a map, a new kernel port."""
        old = f.socks[path]
        ip, port = old.getsockname()[:2]
        if f.values is None:
            old.close()
            self.tx_socks[path], self.tx_entropy[path] = self.tx_socket(ip), None
            return
        m = self.entropy_map
        assert m is not None
        plane = path // self.ports_per_nic
        k = (f.values[path] + self.ports_per_nic) % m.path_count()
        if k == f.values[path]:               # every value taken: the same path on another port
            sock, value = self.entropy_socket(ip, k, avoid=port)
            self.tx_socks.append(sock)
            self.tx_entropy.append(value)
        else:
            sock = self.value_socket(plane, ip, k)
        f.socks[path], f.values[path] = sock, k

    def socket_drops(self) -> int:
        """Packets the kernel dropped at this rank's receiving sockets (a full receive buffer:
        the application did not read in time), summed over the planes (``SO_MEMINFO``)."""
        return sum(socket_drops(s) for s in self.rx_socks)

    def source_ports(self) -> list[int]:
        return [s.getsockname()[1] for s in self.tx_socks]

    def close(self) -> None:
        for s in self.rx_socks + self.tx_socks:
            s.close()
        self.rx_socks, self.tx_socks = [], []
        self._value_socks = {}
        self._ep.close()
