"""The entropy map: which bits of a packet's UDP source port choose its uplink at each tier, and
which values a connection binds (pure).

The controller's compiler lays the map out over the fabric (:func:`lay_out`), the switches
match its bits, the transports bind source ports from it and the flow model follows the same
values: one function (:func:`connection_values`) says which N values a connection takes, for
the RoCE transport and the flow model alike. A hash of (source, destination, plane,
connection) picks where in the map's value space the connection's N consecutive values
start, so different connections use different uplinks and, over many connections, every
uplink evenly. The host side's entropy policies (which of those values each packet takes)
are ``hpnlab.fabric.transport.entropy``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hpnlab.fabric.errors import UserError

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
    compiler, ``hpnlab.fabric.routing.compiler.entropy_map``; plain values, JSON by ``as_dict``).

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
            raise UserError(f"bad entropy map: {exc!r}") from None


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
    transport's ``TxFlow.hash`` (salt 0) and the flow model's (any salt: 0 is the transport's);
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
        raise UserError(f"an entropy value space must hold at least one value, got {m}")
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
