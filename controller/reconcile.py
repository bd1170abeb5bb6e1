"""The controller's decisions, pure: plain events in, plain OpenFlow messages out.

No os-ken import (the idea of Faucet's valve/faucet split): ``controller/app.py`` decodes
os-ken events into the events below, calls :meth:`Reconciler.handle` and encodes the
messages it returns into OpenFlow 1.3. Tests drive the same object with no switch at all
and replay its messages through a table interpreter (tests/oftable.py).

What it owns
    link state      a fabric link is down when either end reports its port down (one-sided
                    reports count); a switch that disconnects is failed until it returns.
    what to compile an event recompiles only the plane(s) it touches (compiler.compile_fabric
                    with ``switches=`` the plane's switches); a port that is no link, or a
                    report that changes nothing, recompiles nothing.
    what is installed
                    ``confirmed[switch]`` holds only what the switch has confirmed: changes
                    count once the barrier sent after them is answered. An OpenFlow error,
                    or a barrier not answered within ``confirm_timeout_s``, resynchronises
                    the switch: its flows are read back (flow stats, our cookie only),
                    ``confirmed`` becomes what it reports, and the difference is sent again.
                    The fabric uses no groups (multipath is table 2, see compiler.py), so a
                    switch's groups are only ever wiped when it connects.
    the order       make-before-break, per switch and across switches (see ``plan_step``).

Order of an update. The difference between confirmed and desired flows is a set of items
(one flow entry to add, change or delete). An item that changes where a switch S sends a
destination address a must wait until every switch that S will send a to (S's new next
hops for a) has confirmed its own items for a: downstream first, so a packet that meets an
updated switch only meets updated switches after it. Entropy entries (table 2) come before
the routes that use them; entropy entries that are no longer used go after the switch's
route changes. Items with nothing left to wait for are sent as one step, per switch in the
order: adds/changes of table 2, barrier, adds/changes of the other tables (most specific
route first), barrier, deletions (least specific route first), barrier, deletions of table 2,
barrier. The next step is planned only when every switch has confirmed the last one, from
the confirmed state, so a new event in between simply changes the target.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter

import networkx as nx

from . import compiler

LOG = logging.getLogger("hpnlab.controller.reconcile")

FlowKey = tuple          # (table, priority, match) with match sorted by field name
Actions = tuple          # compiler.Flow actions
FlowTable = dict         # {FlowKey: Actions}: one switch's flows


# ---- events (in) -------------------------------------------------------------------------

@dataclass(frozen=True)
class SwitchUp:
    """A switch connected (or reconnected): it is wiped and gets its whole state. ``ports``
    (port -> up), when known; otherwise its ports keep their last known state until a
    PortStatus with its port descriptions arrives."""
    switch: str
    ports: Mapping[int, bool] | None = None


@dataclass(frozen=True)
class SwitchDown:
    """A switch disconnected: it counts as failed until it connects again."""
    switch: str


@dataclass(frozen=True)
class PortStatus:
    """Ports of one switch seen up (True) or down (False): a PortStatus message, or all of a
    switch's port descriptions at once."""
    switch: str
    ports: Mapping[int, bool]


@dataclass(frozen=True)
class BarrierReply:
    switch: str
    xid: int


@dataclass(frozen=True)
class Error:
    """An OpenFlow error from a switch: its state is no longer known, so it is resynchronised."""
    switch: str
    xid: int
    type: int = 0
    code: int = 0


@dataclass(frozen=True)
class Tick:
    """Time passes: confirmations older than the timeout resynchronise their switch."""


@dataclass(frozen=True)
class FlowEntry:
    table: int
    priority: int
    match: tuple
    actions: Actions


@dataclass(frozen=True)
class FlowStatsReply:
    """One part of a switch's answer to a FlowStatsRequest (``more``: further parts follow)."""
    switch: str
    xid: int
    flows: tuple = ()
    more: bool = False


Event = SwitchUp | SwitchDown | PortStatus | BarrierReply | Error | Tick | FlowStatsReply


# ---- messages (out) ------------------------------------------------------------------------

