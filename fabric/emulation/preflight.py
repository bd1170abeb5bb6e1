"""Preflight: everything that could stop a run, checked before anything is created, each
failure one line (UserError); and what the run will use on this machine (pure)."""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import networkx as nx

from hpnlab.fabric.emulation import kernel
from hpnlab.fabric.emulation.sizing import check_fits, has_loops, load_budget
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec
from hpnlab.fabric.scenario.graph import intf_name
from hpnlab.fabric.scenario.rates import emulated_delay_us

from ..errors import UserError
from ..transport.tcp import tcp_setting
from . import ovsdb
from .controller_process import port_free


def check_tcp_congestion(wanted: str, available: str | None, allowed: str | None) -> None:
    """Refuse a congestion control the hosts cannot be given (pure). ``available``: the text of
    ``tcp_available_congestion_control``; ``allowed``: of ``tcp_allowed_congestion_control``, the
    ones a network namespace other than the machine's own may make its default (the kernel
    refuses the rest there, EPERM); None: unreadable, nothing to check against."""
    if not wanted:
        return
    if available is not None and wanted not in available.split():
        raise UserError(f"emulation.tcp_congestion {wanted!r} is not available in this kernel "
                        f"(available: {available.strip() or 'none'}); load it first (modprobe tcp_{wanted}) "
                        f"or choose another")
    if allowed is not None and wanted not in allowed.split():
        raise UserError(f"emulation.tcp_congestion {wanted!r} is available but not allowed outside the machine's "
                        f"own namespace (allowed: {allowed.strip() or 'none'}); allow it with sysctl -w "
                        f"net.ipv4.tcp_allowed_congestion_control='{allowed.strip()} {wanted}' or choose another")


def planned_root_interfaces(graph: nx.MultiGraph) -> list[str]:
    """Every interface name the links will create (both ends, as Mininet names them)."""
    return [intf_name(node, d["ports"][node]) for u, v, d in graph.edges(data=True) for node in (u, v)]


def check_names_free(graph: nx.MultiGraph) -> None:
    """No OVS bridge and no interface of ours may exist yet (a clash says whose it is). Called
    with the machine-wide lock held: a run in progress holds it, so what is found then is left
    over, not another run's (checked before the lock, a second run found the first one's
    bridges and told the user to clean them)."""
    clash = sorted(ovsdb.bridges() & set(fgraph.switches(graph)))
    if clash:
        marked = ovsdb.marked_bridges()
        if all(b in marked for b in clash):
            raise UserError(f"OVS bridges {', '.join(clash[:4])} are left from an earlier hpnlab run; "
                            f"run 'sudo hpnlab clean' first")
        raise UserError(f"an OVS bridge named {clash[0]} exists and is not hpnlab's; "
                        f"rename or remove it (hpnlab never deletes bridges it did not create)")
    present = {p.name for p in Path("/sys/class/net").iterdir()}
    clash_if = sorted(present & set(planned_root_interfaces(graph)))
    if clash_if:
        raise UserError(f"network interface {clash_if[0]} already exists; if an earlier hpnlab run left it, "
                        f"run 'sudo hpnlab clean'")


def check(graph: nx.MultiGraph, controller: str, requested_port: int | None) -> tuple[kernel.Capabilities,
                                                                                     dict[str, Any]]:
    """Probe the machine and refuse what cannot run. Returns (capabilities, size estimate)."""
    scenario: spec.Scenario = graph.graph["scenario"]
    if os.geteuid() != 0:
        raise UserError("emulation needs root (real Open vSwitch, network namespaces): run it with sudo")
    caps = kernel.probe()
    if not caps.ovs_installed:
        raise UserError(f"Open vSwitch is not installed: {kernel.fix_for('ovs_installed')}")
    if not caps.ovs_running:
        raise UserError(f"Open vSwitch is not running: {kernel.fix_for('ovs_running')}")
    if not caps.mininet or not caps.mnexec:
        raise UserError(f"Mininet is missing: {kernel.fix_for('mininet')}")
    if not caps.htb:
        raise UserError(f"the kernel has no htb qdisc, links cannot be shaped: {kernel.fix_for('htb')}")
    if controller == "hpnlab":
        if importlib.util.find_spec("hpnlab.controller.__main__") is None:
            raise UserError("controller 'hpnlab' is not available (controller/__main__.py is missing); "
                            "use --controller none on a loop-free scenario")
        if not caps.os_ken:
            raise UserError(f"the controller runtime os-ken is missing: {kernel.fix_for('os_ken')}")
    elif has_loops(graph):
        raise UserError(f"--controller none needs a loop-free fabric and {scenario.name!r} has loops "
                        f"(switches would flood forever); use --controller hpnlab")
    if requested_port is not None and not port_free(requested_port):
        raise UserError(f"OpenFlow port {requested_port} on 127.0.0.1 is taken by another program; "
                        f"pick another with --ofp-port or leave it out to choose a free one")
    estimate = check_fits(graph, caps.cpus, load_budget())
    check_tcp_congestion(scenario.emulation.tcp_congestion, *(
        tcp_setting(f"tcp_{what}_congestion_control") for what in ("available", "allowed")))
    return caps, estimate


