"""hpnlab's OpenFlow 1.3 controller app: a thin shell around hpnlab.controller.compiler.

Runs on os-ken (``python -m hpnlab.controller SCENARIO``) and, through the import shim, under
Ryu's ``ryu-manager controller/app.py``. Configuration comes from the environment so
both launchers work the same way:

    HPNLAB_SCENARIO      preset name or YAML path (required)
    HPNLAB_SET           scenario overrides, one ``key=value`` per line
    HPNLAB_POLICY        aggregate | host-routes (default aggregate)
    HPNLAB_METRICS_PORT  Prometheus endpoint port (0 or unset: none)
    HPNLAB_METRICS_ADDR  its address (default 127.0.0.1)

What it does: on a switch's connect it wipes the switch's tables and installs the
compiled state; on PortStatus (and on a switch disconnecting) it recompiles the whole
fabric and sends every switch only the difference between desired and installed state;
on a reconnect it reinstalls (the wipe makes duplicates impossible). ARP requests from
host ports reach it as packet-ins at the leaves and are answered with the target host's
real MAC (proxy ARP, no flooding). Anything it cannot use (unknown datapath ids,
malformed or unexpected packet-ins) is logged and ignored.
"""
from __future__ import annotations

import logging
import os

from hpnlab.fabric import graph as fgraph
from hpnlab.fabric import spec as fspec
from hpnlab.fabric.addressing import ip_str

from . import compiler as C
from .ofp import (CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, BaseApp, arp, ether_types,
                  ethernet, hub, ofp_event, ofproto_v1_3, packet, set_ev_cls)

COOKIE = 0x68706E6C61620000  # "hpnlab" in the top bytes: the flows this app owns

LOG = logging.getLogger("hpnlab.controller")


def _config() -> dict:
    scenario = os.environ.get("HPNLAB_SCENARIO")
    if not scenario:
        raise RuntimeError("HPNLAB_SCENARIO is not set: start the controller with 'python -m hpnlab.controller SCENARIO'")
    sets = [s for s in os.environ.get("HPNLAB_SET", "").splitlines() if s.strip()]
    return {"scenario": scenario, "overrides": fspec.parse_overrides(sets),
            "policy": os.environ.get("HPNLAB_POLICY", "aggregate"),
            "metrics_port": int(os.environ.get("HPNLAB_METRICS_PORT") or 0),
            "metrics_addr": os.environ.get("HPNLAB_METRICS_ADDR", "127.0.0.1")}


