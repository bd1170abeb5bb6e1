"""The staged rollout (controller/rollout.py decides): one plane at a time; once a plane's switches hold
their state, probes injected at source leaves and caught as packet-ins (host to host, or where they enter
the destination leaf); a plane whose probes do not all arrive is taken back from the reconciler and wiped.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from hpnlab.fabric.routing.oftable import FabricTables

from . import codec, reconcile, rollout
from .shell import Shell

LOG = logging.getLogger("hpnlab.controller")
PROBE_WAIT_S = 1.0                 # a stage's probes have this long to arrive (twice: missing ones are resent)
CATCH_WAIT_S = 0.3                 # the catching rules in place first (other switches), before the probes


class RolloutManager:
    def __init__(self, app: Shell, mode: str, probe: str, out: str | None):
        self.app = app
        self.mode = mode                  # all, staged
        self.probe = probe                # rollout.PROBE_MODES
        self.out = out
        self.state: rollout.Rollout | None = None     # --rollout staged (set by ``begin``)
        self.probes: list[rollout.Probe] = []
        self.arrivals: dict[int, str] = {}
        self.probe_sent_at = 0.0
        self._probe_resent = False
        self.catch_at = 0.0
        self._busy = False
        self._gauge: Any = None

    def begin(self, planes: tuple[int, ...]) -> None:
        """The wiring decided which planes may be installed: a staged rollout starts with them (once)."""
        if self.mode != "staged" or self.state is not None:
            return
        self.state = rollout.Rollout.of(planes, self.probe)
        LOG.info("staged rollout: plane(s) %s, one at a time, probed %s",
                 ", ".join(map(str, self.state.planes)) or "none",
                 "host to host" if self.probe == "hosts" else "to the destination leaves' uplinks")
        self._write()

    def allows(self, plane: int) -> bool:
        """May ``plane`` be installed now (every plane, unless a staged rollout has not reached it)?"""
        return self.state is None or plane in self.state.allowed()

    def poll(self) -> None:
        """Move the staged rollout on: probe a stage once its switches hold their state, judge it once
        its probes arrived or their time is up, roll it back when it failed."""
        r = self.state
        if r is None or r.phase == "done" or self._busy:
            return
        self._busy = True
        try:
            self._step(r)
        finally:
            self._busy = False

    def _step(self, r: rollout.Rollout) -> None:
        plane = r.current
        if plane is None:
            return
        app = self.app
        now = time.monotonic()
        names = [sw.name for sw in app.index.planes[plane]]
        rec = app.reconciler
        if r.phase == "install":
            installed = [n for n in names if n in app.wiring.released]
            if not installed or any(rec.pending.get(n) or rec.confirmed.get(n) != rec.desired.get(n)
                                    for n in installed):
                return
            self._catchers(plane, add=True)
            self.catch_at = now
            r.phase = "catch"
        if r.phase == "catch":
            if now - self.catch_at < CATCH_WAIT_S:
                return
            self.probes = rollout.probes(app.graph, plane, self._delivered_fn(plane), mode=self.probe)
            self.arrivals = {}
            self._send_probes(self.probes)
            self.probe_sent_at, self._probe_resent = now, False
            r.phase = "probe"
            return
        if r.phase == "probe":
            done = all(p.probe_id in self.arrivals for p in self.probes)
            if not done and now - self.probe_sent_at < PROBE_WAIT_S:
                return
            if not done and not self._probe_resent:
                self._send_probes([p for p in self.probes if p.probe_id not in self.arrivals])
                self.probe_sent_at, self._probe_resent = now, True
                return
            result = rollout.evaluate(plane, self.probes, self.arrivals)
            self._catchers(plane, add=False)
            r.finish(result)
            if result.ok:
                LOG.info("staged rollout: plane %d passed (%d of %d probes arrived)", plane, result.arrived,
                         result.sent)
            else:
                LOG.error("staged rollout: plane %d failed (%d of %d probes arrived, %d at a wrong leaf): "
                          "rolling it back", plane, result.arrived, result.sent, len(result.misdelivered))
                self._roll_back(names)
            if self.gauges:
                self.gauges.labels("passed").set(len(r.passed))
                self.gauges.labels("rolled_back").set(len(r.rolled_back))
            self._write()
            if app.wiring.decision is not None:
                app.wiring.release_planes(app.wiring.decision.planes)

    @property
    def gauges(self) -> Any:
        if not self.app.metrics:
            return None
        if self._gauge is None:
            from prometheus_client import Gauge
            self._gauge = Gauge("hpnlab_rollout_planes", "Staged rollout: planes passed or rolled back",
                                ["state"], registry=self.app.metrics.registry)
        return self._gauge

    def _delivered_fn(self, plane: int) -> Callable[[str, str, str, int], bool]:
        """Does the compiled state deliver a probe (src host -> dst ip, sport)? Walked with the table
        interpreter over the reconciler's desired state (the routes the wiring check left out are not probed)."""
        net = FabricTables(self.app.graph, self.app.reconciler.states, self.app.reconciler.failures)

        def delivered(src: str, dst: str, _dst_ip: str, sport: int) -> bool:
            return net.send(src, dst, plane=plane, sport=sport).result == "delivered"
        return delivered

    def _catchers(self, plane: int, add: bool) -> None:
        """The table-0 rules that send probes (hosts mode: the hosts' answers) arriving at a leaf's uplinks to the
        controller (or their removal)."""
        for leaf, ports in rollout.catch_points(self.app.graph, plane).items():
            dp = self.app.datapaths.get(leaf)
            if dp is None:
                continue
            if not add:
                dp.send_msg(codec.probe_catchers_removal(dp))
                continue
            for msg in codec.probe_catchers(dp, ports, rollout.catch_match(self.probe)):
                dp.send_msg(msg)

    def _send_probes(self, probes: list[rollout.Probe]) -> None:
        for p in probes:
            dp = self.app.datapaths.get(p.src_leaf)
            if dp is None:
                continue
            dp.send_msg(codec.packet_out(dp, codec.probe_frame(p), dp.ofproto.OFPP_TABLE, in_port=p.in_port))

    def probe_in(self, name: str, data: bytes) -> str | None:
        """A probe (hosts mode: a host's answer to one) caught at a leaf: recorded (None: not a probe)."""
        pid = codec.probe_caught(data)
        if pid is None:
            return None
        self.arrivals.setdefault(pid, name)
        if self.state is not None and self.state.phase == "probe" and \
                all(p.probe_id in self.arrivals for p in self.probes):
            self.poll()
        return "probe"

    def _roll_back(self, names: list[str]) -> None:
        """Take a plane's switches from the reconciler (failed: no other plane changes) and wipe them."""
        wiring = self.app.wiring
        for name in names:
            if name not in wiring.released:
                continue
            wiring.released.discard(name)
            self.app.handle(reconcile.SwitchDown(name))
            dp = self.app.datapaths.get(name)
            if dp is not None:
                codec.send(dp, reconcile.WipeTables(name))
                wiring.lldp_rule(dp)

    def _write(self) -> None:
        if self.out and self.state is not None:
            tmp = self.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.state.as_dict(), f, indent=1)
            os.replace(tmp, self.out)
