"""The controller's decisions, pure: plain events in, plain OpenFlow messages out.

No os-ken import (the idea of Faucet's valve/faucet split): ``controller/app.py`` decodes
os-ken events into the events below, calls :meth:`Reconciler.handle` and encodes the
messages it returns into OpenFlow 1.3. Tests drive the same object with no switch at all
and replay its messages through a table interpreter (hpnlab.fabric.routing.oftable).

What it owns
    link state      a fabric link is down when either end reports its port down (one-sided
                    reports count); a switch that disconnects is failed until it returns.
    what to compile an event recompiles only the plane(s) it touches (compiler.compile_fabric
                    with ``switches=`` the plane's switches); a port that is no link, or a
                    report that changes nothing, recompiles nothing. A recompiled switch
                    whose state equals its previous one (the compiler shares Flow values, so
                    the comparison is mostly by identity) keeps its desired table untouched
                    and is not diffed at all: only the switches a change reaches cost anything.
                    A changed switch's desired table (and its TableIndex, for the plan) is
                    patched from the previous one with the Flow values that are new objects,
                    and if the switch held its previous desired table, only those keys are
                    diffed; when most of a switch changed, its table is built anew.
    what is installed
                    ``confirmed[switch]`` holds only what the switch has confirmed: changes
                    count once the barrier sent after them is answered. A switch that
                    connects is read back first: its flows (flow stats, every table, every
                    cookie) and its groups (group descriptions); ``confirmed`` becomes what it
                    holds and only the difference is sent (a controller that restarts, or a
                    switch that reconnects with its tables kept by fail mode secure, changes
                    nothing that is already right: no flow or group is deleted and re-added).
                    An OpenFlow error, or a barrier not answered within ``confirm_timeout_s``,
                    resynchronises the switch the same way. That time is the switch's silence:
                    from the later of when the messages left (``sent``, which the app calls once
                    it has encoded and sent them, not from when they were decided) and the
                    switch's last answer; doubled per switch after each of its timeouts; and
                    10 times longer while the controller is busy (``Tick.backlog``,
                    ``Tick.busy``), when the answer may be waiting on the controller's side. A
                    controller slowed by its own work (a first plan over hundreds of switches,
                    read-back replies queued behind others) otherwise read back switches that
                    had answered, which made it slower still (issue 53: 17,280 needless
                    read-backs at alibaba-hpn). See :meth:`Reconciler._timeouts`.
    which flows and groups are ours
                    every flow and every group on a fabric switch. OpenFlow 1.3 groups carry no
                    cookie, so they cannot be told apart by owner; a fabric switch is this
                    controller's alone, so whatever it reports that is not desired (a stale
                    entry of an earlier state, an entry someone added by hand) is deleted.
    the order       make-before-break, per switch and across switches (see ``plan``).

A switch's tables are one dict (:data:`SwitchTable`): a flow entry under its
(table, priority, match) key with its actions as value, a group under ``GroupKey(id)`` with
its :class:`compiler.Group` as value. So confirmation, resync and the diff treat both alike.

Order of an update. The difference between confirmed and desired tables is a set of items
(one flow entry or one group to add, change or delete). An item that changes where a switch
S sends a destination address a (a route of table 1, or a group on the way of a route: a
changed fast-failover group moves traffic just like a changed route) must wait until every
switch that S will send a to (S's new next hops for a) has confirmed its own items for a:
downstream first, so a packet that meets an updated switch only meets updated switches after
it. Where a switch sends a is the ports its route for a resolves to: outputs, the entries of
the table it goes to with the metadata it writes (entropy sets; per pattern of the other
fields only the highest-priority entry the metadata matches, so that an avoid-one-port entry
hides its set's entry, see _Forwarding._met), and for a group its buckets;
of a fast-failover group only the first bucket whose watch port is live counts (the live
fabric as the reconciler knows it), since that is where the switch sends now: a backup
bucket is taken only on a failure the controller has not heard of yet, and then the data
plane, not the update order, protects the traffic. Besides:
- a switch that starts dropping an address it forwarded (it no longer reaches it) waits for
  the switches that stop sending that address to it: until they have, a detour (a group's
  backup bucket further down) may still deliver through it;
- a switch installed from empty (back from a failure, read back with no route) goes first, whole,
  in the step after its read-back (its groups, its entropy entries, then the rest, in the batch order below: its own
  references need no earlier confirmation), and every other switch's changes wait for it: a
  fast-failover group upstream sends to it as soon as its port is live, whatever the update
  order;
- a flow or group that refers to a group is sent only once that group is confirmed with its
  new buckets (OpenFlow refuses a reference to a missing group);
- a group is deleted only once no confirmed flow or group refers to it (Open vSwitch deletes
  the flows that refer to a deleted group);
- entropy entries (table 2) come before the routes that use them (in the same step, the batch
  order sends them first; if they must wait, e.g. for a group they send to, the routes wait
  too); entropy entries that are no longer used go after the switch's route changes are
  confirmed.
Items with nothing left to wait for are sent as one step, per switch in the order: groups
added or changed, barrier, adds/changes of table 2, barrier, adds/changes of the other tables
(most specific route first), barrier, deletions (least specific route first), barrier,
deletions of table 2, barrier, deletions of groups, barrier. The next step is planned only
when every switch has confirmed the last one, from the confirmed state, so a new event in
between simply changes the target.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import gc
import logging
import time
import weakref
from collections import ChainMap, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from typing import NamedTuple

import networkx as nx

from hpnlab.fabric.routing import compiler

LOG = logging.getLogger("hpnlab.controller.reconcile")
#: a switch's confirmation timeout doubles after each of its timeouts, up to this multiple
MAX_BACKOFF = 32
#: while the controller is busy (events waiting, a CPU used up) timeouts run this many times longer
BUSY_PATIENCE = 10
#: a barrier or read-back unanswered this long (seconds, before backing off): the switch is read back
CONFIRM_TIMEOUT_S = 5.0
#: switches read back at once; the others wait their turn, their timeouts not yet running. Hundreds of
#: large tables asked for at once are answered and decoded one after another, and the last ones' time
#: ran out before they were reached: each timeout asked for a whole table again (hpn-130k's restart)
READS_AT_ONCE = 16

FlowKey = tuple          # (table, priority, match) with match sorted by field name
Actions = tuple          # compiler.Flow actions


class GroupKey(NamedTuple):
    """A group's key in a :data:`SwitchTable` (a flow's key is (table, priority, match))."""
    group_id: int


SwitchTable = dict       # {FlowKey: Actions, GroupKey: compiler.Group}: one switch's flows and groups
Value = Actions | compiler.Group
CompileFn = Callable[..., dict]   # (graph, failures, policy, switches=...) -> {switch: SwitchState}


def is_group(key: tuple) -> bool:
    return isinstance(key, GroupKey)


# ---- events (in) -------------------------------------------------------------------------

@dataclass(frozen=True)
class SwitchUp:
    """A switch connected (or reconnected): what it holds is read back (flow stats and group
    descriptions) and it gets the difference to its desired state. ``ports``
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
    switch's port descriptions at once. ``more``: another PortStatus is already waiting behind this
    one (a spine's failure reaches the controller as one PortStatus from each of its neighbours), so
    the recompile may wait for it: it runs at the next event without ``more``, and nothing is sent
    on the fabric's old state meanwhile."""
    switch: str
    ports: Mapping[int, bool]
    more: bool = False


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
    """Time passes: a switch that owes an answer and has said nothing for its timeout is resynchronised.
    ``backlog``: events the controller has not handled yet; ``busy``: the controller used (nearly) all
    of a CPU since the last tick. Either way an answer may be waiting on the controller's side, so
    the timeouts run :data:`BUSY_PATIENCE` times longer."""
    backlog: int = 0
    busy: bool = False


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


@dataclass(frozen=True)
class GroupDescReply:
    """One part of a switch's answer to a GroupDescRequest: its groups as compiler.Group values."""
    switch: str
    xid: int
    groups: tuple = ()
    more: bool = False


@dataclass(frozen=True)
class Restate:
    """New desired states for some switches, decided beside the failure compile (weighted mode's
    load-following weights, fabric/routing/weights.py): handled like a recompile of those switches,
    so only what differs is sent, in the usual order."""
    states: Mapping[str, compiler.SwitchState]


@dataclass(frozen=True)
class ArpMode:
    """From now on ``leaf`` answers ARP in ``mode`` (compiler.ARP_MODES), whatever the fabric's mode: the
    per-leaf fallback (controller/arp_fallback.py decides). Only that leaf's responders change."""
    leaf: str
    mode: str


Event = (SwitchUp | SwitchDown | PortStatus | BarrierReply | Error | Tick | FlowStatsReply | GroupDescReply | Restate
         | ArpMode)


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
class GroupMod:
    """command "add" (a group the switch does not have), "modify" (new kind/buckets for a group it
    has) or "delete". ``kind`` and ``buckets`` as in :class:`compiler.Group`."""
    switch: str
    command: str
    group_id: int
    kind: str = "ff"
    buckets: tuple = ()

    @property
    def key(self) -> GroupKey:
        return GroupKey(self.group_id)

    @property
    def group(self) -> compiler.Group:
        return compiler.Group(self.group_id, self.kind, self.buckets)


@dataclass(frozen=True)
class WipeTables:
    """Delete every flow of every table and every group. The reconciler no longer sends it (a
    connecting switch is read back instead, see :class:`SwitchUp`); the app and the table
    interpreter still understand it, for tools that want an empty switch."""
    switch: str


@dataclass(frozen=True)
class Barrier:
    switch: str
    xid: int


@dataclass(frozen=True)
class FlowStatsRequest:
    """Ask for every flow of every table (whatever its cookie: every flow of a fabric switch is ours)."""
    switch: str
    xid: int


@dataclass(frozen=True)
class GroupDescRequest:
    """Ask for the description (kind, buckets) of every group of the switch."""
    switch: str
    xid: int


Message = FlowMod | GroupMod | WipeTables | Barrier | FlowStatsRequest | GroupDescRequest


# ---- tables --------------------------------------------------------------------------------

def canonical_match(match: Iterable) -> tuple:
    """A match with its fields in one order (name order), so decoded and compiled entries compare."""
    return tuple(sorted(match))


def canonical_group(group: compiler.Group) -> compiler.Group:
    """A group with its buckets as tuples, so decoded and compiled groups compare."""
    return compiler.Group(group.group_id, group.kind,
                          tuple((watch, tuple(actions)) for watch, actions in group.buckets))


def switch_table(state: compiler.SwitchState) -> SwitchTable:
    """A compiled switch state as {key: value}: every flow (compact host-route blocks expanded)
    and every group."""
    table: SwitchTable = {}
    for f in state.flows:
        if f.hosts is None:
            table[f.table, f.priority, tuple(sorted(f.match))] = f.actions
        else:
            for e in f.expand():
                table[e.table, e.priority, tuple(sorted(e.match))] = e.actions
    for group in state.groups:
        table[GroupKey(group.group_id)] = canonical_group(group)
    return table


def _add_flow(table: SwitchTable, f: compiler.Flow, changed: set) -> None:
    if f.hosts is None:
        key = (f.table, f.priority, tuple(sorted(f.match)))
        table[key] = f.actions
        changed.add(key)
        return
    for e in f.expand():
        key = (e.table, e.priority, tuple(sorted(e.match)))
        table[key] = e.actions
        changed.add(key)


def _drop_flow(table: SwitchTable, f: compiler.Flow, changed: set) -> None:
    for e in f.expand():
        key = (e.table, e.priority, tuple(sorted(e.match)))
        table.pop(key, None)
        changed.add(key)


def unshared(la: tuple, lb: tuple) -> tuple[tuple, tuple]:
    """Both flow lists without their common head and tail. A compile lays a switch's flows out
    in one order, what never changes (table 0, the entropy tables, its own hosts) first as
    the same objects, so those compare in C at the speed of an identity test. A key is in a
    switch once: an equal entry at the same place on both sides cancels out."""
    n = min(len(la), len(lb))
    i, step = 0, 256
    while i < n:
        j = min(i + step, n)
        if la[i:j] != lb[i:j]:
            while la[i] == lb[i]:
                i += 1
            break
        i = j
    k = 0
    while k < n - i:
        j = min(k + step, n - i)
        if la[len(la) - j:len(la) - k] != lb[len(lb) - j:len(lb) - k]:
            while la[len(la) - 1 - k] == lb[len(lb) - 1 - k]:
                k += 1
            break
        k = j
    return la[i:len(la) - k], lb[i:len(lb) - k]


def patched_table(old: compiler.SwitchState, new: compiler.SwitchState, table: SwitchTable,
                  rebuild_above: float = 0.5, in_place: bool = False) -> tuple[SwitchTable, set | None]:
    """``new`` as a SwitchTable, made from ``table`` (``old`` as a SwitchTable) by touching only the
    flows that are not the same object in both states (the compiler shares unchanged Flow values
    between compiles), and the keys it touched: a superset of the keys whose value changed. When
    the flows to touch (old and new) outnumber ``rebuild_above`` times the new state's flows, the
    table is built anew instead (cheaper) and the keys are None. ``in_place``: ``table`` itself is
    changed and returned (no copy of a table of thousands of entries; the caller keeps no other
    use of it)."""
    rest_old, rest_new = unshared(old.flows, new.flows)
    old_ids = {id(f) for f in rest_old}
    new_ids = {id(f) for f in rest_new}
    gone = [f for f in rest_old if id(f) not in new_ids]
    came = [f for f in rest_new if id(f) not in old_ids]
    if len(gone) + len(came) > rebuild_above * len(new.flows):
        return switch_table(new), None
    out = table if in_place else table.copy()
    changed: set = set()
    for f in gone:
        _drop_flow(out, f, changed)
    for f in came:
        _add_flow(out, f, changed)
    if old.groups != new.groups:
        for group in old.groups:
            out.pop(GroupKey(group.group_id), None)
            changed.add(GroupKey(group.group_id))
        for group in new.groups:
            out[GroupKey(group.group_id)] = canonical_group(group)
            changed.add(GroupKey(group.group_id))
    return out, changed


def same_state(old: compiler.SwitchState | None, new: compiler.SwitchState) -> bool:
    """Do two compiled states hold the same flows and groups? Identity first (the compiler shares
    Flow values between switches and compiles), then the tuples (C-level, element identity first)."""
    if old is None:
        return False
    if old is new:
        return True
    return (old.flows is new.flows or old.flows == new.flows) and old.groups == new.groups


def groups_referenced(value: Value | None) -> set[int]:
    """The group ids a flow's actions or a group's buckets send to."""
    if value is None:
        return set()
    if isinstance(value, compiler.Group):
        return {a[1] for _watch, actions in value.buckets for a in actions if a[0] == "group"}
    return {a[1] for a in value if a[0] == "group"}


def _route_prefix(match: tuple) -> tuple[int, int] | None:
    for name, value in match:
        if name == "ipv4_dst":
            return value if isinstance(value, tuple) else (value, compiler.FULL)
    return None


def _metadata_match(match: tuple) -> tuple[int, int]:
    """(value, mask) of a match's metadata field; (0, 0) when it has none (matches any metadata)."""
    for kv in match:
        if kv[0] == "metadata":
            value = kv[1]
            return value if value.__class__ is tuple else (value, 0xFFFFFFFFFFFFFFFF)
    return 0, 0


_MAX_DEPTH = 8


class TableIndex:
    """One switch's table indexed for forwarding questions, without liveness: its routes (table 1)
    by priority and mask, its groups, and (built on first use) each other table's entries by the
    metadata they match. Made once per table, or patched from the previous table's index with
    the keys that changed, so that a plan costs what its items touch, not what the switch holds."""

    def __init__(self, table: SwitchTable, build: bool = True):
        self.table = table
        self.by_prio: dict[tuple[int, int], dict[int, tuple]] = {}
        self.groups: dict[int, compiler.Group] = {}
        self.by_meta: dict[int, dict[int, dict[int, dict[FlowKey, Actions]]]] = {}  # table -> mask -> value -> entries
        self._met: dict[tuple[int, int], frozenset[Actions]] = {}     # (table, metadata) -> met(): kept when patched
        self._starts: dict[tuple[int, int], list[int]] = {}           # (priority, mask) -> its nets sorted: starts()
        #: (table, metadata, depth) of a goto -> what walking it found (_Forwarding.goto), kept when patched
        #: unless an entry it read or a group on its way changed
        self.gotos: dict[tuple[int, int, int], _Goto] = {}
        if build:
            for key, value in table.items():
                if key.__class__ is GroupKey:
                    self.groups[key.group_id] = value
                elif key[0] == compiler.TABLE_ROUTE:
                    self._set_route(self.by_prio, key, value)
        self.routes = self._sorted()

    @staticmethod
    def _set_route(by_prio: dict, key: tuple, value: Actions | None) -> None:
        prefix = _route_prefix(key[2])
        if prefix is None:
            return
        nets = by_prio.setdefault((key[1], prefix[1]), {})
        if value is None:
            nets.pop(prefix[0] & prefix[1], None)
        else:
            nets[prefix[0] & prefix[1]] = (key, value)

    def _sorted(self) -> list[tuple[int, int, dict]]:
        return sorted(((p, m, d) for (p, m), d in self.by_prio.items() if d), key=lambda r: -r[0])

    def starts(self, prio: int, mask: int) -> list[int]:
        """The first addresses of the routes of one priority and mask, sorted (kept by a patched
        index for the priorities and masks whose routes did not change)."""
        found = self._starts.get((prio, mask))
        if found is None:
            found = self._starts[prio, mask] = sorted(self.by_prio.get((prio, mask), ()))
        return found

    def meta_index(self, table_id: int) -> dict[int, dict[int, dict[FlowKey, Actions]]]:
        """One table's entries (key -> actions) by the metadata they match (mask -> value)."""
        index = self.by_meta.get(table_id)
        if index is None:
            index = self.by_meta[table_id] = {}
            for key, value in self.table.items():
                if key.__class__ is not GroupKey and key[0] == table_id:
                    self._count(index, key, value)
        return index

    def met(self, table_id: int, meta: int) -> frozenset[Actions]:
        """The actions of the entries of a table that a packet with this metadata can meet: of
        those the metadata matches, per pattern of the other fields only the highest-priority
        one (an avoid-one-port entry hides its set's entry), when entries of several metadata
        masks match (with one mask, entries of one pattern and two priorities are not made).
        Kept per (table, metadata), and by a patched index for the tables whose entries did not change."""
        found = self._met.get((table_id, meta))
        if found is not None:
            return found
        matched = [entries for mask, values in self.meta_index(table_id).items()
                   if (entries := values.get(meta & mask))]
        if len(matched) == 1:
            found = frozenset(matched[0].values())
        else:
            best: dict[tuple, tuple[int, Actions]] = {}
            for entries in matched:
                for key, entry in entries.items():
                    pattern = tuple([kv for kv in key[2] if kv[0] != "metadata"])
                    have = best.get(pattern)
                    if have is None or have[0] < key[1]:
                        best[pattern] = (key[1], entry)
            found = frozenset(entry for _prio, entry in best.values())
        self._met[table_id, meta] = found
        return found

    @staticmethod
    def _count(index: dict, key: tuple, value: Actions | None) -> None:
        """Set (``value``) or remove (None) one entry of a table's metadata index."""
        meta, mask = _metadata_match(key[2])
        if value is not None:
            index.setdefault(mask, {}).setdefault(meta & mask, {})[key] = value
            return
        values = index.get(mask, {})
        entries = values.get(meta & mask)
        if entries is None:
            return
        entries.pop(key, None)
        if not entries:
            del values[meta & mask]
            if not values:
                del index[mask]

    def patched(self, table: SwitchTable, keys: Iterable[tuple]) -> TableIndex:
        """The index of ``table``, which differs from this index's table at most at ``keys``."""
        out = TableIndex(table, build=False)
        out.by_prio = dict(self.by_prio)
        out.groups = self.groups
        copied: set = set()
        metas: dict[int, dict] = {}
        touched: list[tuple[int, int, int]] = []     # (table, metadata, mask) of each changed entry of another table
        changed_groups: set[int] = set()
        for key in keys:
            old, new = self.table.get(key), table.get(key)
            if old == new:
                continue
            if key.__class__ is GroupKey:
                changed_groups.add(key.group_id)
                if out.groups is self.groups:
                    out.groups = dict(self.groups)
                if new is None:
                    out.groups.pop(key.group_id, None)
                else:
                    out.groups[key.group_id] = new
            elif key[0] == compiler.TABLE_ROUTE:
                prefix = _route_prefix(key[2])
                if prefix is not None and (key[1], prefix[1]) not in copied:
                    copied.add((key[1], prefix[1]))
                    out.by_prio[key[1], prefix[1]] = dict(self.by_prio.get((key[1], prefix[1]), {}))
                self._set_route(out.by_prio, key, new)
            else:
                meta, mask = _metadata_match(key[2])
                touched.append((key[0], meta & mask, mask))
                if key[0] in self.by_meta:
                    index = metas.get(key[0])
                    if index is None:    # copied down to the entries (the index of the table before stays as it was)
                        index = metas[key[0]] = {m: {v: dict(c) for v, c in vs.items()}
                                                 for m, vs in self.by_meta[key[0]].items()}
                    self._count(index, key, new)
        out.by_meta = {t: idx for t, idx in self.by_meta.items() if t not in metas} | metas

        def unchanged(table_id: int, meta: int) -> bool:
            """No changed entry of that table matches that metadata: what met() finds there is as before."""
            return not any(t == table_id and meta & mask == value for t, value, mask in touched)
        # what met() found stays known where no changed entry matches its metadata (a link failure adds
        # the entries of a new metadata value: the others' stay), and so do the walks of gotos that read
        # only such entries and passed no changed group
        out._met = {tm: acts for tm, acts in self._met.items() if tm[0] in self.by_meta and unchanged(*tm)}
        out.gotos = {k: hit for k, hit in self.gotos.items()
                     if not hit.groups & changed_groups and all(unchanged(*tm) for tm in hit.reads)}
        out._starts = {level: nets for level, nets in self._starts.items() if level not in copied}
        out.routes = out._sorted()
        return out


class _Goto(NamedTuple):
    """What walking the entries a goto meets found: under which dead ports of the switch, the
    (table, metadata) pairs whose entries it read, the ports and the groups on its way."""
    dead: frozenset[int] | None
    reads: frozenset[tuple[int, int]]
    ports: frozenset[int]
    groups: frozenset[int]


class _Forwarding:
    """Where one switch sends each destination address, under one liveness: longest-prefix lookups
    in table 1, then the ports an action list resolves to (outputs, the entries of the table it goes
    to under the metadata it writes, group buckets; of a fast-failover group the first live bucket
    only).

    ``dead``: the switch's dead ports (what ``live`` says no to), when known: the walks of gotos
    (a leaf's route fans out over its entropy entries, one per uplink at hpn-130k) are then kept in
    the table's index and reused by the next plan while the entries they read, the groups on their
    way and the dead ports are the same (most switches a link failure changes see none of that
    change)."""

    def __init__(self, index: TableIndex, live: Callable[[int], bool], dead: frozenset[int] | None = None):
        self.index = index
        self.live = live
        self.dead = dead
        self._resolved: dict[Actions, tuple[frozenset[int], frozenset[int]]] = {}
        self._gotos: dict[tuple[int, int, int], _Goto] = {}     # without ``dead``: this instance's only

    def run(self, address: int) -> tuple[FlowKey | None, Actions, int]:
        """The route ``address`` meets (longest prefix first: (key, actions), or (None, ()) for none),
        and the last address from ``address`` on that meets the same one: the end of the route's
        prefix, or earlier where a route that comes first starts (none does: it would have been met)."""
        routes = self.index.routes
        end = compiler.FULL
        hit, level = None, 0
        for _prio, mask, nets in routes:
            hit = nets.get(address & mask)
            if hit is not None:
                end = (address & mask) | (~mask & compiler.FULL)
                break
            level += 1
        for prio, mask, _nets in routes[:level]:
            starts = self.index.starts(prio, mask)
            k = bisect.bisect_right(starts, address)
            if k < len(starts) and starts[k] <= end:
                end = starts[k] - 1
        return (hit[0], hit[1], end) if hit is not None else (None, (), end)

    def resolve(self, actions: Actions) -> tuple[frozenset[int], frozenset[int]]:
        """(ports, group ids on the way) of an action list."""
        out = self._resolved.get(actions)
        if out is None:
            ports: set[int] = set()
            groups: set[int] = set()
            self._walk(actions, 0, ports, groups, 0)
            out = self._resolved[actions] = (frozenset(ports), frozenset(groups))
        return out

    def goto(self, table_id: int, meta: int, depth: int) -> _Goto:
        """Walk the entries of ``table_id`` a packet with ``meta`` meets (known ones reused)."""
        key = (table_id, meta, depth)
        known = self.index.gotos if self.dead is not None else self._gotos
        hit = known.get(key)
        if hit is not None and hit.dead == self.dead:
            return hit
        ports: set[int] = set()
        groups: set[int] = set()
        reads: set[tuple[int, int]] = {(table_id, meta)}
        for entry in self.index.met(table_id, meta):
            self._walk(entry, meta, ports, groups, depth, reads)
        hit = known[key] = _Goto(self.dead, frozenset(reads), frozenset(ports), frozenset(groups))
        return hit

    def _walk(self, actions: Actions, meta: int, ports: set, groups: set, depth: int,
              reads: set | None = None) -> None:
        if depth > _MAX_DEPTH:
            return
        for act in actions:
            kind = act[0]
            if kind == "output":
                ports.add(act[1])
            elif kind == "metadata":
                meta = act[1]
            elif kind == "group":
                groups.add(act[1])
                group = self.index.groups.get(act[1])
                if group is None:
                    continue
                ff = group.kind == "ff"
                for watch, bucket_actions in group.buckets:
                    if ff and isinstance(watch, int) and not self.live(watch):
                        continue          # a watched group (always live here: an indirect one) is not skipped
                    if depth < _MAX_DEPTH and len(bucket_actions) == 1 and bucket_actions[0][0] == "output":
                        ports.add(bucket_actions[0][1])      # the usual bucket: one output
                    else:
                        self._walk(bucket_actions, meta, ports, groups, depth + 1, reads)
                    if ff:
                        break          # of a fast-failover group only the first live bucket
            elif kind == "goto":
                if depth + 1 > _MAX_DEPTH:
                    continue
                hit = self.goto(act[1], meta, depth + 1)
                ports |= hit.ports
                groups |= hit.groups
                if reads is not None:
                    reads |= hit.reads

    def prefixes_via(self, group_ids: set[int]) -> list[tuple[int, int]]:
        """The prefixes of the routes whose actions lead through any of ``group_ids``."""
        out = []
        for _prio, mask, nets in self.index.routes:
            for net, (_key, actions) in nets.items():
                if self.resolve(actions)[1] & group_ids:
                    out.append((net, mask))
        return out


_PLANE_ADDRESSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plane_addresses(ix: compiler.FabricIndex) -> dict[int, list[int]]:
    """Host addresses of each plane, sorted (built once per fabric index)."""
    out = _PLANE_ADDRESSES.get(ix)
    if out is None:
        out = {}
        for address, (_mac, _host, plane) in ix.host_addr.items():
            out.setdefault(plane, []).append(address)
        for addresses in out.values():
            addresses.sort()
        _PLANE_ADDRESSES[ix] = out
    return out


def _covered(addresses: list[int], prefixes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The addresses (sorted) that any of the prefixes covers, as ranges of their positions in
    ``addresses`` ([start, end)), sorted, each address in one."""
    ranges = sorted((net & mask, (net & mask) | (~mask & compiler.FULL)) for net, mask in prefixes)
    out: list[tuple[int, int]] = []
    end = -1
    for lo, hi in ranges:
        lo = max(lo, end + 1)
        if lo > hi:
            continue
        i, j = bisect.bisect_left(addresses, lo), bisect.bisect_right(addresses, hi)
        if i < j:
            if out and out[-1][1] == i:
                out[-1] = (out[-1][0], j)
            else:
                out.append((i, j))
        end = hi
    return out


def _live(dead: frozenset[int], port: int) -> bool:
    return port not in dead


def dead_ports(ix: compiler.FabricIndex, failures: compiler.Failures | None) -> dict[str, frozenset[int]]:
    """switch -> its dead ports, for the switches that have any: a port is dead when its link or the
    switch across it failed."""
    out: dict[str, set[int]] = {}
    if failures:
        ends = [(sw, lid) for lid in failures.links for sw in lid[:2]]
        for failed in failures.switches:
            node = ix.sw.get(failed)
            ends += [(peer, lid) for _p, peer, lid in (node.up + node.down + node.lateral)] if node else []
        for sw, lid in ends:
            port = ix.port_of(sw, lid)
            if port is not None:
                out.setdefault(sw, set()).add(port)
    return {sw: frozenset(ports) for sw, ports in out.items()}


@dataclass(frozen=True, eq=False)
class Item:
    """One flow entry or group to change on one switch: ``actions`` is the new value (a flow's
    actions, a group's compiler.Group), None deletes it. Compared and hashed by identity (each
    item of a plan is one object; hashing its nested key on every set operation is what made
    plans of 90k items slow)."""
    switch: str
    key: tuple
    actions: Value | None


def diff(confirmed: SwitchTable, desired: SwitchTable, switch: str) -> list[Item]:
    if confirmed is desired:
        return []
    items = [Item(switch, k, a) for k, a in desired.items() if confirmed.get(k) != a]
    items += [Item(switch, k, None) for k in confirmed if k not in desired]
    return items


def plan_step(ix: compiler.FabricIndex, confirmed: Mapping[str, SwitchTable], desired: Mapping[str, SwitchTable],
              switches: Iterable[str], failures: compiler.Failures | None = None) -> tuple[list[Item], int, bool]:
    """The items of ``switches`` (connected, settled) that may go now; see :func:`plan`."""
    items = [it for sw in switches for it in diff(confirmed.get(sw, {}), desired.get(sw, {}), sw)]
    return plan(ix, confirmed, desired, items, failures)


def plan(ix: compiler.FabricIndex, confirmed: Mapping[str, SwitchTable], desired: Mapping[str, SwitchTable],
         items: list[Item], failures: compiler.Failures | None = None,
         indexes: dict[str, list] | None = None) -> tuple[list[Item], int, bool]:
    """The items that may go now: (items, items left for later steps, whether a dependency cycle
    forced everything out at once). ``failures``: the live fabric (which fast-failover bucket is
    live). ``indexes``: switch -> [TableIndex of its confirmed table, of its desired table], either
    None where not known; the missing ones are built and filled in. The work is proportional to
    the items and the addresses their routes cover (and to the tables whose index is built)."""
    if indexes is None:
        indexes = {}
    if not items:
        return [], 0, False
    by_switch: dict[str, list[Item]] = {}
    for it in items:
        by_switch.setdefault(it.switch, []).append(it)
    deps: dict[Item, set[Item]] = {}      # item -> the items to be confirmed first (only items that wait)
    soft: dict[Item, list[Item]] = {}      # to go first, in the same step if the batch order allows
    runs: dict[str, list[_Run]] = {}       # switch -> the runs of addresses whose forwarding it changes
    dead = dead_ports(ix, failures)
    addresses = _plane_addresses(ix)
    fresh: set[str] = set()          # switches that route nothing yet and will
    for sw, its in by_switch.items():
        old_table, new_table = confirmed.get(sw, {}), desired.get(sw, {})
        group_items = {it.key.group_id: it for it in its if isinstance(it.key, GroupKey)}
        route_items = {it.key: it for it in its if not is_group(it.key) and it.key[0] == compiler.TABLE_ROUTE}
        pair = None
        if route_items or group_items:
            pair = indexes.setdefault(sw, [None, None])
            if pair[0] is None or pair[0].table is not old_table:
                pair[0] = TableIndex(old_table)
            if pair[1] is None or pair[1].table is not new_table:
                pair[1] = TableIndex(new_table)
            if not pair[0].routes and pair[1].routes:
                # installed anew: its items go first and wait for nothing (see below), and every
                # dependency is between items of one switch but the forwarding ones, which skip it:
                # none of them is needed (10.2 s of a cold start's first plan on a 180-switch plane)
                fresh.add(sw)
                continue
        _reference_deps(its, group_items, old_table, deps)
        _entropy_deps(its, soft)
        flows = [it for it in its if it.key.__class__ is not GroupKey]
        routes_and_other = [it for it in flows if it.key[0] != compiler.TABLE_ENTROPY]
        if routes_and_other:
            for it in flows:
                if it.actions is None and it.key[0] == compiler.TABLE_ENTROPY:
                    deps.setdefault(it, set()).update(routes_and_other)
        if pair is not None:
            dead_here = dead.get(sw, frozenset())
            live_here = functools.partial(_live, dead_here)
            found = _forwarding_changes(ix, sw, _Forwarding(pair[0], live_here, dead_here),
                                        _Forwarding(pair[1], live_here, dead_here),
                                        route_items, group_items, addresses.get(ix.sw[sw].plane, []))
            if found:
                runs[sw] = found
    # A switch installed anew (back from a failure: no route yet) goes first: fast-failover groups that
    # watch its ports send to it as soon as they are live, and what it forwards meanwhile is
    # nothing. The others' forwarding changes wait until all of its items are confirmed.
    fresh_items = [it for sw in fresh for it in by_switch[sw]]
    for it in fresh_items:      # all in one step: the batch order puts groups before the flows using them
        deps.pop(it, None)
        soft.pop(it, None)
    if fresh_items:
        # every other switch's items wait for one of them (they all go in this step): strictly after
        first = fresh_items[0]
        for sw, its in by_switch.items():
            if sw not in fresh:
                for it in its:
                    deps.setdefault(it, set()).add(first)
        runs = {sw: rs for sw, rs in runs.items() if sw not in fresh}
    ends = {sw: [r.end for r in rs] for sw, rs in runs.items()}
    relevant: dict[frozenset[str], tuple[str, ...]] = {}    # next hops -> those that have items at all
    for rs in runs.values():
        for run in rs:
            peers = relevant.get(run.peers)
            if peers is None:
                peers = relevant[run.peers] = tuple(p for p in run.peers if p in runs)
            for peer in peers:
                for downstream in _overlapping(runs[peer], ends[peer], run):
                    for it in run.items:
                        deps.setdefault(it, set()).update(downstream.items)
            # A switch that stops forwarding an address (a drop where it forwarded) waits until the
            # switches that sent it there have stopped (a detour through it keeps delivering until then).
            for peer in run.gone:
                if peer in runs:
                    for dropping in _overlapping(runs[peer], ends[peer], run):
                        if dropping.dropped:
                            for it in dropping.items:
                                deps.setdefault(it, set()).update(run.items)
    # Only items that wait for something can be on a cycle, and only through items that wait too.
    waiting = {it: deps.get(it, set()).union(soft.get(it, ())) for it in deps.keys() | soft.keys()}
    order = {it: {d for d in ds if d in waiting} for it, ds in waiting.items()}
    try:
        TopologicalSorter(order).prepare()
    except CycleError:
        LOG.warning("update order has a dependency cycle: sending %d changes in one step", len(items))
        return items, 0, True
    ready = [it for it in items if it not in deps and not any(s in deps for s in soft.get(it, ()))]
    return ready, len(items) - len(ready), False


def _entropy_deps(its: list[Item], soft: dict[Item, list[Item]]) -> None:
    """A flow that writes metadata and goes to table 2 goes with or after the table-2 entries it
    will meet there that are added or changed (the batch order sends those first): if they must
    wait, so does it."""
    by_mask: dict[int, dict[int, list[Item]]] = {}
    for it in its:
        key = it.key
        if key.__class__ is not GroupKey and key[0] == compiler.TABLE_ENTROPY and it.actions is not None:
            meta, mask = _metadata_match(key[2])
            by_mask.setdefault(mask, {}).setdefault(meta & mask, []).append(it)
    if not by_mask:
        return
    for it in its:
        key = it.key
        if key.__class__ is GroupKey or key[0] == compiler.TABLE_ENTROPY or not it.actions:
            continue
        actions = it.actions
        if ("goto", compiler.TABLE_ENTROPY) not in actions:
            continue
        meta = next((a[1] for a in actions if a[0] == "metadata"), 0)
        found = [e for mask, values in by_mask.items() for e in values.get(meta & mask, ())]
        if found:
            soft[it] = found


def _reference_deps(its: list[Item], group_items: Mapping[int, Item], old_table: SwitchTable,
                    deps: dict[Item, set[Item]]) -> None:
    """A reference to a group waits for the group's add/change; a group's deletion waits for every
    change that removes a reference to it."""
    if not group_items:
        return
    for it in its:
        if it.actions is not None:
            for gid in groups_referenced(it.actions):
                group = group_items.get(gid)
                if group is not None and group is not it and group.actions is not None:
                    deps.setdefault(it, set()).add(group)
    deleted = {gid: it for gid, it in group_items.items() if it.actions is None}
    if deleted:
        for it in its:
            for gid in groups_referenced(old_table.get(it.key)) & deleted.keys():
                if deleted[gid] is not it:
                    deps.setdefault(deleted[gid], set()).add(it)


class _Run(NamedTuple):
    """Addresses ``addresses[start:end]`` of a plane whose forwarding at one switch changes alike:
    the items responsible, the new next hops, whether it now drops what it forwarded, the next
    hops it stops using."""
    start: int
    end: int
    items: list
    peers: frozenset[str]
    dropped: bool
    gone: frozenset[str]


def _forwarding_changes(ix: compiler.FabricIndex, sw: str, old: _Forwarding, new: _Forwarding,
                        route_items: Mapping[tuple, Item], group_items: Mapping[int, Item],
                        plane_addresses: list[int]) -> list[_Run]:
    """The runs of addresses whose forwarding at ``sw`` changes (sorted, disjoint): for each, the
    items responsible, the new next hops, the next hops it stops using and whether it now drops
    what it forwarded."""
    # Only an address a changed route covers, or one whose route leads through a changed group,
    # can be forwarded differently: for the rest both tables agree.
    prefixes = [p for p in (_route_prefix(key[2]) for key in route_items) if p is not None]
    if group_items:
        gids = set(group_items)
        prefixes += old.prefixes_via(gids) + new.prefixes_via(gids)
    peers_of: dict[frozenset[int], frozenset[str]] = {}
    # Every address that meets the same old and new entry changes the same way: decided once per
    # such pair, for a whole run of addresses that meet the same entries in both tables.
    decided: dict[tuple, tuple[list[Item], frozenset[str], bool, frozenset[str]] | None] = {}
    runs: list[_Run] = []
    for i, j in _covered(plane_addresses, prefixes):
        k = i
        while k < j:
            address = plane_addresses[k]
            old_key, old_actions, old_end = old.run(address)
            new_key, new_actions, new_end = new.run(address)
            m = bisect.bisect_right(plane_addresses, min(old_end, new_end), k + 1, j)
            pair = (old_key, old_actions, new_key, new_actions)
            if pair in decided:
                change = decided[pair]
            else:
                change = decided[pair] = _change(ix, sw, old, new, pair, route_items, group_items, peers_of)
            if change is not None:
                # the run before ends here with the same change (one items list per decided pair): extend it
                if runs and runs[-1].end == k and runs[-1].items is change[0]:
                    runs[-1] = runs[-1]._replace(end=m)
                else:
                    runs.append(_Run(k, m, *change))
            k = m
    return runs


def _overlapping(runs: list[_Run], ends: list[int], run: _Run) -> Iterator[_Run]:
    """The runs (sorted, disjoint; ``ends`` their ends) that share an address with ``run``."""
    for k in range(bisect.bisect_right(ends, run.start), len(runs)):
        other = runs[k]
        if other.start >= run.end:
            break
        yield other


def _change(ix: compiler.FabricIndex, sw: str, old: _Forwarding, new: _Forwarding, pair: tuple,
            route_items: Mapping[tuple, Item], group_items: Mapping[int, Item],
            peers_of: dict[frozenset[int], frozenset[str]]
            ) -> tuple[list[Item], frozenset[str], bool, frozenset[str]] | None:
    """How an address that meets ``pair`` (old entry key and actions, new key and actions) changes at
    ``sw``: (the items responsible, the new next hops, whether it now drops what it forwarded, the
    next hops it stops using), or None when its forwarding does not change or no item changes it."""
    old_key, old_actions, new_key, new_actions = pair
    old_ports, old_groups = old.resolve(old_actions)
    new_ports, new_groups = new.resolve(new_actions)
    if old_key == new_key and old_actions == new_actions and old_ports == new_ports:
        return None
    its = [route_items[k] for k in {old_key, new_key} if k is not None and k in route_items]
    if group_items:
        its += [group_items[g] for g in old_groups | new_groups if g in group_items]
    if not its:
        return None
    peers = _peers(ix, sw, new_ports, peers_of)
    gone = _peers(ix, sw, old_ports, peers_of) - peers if old_ports - new_ports else frozenset()
    return its, peers, bool(old_ports and not new_ports), gone


_PEERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PEERS_KEPT = 1 << 16          # port sets of switches kept per fabric index (a plan's use a few per switch)


def _peers(ix: compiler.FabricIndex, sw: str, ports: frozenset[int],
           cache: dict[frozenset[int], frozenset[str]]) -> frozenset[str]:
    """The switches across ``ports`` of ``sw`` (cached per port set, and per fabric index across plans:
    at hpn-130k a leaf's route fans out over 128 uplinks, and most switches a plan looks at forward
    over the same sets as at the plan before)."""
    peers = cache.get(ports)
    if peers is None:
        kept = _PEERS.get(ix)
        if kept is None or len(kept) > _PEERS_KEPT:
            kept = _PEERS[ix] = {}
        peers = kept.get((sw, ports))
        if peers is None:
            found = set()
            for port in ports:
                lid = ix.link_at(sw, port)
                if lid is not None:
                    found.add(lid[1] if lid[0] == sw else lid[0])
            peers = kept[sw, ports] = frozenset(found)
        cache[ports] = peers
    return peers


def batch(items: list[Item]) -> list[list[FlowMod | GroupMod]]:
    """One switch's items as ordered groups, each to be followed by a barrier."""
    def mod(it: Item) -> FlowMod | GroupMod:
        if isinstance(it.key, GroupKey):
            group = it.actions
            if isinstance(group, compiler.Group):
                return GroupMod(it.switch, "add", it.key.group_id, group.kind, group.buckets)
            return GroupMod(it.switch, "delete", it.key.group_id)
        t, p, m = it.key
        return FlowMod(it.switch, "delete" if it.actions is None else "add", t, p, m, it.actions or ())

    groups = [it for it in items if is_group(it.key)]
    flows = [it for it in items if not is_group(it.key)]
    adds = [it for it in flows if it.actions is not None]
    dels = [it for it in flows if it.actions is None]
    segments = [
        [it for it in groups if it.actions is not None],
        [it for it in adds if it.key[0] == compiler.TABLE_ENTROPY],
        sorted((it for it in adds if it.key[0] != compiler.TABLE_ENTROPY), key=lambda it: (-it.key[0], -it.key[1])),
        sorted((it for it in dels if it.key[0] != compiler.TABLE_ENTROPY), key=lambda it: (it.key[0], it.key[1])),
        [it for it in dels if it.key[0] == compiler.TABLE_ENTROPY],
        [it for it in groups if it.actions is None],
    ]
    return [[mod(it) for it in segment] for segment in segments if segment]


# ---- the reconciler ------------------------------------------------------------------------

@dataclass
class _Pending:
    """Messages sent to a switch and not yet confirmed: a barrier and the changes before it."""
    xid: int
    sent_at: float
    changes: list = field(default_factory=list)     # (key, value | None)


@dataclass
class _Resync:
    """A switch being read back: its flows and its groups, each answered under its own xid."""
    flow_xid: int
    group_xid: int
    sent_at: float
    table: dict = field(default_factory=dict)
    waiting: set = field(default_factory=set)       # the xids whose last part has not arrived


class Reconciler:
    """Link state, desired state and confirmed state of every switch of one fabric.

    ``compile_fn`` (graph, failures, policy, switches=...) -> {switch: SwitchState}:
    compiler.compile_fabric unless a test gives its own."""

    def __init__(self, g: nx.MultiGraph, policy: str = compiler.DEFAULT_POLICY,
                 confirm_timeout_s: float = CONFIRM_TIMEOUT_S, compile_fn: CompileFn = compiler.compile_fabric,
                 fast_failover: bool = compiler.DEFAULT_FAST_FAILOVER,
                 arp: str = compiler.DEFAULT_ARP, reads_at_once: int = READS_AT_ONCE):
        if reads_at_once < 1:
            raise ValueError(f"reads_at_once must be at least 1, got {reads_at_once}")
        self.graph = g
        self.policy = policy
        self.confirm_timeout_s = confirm_timeout_s
        self.reads_at_once = reads_at_once
        self._to_read: dict[str, None] = {}             # switches waiting for a read-back slot, in order
        self._unsent: list[_Pending | _Resync] = []     # stamped by the last handle(), for sent()
        self._heard: dict[str, float] = {}              # switch -> when it last answered (barrier, read-back)
        self._backoff: dict[str, int] = {}              # switch -> its timeout's multiple after timeouts
        self._deaggregated: dict[str, tuple] = {}      # switch -> (its state, its routes there only for failures)
        if not fast_failover:    # the controller-only baseline (compiler.compile_fabric's docstring)
            compile_fn = functools.partial(compile_fn, fast_failover=False)
        if arp != compiler.DEFAULT_ARP:     # how leaves answer ARP (compiler.arp_responders)
            compile_fn = functools.partial(compile_fn, arp=arp)
        self.fast_failover = fast_failover
        self.arp = arp
        #: leaves answering ARP in another mode than ``arp`` (ArpMode: the per-leaf fallback)
        self.arp_leaves: dict[str, str] = {}
        self.compile_fn = compile_fn
        #: while True, switches are read back and events followed, but no change is sent (the app holds a
        #: restarted controller's installs until the wiring has been observed: wiring.release_ungated)
        self.hold = False
        #: remote convergence: from an event that changed the target (a port or switch seen down
        #: or up) to every connected switch confirming its new state, in seconds (the last 64)
        self.convergences: deque[float] = deque(maxlen=64)
        self._converging_since: float | None = None
        self.rebuild_above = 0.5     # a changed switch's table is patched unless more than this share changed
        self.ix = compiler.index_of(g)
        _ = self.ix.port_link   # (switch, port) -> link, built now: not at the first failure (1.7 s at hpn-130k)
        self.down_ports: set[tuple[str, int]] = set()
        self.failed_switches: set[str] = set()      # connected once, then disconnected
        self.failures = compiler.Failures()
        self.healthy = compile_fn(g, None, policy)
        self.states: dict[str, compiler.SwitchState] = dict(self.healthy)
        self.desired: dict[str, SwitchTable] = {sw: switch_table(st) for sw, st in self.states.items()}
        self.connected: set[str] = set()
        self.confirmed: dict[str, SwitchTable] = {}
        # switches whose confirmed table may differ from the desired one (every other connected
        # switch that has confirmed anything holds exactly its desired table)
        self.dirty: set[str] = set()
        self._recompile_due = False     # ports changed by a PortStatus with more to come (PortStatus.more)
        # for a switch that was clean when its desired table changed: the keys that may differ, and
        # its previous desired table (what it holds) with that table's index
        self._changed_keys: dict[str, set] = {}
        self._prev: dict[str, tuple[SwitchTable, TableIndex | None]] = {}
        self._index: dict[str, TableIndex] = {}      # the index of desired[switch], once built
        self.pending: dict[str, list[_Pending]] = {}
        self.resyncing: dict[str, _Resync] = {}
        self._xid = 0
        self.counters = {"recompiles": 0, "restates": 0, "resyncs": 0, "reads": 0, "reads_queued": 0, "errors": 0,
                         "steps": 0, "cycles": 0,
                         "arp_fallbacks": 0, "add": 0, "modify": 0, "delete": 0, "group_add": 0, "group_modify": 0,
                         "group_delete": 0}
        self.last_recompiled_planes: tuple[int, ...] = ()
        # CPU seconds spent by the last recompile (compile, compare) and the last step (diff, plan)
        self.timings = {"compile_s": 0.0, "compare_s": 0.0, "diff_s": 0.0, "plan_s": 0.0}

    # ---- queries ------------------------------------------------------------------------
    @property
    def settled(self) -> bool:
        """Nothing sent is waiting for a confirmation and every switch holds its desired state."""
        if self._recompile_due or self._outstanding() or any(sw not in self.confirmed for sw in self.connected):
            return False
        return all(self.confirmed[sw] == self.desired.get(sw, {}) for sw in self.dirty & self.connected)

    def deaggregated(self) -> int:
        """Routes present only because of failures (compiler.deaggregated), counted again only for the
        switches whose desired state changed since the last count."""
        total = 0
        for sw, st in self.states.items():
            known = self._deaggregated.get(sw)
            if known is None or known[0] is not st:
                known = self._deaggregated[sw] = (st, compiler.deaggregated({sw: st}, self.healthy))
            total += known[1]
        return total

    # ---- events ------------------------------------------------------------------------
    def handle(self, event: Event, now: float = 0.0) -> list[Message]:
        was_enabled = gc.isenabled()
        gc.disable()    # tens of thousands of small acyclic values per update: no cyclic GC passes over them
        try:
            return self._handle(event, now)
        finally:
            if was_enabled:
                gc.enable()

    def sent(self, now: float) -> None:
        """The messages the last :meth:`handle` returned left the controller at ``now``: their
        switches' time to confirm them counts from here (the time spent deciding, encoding and
        sending them is the controller's)."""
        for waiting in self._unsent:
            waiting.sent_at = max(waiting.sent_at, now)
        self._unsent.clear()

    def _handle(self, event: Event, now: float) -> list[Message]:
        self._unsent.clear()
        out: list[Message] = []
        recompiles = self.counters["recompiles"]
        if isinstance(event, SwitchUp):
            out += self._switch_up(event.switch, event.ports, now)
        elif isinstance(event, SwitchDown):
            self._switch_down(event.switch)
        elif isinstance(event, PortStatus):
            self._port_status(event.switch, event.ports, defer=event.more)
        elif isinstance(event, BarrierReply):
            self._heard[event.switch] = now
            self._barrier_reply(event.switch, event.xid)
        elif isinstance(event, Error):
            if event.switch in self.connected:
                self.counters["errors"] += 1
                LOG.error("%s: OpenFlow error type=%d code=%d (xid %d): resynchronising it",
                          event.switch, event.type, event.code, event.xid)
                out += self._resync(event.switch, now)
        elif isinstance(event, Tick):
            out += self._timeouts(now, busy=event.busy or event.backlog > 0)
        elif isinstance(event, (FlowStatsReply, GroupDescReply)):
            self._heard[event.switch] = now
            self._read_back(event)
        elif isinstance(event, Restate):
            self.counters["restates"] += 1
            self._adopt([sw for sw in event.states if sw in self.states], self._arp_of(event.states))
        elif isinstance(event, ArpMode):
            self._arp_mode(event.leaf, event.mode)
        else:
            raise TypeError(f"not a reconciler event: {event!r}")
        if self._recompile_due and not (isinstance(event, PortStatus) and event.more):
            self._recompile()         # the PortStatus messages that came together, in one recompile
        if (recompiles != self.counters["recompiles"] or self._recompile_due) and self._converging_since is None:
            self._converging_since = now
        out += self._start_reads(now)
        out += self._step(now)
        if (self._converging_since is not None and not self._recompile_due and not self._outstanding()
                and not (self.dirty & self.connected)):
            took = now - self._converging_since
            self._converging_since = None
            self.convergences.append(took)
            LOG.info("converged in %.1f ms after %s (%d switch(es) connected)", took * 1e3,
                     type(event).__name__, len(self.connected))
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
        self.counters["reads"] += 1
        return self._read_held(sw, now)

    def _switch_down(self, sw: str) -> None:
        if sw not in self.connected:
            return
        self.connected.discard(sw)
        self._forget(sw)
        self._heard.pop(sw, None)
        self._backoff.pop(sw, None)
        self.failed_switches.add(sw)
        self._recompile()

    def _forget(self, sw: str) -> None:
        """Drop what is known of a switch's tables and what it was sent (it connected anew,
        disconnected, or is about to be read back)."""
        self.pending.pop(sw, None)
        self.resyncing.pop(sw, None)
        self._to_read.pop(sw, None)
        self.confirmed.pop(sw, None)
        self._changed_keys.pop(sw, None)
        self._prev.pop(sw, None)

    def _port_status(self, sw: str, ports: Mapping[int, bool], defer: bool = False) -> None:
        for port, up in ports.items():
            if self.ix.link_at(sw, port) is None:
                continue
            if up:
                self.down_ports.discard((sw, port))
            else:
                self.down_ports.add((sw, port))
        if defer:
            self._recompile_due = True
        else:
            self._recompile()

    def _barrier_reply(self, sw: str, xid: int) -> None:
        queue = self.pending.get(sw, [])
        if not any(p.xid == xid for p in queue):
            return
        table = self.confirmed.setdefault(sw, {})
        while queue:     # a switch answers barriers in order: everything before this one is done
            p = queue.pop(0)
            for key, value in p.changes:
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value
            if p.xid == xid:
                break
        if not queue and sw in self._backoff:     # answered everything: halve its timeout's multiple
            self._backoff[sw] //= 2
            if self._backoff[sw] <= 1:
                del self._backoff[sw]

    def _resync(self, sw: str, now: float) -> list[Message]:
        self.counters["resyncs"] += 1
        self._forget(sw)
        return self._read_held(sw, now)

    def _read_held(self, sw: str, now: float) -> list[Message]:
        """Ask what ``sw`` holds (its flows and its groups); until both answers are complete it has
        confirmed nothing and no step starts (see :meth:`_read_back`). With ``reads_at_once`` switches
        being read already, it waits its turn (:meth:`_start_reads`)."""
        self.dirty.add(sw)       # what it holds is unknown until it is read back
        if len(self.resyncing) >= self.reads_at_once:
            self.counters["reads_queued"] += 1
            self._to_read[sw] = None
            return []
        flow_xid, group_xid = self._next_xid(), self._next_xid()
        self.resyncing[sw] = resync = _Resync(flow_xid, group_xid, now, waiting={flow_xid, group_xid})
        self._unsent.append(resync)
        return [FlowStatsRequest(sw, flow_xid), GroupDescRequest(sw, group_xid)]

    def _start_reads(self, now: float) -> list[Message]:
        """Read back the switches waiting their turn, while fewer than ``reads_at_once`` are being read."""
        out: list[Message] = []
        while self._to_read and len(self.resyncing) < self.reads_at_once:
            sw = next(iter(self._to_read))
            del self._to_read[sw]
            out += self._read_held(sw, now)
        return out

    def _timeouts(self, now: float, busy: bool = False) -> list[Message]:
        """Resynchronise each switch that owes an answer and has been silent for its timeout: silent
        since the later of the oldest unanswered request's sending and the switch's last answer (a
        switch working through a long step answers its barriers one by one), for ``confirm_timeout_s``
        doubled after each of its timeouts up to :data:`MAX_BACKOFF` times (halved each time it has
        answered everything), and :data:`BUSY_PATIENCE` times that while the controller is busy."""
        out: list[Message] = []
        for sw in sorted(self.connected):
            queue = self.pending.get(sw)
            resync = self.resyncing.get(sw)
            sent = queue[0].sent_at if queue else resync.sent_at if resync else None
            if sent is None:
                continue
            limit = self.confirm_timeout_s * self._backoff.get(sw, 1) * (BUSY_PATIENCE if busy else 1)
            if now - max(sent, self._heard.get(sw, sent)) > limit:
                LOG.warning("%s: no answer within %.1f s%s: resynchronising it", sw, limit,
                            " (the controller busy)" if busy else "")
                self._backoff[sw] = min(self._backoff.get(sw, 1) * 2, MAX_BACKOFF)
                out += self._resync(sw, now)
        return out

    def _read_back(self, ev: FlowStatsReply | GroupDescReply) -> None:
        resync = self.resyncing.get(ev.switch)
        if resync is None or ev.xid not in resync.waiting:
            return
        if isinstance(ev, FlowStatsReply):
            if ev.xid != resync.flow_xid:
                return
            for f in ev.flows:
                resync.table[(f.table, f.priority, canonical_match(f.match))] = tuple(f.actions)
        else:
            if ev.xid != resync.group_xid:
                return
            for group in ev.groups:
                resync.table[GroupKey(group.group_id)] = canonical_group(group)
        if not ev.more:
            resync.waiting.discard(ev.xid)
        if not resync.waiting:
            del self.resyncing[ev.switch]
            self.confirmed[ev.switch] = resync.table
            self._changed_keys.pop(ev.switch, None)     # what it holds is read, not known by keys
            self.dirty.add(ev.switch)

    # ---- decisions ------------------------------------------------------------------------
    def _link_failures(self) -> compiler.Failures:
        links = {self.ix.link_at(sw, port) for sw, port in self.down_ports}
        links.discard(None)
        return compiler.Failures(frozenset(links), frozenset(self.failed_switches))

    def _recompile(self) -> None:
        self._recompile_due = False
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
        t0 = time.process_time()
        states = self._arp_of(self.compile_fn(self.graph, failures, self.policy, switches=wanted))
        t1 = time.process_time()
        changed = self._adopt(wanted, states)
        self.timings["compile_s"] = t1 - t0
        self.timings["compare_s"] = time.process_time() - t1
        self.counters["recompiles"] += 1
        self.last_recompiled_planes = tuple(sorted(planes))
        LOG.info("recompiled plane(s) %s in %.0f ms: %d failed links, %d failed switches, %d switches changed",
                 ", ".join(map(str, sorted(planes))), 1000 * (t1 - t0), len(failures.links),
                 len(failures.switches), changed)

    def _arp_of(self, states: Mapping[str, compiler.SwitchState]) -> Mapping[str, compiler.SwitchState]:
        """Compiled states with the leaves of ``arp_leaves`` answering ARP in their own mode."""
        if not self.arp_leaves or not self.arp_leaves.keys() & states.keys():
            return states
        return {sw: compiler.with_arp(self.graph, st, self.arp_leaves[sw], self.arp) if sw in self.arp_leaves else st
                for sw, st in states.items()}

    def _arp_mode(self, leaf: str, mode: str) -> None:
        if leaf not in self.ix.sw or self.arp_leaves.get(leaf, self.arp) == mode:
            return
        if mode == self.arp:
            del self.arp_leaves[leaf]
        else:
            self.arp_leaves[leaf] = mode
            self.counters["arp_fallbacks"] += 1
        if leaf in self.states:      # a failed leaf gets it when it is compiled again
            compiled = self.compile_fn(self.graph, self.failures, self.policy, switches=[leaf])
            self._adopt([leaf], self._arp_of(compiled))

    def _adopt(self, wanted: Iterable[str], states: Mapping[str, compiler.SwitchState]) -> int:
        """Make ``states`` the desired states of the ``wanted`` switches (one missing from ``states``
        has none: it failed); returns how many changed."""
        changed = 0
        for sw in wanted:
            new = states.get(sw)
            if new is None:
                self.states.pop(sw, None)
                self.desired.pop(sw, None)
                self.dirty.discard(sw)
                for known in (self._changed_keys, self._prev, self._index):
                    known.pop(sw, None)
            elif not same_state(self.states.get(sw), new):
                old, table = self.states.get(sw), self.desired.get(sw)
                old_index = self._index.pop(sw, None)
                # a clean switch holds its desired table: what it confirmed is the same content, so
                # that stands for the previous table (with its index) and the table is patched in place
                held = self.confirmed.get(sw) if sw not in self.dirty else None
                in_place = held is not None and held is not table
                if held is not None and in_place and old_index is not None:
                    old_index.table = held
                keys = None
                if old is not None and table is not None:
                    self.desired[sw], keys = patched_table(old, new, table, self.rebuild_above, in_place)
                else:
                    self.desired[sw] = switch_table(new)
                if keys is not None and old_index is not None:
                    self._index[sw] = old_index.patched(self.desired[sw], keys)
                self._changed_keys.pop(sw, None)
                self._prev.pop(sw, None)
                if table is not None and sw not in self.dirty:    # it holds the old desired table
                    self._prev[sw] = (held if held is not None and in_place else table, old_index)
                    if keys is not None:
                        self._changed_keys[sw] = keys
                self.states[sw] = new
                self.dirty.add(sw)
                changed += 1
        return changed

    def _outstanding(self) -> bool:
        return any(self.pending.get(sw) for sw in self.connected) or bool(self.resyncing) or bool(self._to_read)

    def _step(self, now: float) -> list[Message]:
        if self.hold or self._recompile_due or self._outstanding() or not self.dirty:
            return []
        t0 = time.process_time()
        switches = sorted(sw for sw in self.dirty if sw in self.connected and sw in self.confirmed)
        items: list[Item] = []
        held: dict[str, SwitchTable] = {}      # tables equal to what switches confirmed, with an index
        indexes: dict[str, list] = {}
        for sw in switches:
            keys, prev = self._changed_keys.pop(sw, None), self._prev.pop(sw, None)
            confirmed, desired = self.confirmed[sw], self.desired.get(sw, {})
            if keys is None:
                its = diff(confirmed, desired, sw)
            else:    # the switch was clean: only these keys can differ
                its = [Item(sw, k, desired.get(k)) for k in keys if confirmed.get(k) != desired.get(k)]
            indexes[sw] = [None, self._index.get(sw)]
            if prev is not None:     # it holds its previous desired table, whose index may be known
                held[sw] = prev[0]
                indexes[sw][0] = prev[1]
            if its:
                items += its
                # what it is sent now (or later, where the plan holds an item back) are the only keys
                # in which it can differ from its desired table at the next step: a change of the
                # desired table (_adopt) or of what it holds beyond its barriers (_forget) drops this,
                # and the next step diffs it in full. At hpn-130k the full diff of every switch a link
                # failure changed, in the step after they confirmed, was a quarter of the controller's CPU.
                self._changed_keys[sw] = {it.key for it in its}
            else:
                self.dirty.discard(sw)
        t1 = time.process_time()
        ready: list[Item] = []
        cycle = False
        if items:
            ready, _left, cycle = plan(self.ix, ChainMap(held, self.confirmed), self.desired, items,
                                       self.failures, indexes)
            for sw, (_old, new) in indexes.items():
                if new is not None and new.table is self.desired.get(sw):
                    self._index[sw] = new
        self.timings["diff_s"] = t1 - t0
        self.timings["plan_s"] = time.process_time() - t1
        if not ready:
            return []
        self.counters["steps"] += 1
        self.counters["cycles"] += cycle
        out: list[Message] = []
        by_switch: dict[str, list[Item]] = {}
        for it in ready:
            by_switch.setdefault(it.switch, []).append(it)
        for sw in switches:
            for segment in batch(by_switch.get(sw, [])):
                changes: list[tuple[tuple, Value | None]] = []
                for mod in segment:
                    if mod.command == "add" and mod.key in self.confirmed[sw]:
                        mod = dataclasses.replace(mod, command="modify")
                    self.counters[("group_" if isinstance(mod, GroupMod) else "") + mod.command] += 1
                    out.append(mod)
                    if mod.command == "delete":
                        changes.append((mod.key, None))
                    else:
                        changes.append((mod.key, mod.group if isinstance(mod, GroupMod) else mod.actions))
                xid = self._next_xid()
                out.append(Barrier(sw, xid))
                pending = _Pending(xid, now, changes)
                self.pending.setdefault(sw, []).append(pending)
                self._unsent.append(pending)
        return out

    def _next_xid(self) -> int:
        self._xid = (self._xid + 1) & 0xFFFFFFFF or 1
        return self._xid
