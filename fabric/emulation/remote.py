"""A second machine: switches and hosts of the emulation placed on another server, for real.

Mininet's cluster edition (``mininet.examples.cluster``) reaches servers by ssh and
tunnels the links that cross them; as shipped it assumes ``sudo`` on both ends, the
user's default ssh key and known_hosts, and leaves cleaning to Mininet's machine-wide cleanup
on every server, which hpnlab never runs. This module makes it work against a real server and
cleans there only what the run made (processes by pid, its own bridges and links):

- ``Ssh``: how to reach a server (user, identity, known_hosts pinned, a multiplexed
  connection per run); from ``HPNLAB_SSH_USER``, ``HPNLAB_SSH_IDENTITY``,
  ``HPNLAB_SSH_KNOWN_HOSTS`` and ``HPNLAB_REMOTE_PYTHON`` (the server's Python with hpnlab).
- ``Remote.classes``: the run's host, switch and link classes for the cluster; every
  command on a server runs through ssh as the ssh user (root: no sudo), with
  ``HPNLAB_RUN=<run id>`` in its environment, so a cleaner on that server finds it; links
  across servers are ssh Ethernet tunnels (``ssh -w``, Mininet's ``RemoteLink``) started
  from this machine.
- ``Remote.configure_ports``: the remote switch ports get what local ones get (IPv6 off,
  MTU, htb at the emulated rate, netem delay where the server's kernel has it) and, with
  ECN asked and sch_red on the server, RED with ECN under the htb class.
- the run's state file records, per server, the ssh command, the bridges and interfaces
  the run makes there (before it makes them); ``teardown`` (called by
  ``cleanup.teardown``, so by ``hpnlab clean`` too) ends the run's processes on the server
  (found by the environment mark), deletes its marked bridges and QoS rows and the listed
  interfaces that still exist.

The server must see the run directory (``/run/hpnlab/<run id>``) at the same path: host
configuration, ping and probe scripts are written there (the full-kernel lane shares it by
9p; real servers by NFS or similar).

Pure functions (``port_lines``, ``teardown_script``, ``parse_connected``,
``parse_caps``, ...) build and read what runs on the server; the classes only plumb.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hpnlab.fabric.scenario.graph import intf_name
from hpnlab.fabric.scenario.rates import frame_bytes
from hpnlab.fabric.workload.ecn import default_thresholds

from ..errors import UserError
from . import ecn, ovsdb, shaping
from .nodes import placers
from .state import ENV_MARK, RunState

__all__ = ["Remote", "RemoteError", "Ssh", "teardown"]

TUNNEL_TAP = "tap9"          # Mininet's RemoteLink makes every tunnel end under this name, then renames it
FEATURE_MODULES = {"openvswitch": "kernel datapath", "sch_netem": "netem", "sch_red": "red", "sch_htb": "htb"}


class RemoteError(RuntimeError):
    """A server could not be reached or did not do what it was asked."""


# ---- how to reach a server (pure) ------------------------------------------------------------

@dataclass(frozen=True)
class Ssh:
    user: str = "root"
    identity: str | None = None
    known_hosts: str | None = None
    python: str = "python3"
    control_dir: str | None = None          # a multiplexed connection per server lives here
    extra: tuple[str, ...] = field(default=())

    @classmethod
    def from_env(cls, control_dir: str | None = None) -> Ssh:
        env = os.environ
        return cls(user=env.get("HPNLAB_SSH_USER", "root"), identity=env.get("HPNLAB_SSH_IDENTITY") or None,
                   known_hosts=env.get("HPNLAB_SSH_KNOWN_HOSTS") or None,
                   python=env.get("HPNLAB_REMOTE_PYTHON", "python3"), control_dir=control_dir)

    def options(self, mux: bool = True) -> list[str]:
        opts = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=15",
                "-o", "LogLevel=ERROR"]
        if self.identity:
            opts += ["-i", self.identity, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            opts += ["-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
        if mux and self.control_dir:
            opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/ssh-%C",
                     "-o", "ControlPersist=300"]
        else:
            opts += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        return opts + list(self.extra)

    def argv(self, ip: str, tty: bool = False, mux: bool = True, extra: Iterable[str] = ()) -> list[str]:
        """ssh up to the destination; append the remote command (one string)."""
        return ["ssh", "-q", *self.options(mux), *(["-tt"] if tty else []), *extra, f"{self.user}@{ip}"]

    def local_user(self) -> bool:
        return self.user == "root"


def remote_command(cmd: list[str] | str, run_id: str) -> str:
    """The command line a server's shell runs: the run's mark exported, then the command (a
    string is taken as shell text, as ``shell=True`` would locally; a list is quoted)."""
    text = cmd if isinstance(cmd, str) else shlex.join(str(c) for c in cmd)
    return f"{ENV_MARK}={run_id}; export {ENV_MARK}; {text}"


def rewrite_python(cmd: Any, local: str, remote: str) -> Any:
    """This machine's interpreter path replaced by the server's in a command (list or string)."""
    if isinstance(cmd, list):
        return [remote if c == local else c for c in cmd]
    if isinstance(cmd, str):
        return cmd.replace(local, remote)
    return cmd


# ---- what runs on a server (pure) -------------------------------------------------------------

def tunnel_end_rename(intf: str, addr: str | None) -> str:
    """The command that gives a tunnel end (``TUNNEL_TAP``, in its node's namespace) its name and MAC."""
    return f"ip link set {TUNNEL_TAP} name {shlex.quote(intf)}" + (f" address {shlex.quote(addr)}" if addr else "")


def tunnel_end_script(pid: int, intf: str, addr: str | None) -> str:
    """One server-side command line that moves a new tunnel end into the namespace of the node
    whose shell is ``pid`` and renames it there (silent when it worked)."""
    return (f"ip link set {TUNNEL_TAP} netns {int(pid)} && "
            f"nsenter -t {int(pid)} -n {tunnel_end_rename(intf, addr)}")


def caps_script() -> str:
    """Prints one line per kernel feature: 'module yes|no', and 'ovs VERSION'."""
    lines = [f"if modprobe -q {m} 2>/dev/null || [ -d /sys/module/{m} ]; then echo '{m} yes'; else echo '{m} no'; fi"
             for m in FEATURE_MODULES]
    lines.append("echo ovs $(ovs-vsctl --timeout=10 get Open_vSwitch . ovs_version 2>/dev/null | tr -d '\"')")
    return "\n".join(lines) + "\n"


def parse_caps(text: str) -> dict[str, Any]:
    """``caps_script`` output -> {'openvswitch': bool, ..., 'ovs': version or None}."""
    caps: dict[str, Any] = dict.fromkeys(FEATURE_MODULES, False)
    caps["ovs"] = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in FEATURE_MODULES:
            caps[parts[0]] = parts[1] == "yes"
        elif parts[:1] == ["ovs"]:
            caps["ovs"] = parts[1] if len(parts) > 1 else None
    return caps


def port_lines(ports: list[dict[str, Any]], mtu: int, shape: bool, netem: bool,
               red: bool) -> tuple[list[str], list[str]]:
    """(shell lines, tc -batch lines) for one server's switch ports: IPv6 off, the MTU, htb at
    the emulated rate with the port buffer, netem delay when the server has it, and RED with
    ECN at the default thresholds (``workload.ecn.default_thresholds``) as the leaf when ``red``."""
    sh = [f"echo 1 > /proc/sys/net/ipv6/conf/{p['intf']}/disable_ipv6 2>/dev/null" for p in ports]
    if mtu != 1500:
        sh += [f"ip link set dev {p['intf']} mtu {mtu}" for p in ports]
    tc: list[str] = []
    if not shape:
        return sh, tc
    for p in ports:
        s = shaping.port_shape(p, mtu)
        if not red:
            tc += shaping.tc_lines(s, netem)
            continue
        tc += shaping.tc_lines(shaping.port_shape(p, mtu, delay=False), False, leaf=False)
        th = default_thresholds(p["rate_mbps"] * 1e6, mtu)
        args = ecn.red_args(th.kmin, th.kmax, th.pmax, mtu=mtu, rate_mbps=p["rate_mbps"], limit_bytes=s.queue_bytes)
        tc.append(f"qdisc add dev {p['intf']} parent {shaping.data_class(s)} handle 20: {' '.join(args)}")
        if netem and p["delay_us"] > 0:
            limit = max(64, s.queue_bytes // frame_bytes(mtu))
            tc.append(f"qdisc add dev {p['intf']} parent 20: handle 30: netem delay {p['delay_us']:g}us limit {limit}")
    return sh, tc


def connected_script(bridges: list[str]) -> str:
    """Prints 'bridge true|false' per bridge: whether any of its controllers is connected."""
    names = " ".join(shlex.quote(b) for b in bridges)
    return (f"for b in {names}; do v=false; "
            "for c in $(ovs-vsctl --timeout=5 get Bridge $b controller 2>/dev/null | tr -d '[],'); do "
            "[ \"$(ovs-vsctl --timeout=5 get Controller $c is_connected)\" = true ] && v=true; done; "
            "echo \"$b $v\"; done\n")


def parse_connected(text: str, bridges: Iterable[str]) -> dict[str, bool]:
    seen = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            seen[parts[0]] = parts[1] == "true"
    return {b: seen.get(b, False) for b in bridges}


def inactivity_script(bridges: list[str], ms: int) -> str:
    names = " ".join(shlex.quote(b) for b in bridges)
    return (f"for b in {names}; do for c in $(ovs-vsctl --timeout=5 get Bridge $b controller | tr -d '[],'); do "
            f"ovs-vsctl --timeout=10 set Controller $c inactivity_probe={int(ms)}; done; done\n")


def teardown_script(run_id: str, interfaces: Iterable[str]) -> str:
    """Shell text that removes one run's leftovers on a server and prints 'removed KIND N'
    lines: processes whose environment carries the run's mark (shells, their namespaces with
    them, traffic tools), OVS bridges and QoS rows marked with the run, and the listed
    interfaces that still exist. Nothing unmarked or unlisted is touched."""
    mark = f"{ENV_MARK}={run_id}"
    intfs = " ".join(shlex.quote(i) for i in interfaces)
    return f"""n=0
for f in $(grep -lzx {shlex.quote(mark)} /proc/[0-9]*/environ 2>/dev/null); do
  p=${{f#/proc/}}; p=${{p%/environ}}; [ "$p" = $$ ] && continue
  kill -9 $p 2>/dev/null && n=$((n+1))
done
echo "removed processes $n"
n=0
for b in $(ovs-vsctl --timeout=10 --bare --columns=name find Bridge external_ids:{ovsdb.OVS_MARK}={run_id}); do
  ovs-vsctl --timeout=10 --if-exists del-br $b && n=$((n+1))
done
echo "removed bridges $n"
for q in $(ovs-vsctl --timeout=10 --bare --columns=_uuid find QoS external_ids:{ovsdb.OVS_MARK}={run_id}); do
  ovs-vsctl --timeout=10 destroy QoS $q
done
n=0
for i in {intfs}; do [ -e /sys/class/net/$i ] && ip link del dev $i 2>/dev/null && n=$((n+1)); done
echo "removed interfaces $n"
"""


def parse_removed(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "removed" and parts[2].isdigit():
            out[parts[1]] = int(parts[2])
    return out


# ---- running things on a server -------------------------------------------------------------

def run_script(ssh_argv: list[str], script: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    """Run shell text on a server (fed to ``sh -s``); raise RemoteError if ssh itself fails."""
    try:
        r = subprocess.run([*ssh_argv, "sh -s"], input=script, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RemoteError(f"{ssh_argv[-1]}: no answer within {timeout_s:g} s") from None
    if r.returncode == 255:
        raise RemoteError(f"ssh to {ssh_argv[-1]} failed: {r.stderr.strip()[-300:] or 'exit 255'}")
    return r


def teardown(state: RunState, log: Callable[[str], None] = lambda s: None) -> dict[str, int]:
    """Remove what one run made on its servers (``state.remote``); counts summed over servers."""
    total: dict[str, int] = {}
    for server, rec in state.remote.items():
        try:
            r = run_script(rec["ssh"], teardown_script(state.run_id, rec.get("interfaces", [])), 120.0)
        except (RemoteError, OSError) as exc:
            log(f"cleaning {server} failed: {exc}")
            continue
        for k, v in parse_removed(r.stdout).items():
            total[k] = total.get(k, 0) + v
    return total


# ---- the run's servers ---------------------------------------------------------------------------

class Remote:
    """The remote servers of one emulation: reached, recorded, configured, queried."""

    def __init__(self, state: RunState, servers: list[str], ssh: Ssh, log: Callable[[str], None]):
        from mininet.examples.cluster import RemoteMixin
        self.state, self.ssh, self.log = state, ssh, log
        self.ips = {s: RemoteMixin.findServerIP(s) for s in servers}
        missing = [s for s, ip in self.ips.items() if not ip]
        if missing:
            raise UserError(f"cluster server {missing[0]} has no IPv4 address (name not resolved)")
        self.caps: dict[str, dict[str, Any]] = {}
        self.bridges: dict[str, list[str]] = {s: [] for s in servers}
        #: seconds spent per step on the servers (caps, tunnels, ports, connected), for the lane's report
        self.spent: dict[str, float] = {}

    def _spent(self, step: str, t0: float) -> None:
        self.spent[step] = self.spent.get(step, 0.0) + time.monotonic() - t0

    @classmethod
    def start(cls, state: RunState, servers: list[str], planned: dict[str, tuple[list[str], list[str]]],
              log: Callable[[str], None]) -> Remote:
        """Record each server (ssh command, bridges and interfaces the run will make there),
        check it answers and read what its kernel has. ``planned``: server -> (bridges, interfaces)."""
        ssh = Ssh.from_env(control_dir=str(state.run_dir))
        self = cls(state, servers, ssh, log)
        for server in servers:
            bridges, intfs = planned.get(server, ([], []))
            self.bridges[server] = list(bridges)
            state.add_remote(server, self.ssh.argv(self.ips[server], mux=False), bridges, intfs)
        for server in servers:
            t0 = time.monotonic()
            try:
                r = self.run(server, caps_script(), 90.0)
            except RemoteError as exc:
                raise UserError(str(exc)) from None
            caps = parse_caps(r.stdout)
            if not caps["ovs"]:
                raise UserError(f"cluster server {server}: Open vSwitch does not answer there (ovs-vsctl)")
            self.caps[server] = caps
            self._spent("caps", t0)
        return self

    def argv(self, server: str, tty: bool = False) -> list[str]:
        return self.ssh.argv(self.ips[server], tty=tty)

    def run(self, server: str, script: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        return run_script(self.argv(server), script, timeout_s)

    def datapath(self, server: str) -> str:
        return "kernel" if self.caps.get(server, {}).get("openvswitch") else "user"

    def describe(self) -> dict[str, Any]:
        return {s: {"ip": self.ips[s], "ovs": c["ovs"], "datapath": self.datapath(s),
                    "netem": c["sch_netem"], "red": c["sch_red"], "htb": c["sch_htb"]}
                for s, c in self.caps.items()}

    # -- node classes ------------------------------------------------------------------------
    def classes(self, host_cls: type, switch_cls: type) -> tuple[type, type, type]:
        """The run's (host, switch, link) classes for MininetCluster, reaching servers through ``self``."""
        from mininet.examples.cluster import RemoteLink
        from mininet.node import Node

        remote = self
        run_id = self.state.run_id

        class SshNode:
            """Commands on a server through the run's ssh (no sudo: the ssh user is root), marked."""
            via: ClassVar[Remote] = remote

            def _popen(self, cmd, sudo=True, tt=True, **params):
                params.pop("shell", None)
                if getattr(self, "isRemote", False):
                    cmd = [*remote.argv(self.server, tty=tt), remote_command(cmd, run_id)]  # type: ignore[attr-defined]
                elif isinstance(cmd, str):
                    cmd = ["sh", "-c", cmd]
                params.update(preexec_fn=os.setpgrp)
                return Node._popen(self, cmd, **params)

            def rcmd(self, *cmd, **opts) -> str:
                """A command in the server's root namespace; its output (Mininet's reads bytes as str)."""
                opts.update(tt=False, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                p = self._popen(*cmd, **opts)
                out, _ = p.communicate(timeout=120)
                return out.decode(errors="replace")

            def popen(self, *args, **kwargs):
                if getattr(self, "isRemote", False):
                    args = tuple(rewrite_python(a, sys.executable, remote.ssh.python) for a in args)
                return super().popen(*args, **kwargs)  # type: ignore[misc]

        class Host(SshNode, host_cls):
            pass

        class Switch(SshNode, switch_cls):
            def __init__(self, name, **params):
                server = params.get("server") or "localhost"
                if server != "localhost":
                    params["datapath"] = remote.datapath(server)
                super().__init__(name, **params)

            def intfOpts(self, intf):
                opts = super().intfOpts(intf)
                if getattr(self, "isRemote", False):   # the server's ports are plain system ports
                    opts = opts.split(" type=")[0] if " type=" in opts else opts
                return opts

        class TunnelLink(RemoteLink):
            """A link across servers as Mininet's RemoteLink makes it (tap ends joined by ``ssh -w``),
            with the run's ssh and recorded; only this machine <-> one server."""

            def makeTunnel(self, node1, node2, intfname1, intfname2, addr1=None, addr2=None):  # noqa: N802
                if node2.server == "localhost":
                    return self.makeTunnel(node2, node1, intfname2, intfname1, addr2, addr1)
                if node1.server != "localhost":
                    raise RemoteError(f"a link between two remote servers ({node1.server}, {node2.server}) "
                                      f"is not supported: place one end on this machine")
                t0 = time.monotonic()
                # only here is the tap made beforehand: on the server, sshd (root) makes it when it
                # opens the tunnel, which saves an ssh session per tunnel
                out = node1.rcmd(f"ip tuntap add dev {TUNNEL_TAP} mode tap")
                if out.strip():
                    raise RemoteError(f"creating {TUNNEL_TAP} on {node1.server} failed: {out.strip()[:200]}")
                cmd = [*remote.ssh.argv(remote.ips[node2.server], mux=False,
                                        extra=["-n", "-o", "Tunnel=Ethernet", "-w", "9:9"]), "echo @"]
                self.cmd = cmd
                tunnel = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, preexec_fn=os.setpgrp)
                remote.state.add_pid(tunnel.pid, f"ssh tunnel {node1}:{intfname1} - {node2}:{intfname2}",
                                     group=True)
                assert tunnel.stdout is not None
                if tunnel.stdout.read(1) != b"@":
                    raise RemoteError(f"the ssh tunnel to {node2.server} did not come up: {' '.join(cmd)}")
                self.moveIntf(TUNNEL_TAP, node1)
                out = node1.cmd(tunnel_end_rename(intfname1, addr1))
                if out.strip():
                    raise RemoteError(f"renaming the tunnel end to {intfname1} here failed: {out.strip()}")
                out = node2.rcmd(tunnel_end_script(node2.pid, intfname2, addr2))   # one ssh session
                if out.strip():
                    raise RemoteError(f"moving the tunnel end {intfname2} on {node2.server} failed: {out.strip()}")
                remote._spent("tunnels", t0)
                return tunnel

        return Host, Switch, TunnelLink

    # -- configuration and queries -----------------------------------------------------------------
    def configure_ports(self, ports: list[dict[str, Any]], mtu: int, shape: bool, want_ecn: bool) -> dict[str, Any]:
        """Shape (and mark, where asked and possible) every remote switch port; returns per server
        what was applied."""
        done: dict[str, Any] = {}
        by_server: dict[str, list[dict[str, Any]]] = {}
        for p in ports:
            by_server.setdefault(p["server"], []).append(p)
        for server, plist in by_server.items():
            t0 = time.monotonic()
            caps = self.caps[server]
            netem, red = bool(caps["sch_netem"]), bool(want_ecn and caps["sch_red"])
            sh, tc = port_lines(plist, mtu, shape, netem, red)
            script = "\n".join(sh) + "\n"
            if tc:
                script += "tc -batch - <<'HPNLAB_TC'\n" + "\n".join(tc) + "\nHPNLAB_TC\n"
            script += "echo hpnlab-done $?\n"
            r = self.run(server, script, 180.0)
            if "hpnlab-done 0" not in r.stdout:
                raise RemoteError(f"configuring the switch ports on {server} failed: "
                                  f"{(r.stderr or r.stdout).strip()[-300:]}")
            done[server] = {"ports": len(plist), "shaped": shape, "netem_delay": netem,
                            "ecn": "red" if red else None}
            if want_ecn and not red:
                self.log(f"{server}: no sch_red there; its {len(plist)} switch ports have no ECN marking")
            self._spent("ports", t0)
        return done

    def connected(self) -> dict[str, bool]:
        t0 = time.monotonic()
        out: dict[str, bool] = {}
        for server, bridges in self.bridges.items():
            if bridges:
                try:
                    out.update(parse_connected(self.run(server, connected_script(bridges), 60.0).stdout, bridges))
                except RemoteError:
                    out.update(dict.fromkeys(bridges, False))
        self._spent("connected", t0)
        return out

    def set_inactivity_probe(self, ms: int) -> None:
        for server, bridges in self.bridges.items():
            if bridges:
                self.run(server, inactivity_script(bridges, ms), 60.0)

    def qdiscs(self, server: str, intfs: Iterable[str], classes: bool = False) -> dict[str, str]:
        """``tc qdisc show`` (and ``tc class show`` with ``classes``) per interface on a server
        (what shaping and ECN put there), all in one ssh session."""
        names = list(intfs)
        also = "; tc class show dev {i}" if classes else ""
        script = "".join(f"echo '== {i}'; tc qdisc show dev {i}{also.format(i=i)}\n" for i in names)
        out: dict[str, list[str]] = {}
        cur = None
        for line in self.run(server, script, 60.0).stdout.splitlines():
            if line.startswith("== "):
                cur = line[3:].strip()
                out[cur] = []
            elif cur is not None:
                out[cur].append(line)
        return {i: "\n".join(out.get(i, [])) for i in names}

    def close(self) -> None:
        """End the multiplexed connections (the teardown would kill them anyway)."""
        for ip in self.ips.values():
            subprocess.run(["ssh", *self.ssh.options(), "-O", "exit", f"{self.ssh.user}@{ip}"], capture_output=True,
                           timeout=10)


def place(topo: Any, graph: Any, servers: list[str], placement: str) -> dict[str, str]:
    """Every node's server, decided once (before anything exists, so that the state file can
    list what each server will hold) and written into the topology, where MininetCluster
    keeps it (it places only nodes without a server)."""
    placer = placers(graph)[placement](servers=servers, nodes=topo.nodes(), hosts=topo.hosts(),
                                       switches=topo.switches(), links=topo.links())
    where = {}
    for node in topo.nodes():
        info = topo.nodeInfo(node)
        where[node] = info.setdefault("server", placer.place(node)) or "localhost"
    return where


def planned(graph: Any, where: dict[str, str]) -> dict[str, tuple[list[str], list[str]]]:
    """server -> (bridges, root-namespace interfaces) the run will make there (pure): the
    switches placed on it, and their ports' interfaces (a host's ends live in its namespace)."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for node, server in where.items():
        if graph.nodes[node]["tier"] > 0:
            out.setdefault(server, ([], []))[0].append(node)
    for u, v, d in graph.edges(data=True):
        for node in (u, v):
            if graph.nodes[node]["tier"] > 0:
                out.setdefault(where[node], ([], []))[1].append(intf_name(node, d["ports"][node]))
    return out
