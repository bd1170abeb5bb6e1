"""The userspace datapath's send socket: sized to the switch ports' buffers.

Why (measured, issue 11): on the userspace datapath ovs-vswitchd sends every packet to every
``system`` (AF_PACKET) port through ONE packet socket (``af_packet_sock`` in Open vSwitch's
lib/netdev-linux.c). A packet waiting in a switch port's egress queue (the htb class and its
port buffer, :mod:`.shaping`) is still charged to that socket's send buffer, whose size is
``net.core.wmem_default`` (212,992 B here) when OVS opened it: about 25 frames of 4 KB in
truesize, for the whole fabric. Once the ports' queues hold that much together, OVS's send
fails with EAGAIN and the packet is dropped where no tc counter, ECN-stage counter or port
statistic the harness reads sees it (only OVS's log: "error sending Ethernet packet on X:
Resource temporarily unavailable"). On mini-hpn at the budget's rates (8 ranks, 33 Mbit/s,
MTU 4096), a 1 MiB all-to-all lost 184 of 7,756 packets this way with every qdisc at 0 drops:
the retransmission timeouts that set the pace of the routing comparison. The port buffers
(50 ms of each port's rate) were never reached.

So the emulation raises that one socket's send buffer (``SO_SNDBUFFORCE``, through a copy of
its descriptor: ``pidfd_getfd``, Linux 5.6) to what every switch port's buffer holds at once
(:func:`send_buffer_bytes`), never lowers it, and puts the old size back when it stops. The old
size is written into the run's state file before the socket is changed (``RunState.add_send_buffer``),
so `hpnlab clean` after a crash puts it back too, while ovs-vswitchd (pid and start time) still holds
that socket (descriptor and inode: :func:`same_socket`).

The receive side (measured, issue 11): each ``system`` port has a packet socket of its own that
ovs-vswitchd reads the port's arriving packets from, its receive buffer ``net.core.rmem_default``
(212,992 B) as well. When a busy machine keeps ovs-vswitchd from reading for a few tens of
milliseconds, the kernel drops what no longer fits there -- again where no tc counter or port
statistic sees it (only the socket's own drop count, ``ss -0 -m``'s ``d``). On mini-hpn at 20
Mbit/s a sprayed all-to-all lost up to 1,900 of 24,800 packets a run so, with 29 counted at the
port buffers; one host-facing port's socket had dropped 231 within 30 s. A real switch does not
drop at its ingress. So every port's receive socket is raised (``SO_RCVBUFFORCE``, as above) to
hold :data:`RX_STALL_S` of the port's rate (:func:`receive_buffer_bytes`); the sockets go with
their ports, so there is nothing to put back. What they still drop is counted per run
(:func:`ingress_drops`, the socket's ``SO_MEMINFO`` drop count) beside the port buffers' drops.
"""
from __future__ import annotations

import ctypes
import math
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpnlab.fabric.scenario.rates import frame_bytes

OVS_PIDFILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")
SYS_PIDFD_GETFD = 438          # the same number on x86-64 and arm64 (the generic table)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
#: an skb's truesize over the frame it carries, at most (a 4,110 B frame sits in an 8 KiB buffer)
TRUESIZE_FACTOR = 2
#: the kernel doubles what SO_SNDBUF(FORCE) is given and keeps it below INT_MAX
MAX_BUFFER = (1 << 30) - 1
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_MEMINFO = 55                # Linux 4.12: the socket's memory counters, SK_MEMINFO_DROPS among them
SK_MEMINFO_DROPS = 8
#: how long ovs-vswitchd may leave a port unread before its receive socket overflows, and the
#: most one port's receive socket may hold (the memory is taken only while packets wait)
RX_STALL_S = 0.25
RX_MAX = 8 << 20
#: the buffer options by direction: (read, force-set)
OPTIONS = {"send": (socket.SO_SNDBUF, SO_SNDBUFFORCE), "receive": (socket.SO_RCVBUF, SO_RCVBUFFORCE)}


def send_buffer_bytes(queue_bytes: list[int], factor: int = TRUESIZE_FACTOR) -> int:
    """The send buffer that holds every switch port's full queue at once (``queue_bytes``: each
    port's buffer, ``shaping.Shape.queue_bytes``), in the kernel's truesize accounting (pure)."""
    return min(MAX_BUFFER, factor * sum(max(0, q) for q in queue_bytes))


def receive_buffer_bytes(rate_mbps: float, mtu: int, stall_s: float = RX_STALL_S,
                         factor: int = TRUESIZE_FACTOR) -> int:
    """The receive buffer that holds ``stall_s`` of a port's arrivals at its rate (at least 64
    frames, at most :data:`RX_MAX`), in the kernel's truesize accounting (pure)."""
    frame = frame_bytes(mtu)
    frames = max(64, math.ceil(rate_mbps * 1e6 / 8 * stall_s / frame))
    return min(RX_MAX, factor * frames * frame)


def receive_sockets(packet_table: str, owner_inodes: dict[str, int],
                    ifindexes: dict[int, str]) -> dict[int, tuple[str, str]]:
    """The owner's packet sockets bound to these interfaces (``ifindexes``: index -> name), the
    ones it reads each port's packets from: descriptor -> (inode, interface) (pure)."""
    out = {}
    for line in packet_table.splitlines()[1:]:
        f = line.split()
        if len(f) >= 9 and f[4].isdigit() and int(f[4]) in ifindexes and f[8] in owner_inodes:
            out[owner_inodes[f[8]]] = (f[8], ifindexes[int(f[4])])
    return out


