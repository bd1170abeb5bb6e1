"""Mininet node classes and the configuration of their interfaces.

``node_classes`` builds, per run, a host and a switch class that record every shell they
start in the run's state file, mark their bridges as hpnlab's and talk to our controller.
Hosts configure themselves (``HpnlabHost.configure``: addresses are Mininet's; sysctls,
MTU, per-source policy routing, offloads, htb shaping are ours); switch-side interfaces
live in the root namespace and are configured by ``configure_switch_ports``.

Long command lines go into a script file, never through a node's shell: a Mininet shell
is a pty, and a pty truncates lines at 4096 bytes (``script``).
"""
from __future__ import annotations

import socket
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import networkx as nx

from hpnlab.fabric.emulation.mn import host_interfaces
from hpnlab.fabric.scenario import spec
from hpnlab.fabric.scenario.graph import intf_name
from hpnlab.fabric.scenario.rates import emulated_delay_us, emulated_mbps

from . import ovsdb, pfc_plan, shaping
from .state import RunState

HOST_SYSCTLS = ("net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
                "net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2",
                "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0", "net.ipv4.tcp_ecn=1")


class NodeError(RuntimeError):
    """A node could not be configured."""


def script(path: Path, lines: Iterable[str]) -> list[str]:
    """Write ``lines`` as a shell script; returns the argv that runs it (``sh PATH``).

    The one place for the long-line workaround: a Mininet shell's pty truncates lines at
    4096 bytes, so anything long runs from a file (with ``node.cmd`` or ``node.popen``)."""
    path.write_text("".join(line if line.endswith("\n") else line + "\n" for line in lines))
    return ["sh", str(path)]


def host_commands(graph: nx.MultiGraph, host: str, tx_checksum_off: bool, tc_batch: Path | None) -> list[str]:
    """Shell lines that configure one host's interfaces (pure)."""
    mtu = graph.graph["scenario"].emulation.mtu
    intfs = host_interfaces(graph, host)
    cmds = [f"sysctl -qw {' '.join(HOST_SYSCTLS)}"]
    congestion = graph.graph["scenario"].emulation.tcp_congestion
    if congestion:                  # a name spec checked ([a-z0-9_]) and preflight found available
        cmds.append(f"sysctl -qw net.ipv4.tcp_congestion_control={congestion}")
    planes: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for p in intfs:
        planes[p["plane"]].append(p)
        cmds.append(f"sysctl -qw net.ipv4.conf.{p['name'].replace('.', '/')}.rp_filter=0")
        if mtu != 1500:
            cmds.append(f"ip link set dev {p['name']} mtu {mtu}")
        # Userspace OVS without TSO forwards TCP with bad checksums unless hosts compute
        # them; the kernel datapath handles offloads itself.
        if tx_checksum_off:
            cmds.append(f"ethtool -K {p['name']} tx off >/dev/null 2>&1")
    for plane, ports in planes.items():
        if len(ports) < 2:
            continue
        prefix = graph.graph["plan"].plane_prefix(plane)
        for p in ports:   # several ports on one plane: traffic leaves by its source address's port
            table = 100 + p["intf"]
            cmds.append(f"ip route replace {prefix} dev {p['name']} src {p['ip']} table {table}")
            cmds.append(f"ip rule add from {p['ip']} table {table} pref {table}")
    if tc_batch is not None:
        cmds.append(f"tc -batch {tc_batch}")
    return cmds


def host_tc_lines(graph: nx.MultiGraph, host: str, netem: bool) -> list[str]:
    """htb on every host interface at its emulated rate (pure)."""
    s: spec.Scenario = graph.graph["scenario"]
    lines: list[str] = []
    for p in host_interfaces(graph, host):
        lines += shaping.tc_lines(shaping.Shape(p["name"], emulated_mbps(s, p["rate_gbps"]), 0.0,
                                                s.emulation.mtu, buffer_frames=s.emulation.buffer_frames,
                                                control_priority=s.emulation.control_priority,
                                                pfc=s.emulation.lossless.pfc), netem)
    return lines


