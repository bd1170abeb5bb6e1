"""The controller's configuration: one frozen dataclass (:class:`ControllerConfig`), grouped by concern,
with every default written once, here (Faucet's typed ``Conf``).

Built once by the launcher, whichever way the controller is started (``python -m hpnlab.controller
SCENARIO [flags]``, ``hpnlab controller ...``, ``--config FILE.yaml``), through the same checks: the
flags and the file's keys are converted by one parser (:func:`build_parser`, whose defaults are the
dataclasses' own), then :func:`from_namespace` (the settings' rules, pure) and :func:`check` (what the
settings name: the scenario, the ECN policy, the deployment file, the TLS files, the output folders).
A mistake is one line (UserError; the launcher exits 2).

Written once to the run directory as ``controller.yaml`` (:func:`write`: every key with its value, the
keys of a ``--config`` file, so the file starts the same controller again) and read once by the os-ken
app, from the path the launcher hands it (``HpnController(hpnlab_config=PATH)``, :func:`read`).

Sections (a key of the file, as its flag, in brackets):

================  =============================================================================
``openflow``      where switches connect: ``listen``, ``ofp_port``, TLS (``tls: {key, cert, ca}``)
``metrics``       Prometheus and ``/health`` (``metrics_port``; on ``listen``)
``routing``       ``policy``, ``arp``, fast failover (``no_fast_failover``), ``routing_weights``
``ecn``           ``ecn_policy``, ``ecn_actuator``, ``telemetry_interval_ms``, ``telemetry_out``
``wiring``        ``on_miswire``, ``wiring_out``, ``discovery_s``, ``deployment``, ``deployment_out``
``rollout``       ``rollout``, ``rollout_out``, ``rollout_probe``
``dry_run``       ``dry_run``, ``dry_run_timeout``, ``json``
``log``           ``log_format``, ``verbose``
================  =============================================================================
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpnlab.controller.reconcile import CONFIRM_TIMEOUT_S, READS_AT_ONCE
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing import telemetry
from hpnlab.fabric.routing.compiler import (
    ARP_MODES,
    DEFAULT_ARP,
    DEFAULT_FAST_FAILOVER,
    DEFAULT_POLICY,
    ROUTING_POLICIES,
)
from hpnlab.fabric.routing.weights import DEFAULT_MODE as DEFAULT_WEIGHTS
from hpnlab.fabric.routing.weights import MODES as WEIGHTS_MODES
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.scenario.arguments import add_scenario_args
from hpnlab.fabric.workload import ecn as ecn_settings

from . import actuators, config, deployment, ecn_policy, logs, rollout, tls, wiring
from .tls import TlsFiles

#: the configuration's file in the run directory (``write``, ``read``)
FILE_NAME = "controller.yaml"
ON_MISWIRE = (*wiring.MODES, "off")


@dataclass(frozen=True)
class OpenFlow:
    """Where switches connect."""
    listen: str = "127.0.0.1"
    port: int = 6653
    tls: TlsFiles | None = None          # key, certificate, CA: all three or none


@dataclass(frozen=True)
class Metrics:
    """Prometheus metrics and ``/health`` on ``listen`` (None: ``openflow.listen``) (port 0: none served)."""
    port: int = 0
    listen: str | None = None


@dataclass(frozen=True)
class Routing:
    """What the compiler is asked for."""
    policy: str = DEFAULT_POLICY              # compiler.ROUTING_POLICIES
    arp: str = DEFAULT_ARP                    # compiler.ARP_MODES
    fast_failover: bool = DEFAULT_FAST_FAILOVER  # False: the controller-only baseline (--no-fast-failover)
    weights: str = DEFAULT_WEIGHTS            # fabric/routing/weights.py MODES
    weights_control: str | None = None        # the harness's file of live weights-mode changes
    confirm_timeout_s: float = CONFIRM_TIMEOUT_S  # a barrier or read-back unanswered this long: the switch is read back
    reads_at_once: int = READS_AT_ONCE           # switches read back at once (the others wait their turn)


@dataclass(frozen=True)
class Ecn:
    """Telemetry and the dynamic-ECN loop (controller/ecn_loop.py)."""
    policy: str = ecn_settings.STATIC_POLICY  # static, dynamic, MODULE:CLASS, FILE.py[:CLASS]
    actuator: str = "auto"                    # auto, emulated, file:PATH, none
    telemetry_interval_ms: float = float(telemetry.DEFAULT_INTERVAL_MS)  # 0: no telemetry
    telemetry_out: str | None = None          # the telemetry file (JSON lines)
    control: str | None = None                # the harness's file of live policy changes
    stage_run: str | None = None              # the emulation run whose ECN stage to use (None: the live one)


@dataclass(frozen=True)
class Wiring:
    """LLDP discovery, the wiring check and the deployment (controller/wiring.py, deployment.py)."""
    on_miswire: str = "refuse"                # refuse, planes, off (no LLDP)
    out: str | None = None                    # the wiring report (JSON)
    discovery_s: float = 3.0
    deployment: str | None = None             # a deployment file, or "auto"
    deployment_out: str = "deployment-discovered.yaml"


@dataclass(frozen=True)
class Rollout:
    """The staged rollout (controller/rollout.py)."""
    mode: str = "all"                         # all, staged
    out: str | None = None
    probe: str = "hosts"                      # rollout.PROBE_MODES


@dataclass(frozen=True)
class DryRun:
    """Read every switch back, change nothing, print the difference (controller/dryrun.py)."""
    enabled: bool = False
    timeout_s: float = 30.0
    json: bool = False


@dataclass(frozen=True)
class Log:
    format: str = "auto"                      # logs.FORMATS
    verbose: bool = False


@dataclass(frozen=True)
class ControllerConfig:
    """Everything the controller is told, built once (``from_namespace``)."""
    scenario: str                             # a preset name or a scenario YAML file
    overrides: tuple[str, ...] = ()           # ``--set`` items, "field=value"
    openflow: OpenFlow = field(default_factory=OpenFlow)
    metrics: Metrics = field(default_factory=Metrics)
    routing: Routing = field(default_factory=Routing)
    ecn: Ecn = field(default_factory=Ecn)
    wiring: Wiring = field(default_factory=Wiring)
    rollout: Rollout = field(default_factory=Rollout)
    dry_run: DryRun = field(default_factory=DryRun)
    log: Log = field(default_factory=Log)
    run_dir: str | None = None                # where ``write`` puts the file (None: a temporary one)

    def load_scenario(self) -> spec.Scenario:
        return spec.load(self.scenario, spec.parse_overrides(list(self.overrides)))

    @property
    def telemetry(self) -> bool:
        return self.ecn.telemetry_interval_ms > 0


# ---- the flags (and the config file's keys: their dests) -------------------------------------------

def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The controller's flags; their dests are the config file's keys, their defaults the dataclasses'."""
    p = parser or argparse.ArgumentParser(prog="python -m hpnlab.controller",
                                          description="hpnlab's OpenFlow 1.3 controller (os-ken).")
    add_scenario_args(p, optional=True, dest="set",
                      help="preset name (mini-hpn, fat-tree-4, ...) or scenario YAML file (or 'scenario:' in --config)")
    p.add_argument("--config", metavar="FILE.yaml",
                   help="settings file: its keys are these flags' names (ofp_port, metrics_port, tls: {key, cert, "
                        "ca}, set: {field: value}, ...); flags given here win over it (controller/config.py)")
    p.add_argument("--ofp-port", type=int, default=OpenFlow.port, help=f"OpenFlow TCP port (default {OpenFlow.port})")
    p.add_argument("--listen", default=OpenFlow.listen, help=f"address to listen on (default {OpenFlow.listen})")
    p.add_argument("--policy", choices=ROUTING_POLICIES, default=Routing.policy,
                   help="routing policy: aggregate (per-leaf/pod/plane prefixes) or host-routes (baseline)")
    p.add_argument("--arp", choices=ARP_MODES, default=Routing.arp,
                   help=f"how leaves answer ARP while the controller is away (default {Routing.arp}): gateway (one "
                        "gateway MAC for every address, two flows per host port at any size; needs the move action "
                        "Open vSwitch has) or per-host (each peer's own MAC, set-field only, any OpenFlow 1.3 switch; "
                        "at most 4,096 flows per leaf, beyond that the controller answers)")
    p.add_argument("--no-fast-failover", action="store_true", default=not Routing.fast_failover,
                   help="no local protection: fast-failover groups keep only their primary bucket, so a switch "
                        "next to a failure drops until the controller reroutes (the controller-only baseline)")
    p.add_argument("--metrics-port", type=int, default=Metrics.port,
                   help="serve Prometheus metrics on LISTEN:N/metrics (0: off)")
    p.add_argument("--metrics-listen", default=Metrics.listen, metavar="ADDR",
                   help="the address metrics are served on (default: --listen's)")
    p.add_argument("--ecn-policy", default=Ecn.policy, metavar="NAME",
                   help=f"dynamic-ECN policy: static (default {Ecn.policy}; static: thresholds never change), "
                        "dynamic (per-port rules after ACC), or your own as MODULE:CLASS or FILE.py[:CLASS] (see "
                        "controller/ecn_policy.py)")
    p.add_argument("--telemetry-interval-ms", type=float, default=Ecn.telemetry_interval_ms, metavar="N",
                   help=f"poll port statistics and the ECN stage every N ms (default {Ecn.telemetry_interval_ms:g}; "
                        "0: no telemetry)")
    p.add_argument("--telemetry-out", metavar="FILE",
                   help="write telemetry samples and every threshold change (JSON lines) to FILE")
    p.add_argument("--ecn-actuator", default=Ecn.actuator, metavar="KIND",
                   help="where thresholds go: emulated (the emulation's ECN stage), file:PATH (a per-port settings "
                        "file for real switches), none (dry run), auto (emulated once a stage exists; default "
                        f"{Ecn.actuator})")
    p.add_argument("--routing-weights", choices=WEIGHTS_MODES, default=Routing.weights,
                   help=f"multipath weights (default {Routing.weights}): ecmp (every uplink of a set gets an equal "
                        "share of its entropy patterns) or weighted (every telemetry interval, loaded uplinks give "
                        "patterns to less loaded ones; fabric/routing/weights.py; needs telemetry)")
    p.add_argument("--weights-control", metavar="FILE", help=argparse.SUPPRESS)   # the harness's: live mode changes
    p.add_argument("--ecn-control", metavar="FILE", help=argparse.SUPPRESS)   # the harness's: live policy changes
    p.add_argument("--ecn-stage-run", metavar="RUN_ID", help=argparse.SUPPRESS)   # the harness's: its run's stage
    p.add_argument("--on-miswire", choices=ON_MISWIRE, default=Wiring.on_miswire,
                   help=f"what a miswiring found by LLDP stops (default {Wiring.on_miswire}): refuse (nothing a "
                        "miswiring would break is installed; miswired and missing cables are routed around), planes "
                        "(only the planes that check out are installed) or off (no LLDP: every switch is installed "
                        "as it connects)")
    p.add_argument("--wiring-out", metavar="FILE", help="write the wiring report (JSON) to FILE")
    p.add_argument("--deployment", metavar="FILE|auto",
                   help="deployment file mapping the scenario's switches to real dpids and port numbers or names "
                        "(controller/deployment.py); auto: adopt the map LLDP discovers once discovery settles, "
                        "install on it and write it to --deployment-out")
    p.add_argument("--rollout", choices=rollout.MODES, default=Rollout.mode,
                   help=f"all (default {Rollout.mode}): every plane at once; staged: one plane at a time, each "
                        "verified by probes through the plane before the next, rolled back when a probe fails "
                        "(controller/rollout.py)")
    p.add_argument("--rollout-out", metavar="FILE", help="write the staged rollout's stages and results (JSON) to FILE")
    p.add_argument("--rollout-probe", choices=rollout.PROBE_MODES, default=Rollout.probe,
                   help=f"where a stage's probes end (default {Rollout.probe}): hosts (a TCP SYN to each destination "
                        "host, whose answer comes back through the plane: host to host) or leaves (UDP caught where "
                        "it enters the destination leaf, before its last hop)")
    p.add_argument("--deployment-out", metavar="FILE", default=Wiring.deployment_out,
                   help=f"where --deployment auto writes the discovered map (default {Wiring.deployment_out})")
    p.add_argument("--confirm-timeout-s", type=float, default=Routing.confirm_timeout_s, metavar="S",
                   help="a switch that owes an answer (barrier, read-back) and has been silent for S seconds is "
                        "read back again; doubled per switch after each of its timeouts, and 10 times longer "
                        f"while the controller is busy (default {Routing.confirm_timeout_s:g})")
    p.add_argument("--reads-at-once", type=int, default=Routing.reads_at_once, metavar="N",
                   help="read back at most N switches' tables at once (at a start, a restart, a resynchronisation); "
                        "the others wait their turn, their confirmation timeouts not yet running "
                        f"(default {Routing.reads_at_once})")
    p.add_argument("--discovery-s", type=float, default=Wiring.discovery_s, metavar="S",
                   help="LLDP discovery: decide the wiring once nothing new (switch, port, link) was learnt for S "
                        "seconds, or as soon as every expected link was heard as planned "
                        f"(default {Wiring.discovery_s:g})")
    group = p.add_argument_group("OpenFlow over TLS (all three together; tools/scripts/make_test_ca.sh makes a "
                                 "test set)")
    group.add_argument("--ssl-key", metavar="FILE", help="the controller's private key (PEM)")
    group.add_argument("--ssl-cert", metavar="FILE", help="the controller's certificate (PEM)")
    group.add_argument("--ssl-ca", metavar="FILE",
                       help="CA certificate(s) (PEM): only switches presenting a certificate it signed may connect")
    p.add_argument("--dry-run", action="store_true", default=DryRun.enabled,
                   help="connect, read every switch's flows and groups, print what would be added, modified and "
                        "deleted per switch, change nothing, and exit once every switch has answered")
    p.add_argument("--dry-run-timeout", type=float, default=DryRun.timeout_s, metavar="S",
                   help="with --dry-run: give up after S seconds and name the switches that did not answer "
                        f"(default {DryRun.timeout_s:g}; exit code 1)")
    p.add_argument("--json", action="store_true", default=DryRun.json, help="with --dry-run: print the changes as JSON")
    p.add_argument("--run-dir", metavar="DIR",
                   help=f"write the controller's configuration, every setting with its value, to DIR/{FILE_NAME} (a "
                        "--config file that starts the same controller again); default: a temporary file, removed "
                        "once the app has read it")
    p.add_argument("-v", "--verbose", action="store_true", default=Log.verbose, help="debug logging")
    p.add_argument("--log-format", choices=logs.FORMATS, default=Log.format,
                   help="text (time, level, logger; on stderr) or journal (one line per event on stdout, led by its "
                        "syslog priority, <6>...: what journald stores as the entry's priority); auto (default): "
                        "journal when systemd connects the output to the journal ($JOURNAL_STREAM), else text")
    return p


