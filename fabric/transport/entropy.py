"""Entropy policies: which path (plane, UDP source port) each packet of a flow takes.

Pure: a policy sees the flow's hash and the packet's sequence number, and (the adaptive
hook) feedback per path. The names here are the only list of entropy names: the transport
package's ``ENTROPIES`` is ``tuple(ENTROPY_POLICIES)``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .base import TransportError

if TYPE_CHECKING:
    from .roce import _TxFlow


class EntropyPolicy:
    """Chooses each packet's path: (plane index, source-port index on that plane).

    ``paths`` is planes x ports_per_nic. ``on_feedback(flow, path, kind)`` is called with
    kind "ack" (bytes acknowledged on that path), "ce" (a CNP for a packet of that path)
    or "loss" (a NACK or timeout): the hook the adaptive policy uses.
    """
    name = "base"
    per_flow = False        # True: every packet of a flow takes the same path

    def __init__(self, planes: int, ports_per_nic: int):
        self.planes, self.ports = planes, ports_per_nic

    def path(self, flow: _TxFlow, seq: int) -> int:
        raise NotImplementedError

    def on_feedback(self, flow: _TxFlow, path: int, kind: str) -> None:
        pass


class FlowEntropy(EntropyPolicy):
    """One path per flow, from a hash of (src, dst): what per-flow ECMP gives a QP."""
    name = "flow"
    per_flow = True

    def path(self, flow, seq):
        return flow.hash % (self.planes * self.ports)


class SprayEntropy(EntropyPolicy):
    """Per-packet spraying: rotate over every (plane, source port), planes interleaved."""
    name = "spray"

    def path(self, flow, seq):
        i = seq + flow.hash
        return (i % self.planes) * self.ports + (i // self.planes) % self.ports


class AdaptiveEntropy(EntropyPolicy):
    """Hook for host-side adaptive routing (filled by the adaptive-routing issue)."""
    name = "adaptive"

    def __init__(self, planes, ports_per_nic):
        usable = " or ".join(n for n in ENTROPY_POLICIES if n != self.name)
        raise TransportError(f"entropy {self.name!r} is a hook for the adaptive-routing work and has "
                             f"no policy yet; use --entropy {usable}")


ENTROPY_POLICIES: dict[str, type[EntropyPolicy]] = {
    cls.name: cls for cls in (FlowEntropy, SprayEntropy, AdaptiveEntropy)}
"""Entropy policy by name: the one source of the entropy names (``ENTROPIES`` is its keys).
Not to be confused with the controller compiler's routing policies."""
