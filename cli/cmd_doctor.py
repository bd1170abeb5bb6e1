"""`hpnlab doctor`: what this machine supports, what an emulation will do here, how to fix each gap."""
from __future__ import annotations

import json

from hpnlab.cli.args import add_scenario_args, load_scenario


def register(sub) -> None:
    p = sub.add_parser("doctor", help="what this machine supports and what an emulation will do here")
    add_scenario_args(p, optional=True, help="also estimate whether this scenario fits this machine")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--measure", action="store_true",
                   help="(re)measure this machine's budget first: packets/s per switch port type and frame size "
                        "(hpnlab.fabric.emulation.budget, ~2 min), then the rate up to which the collective "
                        "generators keep up (hpnlab.fabric.experiments.calibration, 2-5 min); root; cached for the "
                        "size check and the default rates")
    p.add_argument("--port-type", default=None, metavar="TYPE",
                   help="say what this port type (auto|system|afxdp|afxdp-nonpmd; default $HPNLAB_PORT_TYPE or "
                        "auto) means here")
    p.set_defaults(func=cmd_doctor)


def findings(caps) -> list[tuple[str, str, str, str]]:
    """(status, item, what it means for an emulation, fix command) rows. status: ok|gap|FAIL."""
    from hpnlab.fabric.emulation.kernel import fix_for
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
        "no openvswitch module: switches use the userspace datapath (datapath=user; its packet rate is the "
        "lab's ceiling: see 'switch ports' below)",
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


def port_type_findings(caps, budget, requested: str, mtu: int) -> list[str]:
    """What the port type choice is here and why, for a shaped run with ECN (the default) and for
    one without switch-port tc (--no-ecn and no shaping), with the measured ceilings (pure)."""
    from hpnlab.fabric.emulation import kernel, sizing
    frame = mtu + sizing.ETH
    measured = {t: sizing.pps_at(budget, t, frame) or 0.0 for t in caps.afxdp_types}
    refused = {t: f"it carried frames up to {top} B only" for t in caps.afxdp_types
               if (top := sizing.max_frame(budget, t)) is not None and top < frame}
    lines = [f"OVS interface types: {', '.join(caps.ovs_iface_types) or '(unknown)'}; AF_XDP socket: "
             f"{'yes' if caps.af_xdp else 'no'}"]
    needs_default = ["shaping"] + (["ECN marking"] if caps.ecn_mechanism else [])
    for what, needs in (("a default run (shaped, ECN)", needs_default), ("an unshaped run without ECN", [])):
        try:
            chosen, why, lost = kernel.choose_port_type(requested, caps.datapath, caps.afxdp_types, needs,
                                                        measured, refused)
        except Exception as exc:                       # a forced type that cannot work here
            lines.append(f"{what}: refused: {exc}")
            continue
        lines.append(f"{what}: {chosen} ({why})" + (f"; NOT emulated: {'; '.join(lost)}" if lost else ""))
    for pt in ["system", *caps.afxdp_types]:
        pps = sizing.pps_at(budget, pt, frame)
        if pps:
            lines.append(f"measured {pt}: {pps:,.0f} packets/s through a leaf-spine-leaf chain at {frame} B frames "
                         f"({pps * frame * 8 / 1e6:,.0f} Mbit/s)")
    if budget is None:
        lines.append(f"nothing measured yet ({sizing.budget_path()}): the budget is the constant "
                     f"{sizing.PPS_PER_CORE}/core; measure with: hpnlab doctor --measure")
    else:
        after = budget.get("load_after")
        lines.append(f"measured budget: {sizing.budget_path()} ({budget.get('measured_at', '?')}, load "
                     f"{' '.join(str(v) for v in budget.get('load', []))}"
                     + (f" before, {' '.join(str(v) for v in after)} after" if after else "") + ")"
                     + (": the short probe a first demo ran (the system port type at 4 KB frames, once); "
                        "hpnlab doctor --measure measures fully" if budget.get("probe") else ""))
        gen = sizing.generator_ceiling(budget.get("generators"))
        lines.append(f"generators: {gen[1]}" if gen else
                     f"generators: their ceiling was never measured; the default rates take "
                     f"{sizing.PROBE_SHARE:.0%} of the switches' share (hpnlab doctor --measure)"
                     if budget.get("probe") else
                     "generators: their ceiling was never measured; the default rates come from the switches alone "
                     "(hpnlab doctor --measure)")
    return lines


def cmd_doctor(args) -> int:
    from hpnlab.fabric.emulation import kernel, sizing
    from hpnlab.fabric.scenario import graph

    if args.measure:
        from hpnlab.fabric.emulation import budget as bench_ports
        bench_ports.main(["--save", "--tc-check"])
        from hpnlab.fabric.experiments import calibration as bench_generators
        bench_generators.main(["--save"])
    caps = kernel.probe()
    rows = findings(caps)
    requested = kernel.port_type_request(args.port_type)
    budget = sizing.load_budget()
    est = None
    mtu = 1500
    if args.scenario:
        s = load_scenario(args)
        g = graph.build(s)
        mtu = s.emulation.mtu
        est = sizing.estimate(g, caps.cpus, budget)
    ports = port_type_findings(caps, budget, requested, mtu)
    if args.json:
        print(json.dumps({"capabilities": caps.as_dict(),
                          "findings": [dict(zip(("status", "item", "meaning", "fix"), r, strict=True)) for r in rows],
                          "estimate": est, "port_type": ports}, indent=1))
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
    for line in ports:
        print(f"switch ports: {line}")
    if est:
        verdict = "fits" if est["fits"] else "does NOT fit"
        print(f"{args.scenario}: {est['hosts']} hosts + {est['switches']} switches = {est['nodes']} nodes "
              f"(max {est['nodes_max']}), {est['links']} links, {est['pps_full_load_per_hop']} packets/s per hop "
              f"at full load (budget ~{est['pps_budget']}: {est['pps_budget_source']}): {verdict} on this machine")
    fatal = [r for r in rows if r[0] == "FAIL"]
    return 1 if fatal else 0
