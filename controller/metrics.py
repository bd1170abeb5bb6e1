"""Prometheus metrics of the controller (served on 127.0.0.1, as Faucet does)."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app, start_http_server


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.switches_expected = Gauge("hpnlab_switches_expected", "Switches in the scenario", registry=r)
        self.switches_connected = Gauge("hpnlab_switches_connected", "Switches connected now", registry=r)
        self.flows = Gauge("hpnlab_switch_flows", "OpenFlow flows a switch has confirmed (barrier answered)",
                           ["switch"], registry=r)
        self.convergence = Gauge("hpnlab_last_convergence_seconds",
                                 "From the last event that changed the fabric's target (a port or switch down or "
                                 "up) to every connected switch confirming its new state", registry=r)
        self.recompiles = Counter("hpnlab_recompiles", "Times the fabric state was recompiled", registry=r)
        self.deaggregated = Gauge("hpnlab_deaggregated_routes",
                                  "Routes present only because of failures (de-aggregation)", registry=r)
        self.failed_links = Gauge("hpnlab_failed_links", "Fabric links seen down", registry=r)
        self.failed_switches = Gauge("hpnlab_failed_switches", "Switches that disconnected", registry=r)
        self.resyncs = Counter("hpnlab_resyncs", "Switches resynchronised from flow stats (error or timeout)",
                               registry=r)
        self.errors = Counter("hpnlab_openflow_errors", "OpenFlow error messages from known switches", registry=r)
        self.flow_mods = Counter("hpnlab_flow_mods", "Flow-mod messages sent", ["command"], registry=r)
        self.packet_ins = Counter("hpnlab_packet_ins", "Packet-ins by outcome", ["outcome"], registry=r)
        self.unknown_switches = Counter("hpnlab_unknown_switch_connects",
                                        "Connections from datapath ids not in the scenario", registry=r)

        # ---- fabric telemetry and dynamic ECN (controller/telemetry.py, controller/ecn_loop.py) ----
        labels = ["switch", "port", "peer"]
        self.port_tx = Gauge("hpnlab_port_tx_bits_per_second", "Switch egress port: bits/s sent in the last "
                             "telemetry interval", labels, registry=r)
        self.port_util = Gauge("hpnlab_port_utilisation", "Switch egress port: sent rate / the port's rate",
                               labels, registry=r)
        self.port_queue = Gauge("hpnlab_port_queue_bytes", "Switch egress port: the ECN stage's queue estimate",
                                labels, registry=r)
        self.port_ce = Gauge("hpnlab_port_ce_marked_per_second", "Switch egress port: packets/s marked CE",
                             labels, registry=r)
        self.port_ce_fraction = Gauge("hpnlab_port_ce_marked_fraction", "Switch egress port: share of its "
                                      "packets marked CE in the last interval", labels, registry=r)
        self.port_drops = Counter("hpnlab_port_drops", "Switch egress port: packets dropped (OpenFlow tx_dropped "
                                  "plus the ECN stage's drops)", labels, registry=r)
        self.port_kmin = Gauge("hpnlab_port_ecn_kmin_bytes", "Switch egress port: ECN Kmin in force", labels,
                               registry=r)
        self.port_kmax = Gauge("hpnlab_port_ecn_kmax_bytes", "Switch egress port: ECN Kmax in force", labels,
                               registry=r)
        self.port_pmax = Gauge("hpnlab_port_ecn_pmax", "Switch egress port: ECN Pmax in force", labels, registry=r)
        self.ecn_changes = Counter("hpnlab_ecn_threshold_changes", "ECN threshold changes applied by the policy",
                                   registry=r)
        self.telemetry_interval = Gauge("hpnlab_telemetry_interval_seconds",
                                        "Achieved time between the last two telemetry samples", registry=r)
        self.telemetry_cpu = Counter("hpnlab_telemetry_cpu_seconds",
                                     "CPU seconds the controller spent on telemetry and the ECN policy", registry=r)
        self._ecn_seen = (0, 0.0)

    def update_ports(self, loop: Any) -> None:
        """Per-port gauges from an ``ecn_loop.EcnLoop``'s last sample and thresholds in force."""
        ports = loop.telemetry.ports
        for key, s in loop.last.items():
            lab = (key[0], str(key[1]), ports[key].peer)
            self.port_tx.labels(*lab).set(s.tx_bps)
            self.port_util.labels(*lab).set(s.utilisation)
            if s.queue_bytes is not None:
                self.port_queue.labels(*lab).set(s.queue_bytes)
            self.port_ce.labels(*lab).set(s.ce_marked_pps)
            self.port_ce_fraction.labels(*lab).set(s.ce_fraction)
            if s.drops:
                self.port_drops.labels(*lab).inc(s.drops)
            th = loop.current.get(key)
            if th is not None:
                self.port_kmin.labels(*lab).set(th.kmin)
                self.port_kmax.labels(*lab).set(th.kmax)
                self.port_pmax.labels(*lab).set(th.pmax)
        n, cpu = loop.n_changes, loop.cpu_s
        self.ecn_changes.inc(max(0, n - self._ecn_seen[0]))
        self.telemetry_cpu.inc(max(0.0, cpu - self._ecn_seen[1]))
        self._ecn_seen = (n, cpu)
        if loop.telemetry.intervals:
            self.telemetry_interval.set(loop.telemetry.intervals[-1])

    def serve(self, port: int, addr: str = "127.0.0.1", hub=None) -> None:
        """Serve /metrics. Under an eventlet hub, as a green WSGI server of the hub (the
        prometheus_client thread would block the whole process in a real select());
        otherwise on prometheus_client's own thread."""
        wsgi_server = getattr(hub, "WSGIServer", None) if hub is not None else None
        if wsgi_server is not None:
            server = wsgi_server((addr, port), make_wsgi_app(self.registry))
            hub.spawn(server.serve_forever)
        else:
            start_http_server(port, addr=addr, registry=self.registry)
