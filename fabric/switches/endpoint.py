"""Simulated OpenFlow 1.3 switches, message by message, with no socket: ``Switch.receive(bytes)`` returns the
replies (bytes) a switch sends; ``Fabric`` holds every switch of a scenario (or a subset), their ports and
cabling, and turns injected failures into PortStatus messages.

The tables' decisions are ``tables.Tables``'s; the encoding is ``wire``'s; the sockets are ``server``'s.
Messages are answered in the order they arrive, so a barrier's reply follows every reply to what came before
it (OpenFlow's barrier guarantee holds trivially: each message is applied before the next is read).
Frames a PacketOut sends out of a switch port (LLDP) reach the switch cabled to it, which hands them to its
controller when it holds a table-0 entry sending that EtherType to the controller (the LLDP rule).
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from os_ken.ofproto import ofproto_v1_3 as ofp

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph as fgraph

from . import tables, wire

ETH_LLDP = 0x88CC
OFPP_CONTROLLER = ofp.OFPP_CONTROLLER


def port_mac(dpid: int, port: int) -> str:
    """A port's hardware address: locally administered, from the datapath id and port number."""
    value = (0x02 << 40) | ((dpid & 0xFFFFFF) << 16) | (port & 0xFFFF)
    return ":".join(f"{(value >> s) & 0xFF:02x}" for s in range(40, -8, -8))


@dataclass
class Counters:
    received: int = 0
    flow_mods: int = 0
    group_mods: int = 0
    errors: int = 0
    barriers: int = 0
    first_at: float | None = None       # time.time() of the first message (after the handshake)
    changed_at: float | None = None     # of the last FlowMod/GroupMod
    barrier_at: float | None = None     # of the last barrier answered
    reads: int = 0                      # flow stats requests answered (a controller reading the tables back)
    read_at: float | None = None        # of the last one

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Switch:
    """One switch: its datapath id, ports (number -> (name, up)), tables, and what it has been sent."""

    def __init__(self, name: str, dpid: int, ports: dict[int, str], flow_limit: int = 100_000,
                 group_limit: int = 65_536):
        self.name = name
        self.dpid = dpid
        self.port_names = dict(ports)
        self.up = dict.fromkeys(ports, True)
        self.tables = tables.Tables(flow_limit, group_limit)
        self.counters = Counters()
        self.config = (0, 0xFFFF)
        self.frames_out: list[tuple[int, bytes]] = []     # (port, frame) sent by PacketOuts, for the fabric

    # ---- ports ------------------------------------------------------------------------------------
    def desc(self, port: int) -> tuple:
        return wire.port(port, self.port_names[port], port_mac(self.dpid, port), self.up[port])

    def set_port(self, port: int, up: bool) -> bytes | None:
        """The port goes up or down: the PortStatus the switch sends (None: no change)."""
        if port not in self.up or self.up[port] == up:
            return None
        self.up[port] = up
        return wire.port_status(ofp.OFPPR_MODIFY, self.desc(port))

    # ---- messages ---------------------------------------------------------------------------------
    def receive(self, msg: bytes, now: float | None = None) -> list[bytes]:
        """The replies to one message (a whole OpenFlow message, header included)."""
        _version, msg_type, _length, xid = wire.header(msg)
        now = time.time() if now is None else now
        c = self.counters
        c.received += 1
        if msg_type == ofp.OFPT_HELLO:
            return []
        if c.first_at is None:
            c.first_at = now
        if msg_type == ofp.OFPT_ECHO_REQUEST:
            return [wire.echo_reply(xid, bytes(msg[wire.HEADER:]))]
        if msg_type == ofp.OFPT_FEATURES_REQUEST:
            return [wire.features_reply(xid, self.dpid)]
        if msg_type == ofp.OFPT_SET_CONFIG:
            self.config = struct.unpack_from(ofp.OFP_SWITCH_CONFIG_PACK_STR, msg, wire.HEADER)
            return []
        if msg_type == ofp.OFPT_GET_CONFIG_REQUEST:
            return [wire.get_config_reply(xid, *self.config)]
        if msg_type == ofp.OFPT_BARRIER_REQUEST:
            c.barriers += 1
            c.barrier_at = now
            return [wire.barrier_reply(xid)]
        if msg_type == ofp.OFPT_FLOW_MOD:
            c.flow_mods += 1
            c.changed_at = now
            return self._refused(xid, msg, self.tables.flow_mod(wire.flow_mod(msg)))
        if msg_type == ofp.OFPT_GROUP_MOD:
            c.group_mods += 1
            c.changed_at = now
            return self._refused(xid, msg, self.tables.group_mod(wire.group_mod(msg)))
        if msg_type == ofp.OFPT_MULTIPART_REQUEST:
            return self._multipart(xid, msg)
        if msg_type == ofp.OFPT_PACKET_OUT:
            _in_port, ports, frame = wire.packet_out(msg)
            self.frames_out += [(p, frame) for p in ports if p in self.up]
            return []
        if msg_type == ofp.OFPT_ROLE_REQUEST:
            return self._refused(xid, msg, "bad_type")   # roles: not simulated yet
        return self._refused(xid, msg, "bad_type")

    def _refused(self, xid: int, msg: bytes, err: str | None) -> list[bytes]:
        if err is None:
            return []
        self.counters.errors += 1
        return [wire.error(xid, err, msg)]

    def _multipart(self, xid: int, msg: bytes) -> list[bytes]:
        mp_type, _flags = wire.multipart_request(msg)
        if mp_type == ofp.OFPMP_PORT_DESC:
            return wire.multipart_replies(xid, mp_type, [wire.port_desc_entry(self.desc(p)) for p in sorted(self.up)])
        if mp_type == ofp.OFPMP_FLOW:
            self.counters.reads += 1
            self.counters.read_at = time.time()
            sel = wire.flow_stats_request(msg)
            keys = self.tables.select(sel["table"], sel["match"], cookie=sel["cookie"],
                                      cookie_mask=sel["cookie_mask"], out_port=sel["out_port"],
                                      out_group=sel["out_group"])
            flows = self.tables.flows
            return wire.multipart_replies(xid, mp_type, [wire.flow_stats_entry(k[0], k[1], flows[k]) for k in keys])
        if mp_type == ofp.OFPMP_GROUP_DESC:
            return wire.multipart_replies(xid, mp_type, [wire.group_desc_entry(gid, g.kind, g.body)
                                                         for gid, g in sorted(self.tables.groups.items())])
        if mp_type == ofp.OFPMP_GROUP:
            users = self.tables._users
            return wire.multipart_replies(xid, mp_type, [
                wire.group_stats_entry(gid, len(users.get(gid, ())), 0) for gid in sorted(self.tables.groups)])
        if mp_type == ofp.OFPMP_GROUP_FEATURES:
            return wire.multipart_replies(xid, mp_type, [wire.group_features_body()])
        if mp_type == ofp.OFPMP_PORT_STATS:
            return wire.multipart_replies(xid, mp_type, [])
        return self._refused(xid, msg, "bad_multipart")

    def sends_to_controller(self, eth_type: int) -> int | None:
        """The cookie of a table-0 entry that sends frames of ``eth_type`` to the controller (None: none)."""
        for (table, _prio, match), e in self.tables.flows.items():
            if table == 0 and ("eth_type", eth_type) in match and OFPP_CONTROLLER in e.outputs:
                return e.cookie
        return None

    # ---- what it holds, as the compiler's values --------------------------------------------------
    def state(self) -> compiler.SwitchState:
        """What the switch holds as a compiler.SwitchState (flows one by one, groups decoded)."""
        flows = tuple(compiler.Flow(t, p, wire.compiler_match(e.match_body), wire.compiler_actions(e.instructions_body))
                      for (t, p, _m), e in sorted(self.tables.flows.items(), key=lambda kv: (kv[0][0], -kv[0][1])))
        groups = tuple(compiler.Group(gid, g.kind, wire.compiler_buckets(g.kind, g.body))
                       for gid, g in sorted(self.tables.groups.items()))
        return compiler.SwitchState(self.name, self.dpid, flows, groups)


