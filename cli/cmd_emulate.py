"""`hpnlab emulate`: run a scenario as a live emulated fabric (root, real Open vSwitch)."""
from __future__ import annotations

import json
import sys
import time

from hpnlab.cli.args import add_emulation_args, add_scenario_args, emulation_options, overrides_of
from hpnlab.cli.argtypes import output_file
from hpnlab.cli.cmd_web import add_web_args, metrics_line, open_web, web_controller_args
from hpnlab.fabric.emulation.options import PLACEMENTS as CLUSTER_PLACEMENTS
from hpnlab.fabric.emulation.ovs_sched import MODES as OVS_SCHED_MODES
from hpnlab.fabric.errors import UserError


def port_type_line(md: dict) -> str:
    pt = md.get("port_type") or {}
    return f"switch ports: {pt.get('type', 'system')} ({pt.get('why', '')})"


def register(sub) -> None:
    p = sub.add_parser("emulate", help="run a scenario on Mininet + Open vSwitch with the controller (root)")
    add_scenario_args(p)
    add_emulation_args(p, on_controller_loss="continue")
    p.add_argument("--ofp-port", type=int, help="OpenFlow port (default 6653, or a free one if it is taken)")
    p.add_argument("--cli", action="store_true", help="drop into the Mininet CLI once the fabric is up")
    p.add_argument("--timeline", metavar="FILE", help="failure timeline (YAML/JSON) to run once up")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="keep the fabric up for S seconds (default: until the timeline ends, or until Ctrl-C)")
    p.add_argument("--no-verify", action="store_true", help="skip the all-pairs reachability check")
    p.add_argument("--verify-branches", action="store_true",
                   help="also send UDP probes on every entropy branch (source-port pattern) of every pair")
    p.add_argument("--json", metavar="FILE", type=output_file,
                   help="write the run's metadata and timeline records here")
    p.add_argument("--bfd-mult", type=int, default=3, metavar="N", help="BFD detect multiplier (default 3)")
    p.add_argument("--ovs-sched", choices=OVS_SCHED_MODES, default="nice",
                   help="ovs-vswitchd's main thread during the run: nice (default: nice -20; on the userspace "
                        "datapath it forwards every packet, and on a busy machine its waits for the CPU stall "
                        "every flow), rr (SCHED_RR, as earlier releases: under traffic real-time throttling "
                        "takes its CPU away for tens of ms; README: failures), deadline (SCHED_DEADLINE, 0.9 ms "
                        "of every 1 ms) or off (left alone)")
    p.add_argument("--no-ovs-realtime", dest="ovs_sched", action="store_const", const="off",
                   help="the same as --ovs-sched off (its earlier name)")
    p.add_argument("--failover-probe", metavar="KINDS",
                   help="measure the loss window at a receiver: paced UDP flows (differing in source port) "
                        "through a leaf-spine link failure; comma list of both, one-side, gray, switch (a whole "
                        "switch down: --probe-switch), tc-idle, link-idle, none")
    p.add_argument("--repeat", type=int, default=5, metavar="N", help="failover probe repetitions per kind (default 5)")
    p.add_argument("--probe-link", metavar="LEAF-SPINE", help="the link the probe fails (default: the first leaf's "
                                                              "first uplink)")
    p.add_argument("--probe-switch", metavar="SWITCH",
                   help="the switch the 'switch' probe fails (default: the first core of plane 0, else its first "
                        "spine); the flows cross it (from another campus to a core's, from a spine's pod)")
    p.add_argument("--probe-flows", type=int, default=16, metavar="N", help="probe flows (default 16)")
    p.add_argument("--probe-pps", type=float, default=6000.0, metavar="P",
                   help="probe packets/s, all flows together (default 6000)")
    p.add_argument("--probe-hold", type=float, default=1.0, metavar="S",
                   help="seconds between failure and repair (default 1)")
    p.add_argument("--lock-wait", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds for another emulation on this machine to finish (default 0: say who "
                        "holds it and stop)")
    p.add_argument("--freeze-controller", action="store_true",
                   help="stop the controller (SIGSTOP) during each probe's failure: what the switches do alone")
    p.add_argument("--servers", metavar="LIST",
                   help="place the fabric across machines with Mininet's cluster edition (MininetCluster), "
                        "e.g. localhost,node2,node3 (ssh as root without a password to each)")
    p.add_argument("--placement", dest="cluster_placement", default="plane", choices=CLUSTER_PLACEMENTS,
                   help="cluster placement: plane (each plane's switches on one server, default), or Mininet's")
    p.add_argument("--controller-ip", default="127.0.0.1",
                   help="address the controller listens on and switches dial (a routable one with --servers)")
    add_web_args(p)
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
    from hpnlab.fabric.emulation import Emulation, EmulationError
    from hpnlab.fabric.emulation import timeline as tl
    from hpnlab.fabric.experiments.prepare import prepare

    web_args, metrics_port = web_controller_args(args)
    options = emulation_options(args, extra_args=web_args)     # every bad flag: one line, before anything is built
    prepared = prepare(args.scenario, overrides_of(args), size=False)
    probe = None
    if args.failover_probe:
        from hpnlab.fabric.emulation import failover
        kinds = [k.strip() for k in args.failover_probe.split(",") if k.strip()]
        link = tuple(args.probe_link.split("-")) if args.probe_link else None
        if link is not None and len(link) != 2:
            raise UserError(f"--probe-link must name a leaf and a spine like p0l0-p0s0, got {args.probe_link!r}")
        if args.repeat < 1:
            raise UserError("--repeat must be at least 1")
        probe = failover.Probe(link=link, switch=args.probe_switch, flows=args.probe_flows, pps=args.probe_pps,
                               hold_s=args.probe_hold, freeze_controller=args.freeze_controller)
        for k in kinds:
            failover.Probe(kind=k).check()
    from hpnlab.controller.ecn_policy import policy_class
    from hpnlab.fabric.experiments.runner import telemetry_of
    policy_class(args.ecn_policy)          # a wrong policy name: one line before anything is built
    emu = Emulation(prepared.scenario, options)
    events = tl.load(args.timeline, emu.graph) if args.timeline else None
    if probe is not None:
        failover.endpoints(emu.graph, probe.link)      # a wrong link or switch: one line before anything is built
        if "switch" in kinds:
            failover.switch_endpoints(emu.graph, probe.switch)
    say = lambda m: print(m, flush=True)  # noqa: E731
    say(f"emulating {emu.scenario.name}: {len(emu.hosts)} hosts, "
        f"{emu.graph.number_of_nodes() - len(emu.hosts)} switches, {emu.graph.number_of_edges()} links")
    records = []
    try:
        with emu, open_web(emu, args, metrics_port, say) as web:
            md = emu.metadata
            say(f"up in {emu.timings['up_s']:.1f} s (run {md['run_id']}): datapath {md['datapath']}, "
                f"shaping {md['shaping']}, ECN {md['ecn']}, delay {md['delay']}, "
                f"controller {args.controller}"
                + (f" on 127.0.0.1:{emu.controller.ofp_port}, ARP {md.get('arp')}" if emu.controller.ofp_port else ""))
            say(port_type_line(md))
            if metrics_line(web_args, metrics_port):
                say(str(metrics_line(web_args, metrics_port)))
            if "reachability" in md:
                say(f"reachability: {md['reachability']['pairs']} host-port pairs, "
                    f"{md['reachability']['failed']} failed")
            if emu.controller.telemetry_file is not None:
                say(f"telemetry every {args.telemetry_interval_ms} ms, ECN policy {args.ecn_policy}: "
                    f"{emu.controller.telemetry_file} (JSON lines; with --json, summarised into it)")
            if events:
                records = emu.faults.run_timeline(events, log=say)
            probed = None
            if probe is not None:
                probed = failover.run(emu, kinds, args.repeat, probe, log=say)
                for kind, s in probed["summary"].items():
                    say(failover.describe(kind, s))
            if args.cli:
                say("Mininet CLI: 'h1 ping -c1 10.1.0.5', 'h1 iperf3 ...', 'links', 'exit'; "
                    "iperf/iperfudp are disabled (they kill processes by name machine-wide)")
                safe_cli(emu.net)
            elif args.duration:
                say(f"holding the fabric up for {args.duration:g} s (Ctrl-C to stop)")
                time.sleep(args.duration)
            elif not events and probe is None:
                say("fabric is up; Ctrl-C (or SIGTERM) stops it and removes everything")
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    say("stopping")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"metadata": md, "timings": emu.timings,
                           "timeline": records + (web.records if web is not None else []),
                               "failover": probed, "telemetry": telemetry_of(emu, 0.0, float("inf"))},
                              f, indent=1, default=str)
        say(f"stopped; removed {emu.metadata.get('removed', {})}")
    except EmulationError as exc:
        print(f"hpnlab: emulation failed: {exc}", file=sys.stderr)
        return 1
    return 0
