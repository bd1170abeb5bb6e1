"""The fault API of a run: links and switches taken down and up, both ends or one side, gray
failures, the controller killed, restarted, frozen, and timelines of all of them.

Switch-side interfaces live in the root namespace and are set over one netlink socket
(pyroute2: no process to fork, so a timeline's events land within milliseconds); host-side
interfaces are set inside the host's namespace through its shell.

Three kinds of link failure:

- ``link_down``: both interfaces administratively down; both switches see carrier loss.
- ``link_down(side=X)``: only X's interface down. With veth pairs (this emulation) the peer
  keeps its administrative state but loses carrier at once (NO-CARRIER, operstate down), so
  both switches still see the link down; a one-sided failure whose far end keeps its
  carrier is what ``link_drop`` emulates.
- ``link_drop(side=X)``: a gray failure. Both ends stay up with carrier, but everything X
  sends on the link is dropped: a tc clsact *egress* filter on X's interface running a
  one-instruction classic BPF program (``ret #2``, TC_ACT_SHOT, direct action). It needs only
  cls_bpf (no netem, gact or compiler). An ingress filter would not do: Open vSwitch's
  userspace datapath reads the interface with an AF_PACKET socket, which sees a packet
  before tc ingress runs. Only BFD (or the traffic's own loss) notices this failure.
"""
from __future__ import annotations

import re
import select
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import networkx as nx

from hpnlab.fabric.scenario.graph import intf_name

from ..errors import UserError
from . import timeline as tl

#: (node, interface name): one end of a link
End = tuple[str, str]

#: tc preference of the gray-failure filter: before any other egress filter (the ECN stage's)
DROP_PREF = 1
#: classic BPF, one instruction: return TC_ACT_SHOT (2) for every packet (direct action)
DROP_BYTECODE = "1,6 0 0 2,"


#: rtnetlink notifications about routes and addresses (what a link event must not bring: ovs-vswitchd
#: re-reads the routing table on any of them, and on any link event too: OVS 3.1 lib/route-table.c)
ROUTE_EVENTS = frozenset({"RTM_NEWROUTE", "RTM_DELROUTE", "RTM_NEWADDR", "RTM_DELADDR"})


def notification_index(msg: Any) -> int | None:
    """The interface an rtnetlink notification is about: a link's or address's index, a route's
    output interface (pure; None when it names none)."""
    if msg.get("event") in ("RTM_NEWROUTE", "RTM_DELROUTE"):
        return msg.get_attr("RTA_OIF")
    return msg.get("index")


class RtnlWatch:
    """Collects rtnetlink notifications of this namespace (links, IPv4/IPv6 addresses and routes)
    while open: ``with RtnlWatch() as w: ...; w.events(indexes)`` -> [(event, ifindex), ...]."""

    def __init__(self) -> None:
        from pyroute2.netlink.rtnl import (
            RTMGRP_IPV4_IFADDR,
            RTMGRP_IPV4_ROUTE,
            RTMGRP_IPV6_IFADDR,
            RTMGRP_IPV6_ROUTE,
            RTMGRP_LINK,
        )
        self.groups = (RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_IPV4_ROUTE
                       | RTMGRP_IPV6_ROUTE)
        self.sock: socket.socket | None = None
        self.data: list[bytes] = []

    def __enter__(self) -> RtnlWatch:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.bind((0, self.groups))
        return self

    def drain(self, quiet_s: float = 0.2) -> None:
        """Read what has arrived, until nothing more comes for ``quiet_s``."""
        assert self.sock is not None
        while select.select([self.sock], [], [], quiet_s)[0]:
            self.data.append(self.sock.recv(1 << 16))

    def events(self, indexes: set[int] | None = None) -> list[tuple[str, int | None]]:
        """(event, interface index) of every notification so far (only about ``indexes`` if given)."""
        from pyroute2.netlink.rtnl.marshal import MarshalRtnl
        marshal = MarshalRtnl()
        out = [(m.get("event"), notification_index(m)) for chunk in self.data for m in marshal.parse(chunk)]
        return [e for e in out if indexes is None or e[1] in indexes]

    def __exit__(self, *exc: Any) -> None:
        if self.sock is not None:
            self.drain(0.0)
            self.sock.close()
            self.sock = None


