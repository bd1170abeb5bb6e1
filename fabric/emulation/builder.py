"""The fabric of a run, built: hosts, switches, links, shaping, BFD, the ECN and PFC stages, OVS's own tuning.

``FabricBuilder`` turns the (physical) fabric graph into a Mininet network on real Open vSwitch
as ``options.ports``, ``options.failover`` and ``options.cluster`` ask: it chooses the switch port
type, builds the network (one machine, or Mininet's cluster edition with ``remote`` servers),
configures every host and switch port (``nodes``: addresses, MTU, htb shaping), raises
ovs-vswitchd's thread priority and its socket buffers (each old value recorded in the run's state
first), turns BFD on, and puts priority flow control (``pfc``) and the ECN marking stage on every switch
egress port. It also answers
what the fabric is: its switch ports, which nodes run here, which switches are connected.
Everything it records goes into the run's ``metadata``; what this machine could not emulate into
``metadata["not_emulated"]`` and the log.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import networkx as nx

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec

from . import datapath_socket, kernel, nodes, ovsdb, preflight, remote, shaping, sizing
from . import ovs_sched as ovs_sched_mod
from .ecn import EcnStage
from .errors import EmulationError
from .mn import FabricTopo
from .options import EmulationOptions, FailoverOptions
from .pfc import PfcStage
from .state import RunState

__all__ = ["FabricBuilder", "bfd_intervals"]


def bfd_intervals(failover: FailoverOptions, scenario_bfd: spec.Bfd) -> tuple[int, int, int]:
    """(min_rx ms, min_tx ms, multiplier) of the run's BFD (pure): ``bfd_ms`` on both when given, else
    the scenario's ``bfd`` block when it is enabled, else (0, 0, mult): off."""
    if not failover.bfd_ms and scenario_bfd.enabled:
        return scenario_bfd.min_rx_ms, scenario_bfd.min_tx_ms, scenario_bfd.mult
    return int(failover.bfd_ms), int(failover.bfd_ms), int(failover.bfd_mult)