@dataclass(frozen=True)
class FlowMod:
    """command "add" (new entry), "modify" (same table/priority/match, new actions; sent as
    an OpenFlow ADD, which replaces the entry and, unlike MODIFY, also creates it if the switch
    lost it) or "delete" (strict: exactly this table/priority/match)."""
    switch: str
    command: str
    table: int
    priority: int
    match: tuple
    actions: Actions = ()

    @property
    def key(self) -> FlowKey:
        return (self.table, self.priority, self.match)


@dataclass(frozen=True)
class WipeTables:
    """Delete every flow of every table and every group (sent when a switch connects)."""
    switch: str


@dataclass(frozen=True)
class Barrier:
    switch: str
    xid: int


@dataclass(frozen=True)
class FlowStatsRequest:
    """Ask for every flow that carries the controller's cookie, in every table."""
    switch: str
    xid: int


Message = FlowMod | WipeTables | Barrier | FlowStatsRequest


# ---- flows as tables ---------------------------------------------------------------------

def canonical_match(match: Iterable) -> tuple:
    """A match with its fields in one order (name order), so decoded and compiled entries compare."""
    return tuple(sorted(match))


def flow_table(state: compiler.SwitchState) -> FlowTable:
    """A compiled switch state as {key: actions}, every compact host-route block expanded."""
    return {(t, p, canonical_match(m)): a for (t, p, m), a in state.expanded().items()}


def _route_prefix(match: tuple) -> tuple[int, int] | None:
    for name, value in match:
        if name == "ipv4_dst":
            return value if isinstance(value, tuple) else (value, compiler.FULL)
    return None


class _Routes:
    """Table 1 of one switch, for longest-prefix lookups of host addresses."""

    def __init__(self, table: FlowTable):
        routes = []
        for key, actions in table.items():
            if key[0] != compiler.TABLE_ROUTE:
                continue
            prefix = _route_prefix(key[2])
            if prefix is not None:
                routes.append((key[1], prefix[0], prefix[1], key, actions))
        routes.sort(key=lambda r: -r[0])
        self.routes = routes
        self.entropy_ports: dict[int, set[int]] = {}
        for key, actions in table.items():
            if key[0] == compiler.TABLE_ENTROPY:
                meta = dict(key[2]).get("metadata")
                for act in actions:
                    if act[0] == "output" and meta is not None:
                        self.entropy_ports.setdefault(meta, set()).add(act[1])

    def lookup(self, address: int) -> tuple[FlowKey | None, Actions]:
        for _prio, net, mask, key, actions in self.routes:
            if address & mask == net:
                return key, actions
        return None, ()

    def out_ports(self, actions: Actions) -> set[int]:
        ports: set[int] = set()
        for act in actions:
            if act[0] == "output":
                ports.add(act[1])
            elif act[0] == "metadata":
                ports |= self.entropy_ports.get(act[1], set())
        return ports


@dataclass(frozen=True)
class Item:
    """One flow entry to change on one switch: ``actions`` None deletes it."""
    switch: str
    key: FlowKey
    actions: Actions | None


def diff(confirmed: FlowTable, desired: FlowTable, switch: str) -> list[Item]:
    items = [Item(switch, k, a) for k, a in desired.items() if confirmed.get(k) != a]
    items += [Item(switch, k, None) for k in confirmed if k not in desired]
    return items


