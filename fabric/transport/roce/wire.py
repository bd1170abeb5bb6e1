"""The roce transport's packets on the wire (pure): the header, packet types, sizes, TOS bytes
and the delivery reports that ACKs and NACKs carry."""
from __future__ import annotations

import errno
import math
import socket
import struct

from hpnlab.fabric.scenario.rates import ETH_HEADER as ETH  # what an htb shaper counts on top of the IP packet

DATA, ACK, NACK, CNP, ABORT, PROBE, PATH_LOSS, PLANE = 1, 2, 3, 4, 5, 6, 7, 8
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
#: a send failing with one of these: the NIC port cannot send (its link is down, its address gone)
LINK_ERRNOS = frozenset((errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL))
IP_UDP = 28          # IPv4 + UDP headers
ECT0, CE = 0x02, 0x03
#: data's DSCP: 26, the priority RoCEv2 fabrics run lossless (priority flow control pauses it; ``--pfc on``)
DATA_DSCP = 26
#: the TOS byte of control packets (ACK, NACK, CNP, PLANE): DSCP 48 (CS6), not ECN-capable, the class
#: RoCE fabrics give CNPs a strict-priority queue for (``emulation.control_priority`` does so here)
CONTROL_TOS = 48 << 2
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)


def timestamp(now: float) -> int:
    """A header's send timestamp: ``now`` (monotonic seconds) in microseconds, low 32 bits."""
    return int(now * 1e6) & 0xFFFFFFFF


def report(path: int, ts: int) -> int:
    """One delivery report: ``path`` and the low 24 bits of a packet's send timestamp."""
    return path << 24 | (ts & 0xFFFFFF)


def wire_bits(payload: int) -> int:
    """Bits a data packet of ``payload`` bytes takes on the link (as an htb shaper counts it)."""
    return (payload + HDR.size + IP_UDP + ETH) * 8


def packets_for(nbytes: int, mtu: int) -> int:
    """Data packets a message of ``nbytes`` takes at ``mtu``."""
    return max(1, math.ceil(nbytes / (mtu - IP_UDP - HDR.size)))
