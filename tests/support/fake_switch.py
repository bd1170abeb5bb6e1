"""The os-ken app on fake datapaths (the idea of Faucet's app smoke test): no root, no switch.

The app class is instantiated as the launcher does (from a configuration file, controller/conf.py), fed
real os-ken event objects (built with os-ken's own ofproto_v1_3 and ofproto_v1_3_parser) around fake
datapaths that record every message the app sends (each serialised, as on the wire). ``Fabric`` cables
fake datapaths as a graph says, so that LLDP sent out of a port comes back as a packet-in at its peer.

Import after ``pytest.importorskip("os_ken")`` (this module imports os-ken); the fixtures ``app`` and
``make_app`` are in ``support.controller_app`` (registered in tests/conftest.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from os_ken.controller import ofp_event
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from hpnlab.controller import codec
from hpnlab.fabric.scenario import graph, spec


class FakeDatapath:
    """Records what the app sends; hands out xids as os-ken's Datapath does."""

    def __init__(self, dpid: int):
        self.id = dpid
        self.ofproto = ofp
        self.ofproto_parser = parser
        self.xid = 0
        self.sent: list = []

    def set_xid(self, msg) -> int:
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid

    def send_msg(self, msg, close_socket: bool = False) -> None:
        if msg.xid is None:
            self.set_xid(msg)
        msg.serialize()          # must encode as a real switch would receive it
        self.sent.append(msg)

    def take(self) -> list:
        out, self.sent = self.sent, []
        return out


def controller_app(directory: Path, **settings: Any):
    """The app, started from a configuration file in ``directory`` with these settings (the config file's
    keys, e.g. ``on_miswire="off"``; the scenario defaults to mini-hpn), as the launcher starts it."""
    from hpnlab.controller.app import HpnController
    path = Path(directory) / "controller.yaml"
    path.write_text(yaml.safe_dump({"scenario": "mini-hpn", **settings}))
    return HpnController(hpnlab_config=str(path))


def dpids(scenario: str = "mini-hpn") -> dict[str, int]:
    g = graph.build(spec.load(scenario))
    return {n: d["dpid"] for n, d in g.nodes(data=True) if d["tier"] > 0}


def features(app, dp) -> list:
    """``dp`` connects (its switch features): what the app sends it."""
    app.on_features(ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(dp, datapath_id=dp.id)))
    return dp.take()


def answer_barriers(app, dps: dict, wire: list | None = None) -> list:
    """Answer every barrier request sent so far, and the ones those answers cause, until none is left;
    a request for the flows or groups a switch holds is answered with none (a fresh switch); return
    every other message sent meanwhile. ``wire``: gets every message sent, requests included, in order."""
    other: list = []
    while True:
        pending = [(dp, m) for dp in dps.values() for m in dp.take()]
        if not pending:
            return other
        if wire is not None:
            wire += [m for _, m in pending]
        for dp, m in pending:
            if isinstance(m, parser.OFPBarrierRequest):
                reply = parser.OFPBarrierReply(dp)
                reply.set_xid(m.xid)
                app.on_barrier_reply(ofp_event.EventOFPBarrierReply(reply))
            elif isinstance(m, parser.OFPFlowStatsRequest):
                answer_flow_stats(app, dp, m, [])
            elif isinstance(m, parser.OFPGroupDescStatsRequest):
                answer_group_desc(app, dp, m, [])
            else:
                other.append((dp, m))


def answer_flow_stats(app, dp, request, body: list) -> None:
    reply = parser.OFPFlowStatsReply(dp, type_=ofp.OFPMP_FLOW, flags=0, body=body)
    reply.set_xid(request.xid)
    app.on_flow_stats(ofp_event.EventOFPFlowStatsReply(reply))


def answer_group_desc(app, dp, request, body: list) -> None:
    reply = parser.OFPGroupDescStatsReply(dp, type_=ofp.OFPMP_GROUP_DESC, flags=0, body=body)
    reply.set_xid(request.xid)
    app.on_group_desc(ofp_event.EventOFPGroupDescStatsReply(reply))


def connect_all(app) -> dict:
    """Every switch of mini-hpn connects as a fresh switch and is answered until the app is settled."""
    dps = {name: FakeDatapath(dpid) for name, dpid in dpids().items()}
    for dp in dps.values():
        app.on_features(ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(dp, datapath_id=dp.id)))
    answer_barriers(app, dps)
    assert app.reconciler.settled
    return dps


def parsed_match(match):
    """An OFPMatch as it comes off the wire."""
    buf = bytearray()
    match.serialize(buf, 0)
    return parser.OFPMatch.parser(bytes(buf), 0)


