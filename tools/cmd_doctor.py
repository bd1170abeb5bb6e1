"""`hpnlab doctor`: what this machine supports, what an emulation will do here, how to fix each gap."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("doctor", help="what this machine supports and what an emulation will do here")
    p.add_argument("scenario", nargs="?", metavar="SCENARIO",
                   help="also estimate whether this scenario fits this machine")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(func=cmd_doctor)


def findings(caps) -> list[tuple[str, str, str, str]]:
    """(status, item, what it means for an emulation, fix command) rows. status: ok|gap|FAIL."""
    from hpnlab.fabric.kernel import fix_for
    rows = []

    def row(ok: bool, item: str, meaning: str, fix_key: str, fatal: bool = False):
        rows.append(("ok" if ok else ("FAIL" if fatal else "gap"), item, meaning, "" if ok else fix_for(fix_key)))

    row(caps.root, "root", "emulation and clean need root" if not caps.root else "running as root", "root", True)
    row(caps.ovs_installed, f"Open vSwitch {caps.ovs_version or '(not installed)'}",
        "real OVS switches" if caps.ovs_installed else "no switches without OVS", "ovs_installed", True)
    row(caps.ovs_running, "OVS daemons", "ovsdb-server and ovs-vswitchd answer" if caps.ovs_running
        else "not running: emulation refuses to start", "ovs_running", True)
    row(caps.ovs_kernel_datapath, "OVS kernel datapath",
        "kernel datapath (fast)" if caps.ovs_kernel_datapath else
        "no openvswitch module: switches use the userspace datapath (datapath=user, ~43k packets/s on 2 cores)",
        "ovs_kernel_datapath")
    row(caps.ovs_userspace_tso or caps.ovs_kernel_datapath, "TCP offload",
        "userspace TSO on" if caps.ovs_userspace_tso else
        ("kernel datapath handles offloads" if caps.ovs_kernel_datapath else
         "hosts get 'ethtool -K tx off' so TCP checksums are right (~0.5 Gbit/s per flow ceiling)"),
        "ovs_running")
    if not (caps.ovs_userspace_tso or caps.ovs_kernel_datapath):
        rows[-1] = ("gap", rows[-1][1], rows[-1][2],
                    "ovs-vsctl set Open_vSwitch . other_config:userspace-tso-enable=true, then restart OVS "
                    "(hpnlab never restarts it for you)")
    row(caps.htb, "qdisc htb", "links shaped to their emulated rates" if caps.htb else "links cannot be shaped",
        "htb", True)
    row(caps.netem, "qdisc netem", "link delays emulated" if caps.netem else
        "no netem: link delays (long-haul 5 us/km) are NOT emulated; said once per run and in its metadata",
        "netem")
    row(caps.red, "qdisc red", "RED/ECN available" if caps.red else
        "no sch_red: ECN marking uses the eBPF virtual-queue marker instead", "red")
    ecn = caps.ecn_mechanism
    row(ecn is not None, "ECN marking stage", f"every switch egress port marks CE ({ecn})" if ecn else
        "no mechanism: switches will not mark ECN", "clang" if not caps.clang else "bpftool")
    row(caps.bpf and caps.tc_bpf and caps.qdiscs.get("clsact", False),
        "eBPF (syscall, BTF, cls_bpf, clsact)", "tc egress BPF programs load", "bpf")
    row(caps.clang, "clang", "compiles the ECN marker at run time", "clang")
    row(caps.bpftool, "bpftool", "loads and pins the ECN marker", "bpftool")
    row(bool(caps.os_ken), f"os-ken {caps.os_ken or ''}".strip(), "the controller runtime" if caps.os_ken else
        "no controller: only --controller none on loop-free fabrics", "os_ken")
    row(bool(caps.mininet) and caps.mnexec, f"Mininet {caps.mininet or ''}".strip(),
        "hosts in network namespaces", "mininet", True)
    import importlib.util
    missing = [m for m in ("networkx", "numpy", "yaml", "scapy", "pyroute2", "matplotlib")
               if importlib.util.find_spec(m) is None]
    rows.append(("ok" if not missing else "gap", "Python packages",
                 "networkx numpy PyYAML scapy pyroute2 matplotlib present" if not missing
                 else f"missing: {' '.join(missing)}", "" if not missing else "make venv"))
    row(caps.iperf3, "iperf3", "traffic checks in the demo", "iperf3")
    row(caps.ping, "ping", "reachability checks", "ping", True)
    row(caps.ethtool, "ethtool", "host offload settings", "ethtool")
    return rows


def cmd_doctor(args) -> int:
    from hpnlab.fabric import graph, kernel, sizing, spec

    caps = kernel.probe()
    rows = findings(caps)
    est = None
    if args.scenario:
        g = graph.build(spec.load(args.scenario, spec.parse_overrides(args.overrides)))
        est = sizing.estimate(g, caps.cpus)
    if args.json:
        print(json.dumps({"capabilities": caps.as_dict(),
                          "findings": [dict(zip(("status", "item", "meaning", "fix"), r, strict=True)) for r in rows],
                          "estimate": est}, indent=1))
        return 0
    print(f"machine: {caps.cpus} cores, {caps.mem_gib:g} GiB, kernel {caps.kernel}")
    width = max(len(r[1]) for r in rows)
    for status, item, meaning, fix in rows:
        print(f"  [{status:>4}] {item:<{width}}  {meaning}")
        if fix:
            print(f"         {'':<{width}}  fix: {fix}")
    print("an emulation here will: " + ", ".join([
        f"use the {caps.datapath} datapath",
        "shape links with htb" if caps.htb else "NOT shape links",
        "emulate link delay with netem" if caps.netem else "NOT emulate link delay",
        f"mark ECN with {caps.ecn_mechanism}" if caps.ecn_mechanism else "NOT mark ECN",
    ]))
    if est:
        verdict = "fits" if est["fits"] else "does NOT fit"
        print(f"{args.scenario}: {est['hosts']} hosts + {est['switches']} switches = {est['nodes']} nodes "
              f"(max {est['nodes_max']}), {est['links']} links, {est['pps_full_load_per_hop']} packets/s per hop "
              f"at full load (budget ~{est['pps_budget']}): {verdict} on this machine")
    fatal = [r for r in rows if r[0] == "FAIL"]
    return 1 if fatal else 0