def switch_ports(graph: nx.MultiGraph, is_local: Callable[[str], bool] = lambda node: True) -> list[dict[str, Any]]:
    """Every switch egress port: switch, port, intf name, peer node, emulated rate, delay, kind, local; with
    priority flow control (``pfc``) the most lossless bytes it may hold (``lossless_bytes``: its switch's
    whole buffer, ``pfc_plan.switch_buffers``)."""
    s: spec.Scenario = graph.graph["scenario"]
    pfc = s.emulation.lossless.pfc
    totals = {sw: b.total_bytes for sw, b in pfc_plan.switch_buffers(graph, priorities=2).items()} if pfc else {}
    out = []
    for u, v, d in graph.edges(data=True):
        for a, b in ((u, v), (v, u)):
            if graph.nodes[a]["tier"] == 0:
                continue
            port = d["ports"][a]
            out.append({"switch": a, "port": port, "intf": intf_name(a, port), "peer": b,
                        "rate_mbps": emulated_mbps(s, d["rate_gbps"]),
                        "delay_us": emulated_delay_us(s, d.get("delay_us", 0.0)), "kind": d["kind"],
                        "local": is_local(a), "buffer_frames": s.emulation.buffer_frames,
                        "control_priority": s.emulation.control_priority, "pfc": pfc,
                        "lossless_bytes": totals.get(a, 0)})
    return out


def configure_switch_ports(ports: list[dict[str, Any]], mtu: int, shape: bool, netem: bool,
                           run_dir: Path) -> dict[str, Any]:
    """Switch-side interfaces (root namespace): IPv6 off, the MTU, htb to the emulated rate.
    Call after the ports joined their bridges: OVS resets a port's qdisc when it adds it.

    IPv6 off: a port then has no link-local address or route, so its carrier going down or up
    brings the root namespace link notifications only, no route or address ones. (Open vSwitch
    3.1 re-reads the routing table and revalidates every flow on a link notification anyway,
    ``lib/route-table.c`` ``name_table_change``: README, failures.) Returns what the run's
    metadata records: the ports, those whose IPv6 is off, the root namespace's interfaces."""
    ipv6_off = 0
    for p in ports:
        try:
            Path(f"/proc/sys/net/ipv6/conf/{p['intf']}/disable_ipv6").write_text("1")
            ipv6_off += 1
        except OSError:
            pass
    if mtu != 1500 and ports:
        subprocess.run(["ip", "-batch", "-"], input="".join(f"link set dev {p['intf']} mtu {mtu}\n" for p in ports),
                       text=True, check=True, capture_output=True)
    if shape and ports:
        tc: list[str] = []
        for p in ports:
            tc += shaping.tc_lines(shaping.port_shape(p, mtu), netem)
        batch = run_dir / "tc-switches.txt"
        batch.write_text("\n".join(tc) + "\n")
        r = subprocess.run(["tc", "-batch", str(batch)], capture_output=True, text=True)
        if r.returncode != 0:
            raise NodeError(f"shaping switch ports failed: {r.stderr.strip()[:300]}")
    return {"ports": len(ports), "ipv6_off": ipv6_off, "root_interfaces": len(socket.if_nameindex())}


class ControllerTarget:
    """What OVSSwitch.start needs to know about a controller."""

    def __init__(self, port: int, ip: str = "127.0.0.1", protocol: str = "tcp"):
        self.name, self.protocol, self.port, self.ip = "c0", protocol, port, ip

    def IP(self) -> str:  # noqa: N802 - Mininet's name
        return self.ip