class FabricBuilder:
    """Builds one run's fabric and answers what it is (see the module docstring)."""

    def __init__(self, scenario: spec.Scenario, graph: nx.MultiGraph, physical: nx.MultiGraph,
                 options: EmulationOptions, metadata: dict[str, Any], log: Callable[[str], None] = lambda m: None):
        self.scenario = scenario
        self.graph = graph
        #: Mininet is given the physical graph (cabled as ``options.rewire`` says), everything else the scenario's
        self.physical = physical
        self.ports = options.ports
        self.controller_kind = options.controller.kind
        self.servers = list(options.cluster.servers) or None
        self.placement = options.cluster.placement
        self.metadata = metadata
        self.log = log
        #: the switch port type asked for (the flag, else $HPNLAB_PORT_TYPE, else auto) and the one used
        self.requested_port_type = kernel.port_type_request(options.ports.port_type)
        self.port_type = "system"
        #: BFD on every switch-to-switch interface: min_rx, min_tx (ms; 0: off) and the detect multiplier
        self.bfd_ms, self.bfd_tx_ms, self.bfd_mult = bfd_intervals(options.failover, scenario.bfd)
        self.state: RunState | None = None
        self.caps: kernel.Capabilities | None = None
        self.net: Any = None
        self.remote: Any = None   # remote.Remote when servers other than localhost are used
        self._ovs_sched: tuple[int, int, int, int] | None = None

    @property
    def _st(self) -> RunState:
        if self.state is None:
            raise EmulationError("the emulation is not started")
        return self.state

    @property
    def _caps(self) -> kernel.Capabilities:
        if self.caps is None:
            raise EmulationError("the emulation is not started")
        return self.caps

    # -- what the fabric is ----------------------------------------------------------------------
    def switch_ports(self) -> list[dict[str, Any]]:
        """Every switch egress port: switch, port, intf name, peer node, emulated rate, delay, local."""
        return nodes.switch_ports(self.graph, self.is_local)

    def host(self, name: str) -> Any:
        """A host's Mininet node (once built)."""
        return self.net.get(name)

    @property
    def hosts(self) -> list[str]:
        return fgraph.hosts(self.graph)

    def is_local(self, node: str) -> bool:
        """Whether a node runs on this machine (always, unless cluster servers were given)."""
        if not self.servers or self.net is None:
            return True
        return getattr(self.net.get(node), "server", "localhost") == "localhost"

    def fabric_interfaces(self) -> list[str]:
        """Switch interfaces whose peer is a switch (where BFD runs: hosts do not speak it)."""
        return [p["intf"] for p in self.switch_ports() if p["local"] and self.graph.nodes[p["peer"]]["tier"] > 0]

    def connected(self) -> dict[str, bool]:
        """Bridge name -> is_connected to its controller, read from ovsdb (each server's own)."""
        local = ovsdb.connected(fgraph.switches(self.graph))
        return local if self.remote is None else {**local, **self.remote.connected()}

    def set_inactivity_probe(self, ms: int) -> None:
        """How long OVS waits for the controller's echo before it drops it (every server's switches)."""
        ovsdb.set_inactivity_probe(fgraph.switches(self.graph), ms)
        if self.remote is not None:
            self.remote.set_inactivity_probe(ms)

    def ingress_drops(self) -> dict[str, int]:
        """Packets each local switch port's ingress (ovs-vswitchd's receive socket on the userspace
        datapath) dropped so far: {} where there is no such socket or it cannot be read."""
        if self.metadata.get("datapath") != "user" or self.port_type != "system":
            return {}
        return datapath_socket.ingress_drops([p["intf"] for p in self.switch_ports() if p["local"]])

    def not_emulated(self, line: str) -> None:
        """Say, in the log and the run's metadata, what this machine could not emulate."""
        self.log(line)
        self.metadata.setdefault("not_emulated", []).append(line)

    # -- building --------------------------------------------------------------------------------
    def choose_port_type(self, caps: kernel.Capabilities) -> None:
        """The switch port type (``kernel.choose_port_type``), recorded in the metadata with why."""
        self.caps = caps
        needs = (["shaping"] if self.ports.shape else []) + (
            ["ECN marking"] if self.ports.ecn and caps.ecn_mechanism is not None else []) + (
            ["priority flow control"] if self.scenario.emulation.lossless.pfc else [])
        budget = sizing.load_budget()
        frame = self.scenario.emulation.mtu + sizing.ETH
        measured = {t: sizing.pps_at(budget, t, frame) or 0.0 for t in caps.afxdp_types}
        refused = {t: f"it carried frames up to {top} B only, this scenario sends {frame} B"
                   for t in caps.afxdp_types if (top := sizing.max_frame(budget, t)) is not None and top < frame}
        chosen, why, lost = kernel.choose_port_type(self.requested_port_type, caps.datapath, caps.afxdp_types,
                                                    needs, measured, refused)
        self.port_type = chosen
        self.metadata["port_type"] = {"type": chosen, "requested": self.requested_port_type, "why": why}
        for line in lost:
            self.metadata.setdefault("not_emulated", []).append(line)
            self.log(f"port type {chosen}: {line}")

    def build(self, state: RunState, caps: kernel.Capabilities, target: nodes.ControllerTarget) -> Any:
        """The Mininet network, started, every host and switch port configured; returns it."""
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet

        self.state, self.caps = state, caps
        setLogLevel("error")
        mtu, shape = self.scenario.emulation.mtu, self.ports.shape
        cluster = self.servers is not None
        host_cls, switch_cls = nodes.node_classes(state, caps.datapath, mtu, cluster, port_type=self.port_type)
        switch_cls.targets = [target] if self.controller_kind == "hpnlab" else []  # type: ignore[attr-defined]
        fail_mode = "secure" if self.controller_kind == "hpnlab" else "standalone"
        # recorded before anything exists: bridges (and their userspace tap), veth names
        state.add_bridges(fgraph.switches(self.graph))
        state.add_interfaces(preflight.planned_root_interfaces(self.graph))
        common = dict(topo=FabricTopo(self.physical),
                      switch=lambda name, **p: switch_cls(name, failMode=fail_mode, **p),
                      host=host_cls, controller=None, autoSetMacs=False, autoStaticArp=False,
                      build=False, waitConnected=False, cleanup=False)
        if cluster:
            from mininet.examples import cluster as mncluster
            ssh_dir = Path(os.environ.get("HOME", "/root")) / ".ssh" / "mn"
            for d in (ssh_dir.parent, ssh_dir):   # MininetCluster runs mkdir -p on it
                if not d.exists():
                    state.add_empty_dir(str(d))
            link_cls: type = mncluster.RemoteLink
            servers = self.servers or ["localhost"]
            self.metadata["cluster"] = {"servers": self.servers, "placement": self.placement}
            remote_servers = sorted(set(servers) - {"localhost"})
            if remote_servers:   # other machines, for real (hpnlab.fabric.emulation.remote)
                where = remote.place(common["topo"], self.graph, servers, self.placement)
                self.remote = remote.Remote.start(state, remote_servers, remote.planned(self.graph, where), self.log)
                host_cls, switch_cls, link_cls = self.remote.classes(host_cls, switch_cls)
                common["host"] = host_cls
                common["switch"] = lambda name, **p: switch_cls(name, failMode=fail_mode, **p)
                common["precheck"] = False   # Mininet's asks for sudo; Remote.start has reached every server
                self.metadata["cluster"]["remote"] = self.remote.describe()
            net = mncluster.MininetCluster(servers=servers, placement=nodes.placers(self.graph)[self.placement],
                                           link=link_cls, **common)
        else:
            net = Mininet(link=Link, **common)
        self.net = net
        net.build()
        tx_off = caps.datapath == "user" and not caps.ovs_userspace_tso
        try:
            for host in fgraph.hosts(self.graph):
                net.get(host).configure(self.graph, tx_off, shape, caps.netem)
            net.start()
            self.metadata["switch_ports"] = nodes.configure_switch_ports(
                [p for p in self.switch_ports() if p["local"]], mtu, shape, caps.netem, state.run_dir)
            if self.remote is not None:
                far = [dict(p, server=net.get(p["switch"]).server) for p in self.switch_ports() if not p["local"]]
                self.metadata["cluster"]["remote_ports"] = self.remote.configure_ports(far, mtu, shape, self.ports.ecn)
        except nodes.NodeError as exc:
            raise EmulationError(str(exc)) from None
        return net

    def boost_ovs(self) -> None:
        """Raise ovs-vswitchd's main thread for the run as ``ports.ovs_sched`` says (it forwards every
        packet of a `system` port on the userspace datapath; on a busy machine its waits for the CPU
        stall every flow). The old policy and nice value go into the run's state file first, so stop,
        and `hpnlab clean` after a crash, put them back."""
        mode = self.ports.ovs_sched
        try:
            old, now = ovs_sched_mod.apply(mode, self.state.add_scheduling if self.state is not None else None)
        except (OSError, ValueError) as exc:
            self.log(f"ovs-vswitchd's priority could not be raised ({exc}); forwarding may stall under load")
            return
        self._ovs_sched = old
        pid, policy, priority, nice = old
        self.metadata["ovs_sched"] = {"pid": pid, "mode": mode, **now,
                                      "before": {"policy": policy, "priority": priority, "nice": nice}}

    def enable_bfd(self, timeout_s: float = 20.0) -> None:
        """BFD on every fabric interface; wait until every session forwards (until then OVS
        reports the port not live and the controller routes around it)."""
        names = self.fabric_interfaces()
        err = ovsdb.set_bfd(names, self.bfd_ms, self.bfd_tx_ms, self.bfd_mult)
        if err:
            raise EmulationError(f"enabling BFD failed: {err}")
        self.metadata["bfd"] = {"min_rx_ms": self.bfd_ms, "min_tx_ms": self.bfd_tx_ms, "mult": self.bfd_mult,
                                "interfaces": len(names)}
        deadline = time.monotonic() + timeout_s
        while True:
            status = ovsdb.bfd_status(names)
            down = sorted(n for n in names if status.get(n, {}).get("forwarding") != "true")
            if not down:
                return
            if time.monotonic() > deadline:
                raise EmulationError(f"BFD did not come up within {timeout_s:g} s on {len(down)} of {len(names)} "
                                     f"fabric interfaces: {', '.join(down[:5])}")
            time.sleep(0.2)

    def pfc_stage(self) -> PfcStage:
        """Priority flow control (``pfc.PfcStage``): the data path on every port, the pause agent."""
        if self.port_type != "system":
            raise UserError(f"priority flow control needs the switch ports in tc's reach (port type system); "
                            f"this run uses {self.port_type}")
        stage = PfcStage.for_emulation(self, ecn=self.ports.ecn)
        for line in self.metadata["pfc"]["buffers"]:
            self.log(f"PFC: {line}")
        return stage

    def ecn_stage(self, mechanism: str, pfc_pins: Path | None = None) -> EcnStage:
        """The ECN marking stage on every local switch egress port (``ecn.EcnStage``); with priority flow
        control (``pfc_pins``) it marks on the real occupancy through PFC's maps."""
        stage = EcnStage.for_emulation(self, mechanism=mechanism, pfc_pins=pfc_pins)
        self.metadata["ecn_defaults"] = stage.defaults_description()
        return stage

    def size_ovs_buffers(self) -> None:
        """ovs-vswitchd's send socket and every local switch port's receive socket, raised (after traffic
        crossed the fabric: OVS opens the send socket on first use)."""
        self._size_send_buffer()
        self._size_receive_buffers()

    def _size_send_buffer(self) -> None:
        """Raise ovs-vswitchd's one send socket to hold every switch port's full queue
        (``datapath_socket``: below that, packets waiting in the shaped queues made OVS drop
        others where no counter saw it). Each old size goes into the run's state file first, so stop, and
        `hpnlab clean` after a crash, put it back (``cleanup.teardown``)."""
        mtu = self.scenario.emulation.mtu
        queues = [shaping.port_shape(p, mtu).max_queued_bytes for p in self.switch_ports() if p["local"]]
        want = datapath_socket.send_buffer_bytes(queues)
        record = self.state.add_send_buffer if self.state is not None else None
        try:
            done = datapath_socket.raise_send_buffer(want, record)    # each old size recorded before it changes
        except (OSError, ValueError) as exc:
            return self.not_emulated(f"ovs-vswitchd's send buffer could not be raised to {want:,} B ({exc}): "
                                     f"switch queues beyond it lose packets no counter shows")
        self.metadata["ovs_send_buffer"] = {"wanted_bytes": want, "before_bytes": [d[2] for d in done],
                                            "after_bytes": [d[3] for d in done]}

    def _size_receive_buffers(self) -> None:
        """Raise ovs-vswitchd's receive socket of every local switch port to hold a stall of
        ``datapath_socket.RX_STALL_S`` at the port's rate (below that, a busy machine made OVS's
        ingress drop packets no counter saw). The sockets go with their ports: nothing to put back."""
        mtu = self.scenario.emulation.mtu
        wants = {p["intf"]: datapath_socket.receive_buffer_bytes(p["rate_mbps"], mtu)
                 for p in self.switch_ports() if p["local"]}
        try:
            done = datapath_socket.raise_receive_buffers(wants)
        except (OSError, ValueError) as exc:
            return self.not_emulated(f"ovs-vswitchd's receive buffers could not be raised ({exc}): a busy "
                                     f"machine makes the switches' ingress drop packets (counted per run as "
                                     f"ingress drops)")
        self.metadata["ovs_receive_buffers"] = {
            "ports": len(done), "wanted_bytes": sorted(set(wants.values())),
            "before_bytes": sorted({d[1] for d in done}), "after_bytes": sorted({d[2] for d in done})}

    def restore_ovs(self) -> None:
        """ovs-vswitchd's scheduling back as it was before the run."""
        if self._ovs_sched is not None:
            pid, policy, priority, nice = self._ovs_sched
            self._ovs_sched = None
            try:
                ovs_sched_mod.restore(pid, policy, priority, nice)
            except OSError:
                pass
