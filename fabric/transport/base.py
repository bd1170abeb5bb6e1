"""What every transport shares: the errors and the base class (barrier over ``exchange``)."""
from __future__ import annotations

from ..errors import UserError


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
    #: after an ``exchange`` with receives: when each completed (time.monotonic() seconds, in
    #: the receives' order); per-message completion times of an incast are made from it
    recv_done: list[float]

    def barrier(self) -> None:
        """Gather a 1-byte token at rank 0, then release every rank (2 message rounds)."""
        token = b"\x01"
        if self.rank == 0:
            self.exchange([], [(r, 1) for r in range(1, self.nranks)])
            self.exchange([(r, token) for r in range(1, self.nranks)], [])
        else:
            self.exchange([(0, token)], [])
            self.exchange([], [(0, 1)])

    def start(self) -> None:  # pragma: no cover - interface
        """Connect to every peer (before the first exchange)."""
        raise NotImplementedError

    def info(self) -> dict:  # pragma: no cover - interface
        """What this transport is and how it is configured (for the results' metadata)."""
        raise NotImplementedError

    def exchange(self, sends, recvs, wait_sends: bool = True):  # pragma: no cover - interface
        """Send ``(peer, bytes)`` and receive ``(peer, nbytes)`` in one step; with
        ``wait_sends=False`` the sends may still be in flight on return (see ``flush``)."""
        raise NotImplementedError

    def flush(self) -> None:  # pragma: no cover - interface
        """Wait until every send handed to ``exchange`` has been delivered."""
        raise NotImplementedError

    def flow_stats(self) -> list[dict]:  # pragma: no cover - interface
        return []

    def socket_drops(self) -> int | None:
        """Packets the kernel dropped at this rank's receiving sockets (None: not known)."""
        return None

    def close(self) -> None:  # pragma: no cover - interface
        pass
