"""Entropy policies: which path (plane, UDP source port) each packet of a flow takes.

Pure: a policy sees the flow's hash and the packet's sequence number, and (the adaptive
hook) feedback per path. The names here are the only list of entropy names: the transport
package's ``ENTROPIES`` is ``tuple(ENTROPY_POLICIES)``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
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
        k %= self.path_count()
        out = 0
        for f in self._distinct():
            out |= (k % f.radix) << f.offset
            k //= f.radix
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
