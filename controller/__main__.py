"""Launcher: ``python -m hpnlab.controller SCENARIO [--set k=v ...] [--ofp-port 6653] [--listen 127.0.0.1]
[--policy aggregate|host-routes] [--metrics-port N]
[--ecn-policy static|dynamic|MODULE:CLASS|FILE.py] [--telemetry-interval-ms 200] [--telemetry-out FILE]
[--ecn-actuator auto|emulated|file:PATH|none] [--dry-run [--json] [--dry-run-timeout S]]``.

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

from .compiler import ROUTING_POLICIES


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="python -m hpnlab.controller",
                                          description="hpnlab's OpenFlow 1.3 controller (os-ken).")
    p.add_argument("scenario", help="preset name (mini-hpn, fat-tree-4, ...) or scenario YAML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field (repeatable)")
    p.add_argument("--ofp-port", type=int, default=6653, help="OpenFlow TCP port (default 6653)")
    p.add_argument("--listen", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--policy", choices=ROUTING_POLICIES, default="aggregate",
                   help="routing policy: aggregate (per-leaf/pod/plane prefixes) or host-routes (baseline)")
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
    p.add_argument("--ecn-control", metavar="FILE", help=argparse.SUPPRESS)   # the harness's: live policy changes
    p.add_argument("--dry-run", action="store_true",
                   help="connect, read every switch's flows and groups, print what would be added, modified and "
                        "deleted per switch, change nothing, and exit once every switch has answered")
    p.add_argument("--dry-run-timeout", type=float, default=30.0, metavar="S",
                   help="with --dry-run: give up after S seconds and name the switches that did not answer "
                        "(default 30; exit code 1)")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the changes as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
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


def run(args: argparse.Namespace) -> int:
    from hpnlab.fabric import graph, spec

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
    if args.dry_run_timeout <= 0:
        raise UserError(f"--dry-run-timeout must be > 0 seconds, got {args.dry_run_timeout:g}")
    if args.json and not args.dry_run:
        raise UserError("--json only goes with --dry-run")
    if args.telemetry_out and not Path(args.telemetry_out).resolve().parent.is_dir():
        raise UserError(f"--telemetry-out {args.telemetry_out}: its directory does not exist")
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
    os.environ["HPNLAB_METRICS_PORT"] = str(args.metrics_port)
    os.environ["HPNLAB_METRICS_ADDR"] = args.listen
    os.environ["HPNLAB_ECN_POLICY"] = args.ecn_policy
    os.environ["HPNLAB_TELEMETRY_MS"] = f"{args.telemetry_interval_ms:g}"
    os.environ["HPNLAB_TELEMETRY_OUT"] = str(Path(args.telemetry_out).resolve()) if args.telemetry_out else ""
    os.environ["HPNLAB_ECN_ACTUATOR"] = args.ecn_actuator
    os.environ["HPNLAB_ECN_CONTROL"] = args.ecn_control or ""
    os.environ["HPNLAB_DRY_RUN"] = "1" if args.dry_run else ""

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        for noisy in ("os_ken.base.app_manager", "os_ken.controller.controller", "os_ken.lib.hub"):
            logging.getLogger(noisy).setLevel(logging.WARNING)

    from os_ken.lib import hub
    if hub.HUB_TYPE == "eventlet" and __name__ != "__main__":
        hub.patch(thread=True)
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager  # imports the controller: registers --ofp-*
    cfg.CONF(args=["--ofp-tcp-listen-port", str(args.ofp_port), "--ofp-listen-host", args.listen],
             project="os_ken", default_config_files=[])

    mgr = AppManager.get_instance()
    mgr.load_apps(["hpnlab.controller.app", "os_ken.controller.ofp_handler"])
    contexts = mgr.create_contexts()
    services = mgr.instantiate_apps(**contexts)

    def announce():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
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
              f"{args.policy}, ECN policy {args.ecn_policy}, OpenFlow 1.3 on "
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
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        print(f"hpnlab: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