@dataclass
class Fabric:
    """The simulated switches of one scenario: ``switches`` (a subset of the graph's), their cabling."""
    graph: nx.MultiGraph
    switches: dict[str, Switch]
    peer: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    links_down: set = field(default_factory=set)        # (u, v, key) as the graph has them
    switches_down: set = field(default_factory=set)

    @classmethod
    def of(cls, g: nx.MultiGraph, names: list[str] | None = None, flow_limit: int = 100_000,
           group_limit: int = 65_536) -> Fabric:
        names = fgraph.switches(g) if names is None else names
        ports: dict[str, dict[int, str]] = {n: {} for n in names}
        peer = {}
        for u, v, _k, d in g.edges(keys=True, data=True):
            pu, pv = d["ports"][u], d["ports"][v]
            peer[u, pu] = (v, pv)
            peer[v, pv] = (u, pu)
            for n, p in ((u, pu), (v, pv)):
                if n in ports:
                    ports[n][p] = f"{n}-eth{p}"
        made = {n: Switch(n, g.nodes[n]["dpid"], ports[n], flow_limit, group_limit) for n in names}
        return cls(g, made, peer)

    def _links(self, a: str, b: str) -> list[tuple]:
        if a not in self.graph or b not in self.graph or not self.graph.has_edge(a, b):
            raise UserError(f"no link between {a!r} and {b!r} in {self.graph.graph['scenario'].name}")
        return [(a, b, k) for k in self.graph[a][b]]

    def set_link(self, a: str, b: str, up: bool) -> list[tuple[str, bytes]]:
        """Every link between ``a`` and ``b`` goes down (up): the PortStatus each simulated end sends."""
        out = []
        for u, v, k in self._links(a, b):
            (self.links_down.discard if up else self.links_down.add)((u, v, k))
            d = self.graph.edges[u, v, k]
            for n in (u, v):
                sw = self.switches.get(n)
                other = v if n == u else u
                live = up and other not in self.switches_down
                msg = sw.set_port(d["ports"][n], live) if sw is not None and n not in self.switches_down else None
                if msg is not None:
                    out.append((n, msg))
        return out

    def set_switch(self, name: str, up: bool) -> list[tuple[str, bytes]]:
        """A switch fails (or returns): its neighbours' ports towards it go down (up): their PortStatus. The
        switch's own connection is the server's to drop; a returning switch comes back with empty tables."""
        if name not in self.switches:
            raise UserError(f"no simulated switch {name!r} (switches look like {', '.join(sorted(self.switches)[:3])})")
        (self.switches_down.discard if up else self.switches_down.add)(name)
        if not up:
            self.switches[name].tables.wipe()
        out = []
        for nb in self.graph[name]:
            for k, d in self.graph[name][nb].items():
                lid = (name, nb, k) if (name, nb, k) in self.graph.edges else (nb, name, k)
                sw = self.switches.get(nb)
                if sw is None or nb in self.switches_down:
                    continue
                live = up and tuple(lid) not in self.links_down
                msg = sw.set_port(d["ports"][nb], live)
                if msg is not None:
                    out.append((nb, msg))
        me = self.switches[name]
        for port in me.up:        # its own ports, as it will report them when it reconnects
            other = self.peer.get((name, port))
            me.up[port] = other is None or other[0] not in self.switches_down
        return out

    def deliver(self, name: str) -> list[tuple[str, bytes]]:
        """The frames ``name``'s PacketOuts sent, delivered: the PacketIns their peers send (LLDP rule held)."""
        sw = self.switches[name]
        frames, sw.frames_out = sw.frames_out, []
        out = []
        for port, frame in frames:
            if not sw.up.get(port) or len(frame) < 14:
                continue
            other = self.peer.get((name, port))
            if other is None or other[0] not in self.switches or other[0] in self.switches_down:
                continue
            peer = self.switches[other[0]]
            eth_type = struct.unpack_from("!H", frame, 12)[0]
            cookie = peer.sends_to_controller(eth_type)
            if cookie is not None and peer.up.get(other[1]):
                out.append((other[0], wire.packet_in(other[1], frame, cookie)))
        return out

    def command(self, line: str) -> tuple[list[tuple[str, bytes]], dict[str, bool]]:
        """One control command: ``link down|up A B``, ``switch down|up S``. (The PortStatus to send, the
        switches whose connection must drop (False) or return (True).) UserError for anything else."""
        words = line.split()
        if len(words) == 4 and words[0] == "link" and words[1] in ("down", "up"):
            return self.set_link(words[2], words[3], words[1] == "up"), {}
        if len(words) == 3 and words[0] == "switch" and words[1] in ("down", "up"):
            up = words[1] == "up"
            return self.set_switch(words[2], up), {words[2]: up}
        raise UserError(f"unknown command {line.strip()!r}: use 'link down A B', 'link up A B', 'switch down S', "
                        f"'switch up S', 'stats' or 'dump DIR'")

    def states(self) -> dict[str, compiler.SwitchState]:
        """What every live simulated switch holds, as the compiler's values (the proofs' ``states``)."""
        return {n: sw.state() for n, sw in self.switches.items() if n not in self.switches_down}

    def stats(self) -> dict[str, Any]:
        return {n: {**sw.counters.as_dict(), "flows": len(sw.tables.flows), "groups": len(sw.tables.groups)}
                for n, sw in self.switches.items()}


