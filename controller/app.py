"""hpnlab's OpenFlow 1.3 controller app: the os-ken shell around the pure reconciler.

Started by the launcher (``python -m hpnlab.controller SCENARIO``, ``hpnlab controller``), which builds
the configuration once (controller/conf.py), writes it to the run directory and hands the app its path
(``HpnController(hpnlab_config=PATH)``); the app reads it once.

Every decision (link state, what to recompile, the diff and its order, what counts as installed, when
to resynchronise a switch) is made by ``hpnlab.controller.reconcile``: this module decodes os-ken
events into reconciler events (switch features -> SwitchUp, disconnect -> SwitchDown, PortStatus and
port descriptions -> PortStatus, BarrierReply, ErrorMsg, FlowStatsReply, GroupDescStatsReply, a
one-second Tick), dispatches the rest to its collaborators, and encodes the reconciler's messages into
OpenFlow 1.3 (controller/codec.py). The collaborators, one concern each, wrap their own pure deciders
(controller/shell.py lists them): discovery and the wiring gate, the deployment and its adoption, the
staged rollout, telemetry with dynamic ECN and weighted multipath, proxy ARP and its per-leaf fallback,
the dry run. Anything the app cannot use (unknown datapath ids, malformed or unexpected packet-ins) is
logged and ignored.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, ClassVar

import networkx as nx

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph as fgraph

from . import conf, reconcile
from .adoption_manager import AdoptionManager
from .arp_manager import ArpManager
from .codec import (
    decode_flow_stats,
    decode_group_desc,
    encode,
    fast_failover_supported,
    is_lldp,
    port_is_up,
)
from .dryrun_manager import DryRunManager
from .ofp import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    BaseApp,
    hub,
    ofp_event,
    ofproto_v1_3,
    set_ev_cls,
)
from .rollout_manager import RolloutManager
from .telemetry_manager import TelemetryManager
from .wiring_manager import WiringManager

TICK_S = 1.0
#: a tick that finds the controller used this share of a CPU since the last one finds it busy
BUSY_CPU_SHARE = 0.8
LOG = logging.getLogger("hpnlab.controller")


class HpnController(BaseApp):
    OFP_VERSIONS: ClassVar[list[int]] = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args: Any, hpnlab_config: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if hpnlab_config is None:
            raise RuntimeError("the app reads its configuration from a file: start the controller with "
                               "'python -m hpnlab.controller SCENARIO' (or 'hpnlab controller')")
        cfg = conf.read(hpnlab_config)
        self.config = cfg
        self.policy = cfg.routing.policy
        self.scenario = cfg.load_scenario()
        self.dry_run = cfg.dry_run.enabled
        self.adoption = AdoptionManager(self, fgraph.build(self.scenario), cfg.wiring.deployment,
                                        cfg.wiring.deployment_out)
        self.graph: nx.MultiGraph = self.adoption.graph
        self.index = compiler.index_of(self.graph)
        self.datapaths: dict[str, Any] = {}             # switch name -> connected os-ken Datapath
        # One handle at a time across greenthreads, re-entrant within one (the launcher patches threading
        # for eventlet, so this lock is per greenthread). A handle blocks in send_msg when a switch's send
        # queue is full; without it the tick loop's handle ran meanwhile and slipped a read-back between a
        # step's messages, which then missed the groups the rest of the step added (GROUP_EXISTS errors,
        # resynchronised, again and again: alibaba-hpn's cold start on simulated switches).
        self._one_at_a_time = threading.RLock()
        self.started = time.monotonic()
        self.metrics: Any = None
        self.metrics_served = bool(cfg.metrics.port)
        self.telemetry = TelemetryManager(self, cfg.routing, cfg.ecn, self.adoption.scenario_graph)
        self.arp = ArpManager(self, cfg.routing.arp)
        self.reconciler = reconcile.Reconciler(self.graph, self.policy, cfg.routing.confirm_timeout_s,
                                               fast_failover=cfg.routing.fast_failover,
                                               compile_fn=self.telemetry.compile_fn, arp=self.arp.mode,
                                               reads_at_once=cfg.routing.reads_at_once)
        self._counted = dict(self.reconciler.counters)  # counters already passed to the metrics
        self._recompiled_at = (time.time(), self.started)   # (wall, monotonic) of the last compile, for /health
        self._recompiles_seen = 0
        self._start_metrics(cfg)
        self.dry_runner = DryRunManager(self)
        self.wiring = WiringManager(self, cfg.wiring.on_miswire, cfg.wiring.out, cfg.wiring.discovery_s)
        self.rollout = RolloutManager(self, cfg.rollout.mode, cfg.rollout.probe, cfg.rollout.out)
        #: --on-miswire off: changes wait until every switch told its ports (wiring.release_ungated)
        self.reconciler.hold = cfg.wiring.on_miswire == "off" and not self.dry_run
        LOG.info("scenario %s: %d switches, policy %s, %d flows compiled",
                 self.scenario.name, len(self.index.sw), self.policy,
                 sum(s.flow_count for s in self.reconciler.states.values()))

    def _start_metrics(self, cfg: conf.ControllerConfig) -> None:
        try:
            # prometheus-client is optional (the controller extra)
            from .metrics import Metrics
            self.metrics = Metrics()
        except ImportError:  # prometheus_client missing: run without metrics
            LOG.warning("prometheus_client is not installed: no metrics endpoint")
            return
        self.metrics.switches_expected.set(len(self.index.sw))
        self.metrics.health_source = self._health
        self.metrics.watch_pfc(cfg.ecn.stage_run)
        if cfg.metrics.port:
            addr = cfg.metrics.listen or cfg.openflow.listen
            self.metrics.serve(cfg.metrics.port, addr, hub)
            LOG.info("metrics on http://%s:%d/metrics", addr, cfg.metrics.port)

    def start(self):
        thread = super().start()
        if not self.dry_run:         # a dry run answers no barrier: no timeouts, no resyncs
            self.threads.append(hub.spawn(self._tick_loop))
        elif self.metrics:           # ...but its gauges still follow what it has read, once a tick
            self.threads.append(hub.spawn(self._metrics_loop))
        if self.telemetry.ecn is not None:
            self.threads.append(hub.spawn(self.telemetry.run))
        return thread

    def close(self):
        self.telemetry.close()
        super().close()

    def _tick_loop(self) -> None:
        wall, cpu = time.monotonic(), time.process_time()
        while True:
            hub.sleep(TICK_S)
            self.wiring.tick()
            # the controller's share of a CPU since the last tick: near 1, an answer may be waiting on
            # its side (os-ken parsing a reply, an event queued), not the switch's
            now_wall, now_cpu = time.monotonic(), time.process_time()
            share = (now_cpu - cpu) / max(now_wall - wall, 1e-3)
            wall, cpu = now_wall, now_cpu
            self.handle(reconcile.Tick(backlog=self.events.qsize(), busy=share >= BUSY_CPU_SHARE))
            self.rollout.poll()

    def _metrics_loop(self) -> None:
        while self.is_active:        # ends with the app: a dry run's process stops once its report is out
            hub.sleep(TICK_S)
            with self._one_at_a_time:
                self._update_metrics()

    def rebase(self, g: nx.MultiGraph) -> None:
        """Run on ``g`` from now on (the adoption manager's: numbers found at run time): a new index and a new
        reconciler, which reads back every switch it is handed as after a restart; the per-leaf ARP fallback
        and the hold carried over; telemetry and weighted multipath on the new numbers."""
        old, self.graph = self.graph, g
        self.index = compiler.index_of(g)
        self.telemetry.rebase(self.adoption.scenario_graph, old, g)
        fallen_back, hold = self.reconciler.arp_leaves, self.reconciler.hold
        self.reconciler = reconcile.Reconciler(g, self.policy, self.reconciler.confirm_timeout_s,
                                               fast_failover=self.reconciler.fast_failover,
                                               compile_fn=self.telemetry.compile_fn, arp=self.arp.mode,
                                               reads_at_once=self.reconciler.reads_at_once)
        self.reconciler.hold = hold
        for leaf, mode in sorted(fallen_back.items()):       # the per-leaf ARP fallback outlives the renumbering
            self.reconciler.handle(reconcile.ArpMode(leaf, mode))
        self._counted = dict(self.reconciler.counters)
        self._recompiles_seen = self.reconciler.counters["recompiles"]

    # ---- plumbing ------------------------------------------------------------------------
    def handle(self, event: reconcile.Event) -> None:
        """Give the reconciler one event and send what it answers (one event at a time: see
        ``_one_at_a_time``)."""
        with self._one_at_a_time:
            self._handle(event)

    def _handle(self, event: reconcile.Event) -> None:
        for msg in self.reconciler.handle(event, time.monotonic()):
            dp = self.datapaths.get(msg.switch)
            if dp is None or (self.dry_run and not self.dry_runner.sends(msg)):
                continue
            for ofmsg in encode(dp, msg):
                dp.send_msg(ofmsg)
                if isinstance(msg, reconcile.FlowMod) and msg.command != "delete":
                    self.arp.sent(dp.id, ofmsg.xid, msg)
            if isinstance(msg, reconcile.WipeTables) and self.wiring.enabled:
                self.wiring.lldp_rule(dp)          # the wipe took it too
        self.reconciler.sent(time.monotonic())      # a switch's time to confirm counts from here
        if self.reconciler.counters["recompiles"] != self._recompiles_seen:
            self._recompiles_seen = self.reconciler.counters["recompiles"]
            self._recompiled_at = (time.time(), time.monotonic())
        if isinstance(event, reconcile.Tick):
            # once a tick, not once an event: at hpn-130k the gauges' walk over every switch and /health's
            # check, after each of a link failure's 512 barrier replies, were 60% of the controller's CPU
            self._update_metrics()
        if isinstance(event, reconcile.BarrierReply):
            self.rollout.poll()
        if self.reconciler.hold and not self.wiring.enabled and isinstance(event, (
                reconcile.FlowStatsReply, reconcile.GroupDescReply, reconcile.PortStatus)):
            self.wiring.ungated_check()
        self.wiring.check_installed()

    def dry_run_report(self, final: bool = False) -> dict | None:
        """The dry run's report (``DryRunManager.report``; the launcher waits for it)."""
        return self.dry_runner.report(final)

    def _update_metrics(self) -> None:
        if not self.metrics:
            return
        counters = self.reconciler.counters
        self.metrics.update_reconciler(self.reconciler, self._counted, self.index.sw, len(self.datapaths),
                                       healthy=self._health()[0] == 200)
        self._counted = dict(counters)

    def _health(self) -> tuple[int, dict]:
        """/health's answer (``metrics.health`` decides)."""
        # only with metrics on (prometheus-client is optional)
        from .metrics import health
        now = time.monotonic()
        wall, at = self._recompiled_at
        return health(uptime_s=now - self.started, expected=list(self.index.sw), connected=list(self.datapaths),
                      last_recompile_unix=round(wall, 3), last_recompile_age_s=now - at,
                      telemetry_interval_s=self.telemetry.interval_s,
                      telemetry_age_s=None if self.telemetry.at is None else now - self.telemetry.at)

    def _name(self, dp) -> str | None:
        return self.index.by_dpid.get(dp.id)

    # ---- events ----------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def on_features(self, ev):
        dp = ev.msg.datapath
        name = self._name(dp)
        if name is None and self.adoption.auto and self.wiring.enabled:
            self.adoption.stranger_connected(dp)
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
        self.wiring.connected(name, dp)
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
        self.wiring.disconnected(name)
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
        self.wiring.port_seen(name, msg.desc, up)
        self.handle(reconcile.PortStatus(name, self.wiring.filter(name, {msg.desc.port_no: up}),
                                         more=self._port_status_queued()))
        if up:
            self.wiring.send_lldp(name)      # who is on the other end now

    def _port_status_queued(self) -> bool:
        """Another PortStatus waits in the app's event queue: a spine's failure reaches the controller as one
        from each of its neighbours, and the reconciler recompiles once for all of them (PortStatus.more)."""
        queued = getattr(self.events, "queue", None)       # os-ken's hub.Queue keeps its items in a deque
        return queued is not None and any(isinstance(item[0], ofp_event.EventOFPPortStatus) for item in list(queued))

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_port_desc(self, ev):
        dp, body = ev.msg.datapath, ev.msg.body
        name = self._name(dp)
        if name is None:
            self.adoption.stranger_ports(dp, body)
            return
        wiring = self.wiring
        errors_before = name in self.adoption.errors
        renumbered = self.adoption.resolve(name, dp.ofproto, body)
        ports = {d.port_no: port_is_up(dp.ofproto, d) for d in body}
        for d in body:
            wiring.port_seen(name, d, ports[d.port_no])
        if renumbered:
            self.adoption.renumbered(name, ports)
        else:
            self.handle(reconcile.PortStatus(name, wiring.filter(name, ports)))
            if errors_before != (name in self.adoption.errors) and wiring.decision is not None:
                wiring.decide()      # its plane held back, or given back
            elif not wiring.enabled or (wiring.decision is not None and wiring.plane_allowed(name)):
                wiring.release(name)        # resolved: no longer pending
        wiring.send_lldp(name)

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
        self.arp.error(name, msg)
        self.handle(reconcile.Error(name, msg.xid, msg.type, msg.code))

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def on_flow_stats(self, ev):
        if not self.wiring.lldp_held(ev.msg):          # else: the answer to the LLDP rule's question
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
        if name is not None:
            self.telemetry.port_stats(name, ev.msg.body, ev.msg.xid)

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
        """Where a packet-in goes: LLDP to discovery, a stranger's host frame to the adoption, a caught probe
        to the rollout, ARP from a host port to proxy ARP; the outcome, for the metrics."""
        dp, data = msg.datapath, bytes(msg.data)
        name = self.index.by_dpid.get(dp.id)
        in_port = msg.match.get("in_port")
        if name is None and dp.id in self.adoption.strangers:
            if is_lldp(data):
                return self.wiring.lldp_in(f"dpid:{dp.id:016x}", in_port, data)
            return self.adoption.host_seen(dp.id, in_port, data)
        if name is None:
            LOG.warning("packet-in from unknown datapath %016x ignored", dp.id)
            return "unknown-switch"
        if is_lldp(data):
            return self.wiring.lldp_in(name, in_port, data)
        if self.rollout.state is not None and not self.index.is_host_port(name, in_port or 0):
            caught = self.rollout.probe_in(name, data)
            if caught is not None:
                return caught
        if in_port is None or not self.index.is_host_port(name, in_port):
            LOG.warning("%s: packet-in on port %s which is not a host port, ignored", name, in_port)
            return "ignored"
        return self.arp.answer(dp, name, in_port, data)
