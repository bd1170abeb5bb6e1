"""Launcher: ``python -m hpnlab.controller SCENARIO [--set k=v ...] [--ofp-port 6653] [--listen 127.0.0.1]
[--policy aggregate|host-routes] [--arp gateway|per-host] [--metrics-port N]
[--ecn-policy static|dynamic|MODULE:CLASS|FILE.py] [--telemetry-interval-ms 200] [--telemetry-out FILE]
[--ecn-actuator auto|emulated|file:PATH|none] [--routing-weights ecmp|weighted]
[--on-miswire refuse|planes] [--wiring-out FILE] [--rollout all|staged] [--rollout-probe hosts|leaves]
[--dry-run [--json] [--dry-run-timeout S]]``.

os-ken >= 4 has no manager script; this is the few lines it would run: parse the
os-ken configuration, monkey-patch with eventlet, load and instantiate the app, and
print one line containing ``ready`` once the OpenFlow port accepts connections.
"""
from __future__ import annotations

import os

if __name__ == "__main__":
    # os-ken's default "native" hub cannot stop a connection's sender thread, so a switch
    # that disconnects is never reported (no DEAD_DISPATCHER event). The eventlet hub is
    # what Ryu always used; it must patch the standard library before anything else loads.
    os.environ.setdefault("OSKEN_HUB_TYPE", "eventlet")
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # eventlet's deprecation notice
            from os_ken.lib import hub as _hub
        _hub.patch(thread=True)
    except ImportError:   # reported as one line by run()
        pass

import argparse
import logging
import socket
import sys
import time
from pathlib import Path

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing.compiler import ARP_MODES, ROUTING_POLICIES