def parse_numbers(text: str, what: str) -> list[int]:
    """``0,2,4-7`` -> [0, 2, 4, 5, 6, 7] (UserError, one line, for anything else)."""
    out: list[int] = []
    for part in text.split(","):
        a, sep, b = part.strip().partition("-")
        try:
            lo = int(a)
            hi = int(b) if sep else lo
        except ValueError:
            raise UserError(f"--{what} {text!r}: give numbers and ranges, e.g. 0,2,4-7") from None
        if lo < 0 or hi < lo:
            raise UserError(f"--{what} {text!r}: {part!r} is not a range of numbers from 0 up")
        out += range(lo, hi + 1)
    return sorted(set(out))


def select(g: nx.MultiGraph, planes: list[int] | None = None, pods: list[int] | None = None) -> list[str]:
    """The switches of ``planes`` and ``pods`` (None: all); a switch with no plane (pod) attribute, as a
    core of a design without planes, is kept. UserError when nothing is left."""
    names = []
    for n in fgraph.switches(g):
        d = g.nodes[n]
        if planes is not None and d.get("plane") is not None and d["plane"] not in planes:
            continue
        if pods is not None and d.get("pod") is not None and d["pod"] not in pods:
            continue
        names.append(n)
    if not names:
        have_planes = sorted({g.nodes[n].get("plane") for n in fgraph.switches(g)} - {None})
        have_pods = sorted({g.nodes[n].get("pod") for n in fgraph.switches(g)} - {None})
        raise UserError(f"no switch of {g.graph['scenario'].name} is in planes {planes} and pods {pods} "
                        f"(it has planes {have_planes}, pods {have_pods})")
    return names
