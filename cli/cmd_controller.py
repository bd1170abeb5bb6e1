"""`hpnlab controller`: run the OpenFlow 1.3 controller, or show what it would install.

    hpnlab controller SCENARIO [--set k=v ...] [--ofp-port 6653] [--listen 127.0.0.1]
                      [--policy aggregate|host-routes] [--metrics-port N]
        runs the os-ken app in this process (the same as `python -m hpnlab.controller ...`);
        prints a line containing "ready" once switches can connect.
    hpnlab controller --config FILE.yaml [flags...]
        the same, settings from FILE (keys: the flags' names; flags given win), see controller/config.py
    hpnlab controller SCENARIO --dry-run [--json] [--dry-run-timeout S]
        connects, reads every switch's flows and groups and prints what it would add, modify and
        delete per switch; changes nothing; exits once every switch has answered (1 on timeout).
    hpnlab controller SCENARIO --show SWITCH [--fail A-B ...] [--policy ...]
        prints the flows the compiler gives SWITCH (with links A-B failed), no switch needed.
"""
from __future__ import annotations

import os
import sys

from hpnlab.fabric.errors import UserError


def register(sub) -> None:
    from hpnlab.controller import config
    from hpnlab.controller.__main__ import build_parser

    p = sub.add_parser("controller", help="run the OpenFlow 1.3 controller (os-ken) or show its compiled flows",
                       description=__doc__.split("\n\n", 1)[0])
    build_parser(p)
    p.add_argument("--show", metavar="SWITCH", help="print SWITCH's compiled flows and exit (no controller started)")
    p.add_argument("--fail", action="append", default=[], metavar="A-B",
                   help="with --show: treat the link(s) between switches/hosts A and B as failed (repeatable)")
    p.set_defaults(func=cmd_controller)
    config.record_given(p)      # which flags the command line gave: they win over --config's


def _show(args) -> int:
    from hpnlab.fabric.routing import compiler
    from hpnlab.fabric.scenario import arguments, graph

    g = graph.build(arguments.load(args, dest="set"))
    if args.show not in g or g.nodes[args.show]["tier"] == 0:
        raise UserError(f"no switch {args.show!r} in {g.graph['scenario'].name} "
                        f"(switches look like {', '.join(graph.switches(g)[:3])})")
    links = []
    for item in args.fail:
        a, sep, b = item.partition("-")
        if not sep or a not in g or b not in g or not g.has_edge(a, b):
            raise UserError(f"--fail {item!r}: no link between {a!r} and {b!r} (write it as NODE-NODE)")
        links += [(a, b, k) for k in g[a][b]]
    failures = compiler.Failures.of(links)
    states = compiler.compile_fabric(g, failures, args.policy)
    st = states.get(args.show)
    if st is None:
        print(f"{args.show}: failed (no state)")
        return 0
    healthy = compiler.compile_fabric(g, None, args.policy)
    print(f"# {args.show} dpid {st.dpid:016x}, policy {args.policy}: {st.flow_count} flows "
          f"({st.route_count} routes); {compiler.deaggregated(states, healthy)} de-aggregated "
          f"routes fabric-wide")
    for f in st.flows:
        print(compiler.describe_flow(f))
    return 0


def cmd_controller(args) -> int:
    from hpnlab.controller import config
    from hpnlab.controller.__main__ import build_parser

    flags = build_parser()                   # the controller's own flags (not --show, --fail)
    config.resolve(flags, args)
    if not args.scenario:
        raise UserError("no scenario: give SCENARIO (a preset name or a YAML file) or 'scenario:' in --config FILE")
    if args.show:
        return _show(args)
    if args.fail:
        raise UserError("--fail only goes with --show (a running controller learns failures from the switches)")
    # Run the launcher in a fresh interpreter (it must monkey-patch the standard library with
    # eventlet before anything else is imported): same pid, same output, same exit code. Every
    # controller flag given (on the command line or in --config) is passed on.
    argv = [sys.executable, "-m", "hpnlab.controller", *config.to_argv(flags, args)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return 0  # not reached
