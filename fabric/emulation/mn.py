"""The fabric graph as a Mininet topology (pure: building a Topo needs no root).

``topo_for(scenario)`` (or ``FabricTopo(graph)``) returns a ``mininet.topo.Topo`` in which

* every host ``hN`` has one interface per NIC port, named ``hN-ethI`` where ``I`` is the
  port's ``intf`` number from the graph, carrying the planned address with its **plane
  prefix** length (``10.0.0.5/9`` on plane 0 of a two-plane fabric) and the planned MAC;
  the host's own ``ip``/``mac`` parameters are those of its lowest interface, so Mininet's
  default configuration never overwrites a planned address;
* every switch carries its datapath id (``dpid`` as 16 hex digits) and its links use the
  graph's port numbers on both ends (OVS gets them as ``ofport_request``, so they are the
  OpenFlow port numbers the controller computes with);
* every link carries ``bw`` (Mbit/s, the *emulated* rate: see ``emulated_mbps``), ``delay``
  (only when the graph's delay is non-zero), and the fabric edge's ``kind``.

The link options are Mininet ``TCLink`` options, so ``mn --custom ... --link tc`` shapes
with them. ``hpnlab.fabric.emulation`` does its own shaping (htb, and netem only where it exists)
and only uses the structure from here.

Emulated rates: a scenario describes 400G fabrics; a 2-core machine forwards about 43k
packets/s in userspace OVS. The scenario's ``emulation`` block scales the fabric down:
host links run at ``host_mbps``; every other link at ``host_mbps * rate_gbps /
host_rate_gbps``, capped at ``max_mbps``. Delays are multiplied by ``delay_scale``.
"""
from __future__ import annotations

import ipaddress
from typing import Any

import networkx as nx

from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec
from hpnlab.fabric.scenario.addressing import dpid_str
from hpnlab.fabric.scenario.rates import emulated_delay_us, emulated_mbps
from hpnlab.fabric.scenario.spec import Scenario

try:  # Mininet is an optional (emulation) dependency; the pure helpers work without it.
    from mininet.topo import Topo as _Topo
except ImportError:  # pragma: no cover - exercised only where mininet is missing
    _Topo = object

# Linux limits interface names to 15 characters.
IFNAMSIZ = 15


def plane_prefixlen(g: nx.MultiGraph, plane: int) -> int:
    return ipaddress.IPv4Network(g.graph["plan"].plane_prefix(plane)).prefixlen


def host_interfaces(g: nx.MultiGraph, host: str) -> list[dict[str, Any]]:
    """A host's interfaces: graph.host_ports plus ``name`` (hN-ethI) and ``cidr`` (ip/plane len)."""
    out = []
    for port in fgraph.host_ports(g, host):
        port = dict(port)
        port["name"] = fgraph.intf_name(host, port["intf"])
        port["cidr"] = f"{port['ip']}/{plane_prefixlen(g, port['plane'])}"
        out.append(port)
    return out



def link_options(g: nx.MultiGraph, u: str, v: str, data: dict) -> dict[str, Any]:
    """Mininet link options (port1/port2, names, TCLink bw/delay) for one fabric edge."""
    s: Scenario = g.graph["scenario"]
    # Mininet convention here: a host is always node1 of its link.
    if g.nodes[v]["tier"] == 0 and g.nodes[u]["tier"] > 0:
        u, v = v, u
    p1, p2 = data["ports"][u], data["ports"][v]
    ofports = data.get("ofports", data["ports"])    # emulation.rewire: foreign OpenFlow port numbers
    opts: dict[str, Any] = {
        "port1": ofports[u], "port2": ofports[v],
        "bw": emulated_mbps(s, data["rate_gbps"]),
        "kind": data["kind"],
    }
    delay = emulated_delay_us(s, data.get("delay_us", 0.0))
    if delay > 0:
        opts["delay"] = f"{delay:g}us"
    opts["intfName1"] = fgraph.intf_name(u, p1)
    opts["intfName2"] = fgraph.intf_name(v, p2)
    if g.nodes[u]["tier"] == 0:
        opts["addr1"] = data["mac"]
        opts["params1"] = {"ip": f"{data['ip']}/{plane_prefixlen(g, data['plane'])}"}
    for key in ("intfName1", "intfName2"):
        if len(opts[key]) > IFNAMSIZ:
            raise ValueError(f"interface name {opts[key]!r} is longer than {IFNAMSIZ} characters")
    return {"node1": u, "node2": v, **opts}


class FabricTopo(_Topo):
    """A Mininet Topo built from a fabric graph. ``self.fabric`` is the graph."""

    def __init__(self, fabric_graph: nx.MultiGraph, **opts: Any) -> None:
        self.fabric = fabric_graph
        super().__init__(**opts)

    def build(self, **_opts: Any) -> None:  # Mininet's hook: Topo.__init__ calls it
        g = self.fabric
        for host in fgraph.hosts(g):
            intfs = host_interfaces(g, host)
            params: dict[str, Any] = {}
            if intfs:
                first = intfs[0]
                params = {"ip": first["cidr"], "mac": first["mac"]}
            self.addHost(host, **params)
        for sw in fgraph.switches(g):
            self.addSwitch(sw, dpid=dpid_str(g.nodes[sw]["dpid"]))
        for u, v, data in g.edges(data=True):
            opts = link_options(g, u, v, data)
            self.addLink(opts.pop("node1"), opts.pop("node2"), **opts)


def topo_for(scenario: Scenario) -> FabricTopo:
    """The Mininet Topo of a validated scenario."""
    return FabricTopo(fgraph.build(scenario))


def topo_from(name_or_path: str = "mini-hpn", **overrides: Any) -> FabricTopo:
    """The Topo of a preset or scenario file, with field overrides (``planes=2``...).

    Sub-fields come as ``emulation.host_mbps=5`` (what ``mn --topo hpn,emulation.host_mbps=5``
    passes) or, where a Python keyword is needed, ``emulation__host_mbps=5``.
    """
    flat = ((key.replace("__", "."), value) for key, value in overrides.items())
    return topo_for(spec.load(name_or_path, spec.nest_dotted(flat)))
