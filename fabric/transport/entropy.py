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

With the controller's entropy map (:class:`EntropyMap`, below) the transport binds its
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
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .adaptive import AdaptiveParams, AdaptivePaths, WeightedPaths, WeightParams
from .base import TransportError

if TYPE_CHECKING:
    from .roce import _TxFlow


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

    def path(self, flow: _TxFlow, seq: int) -> int:
        raise NotImplementedError

    def on_feedback(self, flow: _TxFlow, path: int, kind: str, now: float = 0.0, rtt: float | None = None) -> None:
        pass

    def summary(self, flow: _TxFlow) -> dict | None:
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


# ---- the entropy map: which source-port bits choose the uplink at each tier ------------------

PORT_BITS = 16
TIER_NAMES = {1: "leaf", 2: "spine", 3: "core"}
DIRECTIONS = ("up", "across", "down")


@dataclass(frozen=True)
class EntropyField:
    """The source-port bits one kind of multipath choice reads.

    ``role`` names the choice by tier and direction ("leaf-up", "spine-up", "core-across"
    (over long-haul links), "core-down", "spine-down" (parallel links to a leaf)).
    A switch's next-hop set of ``n`` ports in this role sends a packet whose UDP (or TCP)
    source port is ``sport`` to its port number ``index(sport, n)`` (the set's ports
    sorted): ``((sport >> offset) & (2**bits - 1)) % n``. ``sizes``: the set sizes of this
    role in the healthy fabric."""
    role: str
    tier: int
    direction: str
    offset: int
    bits: int
    sizes: tuple[int, ...]

    @property
    def mask(self) -> int:
        return ((1 << self.bits) - 1) << self.offset

    @property
    def radix(self) -> int:
        """Distinct choices a host can make here and know apart: the largest set."""
        return max(self.sizes, default=1)

    def value(self, sport: int) -> int:
        return (sport >> self.offset) & ((1 << self.bits) - 1)

    def index(self, sport: int, n: int) -> int:
        """The port (0-based, of the set's ports sorted) a set of ``n`` ports sends ``sport`` to."""
        return self.value(sport) % n


