"""The emulation harness: a scenario as a live Mininet network on real Open vSwitch.

See the package docstring (``hpnlab.fabric.emulation``) for the API and what it does.
"""
from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable

import networkx as nx
import yaml

from .. import graph as fgraph
from .. import kernel
from .. import spec
from ..errors import UserError
from ..mn import FabricTopo, emulated_delay_us, emulated_mbps, host_interfaces, switch_intf_name
from . import shaping
from .state import ENV_MARK, OVS_MARK, Lock, RunState, marked_bridges

CONTROLLERS = ("hpnlab", "none")
DEFAULT_OFP_PORT = 6653
#: userspace OVS on 2 cores forwards about this many packets/s through the whole fabric
#: (environment note: iperf3 UDP through two switches); scaled with the CPU count.
PPS_PER_CORE = 21_500
#: Mininet nodes (hosts + switches) per core this harness accepts.
NODES_PER_CORE = 64


class EmulationError(RuntimeError):
    """The emulation could not be brought up as asked (switches not connecting, hosts unreachable)."""


def _log_default(msg: str) -> None:
    print(f"hpnlab: {msg}", file=sys.stderr, flush=True)


# ---- sizing -------------------------------------------------------------------------

def estimate(g: nx.MultiGraph, cpus: int) -> dict[str, Any]:
    """What an emulation of this graph costs here, and whether it fits."""
    s: spec.Scenario = g.graph["scenario"]
    hosts = len(fgraph.hosts(g))
    switches = len(fgraph.switches(g))
    links = g.number_of_edges()
    host_links = sum(1 for _, _, d in g.edges(data=True) if d["kind"] == "host")
    frame_bits = 8 * (s.emulation.mtu + 14)
    # every host port sending at its emulated rate; each packet crosses at least one switch
    pps_one_hop = host_links * s.emulation.host_mbps * 1e6 / frame_bits
    budget = PPS_PER_CORE * cpus
    nodes_max = NODES_PER_CORE * cpus
    return {"hosts": hosts, "switches": switches, "links": links, "host_ports": host_links,
            "interfaces": 2 * links, "nodes": hosts + switches, "nodes_max": nodes_max,
            "pps_full_load_per_hop": round(pps_one_hop), "pps_budget": budget,
            "fits": hosts + switches <= nodes_max and pps_one_hop <= budget}


def check_fits(g: nx.MultiGraph, cpus: int) -> dict[str, Any]:
    est = estimate(g, cpus)
    if est["nodes"] > est["nodes_max"]:
        raise UserError(
            f"scenario {g.graph['scenario'].name!r} is too large for this machine: {est['hosts']} hosts + "
            f"{est['switches']} switches = {est['nodes']} nodes, {est['links']} links; this {cpus}-core "
            f"machine takes at most {est['nodes_max']} nodes (pick a mini-/small- preset or fewer hosts)")
    if est["pps_full_load_per_hop"] > est["pps_budget"]:
        raise UserError(
            f"scenario {g.graph['scenario'].name!r} is too fast for this machine: {est['host_ports']} host "
            f"ports at {g.graph['scenario'].emulation.host_mbps:g} Mbit/s need "
            f"{est['pps_full_load_per_hop']} packets/s per switch hop, above the ~{est['pps_budget']} packets/s "
            f"userspace OVS forwards on {cpus} cores (lower emulation.host_mbps or raise emulation.mtu)")
    return est