class HpnController(BaseApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = _config()
        self.policy = cfg["policy"]
        self.scenario = fspec.load(cfg["scenario"], cfg["overrides"])
        self.graph = fgraph.build(self.scenario)
        self.index = C.index_of(self.graph)
        self.datapaths: dict[str, object] = {}          # switch name -> connected datapath
        self.installed: dict[str, dict] = {}            # switch name -> {flow key: actions}
        self.down_ports: set[tuple[str, int]] = set()
        self.lost_switches: set[str] = set()            # connected once, then disconnected
        self.healthy = C.compile_fabric(self.graph, None, self.policy)
        self.states = self.healthy
        self.failures = C.Failures()
        self.metrics = None
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
        LOG.info("scenario %s: %d switches, policy %s, %d flows compiled",
                 self.scenario.name, len(self.index.sw), self.policy,
                 sum(s.flow_count for s in self.states.values()))

    # ---- state -------------------------------------------------------------------
    def _failures(self) -> C.Failures:
        links = set()
        for name, port in self.down_ports:
            lid = self.index.link_at(name, port)
            if lid is not None:
                links.add(lid)
        return C.Failures(frozenset(links), frozenset(self.lost_switches))

    def _recompile(self, reason: str) -> None:
        failures = self._failures()
        if failures == self.failures and self.states is not None:
            return
        self.failures = failures
        self.states = C.compile_fabric(self.graph, failures, self.policy)
        deagg = C.deaggregated(self.states, self.healthy)
        LOG.info("recompiled (%s): %d failed links, %d failed switches, %d de-aggregated routes",
                 reason, len(failures.links), len(failures.switches), deagg)
        if self.metrics:
            self.metrics.recompiles.inc()
            self.metrics.deaggregated.set(deagg)
            self.metrics.failed_links.set(len(failures.links))
            self.metrics.failed_switches.set(len(failures.switches))
        for name, dp in list(self.datapaths.items()):
            self._push(name, dp)

    def _push(self, name: str, dp) -> None:
        """Send a switch the difference between its desired and installed flows."""
        state = self.states.get(name)
        desired = state.expanded() if state else {}
        installed = self.installed.setdefault(name, {})
        adds = [(k, a) for k, a in desired.items() if installed.get(k) != a]
        dels = [k for k in installed if k not in desired]
        # entropy sets before the routes that use them; routes removed before their sets
        adds.sort(key=lambda ka: -ka[0][0])
        dels.sort(key=lambda k: k[0])
        for key, actions in adds:
            self._flow_mod(dp, key, actions, dp.ofproto.OFPFC_ADD)
            installed[key] = actions
        for key in dels:
            self._flow_mod(dp, key, None, dp.ofproto.OFPFC_DELETE_STRICT)
            del installed[key]
        if adds or dels:
            dp.send_msg(dp.ofproto_parser.OFPBarrierRequest(dp))
            LOG.info("%s: %d flows added/changed, %d removed (%d installed)", name, len(adds), len(dels),
                     len(installed))
        if self.metrics:
            self.metrics.flows.labels(name).set(len(installed))
            self.metrics.groups.labels(name).set(len(state.groups) if state else 0)
            self.metrics.flow_mods.labels("add").inc(len(adds))
            self.metrics.flow_mods.labels("delete").inc(len(dels))

    # ---- OpenFlow messages ---------------------------------------------------------------
    @staticmethod
    def _match(parser, match: tuple):
        fields = {}
        for k, v in match:
            if k in ("ipv4_dst", "ipv4_src"):
                v = (ip_str(v[0]), ip_str(v[1])) if isinstance(v, tuple) else ip_str(v)
            fields[k] = v
        return parser.OFPMatch(**fields)

    def _flow_mod(self, dp, key: tuple, actions, command: int) -> None:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        table, priority, match = key
        inst = []
        if actions is not None:
            apply = []
            for act in actions:
                if act[0] == "output":
                    apply.append(parser.OFPActionOutput(act[1]))
                elif act[0] == "controller":
                    apply.append(parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER))
                elif act[0] == "metadata":
                    inst.append(parser.OFPInstructionWriteMetadata(act[1], 0xFFFFFFFF))
                elif act[0] == "goto":
                    inst.append(parser.OFPInstructionGotoTable(act[1]))
            if apply:
                inst.insert(0, parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, apply))
        dp.send_msg(parser.OFPFlowMod(
            datapath=dp, cookie=COOKIE, cookie_mask=0, table_id=table, command=command,
            priority=priority, match=self._match(parser, match), instructions=inst,
            out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, buffer_id=ofp.OFP_NO_BUFFER))

    def _wipe(self, dp) -> None:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        dp.send_msg(parser.OFPFlowMod(datapath=dp, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch()))
        dp.send_msg(parser.OFPGroupMod(datapath=dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL))
        dp.send_msg(parser.OFPBarrierRequest(dp))

    # ---- events ----------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def on_features(self, ev):
        dp = ev.msg.datapath
        name = self.index.by_dpid.get(dp.id)
        if name is None:
            LOG.warning("switch with unknown datapath id %016x connected: not in scenario %s, ignored",
                        dp.id, self.scenario.name)
            if self.metrics:
                self.metrics.unknown_switches.inc()
            return
        LOG.info("%s (dpid %016x) connected", name, dp.id)
        old = self.datapaths.get(name)
        self.datapaths[name] = dp
        self.installed[name] = {}
        self._wipe(dp)
        dp.send_msg(dp.ofproto_parser.OFPPortDescStatsRequest(dp, 0))
        if self.metrics:
            self.metrics.switches_connected.set(len(self.datapaths))
        if old is not None and old is not dp:
            LOG.info("%s reconnected: replacing its old connection", name)
        self.lost_switches.discard(name)
        self._recompile(f"{name} connected")
        self._push(name, dp)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def on_state_change(self, ev):
        dp = ev.datapath
        LOG.debug("state change %s dpid %s", ev.state, dp.id)
        if ev.state != DEAD_DISPATCHER or dp.id is None:
            return
        name = self.index.by_dpid.get(dp.id)
        if name is None or self.datapaths.get(name) is not dp:
            return
        LOG.warning("%s (dpid %016x) disconnected", name, dp.id)
        del self.datapaths[name]
        self.installed.pop(name, None)
        self.lost_switches.add(name)
        if self.metrics:
            self.metrics.switches_connected.set(len(self.datapaths))
            self.metrics.flows.labels(name).set(0)
        self._recompile(f"{name} disconnected")

    def _port_state(self, name: str, port_no: int, down: bool) -> bool:
        if self.index.link_at(name, port_no) is None:
            return False
        key = (name, port_no)
        if down and key not in self.down_ports:
            self.down_ports.add(key)
            return True
        if not down and key in self.down_ports:
            self.down_ports.discard(key)
            return True
        return False

    @staticmethod
    def _is_down(ofp, desc) -> bool:
        return bool(desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def on_port_status(self, ev):
        msg = ev.msg
        dp = msg.datapath
        ofp = dp.ofproto
        name = self.index.by_dpid.get(dp.id)
        if name is None:
            return
        down = msg.reason == ofp.OFPPR_DELETE or self._is_down(ofp, msg.desc)
        if self._port_state(name, msg.desc.port_no, down):
            LOG.info("%s port %d %s", name, msg.desc.port_no, "down" if down else "up")
            self._recompile(f"{name} port {msg.desc.port_no} {'down' if down else 'up'}")

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_port_desc(self, ev):
        dp = ev.msg.datapath
        name = self.index.by_dpid.get(dp.id)
        if name is None:
            return
        changed = False
        for desc in ev.msg.body:
            changed |= self._port_state(name, desc.port_no, self._is_down(dp.ofproto, desc))
        if changed:
            self._recompile(f"{name} port descriptions")

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_error(self, ev):
        msg = ev.msg
        name = self.index.by_dpid.get(msg.datapath.id, f"{msg.datapath.id}")
        LOG.error("%s: OpenFlow error type=%d code=%d", name, msg.type, msg.code)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def on_packet_in(self, ev):
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
        lid = self.index.link_at(name, in_port) if in_port is not None else None
        if lid is None or self.index.sw[name].tier != 1 or not any(h[5] == lid for h in self.index.sw[name].hosts):
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
        mac = C.arp_answer(self.graph, name, req.dst_ip)
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
