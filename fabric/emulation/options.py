"""What an emulation is asked to do, as one typed value: ``Emulation(scenario, options)``.

The options come in groups, one per concern of the harness (Mininet's way: options grouped per
class), each a frozen dataclass with its defaults written here and nowhere else::

    EmulationOptions(
        controller=ControllerOptions(kind="hpnlab", arp="per-host", on_loss="restart"),
        ports=PortOptions(shape=True, ecn=False),
        failover=FailoverOptions(bfd_ms=50),
        supervision=SupervisionOptions(lock_wait_s=300, verify=True),
        cluster=ClusterOptions(servers=("localhost", "node2"), placement="plane"),
        rewire=Rewire(...))

``controller``   the controller process: which, where it listens, what it is told (routing policy,
                 TLS, multipath weights, ARP mode, fast failover, ECN policy and telemetry), what
                 a run does when it dies, and how long it may take to be ready and to get every
                 switch connected
``ports``        the switch ports and links: shaping, the ECN marking stage, the port type, the
                 scheduling of ovs-vswitchd's forwarding thread, priority flow control (``pfc``)
``failover``     BFD on every switch-to-switch interface (0 ms: the scenario's ``bfd`` block)
``supervision``  the run itself: how long to wait for the machine-wide lock, which reachability
                 checks must pass before the fabric is handed over
``cluster``      Mininet's cluster edition: the servers and how switches are placed on them
``rewire``       cabled differently from the scenario on purpose (``emulation/rewire.py``)

Every value is checked once, when the options are made: a bad value is a ``UserError`` whose
message has one line per bad value (``OptionsError.problems``; joined by "; " on the command
line). ``as_dict``/``from_dict`` are the options as plain data: what a run writes to its run
directory (``options.json``) beside its metadata, and reads back the same.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpnlab.fabric.routing.compiler import DEFAULT_ARP, DEFAULT_FAST_FAILOVER
from hpnlab.fabric.routing.telemetry import DEFAULT_INTERVAL_MS
from hpnlab.fabric.routing.weights import DEFAULT_MODE as DEFAULT_WEIGHTS
from hpnlab.fabric.routing.weights import MODES as ROUTING_WEIGHTS  # the controller's: equal, or load-following
from hpnlab.fabric.workload.ecn import STATIC_POLICY

from ..errors import UserError, short
from .controller_process import ON_CONTROLLER_LOSS, check_arp_mode, check_on_controller_loss, tls_files
from .kernel import PORT_TYPE_CHOICES
from .ovs_sched import MODES as OVS_SCHED_MODES
from .ovsdb import BFD_MULT
from .rewire import Rewire

__all__ = ["CONTROLLERS", "ON_CONTROLLER_LOSS", "PLACEMENTS", "ROUTING_WEIGHTS", "ClusterOptions",
           "ControllerOptions", "EmulationOptions", "FailoverOptions", "OptionsError", "PortOptions",
           "SupervisionOptions"]

#: the controllers a run can have: the project's own, or none (standalone switches; loop-free fabrics only)
CONTROLLERS = ("hpnlab", "none")
#: cluster placements: each plane's switches on one server, or Mininet's placers (``nodes.placers``)
PLACEMENTS = ("plane", "switch-bin", "round-robin", "random")
#: the name of the options file in a run's directory
OPTIONS_FILE = "options.json"


class OptionsError(UserError):
    """Options with bad values: ``problems`` has one line per bad value."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class ControllerOptions:
    """The controller process and what it is told."""
    #: "hpnlab" (the project's OpenFlow 1.3 controller) or "none" (standalone switches, loop-free fabrics)
    kind: str = "hpnlab"
    #: the OpenFlow port; None: 6653, or a free one when it is taken
    ofp_port: int | None = None
    #: the address the controller listens on and the switches dial (a routable one with cluster servers)
    listen: str = "127.0.0.1"
    #: the routing policy (``--policy``: aggregate or host-routes); None: the controller's default
    policy: str | None = None
    #: OpenFlow over TLS with the files of this directory (tools/scripts/make_test_ca.sh); None: plain TCP
    tls_dir: str | Path | None = None
    #: the multipath weights: ecmp (equal) or weighted (load-following, live switchable)
    routing_weights: str = DEFAULT_WEIGHTS
    #: how the leaves answer ARP (fabric/routing/compiler.py ARP_MODES)
    arp: str = DEFAULT_ARP
    #: local protection (fast-failover groups); False: the controller-only baseline
    fast_failover: bool = DEFAULT_FAST_FAILOVER
    #: the dynamic-ECN policy (controller/ecn_policy.py) and the telemetry interval (ms)
    ecn_policy: str = STATIC_POLICY
    telemetry_interval_ms: int = DEFAULT_INTERVAL_MS
    #: when the controller process dies: "restart" it, "stop" the run (ControllerLost), or "continue"
    on_loss: str = "continue"
    #: more command-line arguments for the controller (e.g. ``--metrics-port N``, ``--rollout staged``)
    extra_args: tuple[str, ...] = ()
    #: how long the controller may take to print 'ready' (os-ken's imports alone take 30-60 s under qemu TCG)
    ready_timeout_s: float = 30.0
    #: how long every switch may take to connect to it
    connect_timeout_s: float = 60.0
    #: how long to wait for its wiring report once every switch is connected
    wiring_timeout_s: float = 60.0
    #: OVS drops a controller that leaves its echo unanswered this long (None: OVS's 5 s); a CPU-starved
    #: controller needs more, or every switch flaps
    inactivity_probe_ms: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tls_dir, Path):      # kept as text: the options are plain data
            object.__setattr__(self, "tls_dir", str(self.tls_dir))

    def problems(self) -> list[str]:
        out = []
        if self.kind not in CONTROLLERS:
            out.append(f"unknown controller {self.kind!r} (known: {', '.join(CONTROLLERS)})")
            return out                    # every other check depends on which controller runs
        hpnlab = self.kind == "hpnlab"
        if self.tls_dir and not hpnlab:
            out.append("--controller-tls needs the hpnlab controller (it is the one listening with TLS)")
        elif self.tls_dir:
            out += _collect(lambda: tls_files(self.tls_dir or ""))
        if self.routing_weights not in ROUTING_WEIGHTS:
            out.append(f"unknown routing weights {self.routing_weights!r}: use ecmp or weighted")
        elif self.routing_weights != DEFAULT_WEIGHTS and not hpnlab:
            out.append(f"routing weights {self.routing_weights!r} need the hpnlab controller (it decides them)")
        out += _collect(lambda: check_arp_mode(self.arp, self.kind))
        if self.ecn_policy != STATIC_POLICY and not hpnlab:
            out.append(f"ECN policy {self.ecn_policy!r} needs the hpnlab controller (it runs the policy)")
        out += _collect(lambda: check_on_controller_loss(self.on_loss))
        if self.ofp_port is not None and not 1 <= self.ofp_port <= 65535:
            out.append(f"OpenFlow port must be 1-65535, got {self.ofp_port}")
        if self.telemetry_interval_ms < 0:
            out.append(f"telemetry interval must be >= 0 ms (0: off), got {self.telemetry_interval_ms}")
        for name in ("ready_timeout_s", "connect_timeout_s", "wiring_timeout_s"):
            if not getattr(self, name) > 0:
                out.append(f"controller {name} must be > 0 s, got {getattr(self, name):g}")
        if self.inactivity_probe_ms is not None and self.inactivity_probe_ms < 1:
            out.append(f"inactivity probe must be >= 1 ms (None: Open vSwitch's 5 s), got {self.inactivity_probe_ms}")
        return out


