"""Local protection, proved: the healthy tables with only port liveness changed.

What is proved, for one *event* (a failure, or a repair half done): the tables the controller
compiled for the healthy fabric (``compiler.compile_fabric(g)``), with nothing changed but which
ports each switch sees live -- no controller reaction at all --, deliver every *live* host pair
on every entropy branch, with no loop and at most one down-up turn per packet. The walks are
the table interpreter's (``oftable.FabricTables.send_branches``: every source-port pattern any
switch on the way looks at), so every branch is an exact walk, not an approximation.

Events (``EVENT_KINDS``), every one of each kind on the fabric:

    link-down           a link fails at both ends (carrier loss): both ends see it dead.
    link-down-bfd       one end of a link goes down and the other end's BFD session fails: both
                        ends see it dead, nothing crosses. Port liveness is that of ``link-down``,
                        built from the one-sided cut (``one_sided``) plus the far end's session
                        (``not_live``), so that the interpreter's two ways of saying it agree.
    link-down-one-end   one end of a link goes down and the other end does not notice (no BFD;
                        a gray failure seen by one side): nothing crosses, the far end still sends.
    switch-down         a switch fails: its neighbours see their links to it dead.
    switch-back         a switch comes back before its BFD sessions are up while its neighbours'
                        are (a session comes up at one end first): every link carries, its
                        neighbours see their links to it live, it sees none of its own ports live
                        (and, per port, that port alone live).
    link-back-one-end   a link comes back, live at one end and not yet at the other: it carries
                        both ways, one end sends into it, the other does not.

A pair (two NIC ports of one plane on different hosts) is *live* under an event when both ports
are up and a valley-free path joins their leaves over links that carry and that both ends see
live (``oftable.valley_free_reachable``, independent of the compiler). For every live pair every
branch must be delivered; no branch of any pair may loop; and no branch may turn down-then-up
more than once (``turns``: a packet sent back, bounced or detoured turns once; a second turn is
a *double bounce*, which a lossless fabric could not keep free of cyclic buffer dependencies).

Named exceptions (``EXCEPTIONS``): what no table can do, each tested:

    unaware-end         link-down-one-end: the end that does not see the link dead sends
                        into it (the branches it sends there are lost until the controller
                        reacts, or BFD is on: ``link-down-bfd``).

A branch lost or turning twice outside those is a *hole*. The proof walks, for every event,
every pair of the planes the event touches (the planes are disjoint copies: every other plane
keeps its healthy tables and liveness, proved by the healthy case), from one source port per
leaf (sources under one leaf are the same to every table: ``_source_ports`` checks that no IPv4
entry of a leaf matches a host's port or address; where one does, every source is walked).

    proof = prove(g)                                   # every event of every kind
    proof.holes, proof.branches, proof.rows()          # the figures
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

import networkx as nx

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import FabricTables, Walk, valley_free_reachable
from hpnlab.fabric.routing.proofs import Findings
from hpnlab.fabric.scenario.graph import host_ports, hosts

EVENT_KINDS = ("link-down", "link-down-bfd", "link-down-one-end", "switch-down", "switch-back",
               "link-back-one-end")
#: what each kind stands for, in the words of the failure tables (docs/guides/failover.md)
EVENT_NAMES = {"link-down": "both ends down", "link-down-bfd": "one end down, with BFD",
               "link-down-one-end": "one end down, without BFD", "switch-down": "a switch down",
               "switch-back": "a switch coming back", "link-back-one-end": "a link coming back at one end first"}
#: at most this many down-up turns per packet
MAX_TURNS = 1


@dataclass(frozen=True)
class Event:
    """One liveness state of the fabric (see the module docstring)."""
    kind: str
    name: str
    failures: compiler.Failures = field(default_factory=compiler.Failures)
    one_sided: frozenset = frozenset()      # (switch, port): cut, that end sees it dead, the other not
    not_live: frozenset = frozenset()       # (switch, port): carries, that end does not see it live

    def planes(self, g: nx.MultiGraph) -> list[int]:
        """The planes the event touches (every other keeps its healthy liveness)."""
        nodes = ({n for lid in self.failures.links for n in lid[:2]} | set(self.failures.switches)
                 | {s for s, _p in self.one_sided | self.not_live})
        return sorted({g.nodes[n].get("plane", 0) for n in nodes if g.nodes[n]["tier"] > 0})

    def dead_for_paths(self, g: nx.MultiGraph) -> compiler.Failures:
        """The failures a live path must avoid: failed links and switches, links cut at one end,
        and links an end does not see live."""
        peer = _port_links(g)
        extra = {peer[sp] for sp in self.one_sided | self.not_live}
        return compiler.Failures(self.failures.links | extra, self.failures.switches)


def _port_links(g: nx.MultiGraph) -> dict[tuple[str, int], tuple]:
    memo = g.graph.get("_port_links")
    if memo is None:
        memo = {}
        for u, v, k, d in compiler._edges(g):
            lid = (u, v, k)
            memo[u, d["ports"][u]] = lid
            memo[v, d["ports"][v]] = lid
        g.graph["_port_links"] = memo
    return memo


def _fabric_links(g: nx.MultiGraph, plane: int | None = None) -> list[tuple]:
    return [(u, v, k) for u, v, k, d in compiler._edges(g) if d["kind"] != "host"
            and (plane is None or g.nodes[u].get("plane", 0) == plane)]


def events(g: nx.MultiGraph, kinds: Iterable[str] = EVENT_KINDS,
           planes: Iterable[int] | None = None) -> Iterator[Event]:
    """Every event of each kind (on the given planes; default every plane)."""
    want = None if planes is None else set(planes)
    links = [lid for lid in _fabric_links(g) if want is None or g.nodes[lid[0]].get("plane", 0) in want]
    switches = [n for n, d in g.nodes(data=True) if d["tier"] > 0 and (want is None or d.get("plane", 0) in want)]
    for kind in kinds:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        if kind == "link-down":
            for u, v, k in links:
                yield Event(kind, f"link {u}-{v}#{k} down", compiler.Failures(frozenset([(u, v, k)])))
        elif kind in ("link-down-bfd", "link-down-one-end", "link-back-one-end"):
            for u, v, k in links:
                ports = g.edges[u, v, k]["ports"]
                for near, far in ((u, v), (v, u)):
                    if kind == "link-down-bfd":
                        yield Event(kind, f"link {u}-{v}#{k} down at {near}, {far}'s BFD session down",
                                    one_sided=frozenset([(near, ports[near])]),
                                    not_live=frozenset([(far, ports[far])]))
                    elif kind == "link-down-one-end":
                        yield Event(kind, f"link {u}-{v}#{k} down at {near}, {far} unaware",
                                    one_sided=frozenset([(near, ports[near])]))
                    else:
                        yield Event(kind, f"link {u}-{v}#{k} back, live at {far} before {near}",
                                    not_live=frozenset([(near, ports[near])]))
        elif kind == "switch-down":
            for n in switches:
                yield Event(kind, f"switch {n} down", compiler.Failures(switches=frozenset([n])))
        else:
            for n in switches:
                ports = sorted({d["ports"][n] for _a, b, d in g.edges(n, data=True) if g.nodes[b]["tier"] > 0})
                yield Event(kind, f"switch {n} back, no port live yet",
                            not_live=frozenset((n, p) for p in ports))
                if len(ports) > 1:
                    for p in ports:
                        yield Event(kind, f"switch {n} back, only port {p} live",
                                    not_live=frozenset((n, q) for q in ports if q != p))


# ---- turns ----------------------------------------------------------------------------------

def turns(g: nx.MultiGraph, hops: list) -> int:
    """Down-then-up turns of a walk (``Walk.hops``: (switch, in_port, out_port)): the tiers it
    climbs and descends, sideways hops (a long-haul link) neither; the first hop climbs from the
    host. A valley-free path has none; a packet bounced, sent back or detoured once has one."""
    node = g._node
    tiers = [0] + [node[h[0]]["tier"] for h in hops]
    n = 0
    descended = False
    for a, b in pairwise(tiers):
        if b < a:
            descended = True
        elif b > a:
            n += descended
            descended = False
    return n


# ---- exceptions -----------------------------------------------------------------------------

def _unaware_end(net: FabricTables, event: Event, walk: Walk) -> bool:
    """link-down-one-end: the branch was lost sending into the cut link from the end that does
    not see it dead."""
    if event.kind != "link-down-one-end" or walk.result != "dropped" or not walk.hops:
        return False
    sw, _in, out = walk.hops[-1]
    if out is None:
        return False
    cut = {_port_links(net.g)[sp] for sp in event.one_sided}
    return _port_links(net.g).get((sw, out)) in cut and (sw, out) not in event.one_sided


#: name -> (what it is, does it excuse a walk): see the module docstring
EXCEPTIONS: dict[str, tuple[str, Callable[[FabricTables, Event, Walk], bool]]] = {
    "unaware-end": ("one end of a link down without BFD: the other end sends into it until the controller "
                    "reacts", _unaware_end),
}


# ---- proving one event ----------------------------------------------------------------------

@dataclass
class Problem:
    kind: str          # "black hole", "loop", "double bounce"
    event: str
    src: str
    dst: str
    plane: int
    sport: int
    detail: str

    def __str__(self) -> str:
        return (f"{self.kind}: {self.event}: {self.src} -> {self.dst} plane {self.plane} sport {self.sport:#x}: "
                f"{self.detail}")


@dataclass
class EventVerdict(Findings):
    event: Event
    pairs: int = 0              # pairs walked
    live: int = 0               # of which live
    branches: int = 0           # branches walked
    delivered: int = 0          # branches delivered
    excepted: dict[str, int] = field(default_factory=dict)     # exception name -> branches it excused
    problems: list[Problem] = field(default_factory=list)
    most_turns: int = 0
    seconds: float = 0.0


class EventTables(FabricTables):
    """The table interpreter over the healthy tables, its port liveness changed event by event
    (``set_event``). What a switch does with a packet depends on its tables and on which of its
    own ports it sees live, nothing else: it is remembered across events for as long as that
    switch sees the same ports live (most switches, in most events)."""

    def __init__(self, g: nx.MultiGraph, healthy: Mapping[str, compiler.SwitchState]):
        super().__init__(g, dict(healthy))
        self.healthy = healthy
        self._ports: dict[str, list[int]] = {}
        for (node, port) in self.peer:
            if node in healthy:
                self._ports.setdefault(node, []).append(port)
        self._dead_ports: dict[str, frozenset] = {}
        self._kept: dict[tuple, tuple[int | None, tuple]] = {}

    def set_event(self, event: Event) -> None:
        self.states = {n: st for n, st in self.healthy.items() if n not in event.failures.switches}
        self._failures = event.failures          # not the setter: what switches did is kept (see _pipeline)
        self.one_sided, self.not_live = event.one_sided, event.not_live
        self._cut = {self.peer[sp][2] for sp in event.one_sided}
        self._dead_ports = {}

    def _pipeline(self, switch: str, pkt: dict) -> tuple[int | None, tuple]:
        dead = self._dead_ports.get(switch)
        if dead is None:
            dead = self._dead_ports[switch] = frozenset(p for p in self._ports.get(switch, ())
                                                        if not self.port_live(switch, p))
        tables = self.tables(switch)
        sport = pkt.get("udp_src", pkt.get("tcp_src", 0)) & self._sport_mask[switch]
        key = (switch, dead, pkt.get("in_port"), pkt.get("eth_src"), pkt.get("ipv4_dst"), pkt.get("ipv4_src"),
               pkt.get("ip_proto"), "udp_src" in pkt, sport, pkt.get("eth_type"), pkt.get("arp_op"),
               pkt.get("arp_tpa"), pkt.get("arp_spa"))
        hit = self._kept.get(key)
        if hit is None:
            hit = self._kept[key] = self._run_pipeline(switch, tables, pkt)
        return hit


def _host_ports(g: nx.MultiGraph) -> dict[int, list[dict]]:
    """Per plane, every host port (with its host), in host order."""
    memo = g.graph.get("_protection_ports")
    if memo is None:
        memo = {}
        for h in hosts(g):
            for p in host_ports(g, h):
                memo.setdefault(p["plane"], []).append(dict(p, host=h))
        g.graph["_protection_ports"] = memo
    return memo


def _sources_alike(net: FabricTables, leaf: str, ports: list[dict]) -> bool:
    """Do ``leaf``'s tables send a packet from any of its host ports the same way? Yes when no IPv4
    entry of its tables 0 and 1 matches a host port (in_port) or a source address."""
    mine = {p["leaf_port"] for p in ports}
    tables = net.tables(leaf)
    return not any(m.get("eth_type") == compiler.ETH_IPV4 and ("ipv4_src" in m or m.get("in_port") in mine)
                   for t in (compiler.TABLE_CLASSIFY, compiler.TABLE_ROUTE) for f in tables.get(t, ())
                   for m in [dict(f.match)])


def _destinations_alike(net: FabricTables) -> bool:
    """Do all switches but a destination's own leaf treat the addresses under one leaf alike? Yes
    when no entry outside a leaf matches a destination more specific than a leaf prefix (compact
    host-route blocks, one action for every host of a leaf, are alike)."""
    ix = net.ix
    shortest = min((sw.prefix[1] for sw in ix.sw.values() if sw.prefix is not None), default=32)
    for name, st in net.states.items():
        if ix.sw[name].tier == 1:
            continue
        for f in st.flows:
            if f.hosts is not None:
                continue
            v = dict(f.match).get("ipv4_dst")
            if v is not None and (not isinstance(v, tuple) or bin(v[1]).count("1") > shortest):
                return False
    return True


def walked_pairs(net: FabricTables, planes: list[int]) -> list[tuple[dict, dict]]:
    """The (source, destination) host ports to walk on ``planes``: per leaf one source (every one
    where its tables tell sources apart, ``_sources_alike``); per source, on every leaf of its
    plane one destination port of another host (every one where a switch tells the addresses of a
    leaf apart, ``_destinations_alike``). Every pair of ports not walked is sent the same way as a
    pair walked (the same switches, ports and header choices), but for its own last hop."""
    ports = _host_ports(net.g)
    by_leaf: dict[tuple[str, int], list[dict]] = {}
    for plane in planes:
        for p in ports.get(plane, ()):
            by_leaf.setdefault((p["leaf"], plane), []).append(p)
    dest_alike = _destinations_alike(net)
    out: list[tuple[dict, dict]] = []
    for (leaf, plane), here in by_leaf.items():
        alike = not net.has_state(leaf) or _sources_alike(net, leaf, here)
        for s in here[:1] if alike else here:
            for (_dleaf, dplane), there in by_leaf.items():
                if dplane != plane:
                    continue
                others = [d for d in there if d["host"] != s["host"]]
                out.extend((s, d) for d in (others[:1] if dest_alike else others))
    return out


def prove_event(g: nx.MultiGraph, event: Event, healthy: Mapping[str, compiler.SwitchState],
                net: EventTables | None = None, examples: int = 5) -> EventVerdict:
    """Walk the pairs of the planes ``event`` touches (``walked_pairs``), every branch, through the
    healthy tables with the event's liveness (see the module docstring). ``examples``: problems
    described in full per kind (the others are counted)."""
    t0 = time.perf_counter()
    if net is None:
        net = EventTables(g, healthy)
    net.set_event(event)
    v = EventVerdict(event)
    planes = event.planes(g) or sorted(_host_ports(g))
    dead = event.dead_for_paths(g)
    oracle: dict = {}
    reach: dict[tuple[str, str], bool] = {}
    shown: dict[str, int] = {}
    unseen = event.one_sided | event.not_live

    def up(p: dict) -> bool:
        _leaf, leaf_port, lid = net.peer[p["host"], p["intf"]]
        return lid not in dead.links and p["leaf"] not in dead.switches and (p["leaf"], leaf_port) not in unseen

    for s, d in walked_pairs(net, planes):
        plane = s["plane"]
        v.pairs += 1
        key = (s["leaf"], d["leaf"])
        if key not in reach:
            reach[key] = valley_free_reachable(g, dead, *key, oracle)
        alive = up(s) and up(d) and reach[key]
        v.live += alive
        for sport, _mask, _patterns, w in net.walk_branches(s["host"], d["host"], plane, src_rail=s["rail"],
                                                             dst_rail=d["rail"]):
            v.branches += 1
            n = turns(g, w.hops)
            v.most_turns = max(v.most_turns, n)
            kinds = []
            if w.result == "loop":
                kinds.append("loop")
            elif alive and w.result != "delivered":
                why = next((name for name, (_t, rule) in EXCEPTIONS.items() if rule(net, event, w)), None)
                if why is not None:
                    v.excepted[why] = v.excepted.get(why, 0) + 1
                else:
                    kinds.append("black hole")
            if n > MAX_TURNS:
                kinds.append("double bounce")
            v.delivered += w.result == "delivered"
            for kind in kinds:
                shown[kind] = shown.get(kind, 0) + 1
                detail = ""
                if shown[kind] <= examples:
                    detail = f"{w.result} at {w.where}; {n} turns; path {' '.join(h[0] for h in w.hops)}"
                v.problems.append(Problem(kind, event.name, s["host"], d["host"], plane, sport, detail))
    v.seconds = time.perf_counter() - t0
    return v


# ---- proving a fabric -----------------------------------------------------------------------

@dataclass
class KindRow:
    """The figures of one event kind on one fabric."""
    kind: str
    events: int = 0
    pairs: int = 0
    live: int = 0
    branches: int = 0
    black_holes: int = 0
    loops: int = 0
    double_bounces: int = 0
    excepted: dict[str, int] = field(default_factory=dict)
    failing: list[EventVerdict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.black_holes or self.loops or self.double_bounces)


@dataclass
class LocalProof:
    scenario: str
    rows: dict[str, KindRow]
    planes_walked: list[int]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows.values())

    @property
    def events(self) -> int:
        return sum(r.events for r in self.rows.values())

    @property
    def branches(self) -> int:
        return sum(r.branches for r in self.rows.values())

    @property
    def pairs(self) -> int:
        return sum(r.pairs for r in self.rows.values())

    def holes(self) -> int:
        return sum(r.black_holes + r.loops + r.double_bounces for r in self.rows.values())


def symmetric_planes(g: nx.MultiGraph) -> list[int]:
    """The planes to walk events on: plane 0 alone. A built scenario's planes are copies of it (one
    builder, the same ports: the compiled tables are the same but for names and addresses);
    tests/unit/test_local_protection.py checks that every plane gives plane 0's figures."""
    planes = sorted({d.get("plane", 0) for _n, d in g.nodes(data=True) if d["tier"] > 0})
    return planes[:1]