from . import config, logs, tls


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="python -m hpnlab.controller",
                                          description="hpnlab's OpenFlow 1.3 controller (os-ken).")
    p.add_argument("scenario", nargs="?", default=None,
                   help="preset name (mini-hpn, fat-tree-4, ...) or scenario YAML file (or 'scenario:' in --config)")
    p.add_argument("--config", metavar="FILE.yaml",
                   help="settings file: its keys are these flags' names (ofp_port, metrics_port, tls: {key, cert, "
                        "ca}, set: {field: value}, ...); flags given here win over it (controller/config.py)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field (repeatable)")
    p.add_argument("--ofp-port", type=int, default=6653, help="OpenFlow TCP port (default 6653)")
    p.add_argument("--listen", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--policy", choices=ROUTING_POLICIES, default="aggregate",
                   help="routing policy: aggregate (per-leaf/pod/plane prefixes) or host-routes (baseline)")
    p.add_argument("--arp", choices=ARP_MODES, default=None,
                   help="how leaves answer ARP while the controller is away (default: $HPNLAB_ARP, else gateway): "
                        "gateway (one gateway MAC for "
                        "every address, two flows per host port at any size; needs the move action Open vSwitch "
                        "has) or per-host (each peer's own MAC, set-field only, any OpenFlow 1.3 switch; at most "
                        "4,096 flows per leaf, beyond that the controller answers)")
    p.add_argument("--no-fast-failover", action="store_true",
                   help="no local protection: fast-failover groups keep only their primary bucket, so a switch "
                        "next to a failure drops until the controller reroutes (the controller-only baseline)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus metrics on LISTEN:N/metrics (0: off)")
    p.add_argument("--ecn-policy", default="static", metavar="NAME",
                   help="dynamic-ECN policy: static (default: thresholds never change), dynamic (per-port rules "
                        "after ACC), or your own as MODULE:CLASS or FILE.py[:CLASS] (see controller/ecn_policy.py)")
    p.add_argument("--telemetry-interval-ms", type=float, default=200.0, metavar="N",
                   help="poll port statistics and the ECN stage every N ms (default 200; 0: no telemetry)")
    p.add_argument("--telemetry-out", metavar="FILE",
                   help="write telemetry samples and every threshold change (JSON lines) to FILE")
    p.add_argument("--ecn-actuator", default="auto", metavar="KIND",
                   help="where thresholds go: emulated (the emulation's ECN stage), file:PATH (a per-port settings "
                        "file for real switches), none (dry run), auto (default: emulated once a stage exists)")
    p.add_argument("--routing-weights", choices=("ecmp", "weighted"), default="ecmp",
                   help="multipath weights: ecmp (default: every uplink of a set gets an equal share of its entropy "
                        "patterns) or weighted (every telemetry interval, loaded uplinks give patterns to less loaded "
                        "ones; fabric/routing/weights.py; needs telemetry)")
    p.add_argument("--weights-control", metavar="FILE", help=argparse.SUPPRESS)   # the harness's: live mode changes
    p.add_argument("--ecn-control", metavar="FILE", help=argparse.SUPPRESS)   # the harness's: live policy changes
    p.add_argument("--on-miswire", choices=("refuse", "planes", "off"), default="refuse",
                   help="what a miswiring found by LLDP stops: refuse (default: nothing a miswiring would break is "
                        "installed; miswired and missing cables are routed around), planes (only the planes "
                        "that check out are installed) or off (no LLDP: every switch is installed as it connects)")
    p.add_argument("--wiring-out", metavar="FILE", help="write the wiring report (JSON) to FILE")
    p.add_argument("--deployment", metavar="FILE|auto",
                   help="deployment file mapping the scenario's switches to real dpids and port numbers or names "
                        "(controller/deployment.py); auto: adopt the map LLDP discovers once discovery settles, "
                        "install on it and write it to --deployment-out (default: $HPNLAB_DEPLOYMENT)")
    p.add_argument("--rollout", choices=("all", "staged"), default="all",
                   help="all (default): every plane at once; staged: one plane at a time, each verified by probes "
                        "through the plane before the next, rolled back when a probe fails (controller/rollout.py)")
    p.add_argument("--rollout-out", metavar="FILE", help="write the staged rollout's stages and results (JSON) to FILE")
    p.add_argument("--rollout-probe", choices=("hosts", "leaves"), default=None,
                   help="where a stage's probes end (default: $HPNLAB_ROLLOUT_PROBE, else hosts): hosts (a TCP SYN "
                        "to each destination host, whose answer comes back through the plane: host to host) or "
                        "leaves (UDP caught where it enters the destination leaf, before its last hop)")
    p.add_argument("--deployment-out", metavar="FILE", default="deployment-discovered.yaml",
                   help="where --deployment auto writes the discovered map (default deployment-discovered.yaml)")
    p.add_argument("--discovery-s", type=float, default=3.0, metavar="S",
                   help="LLDP discovery: decide the wiring once nothing new (switch, port, link) was learnt for S "
                        "seconds, or as soon as every expected link was heard as planned (default 3)")
    group = p.add_argument_group("OpenFlow over TLS (all three together; tools/scripts/make_test_ca.sh makes a "
                                 "test set)")
    group.add_argument("--ssl-key", metavar="FILE", help="the controller's private key (PEM)")
    group.add_argument("--ssl-cert", metavar="FILE", help="the controller's certificate (PEM)")
    group.add_argument("--ssl-ca", metavar="FILE",
                     help="CA certificate(s) (PEM): only switches presenting a certificate it signed may connect")
    p.add_argument("--dry-run", action="store_true",
                   help="connect, read every switch's flows and groups, print what would be added, modified and "
                        "deleted per switch, change nothing, and exit once every switch has answered")
    p.add_argument("--dry-run-timeout", type=float, default=30.0, metavar="S",
                   help="with --dry-run: give up after S seconds and name the switches that did not answer "
                        "(default 30; exit code 1)")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the changes as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--log-format", choices=logs.FORMATS, default="auto",
                   help="text (time, level, logger; on stderr) or journal (one line per event on stdout, led by its "
                        "syslog priority, <6>...: what journald stores as the entry's priority); auto (default): "
                        "journal when systemd connects the output to the journal ($JOURNAL_STREAM), else text")
    return p


