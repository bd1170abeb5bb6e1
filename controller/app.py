"""hpnlab's OpenFlow 1.3 controller app: event plumbing and encoding around the pure reconciler.

Runs on os-ken (``python -m hpnlab.controller SCENARIO``) and, through the import shim, under
Ryu's ``ryu-manager controller/app.py``. Configuration comes from the environment so
both launchers work the same way:

    HPNLAB_SCENARIO      preset name or YAML path (required)
    HPNLAB_SET           scenario overrides, one ``key=value`` per line
    HPNLAB_POLICY        aggregate | host-routes (default aggregate)
    HPNLAB_METRICS_PORT  Prometheus endpoint port (0 or unset: none)
    HPNLAB_METRICS_ADDR  its address (default 127.0.0.1)
    HPNLAB_ECN_POLICY    static | dynamic | MODULE:CLASS | FILE.py[:CLASS] (default static)
    HPNLAB_TELEMETRY_MS  port statistics / ECN stage polling interval (default 200; 0: no telemetry)
    HPNLAB_TELEMETRY_OUT telemetry file (JSON lines; unset: none)
    HPNLAB_ECN_ACTUATOR  auto | emulated | file:PATH | none (default auto)
    HPNLAB_ECN_CONTROL   a file through which the harness replaces the ECN policy live (controller/ecn_loop.py)
    HPNLAB_RUN           the emulation run whose ECN stage to use (set by the harness)
    HPNLAB_ROUTING_WEIGHTS ecmp | weighted: multipath weights (fabric/routing/weights.py; default ecmp)
    HPNLAB_WEIGHTS_CONTROL weighted mode: a file through which the harness switches the weights between
                         weighted and ecmp live ({"policy": MODE, "seq": N}, answered in FILE.ack)
    HPNLAB_ON_MISWIRE    refuse | planes: what a miswiring found by LLDP stops (controller/wiring.py; default refuse)
    HPNLAB_WIRING_OUT    the wiring report (JSON) is written there (unset: none)
    HPNLAB_DISCOVERY_S   decide the wiring once LLDP has learnt nothing new for this long (default 3 s)
    HPNLAB_DEPLOYMENT    a deployment file (controller/deployment.py: real dpids and port numbers or names), or
                         "auto": adopt the map LLDP discovers once discovery settles, install on it and write it
                         to HPNLAB_DEPLOYMENT_OUT
    HPNLAB_ROLLOUT       all | staged: one plane at a time, each proven by probes, rolled back when one fails
                         (controller/rollout.py; default all)
    HPNLAB_ROLLOUT_OUT   the rollout's stages and results (JSON) are written there (unset: none)
    HPNLAB_ROLLOUT_PROBE hosts | leaves: where a stage's probes end (controller/rollout.py; default hosts)
    HPNLAB_DRY_RUN       1: read every switch's flows and groups and change nothing (controller/dryrun.py)
    HPNLAB_ARP           gateway | per-host: how leaves answer ARP in the switch (compiler.arp_responders;
                         default gateway)

Every decision (link state, what to recompile, the diff and its order, what counts as
installed, when to resynchronise a switch) is made by ``hpnlab.controller.reconcile``:
this module decodes os-ken events into reconciler events (switch features -> SwitchUp,
disconnect -> SwitchDown, PortStatus and port descriptions -> PortStatus, BarrierReply,
ErrorMsg, FlowStatsReply, GroupDescStatsReply, a one-second Tick) and encodes the reconciler's
messages into OpenFlow 1.3 (FlowMod, GroupMod, barrier, flow stats and group description
requests). Groups: fast-failover groups (OFPGT_FF, each bucket watching its port, watch_group
OFPG_ANY; the switch must support the type, as Open vSwitch does), indirect, all and select
(every bucket weight 1); a flow sends to one with an apply-action group. Metadata writes are
full 64-bit values (mask all ones); metadata matches may be masked. The ARP responders' move action
is Open vSwitch's NXM move (``NXActionRegMove``). ARP requests from host ports that the leaves'
responder flows leave to the controller reach it as packet-ins and are answered as the responders
would (proxy ARP: the gateway MAC, or in per-host mode the target host's real MAC;
``compiler.arp_answer``). Anything it cannot use (unknown datapath ids, malformed or unexpected
packet-ins) is logged and ignored.
"""
from __future__ import annotations

import json
import logging
import os
import struct
import time
from collections import OrderedDict
from typing import Any, ClassVar

from hpnlab.controller import arp_fallback, deployment, reconcile, rollout, wiring
from hpnlab.fabric.routing import compiler, telemetry, weights
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec as fspec
from hpnlab.fabric.scenario.addressing import ip_int, ip_str

from .control_file import ControlFile
from .ofp import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    BaseApp,
    arp,
    ether_types,
    ethernet,
    hub,
    ipv4,
    lldp,
    ofp_event,
    ofproto_v1_3,
    packet,
    set_ev_cls,
    tcp,
    udp,
)

COOKIE = 0x68706E6C61620000  # "hpnlab" in the top bytes: the flows this app owns
LLDP_COOKIE = 0x68706E6C6C647000   # the LLDP rule (not the reconciler's: its read-back skips it)
PRIO_LLDP = 65535
LLDP_TTL_S = 120
PROBE_COOKIE = 0x68706E6C70726F00  # the staged rollout's temporary probe-catching rules
PRIO_PROBE = 65534
PROBE_WAIT_S = 1.0                 # a stage's probes have this long to arrive (twice: missing ones are resent)
ALL_COOKIE_BITS = 0xFFFFFFFFFFFFFFFF
OUT_OF_BAND_COOKIES = frozenset({LLDP_COOKIE, PROBE_COOKIE})   # not the reconciler's: left out of read-backs
METADATA_MASK = 0xFFFFFFFFFFFFFFFF   # write-metadata: the compiler's values are whole 64-bit words
TICK_S = 1.0
MAX_HOSTS_SEEN = 1 << 20           # --deployment auto: host ports remembered (bounds what hostile frames can fill)
GROUP_KINDS = ("ff", "indirect", "all", "select")
SENT_FLOWS_KEPT = 1 << 16          # flow-mods remembered by (dpid, xid), so that an error names its flow

LOG = logging.getLogger("hpnlab.controller")


def _config() -> dict:
    scenario = os.environ.get("HPNLAB_SCENARIO")
    if not scenario:
        raise RuntimeError("HPNLAB_SCENARIO is not set: "
                           "start the controller with 'python -m hpnlab.controller SCENARIO'")
    sets = [s for s in os.environ.get("HPNLAB_SET", "").splitlines() if s.strip()]
    return {"scenario": scenario, "overrides": fspec.parse_overrides(sets),
            "policy": os.environ.get("HPNLAB_POLICY", "aggregate"),
            "fast_failover": os.environ.get("HPNLAB_FAST_FAILOVER", "1") != "0",
            "metrics_port": int(os.environ.get("HPNLAB_METRICS_PORT") or 0),
            "metrics_addr": os.environ.get("HPNLAB_METRICS_ADDR", "127.0.0.1"),
            "ecn_policy": os.environ.get("HPNLAB_ECN_POLICY", "static"),
            "telemetry_ms": float(os.environ.get("HPNLAB_TELEMETRY_MS") or 200),
            "telemetry_out": os.environ.get("HPNLAB_TELEMETRY_OUT") or None,
            "ecn_actuator": os.environ.get("HPNLAB_ECN_ACTUATOR", "auto"),
            "ecn_control": os.environ.get("HPNLAB_ECN_CONTROL") or None,
            "run_id": os.environ.get("HPNLAB_RUN") or None,
            "routing_weights": os.environ.get("HPNLAB_ROUTING_WEIGHTS") or "ecmp",
            "weights_control": os.environ.get("HPNLAB_WEIGHTS_CONTROL") or None,
            "on_miswire": os.environ.get("HPNLAB_ON_MISWIRE") or "refuse",
            "wiring_out": os.environ.get("HPNLAB_WIRING_OUT") or None,
            "discovery_s": float(os.environ.get("HPNLAB_DISCOVERY_S") or 3.0),
            "deployment": os.environ.get("HPNLAB_DEPLOYMENT") or None,
            "deployment_out": os.environ.get("HPNLAB_DEPLOYMENT_OUT") or "deployment-discovered.yaml",
            "rollout": os.environ.get("HPNLAB_ROLLOUT") or "all",
            "rollout_out": os.environ.get("HPNLAB_ROLLOUT_OUT") or None,
            "rollout_probe": os.environ.get("HPNLAB_ROLLOUT_PROBE") or "hosts",
            "dry_run": os.environ.get("HPNLAB_DRY_RUN") == "1",
            "arp": arp_mode(os.environ.get("HPNLAB_ARP") or "gateway")}


def arp_mode(value: str) -> str:
    """HPNLAB_ARP's value when it is an ARP mode, else one line (UserError) before anything is built."""
    from hpnlab.fabric.errors import UserError
    if value not in compiler.ARP_MODES:
        raise UserError(f"HPNLAB_ARP={value!r}: one of {', '.join(compiler.ARP_MODES)} (how leaves answer ARP)")
    return value


# ---- encoding: reconciler messages -> OpenFlow 1.3 ------------------------------------------

def encode_match(parser, match: tuple):
    fields = {}
    for name, value in match:
        if name in compiler.IPV4_FIELDS:
            value = (ip_str(value[0]), ip_str(value[1])) if isinstance(value, tuple) else ip_str(value)
        fields[name] = value
    return parser.OFPMatch(**fields)


def _group_type(ofp, kind: str) -> int:
    types = {"ff": ofp.OFPGT_FF, "indirect": ofp.OFPGT_INDIRECT, "all": ofp.OFPGT_ALL, "select": ofp.OFPGT_SELECT}
    if kind not in types:
        raise ValueError(f"unknown group kind {kind!r}: one of {', '.join(GROUP_KINDS)}")
    return types[kind]