def drop_lines(intf: str, drop: bool) -> list[str]:
    """``tc -batch`` lines that start (``drop``) or end a gray failure on one interface (pure).
    The clsact qdisc is left in place (the ECN stage may own it; adding it again fails
    harmlessly, ``tc -force``)."""
    if drop:
        return [f"qdisc add dev {intf} clsact",
                f"filter add dev {intf} egress pref {DROP_PREF} bpf da bytecode '{DROP_BYTECODE}'"]
    return [f"filter del dev {intf} egress pref {DROP_PREF}"]


def link_ends(graph: nx.MultiGraph, u: str, v: str, key: int | None = None, scenario: str = "") -> list[End]:
    """Both ends of one link (every parallel link when ``key`` is None)."""
    data = graph.get_edge_data(u, v)
    if not data:
        raise UserError(f"no link between {u} and {v} in {scenario or 'this fabric'}")
    if key is not None and key not in data:
        raise UserError(f"no parallel link {key} between {u} and {v} in {scenario or 'this fabric'}")
    out: list[End] = []
    for k in ([key] if key is not None else list(data)):
        ports = data[k]["ports"]
        out += [(u, intf_name(u, ports[u])), (v, intf_name(v, ports[v]))]
    return out


def switch_ends(graph: nx.MultiGraph, name: str, scenario: str = "") -> list[End]:
    """Both ends of every link of a switch."""
    if name not in graph or graph.nodes[name]["tier"] == 0:
        raise UserError(f"no switch {name!r} in {scenario or 'this fabric'}")
    ends: list[End] = []
    for nbr in graph.neighbors(name):
        ends += link_ends(graph, name, nbr, scenario=scenario)
    return ends


class Controller(Protocol):
    """What a fault needs of the run's controller (``supervisor.ControllerSupervisor``)."""

    def kill(self) -> int | None: ...

    def restart(self) -> float: ...

    def signal(self, sig: int) -> None: ...


