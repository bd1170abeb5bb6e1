"""The controller of a run, supervised: started, ready, watched, restarted, answered when lost.

``ControllerSupervisor`` is the emulation's one handle on its controller process
(``controller_process.ControllerProcess``): it chooses the OpenFlow port, builds the controller's
settings from ``options.controller`` (``controller_args``: the ONE place they are made), points
Open vSwitch at the TLS files, waits for the ``ready`` line, for every switch to connect and for
the wiring report (and a staged rollout's results), watches the process and answers its loss as
asked (restart, stop the run, or continue), and passes live changes on (ECN policy, routing
weights). The switches it waits for are reached through a small protocol (``Switches``: the
builder's ``connected`` and ``set_inactivity_probe``).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import networkx as nx
import yaml

from hpnlab.fabric.routing.weights import DEFAULT_MODE as DEFAULT_WEIGHTS
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec

from ..errors import UserError
from . import ovsdb
from .controller_process import (
    DEFAULT_OFP_PORT,
    ControllerError,
    ControllerProcess,
    ControllerWatch,
    ecn_args,
    free_port,
    request_policy,
    tls_args,
    tls_files,
)
from .errors import ControllerLost, EmulationError
from .nodes import ControllerTarget
from .options import ControllerOptions
from .rewire import Rewire
from .rewire import deployment as rewire_deployment
from .state import RunState

__all__ = ["ControllerFiles", "ControllerSupervisor", "Switches", "controller_args"]


class Switches(Protocol):
    """What the supervisor needs of the fabric: which switches are connected, and OVS's echo timeout."""

    def connected(self) -> dict[str, bool]: ...

    def set_inactivity_probe(self, ms: int) -> None: ...


@dataclass(frozen=True)
class ControllerFiles:
    """The files a controller of one run writes and reads, all in the run directory."""
    telemetry: Path
    ecn_control: Path
    wiring: Path
    rollout: Path | None = None           # a staged rollout's results
    weights_control: Path | None = None   # weighted mode's live switch
    deployment: Path | None = None        # the deployment file of a fabric on foreign numbers (rewire)

    @classmethod
    def in_dir(cls, run_dir: Path, *, staged: bool, weights: bool, deployment: bool) -> ControllerFiles:
        return cls(telemetry=run_dir / "telemetry.jsonl", ecn_control=run_dir / "ecn-policy.json",
                   wiring=run_dir / "wiring.json", rollout=run_dir / "rollout.json" if staged else None,
                   weights_control=run_dir / "routing-weights.json" if weights else None,
                   deployment=run_dir / "deployment.yaml" if deployment else None)


def own_args(options: ControllerOptions) -> list[str]:
    """The arguments the options themselves add to the user's ``extra_args`` (pure)."""
    args = list(options.extra_args)
    if not options.fast_failover:
        args.append("--no-fast-failover")
    if options.kind == "hpnlab":
        args += ["--arp", options.arp]
    if options.routing_weights != DEFAULT_WEIGHTS:
        args += ["--routing-weights", options.routing_weights]
    return args


def is_staged(args: list[str] | tuple[str, ...]) -> bool:
    """Do these controller arguments ask for a staged rollout (--rollout staged)?"""
    return any((a == "--rollout" and list(args[i + 1:i + 2]) == ["staged"]) or a == "--rollout=staged"
               for i, a in enumerate(args))


def controller_args(options: ControllerOptions, files: ControllerFiles, tls: dict[str, str] | None) -> list[str]:
    """The controller's settings as its command line (pure): telemetry and dynamic ECN, the wiring
    report (and a staged rollout's, and a deployment file), weighted mode's live switch, TLS, then
    the user's arguments and what the options add to them. The one place a run's controller
    settings are made."""
    args = ecn_args(options.ecn_policy, options.telemetry_interval_ms, files.telemetry, files.ecn_control)
    args += ["--wiring-out", str(files.wiring)]
    if files.rollout is not None:
        args += ["--rollout-out", str(files.rollout)]
    if files.deployment is not None:
        args += ["--deployment", str(files.deployment)]
    if files.weights_control is not None:
        args += ["--weights-control", str(files.weights_control)]
    if tls is not None:
        args += tls_args(tls)
    return args + own_args(options)


