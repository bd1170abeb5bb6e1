"""Prometheus metrics of the controller (served on 127.0.0.1, as Faucet does), and beside them
``/health`` (also ``/healthz``): JSON saying whether the controller is doing its job, HTTP 200
when it is and 503 when it is not (``health`` decides, pure), for a load balancer, a systemd
watchdog script or a monitoring probe."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app

from .pfc_metrics import PfcCollector
from .reconcile import GroupKey

HEALTH_PATHS = ("/health", "/healthz")
#: telemetry counts as stale when its last sample is older than this many intervals (or STALE_MIN_S)
STALE_INTERVALS = 5
STALE_MIN_S = 2.0
MISSING_SHOWN = 8     # switch names listed in a health answer's problem line


def health(*, uptime_s: float, expected: Sequence[str], connected: Sequence[str], last_recompile_unix: float | None,
           last_recompile_age_s: float | None, telemetry_interval_s: float, telemetry_age_s: float | None,
           ) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of a health check, from plain values (pure).

    Healthy (200) when every switch of the scenario is connected and, with telemetry on, its last
    sample is fresh: at most ``STALE_INTERVALS`` intervals (and ``STALE_MIN_S``) old; before the
    first sample, only once the controller has been up that long. Anything else is 503, each
    reason one line in ``problems``."""
    problems = []
    missing = sorted(set(expected) - set(connected))
    if missing:
        shown = ", ".join(missing[:MISSING_SHOWN]) + (", ..." if len(missing) > MISSING_SHOWN else "")
        problems.append(f"{len(missing)} of {len(expected)} switches not connected: {shown}")
    tel: dict[str, Any] = {"enabled": telemetry_interval_s > 0}
    if telemetry_interval_s > 0:
        limit = max(STALE_INTERVALS * telemetry_interval_s, STALE_MIN_S)
        tel.update(interval_s=telemetry_interval_s, age_s=_round(telemetry_age_s), stale_after_s=limit)
        if telemetry_age_s is None:
            if uptime_s > limit:
                problems.append(f"no telemetry sample in {uptime_s:.1f} s")
        elif telemetry_age_s > limit:
            problems.append(f"telemetry is {telemetry_age_s:.1f} s old (stale after {limit:g} s)")
    body = {"status": "unhealthy" if problems else "ok", "up": True, "uptime_s": _round(uptime_s),
            "switches": {"connected": len(set(connected) & set(expected)), "expected": len(expected),
                         "missing": missing},
            "last_recompile": {"unix": last_recompile_unix, "age_s": _round(last_recompile_age_s)},
            "telemetry": tel, "problems": problems}
    return (503 if problems else 200), body


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