@dataclass(frozen=True)
class PortOptions:
    """The switch ports and links."""
    #: shape every sending interface to its emulated rate (htb)
    shape: bool = True
    #: the ECN marking stage on every switch egress port
    ecn: bool = True
    #: auto|system|afxdp|afxdp-nonpmd; None: $HPNLAB_PORT_TYPE, else auto (the one used: metadata["port_type"])
    port_type: str | None = None
    #: ovs-vswitchd's main thread during the run: nice (-20, the default: without it healthy paths stall
    #: whenever the machine is busy), rr (SCHED_RR: real-time throttling stalls it), deadline, or off
    ovs_sched: str = "nice"
    #: priority flow control and the shared switch buffer (``--pfc on|off``): True or False sets the
    #: scenario's ``emulation.lossless.pfc`` for the run; None: as the scenario says (docs/guides/lossless.md)
    pfc: bool | None = None

    def problems(self) -> list[str]:
        out = []
        if self.pfc is not None and not isinstance(self.pfc, bool):
            out.append(f"pfc must be on (true), off (false) or left to the scenario (null), got {short(self.pfc)}")
        if self.port_type is not None and self.port_type not in PORT_TYPE_CHOICES:
            out.append(f"--port-type must be one of {', '.join(PORT_TYPE_CHOICES)}, got {self.port_type!r}")
        if self.ovs_sched not in OVS_SCHED_MODES:
            out.append(f"ovs_sched must be one of {', '.join(OVS_SCHED_MODES)}, got {self.ovs_sched!r}")
        return out


