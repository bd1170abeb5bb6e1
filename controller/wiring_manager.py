"""Discovery and the wiring gate (controller/wiring.py decides): LLDP out of every port, what was heard
against the graph, and which switches the reconciler gets.

A switch that connects gets the LLDP rule and sends LLDP out of every port; it is handed to the
reconciler (SwitchUp: routes installed) only once the wiring is decided and only if its plane may be
installed. Ports the decision holds down are reported down to the reconciler. With the gate off
(``--on-miswire off``) every switch is handed over as it connects, and a restarted controller's
changes wait until the wiring is observed (``wiring.release_ungated``; ``Reconciler.hold``).
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from . import codec, reconcile, wiring
from .shell import Shell

LOG = logging.getLogger("hpnlab.controller")


class WiringManager:
    def __init__(self, app: Shell, on_miswire: str, out: str | None, discovery_s: float):
        self.app = app
        self.on_miswire = on_miswire
        #: off (or a dry run): no LLDP, every switch installed at once
        self.enabled = on_miswire != "off" and not app.dry_run
        self.out = out
        self.discovery_s = discovery_s
        self.observed: dict[wiring.Port, tuple[wiring.Port, float]] = {}   # rx port -> (tx port, when)
        self.port_info: dict[str, dict[int, tuple[str, bool]]] = {}         # switch -> port -> (hw addr, up)
        self.expected_links = wiring.expected_links(app.graph)
        self.report: wiring.Report | None = None
        self.decision: wiring.Decision | None = None
        self.released: set[str] = set()       # switches handed to the reconciler
        self._lldp_checks: dict[tuple[int, int], bool] = {}   # (dpid, xid) of a question for the LLDP rule: found
        self.heard_dpids: dict[tuple[int, int], tuple[int, int]] = {}   # rx (dpid, port) -> tx (dpid, port)
        self.last_connect = time.monotonic()     # the last time discovery learnt something (switch, port, link)
        #: when every switch the decision allows first held its desired tables (written into the report:
        #: the harness waits for it before the first packet, as a user's readiness check would)
        self.installed: dict | None = None
        self._lldp_sent: dict[str, float] = {}    # switch (or stranger) -> when it last sent LLDP
        self.gauges = None
        if app.metrics:
            from prometheus_client import Gauge
            r = app.metrics.registry
            self.gauges = {
                "findings": Gauge("hpnlab_wiring_findings", "Wiring check findings by kind (LLDP against the "
                                  "scenario)", ["kind"], registry=r),
                "blocked": Gauge("hpnlab_wiring_planes_blocked", "Planes not installed because of miswiring",
                                 registry=r),
                "held": Gauge("hpnlab_wiring_ports_held_down", "Ports held down (routed around) by the wiring "
                              "check", registry=r),
                "ok": Gauge("hpnlab_wiring_links_ok", "Expected links seen by LLDP as planned", registry=r)}

    # ---- switches connecting and leaving ----------------------------------------------------------
    def connected(self, name: str, dp) -> None:
        """A switch connected: the LLDP rule; its routes once the wiring allows its plane."""
        self.last_connect = time.monotonic()
        if not self.enabled:
            self.release(name)
            return
        self._lldp_rule_unless_held(dp)
        if self.decision is not None and self.plane_allowed(name):
            self.release(name)

    def disconnected(self, name: str) -> None:
        self.released.discard(name)
        self.port_info.pop(name, None)
        self.app.handle(reconcile.SwitchDown(name))

    def _lldp_rule_unless_held(self, dp) -> None:
        """Ask the switch for its LLDP rule and add the rule only if it is missing (``lldp_held``
        answers): a controller that restarts re-adds nothing the switch still holds."""
        req = codec.lldp_rule_request(dp)
        dp.send_msg(req)      # sets req.xid
        self._lldp_checks[dp.id, req.xid] = False

    def lldp_held(self, msg) -> bool:
        """A reply to ``_lldp_rule_unless_held``'s question (True: consumed here)."""
        dp = msg.datapath
        key = (dp.id, msg.xid)
        if key not in self._lldp_checks:
            return False
        held = self._lldp_checks[key] or codec.holds_lldp_rule(msg.body)
        if msg.flags & dp.ofproto.OFPMPF_REPLY_MORE:
            self._lldp_checks[key] = held
            return True
        del self._lldp_checks[key]
        if not held:
            self.lldp_rule(dp)
        return True

    def lldp_rule(self, dp) -> None:
        dp.send_msg(codec.lldp_rule(dp))

    def plane_allowed(self, name: str) -> bool:
        plane = self.app.index.sw[name].plane
        if not self.app.rollout.allows(plane):
            return False
        return self.decision is not None and plane in self.decision.planes

    def release(self, name: str) -> None:
        """Hand a connected switch to the reconciler: it installs the switch's state."""
        if name in self.released or name not in self.app.datapaths or self.app.adoption.names_pending(name):
            return
        self.released.add(name)
        ports = {p: up for p, (_mac, up) in self.port_info.get(name, {}).items()}
        self.app.handle(reconcile.SwitchUp(name, self.filter(name, ports) if ports else None))

    def release_planes(self, planes: tuple[int, ...]) -> None:
        """Hand the switches of ``planes`` to the reconciler (staged: only the stages reached)."""
        self.app.rollout.begin(planes)
        for name in sorted(self.app.datapaths):
            if self.app.index.sw[name].plane in planes and self.plane_allowed(name):
                self.release(name)

    def ungated_check(self) -> None:
        """--on-miswire off: send the changes held since start once the wiring is observed (every switch
        connected and told its ports), discovery settled, or the switches held nothing (a first start)."""
        app, rec = self.app, self.app.reconciler
        if not rec.hold or app.dry_run:
            return
        quiet_s = time.monotonic() - self.last_connect
        told = sum(1 for sw in app.index.sw if sw in self.port_info)
        if not wiring.release_ungated(len(rec.confirmed), sum(len(t) for t in rec.confirmed.values()),
                                      len(app.datapaths), told, len(app.index.sw), quiet_s, self.discovery_s):
            return
        rec.hold = False
        LOG.info("on-miswire off: installing now (%d of %d switches connected, %d told their ports, %d read back "
                 "holding %d entries)", len(app.datapaths), len(app.index.sw), told, len(rec.confirmed),
                 sum(len(t) for t in rec.confirmed.values()))
        app.handle(reconcile.Tick())

    # ---- ports ------------------------------------------------------------------------------------
    def port_seen(self, name: str, desc, up: bool) -> None:
        if desc.port_no not in self.port_info.get(name, {}):
            self.last_connect = time.monotonic()      # something new to hear from: discovery goes on
        self.port_info.setdefault(name, {})[desc.port_no] = (desc.hw_addr, up)

    def filter(self, name: str, ports: dict) -> dict:
        """Port states for the reconciler: a port the wiring decision holds down counts as down."""
        held = self.decision.held_down if self.decision is not None else frozenset()
        return {p: up and (name, p) not in held for p, up in ports.items()}

    # ---- LLDP -------------------------------------------------------------------------------------
    def _senders(self) -> dict[str, Any]:
        """Every connected switch, and every stranger (``--deployment auto``) by its dpid name."""
        return {**self.app.datapaths, **{f"dpid:{dpid:016x}": dp for dpid, dp in self.app.adoption.strangers.items()}}

    def send_lldp(self, name: str | None = None) -> None:
        """LLDP out of every port of one switch (every connected switch when None)."""
        if not self.enabled:
            return
        senders = self._senders()
        now = time.monotonic()
        for sw in [name] if name else list(senders):
            dp = senders.get(sw)
            if dp is None:
                continue
            for port, (mac, _up) in sorted(self.port_info.get(sw, {}).items()):
                if port >= dp.ofproto.OFPP_MAX:
                    continue
                dp.send_msg(codec.packet_out(dp, codec.lldp_frame(dp.id, port, mac), port))
            self._lldp_sent[sw] = now

    def lldp_in(self, name: str, in_port: int | None, data: bytes) -> str:
        sender = codec.parse_lldp(data)
        if sender is None or in_port is None:
            return "ignored"
        dpid, port = sender
        rx_dp = self.app.datapaths.get(name) or self.app.adoption.strangers.get(
            int(name[5:], 16) if name.startswith("dpid:") else -1)
        if rx_dp is not None:
            self.heard_dpids[rx_dp.id, in_port] = (dpid, port)
        tx = (self.app.index.by_dpid.get(dpid) or f"dpid:{dpid:016x}", port)
        rx = (name, in_port)
        first = rx not in self.observed or self.observed[rx][0] != tx
        self.observed[rx] = (tx, time.monotonic())
        if first:
            self.last_connect = time.monotonic()          # still learning: the deadline moves on
            LOG.debug("LLDP: %s port %d hears %s port %d", name, in_port, *tx)
            if self.decision is None and self._discovery_complete():
                self.decide()
        return "lldp"

    def _discovery_complete(self) -> bool:
        """Every switch connected, and every expected link heard from both ends as planned."""
        if len(self.app.datapaths) < len(self.app.index.sw):
            return False
        self.app.adoption.adopt_renumbered_if_due()
        heard = {rx: tx for rx, (tx, _t) in self.observed.items()}
        return all(heard.get(a) == b for a, b in self.expected_links.items())

    def tick(self) -> None:
        """Every tick: LLDP again (every second until decided, then every 5 s), stale observations
        dropped; decide once discovery is complete or settled; afterwards, report changes."""
        if not self.enabled:
            self.ungated_check()          # the hold's time may be up
            return
        app = self.app
        now = time.monotonic()
        strangers = app.adoption.strangers
        present = bool(app.datapaths or strangers)       # --deployment auto: maybe only strangers yet
        senders = self._senders()
        for sw in wiring.lldp_due(self._lldp_sent, senders, now, decided=self.decision is not None):
            self.send_lldp(sw)
        for gone in set(self._lldp_sent) - set(senders):
            del self._lldp_sent[gone]          # bounded: only the switches connected now
        stale = [rx for rx, (_tx, t) in self.observed.items() if now - t > wiring.STALE_S]
        for rx in stale:
            del self.observed[rx]
        if self.decision is not None or (present and (self._discovery_complete() or wiring.settled(
                now - self.last_connect, self.discovery_s, len(app.datapaths) + len(strangers),
                len(app.index.sw)))):
            self.decide()

    # ---- the decision -----------------------------------------------------------------------------
    def decide(self) -> None:
        """The report and the decision; on a change: log, metrics, file, and the ports and planes it
        changes (a port no longer held down is given back its real state)."""
        app, adoption = self.app, self.app.adoption
        if adoption.auto and adoption.adopted is None:
            adoption.adopt_discovered()
        adoption.adopt_renumbered_if_due()
        heard = {rx: tx for rx, (tx, _t) in self.observed.items()}
        report = wiring.compare(app.graph, heard)
        decision = wiring.decide(app.graph, report, self.on_miswire,
                                 hold_planes={app.index.sw[n].plane for n in adoption.errors})
        first = self.decision is None
        if not first and report == self.report and decision == self.decision:
            return
        old_held = self.decision.held_down if self.decision else frozenset()
        self.report, self.decision = report, decision
        LOG.info("wiring: %d of %d expected links as planned, %s; on miswire %s: installing plane(s) %s%s",
                 report.links_ok, report.links_expected,
                 ", ".join(f"{n} {k}" for k, n in report.counts().items()), self.on_miswire,
                 ", ".join(map(str, decision.planes)) or "none",
                 f", {len(decision.held_down)} port(s) held down" if decision.held_down else "")
        for line in report.lines():
            LOG.warning("wiring: %s", line)
        if self.gauges:
            for kind, n in report.counts().items():
                self.gauges["findings"].labels(kind).set(n)
            self.gauges["blocked"].set(len(decision.blocked_planes))
            self.gauges["held"].set(len(decision.held_down))
            self.gauges["ok"].set(report.links_ok)
        self.write_report()
        for sw, port in sorted(old_held ^ decision.held_down):
            info = self.port_info.get(sw, {}).get(port)     # a port never reported counts as up (reconcile)
            app.handle(reconcile.PortStatus(sw, self.filter(sw, {port: info[1] if info else True})))
        self.release_planes(decision.planes)
        if adoption.auto:
            adoption.write_discovered()
        self.check_installed()

    def write_report(self) -> None:
        """The wiring report (``--wiring-out``), with ``installed`` once the routes are in (else null);
        with the gate off, only ``on_miswire`` and ``installed``."""
        if not self.out:
            return
        body: dict[str, Any] = {"on_miswire": self.on_miswire}
        if self.report is not None and self.decision is not None:
            body.update(wiring.report_dict(self.report, self.decision))
        body["deployment"] = self.app.adoption.report()
        body["installed"] = self.installed
        tmp = self.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(body, f, indent=1)
        os.replace(tmp, self.out)

    def check_installed(self) -> None:
        """The first time every switch that may be installed has been handed to the reconciler and the
        reconciler has nothing outstanding and every one holds its desired tables: logged and reported."""
        app = self.app
        if self.installed is not None or app.dry_run:
            return
        if self.enabled and self.decision is None:
            return
        allowed = {n for n in app.datapaths if not self.enabled or self.plane_allowed(n)}
        if len(app.datapaths) < len(app.index.sw) or not allowed <= self.released or not app.reconciler.settled:
            return
        self.installed = {"unix": round(time.time(), 3), "after_s": round(time.monotonic() - app.started, 3),
                          "switches": len(allowed)}
        LOG.info("routes installed on %d switch(es), %.2f s after start", len(allowed), self.installed["after_s"])
        self.write_report()

    # ---- a new graph (controller/adoption_manager.py) ----------------------------------------------
    def by_dpid(self, dpid_of: Callable[[str], int]) -> tuple[dict, dict]:
        """The ports told and what LLDP heard, keyed by datapath id (taken before a new graph renames the
        switches; ``dpid_of``: a name on the graph in force -> its datapath id)."""
        info = {dpid_of(n): ports for n, ports in self.port_info.items()}
        heard = {(dpid_of(rx[0]), rx[1]): ((dpid_of(tx[0]), tx[1]), t) for rx, (tx, t) in self.observed.items()}
        return info, heard

    def rebase(self, by_dpid: tuple[dict, dict], name_of: Callable[[int], str]) -> None:
        """On the app's new graph: the ports told and what LLDP heard (``by_dpid``) renamed through their
        datapath ids (``name_of``); the decision and the hand-overs start again."""
        info, heard = by_dpid
        self.expected_links = wiring.expected_links(self.app.graph)
        self.port_info = {name_of(d): ports for d, ports in info.items()}
        self.observed = {(name_of(rx[0]), rx[1]): ((name_of(tx[0]), tx[1]), t) for rx, (tx, t) in heard.items()}
        self.released = set()
        self.report = self.decision = None
