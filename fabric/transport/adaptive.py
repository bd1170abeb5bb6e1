"""Host-side adaptive routing per packet: which path a flow's next packet takes (pure).

Two rules live here. :class:`WeightedPaths` is the ``adaptive`` entropy; :class:`AdaptivePaths`
(REPS's recycling, below) is the ``reps`` entropy, kept for comparison.

The ``adaptive`` rule (:class:`WeightedPaths`): spray, weighted by path-specific evidence
    Every live path has a weight in [``w_min``, 1], and packets go out in smooth weighted round
    robin (nginx's SWRR): equal weights are exactly ``spray``'s rotation. A path's weight is the
    product of two factors. Its *delay* factor is the flow's median live path's smoothed RTT
    (plus a slack) over this path's, so a path whose queue is longer than most others' gets
    less, and congestion every path shares -- the receiver's own port, in an all-to-all --
    moves nothing, nor does its noise. Its *mark* factor drops by ``mark_cut`` on a congestion
    mark (a CNP naming the path) and by ``loss_cut`` on a loss the path's own sequence showed
    (PATH_LOSS), recovers towards 1 with time constant ``recover_s``, and counts against the
    median live path's: a path that marks more often than most carries less while it does. A
    retransmission timeout cuts by ``timeout_cut``, 0 by default: on a sprayed connection it is
    most often a packet still queued (``reference="best"``, ``timeout_cut=0.75``: the rule
    before 2026-12-03). Nothing is taken away for good, so a path that clears comes back.
    Why not REPS's recycling here: with few paths per flow (mini-hpn's map has 2 per plane, 4 per
    flow), the recycled tokens concentrate a flow's packets on whichever paths acknowledged first,
    a rested path moves all of its plane's share to the other at once, and the sprayed all-to-all
    of ``--compare routing`` measured 0.55-0.62 of line with REPS's rule (with or without resting,
    with or without the RTT test) where oblivious spray measured 0.90-0.91 on the same fabric in
    the same run (2026-12-02, mini-hpn, 20 Mbit/s).

The ``reps`` rule (:class:`AdaptivePaths`):

A *path* is one (plane, entropy value) of the sending rank, the index the transport's
entropy policies return (``plane * ports + k``); with the controller's entropy map every
entropy value is a known, distinct path (:class:`hpnlab.fabric.routing.entropy.EntropyMap`).

It follows REPS (Bonato et al., "REPS: Recycled Entropy Packet Spraying", 2024):

Recycling
    Each packet sent takes a path *token* from a FIFO (the recycle buffer, at most
    ``recycle`` tokens). A packet acknowledged cleanly -- delivered once, no congestion
    mark seen on its path, its path's RTT not above ``rtt_factor`` x the flow's smallest
    -- gives its path's token back. So paths that deliver cleanly are reused, in proportion
    to how fast they deliver (a path at half the rate returns its tokens half as fast),
    and a path that marks or loses packets stops getting them.
Dropping
    A congestion mark (a CNP naming a packet's path), a NACK or a retransmission timeout on a
    path throws away every token of that path and *rests* it for ``hold_rtts`` x the
    smallest RTT (at least ``hold_floor_s``); a mark during or soon after a rest doubles the
    next rest, up to ``hold_max_s``; a clean acknowledgement resets it (hysteresis: a path
    that marks again and again stays out longer, one mark costs little).
Exploring
    When the buffer runs short (start, or tokens dropped) the packet explores: the next path
    in rotation that is live and not resting (all resting: the one whose rest ends first).
    One packet in ``explore_every`` explores anyway, in place of a token, so that a path
    whose marks have cleared comes back into the mix (REPS relies on other paths' marks for
    this; a symmetric fabric that never marks would otherwise keep whatever mix it started
    with).
Never a dead path
    Liveness comes from the transport's dead-path detection (:class:`.paths.PathTable`):
    tokens of a dead path are discarded when they come up, exploration skips it.

Where this differs from REPS: REPS caches entropy values drawn at random from a large space
and echoes each packet's entropy in a per-packet ACK with its ECN bit; here the entropy
values are few, named paths (the entropy map), ACKs are coalesced and cumulative (the
transport gives back one token per packet they acknowledge), marks come as rate-limited
CNPs (so a mark drops every token of its path, not one), exploration is a rotation rather
than a random draw, and REPS's failure "freezing" is left to the dead-path detection.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .base import TransportError


@dataclass(frozen=True)
class AdaptiveParams:
    """Knobs of the adaptive rule (see the module's docstring)."""
    recycle: int = 64               # tokens the recycle buffer holds at most
    explore_every: int = 16         # one packet in this many explores (0: only when short)
    hold_rtts: float = 8.0          # a marked path rests this many smallest RTTs ...
    hold_floor_s: float = 0.002     # ... and at least this long
    hold_max_s: float = 0.1         # repeated marks double the rest, up to this
    rtt_factor: float = 4.0         # an ACK on a path slower than this x the smallest RTT recycles nothing (0: off)

    def __post_init__(self) -> None:
        if self.recycle < 1 or self.explore_every < 0:
            raise TransportError("adaptive entropy needs recycle >= 1 and explore_every >= 0")
        if self.hold_floor_s <= 0 or self.hold_max_s < self.hold_floor_s or self.hold_rtts < 0:
            raise TransportError("adaptive entropy needs 0 < hold_floor_s <= hold_max_s and hold_rtts >= 0")
        if self.rtt_factor and self.rtt_factor < 1:
            raise TransportError(f"rtt_factor must be 0 (off) or at least 1, got {self.rtt_factor}")


class AdaptivePaths:
    """The adaptive state of one flow over ``n`` paths (a few numbers per path and the buffer)."""

    def __init__(self, n: int, params: AdaptiveParams | None = None, start: int = 0):
        if n < 1:
            raise TransportError("adaptive entropy needs at least one path")
        self.n = n
        self.p = params or AdaptiveParams()
        self.tokens: deque[int] = deque()
        self.rest_until = [0.0] * n
        self.rest_s = [0.0] * n
        self.srtt: list[float | None] = [None] * n
        self.min_rtt: float | None = None
        self.cursor = start % n
        self.sent = 0
        self.stats = {"recycled": 0, "explored": 0, "marks": 0, "losses": 0, "not_recycled": 0}

    # ---- decisions ------------------------------------------------------------------
    def resting(self, path: int, now: float) -> bool:
        return self.rest_until[path] > now

    def choose(self, now: float, live: Callable[[int], bool]) -> int:
        """The path of the next packet (never a dead one while a live one exists)."""
        self.sent += 1
        explore = bool(self.p.explore_every) and self.sent % self.p.explore_every == 0
        while self.tokens:
            path = self.tokens.popleft()
            if live(path) and not self.resting(path, now):
                if not explore:
                    return path
                break                       # this packet explores in the token's place
        return self._explore(now, live)

    def _explore(self, now: float, live: Callable[[int], bool]) -> int:
        self.stats["explored"] += 1
        n = self.n
        order = [(self.cursor + 1 + k) % n for k in range(n)]
        pick = next((i for i in order if live(i) and not self.resting(i, now)), None)
        if pick is None:                    # every live path rests: the one back soonest
            alive = [i for i in order if live(i)]
            pick = min(alive, key=lambda i: self.rest_until[i]) if alive else order[0]
        self.cursor = pick
        return pick

    # ---- feedback -------------------------------------------------------------------
    def on_rtt(self, path: int, rtt: float, now: float = 0.0) -> None:
        """An RTT sample of a packet sent on ``path`` (``now``: unused here, the weighted rule's)."""
        if rtt <= 0:
            return
        if self.min_rtt is None or rtt < self.min_rtt:
            self.min_rtt = rtt
        s = self.srtt[path]
        self.srtt[path] = rtt if s is None else 0.875 * s + 0.125 * rtt

    def slow(self, path: int) -> bool:
        s = self.srtt[path]
        return bool(self.p.rtt_factor) and s is not None and self.min_rtt is not None \
            and s > self.p.rtt_factor * self.min_rtt

    def on_ack(self, path: int, now: float) -> None:
        """One packet sent once on ``path`` was acknowledged."""
        if self.resting(path, now) or self.slow(path):
            self.stats["not_recycled"] += 1
            return
        self.rest_s[path] = 0.0
        if len(self.tokens) < self.p.recycle:
            self.tokens.append(path)
            self.stats["recycled"] += 1

    def _rest(self, path: int, now: float) -> None:
        p = self.p
        base = max(p.hold_floor_s, p.hold_rtts * (self.min_rtt or 0.0))
        self.rest_s[path] = min(p.hold_max_s, 2 * self.rest_s[path] if self.rest_s[path] else base)
        self.rest_until[path] = now + self.rest_s[path]
        if path in self.tokens:
            self.tokens = deque(t for t in self.tokens if t != path)

    def on_mark(self, path: int, now: float) -> None:
        """A congestion mark (CE, echoed as a CNP) on a packet of ``path``."""
        self.stats["marks"] += 1
        self._rest(path, now)

    def on_loss(self, path: int, now: float) -> None:
        """A NACK or a retransmission timeout for a packet of ``path``."""
        self.stats["losses"] += 1
        self._rest(path, now)

    def on_timeout(self, path: int, now: float) -> None:
        """The retransmission timer fired for a packet of ``path``: a loss, as REPS counts it."""
        self.on_loss(path, now)

    def summary(self, now: float | None = None) -> dict:
        return {**self.stats, "tokens": len(self.tokens)}


@dataclass(frozen=True)
class WeightParams:
    """Knobs of the weighted rule (see the module's docstring)."""
    w_min: float = 0.05             # the least weight a live path keeps (it still carries a little)
    rtt_slack: float = 0.25         # RTTs within (1 + this) x the best path's count as the best's
    rtt_slack_s: float = 0.001      # ... and within this many seconds of it
    mark_cut: float = 0.5           # a mark multiplies the path's mark factor by (1 - this)
    loss_cut: float = 0.75          # a loss, by (1 - this)
    timeout_cut: float = 0.0        # a retransmission timeout, by (1 - this): nothing by default
    recover_s: float = 0.1          # the mark factor's way back to 1: time constant, seconds
    rtt_gain: float = 0.25          # the per-path smoothed RTT's gain per sample
    #: what a path is measured against: "median" (the flow's median live path: its RTT and its mark
    #: factor) or "best" (the path of least RTT, and a mark factor of 1: the rule before 2026-12-03)
    reference: str = "median"

    def __post_init__(self) -> None:
        if not 0 < self.w_min <= 1:
            raise TransportError(f"w_min must be in (0, 1], got {self.w_min}")
        if not (0 <= self.mark_cut < 1 and 0 <= self.loss_cut < 1 and 0 <= self.timeout_cut < 1):
            raise TransportError("mark_cut, loss_cut and timeout_cut must be in [0, 1)")
        if self.reference not in ("median", "best"):
            raise TransportError(f"reference must be median or best, got {self.reference!r}")
        if self.recover_s <= 0 or not 0 < self.rtt_gain <= 1 or self.rtt_slack < 0 or self.rtt_slack_s < 0:
            raise TransportError("recover_s and rtt_gain must be above 0 (rtt_gain at most 1), the slacks at least 0")


def _median(xs: list[float]) -> float:
    """The median of ``xs`` (1.0 for none)."""
    if not xs:
        return 1.0
    xs = sorted(xs)
    k = len(xs) // 2
    return xs[k] if len(xs) % 2 else (xs[k - 1] + xs[k]) / 2


class WeightedPaths:
    """The weighted state of one flow over ``n`` paths: a weight per path, chosen from in smooth
    weighted round robin over ``order`` (the transport's rotation, planes interleaved)."""

    def __init__(self, n: int, params: WeightParams | None = None, order: list[int] | None = None):
        if n < 1:
            raise TransportError("adaptive entropy needs at least one path")
        if order is not None and sorted(order) != list(range(n)):
            raise TransportError(f"the path order must list each of the {n} paths once")
        self.n = n
        self.p = params or WeightParams()
        self.order = list(order) if order is not None else list(range(n))
        self.srtt: list[float | None] = [None] * n
        self.srtt_t = [0.0] * n              # when each path's RTT was last sampled
        self.mark = [1.0] * n                # the mark factor
        self.mark_t = [0.0] * n              # when it was last brought up to date
        self.current = [0.0] * n             # SWRR's running credit
        self.stats = {"marks": 0, "losses": 0, "timeouts": 0, "cut": 0}

    # ---- the weights ----------------------------------------------------------------
    def _mark_factor(self, path: int, now: float) -> float:
        m = self.mark[path]
        if m < 1.0:
            m = 1.0 - (1.0 - m) * math.exp(-max(0.0, now - self.mark_t[path]) / self.p.recover_s)
            self.mark[path], self.mark_t[path] = m, now
        return m

    def weights(self, now: float, live: Callable[[int], bool]) -> list[float]:
        """Each path's weight now (0 for a dead one)."""
        p = self.p
        alive = [live(i) for i in range(self.n)]
        known = [s for s, a in zip(self.srtt, alive, strict=True) if s is not None and a]
        marks = [self._mark_factor(i, now) if a else 0.0 for i, a in enumerate(alive)]
        # congestion every path shares (the receiver's own port, in an all-to-all) moves nothing,
        # and neither does its noise: a path counts against the flow's median live path, so only
        # the paths worse than most lose weight
        if p.reference == "median":
            best = _median(known) if known else None
            ref = _median([m for m, a in zip(marks, alive, strict=True) if a])
        else:
            best, ref = (min(known) if known else None), 1.0
        out = []
        for i in range(self.n):
            if not alive[i]:
                out.append(0.0)
                continue
            w = min(1.0, marks[i] / ref)
            s = self.srtt[i]
            if best is not None and s is not None:
                # a path that carries little is seldom sampled: its excess fades without samples
                # (4 x recover_s), so that a stale high RTT does not keep it low for good
                s = best + (s - best) * math.exp(-max(0.0, now - self.srtt_t[i]) / (4 * p.recover_s))
                fair = max(best * (1 + p.rtt_slack), best + p.rtt_slack_s)
                w *= min(1.0, fair / s)
            out.append(max(p.w_min, w))
        return out

    # ---- decisions ------------------------------------------------------------------
    def choose(self, now: float, live: Callable[[int], bool]) -> int:
        """The path of the next packet: smooth weighted round robin (never a dead path while a live one exists)."""
        w = self.weights(now, live)
        total = sum(w)
        if total <= 0:                       # every path dead: the transport's probes bring one back
            return self.order[0]
        pick, top = -1, -1.0
        for i in self.order:
            if w[i] <= 0:
                self.current[i] = 0.0
                continue
            self.current[i] += w[i]
            if self.current[i] > top:
                pick, top = i, self.current[i]
        self.current[pick] -= total
        return pick

    # ---- feedback -------------------------------------------------------------------
    def on_rtt(self, path: int, rtt: float, now: float = 0.0) -> None:
        """An RTT sample of a packet sent on ``path``, taken at ``now``."""
        if rtt <= 0:
            return
        s = self.srtt[path]
        self.srtt[path] = rtt if s is None else (1 - self.p.rtt_gain) * s + self.p.rtt_gain * rtt
        self.srtt_t[path] = now

    def on_ack(self, path: int, now: float) -> None:
        """A packet sent once on ``path`` was acknowledged: nothing to do (the RTT and the marks carry the news)."""

    def _cut(self, path: int, now: float, by: float) -> None:
        self.mark[path] = self._mark_factor(path, now) * (1 - by)
        self.mark_t[path] = now
        self.stats["cut"] += 1

    def on_mark(self, path: int, now: float) -> None:
        self.stats["marks"] += 1
        self._cut(path, now, self.p.mark_cut)

    def on_loss(self, path: int, now: float) -> None:
        self.stats["losses"] += 1
        self._cut(path, now, self.p.loss_cut)

    def on_timeout(self, path: int, now: float) -> None:
        """The retransmission timer fired for a packet of ``path``: cut by ``timeout_cut``. On a
        sprayed connection that is most often a packet still queued: a loss on the path shows in
        its own sequence (PATH_LOSS, ``on_loss``) as soon as a later packet of the path arrives."""
        self.stats["timeouts"] += 1
        if self.p.timeout_cut:
            self._cut(path, now, self.p.timeout_cut)

    def summary(self, now: float | None = None) -> dict:
        t = max(self.mark_t) if now is None else now
        return {**self.stats, "weights": [round(w, 3) for w in self.weights(t, lambda _i: True)]}
