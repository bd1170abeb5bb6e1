"""`hpnlab switches`: simulated OpenFlow 1.3 switches of a scenario, connected to a controller over TCP.

    hpnlab switches SCENARIO [--set k=v] [--planes 0,1] [--pods 0-3] [--controller 127.0.0.1:6653]
                    [--flow-limit N] [--group-limit N] [--run-dir DIR]
        every switch (or the subset) connects to the controller and answers as a switch does; prints a line
        containing "ready" with the control socket; runs until interrupted (SIGINT/SIGTERM).
    hpnlab switches --run-dir DIR --send 'link down p0l0 p0s0'
        one command to a running instance: link down|up A B, switch down|up S, stats, dump OUTDIR.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

from hpnlab.cli.args import add_scenario_args, load_fabric
from hpnlab.fabric.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("switches", help="simulated OpenFlow 1.3 switches of a scenario, connected to a controller",
                       description=__doc__.split("\n\n", 1)[0])
    add_scenario_args(p, optional=True)
    p.add_argument("--planes", metavar="LIST", help="only these planes (e.g. 0 or 0,2-3)")
    p.add_argument("--pods", metavar="LIST", help="only these pods")
    p.add_argument("--controller", default="127.0.0.1:6653", metavar="HOST:PORT",
                   help="the controller's OpenFlow address (default 127.0.0.1:6653)")
    p.add_argument("--flow-limit", type=int, default=100_000, metavar="N",
                   help="flow entries per switch before a FlowMod is refused with table full (default 100000)")
    p.add_argument("--group-limit", type=int, default=65_536, metavar="N",
                   help="groups per switch before a GroupMod is refused (default 65536)")
    p.add_argument("--run-dir", metavar="DIR", help="where the control socket goes (default: a new temporary "
                                                    "directory, removed at exit)")
    p.add_argument("--send", metavar="COMMAND", help="send COMMAND to the instance running with --run-dir and "
                                                     "print its answer")
    p.set_defaults(func=cmd_switches)


def _controller(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--controller {text!r}: give HOST:PORT, e.g. 127.0.0.1:6653")
    return host, int(port)


def cmd_switches(args) -> int:
    from hpnlab.fabric.switches import endpoint, server

    if args.send:
        if not args.run_dir:
            raise UserError("--send needs --run-dir DIR (the running instance's)")
        answer = server.send(Path(args.run_dir) / "control.sock", args.send)
        print(answer)
        return 1 if answer.startswith("error") else 0
    if not getattr(args, "scenario", None):
        raise UserError("no scenario: give SCENARIO (a preset name or a YAML file)")
    controller = _controller(args.controller)
    if args.flow_limit < 1 or args.group_limit < 1:
        raise UserError("--flow-limit and --group-limit must be at least 1")
    _scenario, g = load_fabric(args)
    planes = endpoint.parse_numbers(args.planes, "planes") if args.planes else None
    pods = endpoint.parse_numbers(args.pods, "pods") if args.pods else None
    names = endpoint.select(g, planes, pods)
    fabric = endpoint.Fabric.of(g, names, args.flow_limit, args.group_limit)
    own_dir = args.run_dir is None
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="hpnlab-switches-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "control.sock").exists():
        try:
            server.send(run_dir / "control.sock", "", timeout_s=2)
        except UserError:
            (run_dir / "control.sock").unlink()       # a dead instance's socket
        else:
            raise UserError(f"another 'hpnlab switches' runs with --run-dir {run_dir}: stop it or choose another")
    pid_file = run_dir / "switches.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    srv = server.Server(fabric, controller, run_dir)

    def ready() -> None:
        print(f"hpnlab switches ready: {len(names)} switches of {g.graph['scenario'].name} connecting to "
              f"{controller[0]}:{controller[1]}; control socket {srv.control_path} (pid {os.getpid()})", flush=True)

    try:
        asyncio.run(srv.serve(ready))
    finally:
        pid_file.unlink(missing_ok=True)
        if own_dir:
            import shutil
            shutil.rmtree(run_dir, ignore_errors=True)
    return 0
