"""A small OpenFlow 1.3 table interpreter (the idea of Faucet's fakeoftable).

It walks a packet through the compiled tables of every switch it reaches, hop by hop
across the fabric graph, with no switch running: table lookup (highest priority wins;
two different matching entries at the same priority are an error, as the outcome would
be undefined on a real switch), write-metadata, goto-table, output. A failed link or
switch swallows the packet. The walk ends delivered (at a host interface), dropped (table
miss or a drop action, or a dead link) or looping (a switch visited twice, or too
many hops).

    net = FabricTables(graph, compiler.compile_fabric(graph, failures), failures)
    walk = net.send("h1", "h5", plane=0, sport=49152)
    walk.result  # "delivered" | "dropped" | "loop"
    walk.hops    # [(switch, in_port, out_port), ...]
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from hpnlab.controller import compiler as C


class Ambiguous(AssertionError):
    """Two entries of different actions match at the same priority."""


@dataclass
class Walk:
    result: str
    where: str
    hops: list = field(default_factory=list)
    delivered_to: tuple | None = None   # (host, interface number)


def _ip(text: str) -> int:
    a, b, c, d = (int(x) for x in text.split("."))
    return (a << 24) | (b << 16) | (c << 8) | d


class FabricTables:
    MAX_HOPS = 16

    def __init__(self, g: nx.MultiGraph, states: dict, failures: C.Failures | None = None):
        self.g = g
        self.states = states
        self.failures = failures or C.Failures()
        self.ix = C.index_of(g)
        self._tables: dict[str, dict[int, list]] = {}
        self._host_sets: dict[int, frozenset] = {}
        # (node, port) -> (peer node, peer port, link id)
        self.peer: dict[tuple, tuple] = {}
        for u, v, k, d in g.edges(keys=True, data=True):
            lid = C.link_id(u, v, k)
            self.peer[u, d["ports"][u]] = (v, d["ports"][v], lid)
            self.peer[v, d["ports"][v]] = (u, d["ports"][u], lid)

    # ---- tables ---------------------------------------------------------------------
    def tables(self, switch: str) -> dict[int, list]:
        t = self._tables.get(switch)
        if t is None:
            t = {}
            for f in self.states[switch].flows:
                t.setdefault(f.table, []).append(f)
            for flows in t.values():
                flows.sort(key=lambda f: -f.priority)
            self._tables[switch] = t
        return t

    def _matches(self, f: C.Flow, pkt: dict) -> bool:
        for k, v in f.match:
            if f.hosts is not None and k == "ipv4_dst":
                hs = self._host_sets.get(id(f.hosts))
                if hs is None:
                    hs = self._host_sets[id(f.hosts)] = frozenset(f.hosts)
                if pkt.get("ipv4_dst") not in hs:
                    return False
                continue
            have = pkt.get(k)
            if have is None:
                return False
            if isinstance(v, tuple):
                if have & v[1] != v[0]:
                    return False
            elif have != v:
                return False
        return True

    def lookup(self, switch: str, table: int, pkt: dict) -> C.Flow | None:
        best = None
        for f in self.tables(switch).get(table, ()):
            if best is not None and f.priority < best.priority:
                break
            if self._matches(f, pkt):
                if best is None:
                    best = f
                elif f.actions != best.actions:
                    raise Ambiguous(f"{switch} table {table}: {C.describe_flow(best)} and "
                                    f"{C.describe_flow(f)} both match {pkt}")
        return best

    # ---- walking ----------------------------------------------------------------------
    def packet(self, src: str, dst: str, plane: int, *, src_rail: int | None = None,
               dst_rail: int | None = None, proto: str = "udp", sport: int = 49152, dport: int = 4791) -> tuple:
        """(source interface, packet fields) for src -> dst on a plane (first rail by default)."""
        s = self._port(src, plane, src_rail)
        d = self._port(dst, plane, dst_rail)
        pkt = {"eth_type": C.ETH_IPV4, "ipv4_src": _ip(s["ip"]), "ipv4_dst": _ip(d["ip"])}
        if proto == "udp":
            pkt.update(ip_proto=C.PROTO_UDP, udp_src=sport, udp_dst=dport)
        elif proto == "tcp":
            pkt.update(ip_proto=C.PROTO_TCP, tcp_src=sport, tcp_dst=dport)
        else:
            pkt.update(ip_proto=1)
        return s, pkt

    def _port(self, host: str, plane: int, rail: int | None) -> dict:
        ports = [p for p in self._host_ports(host) if p["plane"] == plane and (rail is None or p["rail"] == rail)]
        if not ports:
            raise KeyError(f"{host} has no port on plane {plane} rail {rail}")
        return ports[0]

    def _host_ports(self, host: str) -> list:
        from hpnlab.fabric.graph import host_ports
        return host_ports(self.g, host)

    def send(self, src: str, dst: str, plane: int, **kw) -> Walk:
        sport, pkt = self.packet(src, dst, plane, **kw)
        return self.inject(src, sport["intf"], pkt)

    def inject(self, host: str, intf: int, pkt: dict) -> Walk:
        """Send ``pkt`` out of a host interface and follow it."""
        hops: list = []
        node, port = host, intf
        seen = set()
        for _ in range(self.MAX_HOPS):
            nxt = self.peer.get((node, port))
            if nxt is None:
                return Walk("dropped", f"{node} port {port}: not connected", hops)
            peer, peer_port, lid = nxt
            if lid in self.failures.links or peer in self.failures.switches:
                return Walk("dropped", f"{node} port {port}: link to {peer} is down", hops)
            if self.g.nodes[peer]["tier"] == 0:
                ip = next((p["ip"] for p in self._host_ports(peer) if p["intf"] == peer_port), None)
                if ip is not None and _ip(ip) == pkt.get("ipv4_dst"):
                    return Walk("delivered", f"{peer} intf {peer_port}", hops, (peer, peer_port))
                return Walk("dropped", f"{peer} intf {peer_port}: not its address", hops, (peer, peer_port))
            if peer not in self.states:
                return Walk("dropped", f"{peer}: no state (switch failed)", hops)
            p = dict(pkt, in_port=peer_port)
            out = self._pipeline(peer, p)
            if peer in seen:   # shortest valley-free paths never visit a switch twice
                hops.append((peer, peer_port, out))
                return Walk("loop", f"{peer} visited twice (now from port {peer_port})", hops)
            seen.add(peer)
            hops.append((peer, peer_port, out))
            if out is None:
                return Walk("dropped", f"{peer}: no route / drop", hops)
            node, port = peer, out
        return Walk("loop", f"more than {self.MAX_HOPS} hops", hops)

    def _pipeline(self, switch: str, pkt: dict) -> int | None:
        table = 0
        for _ in range(8):
            f = self.lookup(switch, table, pkt)
            if f is None:
                return None
            goto = None
            out = None
            for act in f.actions:
                if act[0] == "metadata":
                    pkt["metadata"] = act[1]
                elif act[0] == "goto":
                    goto = act[1]
                elif act[0] == "output":
                    out = act[1]
                elif act[0] == "controller":
                    return None
            if out is not None:
                return out
            if goto is None or goto <= table:
                return None
            table = goto
        return None

    # ---- all pairs ------------------------------------------------------------------------
    def all_pairs(self, planes: list[int] | None = None) -> list[tuple]:
        """Every (src, dst, plane, src_rail, dst_rail) of distinct hosts on each plane, rail 0 to every rail."""
        from hpnlab.fabric.graph import hosts
        hs = hosts(self.g)
        ports = {h: self._host_ports(h) for h in hs}
        out = []
        all_planes = sorted({p["plane"] for h in hs for p in ports[h]})
        for plane in planes or all_planes:
            for s in hs:
                sp = [p for p in ports[s] if p["plane"] == plane]
                for d in hs:
                    if d == s:
                        continue
                    for dp in ports[d]:
                        if dp["plane"] == plane:
                            out.append((s, d, plane, sp[0]["rail"], dp["rail"]))
        return out

    def live(self, host: str, plane: int, rail: int) -> bool:
        """A host port is live when its link and its leaf are up."""
        p = self._port(host, plane, rail)
        lid = self.peer[host, p["intf"]][2]
        return lid not in self.failures.links and p["leaf"] not in self.failures.switches


def valley_free_reachable(g: nx.MultiGraph, failures: C.Failures, src_leaf: str, dst_leaf: str) -> bool:
    """Oracle, independent of the compiler: is there a live path that goes only up from
    ``src_leaf``, then at most one long-haul (same-tier) hop, then only down to ``dst_leaf``?"""
    dead_l, dead_s = failures.links, failures.switches
    tier = {n: d["tier"] for n, d in g.nodes(data=True)}
    if src_leaf in dead_s or dst_leaf in dead_s:
        return False

    def neighbours(n, want):
        for v, keys in g.adj[n].items():
            if v in dead_s or tier[v] == 0:
                continue
            if want(tier[n], tier[v]) and any(C.link_id(n, v, k) not in dead_l for k in keys):
                yield v

    def closure(start, want):
        seen, stack = {start}, [start]
        while stack:
            n = stack.pop()
            for v in neighbours(n, want):
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        return seen

    up = closure(src_leaf, lambda a, b: b > a)
    up |= {v for n in list(up) for v in neighbours(n, lambda a, b: a == b)}
    down_to_dst = closure(dst_leaf, lambda a, b: b > a)   # going up from dst = going down to it
    return bool(up & down_to_dst)
