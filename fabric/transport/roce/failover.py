"""The paths of a rank's flows: which path each packet takes and which paths are alive (the
host side of fast failover; the rules themselves are :mod:`..paths`' pure :class:`PathTable`).

Evidence comes in as delivery reports (the receiver names, per path, the newest packet that
arrived), retransmission timeouts, the NIC ports' links (polled through rtnetlink, :mod:`..nic`)
and the peers' PLANE notices; what goes out is a dead path left at once (what was in flight on
it queued to be sent again on live paths), probes down dead paths, a one-path flow migrated to a
new entropy value, and PLANE notices to the peers when a port of this rank goes down or comes back.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Callable

from ..entropy import EntropyPolicy
from ..nic import interface_of, link_up, netlink_socket
from ..paths import PathParams
from .endpoint import Endpoint
from .flows import RxFlow, TxFlow
from .wire import NO_REPORT, PLANE


class Failover:
    """Path choice and path liveness for the flows ``tx`` (and, for the answers a port going
    down lost, ``rx``) of a rank, sending through ``endpoint``."""

    def __init__(self, policy: EntropyPolicy, endpoint: Endpoint, tx: dict[int, TxFlow], rx: dict[int, RxFlow],
                 params: PathParams, *, watch_links: bool = True, link_poll_s: float = 0.005,
                 link_state: Callable[[str], bool | None] | None = None, nics: list[str | None] | None = None,
                 wall_offset: float = 0.0):
        self.policy = policy
        self.endpoint = endpoint
        self.tx, self.rx = tx, rx
        self.params = params
        self.planes = endpoint.planes
        self.ports_per_nic = endpoint.ports_per_nic
        self.watch_links = watch_links
        self.link_poll_s = link_poll_s
        self._link_state = link_state                # (interface) -> up?; default: nic.link_up
        self.nics: list[str | None] = list(nics or [])   # per plane: the interface owning its address
        self.link_ok: list[bool] = []
        self.next_link_poll = 0.0
        self.link_events: list[list] = []           # [wall time, plane, "down" | "up"], bounded
        self._link_sock: socket.socket | None = None
        self.wall_offset = wall_offset

    def start(self, ips: list[str]) -> None:
        """Find the interface of each plane's address ``ips`` (unless given) and watch its link."""
        if self.watch_links:
            if not self.nics:
                self.nics = [interface_of(ip) for ip in ips]
            if self._link_state is None:
                sock = self._link_sock = netlink_socket()
                self._link_state = lambda name: link_up(name, sock)
        self.link_ok = [True] * self.planes

    # ---- the path of a packet ------------------------------------------------------------
    def choose_path(self, f: TxFlow) -> int:
        """The path of the flow's next packet: the policy's choice, skipping dead paths
        (spraying moves on to the next live one; a one-path flow stays where it migrated)."""
        if self.policy.per_flow:
            if f.cur_path is None:
                f.cur_path = self.policy.path(f, f.seq)
            return f.cur_path
        first = self.policy.path(f, f.seq)
        table = f.paths
        if table.live(first):
            return first
        for k in range(1, len(table)):
            p = self.policy.path(f, f.seq + k)
            if table.live(p):
                f.seq += k
                return p
        return first

    # ---- timers --------------------------------------------------------------------------
    def poll(self, now: float) -> None:
        """Poll the NIC ports' links when that is due."""
        if self.watch_links and self.nics and now >= self.next_link_poll:
            self.poll_links(now)

    def on_timers(self, flows: list[TxFlow], now: float) -> None:
        """The dead-path rule where it is due, and the probes due on dead paths."""
        for f in flows:
            if now >= f.next_check:
                self.check_paths(f, now)
            for path in f.paths.probes_due(now):
                self.probe(f, path, now)

    def next_due(self, flows: list[TxFlow], wake: float) -> float:
        """``wake``, or earlier if a probe or a look at a flow's paths is due before."""
        per_flow = self.policy.per_flow
        for f in flows:
            nxt = f.paths.next_probe()
            if nxt is not None:
                wake = min(wake, nxt)
            if f.unacked and not per_flow:
                wake = min(wake, f.next_check)
        return wake

    def check_paths(self, f: TxFlow, now: float) -> None:
        """Apply the dead-path rule (a scan of the packets in flight, a few times per limit)."""
        limit = self.params.dead_after(f.srtt)
        f.next_check = now + limit
        if len(f.paths) < 2 or not f.unacked or self.policy.per_flow:
            return                      # one path in use: no other to compare (the RTO rule migrates)
        table = f.paths
        unconfirmed, last_sent = table.silent(((e[5], e[4]) for e in f.unacked.values()), f.can_send())
        dead = table.check(now, f.srtt, unconfirmed, last_sent)
        if dead:
            self.fail_over(f, dead, now)
        live = [t for p, t in unconfirmed.items() if table.live(p)]
        if live:                         # look again when the oldest silent packet is overdue
            f.next_check = max(now + 0.0005, min(live) + limit + 1e-4)

    def probe(self, f: TxFlow, path: int, now: float) -> None:
        """One probe down a dead path; the receiver's delivery report says if it got through."""
        self.endpoint.probe(f, path, now)
        f.stats["probes"] += 1

    # ---- evidence ------------------------------------------------------------------------
    def delivered(self, f: TxFlow, path: int, ts: int, bits: int, now: float) -> None:
        """The receiver saw a packet sent on ``path`` at timestamp ``ts`` (its low ``bits``)."""
        if path >= len(f.paths):
            return
        age = ((int(now * 1e6) - ts) & ((1 << bits) - 1)) / 1e6
        # + 1.5 us: the timestamp is the send time rounded down to whole microseconds
        if f.paths.on_delivered(path, now - age + 1.5e-6, now):
            f.next_check = 0.0

    def reports(self, f: TxFlow, reports: tuple[int, ...], now: float) -> None:
        """The delivery reports an ACK, NACK or PATH_LOSS carried (:func:`.wire.report`)."""
        for rep in reports:
            if rep != NO_REPORT:
                self.delivered(f, rep >> 24, rep & 0xFFFFFF, 24, now)

    def on_timeout(self, f: TxFlow, path: int, sent: float, now: float) -> None:
        """The retransmission timer fired for a packet sent on ``path`` at ``sent``: on a
        multi-path flow, the path is dead if another delivered since (:meth:`PathTable.on_timeout`)."""
        if not self.policy.per_flow and f.paths.on_timeout(path, sent, now, f.srtt):
            self.fail_over(f, [path], now)

    def on_plane_notice(self, f: TxFlow, plane: int, up: bool, now: float) -> None:
        """The peer says its port on ``plane`` went down (its paths there are left and what was
        in flight on them re-sent) or came back (they are probed at once)."""
        f.stats["plane_notices"] += 1
        if up:
            f.paths.probe_plane_now(plane, now)
        else:
            self.leave_plane(f, plane, now, "peer_plane_down")

    # ---- leaving paths -------------------------------------------------------------------
    def fail_over(self, f: TxFlow, dead: list[int], now: float) -> None:
        """``dead`` paths were just found dead: what was in flight on them is re-sent at once
        (on live paths, as :meth:`choose_path` picks), not after a timeout."""
        gone = set(dead)
        if f.cur_path in gone:
            f.cur_path = f.paths.migration_target(f.cur_path)
        for psn in range(f.una, f.psn):
            e = f.unacked.get(psn)
            if e is not None and e[5] in gone and f.requeue(psn, "failover"):
                f.stats["failover_retx"] += 1

    def leave_plane(self, f: TxFlow, plane: int, now: float, why: str = "plane_down") -> None:
        """Every path of ``plane`` dead for ``f`` (:meth:`.paths.PathTable.kill_plane`), and what
        was in flight on them re-sent at once."""
        dead = f.paths.kill_plane(plane, now, why)
        if dead:
            self.fail_over(f, dead, now)

    def port_refused(self, plane: int, now: float) -> None:
        """The NIC port of ``plane`` cannot send (its link is down, its address gone): every
        flow leaves the plane."""
        for g in self.tx.values():
            self.leave_plane(g, plane, now)

    def migrate(self, f: TxFlow, now: float) -> None:
        """Path migration of a one-path flow after repeated timeouts: a new entropy value
        (another source port, another plane if there is one)."""
        cur = f.cur_path if f.cur_path is not None else self.choose_path(f)
        f.paths.kill(cur, now, "migrated_from")
        target = f.paths.migration_target(cur)
        if target == cur:
            self.endpoint.rebind(f, cur)             # one path only: a new source port for it
        f.paths.events.append((now, "migrated_to", target))
        f.cur_path = target
        f.stats["migrations"] += 1

    # ---- this rank's ports ---------------------------------------------------------------
    def poll_links(self, now: float) -> None:
        """A plane whose NIC port went down is left at once by every flow; when the port
        comes back, its paths are probed at once (they return when a probe gets through)."""
        self.next_link_poll = now + self.link_poll_s
        assert self._link_state is not None
        for plane, name in enumerate(self.nics):
            if name is None:
                continue
            up = self._link_state(name)
            if up is None or up == self.link_ok[plane]:
                continue
            self.link_ok[plane] = up
            if len(self.link_events) < 256:     # the moment it was seen (``now`` is the loop's, maybe stale)
                self.link_events.append([time.monotonic() + self.wall_offset, plane, "up" if up else "down"])
            for f in self.tx.values():
                if up:
                    f.paths.probe_plane_now(plane, now)
                else:
                    self.leave_plane(f, plane, now)
            if not up:
                # answers sent on the plane between its port going down and this poll are lost: answer
                # again at once on another plane, so the sender is not left waiting for its timeout
                for r in self.rx.values():
                    if r.plane == plane and r.expected:
                        r.ack_due = True
            self.notify_plane(plane, up)

    def notify_plane(self, plane: int, up: bool) -> None:
        """Tell every peer, on another plane whose port is up, that this rank's port on ``plane``
        went down (or came back): a peer sending here leaves that plane at once (or probes it
        at once), where its dead-path rule would need its in-flight packets there to age
        ``max(K x srtt, floor)`` (a loaded all-reduce's srtt made that 70-140 ms) and the
        probes of a repaired plane would wait for their interval."""
        via = [q for q in range(self.planes) if q != plane and self.link_ok[q]]
        if not via:
            return
        for peer, r in self.rx.items():
            q = r.plane if r.plane in via else via[0]
            self.endpoint.control(PLANE, peer, q, plane, int(up), 0)

    def close(self) -> None:
        if self._link_sock is not None:
            self._link_sock.close()
            self._link_sock = None
