"""Prometheus metrics of the controller (served on 127.0.0.1, as Faucet does)."""
from __future__ import annotations

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
