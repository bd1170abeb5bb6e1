"""The deployment at run time (controller/deployment.py decides): the scenario's switches on real datapath
ids and port numbers or names, port names resolved as switches connect, and ``--deployment auto``: switches
of datapath ids the scenario does not derive ("strangers") heard by LLDP and by the hosts behind them, the
map discovered adopted once discovery settles, and the app moved onto it with no restart (``adopt_graph``).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

import networkx as nx

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph as fgraph

from . import codec, deployment, reconcile
from .shell import Shell

LOG = logging.getLogger("hpnlab.controller")
MAX_HOSTS_SEEN = 1 << 20           # --deployment auto: host ports remembered (bounds what hostile frames can fill)


class AdoptionManager:
    def __init__(self, app: Shell, scenario_graph: nx.MultiGraph, source: str | None, out: str):
        self.app = app
        self.scenario_graph = scenario_graph
        self.auto = source == "auto"
        self.out = out                    # --deployment auto: where the discovered map is written
        self.data: dict | None = None
        self.named: dict[str, dict[int, str]] = {}     # switch -> scenario port -> port name
        self.resolved: dict[str, dict[int, int]] = {}  # switch -> scenario port -> its number
        self.errors: dict[str, list[str]] = {}         # switch -> names it does not have, ...
        self.adopted: str | None = None     # --deployment auto: what was adopted (one line)
        self._adoption_heard: frozenset | None = None  # what LLDP had heard at the last try to adopt
        self._renumbered = False       # port names resolved that the graph does not have yet
        #: --deployment auto: datapaths not in the scenario, heard by LLDP
        self.strangers: dict[int, Any] = {}
        #: --deployment auto: (dpid, port) of a stranger -> the source MAC of a host's frame that arrived there
        #: (deployment.host_pins tells symmetric leaves apart by it)
        self.hosts_seen: dict[tuple[int, int], str] = {}
        self._host_leaves: dict[str, str] | None = None          # MAC -> leaf (deployment.host_leaves), on first use
        self._unknown_macs_logged: set[tuple[int, int, str]] = set()    # each logged once (bounded)
        self._written: dict | None = None
        self.graph = self._deployed(scenario_graph, source)

    def _deployed(self, g: nx.MultiGraph, source: str | None) -> nx.MultiGraph:
        """The scenario's graph on the deployment file's dpids and ports; ports the file gives by name stand
        on placeholders until their switch connects (``resolve``)."""
        if not source or self.auto:
            return g
        self.data = deployment.load(g, source)
        self.named = deployment.named(g, self.data)
        out = deployment.apply(g, self.data)
        LOG.info("deployment %s: %d switches on their own dpids and ports%s", source,
                 len(fgraph.switches(g)), f"; {len(self.named)} give port names, resolved when they "
                 f"connect" if self.named else "")
        return out

    def report(self) -> dict[str, Any]:
        """The wiring report's ``deployment``: the mistakes, the port names resolved, what was adopted."""
        return {"errors": [line for sw in sorted(self.errors) for line in self.errors[sw]],
                "resolved": {sw: {str(p): n for p, n in sorted(m.items())} for sw, m in sorted(self.resolved.items())},
                "adopted": self.adopted}

    # ---- strangers (--deployment auto) -------------------------------------------------------------
    def stranger_connected(self, dp) -> None:
        """--deployment auto: a datapath id the scenario does not derive; heard by LLDP, never installed."""
        LOG.info("datapath %016x connected: not a derived dpid, discovering it by LLDP (--deployment auto)", dp.id)
        self.strangers[dp.id] = dp
        self.app.wiring.last_connect = time.monotonic()
        self.app.wiring.lldp_rule(dp)
        self._arp_rule(dp)
        dp.send_msg(dp.ofproto_parser.OFPPortDescStatsRequest(dp, 0))

    def stranger_ports(self, dp, body) -> None:
        """A stranger told its ports: LLDP out of each."""
        if dp.id not in self.strangers:
            return
        for d in body:
            self.app.wiring.port_seen(f"dpid:{dp.id:016x}", d, codec.port_is_up(dp.ofproto, d))
        self.app.wiring.send_lldp(f"dpid:{dp.id:016x}")

    def _arp_rule(self, dp) -> None:
        """--deployment auto, on a stranger: ARP to the controller, so that a host's request says which leaf
        it is behind (``host_seen``). It is the leaves' compiled ARP entry (key, actions and cookie), so the
        reconciler that installs the adopted map keeps it on leaves and deletes it from spines and cores."""
        flow = compiler.ARP_TO_CONTROLLER
        codec.send(dp, reconcile.FlowMod(f"dpid:{dp.id:016x}", "add", flow.table, flow.priority, flow.match,
                                         flow.actions))

    def host_seen(self, dpid: int, in_port: int | None, data: bytes) -> str:
        """--deployment auto: a frame from a host port of a stranger (not LLDP): its source MAC, when the
        scenario knows it, pins the stranger to that host's leaf once the map is adopted; the latest known
        MAC per port counts, an unknown one is logged and not kept (``deployment.note_host``)."""
        src = codec.source_mac(data)
        if src is None or in_port is None or self.adopted is not None:
            return "ignored"
        if self._host_leaves is None:
            self._host_leaves = deployment.host_leaves(self.scenario_graph)
        outcome = deployment.note_host(self.hosts_seen, self._host_leaves, dpid, in_port, src, MAX_HOSTS_SEEN)
        if outcome == "host-seen":
            LOG.info("deployment auto: host %s seen behind datapath %016x port %d", src, dpid, in_port)
        elif outcome == "unknown-mac" and len(self._unknown_macs_logged) < MAX_HOSTS_SEEN and \
                (dpid, in_port, src) not in self._unknown_macs_logged:
            self._unknown_macs_logged.add((dpid, in_port, src))
            LOG.info("deployment auto: a frame from %s behind datapath %016x port %d not kept: no host port of "
                     "the scenario has that MAC", src, dpid, in_port)
        return outcome

    def adopt_discovered(self) -> None:
        """--deployment auto, once discovery settles: the map LLDP discovered (``deployment.adoption``) is
        adopted, and the switches are installed on it through the wiring check, with no restart. Adopted
        once: a cable moved later is the wiring check's to report, not a new map's to hide."""
        heard_dpids = self.app.wiring.heard_dpids
        heard = frozenset(heard_dpids.items()) | frozenset(self.hosts_seen.items())
        if heard == self._adoption_heard:
            return
        self._adoption_heard = heard
        try:
            data, line = deployment.adoption(self.scenario_graph, heard_dpids, self.hosts_seen)
        except UserError as exc:
            LOG.warning("deployment auto: nothing adopted yet: %s", exc)
            return
        self.adopted = line
        LOG.info("deployment auto: adopted the discovered map (%s), written to %s; installing through the "
                 "wiring check", line, self.out)
        self.adopt_graph(deployment.apply(self.scenario_graph, data))

    def write_discovered(self) -> None:
        """--deployment auto: the map LLDP discovered (controller/deployment.from_discovery), written once
        it has the scenario's shape and again whenever it changes."""
        try:
            dpids, maps = deployment.from_discovery(self.scenario_graph, self.app.wiring.heard_dpids,
                                                    self.hosts_seen)
        except UserError as exc:
            LOG.warning("deployment auto: %s", exc)
            return
        found = {"dpids": dpids, "maps": maps}
        if found == self._written:
            return
        self._written = found
        text = deployment.dump(self.scenario_graph, dpids, maps)
        tmp = self.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.out)
        foreign = sorted(n for n, d in dpids.items() if d != self.scenario_graph.nodes[n]["dpid"])
        LOG.info("deployment auto: wrote %s (%d switches, %d on dpids of their own; give it to --deployment "
                 "to start with it)", self.out, len(dpids), len(foreign))

    # ---- port names -----------------------------------------------------------------------------
    def resolve(self, name: str, ofp, body) -> bool:
        """A switch whose deployment gives port names told its ports: the names resolved against them
        (``deployment.resolve``); a mistake is logged, one line each, and holds the switch's plane back.
        Returns whether the resolved numbers changed (the graph must be rebuilt on them)."""
        if name not in self.named:
            return False
        names = {(d.name.rstrip(b"\0").decode(errors="replace") if isinstance(d.name, bytes) else str(d.name)):
                 d.port_no for d in body if d.port_no < ofp.OFPP_MAX}
        resolved, errors = deployment.resolve(self.scenario_graph, self.data or {}, name, names)
        if errors != self.errors.get(name, []):
            for line in errors:
                LOG.error("%s (its plane is held back)", line)
        if errors:
            self.errors[name] = errors
            changed = self.resolved.pop(name, None) is not None
        else:
            self.errors.pop(name, None)
            changed = self.resolved.get(name) != resolved
            self.resolved[name] = resolved
            if changed:
                LOG.info("%s: port names resolved: %s", name, ", ".join(
                    f"{self.named[name][p]}={n}" for p, n in sorted(resolved.items())))
        return changed

    def renumbered(self, name: str, ports: dict[int, bool]) -> None:
        """``name``'s port names resolved to new numbers: before the wiring decision, noted (one new graph
        for every switch resolved by then); after it, the graph rebuilt now and the wiring decided anew."""
        wiring = self.app.wiring
        if wiring.enabled and wiring.decision is None:
            self._renumbered = True
            self.app.handle(reconcile.PortStatus(name, ports))
        elif self._adopt_renumbered():
            wiring.decide()
        else:
            for sw in sorted(self.app.datapaths):
                wiring.release(sw)

    def adopt_renumbered_if_due(self) -> None:
        """The graph on the port numbers resolved before the wiring decision, if some are not in it yet."""
        if self._renumbered:
            self._adopt_renumbered()

    def _adopt_renumbered(self) -> bool:
        """The graph on the port numbers resolved so far (see ``adopt_graph``)."""
        self._renumbered = False
        return self.adopt_graph(deployment.apply(self.scenario_graph, self.data or {}, self.resolved))

    def names_pending(self, name: str) -> bool:
        """A switch whose port names are not resolved (not yet, or a name it does not have): never installed."""
        resolved = name in self.resolved and name not in self.errors
        return name in self.named and not resolved

    def adopt_graph(self, g: nx.MultiGraph) -> bool:
        """Run on ``g`` from now on: the deployment's numbers found at run time (port names resolved, or
        the map ``--deployment auto`` discovered). A new reconciler, which reads back every switch it is
        handed as after a restart (what a switch already holds right is left alone); connections, ports and
        what LLDP heard renamed through their datapath ids. Returns whether the wiring had been decided
        (the caller decides it anew: until then nothing is handed to the new reconciler)."""
        app, wiring = self.app, self.app.wiring

        def dpid_of(sw: str) -> int:
            return int(sw[5:], 16) if sw.startswith("dpid:") else app.graph.nodes[sw]["dpid"]

        conns = {dp.id: dp for dp in app.datapaths.values()} | self.strangers
        told = wiring.by_dpid(dpid_of)
        had = wiring.decision is not None
        app.rebase(g)

        def name_of(dpid: int) -> str:
            return app.index.by_dpid.get(dpid) or f"dpid:{dpid:016x}"

        app.datapaths = {app.index.by_dpid[d]: dp for d, dp in conns.items() if d in app.index.by_dpid}
        self.strangers = {d: dp for d, dp in conns.items() if d not in app.index.by_dpid}
        wiring.rebase(told, name_of)
        for name in sorted(app.datapaths):
            ports = {p: up for p, (_mac, up) in wiring.port_info.get(name, {}).items()}
            if ports:
                app.handle(reconcile.PortStatus(name, ports))
        return had