_NOTHING: dict = {}      # a switch that confirmed nothing yet (never changed: the flow gauge's cache keeps it)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


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
        self.arp_fallbacks = Counter("hpnlab_arp_fallbacks", "Leaves that fell back to per-host ARP responders "
                                     "because the switch rejected a gateway-MAC action (controller/arp_fallback.py)",
                                     ["switch"], registry=r)
        self.flow_mods = Counter("hpnlab_flow_mods", "Flow-mod messages sent", ["command"], registry=r)
        self.packet_ins = Counter("hpnlab_packet_ins", "Packet-ins by outcome", ["outcome"], registry=r)
        self.unknown_switches = Counter("hpnlab_unknown_switch_connects",
                                        "Connections from datapath ids not in the scenario", registry=r)
        self.healthy = Gauge("hpnlab_healthy", "1 when /health answers 200 (every switch connected, telemetry "
                             "fresh), else 0", registry=r)

        # ---- fabric telemetry and dynamic ECN (fabric/routing/telemetry.py, controller/ecn_loop.py) ----
        labels = ["switch", "port", "peer"]
        self.port_tx = Gauge("hpnlab_port_tx_bits_per_second", "Switch egress port: bits/s sent in the last "
                             "telemetry interval", labels, registry=r)
        self.port_util = Gauge("hpnlab_port_utilisation", "Switch egress port: sent rate / the port's rate",
                               labels, registry=r)
        self.port_queue = Gauge("hpnlab_port_queue_bytes", "Switch egress port: the ECN stage's queue estimate",
                                labels, registry=r)
        self.port_queue_peak = Gauge("hpnlab_port_queue_peak_bytes", "Switch egress port: the ECN stage's queue "
                                     "peak over the last telemetry interval", labels, registry=r)
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
        # ---- weighted multipath (fabric/routing/weights.py) ----
        self.multipath_weight = Gauge("hpnlab_multipath_weight_patterns", "Weighted mode: entropy patterns of a "
                                      "multipath set (metadata 'set') that go to this port", ["switch", "port", "set"],
                                      registry=r)
        self.multipath_load = Gauge("hpnlab_multipath_load_score", "Weighted mode: the port's smoothed congestion "
                                    "score (utilisation + queue + CE terms) the weights follow", ["switch", "port"],
                                    registry=r)
        self.weight_changes = Counter("hpnlab_multipath_weight_changes", "Multipath sets re-weighted", registry=r)
        self._weights_seen = 0
        self._ecn_seen = (0, 0.0)
        #: switch -> (its confirmed table, its length, its compiled state) when its flow gauge was last set: the
        #: gauge is recounted only for a switch whose table (another object, or a length changed) or state changed.
        #: Counting every switch's groups at every event cost 50 ms an event on alibaba-hpn, most of a cold start's
        #: CPU (docs/results/2026-12-07-controller-scale.md). A step's batch changes groups or flows, never both.
        self._flow_counts: dict[str, tuple[Any, int, Any]] = {}
        #: () -> (HTTP status, JSON body) for /health (the app sets it; ``health`` decides)
        self.health_source: Callable[[], tuple[int, dict[str, Any]]] | None = None

    def update_reconciler(self, rec: Any, before: Mapping[str, int], switches: Iterable[str], connected: int,
                          healthy: bool) -> None:
        """Gauges and counters from a ``reconcile.Reconciler`` (``before``: its counters at the last update),
        the number of switches connected and whether /health answers 200."""
        counters = rec.counters
        if counters["recompiles"] != before["recompiles"]:
            self.deaggregated.set(rec.deaggregated())
            self.failed_links.set(len(rec.failures.links))
            self.failed_switches.set(len(rec.failures.switches))
        self.recompiles.inc(counters["recompiles"] - before["recompiles"])
        self.resyncs.inc(counters["resyncs"] - before["resyncs"])
        self.errors.inc(counters["errors"] - before["errors"])
        for command in ("add", "modify", "delete"):
            self.flow_mods.labels(command).inc(counters[command] - before[command])
        self.switches_connected.set(connected)
        self.healthy.set(1 if healthy else 0)
        if rec.convergences:
            self.convergence.set(rec.convergences[-1])
        counts = self._flow_counts
        for name in switches:
            table = rec.confirmed.get(name, _NOTHING)
            state = rec.states.get(name)
            held = counts.get(name)
            if held is not None and held[0] is table and held[1] == len(table) and held[2] is state:
                continue
            groups = sum(GroupKey(g.group_id) in table for g in state.groups) if state else 0
            counts[name] = (table, len(table), state)
            self.flows.labels(name).set(len(table) - groups)     # the table holds its groups too

    def watch_pfc(self, run_id: str | None) -> None:
        """Priority flow control's series from the emulation's stage, read at each scrape (``pfc_metrics``)."""
        self.registry.register(PfcCollector(run_id))

    def update_ports(self, loop: Any) -> None:
        """Per-port gauges from an ``ecn_loop.EcnLoop``'s last sample and thresholds in force."""
        ports = loop.telemetry.ports
        for key, s in loop.last.items():
            lab = (key[0], str(key[1]), ports[key].peer)
            self.port_tx.labels(*lab).set(s.tx_bps)
            self.port_util.labels(*lab).set(s.utilisation)
            if s.queue_bytes is not None:
                self.port_queue.labels(*lab).set(s.queue_bytes)
            if s.queue_peak_bytes is not None:
                self.port_queue_peak.labels(*lab).set(s.queue_peak_bytes)
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

    def update_weights(self, weights: Any, sets: Any) -> None:
        """Per-port gauges of a ``weights.Weights`` (its smoothed scores and each set's weights);
        ``sets``: ``WeightedTables.sets()`` (which sets and ports exist)."""
        for sw, by_meta in sets.items():
            for meta, es in by_meta.items():
                st = weights.sets.get((sw, meta))
                counts = st.counts if st is not None else es.counts()
                for port in es.ports:
                    self.multipath_weight.labels(sw, str(port), f"{meta:#x}").set(counts.get(port, 0))
                    self.multipath_load.labels(sw, str(port)).set(weights.scores.get((sw, port), 0.0))
        self.weight_changes.inc(max(0, weights.n_changes - self._weights_seen))
        self._weights_seen = weights.n_changes

    def wsgi_app(self) -> Callable:
        """/health and /healthz (``health_source``'s answer), everything else Prometheus's."""
        metrics_app = make_wsgi_app(self.registry)

        def app(environ: dict, start_response: Callable) -> list[bytes]:
            if environ.get("PATH_INFO") in HEALTH_PATHS:
                if self.health_source is None:
                    status, body = 503, {"status": "unknown", "up": True, "problems": ["no health source"]}
                else:
                    status, body = self.health_source()
                data = (json.dumps(body, sort_keys=True) + "\n").encode()
                start_response(f"{status} {'OK' if status == 200 else 'Service Unavailable'}",
                               [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
                return [data]
            return metrics_app(environ, start_response)
        return app

    def serve(self, port: int, addr: str = "127.0.0.1", hub=None) -> None:
        """Serve /metrics and /health. Under an eventlet hub, as a green WSGI server of the hub
        (a server thread would block the whole process in a real select()); otherwise on a
        thread of its own."""
        wsgi_server = getattr(hub, "WSGIServer", None) if hub is not None else None
        if wsgi_server is not None:
            server = wsgi_server((addr, port), self.wsgi_app())
            hub.spawn(server.serve_forever)
        else:
            httpd = make_server(addr, port, self.wsgi_app(), handler_class=_QuietHandler)
            threading.Thread(target=httpd.serve_forever, name="hpnlab-metrics", daemon=True).start()