def encode_action(ofp, parser, act: tuple):
    """One apply-action (output, controller, group, set_field, move), or None for the actions that are instructions."""
    if act[0] == "output":
        return parser.OFPActionOutput(act[1])
    if act[0] == "controller":
        return parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)
    if act[0] == "group":
        return parser.OFPActionGroup(act[1])
    if act[0] == "set_field" and act[1] == "in_port":
        # Open vSwitch refuses OpenFlow 1.3's set-field on in_port (OFPBAC_BAD_SET_ARGUMENT for
        # port 0) but takes its NXM load, load:0->NXM_OF_IN_PORT[]: what lets a detour bucket
        # send a packet back to the switch it came from (compiler's _Protection.detour)
        return parser.NXActionRegLoad(ofs_nbits=15, dst="in_port_nxm", value=act[2])
    if act[0] == "set_field":
        return parser.OFPActionSetField(**{act[1]: ip_str(act[2]) if act[1] in compiler.IPV4_FIELDS else act[2]})
    if act[0] == "move":       # a whole field into another of the same width (Open vSwitch's NXM move)
        return parser.NXActionRegMove(src_field=act[1], dst_field=act[2], n_bits=_FIELD_BITS[act[1]])
    return None


def encode_instructions(ofp, parser, actions: tuple) -> list:
    instructions, apply = [], []
    for act in actions:
        if act[0] == "metadata":
            instructions.append(parser.OFPInstructionWriteMetadata(act[1], METADATA_MASK))
        elif act[0] == "goto":
            instructions.append(parser.OFPInstructionGotoTable(act[1]))
        else:
            action = encode_action(ofp, parser, act)
            if action is not None:
                apply.append(action)
    if apply:
        instructions.insert(0, parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, apply))
    return instructions


def encode_buckets(ofp, parser, kind: str, buckets: tuple) -> list:
    """A group's buckets: a fast-failover bucket watches its port (no group); a select bucket has
    weight 1; the others neither watch nor weigh."""
    out = []
    for watch, actions in buckets:
        acts = [a for a in (encode_action(ofp, parser, act) for act in actions) if a is not None]
        port = watch if isinstance(watch, int) else ofp.OFPP_ANY
        group = watch[1] if isinstance(watch, tuple) else ofp.OFPG_ANY
        out.append(parser.OFPBucket(weight=1 if kind == "select" else 0,
                                    watch_port=port, watch_group=group, actions=acts))
    return out


def encode(dp, msg: reconcile.Message | telemetry.PortStatsRequest) -> list:
    """The OpenFlow 1.3 messages for one reconciler message (xids of barriers and stats
    requests are the reconciler's, so that replies can be matched)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    if isinstance(msg, reconcile.FlowMod):
        command = ofp.OFPFC_DELETE_STRICT if msg.command == "delete" else ofp.OFPFC_ADD
        instructions = [] if msg.command == "delete" else encode_instructions(ofp, parser, msg.actions)
        return [parser.OFPFlowMod(
            datapath=dp, cookie=COOKIE, cookie_mask=0, table_id=msg.table, command=command,
            priority=msg.priority, match=encode_match(parser, msg.match), instructions=instructions,
            out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, buffer_id=ofp.OFP_NO_BUFFER)]
    if isinstance(msg, reconcile.GroupMod):
        if msg.command == "delete":
            return [parser.OFPGroupMod(datapath=dp, command=ofp.OFPGC_DELETE, type_=ofp.OFPGT_ALL,
                                       group_id=msg.group_id, buckets=[])]
        command = ofp.OFPGC_MODIFY if msg.command == "modify" else ofp.OFPGC_ADD
        return [parser.OFPGroupMod(datapath=dp, command=command, type_=_group_type(ofp, msg.kind),
                                   group_id=msg.group_id, buckets=encode_buckets(ofp, parser, msg.kind, msg.buckets))]
    if isinstance(msg, reconcile.WipeTables):
        return [parser.OFPFlowMod(datapath=dp, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
                                  out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch()),
                parser.OFPGroupMod(datapath=dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL)]
    if isinstance(msg, reconcile.Barrier):
        out = parser.OFPBarrierRequest(dp)
    elif isinstance(msg, reconcile.FlowStatsRequest):
        out = parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY,
                                         COOKIE, 0, parser.OFPMatch())     # cookie mask 0: every flow
    elif isinstance(msg, reconcile.GroupDescRequest):
        out = parser.OFPGroupDescStatsRequest(dp, 0)
    elif isinstance(msg, telemetry.PortStatsRequest):
        out = parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY)
    else:
        raise TypeError(f"cannot encode {msg!r}")
    out.set_xid(msg.xid)
    return [out]


# ---- decoding: OpenFlow 1.3 -> reconciler values -----------------------------------------------

_FIELD_BITS = {"metadata": 64, "ipv4_dst": 32, "ipv4_src": 32, "udp_src": 16, "tcp_src": 16,
               "udp_dst": 16, "tcp_dst": 16, "eth_type": 16, "in_port": 32, "arp_spa": 32, "arp_tpa": 32}


def decode_match(match) -> tuple:
    """A match back into compiler fields; a masked field whose mask is all ones (as a switch may
    report it) is the exact value."""
    fields = []
    for name, value in match.items():
        if isinstance(value, tuple) and name in _FIELD_BITS and value[1] == (1 << _FIELD_BITS[name]) - 1:
            value = value[0]
        if name in compiler.IPV4_FIELDS:
            value = (ip_int(value[0]), ip_int(value[1])) if isinstance(value, tuple) else ip_int(value)
        fields.append((name, value))
    return reconcile.canonical_match(fields)


def decode_action(ofp, parser, act) -> tuple | None:
    if isinstance(act, parser.OFPActionOutput):
        return ("controller",) if act.port == ofp.OFPP_CONTROLLER else ("output", act.port)
    if isinstance(act, parser.OFPActionGroup):
        return ("group", act.group_id)
    if isinstance(act, parser.OFPActionSetField):
        return ("set_field", act.key, ip_int(act.value) if act.key in compiler.IPV4_FIELDS else act.value)
    load: Any = getattr(parser, "NXActionRegLoad", ())
    if isinstance(act, load) and act.dst == "in_port_nxm" and act.ofs_nbits == 15:
        return ("set_field", "in_port", act.value)
    move: Any = getattr(parser, "NXActionRegMove", ())
    if isinstance(act, move) and act.src_ofs == act.dst_ofs == 0:
        # Open vSwitch reports the fields by their NXM headers, which os-ken names "arp_tpa_nxm"
        return ("move", act.src_field.removesuffix("_nxm"), act.dst_field.removesuffix("_nxm"))
    return None


def decode_actions(ofp, parser, instructions) -> tuple:
    """Instructions back into compiler actions: apply-actions (outputs, groups, set_field) in their order, then
    write-metadata, then goto (the order OpenFlow executes instructions in, whatever their order)."""
    outputs, metadata, goto = [], [], []
    for inst in instructions:
        if isinstance(inst, parser.OFPInstructionActions):
            for act in inst.actions:
                decoded = decode_action(ofp, parser, act)
                if decoded is not None:
                    outputs.append(decoded)
        elif isinstance(inst, parser.OFPInstructionWriteMetadata):
            metadata.append(("metadata", inst.metadata))
        elif isinstance(inst, parser.OFPInstructionGotoTable):
            goto.append(("goto", inst.table_id))
    return tuple(outputs + metadata + goto)


def decode_flow_stats(dp, body) -> tuple:
    """Every flow of a flow stats reply, as reconciler entries (every flow of a fabric switch counts
    as the controller's: one it did not make is not desired, and is deleted; see reconcile's
    docstring) -- but the app's own out-of-band rules (LLDP, rollout probes), which the app keeps
    itself under their own cookies."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return tuple(reconcile.FlowEntry(st.table_id, st.priority, decode_match(st.match),
                             decode_actions(ofp, parser, st.instructions))
                 for st in body if st.cookie not in OUT_OF_BAND_COOKIES)


def _watch(ofp, kind: str, bucket):
    """A decoded bucket's watch, as compiler.Group has it: a port, ("group", id) or None."""
    if kind != "ff":
        return None
    if bucket.watch_port != ofp.OFPP_ANY:
        return bucket.watch_port
    return ("group", bucket.watch_group) if bucket.watch_group != ofp.OFPG_ANY else None


def decode_group_desc(dp, body) -> tuple:
    """Every group of a group description reply, as compiler.Group values (every group on a fabric
    switch is the controller's: see reconcile's docstring)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    kinds = {_group_type(ofp, k): k for k in GROUP_KINDS}
    out = []
    for st in body:
        kind = kinds.get(st.type)
        if kind is None:
            LOG.warning("group %d of unknown type %d ignored", st.group_id, st.type)
            continue
        buckets = tuple((_watch(ofp, kind, b),
                         tuple(a for a in (decode_action(ofp, parser, act) for act in b.actions) if a is not None))
                        for b in st.buckets)
        out.append(compiler.Group(st.group_id, kind, buckets))
    return tuple(out)


def decode_port_stats(body) -> list[telemetry.OfPortStats]:
    """A port statistics reply's entries as telemetry values."""
    return [telemetry.OfPortStats(st.port_no, st.tx_bytes, st.tx_packets, st.tx_dropped, st.rx_bytes,
                                  st.rx_packets, st.rx_dropped) for st in body]


# ---- LLDP (discovery, controller/wiring.py) ------------------------------------------------------