def prove(g: nx.MultiGraph, kinds: Iterable[str] = EVENT_KINDS, *, all_planes: bool = False,
          healthy: Mapping[str, compiler.SwitchState] | None = None,
          progress: Callable[[str], None] | None = None) -> LocalProof:
    """Every event of each kind on ``g`` (plane 0's, unless ``all_planes``: see
    ``symmetric_planes``), proved on the healthy tables."""
    t0 = time.perf_counter()
    healthy = healthy if healthy is not None else compiler.compile_fabric(g)
    planes = sorted({d.get("plane", 0) for _n, d in g.nodes(data=True) if d["tier"] > 0}) if all_planes \
        else symmetric_planes(g)
    net = EventTables(g, healthy)
    rows = {}
    for kind in kinds:
        row = rows[kind] = KindRow(kind)
        for ev in events(g, [kind], planes):
            v = prove_event(g, ev, healthy, net)
            row.events += 1
            row.pairs += v.pairs
            row.live += v.live
            row.branches += v.branches
            row.black_holes += v.count("black hole")
            row.loops += v.count("loop")
            row.double_bounces += v.count("double bounce")
            for k, n in v.excepted.items():
                row.excepted[k] = row.excepted.get(k, 0) + n
            row.seconds += v.seconds
            if not v.ok:
                row.failing.append(v)
        if progress:
            progress(f"{kind}: {row.events} events, {row.branches:,} branches, "
                     f"{row.black_holes} black holes, {row.loops} loops, {row.double_bounces} double bounces "
                     f"({row.seconds:.1f} s)")
    return LocalProof(g.graph["scenario"].name, rows, planes, time.perf_counter() - t0)