def plan_step(ix: compiler.FabricIndex, confirmed: Mapping[str, FlowTable], desired: Mapping[str, FlowTable],
              switches: Iterable[str]) -> tuple[list[Item], int, bool]:
    """The items that may go now: (items, items left for later steps, whether a dependency cycle
    forced everything out at once). ``switches``: the switches to update (connected, settled)."""
    items: list[Item] = []
    for sw in switches:
        items += diff(confirmed.get(sw, {}), desired.get(sw, {}), sw)
    if not items:
        return [], 0, False
    by_switch: dict[str, list[Item]] = {}
    for it in items:
        by_switch.setdefault(it.switch, []).append(it)
    # destinations whose forwarding each route item changes, and the new next hops
    touched: dict[Item, set[int]] = {}
    next_hops: dict[tuple[str, int], set[str]] = {}
    addresses_of_plane: dict[int, list[int]] = {}
    for address, (_mac, _host, host_plane) in ix.host_addr.items():
        addresses_of_plane.setdefault(host_plane, []).append(address)
    for sw, its in by_switch.items():
        route_items = [it for it in its if it.key[0] == compiler.TABLE_ROUTE]
        if not route_items:
            continue
        old, new = _Routes(confirmed.get(sw, {})), _Routes(desired.get(sw, {}))
        plane = ix.sw[sw].plane
        for it in route_items:
            touched[it] = set()
        keyed = {it.key: it for it in route_items}
        peers_of: dict[Actions, set[str]] = {}     # the switches a route's actions send to
        # Only an address that a changed route covers can be forwarded differently: every
        # other route is the same entry in both tables, so both lookups agree for the rest.
        changed = [prefix for prefix in (_route_prefix(it.key[2]) for it in route_items) if prefix is not None]
        for address in addresses_of_plane[plane]:
            if not any(address & mask == net for net, mask in changed):
                continue
            old_key, old_actions = old.lookup(address)
            new_key, new_actions = new.lookup(address)
            if old_actions == new_actions and old_key == new_key:
                continue
            for k in (old_key, new_key):
                if k in keyed:
                    touched[keyed[k]].add(address)
            if new_actions not in peers_of:
                peers = set()
                for port in new.out_ports(new_actions):
                    lid = ix.link_at(sw, port)
                    if lid is not None:
                        peers.add(lid[1] if lid[0] == sw else lid[0])
                peers_of[new_actions] = peers
            next_hops[sw, address] = peers_of[new_actions]
    touching: dict[tuple[str, int], list[Item]] = {}     # (switch, address) -> its items for it
    for it, addresses in touched.items():
        for address in addresses:
            touching.setdefault((it.switch, address), []).append(it)
    deps: dict[Item, set[Item]] = {it: set() for it in items}
    for it, addresses in touched.items():
        for address in addresses:
            for peer in next_hops.get((it.switch, address), ()):
                deps[it].update(touching.get((peer, address), ()))
    for its in by_switch.values():
        routes = [it for it in its if it.key[0] != compiler.TABLE_ENTROPY]
        for it in its:
            if it.key[0] == compiler.TABLE_ENTROPY and it.actions is None:
                deps[it].update(routes)
    try:
        TopologicalSorter(deps).prepare()
    except CycleError:
        LOG.warning("update order has a dependency cycle: sending %d changes in one step", len(items))
        return items, 0, True
    ready = [it for it in items if not deps[it]]
    return ready, len(items) - len(ready), False


def batch(items: list[Item]) -> list[list[FlowMod]]:
    """One switch's items as ordered groups, each to be followed by a barrier."""
    def mod(it: Item, command: str) -> FlowMod:
        t, p, m = it.key
        return FlowMod(it.switch, command, t, p, m, it.actions or ())

    adds = [it for it in items if it.actions is not None]
    dels = [it for it in items if it.actions is None]
    groups = [
        [it for it in adds if it.key[0] == compiler.TABLE_ENTROPY],
        sorted((it for it in adds if it.key[0] != compiler.TABLE_ENTROPY), key=lambda it: (-it.key[0], -it.key[1])),
        sorted((it for it in dels if it.key[0] != compiler.TABLE_ENTROPY), key=lambda it: (it.key[0], it.key[1])),
        [it for it in dels if it.key[0] == compiler.TABLE_ENTROPY],
    ]
    out = []
    for group in groups:
        if group:
            out.append([mod(it, "delete" if it.actions is None else "add") for it in group])
    return out


# ---- the reconciler ------------------------------------------------------------------------

@dataclass
class _Pending:
    """Messages sent to a switch and not yet confirmed: a barrier and the changes before it."""
    xid: int
    sent_at: float
    changes: list = field(default_factory=list)     # (key, actions | None)
    wipe: bool = False


@dataclass
class _Resync:
    xid: int
    sent_at: float
    flows: dict = field(default_factory=dict)


