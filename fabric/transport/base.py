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
