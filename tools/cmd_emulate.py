"""`hpnlab emulate`: run a scenario as a live emulated fabric (root, real Open vSwitch)."""
from __future__ import annotations

import json
import sys
import time

from hpnlab.fabric import spec
from hpnlab.fabric.errors import UserError

from .argtypes import output_file


def register(sub) -> None:
    p = sub.add_parser("emulate", help="run a scenario on Mininet + Open vSwitch with the controller (root)")
    p.add_argument("scenario", metavar="SCENARIO", help="preset name, fat-tree-K, or a YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a scenario field (repeatable), e.g. --set emulation.host_mbps=5")
    p.add_argument("--controller", default="hpnlab", metavar="NAME",
                   help="hpnlab (default: the project's OpenFlow 1.3 controller) or none "
                        "(standalone switches; loop-free fabrics only)")
    p.add_argument("--policy", help="controller routing policy (aggregate or host-routes)")
    p.add_argument("--ofp-port", type=int, help="OpenFlow port (default 6653, or a free one if it is taken)")
    p.add_argument("--cli", action="store_true", help="drop into the Mininet CLI once the fabric is up")
    p.add_argument("--timeline", metavar="FILE", help="failure timeline (YAML/JSON) to run once up")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="keep the fabric up for S seconds (default: until the timeline ends, or until Ctrl-C)")
    p.add_argument("--no-ecn", action="store_true", help="no ECN marking stage on switch ports")
    p.add_argument("--no-verify", action="store_true", help="skip the all-pairs reachability check")
    p.add_argument("--verify-branches", action="store_true",
                   help="also send UDP probes on every entropy branch (source-port pattern) of every pair")
    p.add_argument("--json", metavar="FILE", type=output_file,
                   help="write the run's metadata and timeline records here")
    p.add_argument("--servers", metavar="LIST",
                   help="place the fabric across machines with Mininet's cluster edition (MininetCluster), "
                        "e.g. localhost,node2,node3 (ssh as root without a password to each)")
    p.add_argument("--placement", default="plane", choices=("plane", "switch-bin", "round-robin", "random"),
                   help="cluster placement: plane (each plane's switches on one server, default), or Mininet's")
    p.add_argument("--controller-ip", default="127.0.0.1",
                   help="address the controller listens on and switches dial (a routable one with --servers)")
    p.set_defaults(func=cmd_emulate)


def safe_cli(net) -> None:
    """Mininet's CLI, without the commands that kill processes machine-wide by name."""
    from mininet.cli import CLI
    from mininet.log import setLogLevel

    class SafeCLI(CLI):
        def _refuse(self, _line):
            print("disabled in hpnlab: Mininet's iperf kills every iperf process on the machine by name; "
                  "use e.g. 'h2 iperf3 -s -1 &' then 'h1 iperf3 -c <h2 address>'")

        do_iperf = _refuse
        do_iperfudp = _refuse

    setLogLevel("output")   # the CLI prints node output at this level
    try:
        SafeCLI(net)
    finally:
        setLogLevel("error")


def cmd_emulate(args) -> int:
    from hpnlab.fabric.emulation import CONTROLLERS, Emulation, EmulationError
    from hpnlab.fabric.emulation import timeline as tl

    if args.controller not in CONTROLLERS:
        raise UserError(f"unknown controller {args.controller!r} (known: {', '.join(CONTROLLERS)})")
    overrides = spec.parse_overrides(args.overrides)
    emu = Emulation(args.scenario, overrides=overrides, controller=args.controller, ofp_port=args.ofp_port,
                    policy=args.policy, ecn=not args.no_ecn, verify=not args.no_verify,
                    verify_branches=args.verify_branches,
                    servers=args.servers.split(",") if args.servers else None, placement=args.placement,
                    controller_ip=args.controller_ip)
    events = tl.load(args.timeline, emu.graph) if args.timeline else None
    say = lambda m: print(m, flush=True)  # noqa: E731
    say(f"emulating {emu.scenario.name}: {len(emu.hosts)} hosts, "
        f"{emu.graph.number_of_nodes() - len(emu.hosts)} switches, {emu.graph.number_of_edges()} links")
    records = []
    try:
        with emu:
            md = emu.metadata
            say(f"up in {emu.timings['up_s']:.1f} s (run {md['run_id']}): datapath {md['datapath']}, "
                f"shaping {md['shaping']}, ECN {md['ecn']}, delay {md['delay']}, "
                f"controller {args.controller}" + (f" on 127.0.0.1:{emu.ofp_port}" if emu.ofp_port else ""))
            if "reachability" in md:
                say(f"reachability: {md['reachability']['pairs']} host-port pairs, "
                    f"{md['reachability']['failed']} failed")
            if events:
                records = emu.run_timeline(events, log=say)
            if args.cli:
                say("Mininet CLI: 'h1 ping -c1 10.1.0.5', 'h1 iperf3 ...', 'links', 'exit'; "
                    "iperf/iperfudp are disabled (they kill processes by name machine-wide)")
                safe_cli(emu.net)
            elif args.duration:
                say(f"holding the fabric up for {args.duration:g} s (Ctrl-C to stop)")
                time.sleep(args.duration)
            elif not events:
                say("fabric is up; Ctrl-C (or SIGTERM) stops it and removes everything")
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    say("stopping")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"metadata": md, "timings": emu.timings, "timeline": records}, f, indent=1,
                              default=str)
        say(f"stopped; removed {emu.metadata.get('removed', {})}")
    except EmulationError as exc:
        print(f"hpnlab: emulation failed: {exc}", file=sys.stderr)
        return 1
    return 0
