"""A small OpenFlow 1.3 table interpreter (the idea of Faucet's fakeoftable).

It walks a packet through the compiled tables of every switch it reaches, hop by hop
across the fabric graph, with no switch running: table lookup (highest priority wins;
two different matching entries at the same priority are an error, as the outcome would
be undefined on a real switch), write-metadata, set-field, move (one field copied into another),
goto-table, output (to a port -- never the one the packet came in on, which OpenFlow skips --,
or back out of the port it came in on: ``compiler.OFPP_IN_PORT``, as ARP responder flows do, or
after a set-field of in_port, as detour buckets do), and groups
(``SwitchState.groups``): a fast-failover ("ff") group forwards by its first bucket whose
watch port is live (or whose watched group has a live bucket), "indirect" by its only
bucket. A failed link or switch swallows the packet. The walk ends delivered (at a host
interface), dropped (table miss or a drop action, a dead link, a group with no live bucket,
or a frame a host does not take: not its address, or an Ethernet destination that is not its
MAC, as a NIC filters) or looping (a switch met twice in the same state -- same in_port and
header -- or too many hops).

Port liveness, per (switch, port), is what a fast-failover group watches. It follows the
failures: a failed link kills the ports at both ends, a failed switch the ports of its
neighbours towards it. ``one_sided`` adds (switch, port) pairs whose link is cut with only
that end noticing (one end taken down, a gray failure seen by one side): the link carries
nothing either way, but the far end still thinks its port is live and keeps sending into
it -- without BFD a black hole until the controller reacts; with BFD both ends see the
port down, which is the same as a failed link. ``not_live`` adds (switch, port) pairs that
their switch does not see live although the link carries packets both ways: a link coming
back, whose BFD session is up at one end and not yet at the other.

    net = FabricTables(graph, compiler.compile_fabric(graph, failures), failures)
    walk = net.send("h1", "h5", plane=0, sport=49152)
    walk.result  # "delivered" | "dropped" | "loop"
    walk.hops    # [(switch, in_port, out_port), ...]
    walk.packet  # the header as it arrived (eth_dst: the receiver's MAC, eth_src: the gateway's)

A packet a host sends (``packet``, ``send``) carries the Ethernet destination the host learns by
ARP: the reply its leaf's responder flows give (``arp_mac``; none when only the controller
answers, and then the frame's Ethernet destination is not checked). ARP packets hold their
addresses as ints (``arp_spa``, ``arp_tpa``; dotted strings are taken too).

For a replay (as Faucet's fakeoftable replays FlowMods) the tables of a switch can be
replaced (``load``, with its groups) and changed one message at a time (``apply``: the
reconciler's FlowMod, GroupMod and WipeTables values; ``set_group``/``delete_group`` for single
groups); ``groups`` (alias ``group_table``) gives a switch's groups (compiled, or as the replayed
GroupMods left them). ``entropy_ports()`` gives one UDP source port per bit
pattern the switches' entropy tables look at, so a walk can cover every multipath branch.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import groupby
from typing import NamedTuple

import networkx as nx

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario.addressing import ip_int
from hpnlab.fabric.scenario.graph import host_ports, hosts


class Ambiguous(AssertionError):
    """Two entries of different actions match at the same priority."""


@dataclass
class Walk:
    result: str
    where: str
    hops: list = field(default_factory=list)
    delivered_to: tuple | None = None   # (host, interface number)
    packet: dict = field(default_factory=dict)   # the header as it arrived (delivered walks)


class Branch(NamedTuple):
    """One branch of ``FabricTables.walk_branches``: a path and every source port that takes it."""
    sport: int              # one source port that takes it
    mask: int               # the source-port bits some switch on the path looked at
    patterns: frozenset     # the values of those bits that take this path
    walk: Walk

    @property
    def ports(self) -> int:
        """How many of the 2**16 source ports take this path."""
        return len(self.patterns) << (16 - bin(self.mask).count("1"))


def _patterns(mask: int) -> list[int]:
    """Every value of the bits of ``mask`` (the other bits 0)."""
    bits = [b for b in range(16) if mask >> b & 1]
    out = []
    for pattern in range(1 << len(bits)):
        value = 0
        for i, b in enumerate(bits):
            if pattern >> i & 1:
                value |= 1 << b
        out.append(value)
    return out


def _field_of(f: compiler.Flow, k: str) -> tuple | None:
    """(mask or None for the whole value, value) of the entry's match on field ``k``; None when it
    does not match on ``k`` plainly (the host-set match on ipv4_dst is not a plain value)."""
    if f.hosts is not None and k == "ipv4_dst":
        return None
    for kk, v in f.match:
        if kk == k:
            return (v[1], v[0]) if isinstance(v, tuple) else (None, v)
    return None


def _bucket(grp: list, depth: int) -> tuple:
    """(field, mask, {value: node}, entries without it): ``grp`` split by the field (under one mask)
    that leaves the fewest entries to check, each bucket split again while ``depth`` lasts."""
    if depth == 0 or len(grp) < 8:
        return (None, None, {}, grp)
    values: dict[tuple, dict] = {}
    for f in grp:
        for k, _v in f.match:
            got = _field_of(f, k)
            if got is not None:
                values.setdefault((k, got[0]), {}).setdefault(got[1], []).append(f)
    if not values:
        return (None, None, {}, grp)

    def cost(fm: tuple) -> float:
        covered = sum(len(b) for b in values[fm].values())
        return len(grp) - covered + covered / len(values[fm])

    best = min(values, key=lambda fm: (cost(fm), fm[0]))
    if cost(best) >= len(grp):
        return (None, None, {}, grp)
    field_, mask = best
    inside = {id(f) for b in values[best].values() for f in b}
    rest = [f for f in grp if id(f) not in inside]
    return (field_, mask, {val: _bucket(b, depth - 1) for val, b in values[best].items()}, rest)


def _candidates(node: tuple, pkt: dict) -> list:
    """The entries of an index node that ``pkt`` could match."""
    field_, mask, buckets, rest = node
    if field_ is None:
        return rest
    have = pkt.get(field_)
    hit = buckets.get(have if mask is None else have & mask) if have is not None else None
    return _candidates(hit, pkt) + rest if hit is not None else rest


class FabricTables:
    MAX_HOPS = 16

    def __init__(self, g: nx.MultiGraph, states: dict, failures: compiler.Failures | None = None,
                 one_sided: frozenset = frozenset(), not_live: frozenset = frozenset()):
        self.g = g
        self.states = states
        self.failures = failures or compiler.Failures()
        self.one_sided = frozenset(one_sided)
        self.not_live = frozenset(not_live)
        self._groups: dict[str, dict[int, compiler.Group]] = {}       # switches whose groups were replaced
        self.ix = compiler.index_of(g)
        self._tables: dict[str, dict[int, list]] = {}
        self._host_sets: dict[int, frozenset] = {}
        self._entries: dict[str, dict[tuple, compiler.Flow]] = {}     # switches whose tables were replaced
        self._pipeline_cache: dict[tuple, tuple[int | None, tuple]] = {}
        self._sport_mask: dict[str, int] = {}
        # per switch: {table: ((field, mask or None for the whole value), ...)} and the lookups
        # already made, keyed by the packet's fields as that table can see them
        self._table_fields: dict[str, dict[int, tuple]] = {}
        self._lookup_cache: dict[str, dict[tuple, compiler.Flow | None]] = {}
        self._table_index: dict[str, dict[int, list]] = {}
        self._host_port_cache: dict[str, list] = {}
        self._arp_cache: dict[tuple, str | None] = {}
        # (node, port) -> (peer node, peer port, link id)
        self.peer: dict[tuple, tuple] = {}
        for u, v, k, d in g.edges(keys=True, data=True):
            lid = compiler.link_id(u, v, k)
            self.peer[u, d["ports"][u]] = (v, d["ports"][v], lid)
            self.peer[v, d["ports"][v]] = (u, d["ports"][u], lid)
        self._cut = {self.peer[sp][2] for sp in self.one_sided}    # links one end took down

    def reload(self, states: dict, failures: compiler.Failures | None = None) -> None:
        """Walk other compiled tables (another failure's compile) over the same graph: keeps only
        what is read off the graph (ports and peers), forgets every table, group and cache."""
        self.states = states
        self._groups = {}
        self._tables = {}
        self._entries = {}
        self._sport_mask = {}
        self._table_fields = {}
        self._table_index = {}
        self._lookup_cache = {}
        self._arp_cache = {}
        self.failures = failures or compiler.Failures()

    # ---- liveness -------------------------------------------------------------------
    @property
    def failures(self) -> compiler.Failures:
        return self._failures

    @failures.setter
    def failures(self, value: compiler.Failures) -> None:
        """A replay changes the failures as it goes: fast-failover outcomes depend on liveness."""
        self._failures = value
        self._pipeline_cache = {}

    def port_live(self, switch: str, port: int) -> bool:
        """Does ``switch`` see ``port`` live (what its fast-failover groups watch)?"""
        if (switch, port) in self.one_sided or (switch, port) in self.not_live:
            return False
        nxt = self.peer.get((switch, port))
        if nxt is None:
            return False
        peer, _pp, lid = nxt
        return lid not in self.failures.links and peer not in self.failures.switches

    def carries(self, lid: tuple, peer: str) -> bool:
        """Does a packet sent over link ``lid`` reach ``peer``?"""
        return lid not in self.failures.links and lid not in self._cut and peer not in self.failures.switches

    # ---- tables ---------------------------------------------------------------------
    def has_state(self, switch: str) -> bool:
        return switch in self._entries or switch in self.states

    def tables(self, switch: str) -> dict[int, list]:
        t = self._tables.get(switch)
        if t is None:
            t = {}
            flows = self._entries[switch].values() if switch in self._entries else self.states[switch].flows
            mask = 0
            for f in flows:
                t.setdefault(f.table, []).append(f)
                for k, v in f.match:
                    if k == "udp_src" and isinstance(v, tuple):
                        mask |= v[1]
            for entries in t.values():
                entries.sort(key=lambda f: -f.priority)
            self._tables[switch] = t
            self._sport_mask[switch] = mask
            self._table_fields[switch] = {table: self._fields_seen(entries) for table, entries in t.items()}
            self._table_index[switch] = {table: self._index(entries) for table, entries in t.items()}
            self._lookup_cache[switch] = {}
        return t

    @staticmethod
    def _fields_seen(entries: list) -> tuple:
        """((field, mask), ...): the bits of each field that some entry of a table looks at (mask
        None: the whole value). Two packets that agree on these bits match the same entries."""
        seen: dict[str, int | None] = {}
        for f in entries:
            for k, v in f.match:
                if isinstance(v, tuple) and not (f.hosts is not None and k == "ipv4_dst"):
                    if k not in seen or seen[k] is not None:
                        seen[k] = (seen.get(k) or 0) | v[1]
                else:
                    seen[k] = None
        return tuple(sorted(seen.items()))

    @staticmethod
    def _index(entries: list) -> list[tuple]:
        """A table's entries (highest priority first) as [(priority, node)]: per priority, a tree
        that buckets the entries by the value of one field (under one mask), bucket by bucket
        again by another, so that a packet meets only the entries of its buckets (``_candidates``)."""
        return [(prio, _bucket(list(same), 3)) for prio, same in groupby(entries, key=lambda f: f.priority)]

    # ---- replay: tables changed message by message -------------------------------------------
    def _changed(self, switch: str) -> None:
        self._tables.pop(switch, None)
        self._table_fields.pop(switch, None)
        self._table_index.pop(switch, None)
        self._lookup_cache.pop(switch, None)
        self._pipeline_cache = {k: v for k, v in self._pipeline_cache.items() if k[0] != switch}

    def load(self, switch: str, entries: dict | None = None, groups: Iterable[compiler.Group] | None = None) -> None:
        """Give ``switch`` these concrete entries ({(table, priority, match): actions}; none: empty
        tables) and groups (none: no groups)."""
        self._entries[switch] = {k: compiler.Flow(k[0], k[1], k[2], a) for k, a in (entries or {}).items()}
        self._groups[switch] = {gr.group_id: gr for gr in groups or ()}
        self._changed(switch)

    def groups(self, switch: str) -> dict[int, compiler.Group]:
        """{group id: Group} of ``switch``."""
        if switch not in self._groups:
            state = self.states.get(switch)
            self._groups[switch] = {gr.group_id: gr for gr in (state.groups if state is not None else ())}
        return self._groups[switch]

    def set_group(self, switch: str, group: compiler.Group) -> None:
        """Add or change one group (a GroupMod add/modify)."""
        self.groups(switch)[group.group_id] = group
        self._changed(switch)

    def delete_group(self, switch: str, group_id: int) -> None:
        self.groups(switch).pop(group_id, None)
        self._changed(switch)

    def forget(self, switch: str) -> None:
        """``switch`` holds no state any more (it failed)."""
        self._entries.pop(switch, None)
        self._groups.pop(switch, None)
        self.states.pop(switch, None)
        self._changed(switch)

    def group_table(self, switch: str) -> dict[int, compiler.Group]:
        """The groups of ``switch`` by group id: what the replayed messages left, else the compiled ones."""
        return self.groups(switch)

    def entries(self, switch: str) -> dict:
        if switch not in self._entries:
            state = self.states.get(switch)
            flows = state.flows if state is not None else ()
            groups = self.groups(switch).values()
            self.load(switch, {(e.table, e.priority, tuple(sorted(e.match))): e.actions
                               for f in flows for e in f.expand()}, list(groups))
        return {k: f.actions for k, f in self._entries[switch].items()}

    def apply(self, msg) -> None:
        """Apply one reconciler message (FlowMod, GroupMod, WipeTables) to its switch's tables."""
        kind = type(msg).__name__
        if kind not in ("FlowMod", "GroupMod", "WipeTables"):
            raise TypeError(f"not a table change: {msg!r}")
        self.entries(msg.switch)
        table = self._entries[msg.switch]
        groups = self.groups(msg.switch)
        if kind == "WipeTables":
            table.clear()
            groups.clear()
        elif kind == "GroupMod":
            # as a switch does: add needs a new id, modify an existing one; deleting a group deletes
            # the flows that send to it (Open vSwitch)
            if msg.command == "add" and msg.group_id in groups:
                raise AssertionError(f"{msg.switch}: group {msg.group_id} added twice")
            if msg.command == "modify" and msg.group_id not in groups:
                raise AssertionError(f"{msg.switch}: group {msg.group_id} modified before it exists")
            if msg.command == "delete":
                groups.pop(msg.group_id, None)
                for key in [k for k, f in table.items() if ("group", msg.group_id) in f.actions]:
                    del table[key]
            else:
                groups[msg.group_id] = compiler.Group(msg.group_id, msg.kind, msg.buckets)
        elif msg.command == "delete":
            table.pop(msg.key, None)
        else:
            missing = [a[1] for a in msg.actions if a[0] == "group" and a[1] not in groups]
            if missing:     # a switch refuses the flow (OFPBAC_BAD_OUT_GROUP)
                raise AssertionError(f"{msg.switch}: flow {msg.key} sends to group(s) {missing} that do not exist")
            table[msg.key] = compiler.Flow(msg.table, msg.priority, msg.match, msg.actions)
        self._changed(msg.switch)

    def entropy_mask(self) -> int:
        """The union of every source-port mask the entropy tables of all switches look at."""
        mask = 0
        for sw in set(self._entries) | set(self.states):
            self.tables(sw)
            mask |= self._sport_mask[sw]
        return mask

    def entropy_ports(self, base: int = 0xC000, extra_mask: int = 0) -> list[int]:
        """One UDP source port per bit pattern of ``entropy_mask()`` (and ``extra_mask``): walking
        each of them covers every multipath branch of every switch."""
        mask = self.entropy_mask() | extra_mask
        bits = [b for b in range(16) if mask >> b & 1]
        ports = []
        for pattern in range(1 << len(bits)):
            port = base & ~mask
            for i, b in enumerate(bits):
                if pattern >> i & 1:
                    port |= 1 << b
            ports.append(port)
        return ports

    def _matches(self, f: compiler.Flow, pkt: dict) -> bool:
        for k, v in f.match:
            if f.hosts is not None and k == "ipv4_dst":
                hs = self._host_sets.get(id(f.hosts))
                if hs is None:
                    hs = self._host_sets[id(f.hosts)] = frozenset(f.hosts)
                if pkt.get("ipv4_dst") not in hs:
                    return False
                continue
            have = pkt.get(k)
            if have is None:
                return False
            if isinstance(v, tuple):
                if have & v[1] != v[0]:
                    return False
            elif have != v:
                return False
        return True

    def lookup(self, switch: str, table: int, pkt: dict) -> compiler.Flow | None:
        """The entry of ``table`` that ``pkt`` hits (None: a table miss). Remembered per switch
        and table on the bits of the packet that the table's entries look at."""
        self.tables(switch)
        key = (table,) + tuple(None if (have := pkt.get(k)) is None else have if m is None else have & m
                               for k, m in self._table_fields[switch].get(table, ()))
        cache = self._lookup_cache[switch]
        if key in cache:
            return cache[key]
        best = cache[key] = self._scan(switch, table, pkt)
        return best

    def _scan(self, switch: str, table: int, pkt: dict) -> compiler.Flow | None:
        best = None
        for _prio, node in self._table_index[switch].get(table, ()):
            if best is not None:        # found at a higher priority
                break
            for f in _candidates(node, pkt):
                if self._matches(f, pkt):
                    if best is None:
                        best = f
                    elif f.actions != best.actions:
                        raise Ambiguous(f"{switch} table {table}: {compiler.describe_flow(best)} and "
                                        f"{compiler.describe_flow(f)} both match {pkt}")
        return best

    # ---- walking ----------------------------------------------------------------------
    def packet(self, src: str, dst: str, plane: int, *, src_rail: int | None = None,
               dst_rail: int | None = None, proto: str = "udp", sport: int = 49152, dport: int = 4791) -> tuple:
        """(source interface, packet fields) for src -> dst on a plane (first rail by default)."""
        s = self._port(src, plane, src_rail)
        d = self._port(dst, plane, dst_rail)
        pkt = {"eth_type": compiler.ETH_IPV4, "eth_src": s.get("mac"), "ipv4_src": ip_int(s["ip"]),
               "ipv4_dst": ip_int(d["ip"])}
        mac = self.arp_mac(src, s["intf"], d["ip"])
        if mac is not None:
            pkt["eth_dst"] = mac
        if proto == "udp":
            pkt.update(ip_proto=compiler.PROTO_UDP, udp_src=sport, udp_dst=dport)
        elif proto == "tcp":
            pkt.update(ip_proto=compiler.PROTO_TCP, tcp_src=sport, tcp_dst=dport)
        else:
            pkt.update(ip_proto=1)
        return s, pkt

    def _port(self, host: str, plane: int, rail: int | None) -> dict:
        ports = [p for p in self._host_ports(host) if p["plane"] == plane and (rail is None or p["rail"] == rail)]
        if not ports:
            raise KeyError(f"{host} has no port on plane {plane} rail {rail}")
        return ports[0]

    def arp_mac(self, host: str, intf: int, target_ip: str | int) -> str | None:
        """The MAC ``host`` learns for ``target_ip`` by ARP out of interface ``intf``: the reply of
        its leaf's responder flows (None when the tables leave the request to the controller)."""
        key = (host, intf, ip_int(target_ip) if isinstance(target_ip, str) else target_ip)
        if key not in self._arp_cache:
            me = next(p for p in self._host_ports(host) if p["intf"] == intf)
            walk = self.inject(host, intf, {"eth_type": compiler.ETH_ARP, "eth_src": me["mac"],
                                            "eth_dst": "ff:ff:ff:ff:ff:ff", "arp_op": compiler.ARP_REQUEST,
                                            "arp_sha": me["mac"], "arp_spa": ip_int(me["ip"]),
                                            "arp_tha": "00:00:00:00:00:00", "arp_tpa": key[2]})
            reply = walk.packet
            ok = (walk.result == "delivered" and walk.delivered_to == (host, intf)
                  and reply.get("arp_op") == compiler.ARP_REPLY and reply.get("arp_spa") == key[2])
            self._arp_cache[key] = reply.get("arp_sha") if ok else None
        return self._arp_cache[key]

    def _host_ports(self, host: str) -> list:
        ports = self._host_port_cache.get(host)
        if ports is None:
            ports = self._host_port_cache[host] = host_ports(self.g, host)
        return ports

    def send(self, src: str, dst: str, plane: int, **kw) -> Walk:
        sport, pkt = self.packet(src, dst, plane, **kw)
        return self.inject(src, sport["intf"], pkt)

    def send_branches(self, src: str, dst: str, plane: int, **kw) -> list[tuple[int, int, Walk]]:
        """Every entropy branch of a UDP packet src -> dst: [(source port, fixed mask, walk)].

        Each walk stands for every source port that agrees with its port on ``fixed mask``:
        a walk is split wherever a switch on its path looks at source-port bits not fixed
        yet, until every switch it crosses looks only at fixed bits. So every bit pattern of
        every switch's entropy table is taken, without walking all 2**bits ports."""
        kw.pop("sport", None)
        out = []
        stack = [(0xC000, 0)]
        while stack:
            sport, fixed = stack.pop()
            walk = self.send(src, dst, plane, sport=sport, **kw)
            seen = 0
            for hop in walk.hops:
                self.tables(hop[0])
                seen |= self._sport_mask[hop[0]]
            new = seen & ~fixed
            if not new:
                out.append((sport, fixed, walk))
                continue
            bits = [b for b in range(16) if new >> b & 1]
            for pattern in range(1 << len(bits)):
                value = sport & ~new
                for i, b in enumerate(bits):
                    if pattern >> i & 1:
                        value |= 1 << b
                stack.append((value, fixed | new))
        return out

    def walk_branches(self, src: str, dst: str, plane: int, **kw) -> list[Branch]:
        """Every path a UDP packet src -> dst can take, whatever its source port: the same cover as
        ``send_branches``, walked as a tree. A walk goes on as one branch while every source port it
        stands for is sent the same way; at a switch whose tables look at bits of the source port
        (its entropy table), the patterns of those bits -- each looked up by that switch's tables --
        that it sends one way go on together, one branch per way. So a branch is a path, and its
        ``patterns`` are every value of the bits looked at on the way (``mask``) that takes it: the
        branches' patterns partition all 2**16 source ports (``Branch.ports``)."""
        kw.pop("sport", None)
        base = 0xC000
        sport, pkt = self.packet(src, dst, plane, sport=base, **kw)
        out: list[Branch] = []
        # (node, port, packet, mask looked at, patterns under it, hops, states met)
        stack: list[tuple[str, int, dict, int, frozenset, list, set]] = [
            (src, sport["intf"], pkt, 0, frozenset([0]), [], set())]
        while stack:
            node, port, pkt, fixed, patterns, hops, seen = stack.pop()
            while True:
                step = self._arrive(node, port, pkt, hops)
                if isinstance(step, Walk):
                    out.append(Branch(pkt["udp_src"], fixed, patterns, step))
                    break
                peer, peer_port = step
                mask = self._sport_mask[peer]
                new = mask & ~fixed
                if new:
                    patterns = frozenset(v | b for v in patterns for b in _patterns(new))
                    fixed |= new
                ways: dict[tuple, set[int]] = {}
                if mask:
                    looked: dict[int, tuple] = {}
                    probe = dict(pkt, in_port=peer_port)
                    for v in patterns:
                        key = v & mask
                        way = looked.get(key)
                        if way is None:
                            probe["udp_src"] = (base & ~fixed) | v
                            way = looked[key] = self._pipeline(peer, probe)
                        ways.setdefault(way, set()).add(v)
                if len(ways) > 1:
                    for vs in ways.values():
                        rep = min(vs)
                        stack.append((node, port, dict(pkt, udp_src=(base & ~fixed) | rep), fixed, frozenset(vs),
                                      list(hops), set(seen)))
                    break
                pkt = dict(pkt, udp_src=(base & ~fixed) | min(patterns))
                done = self._forward(peer, peer_port, pkt, hops, seen)
                if isinstance(done, Walk):
                    out.append(Branch(pkt["udp_src"], fixed, patterns, done))
                    break
                node, port, pkt = peer, done[0], done[1]
                if len(hops) >= self.MAX_HOPS:
                    out.append(Branch(pkt["udp_src"], fixed, patterns,
                                      Walk("loop", f"more than {self.MAX_HOPS} hops", hops)))
                    break
        return out

    def _arrive(self, node: str, port: int, pkt: dict, hops: list) -> Walk | tuple[str, int]:
        """A packet sent out of ``node``'s ``port``: the walk's end (a dead link, a host), or the
        switch and port it arrives at."""
        nxt = self.peer.get((node, port))
        if nxt is None:
            return Walk("dropped", f"{node} port {port}: not connected", hops)
        peer, peer_port, lid = nxt
        if not self.carries(lid, peer):
            return Walk("dropped", f"{node} port {port}: link to {peer} is down", hops)
        if self.g.nodes[peer]["tier"] == 0:
            me = next((p for p in self._host_ports(peer) if p["intf"] == peer_port), None)
            arp = pkt.get("eth_type") == compiler.ETH_ARP
            to = pkt.get("arp_tpa", 0) if arp else pkt.get("ipv4_dst")
            if me is None or ip_int(me["ip"]) != to:
                return Walk("dropped", f"{peer} intf {peer_port}: not its address", hops, (peer, peer_port))
            if pkt.get("eth_dst", me["mac"]) not in (me["mac"], "ff:ff:ff:ff:ff:ff"):
                return Walk("dropped", f"{peer} intf {peer_port}: Ethernet destination {pkt['eth_dst']} is not "
                            f"its MAC {me['mac']}", hops, (peer, peer_port))
            return Walk("delivered", f"{peer} intf {peer_port}", hops, (peer, peer_port), dict(pkt))
        if not self.has_state(peer):
            return Walk("dropped", f"{peer}: no state (switch failed)", hops)
        self.tables(peer)
        return peer, peer_port

    def _forward(self, peer: str, peer_port: int, pkt: dict, hops: list, seen: set) -> Walk | tuple[int, dict]:
        """``peer``'s pipeline for ``pkt`` in at ``peer_port``: the walk's end (a drop, a loop), or
        the port it goes out of and the header it leaves with (``hops`` and ``seen`` updated)."""
        p = dict(pkt, in_port=peer_port)
        state = (peer, peer_port, pkt.get("eth_src"))
        out, changes = self._pipeline(peer, p)
        if changes:
            pkt = dict(pkt, **dict(changes))
        # a switch met again in the same state (same port in, same header) forwards the
        # same way again: a loop. (A detour may cross a switch twice, from another port.)
        if state in seen:
            hops.append((peer, peer_port, out))
            return Walk("loop", f"{peer} visited twice from port {peer_port}", hops)
        seen.add(state)
        hops.append((peer, peer_port, out))
        if out is None:
            return Walk("dropped", f"{peer}: no route / drop", hops)
        return out, pkt

    def inject(self, host: str, intf: int, pkt: dict) -> Walk:
        """Send ``pkt`` out of a host interface and follow it."""
        hops: list = []
        node, port = host, intf
        seen: set = set()
        if pkt.get("eth_type") == compiler.ETH_ARP:
            pkt = dict(pkt, **{k: ip_int(pkt[k]) for k in ("arp_spa", "arp_tpa") if isinstance(pkt.get(k), str)})
        for _ in range(self.MAX_HOPS):
            step = self._arrive(node, port, pkt, hops)
            if isinstance(step, Walk):
                return step
            peer, peer_port = step
            done = self._forward(peer, peer_port, pkt, hops, seen)
            if isinstance(done, Walk):
                return done
            node, (port, pkt) = peer, done
        return Walk("loop", f"more than {self.MAX_HOPS} hops", hops)

    def _pipeline(self, switch: str, pkt: dict) -> tuple[int | None, tuple]:
        """(output port of ``switch`` for ``pkt`` (None: dropped or sent to the controller), fields
        it set). Cached per switch on the fields its tables can look at."""
        tables = self.tables(switch)
        sport = pkt.get("udp_src", pkt.get("tcp_src", 0)) & self._sport_mask[switch]
        key = (switch, pkt.get("in_port"), pkt.get("eth_src"), pkt.get("ipv4_dst"), pkt.get("ipv4_src"),
               pkt.get("ip_proto"), "udp_src" in pkt, sport, pkt.get("eth_type"), pkt.get("arp_op"), pkt.get("arp_tpa"),
               pkt.get("arp_spa"))
        if key not in self._pipeline_cache:
            self._pipeline_cache[key] = self._run_pipeline(switch, tables, pkt)
        return self._pipeline_cache[key]

    def _run_pipeline(self, switch: str, tables: dict, pkt: dict) -> tuple[int | None, tuple]:
        table = 0
        changes: list = []
        for _ in range(8):
            f = self.lookup(switch, table, pkt)
            if f is None:
                return None, ()
            out, goto = self.apply_entry(switch, table, f, pkt, changes)
            if out is not None:
                return out, tuple(changes)
            if goto is None:
                return None, ()
            table = goto
        return None, ()

    def apply_entry(self, switch: str, table: int, f: compiler.Flow, pkt: dict,
                    changes: list) -> tuple[int | None, int | None]:
        """Apply one entry's actions to ``pkt`` (set-fields also appended to ``changes``):
        (port, None) when it outputs, (None, table) when the pipeline goes on at a later table,
        (None, None) when the packet is dropped (no output, a group with no live bucket, a
        packet-in, or a goto that does not go forward)."""
        goto = out = None
        for act in f.actions:
            if act[0] == "metadata":
                pkt["metadata"] = act[1]
            elif act[0] == "goto":
                goto = act[1]
            elif act[0] == "output":
                out = self._out_port(pkt, act[1])
                if out is None:
                    return None, None
            elif act[0] == "set_field":
                self._set_field(pkt, act[1], act[2], changes)
            elif act[0] == "move":
                pkt[act[2]] = pkt.get(act[1])
                changes.append((act[2], pkt[act[2]]))
            elif act[0] == "group":
                out = self.group_output(switch, act[1], pkt, changes)
                if out is None:
                    return None, None
            elif act[0] == "controller":
                return None, None
        if out is not None:
            return out, None
        if goto is None or goto <= table:
            return None, None
        return None, goto

    @staticmethod
    def _out_port(pkt: dict, port: int) -> int | None:
        """Where an output to ``port`` goes: OFPP_IN_PORT is the port the packet came in on; any
        other port that is the ingress port sends nothing (None): OpenFlow does not send a packet
        back that way unless told to by OFPP_IN_PORT (Open vSwitch: "skipping output to input
        port"), or unless in_port was set to another value first."""
        if port == compiler.OFPP_IN_PORT:
            return pkt.get("in_port")
        return None if port == pkt.get("in_port") else port

    @staticmethod
    def _set_field(pkt: dict, name: str, value, changes: list | None) -> None:
        """A set-field on ``pkt``; recorded in ``changes`` unless it is in_port (the switch's own
        view: the next hop has its own)."""
        pkt[name] = value
        if changes is not None and name != "in_port":
            changes.append((name, value))

    def group_output(self, switch: str, group_id: int, pkt: dict | None = None,
                     changes: list | None = None) -> int | None:
        """The port a group forwards to now (None: no live bucket, or a bucket that drops); the
        bucket's set-fields apply to ``pkt`` (and are added to ``changes``) before its output."""
        gr = self.groups(switch).get(group_id)
        if gr is None:
            raise KeyError(f"{switch}: a flow refers to group {group_id}, which does not exist")
        if gr.kind == "ff":
            bucket = next((b for b in gr.buckets if self.watch_live(switch, b[0])), None)
        elif gr.kind == "indirect":
            bucket = gr.buckets[0]
        else:
            raise NotImplementedError(f"{switch}: group kind {gr.kind!r} is not interpreted")
        if bucket is None:
            return None
        pkt = dict(pkt or {})
        for act in bucket[1]:
            if act[0] == "set_field":
                self._set_field(pkt, act[1], act[2], changes)
            elif act[0] == "output":
                return self._out_port(pkt, act[1])
            elif act[0] == "group":
                return self.group_output(switch, act[1], pkt, changes)
        return None

    def watch_live(self, switch: str, watch, depth: int = 0) -> bool:
        """Is a fast-failover bucket's watch live: a port (``port_live``), or ("group", id), a group
        with a live bucket (an indirect group's one bucket is always live)?"""
        if isinstance(watch, tuple):
            gr = self.groups(switch).get(watch[1])
            if gr is None or depth > 8:
                return False
            return gr.kind != "ff" or any(self.watch_live(switch, b[0], depth + 1) for b in gr.buckets)
        return watch is not None and self.port_live(switch, watch)

    # ---- all pairs ------------------------------------------------------------------------
    def all_pairs(self, planes: list[int] | None = None) -> list[tuple]:
        """Every (src, dst, plane, src_rail, dst_rail) of distinct hosts on each plane, rail 0 to every rail."""
        hs = hosts(self.g)
        ports = {h: self._host_ports(h) for h in hs}
        out = []
        all_planes = sorted({p["plane"] for h in hs for p in ports[h]})
        for plane in planes or all_planes:
            for s in hs:
                sp = [p for p in ports[s] if p["plane"] == plane]
                for d in hs:
                    if d == s:
                        continue
                    for dp in ports[d]:
                        if dp["plane"] == plane:
                            out.append((s, d, plane, sp[0]["rail"], dp["rail"]))
        return out

    def live(self, host: str, plane: int, rail: int) -> bool:
        """A host port is live when its link and its leaf are up."""
        p = self._port(host, plane, rail)
        lid = self.peer[host, p["intf"]][2]
        return lid not in self.failures.links and lid not in self._cut and p["leaf"] not in self.failures.switches


def valley_free_reachable(g: nx.MultiGraph, failures: compiler.Failures, src_leaf: str, dst_leaf: str,
                          cache: dict | None = None) -> bool:
    """Oracle, independent of the compiler: is there a live path that goes only up from
    ``src_leaf``, then at most one long-haul (same-tier) hop, then only down to ``dst_leaf``?

    ``cache`` (a dict the caller keeps, for many pairs of one graph) keeps each switch's
    upward and sideways links, and each leaf's closures while ``failures`` stays the same."""
    dead_l, dead_s = failures.links, failures.switches
    if src_leaf in dead_s or dst_leaf in dead_s:
        return False
    if cache is None:
        cache = {}
    if cache.get("graph") is not g:
        cache.clear()
        cache.update(graph=g, links={})
    if cache.get("failures") != failures:
        cache.update(failures=failures, closures={})
    node, adj = g._node, g._adj      # the raw dicts: this runs per pair at 130k scale
    links, closures = cache["links"], cache["closures"]

    def neighbours(n: str, way: str):
        """Live switches above ``n`` (way "up") or beside it ("side")."""
        mine = links.get(n)
        if mine is None:
            tn = node[n]["tier"]
            above: list[tuple[str, tuple]] = []
            beside: list[tuple[str, tuple]] = []
            for v, keys in adj[n].items():
                tv = node[v]["tier"]
                if tv > tn:
                    above.append((v, tuple(keys)))
                elif tv == tn and tv > 0:
                    beside.append((v, tuple(keys)))
            mine = links[n] = {"up": above, "side": beside}
        for v, keys in mine[way]:
            if v not in dead_s and any(compiler.link_id(n, v, k) not in dead_l for k in keys):
                yield v

    def up_closure(start: str) -> set:
        seen = closures.get(start)
        if seen is None:
            seen, stack = {start}, [start]
            while stack:
                n = stack.pop()
                for v in neighbours(n, "up"):
                    if v not in seen:
                        seen.add(v)
                        stack.append(v)
            closures[start] = seen
        return seen

    up = up_closure(src_leaf)
    up = up | {v for n in up for v in neighbours(n, "side")}
    down_to_dst = up_closure(dst_leaf)    # going up from dst = going down to it
    return bool(up & down_to_dst)