class Faults:
    """Sets interfaces of a running emulation down and up, and its controller away and back.
    ``host_cmd(host, line)`` runs a command in a host's namespace; ``is_local(node)`` says whether
    a node is on this machine; ``controller``: the run's controller (None: it has none)."""

    def __init__(self, graph: nx.MultiGraph, host_cmd: Callable[[str, str], Any],
                 is_local: Callable[[str], bool] = lambda node: True, scenario: str = "",
                 controller: Controller | None = None):
        self.graph = graph
        self.host_cmd = host_cmd
        self.is_local = is_local
        self.scenario = scenario
        self.controller = controller
        self._ipr: Any = None

    # -- the netlink socket ---------------------------------------------------------------
    def netlink(self) -> Any:
        """A pyroute2 IPRoute socket in the root namespace (opened once; None without pyroute2)."""
        if self._ipr is None:
            try:
                from pyroute2 import IPRoute
            except ImportError:
                return None
            self._ipr = IPRoute()
        return self._ipr

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    # -- interfaces -----------------------------------------------------------------------
    def set_ends(self, ends: list[End], up: bool) -> float:
        """Set these interfaces up or down; returns the time.time() at which it was applied."""
        root = [name for node, name in ends if self.graph.nodes[node]["tier"] > 0 and self.is_local(node)]
        if root:
            self._set_root(root, up)
        for node, name in ends:
            if self.graph.nodes[node]["tier"] == 0:
                self.host_cmd(node, f"ip link set dev {name} {'up' if up else 'down'}")
        return time.time()

    def _set_root(self, names: list[str], up: bool) -> None:
        ipr = self.netlink()
        state = "up" if up else "down"
        if ipr is None:
            subprocess.run(["ip", "-batch", "-"], input="".join(f"link set dev {n} {state}\n" for n in names),
                           text=True, capture_output=True, check=True)
            return
        for name in names:
            ipr.link("set", index=socket.if_nametoindex(name), state=state)

    def is_up(self, name: str, host: str | None = None) -> bool:
        """Operational state of an interface (a host's, inside its namespace, when host is given)."""
        if host:
            out = str(self.host_cmd(host, f"cat /sys/class/net/{name}/operstate"))
        else:
            out = Path(f"/sys/class/net/{name}/operstate").read_text()
        return out.strip() == "up"

    # -- links and switches ---------------------------------------------------------------
    def _link(self, u: str, v: str, key: int | None, side: str | None) -> list[End]:
        ends = link_ends(self.graph, u, v, key, self.scenario)
        if side is None:
            return ends
        if side not in (u, v):
            raise UserError(f"side {side!r} is neither end of the link {u}-{v}")
        return [e for e in ends if e[0] == side]

    def link_down(self, u: str, v: str, key: int | None = None, side: str | None = None) -> float:
        """Take a link down: both ends, or only ``side``'s end (one-sided: that interface is
        administratively down; its veth peer stays up administratively but loses carrier).
        Returns the time.time() at which it was applied."""
        return self.set_ends(self._link(u, v, key, side), up=False)

    def link_up(self, u: str, v: str, key: int | None = None, side: str | None = None) -> float:
        return self.set_ends(self._link(u, v, key, side), up=True)

    def link_drop(self, u: str, v: str, key: int | None = None, side: str | None = None) -> float:
        """A gray failure: the link stays up, everything ``side`` (default ``u``) sends on it is
        dropped. Returns the time.time() at which the drop was in place."""
        return self._drop(self._link(u, v, key, side or u), drop=True)

    def link_restore(self, u: str, v: str, key: int | None = None, side: str | None = None) -> float:
        """End a gray failure started with ``link_drop`` (the same ``side``)."""
        return self._drop(self._link(u, v, key, side or u), drop=False)

    def _drop(self, ends: list[End], drop: bool) -> float:
        root = [line for node, name in ends if self.graph.nodes[node]["tier"] > 0 and self.is_local(node)
                for line in drop_lines(name, drop)]
        if root:
            # -force: go on past 'qdisc add' failing because the qdisc exists
            r = subprocess.run(["tc", "-force", "-batch", "-"], input="\n".join(root) + "\n", text=True,
                               capture_output=True)
            failed = {int(m) for m in re.findall(r"Command failed -:(\d+)", r.stderr)}
            if any(root[i - 1].startswith("filter") for i in failed if 0 < i <= len(root)):
                raise UserError(f"tc could not {'add' if drop else 'remove'} the gray-failure drop filter: "
                                f"{r.stderr.strip().splitlines()[0]}")
        for node, name in ends:
            if self.graph.nodes[node]["tier"] == 0:
                for line in drop_lines(name, drop):
                    self.host_cmd(node, f"tc {line} 2>/dev/null")
        return time.time()

    def is_dropping(self, name: str) -> bool:
        """Whether a root-namespace interface has the gray-failure filter."""
        r = subprocess.run(["tc", "filter", "show", "dev", name, "egress"], capture_output=True, text=True)
        return f"pref {DROP_PREF} bpf" in r.stdout

    def switch_down(self, name: str) -> float:
        """A switch fails: every link of it goes down (its neighbours see carrier loss)."""
        return self.set_ends(switch_ends(self.graph, name, self.scenario), up=False)

    def switch_up(self, name: str) -> float:
        return self.set_ends(switch_ends(self.graph, name, self.scenario), up=True)

    # -- the controller ---------------------------------------------------------------------
    def kill_controller(self) -> int | None:
        """The controller process ends as a crash would (SIGKILL); its exit code."""
        if self.controller is None:
            raise UserError("this run has no hpnlab controller to kill")
        return self.controller.kill()

    def restart_controller(self) -> float:
        """The controller started again; the seconds until every switch has connected to it."""
        if self.controller is None:
            raise UserError("this run has no hpnlab controller to restart")
        return self.controller.restart()

    def signal_controller(self, sig: int) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) the controller process; nothing without one."""
        if self.controller is not None:
            self.controller.signal(sig)

    # -- timelines ----------------------------------------------------------------------------
    def run_timeline(self, timeline: Any, log: Callable[[str], None] = lambda m: None) -> list[dict[str, Any]]:
        """Apply a timeline's events at their times (``timeline.run``: blocking); one record per event."""
        return tl.run(self, timeline, log=log)