def node_classes(state: RunState, datapath: str, mtu: int, cluster: bool = False,
                 port_type: str = "system") -> tuple[type, type]:
    """(host class, switch class) for one run (Mininet's cluster classes when ``cluster``);
    switch ports are of ``port_type`` (``hpnlab.fabric.emulation.kernel.PORT_TYPES``)."""
    from mininet.node import Host, OVSSwitch

    class HpnlabHost(Host):
        def startShell(self, *args, **kwargs):
            super().startShell(*args, **kwargs)
            if not getattr(self, "isRemote", False):  # a remote pid means nothing here
                state.add_pid(self.pid, f"host {self.name}", hard=True)

        def configure(self, graph: nx.MultiGraph, tx_checksum_off: bool, shape: bool, netem: bool) -> None:
            """Sysctls, MTU, policy routing, offloads and htb on this host's interfaces."""
            batch = None
            if shape:
                batch = state.run_dir / f"tc-{self.name}.txt"
                batch.write_text("\n".join(host_tc_lines(graph, self.name, netem)) + "\n")
            argv = script(state.run_dir / f"config-{self.name}.sh",
                          host_commands(graph, self.name, tx_checksum_off, batch))
            out = self.cmd(f"{' '.join(argv)}; echo hpnlab-done $?")
            if "hpnlab-done" not in out:
                raise NodeError(f"configuring {self.name} failed: {out.strip()[-200:]}")

    class HpnlabSwitch(OVSSwitch):
        """OVSSwitch whose bridge is marked as ours and which talks to our controller."""
        targets: ClassVar[list] = []

        def __init__(self, name, **params):
            params.setdefault("datapath", datapath)
            params.setdefault("protocols", "OpenFlow13")
            super().__init__(name, **params)

        def startShell(self, *args, **kwargs):
            super().startShell(*args, **kwargs)
            if not getattr(self, "isRemote", False):
                state.add_pid(self.pid, f"switch shell {self.name}", hard=True)

        def bridgeOpts(self):
            return super().bridgeOpts() + f" external_ids:{ovsdb.OVS_MARK}={state.run_id}"

        def intfOpts(self, intf):
            opts = super().intfOpts(intf)
            if mtu != 1500:
                opts += f" mtu_request={mtu}"
            return opts + ovsdb.port_type_args(port_type)

        def start(self, controllers):
            super().start(self.targets)
            ports = [str(i) for i in self.intfList() if self.ports[i] and not i.IP()]
            if ports:
                self.vsctl(ovsdb.noop_qos_args(self.name, ports, state.run_id))

    if not cluster:
        return HpnlabHost, HpnlabSwitch

    from itertools import groupby
    from operator import attrgetter

    from mininet.examples.cluster import RemoteHost, RemoteOVSSwitch
    from mininet.util import errRun

    class ClusterHost(HpnlabHost, RemoteHost):
        """A host placed on a cluster server (``server=``), local when that is localhost."""

    class ClusterSwitch(HpnlabSwitch, RemoteOVSSwitch):
        """A switch placed on a cluster server; its bridge is marked and talks to our controller."""

        @classmethod
        def batchStartup(cls, switches, **_kwargs):
            # one ovs-vsctl per server; locally without a shell (see ``script``: a pty truncates long lines)
            for server, members in groupby(sorted(switches, key=attrgetter("server")), attrgetter("server")):
                group = tuple(members)
                run = errRun if server == "localhost" else group[0].rcmd
                OVSSwitch.batchStartup(group, run=run)
            return switches

    return ClusterHost, ClusterSwitch


def plane_placer(graph: nx.MultiGraph) -> type:
    """A MininetCluster placer that puts each plane's switches on one server (planes never
    share a link, so only host links cross servers) and spreads hosts round-robin."""
    from mininet.examples.cluster import Placer

    class PlanePlacer(Placer):
        def place(self, node):
            n = len(self.servers)
            data = graph.nodes[node]
            if data["tier"] == 0:
                return self.servers[data["index"] % n]
            return self.servers[(data["plane"] * max(1, data.get("campus", 0) + 1)) % n]

    return PlanePlacer


def placers(graph: nx.MultiGraph) -> dict[str, Any]:
    """Placement name -> MininetCluster placer class."""
    from mininet.examples import cluster as mncluster
    return {"plane": plane_placer(graph), "switch-bin": mncluster.SwitchBinPlacer,
            "round-robin": mncluster.RoundRobinPlacer, "random": mncluster.RandomPlacer}