def _port_sockets(intfs: list[str]) -> tuple[int, dict[int, tuple[str, str]]]:
    pid = int(OVS_PIDFILE.read_text().split()[0])
    ifindexes = {}
    for name in intfs:
        try:
            ifindexes[socket.if_nametoindex(name)] = name
        except OSError:
            continue                          # gone (a remote or removed port)
    return pid, receive_sockets(Path("/proc/net/packet").read_text(), _owner_inodes(pid), ifindexes)


def raise_receive_buffers(wants: dict[str, int]) -> list[tuple[str, int, int]]:
    """Raise ovs-vswitchd's receive socket of each port (interface -> bytes wanted); (interface,
    before, after) per socket. Raises OSError when OVS or its sockets cannot be reached."""
    pid, socks = _port_sockets(list(wants))
    if not socks:
        raise OSError("ovs-vswitchd has no packet socket on these ports")
    out = []
    for fd, (inode, intf) in sorted(socks.items()):
        [(_pid, _fd, before, after)] = raise_sockets(pid, {fd: inode}, wants[intf], direction="receive")
        out.append((intf, before, after))
    return out


def ingress_drops(intfs: list[str]) -> dict[str, int]:
    """Packets each port's receive socket dropped so far (its SO_MEMINFO drop count); {} when
    OVS or the sockets cannot be reached."""
    def drops(sock: Any) -> int:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 4 * (SK_MEMINFO_DROPS + 1))
        return struct.unpack(f"{len(raw) // 4}I", raw)[SK_MEMINFO_DROPS]
    try:
        pid, socks = _port_sockets(intfs)
        return {intf: _with_socket(pid, fd, drops) for fd, (_inode, intf) in socks.items()}
    except (OSError, ValueError, struct.error):
        return {}


def send_sockets(packet_table: str, owner_inodes: dict[str, int]) -> list[int]:
    """Descriptors (in the owner) of its unbound packet sockets, the ones it sends with: rows of
    ``/proc/net/packet`` with protocol 0 and interface 0, whose inode the owner holds (pure)."""
    fds = []
    for line in packet_table.splitlines()[1:]:
        f = line.split()
        if len(f) >= 9 and f[3] == "0000" and f[4] == "0" and f[8] in owner_inodes:
            fds.append(owner_inodes[f[8]])
    return sorted(fds)


def _owner_inodes(pid: int) -> dict[str, int]:
    out = {}
    base = Path(f"/proc/{pid}/fd")
    for entry in base.iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            out[target[8:-1]] = int(entry.name)
    return out


def _with_socket(pid: int, fd: int, use):
    """Run ``use(sock)`` on a copy of descriptor ``fd`` of process ``pid``."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        dup = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if dup < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        sock = socket.socket(fileno=dup)
        try:
            return use(sock)
        finally:
            sock.close()                     # our copy only: the socket stays open in the owner
    finally:
        os.close(pidfd)


#: ``record(pid, fd, inode, size)``: called with a socket's size before it is raised
Record = Callable[[int, int, str, int], None]


def raise_send_buffer(want: int, record: Record | None = None) -> list[tuple[int, int, int, int]]:
    """Raise ovs-vswitchd's send socket(s) to at least ``want`` bytes (as SO_SNDBUF reports it,
    the kernel's doubled value); ``record`` is told each socket's size before it changes (the run's
    state file); returns (pid, fd, before, after) per socket. Raises OSError when OVS or its
    socket cannot be reached."""
    pid = int(OVS_PIDFILE.read_text().split()[0])
    inodes = _owner_inodes(pid)
    fds = send_sockets(Path("/proc/net/packet").read_text(), inodes)
    if not fds:
        raise OSError("ovs-vswitchd has no unbound packet socket (no userspace port has sent yet?)")
    return raise_sockets(pid, {fd: inode for inode, fd in inodes.items() if fd in fds}, want, record)


def raise_sockets(pid: int, sockets: dict[int, str], want: int, record: Record | None = None,
                  with_socket: Callable[[int, int, Callable[[Any], Any]], Any] | None = None,
                  direction: str = "send") -> list[tuple[int, int, int, int]]:
    """Raise process ``pid``'s sockets' ``direction`` buffers (descriptor -> inode) below ``want``
    bytes to it, each ``record``-ed first; (pid, fd, before, after) per socket. ``with_socket``: how a
    socket of the process is reached (a copy of its descriptor; tests give a fake)."""
    reach = with_socket or _with_socket
    read, force = OPTIONS[direction]
    out = []
    for fd, inode in sorted(sockets.items()):
        def bump(sock: Any, fd: int = fd, inode: str = inode) -> tuple[int, int]:
            before = sock.getsockopt(socket.SOL_SOCKET, read)
            if before < want:
                if record is not None:
                    record(pid, fd, inode, before)
                sock.setsockopt(socket.SOL_SOCKET, force, min(MAX_BUFFER, want) // 2)
            return before, sock.getsockopt(socket.SOL_SOCKET, read)
        before, after = reach(pid, fd, bump)
        out.append((pid, fd, before, after))
    return out


def same_socket(entry: dict[str, Any], start: int | None, link: str | None) -> bool:
    """Whether a recorded socket (``RunState.send_buffers``: pid, start, fd, inode) is still the
    one its process holds: the process started when recorded (``start``: its start time now, None
    when gone) and the descriptor still names that inode (``link``: its /proc fd link now) (pure)."""
    return start is not None and start == entry.get("start") and link == f"socket:[{entry.get('inode')}]"


def fd_link(pid: int, fd: int) -> str | None:
    """What descriptor ``fd`` of process ``pid`` names (``socket:[INODE]``), or None."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def restore_send_buffer(pid: int, fd: int, size: int) -> None:
    """Put a send socket's buffer back to ``size`` (as SO_SNDBUF reported it); quiet when OVS is gone."""
    try:
        _with_socket(pid, fd, lambda s: s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, size // 2))
    except OSError:
        pass
