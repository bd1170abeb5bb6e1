"""The emulation harness: a scenario as a live Mininet network on real Open vSwitch.

``Emulation(scenario, options)`` keeps only the order of things; its collaborators do the work:
``builder.FabricBuilder`` (hosts, switches, links, shaping, BFD, the ECN stage, OVS's tuning),
``supervisor.ControllerSupervisor`` (the controller process: start, readiness, watch, restart,
loss, live changes) and ``faults.Faults`` (the fault API: links and switches down and up, gray
failures, the controller killed and restarted, timelines). What it is asked to do is one
``options.EmulationOptions`` value, written to the run directory (``options.json``). Each other
concern lives in its own module: ``preflight`` (checks, mechanisms), ``controller_process``,
``nodes`` (node classes and interface configuration), ``ovsdb`` (every ovs-vsctl call),
``reachability`` (pure walk scripts and parsers) and ``walks`` (running them on the hosts),
``ecn``, ``state``, ``signals``.
See the package docstring (``hpnlab.fabric.emulation``) for the API and what it does.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from hpnlab.fabric.emulation import kernel, sizing
from hpnlab.fabric.emulation.mn import host_interfaces
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec

from ..errors import UserError
from . import preflight, reachability, walks
from .builder import FabricBuilder
from .cleanup import teardown
from .errors import ControllerLost, EmulationError
from .faults import Faults
from .options import OPTIONS_FILE, EmulationOptions
from .rewire import physical
from .signals import Unwind
from .state import ENV_MARK, Lock, RunState
from .supervisor import ControllerSupervisor

__all__ = ["ControllerLost", "Emulation", "EmulationError", "EmulationOptions"]


def _log_default(msg: str) -> None:
    print(f"hpnlab: {msg}", file=sys.stderr, flush=True)


class Emulation:
    """A scenario running as a live emulated fabric. Use as a context manager.

    ``scenario``: a validated ``Scenario`` (a preset name or file is loaded as it is); ``options``:
    what to do with it (``EmulationOptions``, checked when made). ``log``: where the run's lines go
    (None: nowhere); ``on_built(emu)``: called once the network exists, before the switches are
    installed (tests: break something first)."""

    def __init__(self, scenario: str | spec.Scenario, options: EmulationOptions | None = None, *,
                 log: Callable[[str], None] | None = _log_default,
                 on_built: Callable[[Emulation], None] | None = None):
        self.scenario = scenario if isinstance(scenario, spec.Scenario) else spec.load(scenario)
        self.options = options if options is not None else EmulationOptions()
        if not isinstance(self.options, EmulationOptions):
            raise TypeError(f"options must be EmulationOptions, got {type(self.options).__name__}")
        self.log = log or (lambda m: None)
        self.on_built = on_built
        pfc = self.options.ports.pfc          # --pfc on|off: the scenario's emulation.lossless.pfc for this run
        if pfc is not None and pfc != self.scenario.emulation.lossless.pfc:
            self.scenario = spec.merged(self.scenario, {"emulation": {"lossless": {"pfc": pfc}}})
        if self.scenario.emulation.lossless.pfc and self.options.cluster.servers:
            raise UserError("priority flow control runs on one machine only (--pfc off with cluster servers)")
        self.graph = fgraph.build(self.scenario)
        #: cabled differently from the scenario on purpose (tests: emulation/rewire.py); the controller
        #: gets the scenario (and a deployment file when the numbers are foreign), Mininet the physical graph
        self.physical = physical(self.graph, self.options.rewire) if self.options.rewire else self.graph
        self.metadata: dict[str, Any] = {"scenario": self.scenario.name, "controller": self.options.controller.kind}
        self.timings: dict[str, float] = {}
        self.caps: kernel.Capabilities | None = None
        self.state: RunState | None = None
        self.net: Any = None
        self.ecn: Any = None  # hpnlab.fabric.emulation.ecn.EcnStage once started (with one)
        self.pfc: Any = None  # hpnlab.fabric.emulation.pfc.PfcStage with priority flow control
        self.builder = FabricBuilder(self.scenario, self.graph, self.physical, self.options, self.metadata, self.log)
        self.controller = ControllerSupervisor(self.options.controller, self.scenario, self.graph,
                                               self.options.rewire, self.builder, self.metadata, self.log)
        self.faults = Faults(self.graph, lambda host, line: self.host(host).cmd(line), self.builder.is_local,
                             self.scenario.name, controller=self.controller)
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

    # -- context manager --------------------------------------------------------------
    def __enter__(self) -> Emulation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def preflight(self) -> kernel.Capabilities:
        """Check everything that could stop the run; raise UserError with one line."""
        caps, self.metadata["estimate"] = preflight.check(self.graph, self.options.controller.kind,
                                                          self.options.controller.ofp_port)
        return caps

    # -- start: the order of things -----------------------------------------------------
    def start(self) -> Emulation:
        t0 = time.monotonic()
        self.caps = caps = self.preflight()
        opts = self.options
        self._lock.acquire(f"scenario {self.scenario.name}", opts.supervision.lock_wait_s)
        try:
            preflight.check_names_free(self.graph)     # under the lock: a live run holds it
        except BaseException:
            self._lock.release()
            raise
        try:
            self._signals.install()
            self.state = state = RunState.new(self.scenario.name)
            self._stopped = False
            self.metadata["run_id"] = state.run_id
            state.add_dir(str(state.run_dir))
            state.run_dir.mkdir(parents=True, exist_ok=True)
            (state.run_dir / OPTIONS_FILE).write_text(json.dumps(opts.as_dict(), indent=1))
            self.metadata["options"] = opts.as_dict()
            self._old_env = os.environ.get(ENV_MARK)
            os.environ[ENV_MARK] = state.run_id
            used, warnings = preflight.mechanisms(caps, self.graph, opts.ports.shape, opts.ports.ecn)
            self.metadata.update(used)
            for line in warnings:
                self.log(line)
            self.builder.choose_port_type(caps)
            if self.controller.active:
                self.controller.start(state)
            self.timings["controller_s"] = time.monotonic() - t0
            self.net = self.builder.build(state, caps, self.controller.target())
            self.timings["built_s"] = time.monotonic() - t0
            if self.on_built is not None:
                self.on_built(self)
            if opts.ports.ovs_sched != "off" and self.metadata.get("datapath") == "user":
                self.builder.boost_ovs()     # only the userspace datapath forwards in that thread
            if self.builder.bfd_ms:
                self.builder.enable_bfd()
                self.timings["bfd_s"] = time.monotonic() - t0
            if self.scenario.emulation.lossless.pfc:
                self.pfc = self.builder.pfc_stage()
            if opts.ports.ecn and (caps.ecn_mechanism is not None or self.pfc is not None):
                self.ecn = self.builder.ecn_stage(caps.ecn_mechanism or "bpf",
                                                  pfc_pins=self.pfc.pin_dir if self.pfc is not None else None)
            if self.controller.active:
                self.controller.wait_connected()
                self.controller.read_wiring()
                self.controller.watch()
            self.timings["connected_s"] = time.monotonic() - t0
            if opts.supervision.verify:
                self._verify()
            if opts.supervision.verify_branches:
                self._verify_branches()
            if self.metadata.get("datapath") == "user" and self.builder.port_type == "system" and opts.ports.shape:
                self.builder.size_ovs_buffers()     # after traffic crossed it: OVS opens the socket on first use
            self.timings["up_s"] = time.monotonic() - t0
            if opts.supervision.verify and not opts.cluster.servers:
                sizing.record_bringup(self.graph.number_of_nodes(), self.timings["up_s"])
            state.notes["metadata"] = self.metadata
            state.save()
            (state.run_dir / "metadata.json").write_text(json.dumps(self.metadata, indent=1, default=str))
        except BaseException:
            self.stop()
            raise
        return self

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
        return self.builder.switch_ports()

    def connected_switches(self) -> dict[str, bool]:
        """Bridge name -> is_connected to its controller, read from ovsdb (each server's own)."""
        return self.builder.connected()

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
        return walks.entropy_source_ports(sw for sw in fgraph.switches(self.graph) if self.builder.is_local(sw))

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

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Remove everything this run created (the same code path as `hpnlab clean`)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self.controller.unwatch()       # ending the controller below is no loss
            self.builder.restore_ovs()
            self.faults.close()
            if self.pfc is not None:
                self.pfc.close()         # the agent ends first, opening every gate (its loss is no loss)
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
