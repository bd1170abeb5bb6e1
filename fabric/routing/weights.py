"""Load-following weights of the switches' multipath sets ("weighted" mode), pure.

A *multipath set* is a switch's next-hop set as its entropy table (table 2) serves it: the
source-port patterns it reads, each dealt to one of its ports (``compiler.EntropySet``). In
ecmp mode every port gets an equal share of the patterns, as the entropy map promises. In
weighted mode (``--routing-weights weighted``) the controller re-deals them every telemetry
interval, from the port statistics it already polls (``fabric/routing/telemetry.py``), so that a
loaded uplink gets fewer patterns and its less loaded siblings more. Only the entries whose
pattern moved change: the reconciler sends them as flow-mods (three per pattern: UDP, TCP and
the other-IPv4 entry), nothing else.

Granularity. A set of n ports whose role reads b bits of the map has 2**b patterns: too few to
weight (mini presets: 2 uplinks, 1 bit, so only 1:1). Weighted mode widens each role's sets to
at least ``compiler.WEIGHT_PATTERNS_PER_PORT`` patterns per port of the role's largest set (2
uplinks: 8 patterns, shares in steps of 1/8) with bits the entropy map leaves free
(``compiler.weighted_masks``); with equal weights every source port still takes the port the
map names. A host's entropy value then names its path only while the weights are equal:
weights re-point some values (their patterns) to other uplinks. That is the point: an adaptive
host sees the paths it liked move and re-learns; a per-flow host is moved by the switch.
The widened tables also complete each set's "avoid port j" entries, so that a route avoiding
port j never falls through to a weighted entry sending to j.

The decision, per set, each interval (``Weights.decide``):

1. A congestion score per port: ``utilisation + min(1, queue_bytes / queue_ref_bytes) +
   min(1, ce_fraction / ce_ref)`` (queue and CE where the ECN stage reports them), smoothed by
   an EWMA (``ewma``: the weight of the new sample).
2. Target shares in proportion to each live port's headroom ``max(floor, 1 - score)``; a dead
   port (its link or neighbour failed) gets none. Targets within ``deadband`` of equal are equal,
   so that noise on equal loads changes nothing.
3. Damping: the set's (real-valued) shares move ``gain`` of the way to the target. The score
   includes the set's own traffic, so undamped shares would swing between two uplinks on a
   saturated fabric (moving traffic off a port makes it look idle); half steps converge.
4. Integer weights: shares x patterns, every live port at least ``min_patterns`` (1), largest
   remainders first.
5. Hysteresis: the weights change only when some port's share is more than ``hysteresis``
   patterns away from its current weight, only when ``persist`` decisions in a row wanted the
   same ports to gain patterns, and not within ``hold_s`` of the set's last change (the port
   counters need an interval or two to show the effect of a change). Persistence is what keeps
   equal loads with bursty queues still: a burst's queue scores a port near 1 for one interval,
   and the next burst is as likely on its sibling (measured on the emulated fabric: 20-64
   changes per routing-comparison cell without it, even on the symmetric fabric, and adaptive
   hosts whose learned paths kept moving). A port that died or came back changes the weights
   at once.
6. The new assignment moves as few patterns as the new weights need (surplus patterns, highest
   first, go to the ports short of patterns); weights equal to ecmp's restore ecmp's exact
   assignment.

``WeightedTables`` is the reconciler's compile function in weighted mode: it compiles, widens
and applies the current assignment of every set, and gives the states for new assignments.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.compiler import EntropySet, SwitchState
from hpnlab.fabric.routing.telemetry import PortKey, PortTelemetry

LOG = logging.getLogger("hpnlab.fabric.routing.weights")
MODES = ("ecmp", "weighted")
DEFAULT_MODE = MODES[0]      # equal shares: the controller's and the emulation's default
SetKey = tuple[str, int]        # (switch, metadata value of the set)


@dataclass(frozen=True)
class WeightParams:
    ewma: float = 0.2               # weight of a new sample in the smoothed score
    gain: float = 0.5               # share of the way to the target the shares move per decision
    deadband: float = 0.05          # target shares this close to equal are equal
    hysteresis: float = 0.75        # patterns a share must be away from its weight to change it
    hold_s: float = 1.0             # seconds between two changes of one set
    persist: int = 10               # decisions in a row that must want the same ports to gain (2 s at 200 ms)
    floor: float = 0.05             # least headroom a live port is credited with
    min_patterns: int = 1           # every live port keeps at least this many patterns
    queue_ref_bytes: float = 100_000.0
    ce_ref: float = 0.1


def score(s: PortTelemetry, p: WeightParams) -> float:
    """A port's congestion in one interval (see the module docstring, step 1)."""
    q = min(1.0, (s.queue_bytes or 0) / p.queue_ref_bytes) if p.queue_ref_bytes > 0 else 0.0
    ce = min(1.0, s.ce_fraction / p.ce_ref) if p.ce_ref > 0 else 0.0
    return max(0.0, s.utilisation) + q + ce


