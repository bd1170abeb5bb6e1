"""Which paths of a flow are alive: the host side of fast failover (pure: times in, decisions out).

A *path* is one (plane, source port) of the sending rank: index ``plane * ports + k``, the
same index the entropy policies return. The roce transport tells a :class:`PathTable` which
packets the receiver reports delivered, as (path, send time) (:meth:`PathTable.on_delivered`:
from the packets a cumulative ACK covers, the data an ACK echoes, and the per-path reports
ACKs and NACKs carry), and asks it which paths to avoid. The rules, in the field's terms:

Dead path (spraying, several paths per flow)
    A path whose ``dead_losses``-th oldest packet in flight (sent at ``s``, after the newest
    packet of it known delivered; default the second) is older than
    ``max(dead_rtts x srtt, dead_floor_s)``, while another live path of the same flow
    delivered a packet sent after ``s``, is *dead*. One overdue packet is not enough: a queue
    that overflows drops one packet of a path now and then while the path is healthy (every
    path of a flow shares the receiver's port, so moving off it cannot help), and calling
    that a dead path re-sent the path's whole flight into the same full queue. Emulated
    8-rank sprayed all-to-all and all-reduce at 1 MiB, no link down, 4 runs each: judged by
    the first silent packet, 15 paths were condemned (one earlier all-to-all run: 38 paths,
    108 packets re-sent, 0.29 of line where runs without reached 0.59-0.69); by the second,
    2 (and 2 and 3 in two runs of the default matrix with the fallback :meth:`silent`
    describes). A dead link loses every packet sent on it, so its second packet is overdue
    one spray round after the first. The flow sends no new
    packets there and re-sends at once what was in flight on it (the transport does that on
    the paths :meth:`PathTable.check` returns). A plane all of whose paths are dead, or whose
    NIC port refused to send (:meth:`PathTable.kill_plane`: ``ENETUNREACH``/``ENETDOWN``), or
    whose peer said its own port on that plane went down, is avoided the same way. When the
    silent packet is the flow's newest (a message's tail: no later one exists to compare), a
    delivery on another path of a packet sent at most one limit before it is the evidence
    instead; a retransmission timeout is judged the same
    way (:meth:`PathTable.on_timeout`). The table never kills the last live path: with
    nothing alive there is nothing to prefer, and every path keeps being tried.
Probing and repair
    A dead path is probed at once (a path condemned on one random loss comes back within a
    round trip), then once per ``probe_interval_s`` (:meth:`PathTable.probes_due`);
    a report that something sent on it since it was found dead arrived (the probe) brings it back.
Path migration (one path per flow: ``flow`` entropy)
    A flow on one path cannot compare paths; its signal is the retransmission timer. After
    ``migrate_after_rtos`` consecutive timeouts with no progress, the flow moves to another
    path: another source port (a new ECMP hash, so most likely other links) and, when the
    rank has several planes, another plane (:meth:`PathTable.migration_target`), instead of
    backing the timer off to a second. This is path migration in the NCCL/UEC sense: a
    connection is not tied to the ECMP path its first hash picked; like the Ultra Ethernet
    transport, which steers away from entropy values that see losses and timeouts, it draws
    a new entropy value when the current one stops delivering.

Bounded memory: a few numbers per path and a fixed-length event log.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from .base import TransportError


@dataclass(frozen=True)
class PathParams:
    """Knobs of the path rules (see the module's docstring)."""
    dead_rtts: float = 4.0              # K: a path silent for K x srtt ...
    dead_floor_s: float = 0.005         # ... and at least this long is dead
    dead_losses: int = 2                # ... counted from its dead_losses-th oldest silent packet
    probe_interval_s: float = 0.05      # one probe per dead path per interval
    migrate_after_rtos: int = 2         # flow entropy: consecutive RTOs before a new path
    #: several paths per flow: the retransmission timer of a packet is at least its own path's
    #: srtt + 4 rttvar (RFC 6298's estimator per path), not only the flow's. Measured (2026-12-03,
    #: mini-hpn at 8 Mbit/s, adaptive, 3 interleaved repetitions each of an all-to-all, a
    #: permutation and two jobs on a symmetric fabric and with one uplink at half rate): timeouts
    #: per cell 56-188 -> 3-30 (every one a packet that arrived anyway), busbw level or 5-8% up
    path_rto: bool = True

    def __post_init__(self) -> None:
        if self.dead_rtts <= 0 or self.dead_floor_s <= 0 or self.probe_interval_s <= 0:
            raise TransportError("path rules need dead_rtts, dead_floor_s and probe_interval_s above 0")
        if self.dead_losses < 1:
            raise TransportError(f"dead_losses must be at least 1, got {self.dead_losses}")
        if self.migrate_after_rtos < 1:
            raise TransportError(f"migrate_after_rtos must be at least 1, got {self.migrate_after_rtos}")

    def dead_after(self, srtt: float | None) -> float:
        """How long a path may deliver nothing (while others do) before it is dead."""
        return max(self.dead_rtts * (srtt or 0.0), self.dead_floor_s)


def rtt_update(srtt: float | None, rttvar: float, rtt: float) -> tuple[float, float]:
    """RFC 6298's smoothed RTT and RTT variation after the sample ``rtt`` (``srtt`` None: the first)."""
    if srtt is None:
        return rtt, rtt / 2
    return 0.875 * srtt + 0.125 * rtt, 0.75 * rttvar + 0.25 * abs(srtt - rtt)


class _Path:
    __slots__ = ("dead", "dead_since", "deaths", "delivered_t", "probe_t", "revivals", "rttvar", "srtt")

    def __init__(self) -> None:
        self.delivered_t = -1.0                   # send time of the newest packet known delivered
        self.dead = False
        self.dead_since = 0.0
        self.probe_t = 0.0
        self.deaths = 0
        self.revivals = 0
        self.srtt: float | None = None            # the path's own RTT estimate (RFC 6298's gains)
        self.rttvar = 0.0


class PathTable:
    """Liveness of the ``planes x ports`` paths of one flow."""

    def __init__(self, planes: int, ports: int, params: PathParams | None = None, log_len: int = 64):
        self.planes, self.ports = planes, ports
        self.params = params or PathParams()
        self.paths = [_Path() for _ in range(planes * ports)]
        self.events: deque[tuple[float, str, int]] = deque(maxlen=log_len)   # (time, what, path or plane)
        self._dead_planes: set[int] | None = set()      # cached; None: to recompute
        self._n_dead: int | None = 0

    def __len__(self) -> int:
        return len(self.paths)

    def plane_of(self, path: int) -> int:
        return path // self.ports

    def live(self, path: int) -> bool:
        return not self.paths[path].dead

    def live_paths(self) -> list[int]:
        return [i for i, p in enumerate(self.paths) if not p.dead]

    def dead_paths(self) -> list[int]:
        return [i for i, p in enumerate(self.paths) if p.dead]

    def dead_planes(self) -> set[int]:
        """Planes every path of which is dead."""
        if self._dead_planes is None:
            self._dead_planes = {pl for pl in range(self.planes)
                                 if all(self.paths[i].dead for i in range(pl * self.ports, (pl + 1) * self.ports))}
        return self._dead_planes

    def _any_dead(self) -> bool:
        if self._n_dead is None:
            self._n_dead = sum(p.dead for p in self.paths)
        return self._n_dead > 0

    def delivered_t(self, path: int) -> float:
        """Send time of the newest packet on ``path`` that the receiver reported (-1: none)."""
        return self.paths[path].delivered_t

    # ---- events in ------------------------------------------------------------------------
    def on_delivered(self, path: int, sent_t: float, now: float) -> bool:
        """The receiver reports that a packet sent on ``path`` at ``sent_t`` arrived. True if
        that brings a dead path back (it was sent after the path was found dead: a probe)."""
        p = self.paths[path]
        if sent_t > p.delivered_t:
            p.delivered_t = sent_t
        if p.dead and sent_t >= p.dead_since:
            p.dead = False
            self._dead_planes = self._n_dead = None
            p.revivals += 1
            self.events.append((now, "alive", path))
            return True
        return False

    def on_rtt(self, path: int, rtt: float) -> None:
        """An RTT sample of a packet sent on ``path``: its smoothed RTT and variation (RFC 6298)."""
        p = self.paths[path]
        p.srtt, p.rttvar = rtt_update(p.srtt, p.rttvar, rtt)

    def rto(self, path: int) -> float | None:
        """``path``'s own retransmission timeout, srtt + 4 rttvar (None: no sample yet)."""
        p = self.paths[path]
        return None if p.srtt is None else p.srtt + 4 * p.rttvar

    def kill(self, path: int, now: float, why: str = "dead") -> bool:
        """Mark ``path`` dead unless it is the last live one; True if it was marked."""
        p = self.paths[path]
        if p.dead or len(self.live_paths()) <= 1:
            return False
        # the first probe at once: a path condemned on one lost packet (a random loss while
        # the flow had nothing more to send on it) answers within a round trip and is back
        p.dead, p.dead_since, p.probe_t = True, now, now - self.params.probe_interval_s
        self._dead_planes = self._n_dead = None
        p.deaths += 1
        self.events.append((now, why, path))
        return True

    def kill_plane(self, plane: int, now: float, why: str = "plane_down") -> list[int]:
        """The NIC port of ``plane`` cannot send (or the peer's cannot receive: ``why``
        "peer_plane_down"): every path of it dead (as long as another plane has a live path).
        Returns the paths newly marked."""
        mine = range(plane * self.ports, (plane + 1) * self.ports)
        if not any(not self.paths[i].dead for i in range(len(self.paths)) if i not in mine):
            return []
        out = []
        for i in mine:
            p = self.paths[i]
            if not p.dead:
                p.dead, p.dead_since, p.probe_t = True, now, now
                p.deaths += 1
                out.append(i)
        if out:
            self._dead_planes = self._n_dead = None
            self.events.append((now, why, plane))
        return out

    def probe_plane_now(self, plane: int, now: float) -> None:
        """The NIC port of ``plane`` is back: probe its dead paths at once."""
        for i in range(plane * self.ports, (plane + 1) * self.ports):
            if self.paths[i].dead:
                self.paths[i].probe_t = now - self.params.probe_interval_s

    # ---- decisions out ------------------------------------------------------------------
    def silent(self, sends: Iterable[tuple[int, float]], more_coming: bool = True
               ) -> tuple[dict[int, float], float]:
        """From the flow's packets in flight as (path, send time): per path, the send time
        :meth:`check` judges it by (its ``dead_losses``-th oldest packet sent after the newest
        one known delivered; with fewer, its oldest, when no second can follow: that packet is
        the flow's newest, a message's tail; or it is the only silent packet of the flow, which
        can send nothing more now (``more_coming`` false: its data is all sent or its window
        is full), so it waits for that packet alone: re-sending it elsewhere costs one packet,
        where condemning a path with a queue's worth in flight re-sent them all), and the send
        time of the flow's newest packet in flight (0.0: none)."""
        per: dict[int, list[float]] = {}
        last = 0.0
        for path, sent in sends:
            last = max(last, sent)
            if sent and sent > self.paths[path].delivered_t:
                per.setdefault(path, []).append(sent)
        k = self.params.dead_losses
        if not more_coming and sum(len(times) for times in per.values()) == 1:
            k = 1
        out = {}
        for path, times in per.items():
            if len(times) >= k:
                out[path] = heapq.nsmallest(k, times)[-1]
            elif max(times) >= last:
                out[path] = min(times)
        return out, last

    def check(self, now: float, srtt: float | None, unconfirmed: dict[int, float],
              last_sent: float | None = None) -> list[int]:
        """Paths that turn dead now; they are marked dead. ``unconfirmed`` gives, per path,
        the send time it is judged by (:meth:`silent` reads it off the packets in flight);
        ``last_sent`` the send time of the flow's newest packet in flight. Evidence that the others still deliver: one
        delivered a packet sent later; or, when this path holds the newest packet of all (a
        message's tail: nothing later exists to compare), one delivered a packet sent at
        most one limit before it."""
        limit = self.params.dead_after(srtt)
        out = []
        for i, since in sorted(unconfirmed.items()):
            p = self.paths[i]
            if p.dead or now - since <= limit or p.delivered_t >= since:
                continue
            tail = last_sent is not None and since >= last_sent
            after = since - limit if tail else since
            if any(q.delivered_t > after and not q.dead for j, q in enumerate(self.paths) if j != i) \
                    and self.kill(i, now):
                out.append(i)
        return out

    def on_timeout(self, path: int, sent_t: float, now: float, srtt: float | None) -> bool:
        """The retransmission timer fired for a packet sent on ``path`` at ``sent_t``. When it
        was the flow's last packet, no later packet can show the other paths still deliver;
        a delivery on another live path of a packet sent at most one limit before it does.
        True if ``path`` is marked dead."""
        limit = self.params.dead_after(srtt)
        p = self.paths[path]
        if p.dead or now - sent_t <= limit or p.delivered_t >= sent_t:
            return False
        if any(q.delivered_t > sent_t - limit and not q.dead for j, q in enumerate(self.paths) if j != path):
            return self.kill(path, now, "dead")
        return False

    def probes_due(self, now: float) -> list[int]:
        """Dead paths whose next probe is due (their probe clock restarts)."""
        if not self._any_dead():
            return []
        out = []
        for i, p in enumerate(self.paths):
            if p.dead and now - p.probe_t >= self.params.probe_interval_s:
                p.probe_t = now
                out.append(i)
        return out

    def next_probe(self) -> float | None:
        """When the next probe is due (None: no dead path)."""
        if not self._any_dead():
            return None
        due = [p.probe_t + self.params.probe_interval_s for p in self.paths if p.dead]
        return min(due) if due else None

    def migration_target(self, current: int) -> int:
        """Where a one-path flow moves after repeated timeouts: the first live path after
        ``current`` on another plane (if the rank has several) with another source port;
        else any other live path; else ``current`` itself (one path only: the transport then
        gives that path a new source port)."""
        n = len(self.paths)
        order = [(current + self.ports + 1 + k) % n for k in range(n)]
        order = [i for i in order if i != current]
        for want_other_plane in (True, False):
            for i in order:
                if self.paths[i].dead:
                    continue
                if want_other_plane and self.planes > 1 and self.plane_of(i) == self.plane_of(current):
                    continue
                return i
        return current

    def summary(self, wall_offset: float = 0.0) -> dict:
        """JSON-ready: dead paths now, counts, and the event log with wall-clock times."""
        return {"dead_now": self.dead_paths(), "deaths": sum(p.deaths for p in self.paths),
                "revivals": sum(p.revivals for p in self.paths),
                "events": [[t + wall_offset, what, idx] for t, what, idx in self.events]}


def ack_plane(last_data_t: list[float], tx_dead_planes: set[int], suspect_until: list[float],
              current: int, now: float, fresh_s: float, hysteresis_s: float = 0.002) -> int:
    """The plane a receiver answers a peer on (ACK, NACK, CNP).

    Candidates are the planes that delivered data from the peer within ``fresh_s``, that
    this rank's own sending to the peer does not find dead (a link failure is usually both
    ways) and whose answers do not seem lost (``suspect_until``: the peer re-sent data
    already acknowledged on that plane). The current plane is kept while it is a candidate
    and delivered no more than ``hysteresis_s`` before the newest candidate (answers on one
    plane arrive in order; spraying alternates planes every packet); otherwise the answers
    move to the candidate that delivered last, so they follow within a few milliseconds a
    sender that stopped using a plane. With no candidate: the plane that delivered last
    and is not dead for sending, else the current one.
    """
    def ok(pl: int) -> bool:
        return pl not in tx_dead_planes and suspect_until[pl] <= now

    fresh = [pl for pl, t in enumerate(last_data_t) if t > 0 and now - t <= fresh_s and ok(pl)]
    if fresh:
        best = max(fresh, key=lambda pl: last_data_t[pl])
        if current in fresh and last_data_t[current] >= last_data_t[best] - hysteresis_s:
            return current
        return best
    seen = [pl for pl, t in enumerate(last_data_t) if t > 0 and pl not in tx_dead_planes]
    if seen:
        return max(seen, key=lambda pl: last_data_t[pl])
    return current
