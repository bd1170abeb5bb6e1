"""Telemetry, dynamic ECN and weighted multipath: every interval, port statistics requested from the
switches and the ECN stage read, the ECN policy's decisions applied (controller/ecn_loop.py, which runs
the policy of controller/ecn_policy.py), and in weighted mode the multipath weights decided from the same
sample (fabric/routing/weights.py), the changed sets' states given to the reconciler.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import networkx as nx

from hpnlab.fabric.routing import compiler, telemetry, weights

from . import codec, ecn_loop, ecn_policy, reconcile
from .conf import Ecn, Routing
from .control_file import ControlFile
from .ofp import hub
from .shell import Shell

LOG = logging.getLogger("hpnlab.controller")


def _open_pfc_stage(run_id: str | None) -> Any | None:
    """The run's PFC stage (``pfc_metrics.open_stage``), or None; without prometheus-client (optional, the
    controller extra) no PFC telemetry either."""
    try:
        from .pfc_metrics import open_stage  # prometheus-client is optional: imported only here
    except ImportError:
        return None
    return open_stage(run_id)


class TelemetryManager:
    def __init__(self, app: Shell, routing: Routing, ecn: Ecn, scenario_graph: nx.MultiGraph):
        self.app = app
        self.weights: weights.Weights | None = None
        self.weighted: weights.WeightedTables | None = None
        self._weights_control = ControlFile(routing.weights_control, "routing weights") \
            if routing.weights_control else None
        if routing.weights == "weighted":
            self.weighted = weights.WeightedTables(app.graph)
            self.weights = weights.Weights()
            LOG.info("routing weights: weighted (sets widened to %s)", ", ".join(
                f"{bin(a).count('1')}->{bin(b).count('1')} bits" for a, b in self.weighted.masks.items()) or "-")
        self.at: float | None = None        # monotonic time of the last telemetry sample with data
        #: telemetry and the ECN policy, unless the interval is 0 (or in a dry run)
        self.ecn = None if app.dry_run else self._ecn_loop(ecn, scenario_graph)

    @property
    def compile_fn(self) -> Any:
        """The reconciler's compile function: the weighted tables', or the compiler's."""
        return self.weighted or compiler.compile_fabric

    @property
    def interval_s(self) -> float:
        return self.ecn.telemetry.interval_s if self.ecn is not None else 0.0

    def _ecn_loop(self, cfg: Ecn, scenario_graph: nx.MultiGraph) -> ecn_loop.EcnLoop | None:
        if cfg.telemetry_interval_ms <= 0:
            return None
        app = self.app
        mtu = app.scenario.emulation.mtu
        tel = telemetry.Telemetry(telemetry.fabric_ports(app.graph), cfg.telemetry_interval_ms / 1000)
        out = open(cfg.telemetry_out, "w") if cfg.telemetry_out else None   # noqa: SIM115 (closed in close())
        loop = ecn_loop.EcnLoop(tel, ecn_policy.load(cfg.policy, mtu), cfg.actuator, mtu, out, cfg.stage_run,
                                control=cfg.control, stage_keys=telemetry.port_renumbering(scenario_graph, app.graph),
                                open_pfc=_open_pfc_stage)
        LOG.info("telemetry every %g ms, ECN policy %s, actuator %s%s", cfg.telemetry_interval_ms, loop.policy.name,
                 loop.spec, f", written to {cfg.telemetry_out}" if out else "")
        return loop

    def run(self) -> None:
        """The telemetry thread: one tick per interval."""
        assert self.ecn is not None
        app = self.app
        while True:
            now = time.monotonic()
            requests = self.ecn.tick(now, list(app.datapaths))
            if self.ecn.last:
                self.at = now
            for msg in requests:
                dp = app.datapaths.get(msg.switch)
                if dp is not None:
                    codec.send(dp, msg)
            if self.weights is not None:
                self._reweight(now)
            if app.metrics and app.metrics_served:       # nobody scrapes otherwise
                app.metrics.update_ports(self.ecn)
                if self.weights is not None and self.weighted is not None:
                    app.metrics.update_weights(self.weights, self.weighted.sets())
            hub.sleep(max(0.0, self.ecn.telemetry.interval_s - (time.monotonic() - now)))

    def port_stats(self, name: str, body, xid: int) -> None:
        """A port statistics reply of a known switch (decoded) to the ECN loop."""
        if self.ecn is not None:
            self.ecn.port_stats(name, time.monotonic(), codec.decode_port_stats(body), xid)

    # ---- weighted multipath (fabric/routing/weights.py decides, the reconciler sends the difference) ----
    def _reweight(self, now: float) -> None:
        """One decision of the weights from the last telemetry sample; the changed sets' states go to
        the reconciler (only the moved patterns' entries are sent)."""
        assert self.weights is not None and self.weighted is not None and self.ecn is not None
        self._check_weights_control()
        if not self.ecn.last:
            return
        rec = self.app.reconciler
        dead = compiler.dead_ports(self.app.graph, rec.failures) if rec.failures else {}
        changes = self.weights.decide(now, self.ecn.last, self.weighted.sets(), dead)
        if not changes:
            return
        for c in changes:
            LOG.info("%s", c.line())
            self.ecn.record(c.as_dict(now))      # the telemetry file (a comparison reads its cells' changes)
        self.app.handle(reconcile.Restate(self.weighted.restate(changes)))

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

    # ---- a new graph (controller/adoption_manager.py) ----------------------------------------------
    def rebase(self, scenario_graph: nx.MultiGraph, old: nx.MultiGraph, g: nx.MultiGraph) -> None:
        """The fabric on other port numbers: weighted multipath's sets on them, telemetry polling the ports
        on them and reading the ECN stage there."""
        if self.weighted is not None:
            self.weighted = weights.WeightedTables(g)
            self.weights = weights.Weights()
        if self.ecn is not None:
            self.ecn.rebase(telemetry.fabric_ports(g), telemetry.port_renumbering(scenario_graph, g),
                            telemetry.port_renumbering(old, g))

    def close(self) -> None:
        if self.ecn is not None:
            self.ecn.close()
