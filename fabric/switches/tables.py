"""A simulated OpenFlow 1.3 switch's flow and group tables: what a FlowMod or GroupMod changes, and which
error a switch answers instead. Pure: plain values in, plain values out (no os-ken, no socket).

The shell (``fabric/switches/wire.py`` decodes, ``endpoint.py`` answers) hands a :class:`FlowMod` or
:class:`GroupMod` value to :meth:`Tables.flow_mod` / :meth:`Tables.group_mod` and gets back ``None``
(applied) or the name of the OpenFlow error a switch sends (:data:`ERRORS`). The encoded match and
instructions (``match_body``, ``instructions_body``) and a group's encoded buckets (``body``) are kept
as given, opaque, so that stats replies send back what was installed, byte for byte.

Semantics (OpenFlow 1.3.5, section 6.4 and 6.5, as Open vSwitch behaves):
- add: an entry of the same table, priority and match is replaced (its cookie too); a new entry
  beyond ``flow_limit`` is refused with ``table_full``; an entry whose instructions send to a group
  the switch does not have is refused with ``bad_out_group``.
- modify / modify_strict: the instructions of every entry the request selects are replaced (the
  cookie stays); nothing is added when none is selected (OpenFlow >= 1.2).
- delete / delete_strict: every selected entry goes.
- selection: strict: the same table, priority and match; non-strict: every entry at least as
  specific as the request's match (each field of the request present in the entry, the entry's mask
  covering the request's, the values equal under the request's mask), any priority; both: the
  request's cookie under its cookie mask, and for deletes its out_port and out_group (None: any).
  Table None: every table (deletes only).
- groups: add of an id in use: ``group_exists``; beyond ``group_limit``: ``out_of_groups``; modify of
  an unknown id: ``unknown_group``; a bucket that sends to or watches a missing group is taken, as Open
  vSwitch takes it (the reconciler adds a switch's chained groups in one batch, in id order), unless
  ``strict_chaining``: then ``bad_out_group``; delete of an unknown id: nothing (no error); a deleted
  group takes every flow that sends to it with it (Open vSwitch does), group None: every group.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

FLOW_COMMANDS = ("add", "modify", "modify_strict", "delete", "delete_strict")
GROUP_COMMANDS = ("add", "modify", "delete")
#: the errors a simulated switch answers, by name (the shell maps them to OpenFlow type and code)
ERRORS = ("table_full", "bad_out_group", "bad_table_id", "group_exists", "unknown_group",
          "out_of_groups", "bad_command")
N_TABLES = 254        # as Open vSwitch advertises: tables 0..253

FlowKey = tuple       # (table, priority, match)


@dataclass(frozen=True)
class FlowMod:
    """One flow modification, decoded. ``match`` is canonical: ((field, value), ...) sorted by field, a value
    an int (IPv4 addresses too) or (value, mask) when masked (a mask of all ones is the plain value)."""
    command: str
    table: int | None                  # None: every table (OFPTT_ALL; deletes only)
    priority: int = 0
    match: tuple = ()
    cookie: int = 0
    cookie_mask: int = 0
    out_port: int | None = None        # deletes: only entries that output to this port (None: any)
    out_group: int | None = None       # deletes: only entries that send to this group (None: any)
    outputs: frozenset = frozenset()   # the ports the instructions output to
    groups: frozenset = frozenset()    # the groups the instructions send to
    match_body: Any = None             # the encoded match, kept for stats replies
    instructions_body: Any = None      # the encoded instructions, likewise


@dataclass(frozen=True)
class GroupMod:
    command: str
    group_id: int | None               # None: every group (OFPG_ALL; deletes only)
    kind: str = "all"                  # ff, indirect, all, select
    groups: frozenset = frozenset()    # groups its buckets send to or watch
    body: Any = None                   # the encoded buckets


class Entry(NamedTuple):
    cookie: int
    outputs: frozenset
    groups: frozenset
    match_body: Any
    instructions_body: Any


class GroupEntry(NamedTuple):
    kind: str
    groups: frozenset
    body: Any


def _covers(want: Any, have: Any) -> bool:
    """Does a request's value of one field (``want``) select an entry's value (``have``) of it?"""
    if want == have:
        return True
    if not isinstance(want, tuple):
        return False          # an exact request selects only the same exact value
    value, mask = want
    if isinstance(have, tuple):
        hv, hm = have
        return isinstance(hv, int) and hm & mask == mask and hv & mask == value & mask
    return isinstance(have, int) and isinstance(value, int) and have & mask == value & mask


def covers(request: tuple, entry: tuple) -> bool:
    """Non-strict selection: is ``entry``'s match at least as specific as ``request``'s?"""
    fields = dict(entry)
    return all(name in fields and _covers(want, fields[name]) for name, want in request)


class Tables:
    """One switch's flow entries and groups, bounded by ``flow_limit`` and ``group_limit``."""

    def __init__(self, flow_limit: int = 100_000, group_limit: int = 65_536, strict_chaining: bool = False):
        self.flow_limit = flow_limit
        self.strict_chaining = strict_chaining
        self.group_limit = group_limit
        self.flows: dict[FlowKey, Entry] = {}
        self.groups: dict[int, GroupEntry] = {}
        self._users: dict[int, set[FlowKey]] = {}      # group id -> keys of the flows that send to it

    # ---- selection ---------------------------------------------------------------------------
    def select(self, table: int | None, match: tuple, *, priority: int | None = None, cookie: int = 0,
               cookie_mask: int = 0, out_port: int | None = None, out_group: int | None = None) -> list[FlowKey]:
        """The keys of the entries a request selects (``priority`` given: strict, else non-strict)."""
        if priority is not None and table is not None:
            keys: Iterable[FlowKey] = [(table, priority, match)] if (table, priority, match) in self.flows else []
        elif out_group is not None:
            keys = list(self._users.get(out_group, ()))
        else:
            keys = self.flows
        out = []
        for key in keys:
            t, prio, m = key
            if table is not None and t != table:
                continue
            if priority is not None and (prio != priority or m != match):
                continue
            e = self.flows[key]
            if cookie_mask and (e.cookie & cookie_mask) != (cookie & cookie_mask):
                continue
            if out_port is not None and out_port not in e.outputs:
                continue
            if out_group is not None and out_group not in e.groups:
                continue
            if priority is None and match and not covers(match, m):
                continue
            out.append(key)
        return out

    # ---- flows -------------------------------------------------------------------------------
    def _put(self, key: FlowKey, entry: Entry) -> None:
        old = self.flows.get(key)
        if old is not None:
            for gid in old.groups:
                self._users[gid].discard(key)
        self.flows[key] = entry
        for gid in entry.groups:
            self._users.setdefault(gid, set()).add(key)

    def _drop(self, key: FlowKey) -> None:
        old = self.flows.pop(key)
        for gid in old.groups:
            users = self._users.get(gid)
            if users is not None:
                users.discard(key)

    def flow_mod(self, m: FlowMod) -> str | None:
        """Apply one FlowMod; the error a switch would answer instead (nothing changed), or None."""
        if m.command not in FLOW_COMMANDS:
            return "bad_command"
        strict = m.command.endswith("_strict")
        if m.command in ("add", "modify", "modify_strict"):
            if m.table is None or not 0 <= m.table < N_TABLES:
                return "bad_table_id"
            if any(gid not in self.groups for gid in m.groups):
                return "bad_out_group"
        if m.command == "add":
            key = (m.table, m.priority, m.match)
            if key not in self.flows and len(self.flows) >= self.flow_limit:
                return "table_full"
            self._put(key, Entry(m.cookie, m.outputs, m.groups, m.match_body, m.instructions_body))
            return None
        keys = self.select(m.table, m.match, priority=m.priority if strict else None, cookie=m.cookie,
                           cookie_mask=m.cookie_mask,
                           out_port=m.out_port if m.command.startswith("delete") else None,
                           out_group=m.out_group if m.command.startswith("delete") else None)
        for key in keys:
            if m.command.startswith("delete"):
                self._drop(key)
            else:
                old = self.flows[key]
                self._put(key, Entry(old.cookie, m.outputs, m.groups, old.match_body, m.instructions_body))
        return None

    # ---- groups ------------------------------------------------------------------------------
    def group_mod(self, m: GroupMod) -> str | None:
        """Apply one GroupMod; the error a switch would answer instead (nothing changed), or None."""
        if m.command not in GROUP_COMMANDS:
            return "bad_command"
        if m.command == "delete":
            doomed = list(self.groups) if m.group_id is None else [m.group_id] if m.group_id in self.groups else []
            for gone in doomed:
                for key in list(self._users.pop(gone, ())):
                    if key in self.flows:
                        self._drop(key)
                del self.groups[gone]
            return None
        gid = m.group_id
        if gid is None:
            return "unknown_group"
        if m.command == "add" and gid in self.groups:
            return "group_exists"
        if m.command == "modify" and gid not in self.groups:
            return "unknown_group"
        if self.strict_chaining and any(g not in self.groups and g != gid for g in m.groups):
            return "bad_out_group"
        if m.command == "add" and len(self.groups) >= self.group_limit:
            return "out_of_groups"
        self.groups[gid] = GroupEntry(m.kind, m.groups, m.body)
        return None

    def wipe(self) -> None:
        self.flows.clear()
        self.groups.clear()
        self._users.clear()