def stats_entry(key: tuple, actions: tuple):
    """The flow stats entry a switch reports for one installed flow."""
    table, priority, match = key
    return parser.OFPFlowStats(table_id=table, duration_sec=1, duration_nsec=0, priority=priority,
                               idle_timeout=0, hard_timeout=0, flags=0, cookie=codec.COOKIE, packet_count=0,
                               byte_count=0, match=parsed_match(codec.encode_match(parser, match)),
                               instructions=codec.encode_instructions(ofp, parser, actions))


def _wire_bucket(bucket):
    """An OFPBucket as it comes off the wire (in a group description reply)."""
    buf = bytearray()
    bucket.serialize(buf, 0)
    return parser.OFPBucket.parser(bytes(buf), 0)


def group_desc(group_mod) -> object:
    """The group description entry a switch reports for a group it was sent."""
    return parser.OFPGroupDescStats(type_=group_mod.type, group_id=group_mod.group_id,
                                    buckets=[_wire_bucket(b) for b in group_mod.buckets])


# ---- a cabled fabric: LLDP carried across (the wiring gate, adoption, the staged rollout) --------------

def scenario():
    return graph.build(spec.load("mini-hpn"))


def wipes(msgs) -> int:
    """How many times the switch was handed to the reconciler: each hand-over reads back what the
    switch holds (a flow stats request for every table) before anything is installed."""
    return sum(isinstance(m, parser.OFPFlowStatsRequest) and m.table_id == ofp.OFPTT_ALL for m in msgs)


class Fabric:
    """Fake datapaths cabled as a graph says: LLDP packet-outs come back as packet-ins at the peer."""

    def __init__(self, app, cabling):
        self.app, self.cabling = app, cabling
        self.dps = {n: FakeDatapath(d["dpid"]) for n, d in cabling.nodes(data=True) if d["tier"] > 0}
        self.peer: dict = {}
        self.ports: dict = {n: set() for n in self.dps}
        self.names: dict = {}          # (switch, OpenFlow port) -> its name (Open vSwitch: the interface's)
        for u, v, d in cabling.edges(data=True):
            ports = d.get("ofports", d["ports"])
            for a, b in ((u, v), (v, u)):
                if a in self.dps:
                    self.ports[a].add(ports[a])
                    self.names[a, ports[a]] = graph.intf_name(a, d["ports"][a])
                    if b in self.dps:
                        self.peer[a, ports[a]] = (b, ports[b])
        self.installed: dict = {n: [] for n in self.dps}

    def connect(self) -> None:
        for name, dp in self.dps.items():
            self.app.on_features(ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(dp, datapath_id=dp.id)))
            body = [parser.OFPPort(port_no=p, hw_addr=f"02:00:00:00:{len(name):02x}:{p % 256:02x}",
                                   name=self.names[name, p].encode(), config=0,
                                   state=ofp.OFPPS_LIVE, curr=0, advertised=0, supported=0, peer=0, curr_speed=0,
                                   max_speed=0) for p in sorted(self.ports[name])]
            self.app.on_port_desc(ofp_event.EventOFPPortDescStatsReply(parser.OFPPortDescStatsReply(dp, body=body)))
        self.deliver()

    def deliver(self) -> None:
        """Carry LLDP frames across the cables until none is left; keep everything else."""
        while True:
            moved = False
            for name, dp in self.dps.items():
                for m in dp.take():
                    if isinstance(m, parser.OFPPacketOut) and codec.is_lldp(bytes(m.data)):
                        far = self.peer.get((name, m.actions[0].port))
                        if far is not None:
                            moved = True
                            self.packet_in(far[0], far[1], bytes(m.data))
                    elif not self.carry(name, m):
                        self.installed[name].append(m)
            if not moved:
                return

    def packet_in(self, name: str, port: int, data: bytes) -> None:
        dp = self.dps[name]
        msg = parser.OFPPacketIn(dp, buffer_id=ofp.OFP_NO_BUFFER, total_len=len(data), reason=ofp.OFPR_ACTION,
                                 table_id=0, cookie=0, match=parser.OFPMatch(in_port=port), data=data)
        self.app.on_packet_in(ofp_event.EventOFPPacketIn(msg))

    def carry(self, name: str, msg) -> bool:
        """Other packet-outs a subclass carries (True: carried)."""
        return False

    def settle(self) -> None:
        for name, dp in self.dps.items():
            dp.sent = self.installed[name]
            self.installed[name] = []
        answer_barriers(self.app, self.dps)
