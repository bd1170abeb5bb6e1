"""Entropy policies: which path (plane, UDP source port) each packet of a flow takes.

Pure: a policy sees the flow's hash and the packet's sequence number, the flow's path
liveness (``flow.paths``, :class:`.paths.PathTable`), and feedback per path. The names here
are the only list of entropy names: the transport package's ``ENTROPIES`` is
``tuple(ENTROPY_POLICIES)``.

    flow       one path per flow (hash of the rank pair): per-flow ECMP, one connection
    ecmp       per-flow ECMP over one connection per plane (as NCCL's QPs), each hashed
    flowlet    as ecmp, but a connection moves to its plane's next entropy value after an
               idle gap longer than ``flowlet_gap_s`` (LetFlow, Vanini et al., NSDI'17)
    spray      every packet the next path in rotation (oblivious spraying)
    adaptive   REPS-like recycling of the paths whose packets were acknowledged cleanly
               (:mod:`.adaptive`)

With the controller's entropy map (``hpnlab.fabric.routing.entropy``) the transport binds its
source ports to the map's entropy values, so N paths are N known, distinct ways through
the fabric. Which N values a connection takes is :func:`connection_values` (one function,
used by the RoCE transport and the flow model alike): a hash of (source, destination,
plane, connection) picks where in the map's value space the connection's N consecutive
values start, so different connections use different uplinks and, over many connections,
every uplink evenly.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from hpnlab.fabric.routing.entropy import connection_path

from .adaptive import AdaptiveParams, AdaptivePaths, WeightedPaths, WeightParams
from .base import TransportError
from .paths import PathTable


class FlowView(Protocol):
    """What a policy reads of a sending flow (the RoCE transport's sender state is one): its
    destination rank, its hash (the rank pair's, ``routing.entropy.flow_hash``) and which of its
    paths are alive (:class:`.paths.PathTable`)."""

    @property
    def dst(self) -> int: ...

    @property
    def hash(self) -> int: ...

    @property
    def paths(self) -> PathTable: ...


class EntropyPolicy:
    """Chooses each packet's path: (plane index, source-port index on that plane).

    ``paths`` is planes x ports_per_nic. ``on_feedback(flow, path, kind, now, rtt)`` is called
    with kind "ack" (one packet sent once on that path acknowledged), "rtt" (an RTT sample
    of a packet of that path), "ce" (a CNP for a packet of that path), "loss" (a loss the
    path's own sequence showed) or "timeout" (the retransmission timer fired for a packet of
    that path): the hook the adaptive policy uses.
    """
    name = "base"
    per_flow = False        # True: every packet of a flow takes the same path

    def __init__(self, planes: int, ports_per_nic: int, clock: Callable[[], float] = time.monotonic,
                 **params: Any):
        self.planes, self.ports = planes, ports_per_nic
        self.clock = clock

    @property
    def n_paths(self) -> int:
        return self.planes * self.ports

    def rotation(self, i: int) -> int:
        """The i-th path of the rotation that interleaves planes (path 0 of plane 0, of plane 1...)."""
        return (i % self.planes) * self.ports + (i // self.planes) % self.ports

    def path(self, flow: FlowView, seq: int) -> int:
        raise NotImplementedError

    def on_feedback(self, flow: FlowView, path: int, kind: str, now: float = 0.0, rtt: float | None = None) -> None:
        pass

    def summary(self, flow: FlowView) -> dict | None:
        """The policy's per-flow state for the results (None: nothing to say)."""
        return None


class FlowEntropy(EntropyPolicy):
    """One path per flow, from a hash of (src, dst): what per-flow ECMP gives a QP."""
    name = "flow"
    per_flow = True

    def path(self, flow, seq):
        plane, j = connection_path(flow.hash, 0, 1, self.planes, self.ports)
        return plane * self.ports + j


class EcmpEntropy(EntropyPolicy):
    """Per-flow ECMP as NCCL runs it: one connection (QP) per plane for each rank pair, each
    on the entropy value a hash of (pair, connection) gives -- so two connections may collide
    on one path, as hashed QPs do -- and the flow's packets dealt over its connections in
    turn (NCCL splits a message evenly over its QPs). The fair baseline for spraying: the
    same planes and connections, no choice of path."""
    name = "ecmp"

    def path(self, flow, seq):
        plane, j = connection_path(flow.hash, seq % self.planes, self.planes, self.planes, self.ports)
        return plane * self.ports + j


class FlowletEntropy(EntropyPolicy):
    """LetFlow-like flowlets on one connection per plane (as ``ecmp``: packets dealt over the
    planes in turn): each connection keeps its entropy value while it sends; after an idle
    gap longer than ``flowlet_gap_s`` (or when its path is found dead) it moves to the next
    live value of its plane. A gap longer than the paths' delay difference cannot reorder
    packets within a connection."""
    name = "flowlet"

    def __init__(self, planes, ports_per_nic, clock=time.monotonic, flowlet_gap_s: float = 0.0005, **params):
        super().__init__(planes, ports_per_nic, clock)
        if flowlet_gap_s <= 0:
            raise TransportError(f"the flowlet gap must be above 0, got {flowlet_gap_s * 1e6:g} us")
        self.gap_s = flowlet_gap_s
        self.state: dict[tuple[int, int], list] = {}   # (peer, plane) -> [entropy index, last send, flowlets]

    def path(self, flow, seq):
        now = self.clock()
        plane = seq % self.planes
        base = plane * self.ports
        st = self.state.get((flow.dst, plane))
        if st is None:
            j = connection_path(flow.hash, plane, self.planes, self.planes, self.ports)[1]
            st = self.state[flow.dst, plane] = [j, now, 1]
        elif now - st[1] > self.gap_s or not flow.paths.live(base + st[0]):
            for k in range(1, self.ports + 1):
                if flow.paths.live(base + (st[0] + k) % self.ports):
                    st[0] = (st[0] + k) % self.ports
                    break
            st[2] += 1
        st[1] = now
        return base + st[0]

    def summary(self, flow):
        n = sum(st[2] for (dst, _pl), st in self.state.items() if dst == flow.dst)
        return {"flowlets": n, "gap_us": self.gap_s * 1e6}


class SprayEntropy(EntropyPolicy):
    """Per-packet spraying: rotate over every (plane, source port), planes interleaved."""
    name = "spray"

    def path(self, flow, seq):
        return self.rotation(seq + flow.hash)


class _PerFlowState(EntropyPolicy):
    """A policy that keeps a path state per flow (``new_state``), fed by the transport's feedback;
    ``params_class`` holds its knobs, given as ``adaptive=`` (a dict or an instance)."""
    params_class: type = AdaptiveParams

    def __init__(self, planes, ports_per_nic, clock=time.monotonic, adaptive: Any = None, **params):
        super().__init__(planes, ports_per_nic, clock)
        self.params: Any
        try:
            self.params = adaptive if isinstance(adaptive, self.params_class) else self.params_class(**(adaptive or {}))
        except TypeError as exc:
            raise TransportError(f"bad {self.name} entropy parameters: {exc}") from None
        self.flows: dict[int, Any] = {}

    def new_state(self, flow) -> Any:
        raise NotImplementedError

    def of(self, flow) -> Any:
        st = self.flows.get(flow.dst)
        if st is None:
            st = self.flows[flow.dst] = self.new_state(flow)
        return st

    def path(self, flow, seq):
        return self.of(flow).choose(self.clock(), flow.paths.live)

    def on_feedback(self, flow, path, kind, now=0.0, rtt=None):
        if path >= self.n_paths:
            return
        st = self.of(flow)
        now = now or self.clock()
        if kind == "ack":
            st.on_ack(path, now)
        elif kind == "rtt" and rtt is not None:
            st.on_rtt(path, rtt, now)
        elif kind == "ce":
            st.on_mark(path, now)
        elif kind == "loss":
            st.on_loss(path, now)
        elif kind == "timeout":
            st.on_timeout(path, now)

    def summary(self, flow):
        st = self.flows.get(flow.dst)
        return st.summary(self.clock()) if st else None


class AdaptiveEntropy(_PerFlowState):
    """Host-side adaptive routing per packet (:class:`.adaptive.WeightedPaths`): spray weighted
    by each path's own evidence (its RTT against the flow's best path's, its marks and losses),
    one state per flow over every (plane, value)."""
    name = "adaptive"
    params_class = WeightParams

    def new_state(self, flow) -> WeightedPaths:
        n = self.n_paths
        start = flow.hash % n
        return WeightedPaths(n, self.params, order=[self.rotation(start + i) for i in range(n)])


class RepsEntropy(_PerFlowState):
    """REPS's recycling (:class:`.adaptive.AdaptivePaths`): one recycle buffer per flow. Kept
    beside ``adaptive`` for comparison (see :mod:`.adaptive` for what it measured)."""
    name = "reps"
    params_class = AdaptiveParams

    def new_state(self, flow) -> AdaptivePaths:
        return AdaptivePaths(self.n_paths, self.params, start=flow.hash)


ENTROPY_POLICIES: dict[str, type[EntropyPolicy]] = {
    cls.name: cls for cls in (FlowEntropy, EcmpEntropy, FlowletEntropy, SprayEntropy, AdaptiveEntropy,
                                RepsEntropy)}
"""Entropy policy by name: the one source of the entropy names (``ENTROPIES`` is its keys).
Not to be confused with the controller compiler's routing policies."""
