"""The emulation harness: a scenario as a live Mininet network on real Open vSwitch.

``Emulation`` keeps the order of things; each concern lives in its own module:
``preflight`` (checks, mechanisms), ``controller_process``, ``nodes`` (node classes and
interface configuration), ``ovsdb`` (every ovs-vsctl call), ``reachability`` (pure walk
scripts and parsers) and ``walks`` (running them on the hosts), ``faults`` (links and
switches down/up), ``ecn``, ``state``, ``signals``.
See the package docstring (``hpnlab.fabric.emulation``) for the API and what it does.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from hpnlab.fabric.emulation import kernel, sizing
from hpnlab.fabric.emulation.mn import FabricTopo, host_interfaces
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec

from ..errors import UserError
from . import nodes, ovsdb, preflight, reachability, shaping, walks
from . import ovs_sched as ovs_sched_mod
from .controller_process import (
    DEFAULT_OFP_PORT,
    ControllerError,
    ControllerProcess,
    ControllerWatch,
    check_arp_mode,
    check_on_controller_loss,
    ecn_args,
    free_port,
    request_policy,
    tls_args,
    tls_files,
)
from .faults import Faults
from .nodes import PLACEMENTS
from .preflight import CONTROLLERS
from .rewire import Rewire, physical
from .rewire import deployment as rewire_deployment
from .signals import Unwind
from .state import ENV_MARK, Lock, RunState

__all__ = ["ControllerLost", "Emulation", "EmulationError"]


class EmulationError(RuntimeError):
    """The emulation could not be brought up as asked (switches not connecting, hosts unreachable)."""


class ControllerLost(EmulationError):
    """The controller process died and the run was asked to stop then (``on_controller_loss="stop"``)."""


def _log_default(msg: str) -> None:
    print(f"hpnlab: {msg}", file=sys.stderr, flush=True)


class Emulation:
    """A scenario running as a live emulated fabric. Use as a context manager."""

    def __init__(self, scenario: str | spec.Scenario, *, overrides: dict | None = None,
                 controller: str = "hpnlab", ofp_port: int | None = None, policy: str | None = None,
                 ecn: bool = True, shape: bool = True, verify: bool = True, verify_branches: bool = False,
                 connect_timeout: float = 60.0, controller_args: Iterable[str] = (), lock_wait_s: float = 0.0,
                 ready_timeout: float = 30.0, inactivity_probe_ms: int | None = None,
                 servers: list[str] | None = None, placement: str = "plane", controller_ip: str = "127.0.0.1",
                 bfd_ms: int = 0, bfd_mult: int = ovsdb.BFD_MULT, ovs_sched: str = "nice",
                 fast_failover: bool = True, ecn_policy: str = "static", telemetry_interval_ms: int = 200,
                 log: Callable[[str], None] | None = _log_default, port_type: str | None = None,
                 rewire: Rewire | None = None, wiring_timeout: float = 60.0,
                 on_built: Callable[[Emulation], None] | None = None,
                 controller_tls: str | Path | None = None, on_controller_loss: str = "continue",
                 routing_weights: str = "ecmp", arp: str = "gateway"):
        if controller not in CONTROLLERS:
            raise UserError(f"unknown controller {controller!r} (known: {', '.join(CONTROLLERS)})")
        if controller_tls and controller != "hpnlab":
            raise UserError("--controller-tls needs the hpnlab controller (it is the one listening with TLS)")
        #: OpenFlow over TLS: the files of a TLS directory (tools/scripts/make_test_ca.sh), or None (plain TCP)
        self.tls = tls_files(controller_tls) if controller_tls else None
        if isinstance(scenario, spec.Scenario):
            self.scenario = scenario if not overrides else spec.from_dict(
                spec.deep_merge(spec.to_dict(scenario), overrides), scenario.source)
        else:
            self.scenario = spec.load(scenario, overrides or {})
        if placement not in PLACEMENTS:
            raise UserError(f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})")
        self.controller = controller
        self.requested_port = ofp_port
        self.policy = policy
        self.want_ecn = ecn
        self.want_shape = shape
        self.verify = verify
        #: at start, also walk every entropy branch of every pair (``walk_branches``)
        self.verify_branches = verify_branches
        self.connect_timeout = connect_timeout
        self.lock_wait_s = lock_wait_s
        # How long the controller may take to print 'ready' (slow machines, software-emulated
        # guests: os-ken's imports alone take 30-60 s under qemu TCG).
        self.ready_timeout = ready_timeout
        # OVS drops a controller that leaves its echo unanswered this long (OVS default 5 s);
        # a CPU-starved controller needs more, or every switch flaps.
        self.inactivity_probe_ms = inactivity_probe_ms
        self.servers = list(servers) if servers else None
        self.placement = placement
        self.controller_ip = controller_ip
        self.controller_args = list(controller_args)
        #: when the controller process dies: "restart" it, "stop" the run (ControllerLost in the thread
        #: that started the run), or say so and "continue" (the switches keep forwarding: fail mode secure)
        self.on_controller_loss = check_on_controller_loss(on_controller_loss)
        #: one entry per loss noticed: {"at", "code", "action", "restart_s"}
        self.controller_losses: list[dict[str, Any]] = []
        self._ctl: ControllerProcess | None = None
        self._watch: ControllerWatch | None = None
        self._lost_line = ""
        self._old_usr1: Any = None
        #: local protection (the controller's fast-failover groups); False: the controller-only baseline
        self.fast_failover = fast_failover
        if not fast_failover:
            self.controller_args.append("--no-fast-failover")
        #: the controller's multipath weights (fabric/routing/weights.py): ecmp (equal) or weighted (load-following)
        if routing_weights not in ("ecmp", "weighted"):
            raise UserError(f"unknown routing weights {routing_weights!r}: use ecmp or weighted")
        if routing_weights != "ecmp" and controller != "hpnlab":
            raise UserError(f"routing weights {routing_weights!r} need the hpnlab controller (it decides them)")
        self.routing_weights = routing_weights
        #: how the leaves answer ARP (fabric/routing/compiler.py ARP_MODES): gateway (one gateway MAC) or per-host
        self.arp = check_arp_mode(arp, controller)
        if controller == "hpnlab":
            self.controller_args += ["--arp", arp]
        self._weights_control: Path | None = None
        if routing_weights != "ecmp":
            self.controller_args += ["--routing-weights", routing_weights]
        #: the controller's dynamic-ECN policy (controller/ecn_policy.py) and telemetry interval; the
        #: telemetry (JSON lines) goes to ``telemetry_file`` in the run directory
        if ecn_policy != "static" and controller != "hpnlab":
            raise UserError(f"ECN policy {ecn_policy!r} needs the hpnlab controller (it runs the policy)")
        self.ecn_policy = ecn_policy
        self.telemetry_interval_ms = telemetry_interval_ms
        self.telemetry_file: Path | None = None
        self._ecn_control: Path | None = None
        if bfd_ms < 0 or not 1 <= bfd_mult <= 255:
            raise UserError(f"BFD interval must be >= 0 ms (0: off) and its multiplier 1-255, got {bfd_ms}, {bfd_mult}")
        #: BFD on every switch-to-switch interface (min_rx = min_tx = bfd_ms; 0: off); without
        #: ``bfd_ms``, the scenario's ``bfd`` block (its own min_tx, min_rx and multiplier)
        self.bfd_ms = int(bfd_ms)
        self.bfd_mult = int(bfd_mult)
        self.bfd_tx_ms = self.bfd_ms
        if not bfd_ms and self.scenario.bfd.enabled:
            self.bfd_ms, self.bfd_tx_ms = self.scenario.bfd.min_rx_ms, self.scenario.bfd.min_tx_ms
            self.bfd_mult = self.scenario.bfd.mult
        #: ovs-vswitchd's main thread while the emulation runs (``ovs_sched``): nice -20 (default:
        #: without it, healthy paths stall whenever the machine is busy), rr (SCHED_RR, as earlier
        #: releases did: real-time throttling stalls it), deadline (SCHED_DEADLINE) or off
        if ovs_sched not in ovs_sched_mod.MODES:
            raise UserError(f"ovs_sched must be one of {', '.join(ovs_sched_mod.MODES)}, got {ovs_sched!r}")
        self.ovs_sched = ovs_sched
        #: switch port type asked for: auto|system|afxdp|afxdp-nonpmd (None: $HPNLAB_PORT_TYPE, else auto);
        #: the one used is ``metadata["port_type"]["type"]`` once started
        self.requested_port_type = kernel.port_type_request(port_type)
        self.port_type = "system"
        self._ovs_sched: tuple[int, int, int, int] | None = None
        #: ovs-vswitchd's send socket(s) whose buffer this run raised: (pid, fd, old size)
        self.log = log or (lambda m: None)
        self.graph = fgraph.build(self.scenario)
        #: cabled differently from the scenario on purpose (tests: emulation/rewire.py); the controller
        #: gets the scenario (and a deployment file when the numbers are foreign), Mininet the physical graph
        self.rewire = rewire or Rewire()
        self.physical = physical(self.graph, self.rewire) if self.rewire else self.graph
        #: how long to wait for the controller's wiring report once every switch is connected
        self.wiring_timeout = wiring_timeout
        self.wiring_file: Path | None = None
        self.rollout_file: Path | None = None
        #: called once the network is built, before the switches are installed (tests: break something first)
        self.on_built = on_built
        self.caps: kernel.Capabilities | None = None
        self.net: Any = None
        self.state: RunState | None = None
        self.ofp_port: int | None = None
        self.controller_proc: subprocess.Popen | None = None
        self.ecn: Any = None  # hpnlab.fabric.emulation.ecn.EcnStage once started
        self.remote: Any = None  # hpnlab.fabric.emulation.remote.Remote when servers other than localhost are used
        self.metadata: dict[str, Any] = {"scenario": self.scenario.name, "controller": controller}
        self.timings: dict[str, float] = {}
        self.faults = Faults(self.graph, lambda host, line: self.host(host).cmd(line), self._is_local,
                             self.scenario.name)
        self._lock = Lock()
        self._old_env: str | None = None
        self._signals = Unwind()
        self._stopped = True

    @property
    def _st(self) -> RunState:
        """The run's state (typed access; only once started)."""
        if self.state is None:
            raise EmulationError("the emulation is not started")
        return self.state

    @property
    def _caps(self) -> kernel.Capabilities:
        if self.caps is None:
            raise EmulationError("the emulation is not started")
        return self.caps

    # -- context manager --------------------------------------------------------------
    def __enter__(self) -> Emulation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def preflight(self) -> kernel.Capabilities:
        """Check everything that could stop the run; raise UserError with one line."""
        caps, self.metadata["estimate"] = preflight.check(self.graph, self.controller, self.requested_port)
        return caps

    # -- start: the order of things -----------------------------------------------------
    def start(self) -> Emulation:
        t0 = time.monotonic()
        self.caps = self.preflight()
        self._lock.acquire(f"scenario {self.scenario.name}", self.lock_wait_s)
        try:
            preflight.check_names_free(self.graph)     # under the lock: a live run holds it
        except BaseException:
            self._lock.release()
            raise
        try:
            self._signals.install()
            self.state = RunState.new(self.scenario.name)
            self._stopped = False
            self.metadata["run_id"] = self.state.run_id
            self.state.add_dir(str(self.state.run_dir))
            self.state.run_dir.mkdir(parents=True, exist_ok=True)
            self._old_env = os.environ.get(ENV_MARK)
            os.environ[ENV_MARK] = self.state.run_id
            used, warnings = preflight.mechanisms(self.caps, self.graph, self.want_shape, self.want_ecn)
            self.metadata.update(used)
            for line in warnings:
                self.log(line)
            self._choose_port_type()
            if self.controller == "hpnlab":
                self._start_controller()
            self.timings["controller_s"] = time.monotonic() - t0
            self._build()
            self.timings["built_s"] = time.monotonic() - t0
            if self.on_built is not None:
                self.on_built(self)
            if self.ovs_sched != "off" and self.metadata.get("datapath") == "user":
                self._boost_ovs()     # only the userspace datapath forwards in that thread
            if self.bfd_ms:
                self._enable_bfd()
                self.timings["bfd_s"] = time.monotonic() - t0
            if self.want_ecn and self.caps.ecn_mechanism is not None:
                from .ecn import EcnStage
                self.ecn = EcnStage.for_emulation(self, mechanism=self.caps.ecn_mechanism)
                self.metadata["ecn_defaults"] = self.ecn.defaults_description()
            if self.controller == "hpnlab":
                self._wait_connected()
                self._read_wiring()
                self._watch_controller()
            self.timings["connected_s"] = time.monotonic() - t0
            if self.verify:
                self._verify()
            if self.verify_branches:
                self._verify_branches()
            if self.metadata.get("datapath") == "user" and self.port_type == "system" and self.want_shape:
                self._size_ovs_send_buffer()     # after traffic crossed it: OVS opens the socket on first use
                self._size_ovs_receive_buffers()
            self.timings["up_s"] = time.monotonic() - t0
            if self.verify and not self.servers:
                sizing.record_bringup(self.graph.number_of_nodes(), self.timings["up_s"])
            self.state.notes["metadata"] = self.metadata
            self.state.save()
            (self.state.run_dir / "metadata.json").write_text(json.dumps(self.metadata, indent=1, default=str))
        except BaseException:
            self.stop()
            raise
        return self

    def _choose_port_type(self) -> None:
        """The switch port type (``kernel.choose_port_type``), recorded in the metadata with why."""
        caps = self._caps
        needs = (["shaping"] if self.want_shape else []) + (
            ["ECN marking"] if self.want_ecn and caps.ecn_mechanism is not None else [])
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

    def _start_controller(self) -> None:
        port: int = self.requested_port or free_port(DEFAULT_OFP_PORT)
        if self.requested_port is None and port != DEFAULT_OFP_PORT:
            self.log(f"port {DEFAULT_OFP_PORT} is taken; the controller listens on {port}")
        self.ofp_port = port
        self.telemetry_file = self._st.run_dir / "telemetry.jsonl"
        self._ecn_control = self._st.run_dir / "ecn-policy.json"
        args = ecn_args(self.ecn_policy, self.telemetry_interval_ms, self.telemetry_file, self._ecn_control)
        args += self._wiring_args()
        if "--routing-weights" in self.controller_args:     # weighted mode's tables: live switches possible
            self._weights_control = self._st.run_dir / "routing-weights.json"
            args += ["--weights-control", str(self._weights_control)]
        if self.tls is not None:
            args += tls_args(self.tls)
            self._switch_tls()
        ctl = ControllerProcess(self.scenario, self._st.run_dir, port, self.controller_ip, self.policy,
                                args + self.controller_args)
        self.metadata["controller_cmd"] = " ".join(ctl.cmd)
        self.metadata["ecn_policy"] = self.ecn_policy
        self.metadata["telemetry_interval_ms"] = self.telemetry_interval_ms
        self.metadata["fast_failover"] = self.fast_failover
        self.metadata["routing_weights"] = self.routing_weights
        self.metadata["arp"] = self.arp
        self.metadata["controller_log"] = str(ctl.log_file)
        self._ctl = ctl
        self.controller_proc = ctl.start()
        self._st.add_pid(self.controller_proc.pid, "controller", group=True)
        try:
            ctl.wait_ready(self.ready_timeout)
        except ControllerError as exc:
            raise EmulationError(str(exc)) from None

    def _switch_tls(self) -> None:
        """Open vSwitch's key, certificate and CA for ``ssl:`` controllers. The setting is machine-wide
        (one SSL row per ovsdb): the one in force is written into the run's state first, and put back
        at teardown (``cleanup.teardown``, also after a crash by `hpnlab clean`)."""
        assert self.tls is not None
        self._st.notes["ovs_ssl"] = {"previous": ovsdb.get_ssl()}
        self._st.save()
        error = ovsdb.set_ssl(self.tls["switch_key"], self.tls["switch_cert"], self.tls["ca"])
        if error:
            raise EmulationError(f"Open vSwitch would not take the TLS files: {error}")
        self.metadata["controller_tls"] = {"ca": self.tls["ca"], "switch_cert": self.tls["switch_cert"]}
    # -- the controller process: loss, kill, restart ----------------------------------------
    def _watch_controller(self) -> None:
        """From now on a dead controller is noticed (its pid polled) and answered as chosen."""
        if self._ctl is None:
            return
        if threading.current_thread() is threading.main_thread():
            self._old_usr1 = signal.signal(signal.SIGUSR1, self._raise_controller_lost)
        self.metadata["on_controller_loss"] = self.on_controller_loss
        self._watch = ControllerWatch(self._ctl, self._controller_lost).start()

    def _raise_controller_lost(self, _signum: int, _frame: Any) -> None:
        raise ControllerLost(self._lost_line)

    def _controller_lost(self, code: int) -> None:
        """The watch found the controller dead: one line, then restart, stop or continue."""
        pid = self._ctl.proc.pid if self._ctl and self._ctl.proc else 0
        action = self.on_controller_loss
        what = {"restart": "restarting it", "stop": "stopping the run",
                "continue": "continuing without it (the switches keep their tables: fail mode secure)"}[action]
        self._lost_line = (f"the controller (pid {pid}) exited with code {code}: {what} "
                           f"(--on-controller-loss {action}; log: {self.metadata.get('controller_log')})")
        self.log(self._lost_line)
        loss: dict[str, Any] = {"at": time.time(), "code": code, "action": action}
        self.controller_losses.append(loss)
        if action == "restart":
            loss["restart_s"] = self.restart_controller(watch=False)
        elif action == "stop":
            if self._old_usr1 is not None:
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
            else:
                import _thread
                _thread.interrupt_main()

    def kill_controller(self, sig: int = signal.SIGKILL) -> int | None:
        """End the controller process as a crash would (SIGKILL by default); its exit code. The watch
        notices and answers it as chosen (``on_controller_loss``)."""
        if self._ctl is None:
            raise UserError("this run has no hpnlab controller to kill")
        return self._ctl.kill(sig)

    def restart_controller(self, watch: bool = True) -> float:
        """Start the controller again (same port and arguments; a dead one first ended) and wait until
        every switch has connected to it; the seconds that took."""
        if self._ctl is None:
            raise UserError("this run has no hpnlab controller to restart")
        t0 = time.monotonic()
        if self._ctl.exited() is None:
            if self._watch is not None and watch:
                self._watch.stop()
            self._ctl.kill()
        self.controller_proc = self._ctl.start()
        self._st.add_pid(self.controller_proc.pid, "controller", group=True)
        try:
            self._ctl.wait_ready(self.ready_timeout)
        except ControllerError as exc:
            raise EmulationError(str(exc)) from None
        self._wait_connected()
        if watch and (self._watch is None or self._watch._stop.is_set()):
            self._watch = ControllerWatch(self._ctl, self._controller_lost).start()
        return time.monotonic() - t0

    def _unwatch_controller(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._old_usr1 is not None:
            try:
                signal.signal(signal.SIGUSR1, self._old_usr1)
            except (ValueError, TypeError):
                pass
            self._old_usr1 = None

    def _build(self) -> None:
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet

        setLogLevel("error")
        state = self._st
        cluster = self.servers is not None
        host_cls, switch_cls = nodes.node_classes(state, self._caps.datapath, self.scenario.emulation.mtu, cluster,
                                                  port_type=self.port_type)
        protocol = "ssl" if self.tls is not None else "tcp"
        target = nodes.ControllerTarget(self.ofp_port or DEFAULT_OFP_PORT, self.controller_ip, protocol)
        switch_cls.targets = [target] if self.controller == "hpnlab" else []  # type: ignore[attr-defined]
        fail_mode = "secure" if self.controller == "hpnlab" else "standalone"
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
                from . import remote
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
        tx_off = self._caps.datapath == "user" and not self._caps.ovs_userspace_tso
        try:
            for host in self.hosts:
                net.get(host).configure(self.graph, tx_off, self.want_shape, self._caps.netem)
            net.start()
            self.metadata["switch_ports"] = nodes.configure_switch_ports(
                [p for p in self.switch_ports() if p["local"]], self.scenario.emulation.mtu, self.want_shape,
                self._caps.netem, state.run_dir)
            if self.remote is not None:
                far = [dict(p, server=self.net.get(p["switch"]).server) for p in self.switch_ports() if not p["local"]]
                self.metadata["cluster"]["remote_ports"] = self.remote.configure_ports(
                    far, self.scenario.emulation.mtu, self.want_shape, self.want_ecn)
        except nodes.NodeError as exc:
            raise EmulationError(str(exc)) from None

    def _boost_ovs(self) -> None:
        """Raise ovs-vswitchd's main thread for the run as ``self.ovs_sched`` says (``ovs_sched``:
        it forwards every packet of a `system` port on the userspace datapath; on a busy machine
        its waits for the CPU stall every flow). The old policy and nice value go into the run's
        state file first, so stop, and `hpnlab clean` after a crash, put them back."""
        try:
            old, now = ovs_sched_mod.apply(self.ovs_sched,
                                           self.state.add_scheduling if self.state is not None else None)
        except (OSError, ValueError) as exc:
            self.log(f"ovs-vswitchd's priority could not be raised ({exc}); forwarding may stall under load")
            return
        self._ovs_sched = old
        pid, policy, priority, nice = old
        self.metadata["ovs_sched"] = {"pid": pid, "mode": self.ovs_sched, **now,
                                      "before": {"policy": policy, "priority": priority, "nice": nice}}

    def _size_ovs_send_buffer(self) -> None:
        """Raise ovs-vswitchd's one send socket to hold every switch port's full queue
        (``datapath_socket``: below that, packets waiting in the shaped queues made OVS drop
        others where no counter saw it). Each old size goes into the run's state file first, so stop, and
        `hpnlab clean` after a crash, put it back (``cleanup.teardown``)."""
        from . import datapath_socket

        mtu = self.scenario.emulation.mtu
        queues = [shaping.port_shape(p, mtu).queue_bytes
                  for p in self.switch_ports() if p["local"]]
        want = datapath_socket.send_buffer_bytes(queues)
        record = self.state.add_send_buffer if self.state is not None else None
        try:
            done = datapath_socket.raise_send_buffer(want, record)    # each old size recorded before it changes
        except (OSError, ValueError) as exc:
            return self._not_emulated(f"ovs-vswitchd's send buffer could not be raised to {want:,} B ({exc}): "
                                      f"switch queues beyond it lose packets no counter shows")
        self.metadata["ovs_send_buffer"] = {"wanted_bytes": want, "before_bytes": [d[2] for d in done],
                                            "after_bytes": [d[3] for d in done]}

    def _size_ovs_receive_buffers(self) -> None:
        """Raise ovs-vswitchd's receive socket of every local switch port to hold a stall of
        ``datapath_socket.RX_STALL_S`` at the port's rate (below that, a busy machine made OVS's
        ingress drop packets no counter saw). The sockets go with their ports: nothing to put back."""
        from . import datapath_socket

        mtu = self.scenario.emulation.mtu
        wants = {p["intf"]: datapath_socket.receive_buffer_bytes(p["rate_mbps"], mtu)
                 for p in self.switch_ports() if p["local"]}
        try:
            done = datapath_socket.raise_receive_buffers(wants)
        except (OSError, ValueError) as exc:
            return self._not_emulated(f"ovs-vswitchd's receive buffers could not be raised ({exc}): a busy "
                                      f"machine makes the switches' ingress drop packets (counted per run as "
                                      f"ingress drops)")
        self.metadata["ovs_receive_buffers"] = {
            "ports": len(done), "wanted_bytes": sorted(set(wants.values())),
            "before_bytes": sorted({d[1] for d in done}), "after_bytes": sorted({d[2] for d in done})}

    def _not_emulated(self, line: str) -> None:
        """Say, in the log and the run's metadata, what this machine could not emulate."""
        self.log(line)
        self.metadata.setdefault("not_emulated", []).append(line)

    def ingress_drops(self) -> dict[str, int]:
        """Packets each local switch port's ingress (ovs-vswitchd's receive socket on the userspace
        datapath) dropped so far: {} where there is no such socket or it cannot be read."""
        if self.metadata.get("datapath") != "user" or self.port_type != "system":
            return {}
        from . import datapath_socket
        return datapath_socket.ingress_drops([p["intf"] for p in self.switch_ports() if p["local"]])

    def _restore_ovs(self) -> None:
        if self._ovs_sched is not None:
            pid, policy, priority, nice = self._ovs_sched
            self._ovs_sched = None
            try:
                ovs_sched_mod.restore(pid, policy, priority, nice)
            except OSError:
                pass

    def fabric_interfaces(self) -> list[str]:
        """Switch interfaces whose peer is a switch (where BFD runs: hosts do not speak it)."""
        return [p["intf"] for p in self.switch_ports() if p["local"] and self.graph.nodes[p["peer"]]["tier"] > 0]

    def _enable_bfd(self, timeout_s: float = 20.0) -> None:
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

    def _wait_connected(self) -> None:
        switches = fgraph.switches(self.graph)
        if self.inactivity_probe_ms is not None:
            ovsdb.set_inactivity_probe(switches, self.inactivity_probe_ms)
            if self.remote is not None:
                self.remote.set_inactivity_probe(self.inactivity_probe_ms)
        deadline = time.monotonic() + self.connect_timeout
        want = set(switches)
        while True:
            up = {n for n, ok in self.connected_switches().items() if ok}
            if up >= want:
                return
            if self.controller_proc and self.controller_proc.poll() is not None:
                raise EmulationError(f"the controller exited (code {self.controller_proc.returncode}); "
                                     f"log: {self.metadata.get('controller_log')}")
            if time.monotonic() > deadline:
                missing = sorted(want - up)
                raise EmulationError(f"{len(missing)} of {len(want)} switches did not connect to the controller "
                                     f"within {self.connect_timeout:g} s: {', '.join(missing[:6])}")
            time.sleep(0.2)

    def _wiring_args(self) -> list[str]:
        """The controller's wiring report goes to the run directory; foreign numbers (``rewire``) come
        with the deployment file that maps the scenario onto them."""
        self.wiring_file = self._st.run_dir / "wiring.json"
        args = ["--wiring-out", str(self.wiring_file)]
        if self.staged:
            self.rollout_file = self._st.run_dir / "rollout.json"
            args += ["--rollout-out", str(self.rollout_file)]
        foreign = self.rewire.foreign
        if foreign and "--deployment" not in self.controller_args:
            path = self._st.run_dir / "deployment.yaml"
            path.write_text(yaml.safe_dump(rewire_deployment(self.graph, self.rewire), sort_keys=False))
            self.metadata["deployment"] = str(path)
            args += ["--deployment", str(path)]
        return args

    @property
    def staged(self) -> bool:
        """Is the controller asked for a staged rollout (``controller_args``: --rollout staged)?"""
        args = self.controller_args
        return any((a == "--rollout" and args[i + 1:i + 2] == ["staged"]) or a == "--rollout=staged"
                   for i, a in enumerate(args))

    def _read_wiring(self) -> None:
        """The controller's wiring report (controller/wiring.py) into the metadata, once it says the
        routes it decided on are installed (no packet goes out before); its findings are logged."""
        if self.wiring_file is None:
            return
        deadline = time.monotonic() + self.wiring_timeout
        report = self._wait_controller_file(
            self.wiring_file, "installed", deadline,
            f"the controller reported no routes installed within {self.wiring_timeout:g} s")
        self.metadata["wiring"] = report
        for finding in report.get("findings", []):
            self.log(f"wiring: {finding['line']}")
        if self.rollout_file is not None:
            self.metadata["rollout"] = self._wait_rollout(deadline + self.wiring_timeout)
            for plane in self.metadata["rollout"]["rolled_back"]:
                self.log(f"staged rollout: plane {plane} failed its probes and was rolled back")

    def _wait_rollout(self, deadline: float) -> dict:
        """The staged rollout's results once every stage is done."""
        assert self.rollout_file is not None
        return self._wait_controller_file(self.rollout_file, "done", deadline,
                                          "the staged rollout did not finish in time")

    def _wait_controller_file(self, path: Path, key: str, deadline: float, late: str) -> dict:
        """Poll the JSON file the controller writes at ``path`` until it reads whole with ``key`` set;
        one line if the controller exits first or ``deadline`` passes (``late``: what did not happen)."""
        def read() -> dict | None:
            try:
                got = json.loads(path.read_text())
            except (OSError, ValueError):
                return None
            return got if got.get(key) else None

        while (got := read()) is None:
            if self.controller_proc and self.controller_proc.poll() is not None:
                raise EmulationError(f"the controller exited (code {self.controller_proc.returncode}); "
                                     f"log: {self.metadata.get('controller_log')}")
            if time.monotonic() > deadline:
                raise EmulationError(f"{late} (log: {self.metadata.get('controller_log')})")
            time.sleep(0.1)
        return got

    def _verify(self, rounds: int = 3) -> None:
        """Every host-port pair on every plane must answer; pairs that fail are retried (ARP
        answers and flow set-up can lag under load) up to ``rounds`` times in all."""
        pairs = self.all_pairs()
        pending = pairs
        history = []
        for attempt in range(rounds):
            if attempt:
                time.sleep(1.0)
            pending = self.ping_all(pairs=pending)["failed"]
            history.append(len(pending))
            if not pending:
                break
        self.metadata["reachability"] = {"pairs": len(pairs), "failed": len(pending),
                                         "failed_per_round": history}
        if pending:
            sample = ", ".join(f"{a}->{b}" for (_, a, _, b) in pending[:5])
            raise EmulationError(f"{len(pending)} of {len(pairs)} host-port pairs cannot reach "
                                 f"each other: {sample}")

    def _verify_branches(self) -> None:
        walk = self.walk_branches()
        self.metadata["reachability_branches"] = {k: v for k, v in walk.items() if k != "missing"}
        self.metadata["reachability_branches"]["missing"] = len(walk["missing"])
        if walk["missing"]:
            sample = ", ".join(f"{sip}:{sp}->{dip}" for (_, sip, _, dip, sp) in walk["missing"][:5])
            raise EmulationError(f"{len(walk['missing'])} of {walk['probes']} (pair, entropy branch) probes did "
                                 f"not arrive: {sample}")

    # -- queries --------------------------------------------------------------------------
    def host(self, name: str) -> Any:
        return self.net.get(name)

    @property
    def hosts(self) -> list[str]:
        return fgraph.hosts(self.graph)

    def interfaces(self, host: str) -> list[dict[str, Any]]:
        """A host's interfaces: name (hN-ethI), ip, cidr, plane, rail, mac, leaf."""
        return host_interfaces(self.graph, host)

    def ip(self, host: str, plane: int = 0, rail: int = 0) -> str:
        for p in host_interfaces(self.graph, host):
            if p["plane"] == plane and p["rail"] == rail:
                return p["ip"]
        raise KeyError(f"{host} has no port on plane {plane} rail {rail}")

    def all_pairs(self) -> list[tuple[str, str, str, str]]:
        """(src host, src ip, dst host, dst ip) for every pair of host ports on the same plane."""
        return [tuple(p) for p in reachability.all_pairs(self.graph)]  # type: ignore[misc]

    def switch_ports(self) -> list[dict[str, Any]]:
        """Every switch egress port: switch, port, intf name, peer node, emulated rate, delay, local."""
        return nodes.switch_ports(self.graph, self._is_local)

    def _is_local(self, node: str) -> bool:
        """Whether a node runs on this machine (always, unless cluster servers were given)."""
        if not self.servers or self.net is None:
            return True
        return getattr(self.net.get(node), "server", "localhost") == "localhost"

    def connected_switches(self) -> dict[str, bool]:
        """Bridge name -> is_connected to its controller, read from ovsdb (each server's own)."""
        local = ovsdb.connected(fgraph.switches(self.graph))
        return local if self.remote is None else {**local, **self.remote.connected()}

    # -- reachability walks -----------------------------------------------------------------
    def ping_all(self, pairs: list[tuple[str, str, str, str]] | None = None, timeout_s: float = 2.0,
                 count: int = 1) -> dict[str, Any]:
        """Ping every host-port pair on every plane (from the source's port on that plane).

        Returns ``{"pairs": n, "failed": [(src, src_ip, dst, dst_ip), ...]}``. Sources run in
        parallel, each pinging ``reachability.PING_BATCH`` destinations at once.
        """
        return walks.ping(lambda host, argv: self.host(host).popen(argv), self._st.run_dir,
                          self.all_pairs() if pairs is None else pairs, timeout_s, count)

    def entropy_source_ports(self) -> list[int]:
        """One UDP source port per entropy branch the switches match now (one when nothing spreads)."""
        return walks.entropy_source_ports(sw for sw in fgraph.switches(self.graph) if self._is_local(sw))

    def walk_branches(self, pairs: list[tuple[str, str, str, str]] | None = None,
                      source_ports: list[int] | None = None, repeat: int = 3) -> dict[str, Any]:
        """UDP probes from every host port to every other on its plane, one per entropy
        branch (source port); returns ``reachability.branch_report``: per (pair, branch)
        whether it arrived. Bounded: every host sends for ``repeat * 50 ms`` and listens 1 s more."""
        listen = {h: [p["ip"] for p in self.interfaces(h)] for h in self.hosts}
        try:
            return walks.branches(self.popen, self._st.run_dir, self.all_pairs() if pairs is None else pairs,
                                  self.entropy_source_ports() if source_ports is None else source_ports,
                                  listen, repeat)
        except walks.WalkError as exc:
            raise EmulationError(str(exc)) from None

    # -- processes on hosts ------------------------------------------------------------------
    def popen(self, host: str, cmd: list[str] | str, **kwargs: Any) -> subprocess.Popen:
        """Start a process on a host (recorded in the run's state; ended at stop)."""
        proc = self.host(host).popen(cmd, **kwargs)
        self._st.add_pid(proc.pid, f"{host}: {cmd if isinstance(cmd, str) else ' '.join(cmd)}")
        return proc

    # -- faults (hpnlab.fabric.emulation.faults) ---------------------------------------------
    def netlink(self) -> Any:
        """A pyroute2 IPRoute socket in the root namespace (opened once; None without pyroute2)."""
        return self.faults.netlink()

    def link_down(self, u: str, v: str, key: int | None = None, side: str | None = None) -> float:
        """Take a link down (both ends, or only ``side``'s). Returns the time.time() at which it was applied."""
        return self.faults.link_down(u, v, key, side)

    def link_up(self, u: str, v: str, key: int | None = None, side: str | None = None) -> float:
        return self.faults.link_up(u, v, key, side)

    def link_drop(self, u: str, v: str, key: int | None = None, side: str | None = None) -> float:
        """A gray failure: the link stays up, everything ``side`` (default ``u``) sends on it is dropped."""
        return self.faults.link_drop(u, v, key, side)

    def link_restore(self, u: str, v: str, key: int | None = None, side: str | None = None) -> float:
        return self.faults.link_restore(u, v, key, side)

    def switch_down(self, name: str) -> float:
        """A switch fails: every link of it goes down (its neighbours see carrier loss)."""
        return self.faults.switch_down(name)

    def switch_up(self, name: str) -> float:
        return self.faults.switch_up(name)

    def intf_is_up(self, name: str, host: str | None = None) -> bool:
        """Operational state of an interface (a host's, inside its namespace, when host is given)."""
        return self.faults.is_up(name, host)

    def set_ecn_policy(self, policy: str) -> None:
        """Replace the controller's dynamic-ECN policy live (every port back to its start-up
        thresholds first); returns once the controller has taken it."""
        if policy == self.ecn_policy:
            return
        if self.controller != "hpnlab" or self._ecn_control is None:
            raise UserError(f"ECN policy {policy!r} needs the hpnlab controller")
        try:
            request_policy(self._ecn_control, policy)
        except ControllerError as exc:
            raise UserError(str(exc)) from None
        self.ecn_policy = policy
        self.metadata["ecn_policy"] = policy

    def set_routing_weights(self, mode: str) -> None:
        """Switch the controller's multipath weights live between "weighted" and "ecmp" (equal shares on
        weighted mode's tables: every source port takes the path ecmp mode gives it); returns once the
        controller has taken it. Needs an emulation started with ``routing_weights="weighted"``."""
        if mode == self.routing_weights:
            return
        if self._weights_control is None:
            raise UserError(f"routing weights {mode!r} live: start the emulation with routing_weights='weighted'")
        try:
            request_policy(self._weights_control, mode, what="routing weights")
        except ControllerError as exc:
            raise UserError(str(exc)) from None
        self.routing_weights = mode
        self.metadata["routing_weights"] = mode

    def run_timeline(self, timeline: Any, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        from .timeline import run as run_timeline
        return run_timeline(self, timeline, log=log or self.log)

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Remove everything this run created (the same code path as `hpnlab clean`)."""
        if self._stopped:
            return
        self._stopped = True
        from hpnlab.fabric.emulation.cleanup import teardown
        try:
            self._unwatch_controller()       # ending the controller below is no loss
            self._restore_ovs()
            self.faults.close()
            if self.ecn is not None:
                self.ecn.close()
            if self.state is not None:
                self.metadata["removed"] = teardown(self.state, log=self.log)
            if self.net is not None:  # reap the shells teardown ended (no zombies in long runs)
                for node in self.net.hosts + self.net.switches:
                    shell = getattr(node, "shell", None)
                    if shell is not None:
                        try:
                            shell.wait(timeout=1)
                        except Exception:
                            pass
        finally:
            if self._old_env is None:
                os.environ.pop(ENV_MARK, None)
            else:
                os.environ[ENV_MARK] = self._old_env
            self._signals.restore()
            self._lock.release()