class ControllerSupervisor:
    """One run's controller process: start, readiness, watch, restart, loss (see the module docstring)."""

    def __init__(self, options: ControllerOptions, scenario: spec.Scenario, graph: nx.MultiGraph,
                 rewire: Rewire, switches: Switches, metadata: dict[str, Any],
                 log: Callable[[str], None] = lambda m: None):
        self.options = options
        self.kind = options.kind
        self.scenario = scenario
        self.graph = graph
        self.rewire = rewire
        self.switches = switches
        self.metadata = metadata
        self.log = log
        #: OpenFlow over TLS: the files of the TLS directory by role, or None (plain TCP)
        self.tls = tls_files(options.tls_dir) if options.tls_dir else None
        #: what a loss is answered with now (a test may change it while the run goes on)
        self.on_loss = options.on_loss
        #: the ECN policy and routing weights in force (changed live by ``set_ecn_policy``/``set_routing_weights``)
        self.ecn_policy = options.ecn_policy
        self.routing_weights = options.routing_weights
        #: one entry per loss noticed: {"at", "code", "action", "restart_s"}
        self.losses: list[dict[str, Any]] = []
        self.files: ControllerFiles | None = None
        self.ofp_port: int | None = None
        self.proc: Any = None           # the controller's subprocess.Popen while it runs
        self._ctl: ControllerProcess | None = None
        self._watch: ControllerWatch | None = None
        self._state: RunState | None = None
        self._lost_line = ""
        self._old_usr1: Any = None

    @property
    def active(self) -> bool:
        """Does this run have a controller process (the hpnlab controller)?"""
        return self.kind == "hpnlab"

    @property
    def staged(self) -> bool:
        """Is the controller asked for a staged rollout (``extra_args``: --rollout staged)?"""
        return is_staged(self.options.extra_args)

    @property
    def telemetry_file(self) -> Path | None:
        """The controller's telemetry (JSON lines) once started, else None."""
        return self.files.telemetry if self.files is not None else None

    @property
    def wiring_file(self) -> Path | None:
        return self.files.wiring if self.files is not None else None

    def target(self) -> ControllerTarget:
        """Where the switches dial."""
        return ControllerTarget(self.ofp_port or DEFAULT_OFP_PORT, self.options.listen,
                                "ssl" if self.tls is not None else "tcp")

    # -- start and readiness -----------------------------------------------------------------
    def start(self, state: RunState) -> None:
        """Start the controller of this run (files in its run directory) and wait for its 'ready'."""
        self._state = state
        requested = self.options.ofp_port
        port: int = requested or free_port(DEFAULT_OFP_PORT)
        if requested is None and port != DEFAULT_OFP_PORT:
            self.log(f"port {DEFAULT_OFP_PORT} is taken; the controller listens on {port}")
        self.ofp_port = port
        extra = own_args(self.options)
        self.files = ControllerFiles.in_dir(
            state.run_dir, staged=self.staged, weights="--routing-weights" in extra,
            deployment=self.rewire.foreign and "--deployment" not in self.options.extra_args)
        if self.files.deployment is not None:     # foreign numbers: the file that maps the scenario onto them
            self.files.deployment.write_text(yaml.safe_dump(rewire_deployment(self.graph, self.rewire),
                                                            sort_keys=False))
            self.metadata["deployment"] = str(self.files.deployment)
        if self.tls is not None:
            self._switch_tls(state)
        ctl = ControllerProcess(self.scenario, state.run_dir, port, self.options.listen, self.options.policy,
                                controller_args(self.options, self.files, self.tls))
        self.metadata["controller_cmd"] = " ".join(ctl.cmd)
        self.metadata["ecn_policy"] = self.ecn_policy
        self.metadata["telemetry_interval_ms"] = self.options.telemetry_interval_ms
        self.metadata["fast_failover"] = self.options.fast_failover
        self.metadata["routing_weights"] = self.routing_weights
        self.metadata["arp"] = self.options.arp
        self.metadata["controller_log"] = str(ctl.log_file)
        self._ctl = ctl
        self._spawn()

    def _spawn(self) -> None:
        assert self._ctl is not None and self._state is not None
        self.proc = self._ctl.start()
        self._state.add_pid(self.proc.pid, "controller", group=True)
        try:
            self._ctl.wait_ready(self.options.ready_timeout_s)
        except ControllerError as exc:
            raise EmulationError(str(exc)) from None

    def _switch_tls(self, state: RunState) -> None:
        """Open vSwitch's key, certificate and CA for ``ssl:`` controllers. The setting is machine-wide
        (one SSL row per ovsdb): the one in force is written into the run's state first, and put back
        at teardown (``cleanup.teardown``, also after a crash by `hpnlab clean`)."""
        assert self.tls is not None
        state.notes["ovs_ssl"] = {"previous": ovsdb.get_ssl()}
        state.save()
        error = ovsdb.set_ssl(self.tls["switch_key"], self.tls["switch_cert"], self.tls["ca"])
        if error:
            raise EmulationError(f"Open vSwitch would not take the TLS files: {error}")
        self.metadata["controller_tls"] = {"ca": self.tls["ca"], "switch_cert": self.tls["switch_cert"]}

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise EmulationError(f"the controller exited (code {self.proc.returncode}); "
                                 f"log: {self.metadata.get('controller_log')}")

    def wait_connected(self) -> None:
        """Until every switch is connected to the controller (``connect_timeout_s``)."""
        switches = fgraph.switches(self.graph)
        if self.options.inactivity_probe_ms is not None:
            self.switches.set_inactivity_probe(self.options.inactivity_probe_ms)
        timeout = self.options.connect_timeout_s
        deadline = time.monotonic() + timeout
        want = set(switches)
        while True:
            up = {n for n, ok in self.switches.connected().items() if ok}
            if up >= want:
                return
            self._check_alive()
            if time.monotonic() > deadline:
                missing = sorted(want - up)
                raise EmulationError(f"{len(missing)} of {len(want)} switches did not connect to the controller "
                                     f"within {timeout:g} s: {', '.join(missing[:6])}")
            time.sleep(0.2)

    def read_wiring(self) -> None:
        """The controller's wiring report (controller/wiring.py) into the metadata, once it says the
        routes it decided on are installed (no packet goes out before); its findings are logged."""
        if self.files is None:
            return
        timeout = self.options.wiring_timeout_s
        deadline = time.monotonic() + timeout
        report = self._wait_file(self.files.wiring, "installed", deadline,
                                 f"the controller reported no routes installed within {timeout:g} s")
        self.metadata["wiring"] = report
        for finding in report.get("findings", []):
            self.log(f"wiring: {finding['line']}")
        if self.files.rollout is not None:
            self.metadata["rollout"] = self._wait_file(self.files.rollout, "done", deadline + timeout,
                                                       "the staged rollout did not finish in time")
            for plane in self.metadata["rollout"]["rolled_back"]:
                self.log(f"staged rollout: plane {plane} failed its probes and was rolled back")

    def _wait_file(self, path: Path, key: str, deadline: float, late: str) -> dict:
        """Poll the JSON file the controller writes at ``path`` until it reads whole with ``key`` set;
        one line if the controller exits first or ``deadline`` passes (``late``: what did not happen)."""
        def read() -> dict | None:
            try:
                got = json.loads(path.read_text())
            except (OSError, ValueError):
                return None
            return got if got.get(key) else None

        while (got := read()) is None:
            self._check_alive()
            if time.monotonic() > deadline:
                raise EmulationError(f"{late} (log: {self.metadata.get('controller_log')})")
            time.sleep(0.1)
        return got

    # -- the process: loss, kill, restart ------------------------------------------------------
    def watch(self) -> None:
        """From now on a dead controller is noticed (its pid polled) and answered as chosen."""
        if self._ctl is None:
            return
        if threading.current_thread() is threading.main_thread():
            self._old_usr1 = signal.signal(signal.SIGUSR1, self._raise_lost)
        self.metadata["on_controller_loss"] = self.on_loss
        self._watch = ControllerWatch(self._ctl, self._lost).start()

    def _raise_lost(self, _signum: int, _frame: Any) -> None:
        raise ControllerLost(self._lost_line)

    def _lost(self, code: int) -> None:
        """The watch found the controller dead: one line, then restart, stop or continue."""
        pid = self._ctl.proc.pid if self._ctl and self._ctl.proc else 0
        action = self.on_loss
        what = {"restart": "restarting it", "stop": "stopping the run",
                "continue": "continuing without it (the switches keep their tables: fail mode secure)"}[action]
        self._lost_line = (f"the controller (pid {pid}) exited with code {code}: {what} "
                           f"(--on-controller-loss {action}; log: {self.metadata.get('controller_log')})")
        self.log(self._lost_line)
        loss: dict[str, Any] = {"at": time.time(), "code": code, "action": action}
        self.losses.append(loss)
        if action == "restart":
            loss["restart_s"] = self.restart(watch=False)
        elif action == "stop":
            if self._old_usr1 is not None:
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
            else:
                import _thread
                _thread.interrupt_main()

    def kill(self, sig: int = signal.SIGKILL) -> int | None:
        """End the controller process as a crash would (SIGKILL by default); its exit code. The watch
        notices and answers it as chosen (``on_loss``)."""
        if self._ctl is None:
            raise UserError("this run has no hpnlab controller to kill")
        return self._ctl.kill(sig)

    def restart(self, watch: bool = True) -> float:
        """Start the controller again (same port and arguments; a dead one first ended) and wait until
        every switch has connected to it; the seconds that took."""
        if self._ctl is None:
            raise UserError("this run has no hpnlab controller to restart")
        t0 = time.monotonic()
        if self._ctl.exited() is None:
            if self._watch is not None and watch:
                self._watch.stop()
            self._ctl.kill()
        self._spawn()
        self.wait_connected()
        if watch and (self._watch is None or self._watch._stop.is_set()):
            self._watch = ControllerWatch(self._ctl, self._lost).start()
        return time.monotonic() - t0

    def signal(self, sig: int) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) the controller process (its process group); nothing
        without one running."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def unwatch(self) -> None:
        """Stop watching (ending the controller from now on is no loss)."""
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._old_usr1 is not None:
            try:
                signal.signal(signal.SIGUSR1, self._old_usr1)
            except (ValueError, TypeError):
                pass
            self._old_usr1 = None

    # -- live changes ---------------------------------------------------------------------------
    def set_ecn_policy(self, policy: str) -> None:
        """Replace the controller's dynamic-ECN policy live (every port back to its start-up
        thresholds first); returns once the controller has taken it."""
        if policy == self.ecn_policy:
            return
        if not self.active or self.files is None:
            raise UserError(f"ECN policy {policy!r} needs the hpnlab controller")
        try:
            request_policy(self.files.ecn_control, policy)
        except ControllerError as exc:
            raise UserError(str(exc)) from None
        self.ecn_policy = policy
        self.metadata["ecn_policy"] = policy

    def set_routing_weights(self, mode: str) -> None:
        """Switch the controller's multipath weights live between "weighted" and "ecmp" (equal shares on
        weighted mode's tables: every source port takes the path ecmp mode gives it); returns once the
        controller has taken it. Needs a run started with ``routing_weights="weighted"``."""
        if mode == self.routing_weights:
            return
        if self.files is None or self.files.weights_control is None:
            raise UserError(f"routing weights {mode!r} live: start the emulation with routing_weights='weighted'")
        try:
            request_policy(self.files.weights_control, mode, what="routing weights")
        except ControllerError as exc:
            raise UserError(str(exc)) from None
        self.routing_weights = mode
        self.metadata["routing_weights"] = mode

    @property
    def live_weights(self) -> bool:
        """Can the routing weights be switched live (the controller runs weighted mode's tables)?"""
        return self.files is not None and self.files.weights_control is not None
