"""Launcher: ``python -m hpnlab.controller SCENARIO [flags]`` (``--help`` lists them; ``--config FILE.yaml``
takes them from a file, controller/config.py).

The flags (and the config file) become one configuration (controller/conf.py), checked before anything
starts (a mistake: one line, exit code 2), written once to the run directory (``--run-dir DIR``, else a
temporary one) as ``controller.yaml``, whose path the app is handed (it reads nothing else).

os-ken >= 4 has no manager script; this is the few lines it would run: parse the os-ken configuration,
monkey-patch with eventlet, load and instantiate the app, and print one line containing ``ready`` once
the OpenFlow port accepts connections.
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
import shutil
import socket
import sys
import tempfile
import time

from hpnlab.fabric.errors import UserError

from . import conf, config, dryrun, logs, tls
from .conf import build_parser


def _check_port(addr: str, port: int, what: str) -> None:
    """Nothing listens on addr:port yet (else one line naming the flag to change)."""
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
    """Start the controller the command line (``--config`` applied) asks for; its exit code."""
    cfg = conf.from_namespace(args)
    scenario = conf.check(cfg)          # everything the user gave, checked before starting anything
    listen, port = cfg.openflow.listen, cfg.openflow.port
    _check_port(listen, port, "ofp port")
    if cfg.metrics.port:
        _check_port(cfg.metrics.listen or listen, cfg.metrics.port, "metrics port")
    try:
        import os_ken  # noqa: F401
    except ImportError:
        raise UserError("os-ken is not installed: run 'make venv' (it installs the controller extra)") from None

    logs.configure(cfg.log.format, cfg.log.verbose)
    if not cfg.log.verbose:
        for noisy in ("os_ken.base.app_manager", "os_ken.controller.controller", "os_ken.lib.hub"):
            logging.getLogger(noisy).setLevel(logging.WARNING)

    from os_ken.lib import hub
    if hub.HUB_TYPE == "eventlet" and __name__ != "__main__":
        hub.patch(thread=True)
    from os_ken import cfg as os_ken_cfg
    from os_ken.base.app_manager import AppManager  # imports the controller: registers --ofp-*
    tls_files = cfg.openflow.tls
    os_ken_cfg.CONF(args=tls.os_ken_args(tls_files, listen, port), project="os_ken", default_config_files=[])
    if tls_files is not None:
        tls.green_server(hub)
        logging.getLogger("os_ken.lib.hub").addFilter(tls.HandshakeFilter())

    run_dir = cfg.run_dir or tempfile.mkdtemp(prefix="hpnlab-controller-")
    try:
        path = conf.write(cfg, run_dir)       # the configuration, once: the app reads it from there
        mgr = AppManager.get_instance()
        mgr.load_apps(["hpnlab.controller.app", "os_ken.controller.ofp_handler"])
        contexts = mgr.create_contexts()
        services = mgr.instantiate_apps(**contexts, hpnlab_config=str(path))
    finally:
        if cfg.run_dir is None:           # read: no file is left behind, however the process ends
            shutil.rmtree(run_dir, ignore_errors=True)

    def announce():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if tls_files is not None:     # a plain connection would be a failed handshake in the log
                if _listening(listen, port):
                    break
                hub.sleep(0.05)
                continue
            try:
                with socket.create_connection((listen, port), timeout=1):
                    break
            except OSError:
                hub.sleep(0.05)
        else:
            print("hpnlab controller: OpenFlow port never opened", file=sys.stderr, flush=True)
            return
        metrics = (f", metrics http://{cfg.metrics.listen or listen}:{cfg.metrics.port}/metrics"
                   if cfg.metrics.port else "")
        print(f"hpnlab controller ready{' (dry run)' if cfg.dry_run.enabled else ''}: {scenario.name}, policy "
              f"{cfg.routing.policy}, ECN policy {cfg.ecn.policy}, OpenFlow 1.3{' over TLS' if tls_files else ''} "
              f"on {listen}:{port}{metrics}", file=sys.stderr if cfg.dry_run.enabled else sys.stdout, flush=True)

    services.append(hub.spawn(announce))
    result = {"code": 0}
    if cfg.dry_run.enabled:
        app = next(a for a in mgr.applications.values() if hasattr(a, "dry_run_report"))
        services.append(hub.spawn(_dry_run_wait, app, cfg.dry_run, services, result))
    try:
        hub.joinall(services)
    except KeyboardInterrupt:
        pass
    finally:
        mgr.close()
    return result["code"]


def _dry_run_wait(app, dry: conf.DryRun, services: list, result: dict) -> None:
    """Until every switch has been read back (or the timeout), then print the dry run and stop."""
    import json

    from os_ken.lib import hub
    deadline = time.monotonic() + dry.timeout_s
    rep = None
    while rep is None and time.monotonic() < deadline:
        hub.sleep(0.1)
        rep = app.dry_run_report()
    if rep is None:
        rep = app.dry_run_report(final=True)
        result["code"] = 1
    print(json.dumps(rep, indent=1) if dry.json else dryrun.format_table(rep), flush=True)
    if rep["missing"]:
        print(f"hpnlab: dry run: no answer within {dry.timeout_s:g} s from {', '.join(rep['missing'])}",
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
