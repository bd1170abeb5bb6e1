"""Faults: links and switches taken down and up, both ends or one side, at precise times.

Switch-side interfaces live in the root namespace and are set over one netlink socket
(pyroute2: no process to fork, so a timeline's events land within milliseconds); host-side
interfaces are set inside the host's namespace through its shell.
"""
from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import networkx as nx

from ..errors import UserError
from ..graph import intf_name

#: (node, interface name): one end of a link
End = tuple[str, str]


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


class Faults:
    """Sets interfaces of a running emulation down and up. ``host_cmd(host, line)`` runs a
    command in a host's namespace; ``is_local(node)`` says whether a node is on this machine."""

    def __init__(self, graph: nx.MultiGraph, host_cmd: Callable[[str, str], Any],
                 is_local: Callable[[str], bool] = lambda node: True, scenario: str = ""):
        self.graph = graph
        self.host_cmd = host_cmd
        self.is_local = is_local
        self.scenario = scenario
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

    def switch_down(self, name: str) -> float:
        """A switch fails: every link of it goes down (its neighbours see carrier loss)."""
        return self.set_ends(switch_ends(self.graph, name, self.scenario), up=False)

    def switch_up(self, name: str) -> float:
        return self.set_ends(switch_ends(self.graph, name, self.scenario), up=True)
