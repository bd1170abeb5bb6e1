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
    HPNLAB_DRY_RUN       1: read every switch's flows and groups and change nothing (controller/dryrun.py)

Every decision (link state, what to recompile, the diff and its order, what counts as
installed, when to resynchronise a switch) is made by ``hpnlab.controller.reconcile``:
this module decodes os-ken events into reconciler events (switch features -> SwitchUp,
disconnect -> SwitchDown, PortStatus and port descriptions -> PortStatus, BarrierReply,
ErrorMsg, FlowStatsReply, GroupDescStatsReply, a one-second Tick) and encodes the reconciler's
messages into OpenFlow 1.3 (FlowMod, GroupMod, barrier, flow stats and group description
requests). Groups: fast-failover groups (OFPGT_FF, each bucket watching its port, watch_group
OFPG_ANY; the switch must support the type, as Open vSwitch does), indirect, all and select
(every bucket weight 1); a flow sends to one with an apply-action group. Metadata writes are
full 64-bit values (mask all ones); metadata matches may be masked. ARP requests from host ports reach it
as packet-ins at the leaves and are answered with the target host's real MAC (proxy ARP,
the answer decided by ``compiler.arp_answer``). Anything it cannot use (unknown datapath
ids, malformed or unexpected packet-ins) is logged and ignored.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, ClassVar

from hpnlab.fabric import graph as fgraph
from hpnlab.fabric import spec as fspec
from hpnlab.fabric.addressing import ip_int, ip_str

from . import compiler, reconcile, telemetry
from .ofp import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    BaseApp,
    arp,
    ether_types,
    ethernet,
    hub,
    ofp_event,
    ofproto_v1_3,
    packet,
    set_ev_cls,
)

COOKIE = 0x68706E6C61620000  # "hpnlab" in the top bytes: the flows this app owns
METADATA_MASK = 0xFFFFFFFFFFFFFFFF   # write-metadata: the compiler's values are whole 64-bit words
TICK_S = 1.0
GROUP_KINDS = ("ff", "indirect", "all", "select")

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
            "dry_run": os.environ.get("HPNLAB_DRY_RUN") == "1"}


# ---- encoding: reconciler messages -> OpenFlow 1.3 ------------------------------------------

def encode_match(parser, match: tuple):
    fields = {}
    for name, value in match:
        if name in ("ipv4_dst", "ipv4_src"):
            value = (ip_str(value[0]), ip_str(value[1])) if isinstance(value, tuple) else ip_str(value)
        fields[name] = value
    return parser.OFPMatch(**fields)


def _group_type(ofp, kind: str) -> int:
    types = {"ff": ofp.OFPGT_FF, "indirect": ofp.OFPGT_INDIRECT, "all": ofp.OFPGT_ALL, "select": ofp.OFPGT_SELECT}
    if kind not in types:
        raise ValueError(f"unknown group kind {kind!r}: one of {', '.join(GROUP_KINDS)}")
    return types[kind]


def encode_action(ofp, parser, act: tuple):
    """One apply-action (output, controller, group, set_field), or None for the actions that are instructions."""
    if act[0] == "output":
        return parser.OFPActionOutput(act[1])
    if act[0] == "controller":
        return parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)
    if act[0] == "group":
        return parser.OFPActionGroup(act[1])
    if act[0] == "set_field":
        return parser.OFPActionSetField(**{act[1]: act[2]})
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
        out.append(parser.OFPBucket(weight=1 if kind == "select" else 0,
                                    watch_port=ofp.OFPP_ANY if watch is None else watch,
                                    watch_group=ofp.OFPG_ANY, actions=acts))
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
               "udp_dst": 16, "tcp_dst": 16, "eth_type": 16, "in_port": 32}


def decode_match(match) -> tuple:
    """A match back into compiler fields; a masked field whose mask is all ones (as a switch may
    report it) is the exact value."""
    fields = []
    for name, value in match.items():
        if isinstance(value, tuple) and name in _FIELD_BITS and value[1] == (1 << _FIELD_BITS[name]) - 1:
            value = value[0]
        if name in ("ipv4_dst", "ipv4_src"):
            value = (ip_int(value[0]), ip_int(value[1])) if isinstance(value, tuple) else ip_int(value)
        fields.append((name, value))
    return reconcile.canonical_match(fields)


def decode_action(ofp, parser, act) -> tuple | None:
    if isinstance(act, parser.OFPActionOutput):
        return ("controller",) if act.port == ofp.OFPP_CONTROLLER else ("output", act.port)
    if isinstance(act, parser.OFPActionGroup):
        return ("group", act.group_id)
    if isinstance(act, parser.OFPActionSetField):
        return ("set_field", act.key, act.value)
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
    docstring)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return tuple(reconcile.FlowEntry(st.table_id, st.priority, decode_match(st.match),
                             decode_actions(ofp, parser, st.instructions))
                 for st in body)


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
        buckets = tuple((b.watch_port if kind == "ff" and b.watch_port != ofp.OFPP_ANY else None,
                         tuple(a for a in (decode_action(ofp, parser, act) for act in b.actions) if a is not None))
                        for b in st.buckets)
        out.append(compiler.Group(st.group_id, kind, buckets))
    return tuple(out)