def free_port(preferred: int = DEFAULT_OFP_PORT) -> int:
    if port_free(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def has_loops(g: nx.MultiGraph) -> bool:
    sw = g.subgraph(fgraph.switches(g))
    simple = nx.Graph(sw)
    parallel = any(len(d) > 1 for _, nbrs in sw.adj.items() for d in nbrs.values())
    return parallel or simple.number_of_edges() >= simple.number_of_nodes() - nx.number_connected_components(simple) + 1


# ---- Mininet node classes (built per run: they record what they start) ----------------

def _node_classes(state: RunState, datapath: str, mtu: int, cluster: bool = False):
    from mininet.node import Host, OVSSwitch

    class HpnlabHost(Host):
        def startShell(self, *args, **kwargs):
            super().startShell(*args, **kwargs)
            if not getattr(self, "isRemote", False):  # a remote pid means nothing here
                state.add_pid(self.pid, f"host {self.name}", hard=True)

    class HpnlabSwitch(OVSSwitch):
        """OVSSwitch whose bridge is marked as ours and which talks to our controller."""
        targets: list = []

        def __init__(self, name, **params):
            params.setdefault("datapath", datapath)
            params.setdefault("protocols", "OpenFlow13")
            super().__init__(name, **params)

        def startShell(self, *args, **kwargs):
            super().startShell(*args, **kwargs)
            if not getattr(self, "isRemote", False):
                state.add_pid(self.pid, f"switch shell {self.name}", hard=True)

        def bridgeOpts(self):
            return super().bridgeOpts() + f" external_ids:{OVS_MARK}={state.run_id}"

        def intfOpts(self, intf):
            opts = super().intfOpts(intf)
            if mtu != 1500:
                opts += f" mtu_request={mtu}"
            return opts

        def start(self, controllers):
            super().start(self.targets)
            # linux-noop QoS: OVS leaves the ports' qdiscs (our htb and clsact) alone
            qid = f"noop_{self.name}"
            ports = [str(i) for i in self.intfList() if self.ports[i] and not i.IP()]
            if ports:
                self.vsctl(f"-- --id=@{qid} create QoS type=linux-noop "
                           f"external_ids:{OVS_MARK}={state.run_id} "
                           + " ".join(f"-- set Port {p} qos=@{qid}" for p in ports))

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
            # one ovs-vsctl per server; locally without a shell (a pty truncates long lines)
            for server, group in groupby(sorted(switches, key=attrgetter("server")), attrgetter("server")):
                group = tuple(group)
                run = errRun if server == "localhost" else group[0].rcmd
                OVSSwitch.batchStartup(group, run=run)
            return switches

    return ClusterHost, ClusterSwitch


def plane_placer(graph: nx.MultiGraph):
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


PLACEMENTS = ("plane", "switch-bin", "round-robin", "random")


class _Target:
    """What OVSSwitch.start needs to know about a controller."""

    def __init__(self, port: int, ip: str = "127.0.0.1"):
        self.name, self.protocol, self.port, self.ip = "c0", "tcp", port, ip

    def IP(self):  # noqa: N802 - Mininet's name
        return self.ip


# ---- the harness ------------------------------------------------------------------------

class Emulation:
    """A scenario running as a live emulated fabric. Use as a context manager."""

    #: pings a source runs at once in ping_all (all sources run in parallel)
    PING_BATCH = 8

    def __init__(self, scenario: str | spec.Scenario, *, overrides: dict | None = None,
                 controller: str = "hpnlab", ofp_port: int | None = None, policy: str | None = None,
                 ecn: bool = True, shape: bool = True, verify: bool = True,
                 connect_timeout: float = 60.0, controller_args: Iterable[str] = (), lock_wait_s: float = 0.0,
                 ready_timeout: float = 30.0, inactivity_probe_ms: int | None = None,
                 servers: list[str] | None = None, placement: str = "plane", controller_ip: str = "127.0.0.1",
                 log: Callable[[str], None] | None = _log_default):
        if controller not in CONTROLLERS:
            raise UserError(f"unknown controller {controller!r} (known: {', '.join(CONTROLLERS)})")
        if isinstance(scenario, spec.Scenario):
            self.scenario = scenario if not overrides else spec.from_dict(
                _merge(spec.to_dict(scenario), overrides), scenario.source)
        else:
            self.scenario = spec.load(scenario, overrides or {})
        self.controller = controller
        self.requested_port = ofp_port
        self.policy = policy
        self.want_ecn = ecn
        self.want_shape = shape
        self.verify = verify
        self.connect_timeout = connect_timeout
        self.lock_wait_s = lock_wait_s
        # How long the controller may take to print 'ready' (slow machines, software-emulated
        # guests: os-ken's imports alone take 30-60 s under qemu TCG).
        self.ready_timeout = ready_timeout
        # OVS drops a controller that leaves its echo unanswered this long (OVS default 5 s);
        # a CPU-starved controller needs more, or every switch flaps.
        self.inactivity_probe_ms = inactivity_probe_ms
        self.servers = list(servers) if servers else None
        if placement not in PLACEMENTS:
            raise UserError(f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})")
        self.placement = placement
        self.controller_ip = controller_ip
        self.controller_args = list(controller_args)
        self.log = log or (lambda m: None)
        self.graph = fgraph.build(self.scenario)
        self.caps: kernel.Capabilities | None = None
        self.net = None
        self.state: RunState | None = None
        self.ofp_port: int | None = None
        self.controller_proc: subprocess.Popen | None = None
        self.ecn = None  # hpnlab.fabric.emulation.ecn.EcnStage once started
        self.metadata: dict[str, Any] = {"scenario": self.scenario.name, "controller": controller}
        self.timings: dict[str, float] = {}
        self._lock = Lock()
        self._old_env: str | None = None
        self._old_handlers: dict[int, Any] = {}
        self._stopped = True
        self._intf_of: dict[tuple[str, str, int], tuple[str, str]] = {}

    # -- context manager --------------------------------------------------------------
    def __enter__(self) -> "Emulation":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- preflight ----------------------------------------------------------------------
    def preflight(self) -> kernel.Capabilities:
        """Check everything that could stop the run; raise UserError with one line."""
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
        if self.controller == "hpnlab":
            if importlib.util.find_spec("hpnlab.controller.__main__") is None:
                raise UserError("controller 'hpnlab' is not available (controller/__main__.py is missing); "
                                "use --controller none on a loop-free scenario")
            if not caps.os_ken:
                raise UserError(f"the controller runtime os-ken is missing: {kernel.fix_for('os_ken')}")
        elif has_loops(self.graph):
            raise UserError(f"--controller none needs a loop-free fabric and {self.scenario.name!r} has loops "
                            f"(switches would flood forever); use --controller hpnlab")
        if self.requested_port is not None and not port_free(self.requested_port):
            raise UserError(f"OpenFlow port {self.requested_port} on 127.0.0.1 is taken by another program; "
                            f"pick another with --ofp-port or leave it out to choose a free one")
        self.metadata["estimate"] = check_fits(self.graph, caps.cpus)
        self._check_names_free()
        return caps

    def _planned_root_interfaces(self) -> list[str]:
        names = []
        for u, v, d in self.graph.edges(data=True):
            for node in (u, v):
                port = d["ports"][node]
                names.append(f"{node}-eth{port}")
        return names

    def _check_names_free(self) -> None:
        r = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True)
        existing = set(r.stdout.split())
        ours = set(fgraph.switches(self.graph))
        clash = sorted(existing & ours)
        if clash:
            marked = marked_bridges()
            if all(b in marked for b in clash):
                raise UserError(f"OVS bridges {', '.join(clash[:4])} are left from an earlier hpnlab run; "
                                f"run 'sudo hpnlab clean' first")
            raise UserError(f"an OVS bridge named {clash[0]} exists and is not hpnlab's; "
                            f"rename or remove it (hpnlab never deletes bridges it did not create)")
        present = {p.name for p in Path("/sys/class/net").iterdir()}
        clash_if = sorted(present & set(self._planned_root_interfaces()))
        if clash_if:
            raise UserError(f"network interface {clash_if[0]} already exists; if an earlier hpnlab run left it, "
                            f"run 'sudo hpnlab clean'")

    # -- start ---------------------------------------------------------------------------
    def start(self) -> "Emulation":
        t0 = time.monotonic()
        self.caps = self.preflight()
        self._lock.acquire(f"scenario {self.scenario.name}", self.lock_wait_s)
        try:
            self._install_signal_handlers()
            self.state = RunState.new(self.scenario.name)
            self._stopped = False
            self.metadata["run_id"] = self.state.run_id
            self.state.add_dir(str(self.state.run_dir))
            self.state.run_dir.mkdir(parents=True, exist_ok=True)
            self._old_env = os.environ.get(ENV_MARK)
            os.environ[ENV_MARK] = self.state.run_id
            self._describe_mechanisms()
            if self.controller == "hpnlab":
                self._start_controller()
            self.timings["controller_s"] = time.monotonic() - t0
            self._build()
            self.timings["built_s"] = time.monotonic() - t0
            if self.want_ecn:
                self._start_ecn()
            if self.controller == "hpnlab":
                self._wait_connected()
            self.timings["connected_s"] = time.monotonic() - t0
            if self.verify:
                self._verify()
            self.timings["up_s"] = time.monotonic() - t0
            self.state.notes["metadata"] = self.metadata
            self.state.save()
            (self.state.run_dir / "metadata.json").write_text(json.dumps(self.metadata, indent=1, default=str))
        except BaseException:
            self.stop()
            raise
        return self

    def _describe_mechanisms(self) -> None:
        caps = self.caps
        md = self.metadata
        md["datapath"] = caps.datapath
        md["shaping"] = "htb" if self.want_shape else "off"
        delays = [d for _, _, d in self.graph.edges(data=True) if d.get("delay_us", 0) > 0]
        md["delay"] = "netem" if caps.netem else ("none needed" if not delays else "not emulated")
        if delays and not caps.netem:
            worst = max(emulated_delay_us(self.scenario, d["delay_us"]) for d in delays)
            md.setdefault("not_emulated", []).append(
                f"link delay: {len(delays)} links want up to {worst:g} us but the kernel has no netem")
            self.log(f"no netem in this kernel: {len(delays)} link delays (up to {worst:g} us) are NOT emulated")
        if self.want_ecn:
            md["ecn"] = caps.ecn_mechanism or "none"
            if caps.ecn_mechanism is None:
                md.setdefault("not_emulated", []).append("ECN marking: neither sch_red nor clang/bpftool/cls_bpf")
                self.log("no ECN marking possible here (no sch_red, no BPF toolchain); switches will not mark")
        else:
            md["ecn"] = "off"
        md["tcp_offload"] = ("userspace-tso" if caps.ovs_userspace_tso else "host tx checksum offload off")

    def _start_controller(self) -> None:
        port = self.requested_port or free_port(DEFAULT_OFP_PORT)
        if self.requested_port is None and port != DEFAULT_OFP_PORT:
            self.log(f"port {DEFAULT_OFP_PORT} is taken; the controller listens on {port}")
        self.ofp_port = port
        scen_file = self.state.run_dir / "scenario.yaml"
        scen_file.write_text(yaml.safe_dump(spec.to_dict(self.scenario), sort_keys=False))
        cmd = [sys.executable, "-m", "hpnlab.controller", str(scen_file), "--ofp-port", str(port),
               "--listen", self.controller_ip]
        if self.policy:
            cmd += ["--policy", self.policy]
        cmd += self.controller_args
        logf = self.state.run_dir / "controller.log"
        self.metadata["controller_cmd"] = " ".join(cmd)
        self.metadata["controller_log"] = str(logf)
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(logf, "wb") as out:
            self.controller_proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                                    cwd=root, env=env)
        self.state.add_pid(self.controller_proc.pid, "controller", group=True)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            text = logf.read_text(errors="replace")
            if "ready" in text:
                return
            if self.controller_proc.poll() is not None:
                tail = text.strip().splitlines()[-3:]
                raise EmulationError(f"the controller exited (code {self.controller_proc.returncode}): "
                                     + " | ".join(tail))
            time.sleep(0.05)
        raise EmulationError(f"the controller did not print 'ready' within {self.ready_timeout:g} s (log: {logf})")

    def _build(self) -> None:
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet

        setLogLevel("error")
        s = self.scenario
        state = self.state
        cluster = self.servers is not None
        host_cls, switch_cls = _node_classes(state, self.caps.datapath, s.emulation.mtu, cluster)
        switch_cls.targets = ([_Target(self.ofp_port, self.controller_ip)]
                              if self.controller == "hpnlab" else [])
        fail_mode = "secure" if self.controller == "hpnlab" else "standalone"
        topo = FabricTopo(self.graph)
        # recorded before anything exists: bridges (and their userspace tap), veth names
        state.add_bridges(fgraph.switches(self.graph))
        state.add_interfaces(self._planned_root_interfaces())
        common = dict(topo=topo, switch=lambda name, **p: switch_cls(name, failMode=fail_mode, **p),
                      host=host_cls, controller=None, autoSetMacs=False, autoStaticArp=False,
                      build=False, waitConnected=False, cleanup=False)
        if cluster:
            from mininet.examples import cluster as mncluster
            placers = {"plane": plane_placer(self.graph), "switch-bin": mncluster.SwitchBinPlacer,
                       "round-robin": mncluster.RoundRobinPlacer, "random": mncluster.RandomPlacer}
            ssh_dir = Path(os.environ.get("HOME", "/root")) / ".ssh" / "mn"
            for d in (ssh_dir.parent, ssh_dir):   # MininetCluster runs mkdir -p on it
                if not d.exists():
                    state.add_empty_dir(str(d))
            net = mncluster.MininetCluster(servers=self.servers, placement=placers[self.placement],
                                           link=mncluster.RemoteLink, **common)
            remote = sorted(set(self.servers) - {"localhost"})
            self.metadata["cluster"] = {"servers": self.servers, "placement": self.placement}
            if remote:
                line = (f"nodes on {', '.join(remote)}: no htb shaping or ECN stage on their switch ports, and "
                        f"'hpnlab clean' here cannot remove what a killed run left there (run it on each server)")
                self.metadata.setdefault("not_emulated", []).append(line)
                self.log(line)
        else:
            net = Mininet(link=Link, **common)
        self.net = net
        net.build()
        self._configure_hosts()
        net.start()
        # after the ports joined their bridges: OVS resets a port's qdisc when it adds it
        self._configure_switch_ports()

    def _configure_hosts(self) -> None:
        s = self.scenario
        mtu = s.emulation.mtu
        netem = self.caps.netem
        for host in fgraph.hosts(self.graph):
            node = self.net.get(host)
            intfs = host_interfaces(self.graph, host)
            sysctls = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
                       "net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2",
                       "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
                       "net.ipv4.tcp_ecn=1"]
            cmds = [f"sysctl -qw {' '.join(sysctls)}"]
            planes = defaultdict(list)
            for p in intfs:
                planes[p["plane"]].append(p)
                cmds.append(f"sysctl -qw net.ipv4.conf.{p['name'].replace('.', '/')}.rp_filter=0")
                if mtu != 1500:
                    cmds.append(f"ip link set dev {p['name']} mtu {mtu}")
                # Userspace OVS without TSO forwards TCP with bad checksums unless hosts
                # compute them; the kernel datapath handles offloads itself.
                if self.caps.datapath == "user" and not self.caps.ovs_userspace_tso:
                    cmds.append(f"ethtool -K {p['name']} tx off >/dev/null 2>&1")
            for plane, ports in planes.items():
                if len(ports) < 2:
                    continue
                prefix = self.graph.graph["plan"].plane_prefix(plane)
                for p in ports:
                    table = 100 + p["intf"]
                    cmds.append(f"ip route replace {prefix} dev {p['name']} src {p['ip']} table {table}")
                    cmds.append(f"ip rule add from {p['ip']} table {table} pref {table}")
            if self.want_shape:
                lines = []
                for p in intfs:
                    rate = emulated_mbps(s, p["rate_gbps"])
                    lines += shaping.tc_lines(shaping.Shape(p["name"], rate, 0.0, mtu), netem)
                batch = self.state.run_dir / f"tc-{host}.txt"
                batch.write_text("\n".join(lines) + "\n")
                cmds.append(f"tc -batch {batch}")
            # a file, not a long command line: a Mininet shell's pty truncates lines at 4096 bytes
            script = self.state.run_dir / f"config-{host}.sh"
            script.write_text("\n".join(cmds) + "\n")
            out = node.cmd(f"sh {script}; echo hpnlab-done $?")
            if "hpnlab-done" not in out:
                raise EmulationError(f"configuring {host} failed: {out.strip()[-200:]}")

    def switch_ports(self) -> list[dict[str, Any]]:
        """Every switch egress port: switch, port, intf name, peer node, emulated rate, delay."""
        s = self.scenario
        out = []
        for u, v, d in self.graph.edges(data=True):
            for a, b in ((u, v), (v, u)):
                if self.graph.nodes[a]["tier"] == 0:
                    continue
                port = d["ports"][a]
                out.append({"switch": a, "port": port, "intf": switch_intf_name(a, port), "peer": b,
                            "rate_mbps": emulated_mbps(s, d["rate_gbps"]),
                            "delay_us": emulated_delay_us(s, d.get("delay_us", 0.0)), "kind": d["kind"],
                            "local": self._is_local(a)})
        return out

    def _is_local(self, node: str) -> bool:
        """Whether a node runs on this machine (always, unless cluster servers were given)."""
        if not self.servers or self.net is None:
            return True
        return getattr(self.net.get(node), "server", "localhost") == "localhost"

    def _configure_switch_ports(self) -> None:
        s = self.scenario
        ports = [p for p in self.switch_ports() if p["local"]]
        for p in ports:
            try:
                Path(f"/proc/sys/net/ipv6/conf/{p['intf']}/disable_ipv6").write_text("1")
            except OSError:
                pass
        lines = []
        for p in ports:
            if s.emulation.mtu != 1500:
                lines.append(f"link set dev {p['intf']} mtu {s.emulation.mtu}")
        if lines:
            subprocess.run(["ip", "-batch", "-"], input="\n".join(lines) + "\n", text=True, check=True,
                           capture_output=True)
        if self.want_shape:
            tc = []
            for p in ports:
                tc += shaping.tc_lines(shaping.Shape(p["intf"], p["rate_mbps"], p["delay_us"], s.emulation.mtu),
                                       self.caps.netem)
            batch = self.state.run_dir / "tc-switches.txt"
            batch.write_text("\n".join(tc) + "\n")
            r = subprocess.run(["tc", "-batch", str(batch)], capture_output=True, text=True)
            if r.returncode != 0:
                raise EmulationError(f"shaping switch ports failed: {r.stderr.strip()[:300]}")

    def _start_ecn(self) -> None:
        mech = self.caps.ecn_mechanism
        if mech is None:
            return
        from .ecn import EcnStage
        self.ecn = EcnStage.for_emulation(self, mechanism=mech)
        self.metadata["ecn_defaults"] = self.ecn.defaults_description()

    # -- controller connection and reachability --------------------------------------------
    def connected_switches(self) -> dict[str, bool]:
        """Bridge name -> is_connected to its controller, read from ovsdb."""
        r = subprocess.run(["ovs-vsctl", "--timeout=5", "--format=json", "--columns=name,controller",
                            "list", "Bridge"], capture_output=True, text=True)
        c = subprocess.run(["ovs-vsctl", "--timeout=5", "--format=json", "--columns=_uuid,is_connected",
                            "list", "Controller"], capture_output=True, text=True)
        if r.returncode or c.returncode:
            return {}
        conn = {row[0][1]: row[1] for row in json.loads(c.stdout)["data"]}
        out = {}
        ours = set(fgraph.switches(self.graph))
        for name, ctl in json.loads(r.stdout)["data"]:
            if name not in ours:
                continue
            uuids = [ctl[1]] if ctl[0] == "uuid" else [u[1] for u in ctl[1]]
            out[name] = any(conn.get(u) is True for u in uuids)
        return out

    def _set_inactivity_probe(self) -> None:
        for sw in fgraph.switches(self.graph):
            r = subprocess.run(["ovs-vsctl", "--timeout=10", "get", "bridge", sw, "controller"],
                               capture_output=True, text=True)
            for uuid in r.stdout.strip().strip("[]").replace(",", " ").split():
                subprocess.run(["ovs-vsctl", "--timeout=10", "set", "controller", uuid,
                                f"inactivity_probe={int(self.inactivity_probe_ms)}"], capture_output=True)

    def _wait_connected(self) -> None:
        if self.inactivity_probe_ms is not None:
            self._set_inactivity_probe()
        deadline = time.monotonic() + self.connect_timeout
        want = set(fgraph.switches(self.graph))
        while True:
            state = self.connected_switches()
            up = {n for n, ok in state.items() if ok}
            if up >= want:
                return
            if self.controller_proc and self.controller_proc.poll() is not None:
                raise EmulationError(f"the controller exited (code {self.controller_proc.returncode}); "
                                     f"log: {self.metadata.get('controller_log')}")
            if time.monotonic() > deadline:
                missing = sorted(want - up)
                raise EmulationError(f"{len(missing)} of {len(want)} switches did not connect to the controller "
                                     f"within {self.connect_timeout:g} s: {', '.join(missing[:6])}")
            time.sleep(0.2)

    def _verify(self, rounds: int = 3) -> None:
        """Every host-port pair on every plane must answer; pairs that fail are retried (ARP
        answers and flow set-up can lag under load) up to ``rounds`` times in all."""
        pairs = self.all_pairs()
        pending = pairs
        history = []
        for attempt in range(rounds):
            if attempt:
                time.sleep(1.0)
            pending = self.ping_all(pairs=pending)["failed"]
            history.append(len(pending))
            if not pending:
                break
        self.metadata["reachability"] = {"pairs": len(pairs), "failed": len(pending),
                                         "failed_per_round": history}
        if pending:
            sample = ", ".join(f"{a}->{b}" for (_, a, _, b) in pending[:5])
            raise EmulationError(f"{len(pending)} of {len(pairs)} host-port pairs cannot reach "
                                 f"each other: {sample}")

    # -- queries --------------------------------------------------------------------------
    def host(self, name: str):
        return self.net.get(name)

    @property
    def hosts(self) -> list[str]:
        return fgraph.hosts(self.graph)

    def interfaces(self, host: str) -> list[dict[str, Any]]:
        """A host's interfaces: name (hN-ethI), ip, cidr, plane, rail, mac, leaf."""
        return host_interfaces(self.graph, host)

    def ip(self, host: str, plane: int = 0, rail: int = 0) -> str:
        for p in host_interfaces(self.graph, host):
            if p["plane"] == plane and p["rail"] == rail:
                return p["ip"]
        raise KeyError(f"{host} has no port on plane {plane} rail {rail}")

    def all_pairs(self) -> list[tuple[str, str, str, str]]:
        """(src host, src ip, dst host, dst ip) for every pair of host ports on the same plane."""
        ports = {h: host_interfaces(self.graph, h) for h in self.hosts}
        out = []
        for a in self.hosts:
            for b in self.hosts:
                if a == b:
                    continue
                for pa in ports[a]:
                    for pb in ports[b]:
                        if pa["plane"] == pb["plane"]:
                            out.append((a, pa["ip"], b, pb["ip"]))
        return out

    def ping_all(self, pairs: list[tuple[str, str, str, str]] | None = None, timeout_s: float = 2.0,
                 count: int = 1) -> dict[str, Any]:
        """Ping every host-port pair on every plane (from the source's port on that plane).

        Returns ``{"pairs": n, "failed": [(src, src_ip, dst, dst_ip), ...]}``. Sources run in
        parallel, each pinging all its destinations at once.
        """
        pairs = self.all_pairs() if pairs is None else pairs
        by_src: dict[str, list] = defaultdict(list)
        for pair in pairs:
            by_src[pair[0]].append(pair)
        wait = max(1, int(round(timeout_s)))
        # one script file per source, run with popen (a Mininet shell's pty truncates long lines)
        procs = {}
        for src, plist in by_src.items():
            script = self.state.run_dir / f"ping-{src}.sh"
            lines = []
            for i, (_, sip, _, dip) in enumerate(plist):
                lines.append(f"(ping -n -q -c {count} -W {wait} -I {sip} {dip} >/dev/null 2>&1 "
                             f"&& echo OK {sip} {dip} || echo NO {sip} {dip}) &\n")
                if i % self.PING_BATCH == self.PING_BATCH - 1:
                    lines.append("wait\n")   # at most PING_BATCH pings at once per source
            script.write_text("".join(lines) + "wait\n")
            procs[src] = self.host(src).popen(["sh", str(script)])
        ok = set()
        failed = []
        for src, proc in procs.items():
            try:
                out, _ = proc.communicate(timeout=wait * count + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            for line in out.decode(errors="replace").splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == "OK":
                    ok.add((parts[1], parts[2]))
        for pair in pairs:
            if (pair[1], pair[3]) not in ok:
                failed.append(pair)
        return {"pairs": len(pairs), "failed": failed}

    # -- processes on hosts ------------------------------------------------------------------
    def popen(self, host: str, cmd: list[str] | str, **kwargs) -> subprocess.Popen:
        """Start a process on a host (recorded in the run's state; ended at stop)."""
        proc = self.host(host).popen(cmd, **kwargs)
        self.state.add_pid(proc.pid, f"{host}: {cmd if isinstance(cmd, str) else ' '.join(cmd)}")
        return proc

    # -- failures ---------------------------------------------------------------------------
    def _link_intfs(self, u: str, v: str, key: int | None = None) -> list[tuple[str, str]]:
        """(node, interface name) of both ends of one link (or every parallel link if key is None)."""
        data = self.graph.get_edge_data(u, v)
        if not data:
            raise UserError(f"no link between {u} and {v} in {self.scenario.name}")
        keys = [key] if key is not None else list(data)
        out = []
        for k in keys:
            ports = data[k]["ports"]
            out += [(u, f"{u}-eth{ports[u]}"), (v, f"{v}-eth{ports[v]}")]
        return out

    def _set_intfs(self, ends: list[tuple[str, str]], up: bool) -> None:
        state = "up" if up else "down"
        root = [name for node, name in ends if self.graph.nodes[node]["tier"] > 0 and self._is_local(node)]
        if root:
            self._set_root_links(root, up)
        for node, name in ends:
            if self.graph.nodes[node]["tier"] == 0:
                self.host(node).cmd(f"ip link set dev {name} {state}")

    def _set_root_links(self, names: list[str], up: bool) -> None:
        """Set root-namespace interfaces up/down over netlink (no process to fork: precise timing)."""
        ipr = self.netlink()
        if ipr is None:
            state = "up" if up else "down"
            subprocess.run(["ip", "-batch", "-"], input="".join(f"link set dev {n} {state}\n" for n in names),
                           text=True, capture_output=True, check=True)
            return
        for name in names:
            ipr.link("set", index=socket.if_nametoindex(name), state="up" if up else "down")

    def netlink(self):
        """A pyroute2 IPRoute socket in the root namespace (opened once; None without pyroute2)."""
        if getattr(self, "_ipr", None) is None:
            try:
                from pyroute2 import IPRoute
            except ImportError:
                return None
            self._ipr = IPRoute()
        return self._ipr

    def link_down(self, u: str, v: str, key: int | None = None) -> float:
        """Take a link down (both ends). Returns the time.time() at which it was applied."""
        self._set_intfs(self._link_intfs(u, v, key), up=False)
        return time.time()

    def link_up(self, u: str, v: str, key: int | None = None) -> float:
        self._set_intfs(self._link_intfs(u, v, key), up=True)
        return time.time()

    def _switch_ends(self, name: str) -> list[tuple[str, str]]:
        if name not in self.graph or self.graph.nodes[name]["tier"] == 0:
            raise UserError(f"no switch {name!r} in {self.scenario.name}")
        ends = []
        for nbr in self.graph.neighbors(name):
            ends += self._link_intfs(name, nbr)
        return ends

    def switch_down(self, name: str) -> float:
        """A switch fails: every link of it goes down (its neighbours see carrier loss)."""
        self._set_intfs(self._switch_ends(name), up=False)
        return time.time()

    def switch_up(self, name: str) -> float:
        self._set_intfs(self._switch_ends(name), up=True)
        return time.time()

    def intf_is_up(self, name: str, host: str | None = None) -> bool:
        """Operational state of an interface (a host's, inside its namespace, when host is given)."""
        if host:
            out = self.host(host).cmd(f"cat /sys/class/net/{name}/operstate")
        else:
            out = Path(f"/sys/class/net/{name}/operstate").read_text()
        return out.strip() == "up"

    def run_timeline(self, timeline, log: Callable[[str], None] | None = None):
        from .timeline import run as run_timeline
        return run_timeline(self, timeline, log=log or self.log)

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Remove everything this run created (the same code path as `hpnlab clean`)."""
        if self._stopped:
            return
        self._stopped = True
        from .state import teardown
        try:
            if getattr(self, "_ipr", None) is not None:
                self._ipr.close()
                self._ipr = None
            if self.ecn is not None:
                self.ecn.close()
            if self.state is not None:
                counts = teardown(self.state, log=self.log)
                self.metadata["removed"] = counts
            if self.net is not None:  # reap the shells teardown ended (no zombies in long runs)
                for node in self.net.hosts + self.net.switches:
                    shell = getattr(node, "shell", None)
                    if shell is not None:
                        try:
                            shell.wait(timeout=1)
                        except Exception:  # noqa: BLE001
                            pass
        finally:
            if self._old_env is None:
                os.environ.pop(ENV_MARK, None)
            else:
                os.environ[ENV_MARK] = self._old_env
            self._restore_signal_handlers()
            self._lock.release()

    # -- signals -----------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum, _frame):
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, on_term)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._old_handlers.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, TypeError):
                pass
        self._old_handlers.clear()


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out
