"""Which paths of a flow are alive: the host side of fast failover (pure: times in, decisions out).

A *path* is one (plane, source port) of the sending rank: index ``plane * ports + k``, the
same index the entropy policies return. The roce transport tells a :class:`PathTable` what
it sent on which path (:meth:`PathTable.on_send`) and which paths the receiver says
delivered (:meth:`PathTable.on_credit`, from the path mask every ACK and NACK carries), and
asks it which paths to avoid. The rules, in the field's terms:

Dead path (spraying, several paths per flow)
    A path that was sent on at ``pending_since`` and has delivered nothing since, for longer
    than ``max(dead_rtts x srtt, dead_floor_s)``, while another live path of the same flow
    delivered something sent after ``pending_since``, is *dead*: the flow sends no new
    packets there and re-sends at once what was in flight on it (the transport does that on
    the paths :meth:`PathTable.check` returns). A plane all of whose paths are dead, or whose
    NIC port refused to send (:meth:`PathTable.kill_plane`: ``ENETUNREACH``/``ENETDOWN``), is
    avoided the same way. The table never kills the last live path: with nothing alive
    there is nothing to prefer, and every path keeps being tried.
Probing and repair
    Each dead path gets one probe per ``probe_interval_s`` (:meth:`PathTable.probes_due`);
    a credit for it (the receiver saw the probe) brings it back.
Path migration (one path per flow: ``flow`` entropy)
    A flow on one path cannot compare paths; its signal is the retransmission timer. After
    ``migrate_after_rtos`` consecutive timeouts with no progress, the flow moves to another
    path: another source port (a new ECMP hash, so most likely other links) and, when the
    rank has several planes, another plane (:meth:`PathTable.migration_target`). This is the
    rule of NCCL's and UEC's transports (UEC: on repeated timeouts a packet's entropy value
    is retired and a new one drawn), instead of backing the timer off to a second.

Bounded memory: a few numbers per path and a fixed-length event log.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .base import TransportError


@dataclass(frozen=True)
class PathParams:
    """Knobs of the path rules (see the module's docstring)."""
    dead_rtts: float = 4.0              # K: a path silent for K x srtt ...
    dead_floor_s: float = 0.005         # ... and at least this long is dead
    probe_interval_s: float = 0.05      # one probe per dead path per interval
    migrate_after_rtos: int = 2         # flow entropy: consecutive RTOs before a new path

    def __post_init__(self) -> None:
        if self.dead_rtts <= 0 or self.dead_floor_s <= 0 or self.probe_interval_s <= 0:
            raise TransportError("path rules need dead_rtts, dead_floor_s and probe_interval_s above 0")
        if self.migrate_after_rtos < 1:
            raise TransportError(f"migrate_after_rtos must be at least 1, got {self.migrate_after_rtos}")

    def dead_after(self, srtt: float | None) -> float:
        """How long a path may deliver nothing (while others do) before it is dead."""
        return max(self.dead_rtts * (srtt or 0.0), self.dead_floor_s)


class _Path:
    __slots__ = ("credit_t", "dead", "dead_since", "deaths", "pending_since", "probe_t", "revivals")

    def __init__(self) -> None:
        self.pending_since: float | None = None   # first send not yet covered by a credit
        self.credit_t = -1.0                      # last time the receiver said it delivered
        self.dead = False
        self.dead_since = 0.0
        self.probe_t = 0.0
        self.deaths = 0
        self.revivals = 0


class PathTable:
    """Liveness of the ``planes x ports`` paths of one flow."""

    def __init__(self, planes: int, ports: int, params: PathParams | None = None, log_len: int = 64):
        self.planes, self.ports = planes, ports
        self.params = params or PathParams()
        self.paths = [_Path() for _ in range(planes * ports)]
        self.events: deque[tuple[float, str, int]] = deque(maxlen=log_len)   # (time, what, path or plane)

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
        return {pl for pl in range(self.planes)
                if all(self.paths[i].dead for i in range(pl * self.ports, (pl + 1) * self.ports))}

    # ---- events in ------------------------------------------------------------------------
    def on_send(self, path: int, now: float) -> None:
        p = self.paths[path]
        if p.pending_since is None:
            p.pending_since = now

    def on_credit(self, path: int, now: float) -> bool:
        """The receiver says ``path`` delivered; True if that brings a dead path back."""
        p = self.paths[path]
        p.credit_t = now
        p.pending_since = None
        if p.dead:
            p.dead = False
            p.revivals += 1
            self.events.append((now, "alive", path))
            return True
        return False

    def kill(self, path: int, now: float, why: str = "dead") -> bool:
        """Mark ``path`` dead unless it is the last live one; True if it was marked."""
        p = self.paths[path]
        if p.dead or len(self.live_paths()) <= 1:
            return False
        p.dead, p.dead_since, p.probe_t = True, now, now
        p.pending_since = None
        p.deaths += 1
        self.events.append((now, why, path))
        return True

    def kill_plane(self, plane: int, now: float) -> list[int]:
        """The NIC port of ``plane`` cannot send: every path of it dead (as long as another
        plane has a live path). Returns the paths newly marked."""
        mine = range(plane * self.ports, (plane + 1) * self.ports)
        if not any(not self.paths[i].dead for i in range(len(self.paths)) if i not in mine):
            return []
        out = []
        for i in mine:
            if not self.paths[i].dead:
                p = self.paths[i]
                p.dead, p.dead_since, p.probe_t = True, now, now
                p.pending_since = None
                p.deaths += 1
                out.append(i)
        if out:
            self.events.append((now, "plane_down", plane))
        return out

    # ---- decisions out ------------------------------------------------------------------
    def check(self, now: float, srtt: float | None) -> list[int]:
        """Paths that turn dead now (the dead-path rule); they are marked dead."""
        limit = self.params.dead_after(srtt)
        out = []
        for i, p in enumerate(self.paths):
            if p.dead or p.pending_since is None or now - p.pending_since <= limit:
                continue
            since = p.pending_since
            if any(q.credit_t > since and not q.dead for j, q in enumerate(self.paths) if j != i) \
                    and self.kill(i, now):
                out.append(i)
        return out

    def probes_due(self, now: float) -> list[int]:
        """Dead paths whose next probe is due (their probe clock restarts)."""
        out = []
        for i, p in enumerate(self.paths):
            if p.dead and now - p.probe_t >= self.params.probe_interval_s:
                p.probe_t = now
                out.append(i)
        return out

    def next_probe(self) -> float | None:
        """When the next probe is due (None: no dead path)."""
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
              current: int, now: float, fresh_s: float) -> int:
    """The plane a receiver answers a peer on (ACK, NACK, CNP).

    Candidates are the planes that delivered data from the peer within ``fresh_s`` and that
    this rank's own sending to the peer does not find dead (a link failure is usually both
    ways) and whose ACKs were not recently found lost (``suspect_until``: the peer re-sent
    data already acknowledged on that plane). The current plane is kept while it stays a
    candidate (ACKs on one plane arrive in order); otherwise the candidate that delivered
    last. With no candidate: the plane that delivered last and is not dead for sending,
    else the current one.
    """
    def ok(pl: int) -> bool:
        return pl not in tx_dead_planes and suspect_until[pl] <= now

    fresh = [pl for pl, t in enumerate(last_data_t) if t > 0 and now - t <= fresh_s and ok(pl)]
    if current in fresh:
        return current
    if fresh:
        return max(fresh, key=lambda pl: last_data_t[pl])
    seen = [pl for pl, t in enumerate(last_data_t) if t > 0 and pl not in tx_dead_planes]
    if seen:
        return max(seen, key=lambda pl: last_data_t[pl])
    return current