def mechanisms(caps: kernel.Capabilities, graph: nx.MultiGraph, shape: bool, ecn: bool) -> tuple[dict[str, Any],
                                                                                              list[str]]:
    """What the run uses for each feature, and the lines to tell the user (pure).

    Returns (metadata entries, warnings); what cannot be emulated here is listed in
    ``metadata["not_emulated"]``."""
    scenario: spec.Scenario = graph.graph["scenario"]
    md: dict[str, Any] = {"datapath": caps.datapath, "shaping": "htb" if shape else "off"}
    warnings: list[str] = []
    delays = [d for _, _, d in graph.edges(data=True) if d.get("delay_us", 0) > 0]
    md["delay"] = "netem" if caps.netem else ("none needed" if not delays else "not emulated")
    if delays and not caps.netem:
        worst = max(emulated_delay_us(scenario, d["delay_us"]) for d in delays)
        md.setdefault("not_emulated", []).append(
            f"link delay: {len(delays)} links want up to {worst:g} us but the kernel has no netem")
        warnings.append(f"no netem in this kernel: {len(delays)} link delays (up to {worst:g} us) are NOT emulated")
    if ecn:
        md["ecn"] = caps.ecn_mechanism or "none"
        if caps.ecn_mechanism is None:
            md.setdefault("not_emulated", []).append("ECN marking: neither sch_red nor clang/bpftool/cls_bpf")
            warnings.append("no ECN marking possible here (no sch_red, no BPF toolchain); switches will not mark")
    else:
        md["ecn"] = "off"
    md["tcp_offload"] = "userspace-tso" if caps.ovs_userspace_tso else "host tx checksum offload off"
    if scenario.emulation.lossless.pfc:
        missing = pfc_missing(caps)
        if missing:
            raise UserError(f"priority flow control (--pfc on) needs {missing}; run 'hpnlab doctor', or --pfc off")
        md["pfc"] = "tc BPF + pause agent"
    else:
        md["pfc"] = "off"
    return md, warnings


def pfc_missing(caps: kernel.Capabilities) -> str | None:
    """What priority flow control lacks here (pure): tc BPF, its toolchain, clsact, tbf; None when nothing."""
    needs = [("the bpf system call with BTF", caps.bpf), ("clang", caps.clang), ("bpftool", caps.bpftool),
             ("the bpf tc classifier", caps.tc_bpf), ("the clsact qdisc", bool(caps.qdiscs.get("clsact"))),
             ("the tbf qdisc", bool(caps.qdiscs.get("tbf"))), ("the htb qdisc", bool(caps.qdiscs.get("htb")))]
    lacking = [name for name, ok in needs if not ok]
    return ", ".join(lacking) if lacking else None


def emulation_missing() -> str | None:
    """Why an emulation cannot be built here (names the missing feature), or None."""
    if os.geteuid() != 0:
        return "needs root (real Open vSwitch and network namespaces)"
    if shutil.which("ovs-vsctl") is None:
        return "needs Open vSwitch (openvswitch-switch)"
    if subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode != 0:
        return "needs Open vSwitch running"
    if shutil.which("mnexec") is None:
        return "needs mnexec (the mininet package)"
    try:
        import mininet.net  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        return "needs the mininet Python package (pip install 'hpnlab[emulation]')"
    return None


def say(line: str) -> None:
    """An emulated benchmark's line, shown at once (a long run's progress)."""
    print(line, flush=True)


def measurement_parser(description: str | None, repeat: int, repeat_help: str) -> argparse.ArgumentParser:
    """An emulated benchmark's arguments: the preset to emulate (default mini-hpn) and ``--repeat``."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset", nargs="?", default="mini-hpn")
    p.add_argument("--repeat", type=int, default=repeat, help=f"{repeat_help} (default {repeat})")
    return p


def measurement_refused(name: str, repeat: int, most: int, say: Callable[[str], None]) -> int | None:
    """The exit code an emulated benchmark stops with before measuring, having said why in one
    line: 2 for ``--repeat`` outside 1..``most``, 0 without root or Open vSwitch (nothing to
    measure); None when it can run."""
    if not 1 <= repeat <= most:
        say(f"{name}: --repeat must be 1 to {most}, got {repeat}")
        return 2
    why = emulation_missing()
    if why:
        say(f"{name}: {why}; nothing measured")
        return 0
    return None