@dataclass(frozen=True)
class FailoverOptions:
    """BFD on every switch-to-switch interface: min_rx = min_tx = ``bfd_ms`` (0: the scenario's ``bfd``
    block with its own intervals and multiplier, else off)."""
    bfd_ms: int = 0
    bfd_mult: int = BFD_MULT

    def problems(self) -> list[str]:
        if self.bfd_ms < 0 or not 1 <= self.bfd_mult <= 255:
            return [f"BFD interval must be >= 0 ms (0: off) and its multiplier 1-255, got {self.bfd_ms}, "
                    f"{self.bfd_mult}"]
        return []


@dataclass(frozen=True)
class SupervisionOptions:
    """The run: the machine-wide lock, and what must hold before the fabric is handed over."""
    #: seconds to wait for the machine-wide lock when another run holds it (0: refuse at once)
    lock_wait_s: float = 0.0
    #: every host-port pair on every plane must answer a ping
    verify: bool = True
    #: also every entropy branch of every pair (UDP probes)
    verify_branches: bool = False

    def problems(self) -> list[str]:
        return [] if self.lock_wait_s >= 0 else [f"lock wait must be >= 0 s, got {self.lock_wait_s:g}"]


@dataclass(frozen=True)
class ClusterOptions:
    """Mininet's cluster edition (``mininet.examples.cluster.MininetCluster``): the servers (empty: one
    machine, no cluster) and how switches are placed on them."""
    servers: tuple[str, ...] = ()
    placement: str = "plane"

    def problems(self) -> list[str]:
        if self.placement not in PLACEMENTS:
            return [f"unknown placement {self.placement!r} (known: {', '.join(PLACEMENTS)})"]
        return []


@dataclass(frozen=True)
class EmulationOptions:
    """Everything an emulation is asked to do besides the scenario (see the module docstring)."""
    controller: ControllerOptions = field(default_factory=ControllerOptions)
    ports: PortOptions = field(default_factory=PortOptions)
    failover: FailoverOptions = field(default_factory=FailoverOptions)
    supervision: SupervisionOptions = field(default_factory=SupervisionOptions)
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    rewire: Rewire = field(default_factory=Rewire)

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name, cls in GROUPS.items():
            group = getattr(self, name)
            if not isinstance(group, cls):
                problems.append(f"options.{name} must be {cls.__name__}, got {short(group)}")
            elif hasattr(group, "problems"):
                problems += group.problems()
        if problems:
            raise OptionsError(problems)

    def as_dict(self) -> dict[str, Any]:
        """The options as plain data (JSON-ready: tuples become lists)."""
        return {name: _plain(dataclasses.asdict(getattr(self, name))) for name in GROUPS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EmulationOptions:
        """Options from plain data (``as_dict``'s shape; a group or field left out keeps its default).
        An unknown group or field, or a value of the wrong kind, is a line of the OptionsError."""
        if not isinstance(data, Mapping):
            raise OptionsError([f"options must be a mapping of groups, got {short(data)}"])
        problems = [f"unknown options group {short(k)} (known: {', '.join(GROUPS)})" for k in data if k not in GROUPS]
        groups: dict[str, Any] = {}
        for name, group_cls in GROUPS.items():
            given = data.get(name, {})
            if not isinstance(given, Mapping):
                problems.append(f"options.{name} must be a mapping of fields, got {short(given)}")
                continue
            fields = {f.name: f for f in dataclasses.fields(group_cls)}
            problems += [f"unknown option {name}.{short(k)} (known: {', '.join(fields)})"
                         for k in given if k not in fields]
            kwargs = {}
            for key, value in given.items():
                if key in fields:
                    kwargs[key], problem = _typed(f"{name}.{key}", value, fields[key].default)
                    problems += [problem] if problem else []
            groups[name] = kwargs
        if problems:
            raise OptionsError(problems)
        return cls(**{name: GROUPS[name](**kwargs) for name, kwargs in groups.items()})


#: the groups by field name, in order (also ``as_dict``'s keys)
GROUPS: dict[str, type] = {"controller": ControllerOptions, "ports": PortOptions, "failover": FailoverOptions,
                           "supervision": SupervisionOptions, "cluster": ClusterOptions, "rewire": Rewire}


def _collect(check: Callable[[], object]) -> list[str]:
    """The one line a check raises (as a list), or none."""
    try:
        check()
    except UserError as exc:
        return [str(exc)]
    return []


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _typed(name: str, value: Any, default: Any) -> tuple[Any, str | None]:
    """``value`` in the kind its field's default has (a JSON list back to a tuple), or a problem line."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer()
        value = int(value) if ok else value
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, tuple):
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    else:              # an optional value (None by default), or Rewire's lists: the group checks it
        ok = True
        if isinstance(value, list):
            value = [_tuples(v) for v in value]
    if not ok:
        return value, f"option {name} must be like {default!r}, got {short(value)}"
    return value, None


def _tuples(value: Any) -> Any:
    """JSON's lists back to the tuples Rewire holds (a cable: a pair of nodes; a swap: a pair of cables)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
