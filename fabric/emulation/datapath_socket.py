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
"""
from __future__ import annotations

import ctypes
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

OVS_PIDFILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")
SYS_PIDFD_GETFD = 438          # the same number on x86-64 and arm64 (the generic table)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
#: an skb's truesize over the frame it carries, at most (a 4,110 B frame sits in an 8 KiB buffer)
TRUESIZE_FACTOR = 2
#: the kernel doubles what SO_SNDBUF(FORCE) is given and keeps it below INT_MAX
MAX_BUFFER = (1 << 30) - 1


def send_buffer_bytes(queue_bytes: list[int], factor: int = TRUESIZE_FACTOR) -> int:
    """The send buffer that holds every switch port's full queue at once (``queue_bytes``: each
    port's buffer, ``shaping.Shape.queue_bytes``), in the kernel's truesize accounting (pure)."""
    return min(MAX_BUFFER, factor * sum(max(0, q) for q in queue_bytes))


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
                  ) -> list[tuple[int, int, int, int]]:
    """Raise process ``pid``'s sockets (descriptor -> inode) below ``want`` bytes to it, each
    ``record``-ed first; (pid, fd, before, after) per socket. ``with_socket``: how a socket of the
    process is reached (a copy of its descriptor; tests give a fake)."""
    reach = with_socket or _with_socket
    out = []
    for fd, inode in sorted(sockets.items()):
        def bump(sock: Any, fd: int = fd, inode: str = inode) -> tuple[int, int]:
            before = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            if before < want:
                if record is not None:
                    record(pid, fd, inode, before)
                sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, min(MAX_BUFFER, want) // 2)
            return before, sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
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