# ---- flags -> the dataclass (the settings' rules, pure) ------------------------------------------

def _path(value: str | None) -> str | None:
    """A file named on the command line or in a config file, absolute (the app may run elsewhere)."""
    return str(Path(value).resolve()) if value else None


def _port(value: int, flag: str) -> int:
    if not 0 < value < 65536:
        raise UserError(f"{flag} {value} is not a TCP port number (1-65535)")
    return value


def from_namespace(args: argparse.Namespace) -> ControllerConfig:
    """The configuration of a parsed command line (``--config`` applied: ``config.resolve``); UserError,
    one line, for settings that do not go together or are out of range. Files are not read (``check``)."""
    if not args.scenario:
        raise UserError("no scenario: give SCENARIO (a preset name or a YAML file) or 'scenario:' in --config FILE")
    telemetry_ms = args.telemetry_interval_ms
    if telemetry_ms < 0:
        raise UserError(f"--telemetry-interval-ms must be >= 0 (0: off), got {telemetry_ms:g}")
    if args.ecn_policy != ecn_settings.STATIC_POLICY and telemetry_ms == 0:
        raise UserError(f"--ecn-policy {args.ecn_policy} needs telemetry: --telemetry-interval-ms must be > 0")
    if args.routing_weights == "weighted" and telemetry_ms == 0:
        raise UserError("--routing-weights weighted needs telemetry: --telemetry-interval-ms must be > 0")
    actuators.check_spec(args.ecn_actuator)
    if args.deployment == "auto" and args.on_miswire == "off":
        raise UserError("--deployment auto needs LLDP discovery: not with --on-miswire off")
    if args.rollout == "staged" and args.on_miswire == "off":
        raise UserError("--rollout staged needs LLDP discovery: not with --on-miswire off")
    if args.confirm_timeout_s <= 0:
        raise UserError(f"--confirm-timeout-s must be > 0, got {args.confirm_timeout_s:g}")
    if args.reads_at_once < 1:
        raise UserError(f"--reads-at-once must be at least 1, got {args.reads_at_once}")
    if args.discovery_s < 0:
        raise UserError(f"--discovery-s must be >= 0, got {args.discovery_s:g}")
    if args.dry_run_timeout <= 0:
        raise UserError(f"--dry-run-timeout must be > 0 seconds, got {args.dry_run_timeout:g}")
    if args.json and not args.dry_run:
        raise UserError("--json only goes with --dry-run")
    _port(args.ofp_port, "ofp port")
    if args.metrics_port:
        if args.metrics_port == args.ofp_port and (args.metrics_listen or args.listen) == args.listen:
            raise UserError("--metrics-port must differ from --ofp-port")
        _port(args.metrics_port, "metrics port")
    return ControllerConfig(
        scenario=args.scenario, overrides=tuple(args.set or ()),
        openflow=OpenFlow(listen=args.listen, port=args.ofp_port, tls=tls.given(args.ssl_key, args.ssl_cert,
                                                                                args.ssl_ca)),
        metrics=Metrics(port=args.metrics_port, listen=args.metrics_listen or None),
        routing=Routing(policy=args.policy, arp=args.arp, fast_failover=not args.no_fast_failover,
                        weights=args.routing_weights, weights_control=args.weights_control or None,
                        confirm_timeout_s=float(args.confirm_timeout_s), reads_at_once=int(args.reads_at_once)),
        ecn=Ecn(policy=args.ecn_policy, actuator=args.ecn_actuator, telemetry_interval_ms=float(telemetry_ms),
                telemetry_out=_path(args.telemetry_out), control=args.ecn_control or None,
                stage_run=args.ecn_stage_run or None),
        wiring=Wiring(on_miswire=args.on_miswire, out=_path(args.wiring_out), discovery_s=float(args.discovery_s),
                      deployment="auto" if args.deployment == "auto" else _path(args.deployment),
                      deployment_out=str(_path(args.deployment_out))),
        rollout=Rollout(mode=args.rollout, out=_path(args.rollout_out), probe=args.rollout_probe),
        dry_run=DryRun(enabled=args.dry_run, timeout_s=float(args.dry_run_timeout), json=args.json),
        log=Log(format=args.log_format, verbose=args.verbose),
        run_dir=_path(args.run_dir))