@dataclass(frozen=True)
class EntropyMap:
    """Per role, the source-port bits that choose the uplink (published by the controller's
    compiler, ``hpnlab.controller.compiler.entropy_map``; plain values, JSON by ``as_dict``).

    Fields are laid out one after the other from bit 0 in path order (up, across, down), so
    no two choices of one path read the same bits (no lockstep). ``overlaps`` names pairs of
    roles that share bits because the 16-bit port cannot hold them all (empty on every
    preset). A host that wants N distinct paths takes :meth:`entropy_values`: entropy value
    k sets, field by field in that order, the digit of k in the mixed radix of the fields'
    largest set sizes, so N values below :meth:`path_count` are N different combinations of
    choices (every first-hop uplink used evenly first, then every second-hop one...)."""
    fields: tuple[EntropyField, ...] = ()
    overlaps: tuple[tuple[str, str], ...] = ()

    @property
    def width(self) -> int:
        """Bits from bit 0 that the switches read (the rest of the port is free)."""
        return max((f.offset + f.bits for f in self.fields), default=0)

    def field(self, role: str) -> EntropyField | None:
        return next((f for f in self.fields if f.role == role), None)

    def _distinct(self) -> list[EntropyField]:
        """The fields a host can set independently (of roles that share bits, only the first)."""
        taken = 0
        out = []
        for f in self.fields:
            if f.mask & taken == 0:
                out.append(f)
                taken |= f.mask
        return out

    def path_count(self) -> int:
        """How many entropy values name different paths across every role."""
        n = 1
        for f in self._distinct():
            n *= f.radix
        return n

    def low_bits(self, k: int) -> int:
        """The switch-read bits of entropy value number ``k`` (mixed radix, see the class)."""
        k = k % self.path_count()            # not in place: k may be a numpy array (elementwise)
        out = 0
        for f in self._distinct():
            out = out | (k % f.radix) << f.offset
            k = k // f.radix
        return out

    def source_port(self, k: int, high: int = 0) -> int:
        """Entropy value ``k`` as a UDP source port, ``high`` in the bits no switch reads."""
        return (self.low_bits(k) | high << self.width) & 0xFFFF

    def high_values(self) -> int:
        """How many values the bits above ``width`` can take (choices of port for one path)."""
        return 1 << (PORT_BITS - self.width)

    def entropy_values(self, count: int, high: int = 0) -> list[int]:
        """``count`` source ports, distinct paths while ``count <= path_count()``."""
        return [self.source_port(k, high) for k in range(count)]

    def choices(self, sport: int, sizes: dict[str, int] | None = None) -> dict[str, int]:
        """Per role, the port index ``sport`` takes (at sets of the role's largest size, or ``sizes``)."""
        sizes = sizes or {}
        return {f.role: f.index(sport, sizes.get(f.role, f.radix)) for f in self.fields}

    def as_dict(self) -> dict:
        return {"fields": [asdict(f) for f in self.fields], "overlaps": [list(p) for p in self.overlaps],
                "width": self.width, "path_count": self.path_count()}

    @classmethod
    def from_dict(cls, d: dict | EntropyMap | None) -> EntropyMap | None:
        if d is None or isinstance(d, EntropyMap):
            return d
        try:
            fields = tuple(EntropyField(str(f["role"]), int(f["tier"]), str(f["direction"]), int(f["offset"]),
                                        int(f["bits"]), tuple(int(n) for n in f["sizes"])) for f in d["fields"])
            return cls(fields, tuple((str(a), str(b)) for a, b in d.get("overlaps", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise TransportError(f"bad entropy map: {exc!r}") from None


#: source ports below this are never bound for entropy (the well-known ports, root's alone)
FIRST_FREE_PORT = 1024


def first_high(m: EntropyMap, low: Any, rank: Any) -> Any:
    """The bits above the switch-read ones (``m.width``) of the first source port rank ``rank``
    takes for the switch-read bits ``low`` (``m.low_bits``): down from the top of the free bits by
    the rank, ``(high_values - 1 - rank) % high_values``, so that ranks differ in them (weighted
    switches read the lowest of them, ``compiler.weighted_masks``), or, when that port is below
    :data:`FIRST_FREE_PORT` (every lower value is too), the top value. The RoCE transport tries
    the values from there down (a taken port moves to the next); the flow model takes this one.
    Python ints or numpy arrays (elementwise). A map whose switches read all 16 bits has one
    value, 0."""
    highs = m.high_values()
    high = (highs - 1 - rank) % highs
    below = ((high << m.width) | low) < FIRST_FREE_PORT
    return high + (highs - 1 - high) * below


# ---- which entropy values one connection takes --------------------------------------------

_MASK64 = (1 << 64) - 1
_GOLD = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _splitmix(x: Any) -> Any:
    """splitmix64's step and finaliser on a Python int or (elementwise, wrapping) a numpy
    uint64 array: the same bits either way."""
    x = (x + _GOLD) & _MASK64
    x = ((x ^ (x >> 30)) * _MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX2) & _MASK64
    return x ^ (x >> 31)


def flow_hash(src: Any, dst: Any, salt: Any = 0) -> Any:
    """A rank pair's flow hash (32 bits): splitmix64 chained over (src, dst, salt). The RoCE
    transport's ``_TxFlow.hash`` (salt 0) and the flow model's (any salt: 0 is the transport's);
    Python ints or numpy uint64 arrays (elementwise; the same results), any rank number."""
    h = _splitmix(src)
    h = _splitmix(h ^ dst)
    return _splitmix(h ^ salt) & 0xFFFFFFFF


def connection_path(h: Any, conn: Any, qps: int, planes: int, ports: int, moves: Any = 0) -> tuple[Any, Any]:
    """Where per-flow hashing puts connection ``conn`` (of ``qps``) of a rank pair whose flow
    hash is ``h``: (plane, index of the connection's entropy value on that plane, below
    ``ports``). The one rule of the transport's per-flow policies and the flow model's:

    * ``qps == 1`` (the ``flow`` policy): the one path ``h mod (planes * ports)``, planes
      outer -- any plane, any of its values;
    * else (``ecmp``, ``flowlet``: one connection per plane, NCCL's QPs): connection ``conn``
      on plane ``conn mod planes`` (connection c pinned to plane c), at the value index a
      hash of (h, conn) gives.

    ``moves``: how many times the connection has moved to its plane's next value (a flowlet
    after each idle gap). Python ints or numpy uint64 arrays (elementwise)."""
    if qps == 1:
        path = h % (planes * ports)
        plane, j = path // ports, path % ports
    else:
        plane, j = conn % planes, _splitmix(_splitmix(h) ^ conn) % ports
    return plane, (j + moves) % ports


def connection_offset(space: int, src: Any, dst: Any, plane: Any, index: Any = 0) -> Any:
    """Where connection (``src`` rank, ``dst`` rank, ``plane``, connection ``index``) starts in
    a value space of ``space`` entropy values: splitmix64 chained over the four numbers (each
    fed in turn: h = mix(h ^ x)), modulo ``space``. Python ints, or numpy uint64 arrays
    (elementwise; the same results)."""
    h = _splitmix(src)
    h = _splitmix(h ^ dst)
    h = _splitmix(h ^ plane)
    h = _splitmix(h ^ index)
    return h % space


def connection_value(space: int, src: Any, dst: Any, plane: Any, i: Any, index: Any = 0) -> Any:
    """The ``i``-th entropy value (a number k of :meth:`EntropyMap.source_port`, below
    ``space``) of a connection: ``(connection_offset(...) + i) % space``. Python ints, or numpy
    uint64 arrays elementwise (what the flow model uses: the same function)."""
    return (connection_offset(space, src, dst, plane, index) + i) % space


def connection_values(space: EntropyMap | int, src: int, dst: int, plane: int, n: int,
                      index: int = 0) -> list[int]:
    """The ``n`` entropy values (numbers k of the map, :meth:`EntropyMap.source_port`) that
    connection ``index`` from rank ``src`` to rank ``dst`` on ``plane`` binds its paths to.

    ``space``: the map (its :meth:`EntropyMap.path_count`) or the number of values. The
    values are ``n`` consecutive numbers from an offset that :func:`connection_offset`
    hashes from (src, dst, plane, index), wrapping at ``space``. Why consecutive: value k is
    a mixed-radix number whose lowest digit is the first hop's uplink (the leaf's), the next
    the second hop's, and so on, so ``n`` consecutive values are ``n`` distinct paths while
    ``n <= space`` and ``n`` different leaf uplinks while ``n`` is at most the leaf's uplink
    count. Why hashed: the offset is uniform over the space, so over many connections each
    uplink (each digit value of every tier) is used evenly -- as balls thrown into bins --
    where a fixed start (0..n-1 for everyone) would put every connection on the same ``n``
    uplinks of a leaf that has more. Deterministic: the same connection always gets the same
    values, in the transport and in the model."""
    m = space.path_count() if isinstance(space, EntropyMap) else int(space)
    if m < 1:
        raise TransportError(f"an entropy value space must hold at least one value, got {m}")
    n = max(0, min(int(n), m))
    return [int(connection_value(m, src, dst, plane, i, index)) for i in range(n)]


def entropy_bits(n: int) -> int:
    """Source-port bits a set of ``n`` ports reads: log2(n) for a power of two, else enough
    for 2**bits >= 4n patterns (dealt round-robin, every port within +-1 pattern)."""
    if n & (n - 1) == 0:
        return n.bit_length() - 1
    return (n - 1).bit_length() + 2


def lay_out(sizes: dict[tuple[int, str], list[int]]) -> EntropyMap:
    """The entropy map for multipath sets of these sizes per (tier, direction).

    Roles in path order (up by tier, across, down by tier from the top), each as wide as its
    largest set needs (:func:`entropy_bits`), packed from bit 0. A role that no longer fits
    in 16 bits shares: it takes the top bits and ``overlaps`` names the roles it shares
    with (the latest roles in path order, so the first hops -- which every path crosses --
    keep their own bits)."""
    def order(key: tuple[int, str]) -> tuple[int, int]:
        tier, direction = key
        d = DIRECTIONS.index(direction)
        return d, tier if direction == "up" else -tier

    fields: list[EntropyField] = []
    overlaps: list[tuple[str, str]] = []
    off = 0
    for key in sorted(sizes, key=order):
        ns = sorted({n for n in sizes[key] if n >= 2})
        if not ns:
            continue
        tier, direction = key
        bits = entropy_bits(ns[-1])
        role = f"{TIER_NAMES.get(tier, f'tier{tier}')}-{direction}"
        start = off if off + bits <= PORT_BITS else PORT_BITS - bits
        f = EntropyField(role, tier, direction, start, bits, tuple(ns))
        overlaps += [(g.role, role) for g in fields if g.mask & f.mask]
        fields.append(f)
        off = max(off, start + bits)
    return EntropyMap(tuple(fields), tuple(overlaps))