class Reconciler:
    """Link state, desired state and confirmed state of every switch of one fabric."""

    def __init__(self, g: nx.MultiGraph, policy: str = "aggregate", confirm_timeout_s: float = 5.0):
        self.graph = g
        self.policy = policy
        self.confirm_timeout_s = confirm_timeout_s
        self.ix = compiler.index_of(g)
        self.down_ports: set[tuple[str, int]] = set()
        self.failed_switches: set[str] = set()      # connected once, then disconnected
        self.failures = compiler.Failures()
        self.healthy = compiler.compile_fabric(g, None, policy)
        self.states: dict[str, compiler.SwitchState] = dict(self.healthy)
        self.desired: dict[str, FlowTable] = {sw: flow_table(st) for sw, st in self.states.items()}
        self.connected: set[str] = set()
        self.confirmed: dict[str, FlowTable] = {}
        self.pending: dict[str, list[_Pending]] = {}
        self.resyncing: dict[str, _Resync] = {}
        self._xid = 0
        self.counters = {"recompiles": 0, "resyncs": 0, "errors": 0, "steps": 0, "cycles": 0,
                         "add": 0, "modify": 0, "delete": 0}
        self.last_recompiled_planes: tuple[int, ...] = ()

    # ---- queries ------------------------------------------------------------------------
    @property
    def settled(self) -> bool:
        """Nothing sent is waiting for a confirmation and every switch holds its desired state."""
        return not self._outstanding() and all(
            self.confirmed.get(sw) == self.desired.get(sw, {}) for sw in self.connected)

    def deaggregated(self) -> int:
        return compiler.deaggregated(self.states, self.healthy)

    # ---- events ------------------------------------------------------------------------
    def handle(self, event: Event, now: float = 0.0) -> list[Message]:
        out: list[Message] = []
        if isinstance(event, SwitchUp):
            out += self._switch_up(event.switch, event.ports, now)
        elif isinstance(event, SwitchDown):
            self._switch_down(event.switch)
        elif isinstance(event, PortStatus):
            self._port_status(event.switch, event.ports)
        elif isinstance(event, BarrierReply):
            self._barrier_reply(event.switch, event.xid)
        elif isinstance(event, Error):
            if event.switch in self.connected:
                self.counters["errors"] += 1
                LOG.error("%s: OpenFlow error type=%d code=%d (xid %d): resynchronising it",
                          event.switch, event.type, event.code, event.xid)
                out += self._resync(event.switch, now)
        elif isinstance(event, Tick):
            out += self._timeouts(now)
        elif isinstance(event, FlowStatsReply):
            self._stats_reply(event)
        else:
            raise TypeError(f"not a reconciler event: {event!r}")
        out += self._step(now)
        return out

    def _switch_up(self, sw: str, ports: Mapping[int, bool] | None, now: float) -> list[Message]:
        if sw not in self.ix.sw:
            return []
        self.connected.add(sw)
        self._forget(sw)
        self.failed_switches.discard(sw)
        if ports is not None:
            self._port_status(sw, ports)      # recompiles
        else:
            self._recompile()
        xid = self._next_xid()
        self.pending[sw] = [_Pending(xid, now, wipe=True)]
        return [WipeTables(sw), Barrier(sw, xid)]

    def _switch_down(self, sw: str) -> None:
        if sw not in self.connected:
            return
        self.connected.discard(sw)
        self._forget(sw)
        self.failed_switches.add(sw)
        self._recompile()

    def _forget(self, sw: str) -> None:
        """Drop what is known of a switch's tables and what it was sent (it connected anew,
        disconnected, or is about to be read back)."""
        self.pending.pop(sw, None)
        self.resyncing.pop(sw, None)
        self.confirmed.pop(sw, None)

    def _port_status(self, sw: str, ports: Mapping[int, bool]) -> None:
        for port, up in ports.items():
            if self.ix.link_at(sw, port) is None:
                continue
            if up:
                self.down_ports.discard((sw, port))
            else:
                self.down_ports.add((sw, port))
        self._recompile()

    def _barrier_reply(self, sw: str, xid: int) -> None:
        queue = self.pending.get(sw, [])
        if not any(p.xid == xid for p in queue):
            return
        table = self.confirmed.setdefault(sw, {})
        while queue:     # a switch answers barriers in order: everything before this one is done
            p = queue.pop(0)
            if p.wipe:
                table.clear()
            for key, actions in p.changes:
                if actions is None:
                    table.pop(key, None)
                else:
                    table[key] = actions
            if p.xid == xid:
                break

    def _resync(self, sw: str, now: float) -> list[Message]:
        self.counters["resyncs"] += 1
        self._forget(sw)
        xid = self._next_xid()
        self.resyncing[sw] = _Resync(xid, now)
        return [FlowStatsRequest(sw, xid)]

    def _timeouts(self, now: float) -> list[Message]:
        out: list[Message] = []
        for sw in sorted(self.connected):
            queue = self.pending.get(sw)
            resync = self.resyncing.get(sw)
            sent = queue[0].sent_at if queue else resync.sent_at if resync else None
            if sent is not None and now - sent > self.confirm_timeout_s:
                LOG.warning("%s: no confirmation within %.1f s: resynchronising it", sw, self.confirm_timeout_s)
                out += self._resync(sw, now)
        return out

    def _stats_reply(self, ev: FlowStatsReply) -> None:
        resync = self.resyncing.get(ev.switch)
        if resync is None or resync.xid != ev.xid:
            return
        for f in ev.flows:
            resync.flows[(f.table, f.priority, canonical_match(f.match))] = tuple(f.actions)
        if not ev.more:
            del self.resyncing[ev.switch]
            self.confirmed[ev.switch] = resync.flows

    # ---- decisions ------------------------------------------------------------------------
    def _link_failures(self) -> compiler.Failures:
        links = {self.ix.link_at(sw, port) for sw, port in self.down_ports}
        links.discard(None)
        return compiler.Failures(frozenset(links), frozenset(self.failed_switches))

    def _recompile(self) -> None:
        failures = self._link_failures()
        if failures == self.failures:
            return
        changed_links = failures.links ^ self.failures.links
        changed_switches = failures.switches ^ self.failures.switches
        planes = {self.ix.sw[sw].plane for sw in changed_switches}
        for lid in changed_links:
            planes |= {self.ix.sw[n].plane for n in lid[:2] if n in self.ix.sw}
        self.failures = failures
        wanted = [sw.name for p in sorted(planes) for sw in self.ix.planes[p]]
        states = compiler.compile_fabric(self.graph, failures, self.policy, switches=wanted)
        for sw in wanted:
            if sw in states:
                self.states[sw] = states[sw]
                self.desired[sw] = flow_table(states[sw])
            else:
                self.states.pop(sw, None)
                self.desired.pop(sw, None)
        self.counters["recompiles"] += 1
        self.last_recompiled_planes = tuple(sorted(planes))
        LOG.info("recompiled plane(s) %s: %d failed links, %d failed switches",
                 ", ".join(map(str, sorted(planes))), len(failures.links), len(failures.switches))

    def _outstanding(self) -> bool:
        return any(self.pending.get(sw) for sw in self.connected) or bool(self.resyncing)

    def _step(self, now: float) -> list[Message]:
        if self._outstanding():
            return []
        switches = sorted(sw for sw in self.connected if sw in self.confirmed)
        items, _left, cycle = plan_step(self.ix, self.confirmed, self.desired, switches)
        if not items:
            return []
        self.counters["steps"] += 1
        self.counters["cycles"] += cycle
        out: list[Message] = []
        by_switch: dict[str, list[Item]] = {}
        for it in items:
            by_switch.setdefault(it.switch, []).append(it)
        for sw in switches:
            for group in batch(by_switch.get(sw, [])):
                changes = []
                for mod in group:
                    command = mod.command
                    if command == "add" and mod.key in self.confirmed[sw]:
                        command = "modify"
                        mod = FlowMod(sw, command, mod.table, mod.priority, mod.match, mod.actions)
                    self.counters[command] += 1
                    out.append(mod)
                    changes.append((mod.key, None if command == "delete" else mod.actions))
                xid = self._next_xid()
                out.append(Barrier(sw, xid))
                self.pending.setdefault(sw, []).append(_Pending(xid, now, changes))
        return out

    def _next_xid(self) -> int:
        self._xid = (self._xid + 1) & 0xFFFFFFFF or 1
        return self._xid
