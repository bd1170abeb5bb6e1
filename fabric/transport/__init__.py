"""Transports that carry collective traffic between ranks (side-effecting: sockets).

Both transports offer the same small interface, used by the rank worker (``hpnlab.fabric.ranks``):

``start()``
    bind/listen/connect; returns when the transport can send (the first barrier proves
    the peers are there).
``exchange(sends, recvs)``
    one step of a schedule: ``sends`` is a list of (peer rank, bytes-like) and ``recvs``
    a list of (peer rank, nbytes); every send and receive is posted at once and the call
    returns when all sends are delivered (acknowledged) and all receives have arrived,
    giving the received payloads in ``recvs`` order. Messages between two ranks arrive in
    the order they were sent (the schedule's order on both sides).
``barrier()``
    every rank waits for every other, over the data network (gather to rank 0, release).
``flow_stats()``
    per-flow counters (dicts with src, dst, packets, bytes, retransmissions, ...).
``close()``

A rank that stops answering raises :class:`PeerLost` naming the rank and its address.
"""
from __future__ import annotations

from ..errors import UserError

TRANSPORTS = ("tcp", "roce")
ENTROPIES = ("flow", "spray", "adaptive")


class TransportError(UserError):
    """The transport cannot go on (peer gone, address not usable); the message says which."""


class PeerLost(TransportError):
    def __init__(self, rank: int, addr: str, why: str):
        self.rank = rank
        self.addr = addr
        super().__init__(f"rank {rank} ({addr}) {why}")


class Transport:
    rank: int
    nranks: int

    def barrier(self) -> None:
        """Gather a 1-byte token at rank 0, then release every rank (2 message rounds)."""
        token = b"\x01"
        if self.rank == 0:
            self.exchange([], [(r, 1) for r in range(1, self.nranks)])
            self.exchange([(r, token) for r in range(1, self.nranks)], [])
        else:
            self.exchange([(0, token)], [])
            self.exchange([], [(0, 1)])

    def exchange(self, sends, recvs):  # pragma: no cover - interface
        raise NotImplementedError

    def flow_stats(self) -> list[dict]:  # pragma: no cover - interface
        return []

    def close(self) -> None:  # pragma: no cover - interface
        pass


def make(kind: str, rank: int, addrs: list[list[str]], **options) -> Transport:
    """A transport of ``kind`` ("tcp" or "roce") for ``rank``; ``addrs[r]`` lists the
    addresses of rank r, one per plane (NIC port) it uses."""
    if kind == "tcp":
        from .tcp import TcpTransport
        options.pop("entropy", None)
        for key in ("line_rate_bps", "recovery", "dcqcn", "ports_per_nic", "window_pkts", "mtu",
                    "ecn", "reorder_threshold", "reorder_time_s"):
            options.pop(key, None)
        return TcpTransport(rank, addrs, **options)
    if kind == "roce":
        from .roce import RoceTransport
        return RoceTransport(rank, addrs, **options)
    raise TransportError(f"unknown transport {kind!r} (known: {', '.join(TRANSPORTS)})")