def check(conf: ControllerConfig) -> spec.Scenario:
    """Everything the configuration names, read and checked before anything starts (one line for the
    first mistake): the scenario, the ECN policy, the deployment file, the TLS files, the folders the
    output files go to. Returns the scenario."""
    scenario = conf.load_scenario()
    g = graph.build(scenario)
    ecn_policy.load(conf.ecn.policy, scenario.emulation.mtu)
    if conf.wiring.deployment and conf.wiring.deployment != "auto":
        deployment.load(g, conf.wiring.deployment)              # every mistake, one line each
    for flag, out in (("--rollout-out", conf.rollout.out), ("--wiring-out", conf.wiring.out),
                      ("--telemetry-out", conf.ecn.telemetry_out)):
        if out and not Path(out).parent.is_dir():
            raise UserError(f"{flag} {out}: its directory does not exist")
    if conf.run_dir and not Path(conf.run_dir).is_dir():
        raise UserError(f"--run-dir {conf.run_dir}: no such directory")
    files = conf.openflow.tls
    if files is not None:
        tls.from_flags(files.key, files.cert, files.ca)
    return scenario


# ---- the file in the run directory -------------------------------------------------------------

def values(conf: ControllerConfig) -> dict[str, Any]:
    """The configuration as a config file's keys (the flags' dests), every one with its value."""
    o, r, e, w, ro, d = conf.openflow, conf.routing, conf.ecn, conf.wiring, conf.rollout, conf.dry_run
    out: dict[str, Any] = {
        "scenario": conf.scenario, "set": list(conf.overrides),
        "listen": o.listen, "ofp_port": o.port, "metrics_port": conf.metrics.port,
        "metrics_listen": conf.metrics.listen,
        "policy": r.policy, "arp": r.arp, "no_fast_failover": not r.fast_failover, "routing_weights": r.weights,
        "weights_control": r.weights_control, "confirm_timeout_s": r.confirm_timeout_s,
        "reads_at_once": r.reads_at_once,
        "ecn_policy": e.policy, "ecn_actuator": e.actuator, "telemetry_interval_ms": e.telemetry_interval_ms,
        "telemetry_out": e.telemetry_out, "ecn_control": e.control, "ecn_stage_run": e.stage_run,
        "on_miswire": w.on_miswire, "wiring_out": w.out, "discovery_s": w.discovery_s, "deployment": w.deployment,
        "deployment_out": w.deployment_out,
        "rollout": ro.mode, "rollout_out": ro.out, "rollout_probe": ro.probe,
        "dry_run": d.enabled, "dry_run_timeout": d.timeout_s, "json": d.json,
        "log_format": conf.log.format, "verbose": conf.log.verbose}
    if o.tls is not None:
        out["tls"] = {"key": o.tls.key, "cert": o.tls.cert, "ca": o.tls.ca}
    return out


def write(conf: ControllerConfig, directory: str | Path) -> Path:
    """``directory/controller.yaml``: the configuration as a config file (``values``)."""
    path = Path(directory) / FILE_NAME
    text = yaml.safe_dump(values(conf), sort_keys=False)
    path.write_text(f"# hpnlab controller configuration, every setting with its value (controller/conf.py);\n"
                    f"# `hpnlab controller --config {path}` starts the same controller again.\n{text}")
    return path


def read(path: str | Path) -> ControllerConfig:
    """The configuration in a file (``write``'s, or any ``--config`` file): converted and checked as the
    launcher converts and checks ``--config`` (one line for a mistake)."""
    parser = build_parser()
    args = parser.parse_args([])
    config.apply(parser, args, config.load(path, parser))
    return from_namespace(args)