def apportion(shares: Mapping[int, float], total: int, minimum: int = 1) -> dict[int, int]:
    """Integer counts summing to ``total`` in proportion to ``shares`` (ports with a share > 0 get at
    least ``minimum``; a share of 0 gets 0), by largest remainder (ties: the lower port)."""
    live = sorted(p for p, x in shares.items() if x > 0)
    out = dict.fromkeys(shares, 0)
    if not live:
        return out
    minimum = min(minimum, total // len(live))
    rest = total - minimum * len(live)
    s = sum(shares[p] for p in live)
    exact = {p: rest * shares[p] / s for p in live}
    for p in live:
        out[p] = minimum + int(exact[p])
    left = total - sum(out.values())
    for p in sorted(live, key=lambda q: (-(exact[q] - int(exact[q])), q))[:left]:
        out[p] += 1
    return out


def reassign(current: tuple[int, ...], counts: Mapping[int, int], base: tuple[int, ...]) -> tuple[int, ...]:
    """An assignment (pattern -> port) with ``counts`` patterns per port, moving as few patterns of
    ``current`` as it can: each port with too many gives up its highest patterns to the ports with
    too few (lowest port first). Counts equal to ``base``'s give ``base`` itself."""
    if all(base.count(p) == n for p, n in counts.items()) and len(base) == sum(counts.values()):
        return base
    have = {p: [i for i, q in enumerate(current) if q == p] for p in counts}
    out = list(current)
    free: list[int] = []
    for p in sorted(counts):
        surplus = len(have.get(p, [])) - counts[p]
        if surplus > 0:
            free += have[p][-surplus:]
    for i, q in enumerate(current):       # patterns on a port the counts do not know (none in practice)
        if q not in counts:
            free.append(i)
    free.sort()
    for p in sorted(counts):
        short = counts[p] - len(have.get(p, []))
        for _ in range(max(0, short)):
            out[free.pop(0)] = p
    return tuple(out)


@dataclass
class _SetState:
    shares: dict[int, float]
    counts: dict[int, int]
    assignment: tuple[int, ...]
    changed_at: float | None = None
    dead: frozenset[int] = frozenset()
    gaining: frozenset[int] = frozenset()    # the ports the last decisions wanted to give patterns to
    streak: int = 0                          # how many decisions in a row wanted that


@dataclass(frozen=True)
class Change:
    """One set re-weighted: its new assignment, weights (patterns per port) and the scores behind them."""
    switch: str
    meta: int
    assignment: tuple[int, ...]
    counts: dict[int, int]
    previous: dict[int, int]
    scores: dict[int, float] = field(default_factory=dict)
    reason: str = ""

    def as_dict(self, t: float) -> dict[str, Any]:
        """The telemetry file's record of this re-weighting at (monotonic) time ``t``: patterns per port
        before and after, and the scores behind them (ports as strings: JSON keys)."""
        return {"kind": "weights", "t": round(t, 4), "switch": self.switch, "set": self.meta,
                "previous": {str(p): v for p, v in sorted(self.previous.items())},
                "counts": {str(p): v for p, v in sorted(self.counts.items())},
                "scores": {str(p): round(v, 4) for p, v in sorted(self.scores.items())}, "reason": self.reason}

    def line(self) -> str:
        """The one log line of this re-weighting."""
        def ports(d: Mapping[int, Any]) -> str:
            return " ".join(f"{p}:{v}" for p, v in sorted(d.items()))
        sc = " ".join(f"{p}:{v:.2f}" for p, v in sorted(self.scores.items()))
        return (f"weights {self.switch} set {self.meta:#x}: {ports(self.previous)} -> {ports(self.counts)} "
                f"(scores {sc}; {self.reason})")


class Weights:
    """The weighted mode's decisions: per-port smoothed scores and per-set shares, weights, assignment."""

    def __init__(self, params: WeightParams | None = None):
        self.params = params or WeightParams()
        self.scores: dict[PortKey, float] = {}
        self.sets: dict[SetKey, _SetState] = {}
        self.n_changes = 0
        #: False: ecmp mode on weighted mode's tables (every set back to, and kept at, its equal assignment)
        self.enabled = True

    def observe(self, samples: Mapping[PortKey, PortTelemetry]) -> None:
        """Smooth one telemetry sample per port into its score."""
        a = self.params.ewma
        for key, s in samples.items():
            x = score(s, self.params)
            old = self.scores.get(key)
            self.scores[key] = x if old is None else a * x + (1 - a) * old

    def decide(self, now: float, samples: Mapping[PortKey, PortTelemetry],
               sets: Mapping[str, Mapping[int, EntropySet]],
               dead: Mapping[str, Iterable[int]] | None = None) -> list[Change]:
        """One interval: the sets whose assignment changes (see the module docstring).

        ``sets``: per switch, its sets as ecmp mode deals them (``WeightedTables.sets``: each set's
        ``assignment`` is the equal one); ``dead``: per switch, its ports whose link or neighbour failed."""
        self.observe(samples)
        dead = dead or {}
        out: list[Change] = []
        seen: set[SetKey] = set()
        for sw in sorted(sets):
            gone = frozenset(dead.get(sw, ()))
            for meta, es in sorted(sets[sw].items()):
                seen.add((sw, meta))
                change = self._decide_set(now, sw, es, gone)
                if change is not None:
                    out.append(change)
        for key in set(self.sets) - seen:
            del self.sets[key]
        return out

    def _decide_set(self, now: float, sw: str, es: EntropySet, gone: frozenset[int]) -> Change | None:
        p = self.params
        key = (sw, es.meta)
        st = self.sets.get(key)
        if st is None or len(st.assignment) != es.patterns or set(st.counts) != set(es.ports):
            counts = es.counts()
            st = self.sets[key] = _SetState({q: counts[q] / es.patterns for q in es.ports}, counts, es.assignment)
        gone = gone & set(es.ports)
        live = [q for q in es.ports if q not in gone]
        sc = {q: self.scores.get((sw, q), 0.0) for q in es.ports}
        if not self.enabled:
            if st.assignment == es.assignment:
                return None
            change = Change(sw, es.meta, es.assignment, es.counts(), dict(st.counts),
                            {q: round(sc[q], 3) for q in es.ports}, "ecmp mode")
            self.sets[key] = _SetState({q: n / es.patterns for q, n in es.counts().items()}, es.counts(),
                                       es.assignment, now, st.dead)
            self.n_changes += 1
            return change
        if not live:
            return None
        head = {q: max(p.floor, 1.0 - sc[q]) for q in live}
        total = sum(head.values())
        equal = 1.0 / len(live)
        target = {q: head[q] / total if q in head else 0.0 for q in es.ports}
        if all(abs(target[q] - equal) <= p.deadband for q in live):
            target = {q: equal if q in head else 0.0 for q in es.ports}
        liveness = gone != st.dead
        if liveness:        # a port died or came back: its share moves at once
            shares = target
        else:
            shares = {q: st.shares.get(q, 0.0) + p.gain * (target[q] - st.shares.get(q, 0.0)) for q in es.ports}
        norm = sum(shares.values())
        st.shares = {q: x / norm for q, x in shares.items()}
        counts = apportion(st.shares, es.patterns, p.min_patterns)
        far = max(abs(st.shares[q] * es.patterns - st.counts.get(q, 0)) for q in es.ports)
        held = st.changed_at is not None and now - st.changed_at < p.hold_s
        if liveness:
            st.dead = gone
        gaining = frozenset(q for q in es.ports if counts.get(q, 0) > st.counts.get(q, 0))
        st.streak = st.streak + 1 if gaining and gaining == st.gaining else (1 if gaining else 0)
        st.gaining = gaining
        if counts == st.counts or (not liveness and (far <= p.hysteresis or held or st.streak < p.persist)):
            return None
        assignment = reassign(st.assignment, counts, es.assignment)
        if liveness:
            reason = f"port(s) {','.join(map(str, sorted(gone)))} dead" if gone else "every port live again"
        else:
            reason = "load"
        change = Change(sw, es.meta, assignment, dict(counts), dict(st.counts),
                        {q: round(sc[q], 3) for q in es.ports}, reason)
        st.counts, st.assignment, st.changed_at = dict(counts), assignment, now
        st.gaining, st.streak = frozenset(), 0
        self.n_changes += 1
        return change


class WeightedTables:
    """The reconciler's compile function in weighted mode (``compile_fn``): ``compile_fn`` (default
    ``compiler.compile_fabric``), every set widened (``compiler.widened``) and dealt as its current
    assignment says. A set whose assignment names a port the failures killed is dealt as in ecmp
    mode until the next decision (its fast-failover groups and avoid entries protect it)."""

    def __init__(self, g: nx.MultiGraph, compile_fn: Any = compiler.compile_fabric):
        self.graph = g
        self.compile_fn = compile_fn
        self.masks = compiler.weighted_masks(compiler.entropy_map(g))
        self.base: dict[str, SwitchState] = {}          # per switch: its widened, ecmp-dealt state
        self.assignments: dict[str, dict[int, tuple[int, ...]]] = {}
        self._widened: dict[int, tuple[SwitchState, SwitchState]] = {}    # id(compiled) -> (compiled, widened)
        self._sets: dict[int, tuple[SwitchState, dict[int, EntropySet]]] = {}

    def __call__(self, g: nx.MultiGraph, failures: compiler.Failures | None = None,
                 policy: str = compiler.DEFAULT_POLICY, **kw: Any) -> dict[str, SwitchState]:
        states = self.compile_fn(g, failures, policy, **kw)
        dead = compiler.dead_ports(g, failures) if failures else {}
        out = {}
        for sw, st in states.items():
            hit = self._widened.get(id(st))
            if hit is None or hit[0] is not st:
                if len(self._widened) > 8 * max(1, len(states)) + 1024:
                    self._widened.clear()
                hit = self._widened[id(st)] = (st, compiler.widened(st, self.masks))
            self.base[sw] = hit[1]
            mine = self.assignments.get(sw, {})
            bad = [m for m, a in mine.items() if set(a) & dead.get(sw, set())]
            for m in bad:
                del mine[m]
            out[sw] = compiler.weighted(hit[1], mine) if mine else hit[1]
        return out

    def sets(self) -> dict[str, dict[int, EntropySet]]:
        """Per switch, its multipath sets as ecmp mode deals them (from the last compile)."""
        out = {}
        for sw, st in self.base.items():
            hit = self._sets.get(id(st))
            if hit is None or hit[0] is not st:
                hit = self._sets[id(st)] = (st, compiler.entropy_sets(st))
            if hit[1]:
                out[sw] = hit[1]
        return out

    def restate(self, changes: Iterable[Change]) -> dict[str, SwitchState]:
        """The states of the switches ``changes`` re-weight (the reconciler's ``Restate`` event)."""
        touched = set()
        for c in changes:
            self.assignments.setdefault(c.switch, {})[c.meta] = c.assignment
            touched.add(c.switch)
        return {sw: compiler.weighted(self.base[sw], self.assignments[sw]) for sw in sorted(touched)
                if sw in self.base}
