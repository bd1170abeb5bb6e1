"""Transports that carry collective traffic between ranks (side-effecting: sockets).

Both transports offer the same small interface, used by the rank worker (``hpnlab.fabric.transport.ranks``):

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

from hpnlab.fabric.workload.jobs import ENTROPIES, TRANSPORTS

from .base import PeerLost, Transport, TransportError
from .entropy import ENTROPY_POLICIES

__all__ = ["ENTROPIES", "ENTROPY_POLICIES", "TRANSPORTS", "PeerLost", "Transport", "TransportError", "make"]



def make(kind: str, rank: int, addrs: list[list[str]], **options) -> Transport:
    """A transport of ``kind`` ("tcp" or "roce") for ``rank``; ``addrs[r]`` lists the
    addresses of rank r, one per plane (NIC port) it uses."""
    if kind == "tcp":
        # each rank process imports only its own transport
        from .tcp import TcpTransport
        options.pop("entropy", None)
        for key in ("line_rate_bps", "recovery", "dcqcn", "ports_per_nic", "window_pkts", "mtu",
                    "ecn", "reorder_threshold", "reorder_time_s", "max_rto_s", "paths", "gap_threshold_s",
                    "ack_fresh_s", "watch_links", "link_poll_s", "link_state",
                    "nic_names", "entropy_map", "flowlet_gap_us", "adaptive"):
            options.pop(key, None)
        return TcpTransport(rank, addrs, **options)
    if kind == "roce":
        # measured: 50-130 ms more for every tcp rank process
        from .roce import RoceTransport
        return RoceTransport(rank, addrs, **options)
    raise TransportError(f"unknown transport {kind!r} (known: {', '.join(TRANSPORTS)})")