def lldp_frame(dpid: int, port: int, src_mac: str) -> bytes:
    """The LLDP frame sent out of ``port`` of ``dpid``: chassis id ``dpid:<16 hex digits>`` (locally
    assigned, as Ryu's topology app sends it), port id the OpenFlow port number (4 bytes)."""
    tlvs = (lldp.ChassisID(subtype=lldp.ChassisID.SUB_LOCALLY_ASSIGNED, chassis_id=b"dpid:%016x" % dpid),
            lldp.PortID(subtype=lldp.PortID.SUB_PORT_COMPONENT, port_id=struct.pack("!I", port)),
            lldp.TTL(ttl=LLDP_TTL_S), lldp.End())
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst=lldp.LLDP_MAC_NEAREST_BRIDGE, src=src_mac,
                                       ethertype=ether_types.ETH_TYPE_LLDP))
    pkt.add_protocol(lldp.lldp(tlvs))
    pkt.serialize()
    return bytes(pkt.data)


def parse_lldp(data: bytes) -> tuple[int, int] | None:
    """(datapath id, port) of one of our LLDP frames; None for anything else (another sender's LLDP)."""
    pkt = packet.Packet(bytes(data))
    frame = pkt.get_protocol(lldp.lldp)
    if frame is None or len(frame.tlvs) < 2:
        return None
    chassis, port = frame.tlvs[0], frame.tlvs[1]
    chassis_id = getattr(chassis, "chassis_id", b"")
    port_id = getattr(port, "port_id", b"")
    if not chassis_id.startswith(b"dpid:") or len(port_id) != 4:
        return None
    return int(chassis_id[5:], 16), struct.unpack("!I", port_id)[0]


def probe_frame(p: rollout.Probe) -> bytes:
    """A staged rollout's probe from the source host to the destination host: a TCP SYN to PROBE_PORT with
    the probe id in its sequence number (hosts mode: the host answers), or UDP to PROBE_PORT (leaves mode)."""
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst=p.dst_mac, src=p.src_mac, ethertype=ether_types.ETH_TYPE_IP))
    if p.mode == "hosts":
        pkt.add_protocol(ipv4.ipv4(src=p.src_ip, dst=p.dst_ip, proto=rollout.IP_TCP, ttl=64))
        pkt.add_protocol(tcp.tcp(src_port=p.sport, dst_port=rollout.PROBE_PORT, seq=p.seq, bits=tcp.TCP_SYN,
                                 window_size=1024))
    else:
        pkt.add_protocol(ipv4.ipv4(src=p.src_ip, dst=p.dst_ip, proto=rollout.IP_UDP, ttl=64))
        pkt.add_protocol(udp.udp(src_port=p.sport, dst_port=rollout.PROBE_PORT))
        pkt.add_protocol(p.payload)
    pkt.serialize()
    return bytes(pkt.data)


def probe_caught(data: bytes) -> int | None:
    """The probe id of a caught frame: a UDP probe (leaves mode) or a host's TCP answer to one (hosts mode,
    acknowledging the SYN's sequence number); None for anything else."""
    pkt = packet.Packet(bytes(data))
    seg = pkt.get_protocol(tcp.tcp)
    if seg is not None:
        return rollout.probe_id_of_ack(seg.ack) if seg.src_port == rollout.PROBE_PORT and seg.bits & tcp.TCP_ACK \
            else None
    dgram = pkt.get_protocol(udp.udp)
    if dgram is None or dgram.dst_port != rollout.PROBE_PORT:
        return None
    payload = pkt.protocols[-1] if isinstance(pkt.protocols[-1], (bytes, bytearray)) else b""
    return rollout.probe_id_of(bytes(payload))


def is_lldp(data: bytes) -> bool:
    return len(data) >= 14 and struct.unpack("!H", data[12:14])[0] == ether_types.ETH_TYPE_LLDP


def fast_failover_supported(ofp, features) -> bool:
    """Does a group features reply (its body) list the fast-failover group type?"""
    return bool(features.types & (1 << ofp.OFPGT_FF))


def port_is_up(ofp, desc) -> bool:
    """A port carries traffic when it is up, has carrier and is live. Open vSwitch clears
    OFPPS_LIVE (and sends a PortStatus) when BFD on the port stops forwarding while the
    carrier stays up: a gray failure (see hpnlab.fabric.emulation.ovsdb)."""
    return not (desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN
                or not desc.state & ofp.OFPPS_LIVE)