def _check_port(addr: str, port: int, what: str) -> None:
    if not 0 < port < 65536:
        raise UserError(f"{what} {port} is not a TCP port number (1-65535)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError as exc:
            raise UserError(f"cannot listen on {addr}:{port} for the {what} ({exc.strerror}): "
                            f"is another controller running? choose another port with --{what.replace(' ', '-')}"
                            ) from None


def _listening(addr: str, port: int) -> bool:
    """Something listens on addr:port (a bind there fails), found without connecting to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError:
            return True
    return False


def run(args: argparse.Namespace) -> int:
    from hpnlab.fabric.scenario import graph, spec

    if not args.scenario:
        raise UserError("no scenario: give SCENARIO (a preset name or a YAML file) or 'scenario:' in --config FILE")

    # Validate everything the user gave before starting anything (one-line errors).
    scenario = spec.load(args.scenario, spec.parse_overrides(args.set))
    graph.build(scenario)
    from . import actuators, ecn_policy
    ecn_policy.load(args.ecn_policy, scenario.emulation.mtu)       # a bad name or file: one line, now
    actuators.check_spec(args.ecn_actuator)
    if args.telemetry_interval_ms < 0:
        raise UserError(f"--telemetry-interval-ms must be >= 0 (0: off), got {args.telemetry_interval_ms:g}")
    if args.ecn_policy != "static" and args.telemetry_interval_ms == 0:
        raise UserError(f"--ecn-policy {args.ecn_policy} needs telemetry: --telemetry-interval-ms must be > 0")
    if args.routing_weights == "weighted" and args.telemetry_interval_ms == 0:
        raise UserError("--routing-weights weighted needs telemetry: --telemetry-interval-ms must be > 0")
    if args.deployment is None:
        args.deployment = os.environ.get("HPNLAB_DEPLOYMENT") or None
    if args.deployment and args.deployment != "auto":
        from . import deployment
        deployment.load(graph.build(scenario), args.deployment)      # every mistake, one line each, now
    if args.deployment == "auto" and args.on_miswire == "off":
        raise UserError("--deployment auto needs LLDP discovery: not with --on-miswire off")
    if args.rollout == "staged" and args.on_miswire == "off":
        raise UserError("--rollout staged needs LLDP discovery: not with --on-miswire off")
    if args.rollout_out and not Path(args.rollout_out).resolve().parent.is_dir():
        raise UserError(f"--rollout-out {args.rollout_out}: its directory does not exist")
    if args.discovery_s < 0:
        raise UserError(f"--discovery-s must be >= 0, got {args.discovery_s:g}")
    if args.wiring_out and not Path(args.wiring_out).resolve().parent.is_dir():
        raise UserError(f"--wiring-out {args.wiring_out}: its directory does not exist")
    if args.dry_run_timeout <= 0:
        raise UserError(f"--dry-run-timeout must be > 0 seconds, got {args.dry_run_timeout:g}")
    if args.json and not args.dry_run:
        raise UserError("--json only goes with --dry-run")
    if args.telemetry_out and not Path(args.telemetry_out).resolve().parent.is_dir():
        raise UserError(f"--telemetry-out {args.telemetry_out}: its directory does not exist")
    tls_files = tls.from_flags(args.ssl_key, args.ssl_cert, args.ssl_ca)
    _check_port(args.listen, args.ofp_port, "ofp port")
    if args.metrics_port:
        if args.metrics_port == args.ofp_port:
            raise UserError("--metrics-port must differ from --ofp-port")
        _check_port(args.listen, args.metrics_port, "metrics port")
    try:
        import os_ken  # noqa: F401
    except ImportError:
        raise UserError("os-ken is not installed: run 'make venv' (it installs the controller extra)") from None

    os.environ["HPNLAB_SCENARIO"] = args.scenario
    os.environ["HPNLAB_SET"] = "\n".join(args.set)
    os.environ["HPNLAB_POLICY"] = args.policy
    os.environ["HPNLAB_FAST_FAILOVER"] = "0" if args.no_fast_failover else "1"
    os.environ["HPNLAB_ARP"] = args.arp or os.environ.get("HPNLAB_ARP", "")     # a bad value: one line at app init
    os.environ["HPNLAB_METRICS_PORT"] = str(args.metrics_port)
    os.environ["HPNLAB_METRICS_ADDR"] = args.listen
    os.environ["HPNLAB_ECN_POLICY"] = args.ecn_policy
    os.environ["HPNLAB_TELEMETRY_MS"] = f"{args.telemetry_interval_ms:g}"
    os.environ["HPNLAB_TELEMETRY_OUT"] = str(Path(args.telemetry_out).resolve()) if args.telemetry_out else ""
    os.environ["HPNLAB_ECN_ACTUATOR"] = args.ecn_actuator
    os.environ["HPNLAB_ECN_CONTROL"] = args.ecn_control or ""
    os.environ["HPNLAB_ROUTING_WEIGHTS"] = args.routing_weights
    os.environ["HPNLAB_WEIGHTS_CONTROL"] = args.weights_control or ""
    os.environ["HPNLAB_ON_MISWIRE"] = args.on_miswire
    os.environ["HPNLAB_WIRING_OUT"] = str(Path(args.wiring_out).resolve()) if args.wiring_out else ""
    os.environ["HPNLAB_DISCOVERY_S"] = f"{args.discovery_s:g}"
    os.environ["HPNLAB_DEPLOYMENT"] = str(Path(args.deployment).resolve()) if args.deployment and \
        args.deployment != "auto" else (args.deployment or "")
    os.environ["HPNLAB_DEPLOYMENT_OUT"] = str(Path(args.deployment_out).resolve())
    os.environ["HPNLAB_ROLLOUT"] = args.rollout
    os.environ["HPNLAB_ROLLOUT_PROBE"] = args.rollout_probe or os.environ.get("HPNLAB_ROLLOUT_PROBE", "")
    os.environ["HPNLAB_ROLLOUT_OUT"] = str(Path(args.rollout_out).resolve()) if args.rollout_out else ""
    os.environ["HPNLAB_DRY_RUN"] = "1" if args.dry_run else ""

    logs.configure(args.log_format, args.verbose)
    if not args.verbose:
        for noisy in ("os_ken.base.app_manager", "os_ken.controller.controller", "os_ken.lib.hub"):
            logging.getLogger(noisy).setLevel(logging.WARNING)

    from os_ken.lib import hub
    if hub.HUB_TYPE == "eventlet" and __name__ != "__main__":
        hub.patch(thread=True)
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager  # imports the controller: registers --ofp-*
    cfg.CONF(args=tls.os_ken_args(tls_files, args.listen, args.ofp_port), project="os_ken", default_config_files=[])
    if tls_files is not None:
        tls.green_server(hub)
        logging.getLogger("os_ken.lib.hub").addFilter(tls.HandshakeFilter())

    mgr = AppManager.get_instance()
    mgr.load_apps(["hpnlab.controller.app", "os_ken.controller.ofp_handler"])
    contexts = mgr.create_contexts()
    services = mgr.instantiate_apps(**contexts)

    def announce():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if tls_files is not None:     # a plain connection would be a failed handshake in the log
                if _listening(args.listen, args.ofp_port):
                    break
                hub.sleep(0.05)
                continue
            try:
                with socket.create_connection((args.listen, args.ofp_port), timeout=1):
                    break
            except OSError:
                hub.sleep(0.05)
        else:
            print("hpnlab controller: OpenFlow port never opened", file=sys.stderr, flush=True)
            return
        metrics = f", metrics http://{args.listen}:{args.metrics_port}/metrics" if args.metrics_port else ""
        print(f"hpnlab controller ready{' (dry run)' if args.dry_run else ''}: {scenario.name}, policy "
              f"{args.policy}, ECN policy {args.ecn_policy}, OpenFlow 1.3{' over TLS' if tls_files else ''} on "
              f"{args.listen}:{args.ofp_port}{metrics}", file=sys.stderr if args.dry_run else sys.stdout, flush=True)

    services.append(hub.spawn(announce))
    result = {"code": 0}
    if args.dry_run:
        app = next(a for a in mgr.applications.values() if hasattr(a, "dry_run_report"))
        services.append(hub.spawn(_dry_run_wait, app, args, services, result))
    try:
        hub.joinall(services)
    except KeyboardInterrupt:
        pass
    finally:
        mgr.close()
    return result["code"]


def _dry_run_wait(app, args: argparse.Namespace, services: list, result: dict) -> None:
    """Until every switch has been read back (or the timeout), then print the dry run and stop."""
    import json

    from os_ken.lib import hub

    from . import dryrun
    deadline = time.monotonic() + args.dry_run_timeout
    rep = None
    while rep is None and time.monotonic() < deadline:
        hub.sleep(0.1)
        rep = app.dry_run_report()
    if rep is None:
        rep = app.dry_run_report(final=True)
        result["code"] = 1
    print(json.dumps(rep, indent=1) if args.json else dryrun.format_table(rep), flush=True)
    if rep["missing"]:
        print(f"hpnlab: dry run: no answer within {args.dry_run_timeout:g} s from {', '.join(rep['missing'])}",
              file=sys.stderr, flush=True)
    current = hub.getcurrent() if hasattr(hub, "getcurrent") else None
    for thread in services:
        if thread is not current:
            hub.kill(thread)


def main(argv: list[str] | None = None) -> int:
    parser = config.record_given(build_parser())
    args = parser.parse_args(argv)
    try:
        return run(config.resolve(parser, args))
    except UserError as exc:
        journal = logs.choose("auto", os.environ) == "journal"        # under systemd: an error-priority entry
        print(f"{'<3>' if journal else ''}hpnlab: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