def decode_port_stats(body) -> list[telemetry.OfPortStats]:
    """A port statistics reply's entries as telemetry values."""
    return [telemetry.OfPortStats(st.port_no, st.tx_bytes, st.tx_packets, st.tx_dropped, st.rx_bytes,
                                  st.rx_packets, st.rx_dropped) for st in body]


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
        self.graph = fgraph.build(self.scenario)
        self.index = compiler.index_of(self.graph)
        self.reconciler = reconcile.Reconciler(self.graph, self.policy, fast_failover=cfg["fast_failover"])
        self.datapaths: dict[str, Any] = {}             # switch name -> connected os-ken Datapath
        self._counted = dict(self.reconciler.counters)  # counters already passed to the metrics
        self.metrics = None
        self.metrics_served = bool(cfg["metrics_port"])
        try:
            from .metrics import Metrics
            self.metrics = Metrics()
        except ImportError:  # prometheus_client missing: run without metrics
            LOG.warning("prometheus_client is not installed: no metrics endpoint")
        if self.metrics:
            self.metrics.switches_expected.set(len(self.index.sw))
            if cfg["metrics_port"]:
                self.metrics.serve(cfg["metrics_port"], cfg["metrics_addr"], hub)
                LOG.info("metrics on http://%s:%d/metrics", cfg["metrics_addr"], cfg["metrics_port"])
        #: dry run: switches are read back and nothing else is sent (see _dry_run_sends, dry_run_report)
        self.dry_run = cfg["dry_run"]
        self.ecn = None if self.dry_run else self._ecn_loop(cfg)
        LOG.info("scenario %s: %d switches, policy %s, %d flows compiled",
                 self.scenario.name, len(self.index.sw), self.policy,
                 sum(s.flow_count for s in self.reconciler.states.values()))

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
                                cfg["run_id"], control=cfg["ecn_control"])
        LOG.info("telemetry every %g ms, ECN policy %s, actuator %s%s", cfg["telemetry_ms"], loop.policy.name,
                 loop.spec, f", written to {cfg['telemetry_out']}" if out else "")
        return loop

    def _telemetry_loop(self) -> None:
        assert self.ecn is not None
        while True:
            now = time.monotonic()
            for msg in self.ecn.tick(now, list(self.datapaths)):
                dp = self.datapaths.get(msg.switch)
                if dp is not None:
                    for ofmsg in encode(dp, msg):
                        dp.send_msg(ofmsg)
            if self.metrics and self.metrics_served:       # nobody scrapes otherwise
                self.metrics.update_ports(self.ecn)
            hub.sleep(max(0.0, self.ecn.telemetry.interval_s - (time.monotonic() - now)))

    def close(self):
        if self.ecn is not None:
            self.ecn.close()
        super().close()

    def _tick_loop(self) -> None:
        while True:
            hub.sleep(TICK_S)
            self.handle(reconcile.Tick())

    # ---- plumbing ------------------------------------------------------------------------
    def handle(self, event: reconcile.Event) -> None:
        """Give the reconciler one event and send what it answers."""
        for msg in self.reconciler.handle(event, time.monotonic()):
            dp = self.datapaths.get(msg.switch)
            if dp is None or (self.dry_run and not self._dry_run_sends(msg)):
                continue
            for ofmsg in encode(dp, msg):
                dp.send_msg(ofmsg)
        self._update_metrics()

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
        if rec.convergences:
            m.convergence.set(rec.convergences[-1])
        for name in self.index.sw:
            table = rec.confirmed.get(name, {})
            state = rec.states.get(name)
            groups = sum(reconcile.GroupKey(g.group_id) in table for g in state.groups) if state else 0
            m.flows.labels(name).set(len(table) - groups)     # the table holds its groups too

    def _name(self, dp) -> str | None:
        return self.index.by_dpid.get(dp.id)

    # ---- events ----------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def on_features(self, ev):
        dp = ev.msg.datapath
        name = self._name(dp)
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
        self.handle(reconcile.SwitchUp(name))
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
        self.handle(reconcile.PortStatus(name, {msg.desc.port_no: up}))

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_port_desc(self, ev):
        dp = ev.msg.datapath
        name = self._name(dp)
        if name is None:
            return
        self.handle(reconcile.PortStatus(name, {d.port_no: port_is_up(dp.ofproto, d) for d in ev.msg.body}))

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
        if name is None:
            LOG.warning("packet-in from unknown datapath %016x ignored", dp.id)
            return "unknown-switch"
        in_port = msg.match.get("in_port")
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
        mac = compiler.arp_answer(self.graph, name, req.dst_ip)
        if mac is None:
            LOG.info("%s port %d: ARP for %s, no such host on this plane, not answered", name, in_port, req.dst_ip)
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