class HpnController(BaseApp):
    OFP_VERSIONS: ClassVar[list[int]] = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = _config()
        self.policy = cfg["policy"]
        self.scenario = fspec.load(cfg["scenario"], cfg["overrides"])
        self.graph = self._deployed_graph(fgraph.build(self.scenario), cfg)
        self.index = compiler.index_of(self.graph)
        self._weights_init(cfg)
        self.arp = cfg["arp"]
        self.reconciler = reconcile.Reconciler(self.graph, self.policy, fast_failover=cfg["fast_failover"],
                                               compile_fn=self.weighted or compiler.compile_fabric, arp=self.arp)
        self.datapaths: dict[str, Any] = {}             # switch name -> connected os-ken Datapath
        #: (dpid, xid) -> the flow-mod sent under it (the last SENT_FLOWS_KEPT): an error's flow (ARP fallback)
        self._sent_flows: OrderedDict[tuple[int, int], reconcile.FlowMod] = OrderedDict()
        self._counted = dict(self.reconciler.counters)  # counters already passed to the metrics
        self.started = time.monotonic()
        self._recompiled_at = (time.time(), self.started)   # (wall, monotonic) of the last compile, for /health
        self._telemetry_at: float | None = None             # monotonic time of the last telemetry sample with data
        self.metrics = None
        self.metrics_served = bool(cfg["metrics_port"])
        try:
            from .metrics import Metrics
            self.metrics = Metrics()
        except ImportError:  # prometheus_client missing: run without metrics
            LOG.warning("prometheus_client is not installed: no metrics endpoint")
        if self.metrics:
            self.metrics.switches_expected.set(len(self.index.sw))
            self.metrics.health_source = self._health
            if cfg["metrics_port"]:
                self.metrics.serve(cfg["metrics_port"], cfg["metrics_addr"], hub)
                LOG.info("metrics on http://%s:%d/metrics", cfg["metrics_addr"], cfg["metrics_port"])
        #: dry run: switches are read back and nothing else is sent (see _dry_run_sends, dry_run_report)
        self.dry_run = cfg["dry_run"]
        self.ecn = None if self.dry_run else self._ecn_loop(cfg)
        self._wiring_init(cfg)
        if self.dry_run:        # no LLDP rule, no gate: the switches are only read back
            self.wiring_enabled = False
        self._rollout_init(cfg)
        #: --on-miswire off: changes wait until every switch told its ports (wiring.release_ungated)
        self.reconciler.hold = self.on_miswire == "off" and not self.dry_run
        LOG.info("scenario %s: %d switches, policy %s, %d flows compiled",
                 self.scenario.name, len(self.index.sw), self.policy,
                 sum(s.flow_count for s in self.reconciler.states.values()))

    def _deployed_graph(self, g, cfg: dict):
        """The scenario's graph on the deployment file's dpids and ports (controller/deployment.py); ports
        the file gives by name stand on placeholders until their switch connects (``_resolve_names``)."""
        self.scenario_graph = g
        self.deployment_auto = cfg["deployment"] == "auto"
        self.deployment_out = cfg["deployment_out"]
        self.deployment_data: dict | None = None
        self.deployment_named: dict[str, dict[int, str]] = {}     # switch -> scenario port -> port name
        self.deployment_resolved: dict[str, dict[int, int]] = {}  # switch -> scenario port -> its number
        self.deployment_errors: dict[str, list[str]] = {}         # switch -> names it does not have, ...
        self.deployment_adopted: str | None = None     # --deployment auto: what was adopted (one line)
        self._adoption_heard: frozenset | None = None  # what LLDP had heard at the last try to adopt
        self._renumbered = False       # port names resolved that the graph does not have yet
        if not cfg["deployment"] or self.deployment_auto:
            return g
        self.deployment_data = deployment.load(g, cfg["deployment"])
        self.deployment_named = deployment.named(g, self.deployment_data)
        out = deployment.apply(g, self.deployment_data)
        LOG.info("deployment %s: %d switches on their own dpids and ports%s", cfg["deployment"],
                 len(fgraph.switches(g)), f"; {len(self.deployment_named)} give port names, resolved when they "
                 f"connect" if self.deployment_named else "")
        return out

    def start(self):
        thread = super().start()
        if not self.dry_run:         # a dry run answers no barrier: no timeouts, no resyncs
            self.threads.append(hub.spawn(self._tick_loop))
        if self.ecn is not None:
            self.threads.append(hub.spawn(self._telemetry_loop))
        return thread

    def _ecn_loop(self, cfg: dict):
        """Telemetry and the ECN policy (controller/ecn_loop.py), unless the interval is 0."""
        if cfg["telemetry_ms"] <= 0:
            return None
        from . import ecn_loop, ecn_policy
        mtu = self.scenario.emulation.mtu
        tel = telemetry.Telemetry(telemetry.fabric_ports(self.graph), cfg["telemetry_ms"] / 1000)
        out = open(cfg["telemetry_out"], "w") if cfg["telemetry_out"] else None   # noqa: SIM115 (closed in close())
        loop = ecn_loop.EcnLoop(tel, ecn_policy.load(cfg["ecn_policy"], mtu), cfg["ecn_actuator"], mtu, out,
                                cfg["run_id"], control=cfg["ecn_control"],
                                stage_keys=telemetry.port_renumbering(self.scenario_graph, self.graph))
        LOG.info("telemetry every %g ms, ECN policy %s, actuator %s%s", cfg["telemetry_ms"], loop.policy.name,
                 loop.spec, f", written to {cfg['telemetry_out']}" if out else "")
        return loop

    def _telemetry_loop(self) -> None:
        assert self.ecn is not None
        while True:
            now = time.monotonic()
            requests = self.ecn.tick(now, list(self.datapaths))
            if self.ecn.last:
                self._telemetry_at = now
            for msg in requests:
                dp = self.datapaths.get(msg.switch)
                if dp is not None:
                    for ofmsg in encode(dp, msg):
                        dp.send_msg(ofmsg)
            if self.weights is not None:
                self._reweight(now)
            if self.metrics and self.metrics_served:       # nobody scrapes otherwise
                self.metrics.update_ports(self.ecn)
                if self.weights is not None and self.weighted is not None:
                    self.metrics.update_weights(self.weights, self.weighted.sets())
            hub.sleep(max(0.0, self.ecn.telemetry.interval_s - (time.monotonic() - now)))

    # ---- weighted multipath (fabric/routing/weights.py decides, the reconciler sends the difference) ----
    def _weights_init(self, cfg: dict) -> None:
        mode = cfg["routing_weights"]
        if mode not in weights.MODES:
            raise RuntimeError(f"HPNLAB_ROUTING_WEIGHTS={mode!r}: one of {', '.join(weights.MODES)}")
        self.weights: weights.Weights | None = None
        self.weighted: weights.WeightedTables | None = None
        self._weights_control = ControlFile(cfg["weights_control"], "routing weights") if cfg["weights_control"] \
            else None
        if mode == "weighted":
            self.weighted = weights.WeightedTables(self.graph)
            self.weights = weights.Weights()
            LOG.info("routing weights: weighted (sets widened to %s)", ", ".join(
                f"{bin(a).count('1')}->{bin(b).count('1')} bits" for a, b in self.weighted.masks.items()) or "-")

    def _reweight(self, now: float) -> None:
        """One decision of the weights from the last telemetry sample; the changed sets' states go to
        the reconciler (only the moved patterns' entries are sent)."""
        assert self.weights is not None and self.weighted is not None and self.ecn is not None
        self._check_weights_control()
        if not self.ecn.last:
            return
        dead = compiler.dead_ports(self.graph, self.reconciler.failures) if self.reconciler.failures else {}
        changes = self.weights.decide(now, self.ecn.last, self.weighted.sets(), dead)
        if not changes:
            return
        for c in changes:
            LOG.info("%s", c.line())
            self.ecn.record(c.as_dict(now))      # the telemetry file (a comparison reads its cells' changes)
        self.handle(reconcile.Restate(self.weighted.restate(changes)))

    def _check_weights_control(self) -> None:
        """A live switch between weighted and ecmp (the harness's ``set_routing_weights``), answered in
        ``<control file>.ack`` as the ECN loop answers a policy change (``control_file``)."""
        if self._weights_control is None or self.weights is None:
            return
        w = self.weights

        def apply(req: dict) -> None:
            mode = req.get("policy")
            if mode not in weights.MODES:
                raise ValueError(f"unknown routing weights {mode!r}: one of {', '.join(weights.MODES)}")
            if w.enabled != (mode == "weighted"):
                LOG.info("routing weights: %s -> %s", "weighted" if w.enabled else "ecmp", mode)
            w.enabled = mode == "weighted"
        self._weights_control.poll(apply, lambda: "weighted" if w.enabled else "ecmp")

    def close(self):
        if self.ecn is not None:
            self.ecn.close()
        super().close()

    def _tick_loop(self) -> None:
        while True:
            hub.sleep(TICK_S)
            self._wiring_tick()
            self.handle(reconcile.Tick())
            self._rollout_poll()

    # ---- plumbing ------------------------------------------------------------------------
    def handle(self, event: reconcile.Event) -> None:
        """Give the reconciler one event and send what it answers."""
        for msg in self.reconciler.handle(event, time.monotonic()):
            dp = self.datapaths.get(msg.switch)
            if dp is None or (self.dry_run and not self._dry_run_sends(msg)):
                continue
            for ofmsg in encode(dp, msg):
                dp.send_msg(ofmsg)
                if isinstance(msg, reconcile.FlowMod) and msg.command != "delete":
                    self._sent_flow(dp.id, ofmsg.xid, msg)
            if isinstance(msg, reconcile.WipeTables) and self.wiring_enabled:
                self._lldp_rule(dp)          # the wipe took it too
        self._update_metrics()
        if isinstance(event, reconcile.BarrierReply):
            self._rollout_poll()
        if self.reconciler.hold and not self.wiring_enabled and isinstance(event, (
                reconcile.FlowStatsReply, reconcile.GroupDescReply, reconcile.PortStatus)):
            self._ungated_check()
        self._check_installed()

    def _sent_flow(self, dpid: int, xid: int | None, msg: reconcile.FlowMod) -> None:
        if xid is None:
            return
        self._sent_flows[dpid, xid] = msg
        if len(self._sent_flows) > SENT_FLOWS_KEPT:
            self._sent_flows.popitem(last=False)

    # ---- the per-leaf ARP fallback (controller/arp_fallback.py decides) ----------------------------
    def _arp_mode_of(self, name: str) -> str:
        return self.reconciler.arp_leaves.get(name, self.arp)

    def _arp_fallback(self, name: str, msg) -> None:
        """An error from ``name``: if it rejects one of the gateway-MAC design's flows, that leaf answers ARP
        per host from now on (one line, counted); the reconciler then resyncs it as after any error."""
        sent = self._sent_flows.get((msg.datapath.id, msg.xid))
        flow = (sent.table, sent.priority, sent.actions) if sent is not None else None
        fb = arp_fallback.decide(name, self.index.sw[name].tier == 1, self._arp_mode_of(name), flow, msg.type,
                                 msg.code)
        if fb is None:
            return
        LOG.warning("%s", fb.line())
        self.handle(reconcile.ArpMode(fb.leaf, fb.mode))
        if self.metrics:
            self.metrics.arp_fallbacks.labels(fb.leaf).inc()

    # ---- dry run -------------------------------------------------------------------------
    @staticmethod
    def _dry_run_sends(msg: reconcile.Message) -> bool:
        """In a dry run only the questions of what a switch holds go out: no flow, group or barrier."""
        return isinstance(msg, (reconcile.FlowStatsRequest, reconcile.GroupDescRequest))

    def dry_run_report(self, final: bool = False) -> dict | None:
        """What the controller would change on each switch that has been read back (see
        controller/dryrun.py); None until every expected switch has answered, unless ``final``."""
        from . import dryrun
        held = {sw: self.reconciler.confirmed[sw] for sw in self.index.sw if sw in self.reconciler.confirmed}
        if not final and len(held) < len(self.index.sw):
            return None
        return dryrun.report(self.scenario.name, self.index.sw, held, self.reconciler.desired)

    def _update_metrics(self) -> None:
        if not self.metrics:
            return
        rec, m = self.reconciler, self.metrics
        counters = rec.counters
        if counters["recompiles"] != self._counted["recompiles"]:
            self._recompiled_at = (time.time(), time.monotonic())
            m.deaggregated.set(rec.deaggregated())
            m.failed_links.set(len(rec.failures.links))
            m.failed_switches.set(len(rec.failures.switches))
        m.recompiles.inc(counters["recompiles"] - self._counted["recompiles"])
        m.resyncs.inc(counters["resyncs"] - self._counted["resyncs"])
        m.errors.inc(counters["errors"] - self._counted["errors"])
        for command in ("add", "modify", "delete"):
            m.flow_mods.labels(command).inc(counters[command] - self._counted[command])
        self._counted = dict(counters)
        m.switches_connected.set(len(self.datapaths))
        m.healthy.set(1 if self._health()[0] == 200 else 0)
        if rec.convergences:
            m.convergence.set(rec.convergences[-1])
        for name in self.index.sw:
            table = rec.confirmed.get(name, {})
            state = rec.states.get(name)
            groups = sum(reconcile.GroupKey(g.group_id) in table for g in state.groups) if state else 0
            m.flows.labels(name).set(len(table) - groups)     # the table holds its groups too

    # ---- discovery and the wiring gate (controller/wiring.py decides) -----------------------------
    # A switch that connects gets the LLDP rule and sends LLDP out of every port; it is handed to
    # the reconciler (SwitchUp: routes installed) only once the wiring is decided and only if its
    # plane may be installed. Ports the decision holds down are reported down to the reconciler.
    def _wiring_init(self, cfg: dict) -> None:
        if cfg["on_miswire"] not in (*wiring.MODES, "off"):
            raise RuntimeError(f"HPNLAB_ON_MISWIRE={cfg['on_miswire']!r}: one of {', '.join(wiring.MODES)}, off")
        self.on_miswire = cfg["on_miswire"]
        self.wiring_enabled = self.on_miswire != "off"    # off: no LLDP, every switch installed at once
        self.wiring_out = cfg["wiring_out"]
        self.discovery_s = cfg["discovery_s"]
        self.observed: dict[wiring.Port, tuple[wiring.Port, float]] = {}   # rx port -> (tx port, when)
        self.port_info: dict[str, dict[int, tuple[str, bool]]] = {}         # switch -> port -> (hw addr, up)
        self.expected_links = wiring.expected_links(self.graph)
        self.wiring_report: wiring.Report | None = None
        self.wiring_decision: wiring.Decision | None = None
        self.released: set[str] = set()       # switches handed to the reconciler
        self._lldp_checks: dict[tuple[int, int], bool] = {}   # (dpid, xid) of a question for the LLDP rule: found
        self.rollout_state: rollout.Rollout | None = None     # --rollout staged (set by _release_planes)
        self.strangers: dict[int, Any] = {}   # --deployment auto: datapaths not in the scenario, heard by LLDP
        self.heard_dpids: dict[tuple[int, int], tuple[int, int]] = {}   # rx (dpid, port) -> tx (dpid, port)
        #: --deployment auto: (dpid, port) of a stranger -> the source MAC of a host's frame that arrived there
        #: (deployment.host_pins tells symmetric leaves apart by it)
        self.hosts_seen: dict[tuple[int, int], str] = {}
        self._host_leaves: dict[str, str] | None = None          # MAC -> leaf (deployment.host_leaves), on first use
        self._unknown_macs_logged: set[tuple[int, int, str]] = set()    # each logged once (bounded)
        self._deployment_written: dict | None = None
        self._last_connect = time.monotonic()    # the last time discovery learnt something (switch, port, link)
        #: when every switch the decision allows first held its desired tables (written into the report:
        #: the harness waits for it before the first packet, as a user's readiness check would)
        self.installed: dict | None = None
        self._lldp_sent: dict[str, float] = {}    # switch (or stranger) -> when it last sent LLDP
        self.wiring_gauges = None
        if self.metrics:
            from prometheus_client import Gauge
            r = self.metrics.registry
            self.wiring_gauges = {
                "findings": Gauge("hpnlab_wiring_findings", "Wiring check findings by kind (LLDP against the "
                                  "scenario)", ["kind"], registry=r),
                "blocked": Gauge("hpnlab_wiring_planes_blocked", "Planes not installed because of miswiring",
                                 registry=r),
                "held": Gauge("hpnlab_wiring_ports_held_down", "Ports held down (routed around) by the wiring "
                              "check", registry=r),
                "ok": Gauge("hpnlab_wiring_links_ok", "Expected links seen by LLDP as planned", registry=r)}

    def _gate_connected(self, name: str, dp) -> None:
        """A switch connected: the LLDP rule; its routes once the wiring allows its plane."""
        self._last_connect = time.monotonic()
        if not self.wiring_enabled:
            self._release(name)
            return
        self._lldp_rule_unless_held(dp)
        if self.wiring_decision is not None and self._plane_allowed(name):
            self._release(name)

    def _lldp_rule_unless_held(self, dp) -> None:
        """Ask the switch for its LLDP rule and add the rule only if it is missing (``_lldp_held``
        answers): a controller that restarts re-adds nothing the switch still holds."""
        ofp, parser = dp.ofproto, dp.ofproto_parser
        req = parser.OFPFlowStatsRequest(dp, 0, 0, ofp.OFPP_ANY, ofp.OFPG_ANY, LLDP_COOKIE, ALL_COOKIE_BITS,
                                         parser.OFPMatch())
        dp.send_msg(req)      # sets req.xid
        self._lldp_checks[dp.id, req.xid] = False

    def _lldp_held(self, msg) -> bool:
        """A reply to ``_lldp_rule_unless_held``'s question (True: consumed here)."""
        dp = msg.datapath
        key = (dp.id, msg.xid)
        if key not in self._lldp_checks:
            return False
        held = self._lldp_checks[key] or any(st.cookie == LLDP_COOKIE for st in msg.body)
        if msg.flags & dp.ofproto.OFPMPF_REPLY_MORE:
            self._lldp_checks[key] = held
            return True
        del self._lldp_checks[key]
        if not held:
            self._lldp_rule(dp)
        return True

    def _ungated_check(self) -> None:
        """--on-miswire off: send the changes held since start once the wiring is observed (every switch
        connected and told its ports), discovery settled, or the switches held nothing (a first start)."""
        rec = self.reconciler
        if not rec.hold or self.dry_run:
            return
        quiet_s = time.monotonic() - self._last_connect
        told = sum(1 for sw in self.index.sw if sw in self.port_info)
        if not wiring.release_ungated(len(rec.confirmed), sum(len(t) for t in rec.confirmed.values()),
                                      len(self.datapaths), told, len(self.index.sw), quiet_s, self.discovery_s):
            return
        rec.hold = False
        LOG.info("on-miswire off: installing now (%d of %d switches connected, %d told their ports, %d read back "
                 "holding %d entries)", len(self.datapaths), len(self.index.sw), told, len(rec.confirmed),
                 sum(len(t) for t in rec.confirmed.values()))
        self.handle(reconcile.Tick())

    def _gate_disconnected(self, name: str) -> None:
        self.released.discard(name)
        self.port_info.pop(name, None)
        self.handle(reconcile.SwitchDown(name))

    def _plane_allowed(self, name: str) -> bool:
        plane = self.index.sw[name].plane
        if self.rollout_state is not None and plane not in self.rollout_state.allowed():
            return False
        return self.wiring_decision is not None and plane in self.wiring_decision.planes

    def _release(self, name: str) -> None:
        """Hand a connected switch to the reconciler: it installs the switch's state."""
        if name in self.released or name not in self.datapaths or self._names_pending(name):
            return
        self.released.add(name)
        ports = {p: up for p, (_mac, up) in self.port_info.get(name, {}).items()}
        self.handle(reconcile.SwitchUp(name, self._wiring_filter(name, ports) if ports else None))

    def _port_seen(self, name: str, desc, up: bool) -> None:
        if desc.port_no not in self.port_info.get(name, {}):
            self._last_connect = time.monotonic()      # something new to hear from: discovery goes on
        self.port_info.setdefault(name, {})[desc.port_no] = (desc.hw_addr, up)

    def _wiring_filter(self, name: str, ports: dict) -> dict:
        """Port states for the reconciler: a port the wiring decision holds down counts as down."""
        held = self.wiring_decision.held_down if self.wiring_decision is not None else frozenset()
        return {p: up and (name, p) not in held for p, up in ports.items()}

    def _lldp_rule(self, dp) -> None:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                             [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])]
        dp.send_msg(parser.OFPFlowMod(datapath=dp, cookie=LLDP_COOKIE, table_id=0, command=ofp.OFPFC_ADD,
                                      priority=PRIO_LLDP, match=parser.OFPMatch(eth_type=ether_types.ETH_TYPE_LLDP),
                                      instructions=inst, buffer_id=ofp.OFP_NO_BUFFER))

    def _lldp_senders(self) -> dict[str, Any]:
        """Every connected switch, and every stranger (``--deployment auto``) by its dpid name."""
        return {**self.datapaths, **{f"dpid:{dpid:016x}": dp for dpid, dp in self.strangers.items()}}

    def _send_lldp(self, name: str | None = None) -> None:
        """LLDP out of every port of one switch (every connected switch when None)."""
        if not self.wiring_enabled:
            return
        senders = self._lldp_senders()
        now = time.monotonic()
        for sw in [name] if name else list(senders):
            dp = senders.get(sw)
            if dp is None:
                continue
            ofp, parser = dp.ofproto, dp.ofproto_parser
            for port, (mac, _up) in sorted(self.port_info.get(sw, {}).items()):
                if port >= ofp.OFPP_MAX:
                    continue
                dp.send_msg(parser.OFPPacketOut(datapath=dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                                                actions=[parser.OFPActionOutput(port)],
                                                data=lldp_frame(dp.id, port, mac)))
            self._lldp_sent[sw] = now

    def _lldp_in(self, name: str, in_port: int | None, data: bytes) -> str:
        sender = parse_lldp(data)
        if sender is None or in_port is None:
            return "ignored"
        dpid, port = sender
        rx_dp = self.datapaths.get(name) or self.strangers.get(int(name[5:], 16) if name.startswith("dpid:") else -1)
        if rx_dp is not None:
            self.heard_dpids[rx_dp.id, in_port] = (dpid, port)
        tx = (self.index.by_dpid.get(dpid) or f"dpid:{dpid:016x}", port)
        rx = (name, in_port)
        first = rx not in self.observed or self.observed[rx][0] != tx
        self.observed[rx] = (tx, time.monotonic())
        if first:
            self._last_connect = time.monotonic()          # still learning: the deadline moves on
            LOG.debug("LLDP: %s port %d hears %s port %d", name, in_port, *tx)
            if self.wiring_decision is None and self._discovery_complete():
                self._decide_wiring()
        return "lldp"

    def _discovery_complete(self) -> bool:
        """Every switch connected, and every expected link heard from both ends as planned."""
        if len(self.datapaths) < len(self.index.sw):
            return False
        if self._renumbered:
            self._adopt_renumbered()
        heard = {rx: tx for rx, (tx, _t) in self.observed.items()}
        return all(heard.get(a) == b for a, b in self.expected_links.items())

    def _wiring_tick(self) -> None:
        """Every tick: LLDP again (every second until decided, then every 5 s), stale observations
        dropped; decide once discovery is complete or settled; afterwards, report changes."""
        if not self.wiring_enabled:
            self._ungated_check()          # the hold's time may be up
            return
        now = time.monotonic()
        present = bool(self.datapaths or self.strangers)       # --deployment auto: maybe only strangers yet
        senders = self._lldp_senders()
        for sw in wiring.lldp_due(self._lldp_sent, senders, now, decided=self.wiring_decision is not None):
            self._send_lldp(sw)
        for gone in set(self._lldp_sent) - set(senders):
            del self._lldp_sent[gone]          # bounded: only the switches connected now
        stale = [rx for rx, (_tx, t) in self.observed.items() if now - t > wiring.STALE_S]
        for rx in stale:
            del self.observed[rx]
        if self.wiring_decision is not None or (present and (self._discovery_complete() or wiring.settled(
                now - self._last_connect, self.discovery_s, len(self.datapaths) + len(self.strangers),
                len(self.index.sw)))):
            self._decide_wiring()

    def _decide_wiring(self) -> None:
        """The report and the decision; on a change: log, metrics, file, and the ports and planes it
        changes (a port no longer held down is given back its real state)."""
        if self.deployment_auto and self.deployment_adopted is None:
            self._adopt_discovered()
        if self._renumbered:
            self._adopt_renumbered()
        heard = {rx: tx for rx, (tx, _t) in self.observed.items()}
        report = wiring.compare(self.graph, heard)
        decision = wiring.decide(self.graph, report, self.on_miswire,
                                 hold_planes={self.index.sw[n].plane for n in self.deployment_errors})
        first = self.wiring_decision is None
        if not first and report == self.wiring_report and decision == self.wiring_decision:
            return
        old_held = self.wiring_decision.held_down if self.wiring_decision else frozenset()
        self.wiring_report, self.wiring_decision = report, decision
        LOG.info("wiring: %d of %d expected links as planned, %s; on miswire %s: installing plane(s) %s%s",
                 report.links_ok, report.links_expected,
                 ", ".join(f"{n} {k}" for k, n in report.counts().items()), self.on_miswire,
                 ", ".join(map(str, decision.planes)) or "none",
                 f", {len(decision.held_down)} port(s) held down" if decision.held_down else "")
        for line in report.lines():
            LOG.warning("wiring: %s", line)
        if self.wiring_gauges:
            for kind, n in report.counts().items():
                self.wiring_gauges["findings"].labels(kind).set(n)
            self.wiring_gauges["blocked"].set(len(decision.blocked_planes))
            self.wiring_gauges["held"].set(len(decision.held_down))
            self.wiring_gauges["ok"].set(report.links_ok)
        self._write_wiring()
        for sw, port in sorted(old_held ^ decision.held_down):
            info = self.port_info.get(sw, {}).get(port)     # a port never reported counts as up (reconcile)
            self.handle(reconcile.PortStatus(sw, self._wiring_filter(sw, {port: info[1] if info else True})))
        self._release_planes(decision.planes)
        if self.deployment_auto:
            self._write_discovered_deployment()
        self._check_installed()

    def _write_wiring(self) -> None:
        """The wiring report (``--wiring-out``), with ``installed`` once the routes are in (else null);
        with the gate off, only ``on_miswire`` and ``installed``."""
        if not self.wiring_out:
            return
        body: dict[str, Any] = {"on_miswire": self.on_miswire}
        if self.wiring_report is not None and self.wiring_decision is not None:
            body.update(wiring.report_dict(self.wiring_report, self.wiring_decision))
        body["deployment"] = {"errors": [line for sw in sorted(self.deployment_errors)
                                         for line in self.deployment_errors[sw]],
                              "resolved": {sw: {str(p): n for p, n in sorted(m.items())}
                                           for sw, m in sorted(self.deployment_resolved.items())},
                              "adopted": self.deployment_adopted}
        body["installed"] = self.installed
        tmp = self.wiring_out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(body, f, indent=1)
        os.replace(tmp, self.wiring_out)

    def _check_installed(self) -> None:
        """The first time every switch that may be installed has been handed to the reconciler and the
        reconciler has nothing outstanding and every one holds its desired tables: logged and reported."""
        if self.installed is not None or self.dry_run:
            return
        if self.wiring_enabled and self.wiring_decision is None:
            return
        allowed = {n for n in self.datapaths if not self.wiring_enabled or self._plane_allowed(n)}
        if len(self.datapaths) < len(self.index.sw) or not allowed <= self.released or not self.reconciler.settled:
            return
        self.installed = {"unix": round(time.time(), 3), "after_s": round(time.monotonic() - self.started, 3),
                          "switches": len(allowed)}
        LOG.info("routes installed on %d switch(es), %.2f s after start", len(allowed), self.installed["after_s"])
        self._write_wiring()

    def _stranger_connected(self, dp) -> None:
        """--deployment auto: a datapath id the scenario does not derive; heard by LLDP, never installed."""
        LOG.info("datapath %016x connected: not a derived dpid, discovering it by LLDP (--deployment auto)", dp.id)
        self.strangers[dp.id] = dp
        self._last_connect = time.monotonic()
        self._lldp_rule(dp)
        self._arp_rule(dp)
        dp.send_msg(dp.ofproto_parser.OFPPortDescStatsRequest(dp, 0))

    def _arp_rule(self, dp) -> None:
        """--deployment auto, on a stranger: ARP to the controller, so that a host's request says which leaf
        it is behind (``_host_seen``). It is the leaves' compiled ARP entry (key, actions and cookie), so the
        reconciler that installs the adopted map keeps it on leaves and deletes it from spines and cores."""
        flow = compiler.ARP_TO_CONTROLLER
        for msg in encode(dp, reconcile.FlowMod(f"dpid:{dp.id:016x}", "add", flow.table, flow.priority, flow.match,
                                                flow.actions)):
            dp.send_msg(msg)

    def _host_seen(self, dpid: int, in_port: int | None, data: bytes) -> str:
        """--deployment auto: a frame from a host port of a stranger (not LLDP): its source MAC, when the
        scenario knows it, pins the stranger to that host's leaf once the map is adopted; the latest known
        MAC per port counts, an unknown one is logged and not kept (``deployment.note_host``)."""
        eth = packet.Packet(bytes(data)).get_protocol(ethernet.ethernet)
        if eth is None or in_port is None or self.deployment_adopted is not None:
            return "ignored"
        if self._host_leaves is None:
            self._host_leaves = deployment.host_leaves(self.scenario_graph)
        outcome = deployment.note_host(self.hosts_seen, self._host_leaves, dpid, in_port, eth.src, MAX_HOSTS_SEEN)
        if outcome == "host-seen":
            LOG.info("deployment auto: host %s seen behind datapath %016x port %d", eth.src, dpid, in_port)
        elif outcome == "unknown-mac" and len(self._unknown_macs_logged) < MAX_HOSTS_SEEN and \
                (dpid, in_port, eth.src) not in self._unknown_macs_logged:
            self._unknown_macs_logged.add((dpid, in_port, eth.src))
            LOG.info("deployment auto: a frame from %s behind datapath %016x port %d not kept: no host port of "
                     "the scenario has that MAC", eth.src, dpid, in_port)
        return outcome

    def _adopt_discovered(self) -> None:
        """--deployment auto, once discovery settles: the map LLDP discovered (``deployment.adoption``) is
        adopted, and the switches are installed on it through the wiring check, with no restart. Adopted
        once: a cable moved later is the wiring check's to report, not a new map's to hide."""
        from hpnlab.fabric.errors import UserError
        heard = frozenset(self.heard_dpids.items()) | frozenset(self.hosts_seen.items())
        if heard == self._adoption_heard:
            return
        self._adoption_heard = heard
        try:
            data, line = deployment.adoption(self.scenario_graph, self.heard_dpids, self.hosts_seen)
        except UserError as exc:
            LOG.warning("deployment auto: nothing adopted yet: %s", exc)
            return
        self.deployment_adopted = line
        LOG.info("deployment auto: adopted the discovered map (%s), written to %s; installing through the "
                 "wiring check", line, self.deployment_out)
        self._adopt_graph(deployment.apply(self.scenario_graph, data))

    def _write_discovered_deployment(self) -> None:
        """--deployment auto: the map LLDP discovered (controller/deployment.from_discovery), written once
        it has the scenario's shape and again whenever it changes."""
        from hpnlab.fabric.errors import UserError
        try:
            dpids, maps = deployment.from_discovery(self.scenario_graph, self.heard_dpids, self.hosts_seen)
        except UserError as exc:
            LOG.warning("deployment auto: %s", exc)
            return
        found = {"dpids": dpids, "maps": maps}
        if found == self._deployment_written:
            return
        self._deployment_written = found
        text = deployment.dump(self.scenario_graph, dpids, maps)
        tmp = self.deployment_out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.deployment_out)
        foreign = sorted(n for n, d in dpids.items() if d != self.scenario_graph.nodes[n]["dpid"])
        LOG.info("deployment auto: wrote %s (%d switches, %d on dpids of their own; give it to --deployment "
                 "to start with it)", self.deployment_out, len(dpids), len(foreign))

    # ---- port names and a deployment found at run time (controller/deployment.py decides) -------------
    def _resolve_names(self, name: str, ofp, body) -> bool:
        """A switch whose deployment gives port names told its ports: the names resolved against them
        (``deployment.resolve``); a mistake is logged, one line each, and holds the switch's plane back.
        Returns whether the resolved numbers changed (the graph must be rebuilt on them)."""
        names = {(d.name.rstrip(b"\0").decode(errors="replace") if isinstance(d.name, bytes) else str(d.name)):
                 d.port_no for d in body if d.port_no < ofp.OFPP_MAX}
        resolved, errors = deployment.resolve(self.scenario_graph, self.deployment_data or {}, name, names)
        if errors != self.deployment_errors.get(name, []):
            for line in errors:
                LOG.error("%s (its plane is held back)", line)
        if errors:
            self.deployment_errors[name] = errors
            changed = self.deployment_resolved.pop(name, None) is not None
        else:
            self.deployment_errors.pop(name, None)
            changed = self.deployment_resolved.get(name) != resolved
            self.deployment_resolved[name] = resolved
            if changed:
                LOG.info("%s: port names resolved: %s", name, ", ".join(
                    f"{self.deployment_named[name][p]}={n}" for p, n in sorted(resolved.items())))
        return changed

    def _adopt_renumbered(self) -> bool:
        """The graph on the port numbers resolved so far (see ``_adopt_graph``)."""
        self._renumbered = False
        return self._adopt_graph(deployment.apply(self.scenario_graph, self.deployment_data or {},
                                                  self.deployment_resolved))

    def _names_pending(self, name: str) -> bool:
        """A switch whose port names are not resolved (not yet, or a name it does not have): never installed."""
        resolved = name in self.deployment_resolved and name not in self.deployment_errors
        return name in self.deployment_named and not resolved

    def _adopt_graph(self, g) -> bool:
        """Run on ``g`` from now on: the deployment's numbers found at run time (port names resolved, or
        the map ``--deployment auto`` discovered). A new reconciler, which reads back every switch it is
        handed as after a restart (what a switch already holds right is left alone); connections, ports and
        what LLDP heard renamed through their datapath ids. Returns whether the wiring had been decided
        (the caller decides it anew: until then nothing is handed to the new reconciler)."""
        def dpid_of(sw: str) -> int:
            return int(sw[5:], 16) if sw.startswith("dpid:") else self.graph.nodes[sw]["dpid"]

        conns = {dp.id: dp for dp in self.datapaths.values()} | self.strangers
        info = {dpid_of(n): ports for n, ports in self.port_info.items()}
        heard = {(dpid_of(rx[0]), rx[1]): ((dpid_of(tx[0]), tx[1]), t) for rx, (tx, t) in self.observed.items()}
        had = self.wiring_decision is not None
        old_graph, self.graph = self.graph, g
        self.index = compiler.index_of(g)
        self.expected_links = wiring.expected_links(g)
        if self.weighted is not None:           # weighted multipath: its sets on the adopted numbers
            self.weighted = weights.WeightedTables(g)
            self.weights = weights.Weights()
        fallen_back, hold = self.reconciler.arp_leaves, self.reconciler.hold
        self.reconciler = reconcile.Reconciler(g, self.policy, fast_failover=self.reconciler.fast_failover,
                                               compile_fn=self.weighted or compiler.compile_fabric, arp=self.arp)
        self.reconciler.hold = hold
        for leaf, mode in sorted(fallen_back.items()):       # the per-leaf ARP fallback outlives the renumbering
            self.reconciler.handle(reconcile.ArpMode(leaf, mode))
        self._counted = dict(self.reconciler.counters)
        if self.ecn is not None:    # telemetry polls the ports on their adopted numbers, and reads the stage there
            self.ecn.rebase(telemetry.fabric_ports(g), telemetry.port_renumbering(self.scenario_graph, g),
                            telemetry.port_renumbering(old_graph, g))

        def name_of(dpid: int) -> str:
            return self.index.by_dpid.get(dpid) or f"dpid:{dpid:016x}"

        self.datapaths = {self.index.by_dpid[d]: dp for d, dp in conns.items() if d in self.index.by_dpid}
        self.strangers = {d: dp for d, dp in conns.items() if d not in self.index.by_dpid}
        self.port_info = {name_of(d): ports for d, ports in info.items()}
        self.observed = {(name_of(rx[0]), rx[1]): ((name_of(tx[0]), tx[1]), t) for rx, (tx, t) in heard.items()}
        self.released = set()
        self.wiring_report = self.wiring_decision = None
        for name in sorted(self.datapaths):
            ports = {p: up for p, (_mac, up) in self.port_info.get(name, {}).items()}
            if ports:
                self.handle(reconcile.PortStatus(name, ports))
        return had

    def _release_planes(self, planes: tuple[int, ...]) -> None:
        """Hand the switches of ``planes`` to the reconciler (staged: only the stages reached)."""
        if self.rollout_mode == "staged" and self.rollout_state is None:
            self.rollout_state = rollout.Rollout.of(planes, self.rollout_probe)
            LOG.info("staged rollout: plane(s) %s, one at a time, probed %s",
                     ", ".join(map(str, self.rollout_state.planes)) or "none",
                     "host to host" if self.rollout_probe == "hosts" else "to the destination leaves' uplinks")
            self._write_rollout()
        for name in sorted(self.datapaths):
            if self.index.sw[name].plane in planes and self._plane_allowed(name):
                self._release(name)

    # ---- staged rollout (controller/rollout.py decides) ----------------------------------------
    def _rollout_init(self, cfg: dict) -> None:
        if cfg["rollout"] not in rollout.MODES:
            raise RuntimeError(f"HPNLAB_ROLLOUT={cfg['rollout']!r}: one of {', '.join(rollout.MODES)}")
        if cfg["rollout"] == "staged" and not self.wiring_enabled:
            raise RuntimeError("a staged rollout needs the wiring gate (not HPNLAB_ON_MISWIRE=off)")
        if cfg["rollout_probe"] not in rollout.PROBE_MODES:
            from hpnlab.fabric.errors import UserError
            raise UserError(f"HPNLAB_ROLLOUT_PROBE={cfg['rollout_probe']!r}: one of {', '.join(rollout.PROBE_MODES)}")
        self.rollout_mode = cfg["rollout"]
        self.rollout_probe = cfg["rollout_probe"]
        self.rollout_out = cfg["rollout_out"]
        self._probes: list[rollout.Probe] = []
        self._arrivals: dict[int, str] = {}
        self._probe_sent_at = 0.0
        self._probe_resent = False
        self._catch_at = 0.0
        self._rollout_busy = False
        self._rollout_gauge: Any = None

    def _rollout_poll(self) -> None:
        """Move the staged rollout on: probe a stage once its switches hold their state, judge it once
        its probes arrived or their time is up, roll it back when it failed."""
        r = self.rollout_state
        if r is None or r.phase == "done" or self._rollout_busy:
            return
        self._rollout_busy = True
        try:
            self._rollout_step(r)
        finally:
            self._rollout_busy = False

    def _rollout_step(self, r: rollout.Rollout) -> None:
        plane = r.current
        if plane is None:
            return
        now = time.monotonic()
        names = [sw.name for sw in self.index.planes[plane]]
        rec = self.reconciler
        if r.phase == "install":
            installed = [n for n in names if n in self.released]
            if not installed or any(rec.pending.get(n) or rec.confirmed.get(n) != rec.desired.get(n)
                                    for n in installed):
                return
            self._probe_catchers(plane, add=True)
            self._catch_at = now
            r.phase = "catch"
        if r.phase == "catch":
            if now - self._catch_at < 0.3:      # the catching rules in place first (other switches)
                return
            self._probes = rollout.probes(self.graph, plane, self._delivered_fn(plane), mode=self.rollout_probe)
            self._arrivals = {}
            self._send_probes(self._probes)
            self._probe_sent_at, self._probe_resent = now, False
            r.phase = "probe"
            return
        if r.phase == "probe":
            done = all(p.probe_id in self._arrivals for p in self._probes)
            if not done and now - self._probe_sent_at < PROBE_WAIT_S:
                return
            if not done and not self._probe_resent:
                self._send_probes([p for p in self._probes if p.probe_id not in self._arrivals])
                self._probe_sent_at, self._probe_resent = now, True
                return
            result = rollout.evaluate(plane, self._probes, self._arrivals)
            self._probe_catchers(plane, add=False)
            r.finish(result)
            if result.ok:
                LOG.info("staged rollout: plane %d passed (%d of %d probes arrived)", plane, result.arrived,
                         result.sent)
            else:
                LOG.error("staged rollout: plane %d failed (%d of %d probes arrived, %d at a wrong leaf): "
                          "rolling it back", plane, result.arrived, result.sent, len(result.misdelivered))
                self._roll_back(names)
            if self.rollout_gauges:
                self.rollout_gauges.labels("passed").set(len(r.passed))
                self.rollout_gauges.labels("rolled_back").set(len(r.rolled_back))
            self._write_rollout()
            if self.wiring_decision is not None:
                self._release_planes(self.wiring_decision.planes)

    @property
    def rollout_gauges(self) -> Any:
        if not self.metrics:
            return None
        if self._rollout_gauge is None:
            from prometheus_client import Gauge
            self._rollout_gauge = Gauge("hpnlab_rollout_planes", "Staged rollout: planes passed or rolled back",
                                        ["state"], registry=self.metrics.registry)
        return self._rollout_gauge

    def _delivered_fn(self, plane: int):
        """Does the compiled state deliver a probe (src host -> dst ip, sport)? Walked with the table
        interpreter over the reconciler's desired state (the routes the wiring check left out are not probed)."""
        from hpnlab.fabric.routing.oftable import FabricTables
        net = FabricTables(self.graph, self.reconciler.states, self.reconciler.failures)

        def delivered(src: str, dst: str, _dst_ip: str, sport: int) -> bool:
            return net.send(src, dst, plane=plane, sport=sport).result == "delivered"
        return delivered

    def _probe_catchers(self, plane: int, add: bool) -> None:
        """The table-0 rules that send probes (hosts mode: the hosts' answers) arriving at a leaf's uplinks to the
        controller (or their removal)."""
        for leaf, ports in rollout.catch_points(self.graph, plane).items():
            dp = self.datapaths.get(leaf)
            if dp is None:
                continue
            ofp, parser = dp.ofproto, dp.ofproto_parser
            if not add:
                dp.send_msg(parser.OFPFlowMod(datapath=dp, cookie=PROBE_COOKIE, cookie_mask=ALL_COOKIE_BITS,
                                              table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY,
                                              out_group=ofp.OFPG_ANY, match=parser.OFPMatch()))
                continue
            inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [
                parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])]
            for port in ports:
                match = parser.OFPMatch(in_port=port, **dict(rollout.catch_match(self.rollout_probe)))
                dp.send_msg(parser.OFPFlowMod(datapath=dp, cookie=PROBE_COOKIE, table_id=0, command=ofp.OFPFC_ADD,
                                              priority=PRIO_PROBE, match=match, instructions=inst,
                                              buffer_id=ofp.OFP_NO_BUFFER))

    def _send_probes(self, probes: list[rollout.Probe]) -> None:
        for p in probes:
            dp = self.datapaths.get(p.src_leaf)
            if dp is None:
                continue
            ofp, parser = dp.ofproto, dp.ofproto_parser
            dp.send_msg(parser.OFPPacketOut(datapath=dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=p.in_port,
                                            actions=[parser.OFPActionOutput(ofp.OFPP_TABLE)], data=probe_frame(p)))

    def _probe_in(self, name: str, data: bytes) -> str | None:
        """A probe (hosts mode: a host's answer to one) caught at a leaf: recorded (None: not a probe)."""
        pid = probe_caught(data)
        if pid is None:
            return None
        self._arrivals.setdefault(pid, name)
        if self.rollout_state is not None and self.rollout_state.phase == "probe" and \
                all(p.probe_id in self._arrivals for p in self._probes):
            self._rollout_poll()
        return "probe"

    def _roll_back(self, names: list[str]) -> None:
        """Take a plane's switches from the reconciler (failed: no other plane changes) and wipe them."""
        for name in names:
            if name not in self.released:
                continue
            self.released.discard(name)
            self.handle(reconcile.SwitchDown(name))
            dp = self.datapaths.get(name)
            if dp is not None:
                for ofmsg in encode(dp, reconcile.WipeTables(name)):
                    dp.send_msg(ofmsg)
                self._lldp_rule(dp)

    def _write_rollout(self) -> None:
        if self.rollout_out and self.rollout_state is not None:
            tmp = self.rollout_out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.rollout_state.as_dict(), f, indent=1)
            os.replace(tmp, self.rollout_out)
    def _health(self) -> tuple[int, dict]:
        """/health's answer (``metrics.health`` decides)."""
        from .metrics import health
        now = time.monotonic()
        wall, at = self._recompiled_at
        return health(uptime_s=now - self.started, expected=list(self.index.sw), connected=list(self.datapaths),
                      last_recompile_unix=round(wall, 3), last_recompile_age_s=now - at,
                      telemetry_interval_s=self.ecn.telemetry.interval_s if self.ecn is not None else 0.0,
                      telemetry_age_s=None if self._telemetry_at is None else now - self._telemetry_at)

    def _name(self, dp) -> str | None:
        return self.index.by_dpid.get(dp.id)

    # ---- events ----------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def on_features(self, ev):
        dp = ev.msg.datapath
        name = self._name(dp)
        if name is None and self.deployment_auto and self.wiring_enabled:
            self._stranger_connected(dp)
            return
        if name is None:
            LOG.warning("switch with unknown datapath id %016x connected: not in scenario %s, ignored",
                        dp.id, self.scenario.name)
            if self.metrics:
                self.metrics.unknown_switches.inc()
            return
        old = self.datapaths.get(name)
        if old is not None and old is not dp:
            LOG.info("%s reconnected: replacing its old connection", name)
        LOG.info("%s (dpid %016x) connected", name, dp.id)
        self.datapaths[name] = dp
        # its ports first: the switch answers in order, so their state is known before what it holds
        # has been read back and compared (a link found down changes what is desired)
        dp.send_msg(dp.ofproto_parser.OFPPortDescStatsRequest(dp, 0))
        self._gate_connected(name, dp)
        dp.send_msg(dp.ofproto_parser.OFPGroupFeaturesStatsRequest(dp, 0))

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def on_state_change(self, ev):
        dp = ev.datapath
        LOG.debug("state change %s dpid %s", ev.state, dp.id)
        if ev.state != DEAD_DISPATCHER or dp.id is None:
            return
        name = self._name(dp)
        if name is None or self.datapaths.get(name) is not dp:
            return
        LOG.warning("%s (dpid %016x) disconnected", name, getattr(dp, "id", 0) or 0)
        del self.datapaths[name]
        self._gate_disconnected(name)
        self.handle(reconcile.SwitchDown(name))

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def on_port_status(self, ev):
        msg = ev.msg
        dp = msg.datapath
        name = self._name(dp)
        if name is None:
            return
        ofp = dp.ofproto
        up = msg.reason != ofp.OFPPR_DELETE and port_is_up(ofp, msg.desc)
        LOG.info("%s port %d %s", name, msg.desc.port_no, "up" if up else "down")
        self._port_seen(name, msg.desc, up)
        self.handle(reconcile.PortStatus(name, self._wiring_filter(name, {msg.desc.port_no: up})))
        if up:
            self._send_lldp(name)      # who is on the other end now

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_port_desc(self, ev):
        dp = ev.msg.datapath
        name = self._name(dp)
        if name is None:
            if dp.id in self.strangers:
                for d in ev.msg.body:
                    self._port_seen(f"dpid:{dp.id:016x}", d, port_is_up(dp.ofproto, d))
                self._send_lldp(f"dpid:{dp.id:016x}")
            return
        errors_before = name in self.deployment_errors
        renumbered = name in self.deployment_named and self._resolve_names(name, dp.ofproto, ev.msg.body)
        ports = {d.port_no: port_is_up(dp.ofproto, d) for d in ev.msg.body}
        for d in ev.msg.body:
            self._port_seen(name, d, ports[d.port_no])
        if renumbered and self.wiring_enabled and self.wiring_decision is None:
            self._renumbered = True      # one new graph for all the switches resolved before the decision
            self.handle(reconcile.PortStatus(name, ports))
        elif renumbered:
            decided = self._adopt_renumbered()
            if decided:
                self._decide_wiring()
            else:
                for sw in sorted(self.datapaths):
                    self._release(sw)
        else:
            self.handle(reconcile.PortStatus(name, self._wiring_filter(name, ports)))
            if errors_before != (name in self.deployment_errors) and self.wiring_decision is not None:
                self._decide_wiring()      # its plane held back, or given back
            elif not self.wiring_enabled or (self.wiring_decision is not None and self._plane_allowed(name)):
                self._release(name)        # resolved: no longer pending
        self._send_lldp(name)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_barrier_reply(self, ev):
        name = self._name(ev.msg.datapath)
        if name is not None:
            self.handle(reconcile.BarrierReply(name, ev.msg.xid))

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_error(self, ev):
        msg = ev.msg
        name = self._name(msg.datapath)
        if name is None:
            LOG.error("datapath %s: OpenFlow error type=%d code=%d", msg.datapath.id, msg.type, msg.code)
            return
        self._arp_fallback(name, msg)
        self.handle(reconcile.Error(name, msg.xid, msg.type, msg.code))

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_flow_stats(self, ev):
        self._stats_reply(ev.msg, reconcile.FlowStatsReply, decode_flow_stats)

    @set_ev_cls(ofp_event.EventOFPGroupFeaturesStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_group_features(self, ev):
        dp = ev.msg.datapath
        name = self._name(dp)
        if name is not None and not fast_failover_supported(dp.ofproto, ev.msg.body):
            LOG.error("%s does not support fast-failover groups: its local protection cannot be installed "
                      "(the group modifications will fail and be retried)", name)

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def on_port_stats(self, ev):
        name = self._name(ev.msg.datapath)
        if name is not None and self.ecn is not None:
            self.ecn.port_stats(name, time.monotonic(), decode_port_stats(ev.msg.body), ev.msg.xid)

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_group_desc(self, ev):
        self._stats_reply(ev.msg, reconcile.GroupDescReply, decode_group_desc)

    def _stats_reply(self, msg, reply, decode) -> None:
        """One part of a multipart reply from a known switch, decoded, to the reconciler."""
        dp = msg.datapath
        if reply is reconcile.FlowStatsReply and self._lldp_held(msg):
            return
        name = self._name(dp)
        if name is not None:
            more = bool(msg.flags & dp.ofproto.OFPMPF_REPLY_MORE)
            self.handle(reply(name, msg.xid, decode(dp, msg.body), more))

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def on_packet_in(self, ev):
        if self.dry_run:
            return
        try:
            outcome = self._packet_in(ev.msg)
        except Exception as exc:  # a malformed packet must never stop the app
            LOG.warning("packet-in ignored: cannot parse it (%s: %s)", type(exc).__name__, exc)
            outcome = "malformed"
        if self.metrics:
            self.metrics.packet_ins.labels(outcome).inc()

    def _packet_in(self, msg) -> str:
        dp = msg.datapath
        name = self.index.by_dpid.get(dp.id)
        if name is None and dp.id in self.strangers and is_lldp(bytes(msg.data)):
            return self._lldp_in(f"dpid:{dp.id:016x}", msg.match.get("in_port"), bytes(msg.data))
        if name is None and dp.id in self.strangers:
            return self._host_seen(dp.id, msg.match.get("in_port"), bytes(msg.data))
        if name is None:
            LOG.warning("packet-in from unknown datapath %016x ignored", dp.id)
            return "unknown-switch"
        in_port = msg.match.get("in_port")
        if is_lldp(bytes(msg.data)):
            return self._lldp_in(name, in_port, bytes(msg.data))
        if self.rollout_state is not None and not self.index.is_host_port(name, in_port or 0):
            caught = self._probe_in(name, bytes(msg.data))
            if caught is not None:
                return caught
        if in_port is None or not self.index.is_host_port(name, in_port):
            LOG.warning("%s: packet-in on port %s which is not a host port, ignored", name, in_port)
            return "ignored"
        pkt = packet.Packet(bytes(msg.data))
        eth = pkt.get_protocol(ethernet.ethernet)
        req = pkt.get_protocol(arp.arp)
        if eth is None or req is None or eth.ethertype != ether_types.ETH_TYPE_ARP:
            LOG.warning("%s port %d: packet-in that is not ARP, ignored", name, in_port)
            return "ignored"
        if req.opcode != arp.ARP_REQUEST or req.dst_ip == req.src_ip:
            return "ignored"
        mac = compiler.arp_answer(self.graph, name, req.dst_ip, self._arp_mode_of(name), in_port)
        if mac is None:
            LOG.info("%s port %d: ARP for %s, no other host of this plane, not answered", name, in_port, req.dst_ip)
            return "ignored"
        reply = packet.Packet()
        reply.add_protocol(ethernet.ethernet(ethertype=ether_types.ETH_TYPE_ARP, dst=eth.src, src=mac))
        reply.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=mac, src_ip=req.dst_ip,
                                   dst_mac=req.src_mac, dst_ip=req.src_ip))
        reply.serialize()
        ofp, parser = dp.ofproto, dp.ofproto_parser
        dp.send_msg(parser.OFPPacketOut(datapath=dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                                        actions=[parser.OFPActionOutput(in_port)], data=reply.data))
        return "arp-reply"
