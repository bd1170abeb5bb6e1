"""The routing compiler: fabric graph + live state + policy -> each switch's flows, as plain values.

Pure: imports only the standard library and the fabric library (no os-ken). The os-ken
app (controller/app.py) turns the values into OpenFlow 1.3 messages; the table
interpreter (hpnlab.fabric.routing.oftable) walks packets through them.

Tables (the same on every switch; OpenFlow 1.3)
    0  classify   ARP -> controller (leaves only: proxy ARP, nothing is ever flooded); above it,
                  ARP responder flows answer a host's request in the switch, so ARP works while
                  the controller is away (see ``arp_responders``: by default every address of
                  the plane is answered with one gateway MAC, ``GATEWAY_MAC``, and the last hop
                  writes the receiver's own MAC back; table 1's host routes);
                  IPv4 -> table 1; everything else misses and is dropped. Detours (see
                  "Fast failover"): a *bounced* packet (Ethernet source BOUNCE_MAC) goes to
                  table 3 on spines and cores and is dropped on a leaf unless it is for the
                  leaf's own prefix; a packet a core detoured *deep* (Ethernet source
                  DEEP_MAC) goes down to a leaf, unmarked, from a spine under cores; a
                  switch that bounces (a leaf; a spine under cores, with two uplinks or
                  more) sends what comes down an uplink for someone else (not its own
                  prefix or pod) back up avoiding that uplink, marked bounced.
    1  route      IPv4 destination, longest prefix first (priority = 1000 + prefix
                  length). An action is a one-port choice (the port's fast-failover
                  group when it has detours, else output), a *next-hop set* (write its id,
                  or its id with "avoid port i" -- see below -- into metadata, go to table
                  2) or drop (no actions).
    2  entropy    multipath: (metadata = set id in the low 32 bits, masked bits of the UDP
                  source port) -> the fast-failover group [that port, the next 3 ports of
                  the set]; the same for the TCP source port, and for non-UDP/TCP packets
                  the IPv4 source address. A set of n ports uses B bits, 2**B patterns
                  dealt round-robin, so every port carries 2**B/n patterns (exact when n is
                  a power of two, otherwise within +-1 pattern; B is chosen so that
                  2**B >= 4n). Which bits: the *entropy map* (``entropy_map``): every
                  kind of choice -- leaf up, spine up, core across a long-haul link, core
                  down, spine down over parallel links -- reads its own bit range, laid out
                  from bit 0 in path order and as wide as that role's largest set needs, so
                  no two choices on one path read the same bits (no lockstep), and every set
                  of a role reads all of the role's bits (port = pattern mod n, exactly).
                  Hosts pick their entropy values from the same map. Above them, for
                  each port i of the set, the patterns of port i match metadata =
                  id | (i+1) << 32 exactly and are dealt round-robin over the set's other
                  ports ("the set without port i").
                  Why not select groups: OVS select groups without an OpenFlow 1.5
                  selection method ignore UDP ports, so RoCEv2 flows that differ only in
                  the UDP source port (their entropy) would all take one uplink. Masked
                  matching works on any OpenFlow 1.3 switch and the share of patterns a
                  port gets is its weight.
    3  bounced    spines and cores: the healthy routes for bounced packets, with no detour
                  (one port: output; a next-hop set: its fast-failover group), so a packet
                  is detoured at most once and can never loop.

Fast failover (local protection, no controller round trip). Every choice a switch makes goes
through an OpenFlow fast-failover group, so a dead port's traffic moves at once; where no port of
the choice is left, the group *detours* (the tables are the healthy compile's: what follows holds
with only port liveness changed). The detours, switch by switch (the structure a buffer-dependency
proof must cover; docs/guides/failover.md has the coverage per shape):

    marks     BOUNCE_MAC (Ethernet source): the packet was bounced, or sent its way again after a
              neighbour sent it back; a marked packet is routed on spines and cores by table 3
              (the healthy routes, no detour, never sent back) and dropped by a leaf unless it is
              for the leaf's own prefix. DEEP_MAC: a core detoured it *deep* (below).
    leaf      up: a set's group [port i, 3 backups of the set, those to other spines first
              (``_backups``)], then "anyway" (out of port i, live or not: a leaf coming back sees
              no uplink live while its spines see the links up). Table 0 *bounce* (``_bounces``,
              two uplinks or more): what comes down an uplink for someone else goes back up, the
              set without that spine's links, marked.
    spine     down to a leaf: [that port, up to 3 other leaves of the pod (each clearing in_port
              first: the detour may be the leaf the packet came from, and OpenFlow skips an output
              to the ingress port; on Open vSwitch an NXM load, see controller/app.py)]; parallel
              links: the set's rotation. Then "back" (out of the ingress port, for the sender to
              bounce: ``_returns`` for a two-tier spine, ``_returns_below`` under cores) -- or, where
              a core reaches the pod through this spine alone (a fat-tree's aggregation switch),
              "anyway" (``_forwards_anyway``: sent back up, the packet could reach the pod only down
              another pod and up again, a second turn). Up (under cores): the set's rotation, then
              "back"; a single uplink detours through its leaves. Table 0 *bounce* (two uplinks or
              more): what comes down from a core for outside its pod goes up the set without that
              core, marked. A spine that gets deep-marked packets (``_deep_target``) sends them down
              to one of its bouncing leaves, unmarked (GATEWAY_MAC).
    core      down to a pod: one port [that port, up to 3 spines of other pods that bounce]
              (marked DEEP_MAC where ``_deep``: every other core would reach the pod through the
              same spine, a fat-tree; the spine of the other pod sends it down to a leaf, which
              bounces it up another of its spines, so up a core of another group); a set: its
              rotation. Across a long-haul link (one port or parallel ones): [the ports, then up to
              3 spines of its campus that bounce] -- a failed far core or link is detoured down and
              up another core of the campus, to the far campus's other core. Then "back" where every
              spine below bounces (``_returns``). Table 0 *returned* (``_returned_flows``): from
              spine t, for t's pod (t sent it back), the way into the pod without t's links,
              marked; from a far core over a long-haul link, for that core's campus, the detours
              down to this core's spines (or a drop).

Every packet turns down-then-up at most once (a second turn is a buffer-dependency risk in a
lossless fabric; ``hpnlab.fabric.routing.protection.turns`` counts them): a bounce is one turn
and marks the packet, a marked packet never turns again; "back" from below is the turn at the
sender's bounce, "back" from above the turn at the spine, after which the core's returned way
goes down, marked; a deep detour turns once, at the leaf; a long-haul detour once, at the spine;
"anyway" turns nowhere. Not covered (no table can): one end of a link down while the other end
does not notice (no BFD) -- that end keeps sending into it; a pair with no valley-free path left
(a single long-haul path in a plane, a pod's only spine) is not live and is left to the host side.
``hpnlab.fabric.routing.protection`` proves the rest on every event of every kind, over scenario
shapes (tests/unit/test_local_protection.py, tools/bench/bench_local_protection.py).

Remote convergence, per affected route. What a switch holds whatever fails -- table 0,
the groups, the entropy tables of its *healthy* next-hop sets with their "avoid one port"
entries, table 3 -- comes from the healthy compile of its plane (cached on the
FabricIndex, see ``_Protection``) and is the same in every compile. A route whose live
next-hop set is a healthy set minus one port writes that set's id with "avoid that port":
after one link failure the controller changes one route per switch that must avoid it
(alibaba-hpn: 120 flow-mods where a fresh entropy table per set took 93,049). Any other
set gets a fresh entropy table and groups of its own (correct, more messages). A switch
whose one-port way died keeps its route: its group detours until upstream switches
converge, so an update never turns a detour into a drop. The reconciler counts the messages
(tools/bench/bench_compiler.py and tools/bench/bench_reconcile.py print them).

Recompiling after a failure costs what it changes. A plane's healthy routing is kept (per
destination leaf its signature -- the distances of the pod's spines to it --, every switch's
actions, per leaf its action per signature and how many destinations each serves). Failures
of leaves and leaf-spine links change only the destinations whose live uplinks changed: those
are routed anew, the spines and cores whose action towards them changed are rebuilt, a leaf
whose uplinks are intact moves only those destinations between its actions, and every other
switch keeps its healthy state as the very same value (``_patched_actions``). Failures above
the spines (spines, cores, spine-core and long-haul links) change the distances towards every
destination: that plane is routed from scratch, and so is one where leaf failures touch more than
``PATCH_LIMIT`` switches (a spine's every link down: the patch would cost twenty times more). Both
give the same states (exceptions are kept in the plane's leaf order whatever computed them;
tests/unit/test_compiler.py compares them for every single failure of the small presets).

Routing: valley-free shortest paths, computed per destination leaf from the live links
and switches (a failed switch takes its links with it). A packet goes down when the
switch can reach the destination leaf downwards, otherwise up (or across a long-haul
link) towards the switches that can. Distances strictly decrease hop by hop, so there
are no loops.

Policies
    ``aggregate``   the per-destination-leaf actions are compressed along the address
                    hierarchy (plane > campus > pod > leaf prefix): each level takes the
                    most common action of its children; only children that differ get a
                    route. Without failures a leaf holds its hosts' /32 routes and one
                    plane route up; a spine one route per leaf of its pod (and one up).
                    A failure makes some leaves' next-hop sets differ: exactly those
                    more specific routes appear (RFC 7938 §5.2.3 de-aggregation), and
                    vanish again on repair. Addresses of a leaf's prefix that are no host
                    are dropped at that leaf (no ping-pong between leaf and spine).
    ``host-routes`` the baseline: one /32 route per reachable host address on every
                    switch; no aggregate routes at all.

Compact representation: a route standing for "every host address on leaf d" is one
``Flow`` whose ``hosts`` field holds those addresses (shared between switches); it counts
as ``len(hosts)`` OpenFlow flows and ``expand()`` yields them. This keeps the 130k-port
host-routes baseline (hundreds of millions of flows) countable in seconds.
"""
from __future__ import annotations

import bisect
import gc
import socket
import zlib
from collections import ChainMap, Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

import networkx as nx

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing.entropy import PORT_BITS, TIER_NAMES, EntropyMap, entropy_bits, lay_out
from hpnlab.fabric.scenario.addressing import ip_int, ip_str, prefix_int

ROUTING_POLICIES = ("aggregate", "host-routes")   # how routes are built (not the transport's entropy policies)
DEFAULT_POLICY = ROUTING_POLICIES[0]    # the controller's, the emulation's and the model's default
#: local protection (fast-failover groups) by default; False is the controller-only baseline
DEFAULT_FAST_FAILOVER = True

TABLE_CLASSIFY, TABLE_ROUTE, TABLE_ENTROPY, TABLE_BOUNCED = 0, 1, 2, 3
ETH_IPV4, ETH_ARP = 0x0800, 0x0806
PROTO_TCP, PROTO_UDP = 6, 17
PRIO_ARP, PRIO_IPV4 = 100, 10
PRIO_MARKED, PRIO_DEEP, PRIO_OWN, PRIO_MARKED_DROP, PRIO_RETURNED, PRIO_BOUNCE = 50, 45, 40, 30, 25, 20  # table 0
PRIO_ROUTE_BASE = 1000
PRIO_L4, PRIO_OTHER = 300, 200
FULL = 0xFFFFFFFF
FF_BACKUPS = 3          # backup buckets of a next-hop set's fast-failover groups
DETOURS = 3             # detour buckets of a one-port choice's fast-failover group
BOUNCE_MAC = "0e:00:00:00:00:01"    # Ethernet source of a bounced packet (locally administered)
#: Ethernet source of a packet a core detours *deep* (see ``_deep``): the spine it reaches sends it down
DEEP_MAC = "0e:00:00:00:00:03"
OFPP_IN_PORT = 0xFFFFFFF8           # OpenFlow's reserved port: back out of the port the packet came in on
ARP_REQUEST, ARP_REPLY = 1, 2
IPV4_FIELDS = ("ipv4_dst", "ipv4_src", "arp_spa", "arp_tpa")    # fields holding an IPv4 address (an int here)
PRIO_ARP_RESPONDER = PRIO_ARP + 1
PRIO_ARP_OWN = PRIO_ARP + 2         # a host asking for its own address (an announcement): the controller's
#: the Ethernet address every leaf answers ARP with in gateway mode, and the source of every frame
#: a leaf delivers to a host (locally administered, never a host's: hosts are 02:..., see addressing)
GATEWAY_MAC = "0e:00:00:00:00:02"
#: how leaves answer ARP while the controller is away (``arp_responders``): "gateway" (default) one
#: MAC for every address, two flows per host port whatever the plane's size, with one move action
#: (Open vSwitch's NXM move; OpenFlow 1.5's copy-field); "per-host" each peer's own MAC from the
#: address plan, set-field only (any OpenFlow 1.3 switch), one flow per host port and peer
ARP_MODES = ("gateway", "per-host")
DEFAULT_ARP = ARP_MODES[0]
#: per-host mode: a leaf gets ARP responder flows (one per host port and peer of its plane) only up
#: to this many; above it (planes of thousands of hosts) ARP is answered by the controller alone
ARP_RESPONDER_MAX_FLOWS = 4096


class Flow(NamedTuple):
    """One OpenFlow flow entry, or a compact block of /32 host routes (``hosts`` set).

    match   ((field, value), ...) in OXM names; value an int or (int, mask).
    actions ("output", port) | ("controller",) | ("group", group_id) | ("metadata", value)
            (write-metadata, all 64 bits) | ("set_field", field, value) (an apply-action,
            OXM field name, e.g. ("set_field", "eth_src", BOUNCE_MAC)) | ("move", src, dst)
            (copy one whole field into another of the same width: Open vSwitch's NXM move,
            OpenFlow 1.5's copy-field; ARP responders only) | ("goto", table),
            applied in order; () drops. IPv4 addresses (ipv4_*, arp_spa, arp_tpa) are ints.
            A match on metadata may be masked: ("metadata", (value, mask)).
    hosts   None, or the IPv4 addresses (ints) this entry stands for: one flow per address
            with ``ipv4_dst`` exact (``match`` then holds the covering prefix).
    """
    table: int
    priority: int
    match: tuple
    actions: tuple
    hosts: tuple | None = None

    @property
    def entry_count(self) -> int:
        """How many OpenFlow entries this value stands for."""
        return 1 if self.hosts is None else len(self.hosts)

    def expand(self) -> Iterator[Flow]:
        if self.hosts is None:
            yield self
            return
        base = tuple(kv for kv in self.match if kv[0] != "ipv4_dst")
        for addr in self.hosts:
            yield Flow(self.table, self.priority, base + (("ipv4_dst", addr),), self.actions)

    def key(self) -> tuple:
        """What identifies an entry in a switch (OpenFlow: table, priority and match)."""
        return (self.table, self.priority, self.match)


class Group(NamedTuple):
    """One OpenFlow 1.3 group entry.

    kind     "ff" (fast failover: the first bucket whose watch port is live forwards),
             "indirect", "all" or "select".
    buckets  ((watch, actions), ...): ``watch`` for "ff" buckets the port it watches (an int),
             or ("group", group_id), the group it watches (live while that group has a live
             bucket: Open vSwitch refuses a fast-failover bucket that watches nothing); None
             otherwise; ``actions`` as in :class:`Flow` apply-actions (("output", port), ...).
    A flow sends a packet to a group with the action ("group", group_id).
    """
    group_id: int
    kind: str
    buckets: tuple

    def key(self) -> int:
        return self.group_id


@dataclass(frozen=True)
class SwitchState:
    name: str
    dpid: int
    flows: tuple            # of Flow (possibly compact blocks)
    groups: tuple = ()      # of Group, referenced by flows' ("group", id) actions

    @property
    def flow_count(self) -> int:
        return sum(f.entry_count for f in self.flows)

    @property
    def route_count(self) -> int:
        return sum(f.entry_count for f in self.flows if f.table == TABLE_ROUTE)

    def expanded(self) -> dict:
        """{flow key: actions} of every concrete OpenFlow flow (what a switch would hold)."""
        out = {}
        for f in self.flows:
            for e in f.expand():
                out[e.key()] = e.actions
        return out


@dataclass(frozen=True)
class Failures:
    """Failed links (each (u, v, key) with u < v, as in the graph) and failed switches."""
    links: frozenset = frozenset()
    switches: frozenset = frozenset()

    @staticmethod
    def of(links: Iterable = (), switches: Iterable = ()) -> Failures:
        return Failures(frozenset(link_id(*link) for link in links), frozenset(switches))

    def __bool__(self) -> bool:
        return bool(self.links or self.switches)


def link_id(u: str, v: str, key: int = 0) -> tuple:
    return (u, v, key) if u < v else (v, u, key)


def _mask(length: int) -> int:
    return (FULL << (32 - length)) & FULL if length else 0


# ---- the fabric index: everything the compiler needs, read once from the graph ----------

class HostPort(NamedTuple):
    """A leaf port with a host behind it."""
    ip: int
    port: int              # the leaf's OpenFlow port
    mac: str
    host: str
    intf: int              # the host's interface number (hN-eth<intf>)
    link: tuple            # link id


@dataclass
class _Sw:
    name: str
    dpid: int
    tier: int
    plane: int
    pod: tuple | None      # (campus, pod) or None for cores
    down: list = field(default_factory=list)     # (port, neighbour, link id)
    up: list = field(default_factory=list)
    lateral: list = field(default_factory=list)
    hosts: list = field(default_factory=list)    # leaves: HostPort, by address
    prefix: tuple | None = None                  # leaves: (net, length)
    path: tuple = ()                             # leaves: prefixes plane > campus > pod > leaf


def _edges(g: nx.MultiGraph):
    """Every link once as (u, v, key, data) with u < v, straight off the adjacency."""
    for u, nbrs in g._adj.items():
        for v, keydict in nbrs.items():
            if u < v:
                for k, d in keydict.items():
                    yield u, v, k, d


class FabricIndex:
    """The graph read once into per-plane lists; reused by every compile of the same graph."""

    def __init__(self, g: nx.MultiGraph):
        self.graph = g
        self.plan = g.graph["plan"]
        self.sw: dict[str, _Sw] = {}
        self.by_dpid: dict[int, str] = {}
        self.local_routes: dict[str, tuple] = {}   # leaf -> its hosts' /32 flows (filled by compiles)
        self._port_link: dict[tuple[str, int], tuple] | None = None
        self._host_addr: dict[int, tuple[str, str, int]] | None = None
        self.shared: dict = {}       # values shared by switches (groups, bounced-table routes)
        self._healthy: dict[int, tuple[dict, _Tree]] = {}
        self._routing: dict[int, _Routing] = {}
        self._protection: dict[str, _Protection] = {}
        self.own_flows: dict[str, tuple] = {}
        self.healthy_states: dict[tuple[str, str], dict[str, SwitchState]] = {}   # (policy, arp) -> switch -> state
        for n, d in g.nodes(data=True):
            if d["tier"] == 0:
                continue
            pod = None if d.get("pod") is None else (d.get("campus", 0), d["pod"])
            sw = _Sw(n, d["dpid"], d["tier"], d.get("plane", 0), pod)
            if d["tier"] == 1:
                sw.prefix = prefix_int(d["prefix"])
                plane, campus = d.get("plane", 0), d.get("campus", 0)
                sw.path = (("plane", plane), ("campus", plane, campus), ("pod", plane, campus, d["pod"]),
                           ("leaf", n))
            self.sw[n] = sw
            self.by_dpid[d["dpid"]] = n
        for u, v, k, d in _edges(g):
            lid = (u, v, k)
            ports = d["ports"]
            if d["kind"] == "host":
                host, leaf = (u, v) if u not in self.sw else (v, u)
                ip = int.from_bytes(socket.inet_aton(d["ip"]), "big")
                self.sw[leaf].hosts.append(HostPort(ip, ports[leaf], d["mac"], host, ports[host], lid))
                continue
            a, b = self.sw[u], self.sw[v]
            if a.tier == b.tier:
                a.lateral.append((ports[u], v, lid))
                b.lateral.append((ports[v], u, lid))
            else:
                lo, hi = (a, b) if a.tier < b.tier else (b, a)
                lo.up.append((ports[lo.name], hi.name, lid))
                hi.down.append((ports[hi.name], lo.name, lid))
        self.planes: dict[int, list[_Sw]] = {}
        for sw in self.sw.values():
            sw.hosts.sort()
            sw.up.sort()
            sw.down.sort()
            sw.lateral.sort()
            self.planes.setdefault(sw.plane, []).append(sw)
        # host addresses of each leaf: shared by every compact host-route block
        self.leaf_hosts = {sw.name: tuple(h.ip for h in sw.hosts) for sw in self.sw.values() if sw.tier == 1}
        # prefixes of the hierarchy levels
        plan = self.plan
        self.level_prefix: dict[tuple, tuple[int, int]] = {}
        for n, d in g.nodes(data=True):
            if d["tier"] != 1:
                continue
            plane, campus, pod = d.get("plane", 0), d.get("campus", 0), d["pod"]
            self.level_prefix[("plane", plane)] = prefix_int(plan.plane_prefix(plane))
            self.level_prefix[("campus", plane, campus)] = prefix_int(plan.campus_prefix(plane, campus))
            self.level_prefix[("pod", plane, campus, pod)] = prefix_int(plan.pod_prefix(plane, campus, pod))
            self.level_prefix[("leaf", n)] = prefix_int(d["prefix"])

    @property
    def port_link(self) -> dict[tuple[str, int], tuple]:
        """(switch, port) -> link id (built on first use: the app needs it, a compile does not)."""
        if self._port_link is None:
            out = {}
            for sw in self.sw.values():
                for p, _n, lid in sw.up + sw.down + sw.lateral:
                    out[sw.name, p] = lid
                for h in sw.hosts:
                    out[sw.name, h.port] = h.link
            self._port_link = out
        return self._port_link

    @property
    def host_addr(self) -> dict[int, tuple[str, str, int]]:
        """Host address -> (mac, host, plane), for proxy ARP (built on first use)."""
        if self._host_addr is None:
            self._host_addr = {h.ip: (h.mac, h.host, sw.plane) for sw in self.sw.values() for h in sw.hosts}
        return self._host_addr

    def healthy(self, plane: int) -> tuple[dict, _Tree]:
        """The plane's per-switch actions with nothing failed, and its address tree (computed once)."""
        h = self._healthy.get(plane)
        if h is None:
            h = self._healthy[plane] = (self.healthy_routing(plane).result, _Tree(self, plane))
        return h

    def healthy_routing(self, plane: int) -> _Routing:
        """The plane's routing with nothing failed, the base that failures patch (computed once)."""
        r = self._routing.get(plane)
        if r is None:
            r = self._routing[plane] = _routing(self, plane, Failures())
        return r

    def protection(self, sw: _Sw) -> _Protection:
        """What ``sw`` holds whatever fails (computed once, from its plane's healthy actions)."""
        pr = self._protection.get(sw.name)
        if pr is None:
            healthy, tree = self.healthy(sw.plane)
            pr = self._protection[sw.name] = _protect(self, sw, healthy[sw.name], tree)
        return pr

    def port_of(self, switch: str, lid: tuple) -> int | None:
        """The port of ``switch`` on link ``lid`` (None: not one of its links)."""
        node = self.sw.get(switch)
        if node is None:
            return None
        for port, _n, link in node.up + node.down + node.lateral:
            if link == lid:
                return port
        return next((h.port for h in node.hosts if h.link == lid), None)

    def link_at(self, switch: str, port: int) -> tuple | None:
        return self.port_link.get((switch, port))

    def is_host_port(self, switch: str, port: int) -> bool:
        """Is ``port`` of ``switch`` a leaf port with a host behind it?"""
        sw = self.sw.get(switch)
        return sw is not None and sw.tier == 1 and any(h.port == port for h in sw.hosts)


def index_of(g: nx.MultiGraph) -> FabricIndex:
    idx = g.graph.get("_controller_index")
    if idx is None or idx.graph is not g:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            idx = FabricIndex(g)
        finally:
            if was_enabled:
                gc.enable()
        g.graph["_controller_index"] = idx
    return idx


# ---- routing: next-hop sets per (switch, destination leaf) -----------------------------

DROP: tuple = ()


def _plane_actions(ix: FabricIndex, plane: int, failures: Failures) -> dict[str, tuple[tuple, dict]]:
    """{switch: (default action, {destination leaf: action that differs})} for one plane.

    An action is the tuple of output ports towards the destination leaf (empty: drop).
    Sparse because at scale almost every destination gets a switch's default action. The
    exceptions are in the plane's leaf order (``_Tree.rank``), whatever computed them, so that
    equal actions give the same routes in the same order.
    """
    return _routing(ix, plane, failures).result


class _View:
    """The live adjacency of one plane under some failures: per live switch its live (port,
    neighbour) lists, spines' ports per leaf below, spines' cores above."""

    def __init__(self) -> None:
        self.sws: list[_Sw] = []
        self.dead_sw: frozenset = frozenset()
        self.leaves: list[_Sw] = []
        self.all_leaves: list[_Sw] = []
        self.spines: list[_Sw] = []
        self.cores: list[_Sw] = []
        self.up: dict[str, list] = {}
        self.down: dict[str, list] = {}
        self.lat: dict[str, list] = {}
        self.down_to: dict[str, dict[str, tuple]] = {}
        self.pod_spines: dict = {}
        self.spine_cores: dict[str, frozenset] = {}
        self.has_cores = False
        self.leaf_pods: list = []

    @staticmethod
    def live(links: list, failures: Failures) -> list:
        dead_ln, dead_sw = failures.links, failures.switches
        return [(p, n) for p, n, lid in links if lid not in dead_ln and n not in dead_sw]

    @staticmethod
    def ports_by_leaf(down: list) -> dict[str, tuple]:
        by_leaf: dict[str, list] = {}
        for p, n in down:
            by_leaf.setdefault(n, []).append(p)
        return {n: tuple(sorted(ps)) for n, ps in by_leaf.items()}

    @classmethod
    def of(cls, ix: FabricIndex, plane: int, failures: Failures) -> _View:
        v = cls()
        live = cls.live
        v.sws = sws = ix.planes[plane]
        v.dead_sw = dead_sw = failures.switches
        alive = [s for s in sws if s.name not in dead_sw]
        v.leaves = [s for s in alive if s.tier == 1]
        v.all_leaves = [s for s in sws if s.tier == 1]
        v.spines = [s for s in alive if s.tier == 2]
        v.cores = [s for s in alive if s.tier == 3]
        v.up = {s.name: live(s.up, failures) for s in alive}
        v.down = {s.name: live(s.down, failures) for s in alive}
        v.lat = {s.name: live(s.lateral, failures) for s in alive}
        v.down_to = {s.name: cls.ports_by_leaf(v.down[s.name]) for s in v.spines}
        for s in v.spines:
            v.pod_spines.setdefault(s.pod, []).append(s.name)
        v.spine_cores = {s.name: frozenset(n for _, n in v.up[s.name]) for s in v.spines}
        v.has_cores = bool(v.cores)
        v.leaf_pods = sorted({x.pod for x in v.leaves if x.pod is not None})
        return v

    def patched(self, ix: FabricIndex, failures: Failures, touched: set[str]) -> _View:
        """This (healthy) view with only leaves failed and leaf-spine links down: the live lists
        of ``touched`` switches (the failures' ends and neighbours) made anew, the rest shared."""
        v = _View()
        v.__dict__.update(self.__dict__)
        live = _View.live
        v.dead_sw = failures.switches
        v.leaves = [s for s in self.leaves if s.name not in failures.switches]
        v.up, v.down, v.lat, v.down_to = dict(self.up), dict(self.down), dict(self.lat), dict(self.down_to)
        for name in touched:
            if name in failures.switches:
                for m in (v.up, v.down, v.lat, v.down_to):
                    m.pop(name, None)
                continue
            s = ix.sw[name]
            v.up[name], v.down[name], v.lat[name] = (live(s.up, failures), live(s.down, failures),
                                                     live(s.lateral, failures))
            if s.tier == 2:
                v.down_to[name] = _View.ports_by_leaf(v.down[name])
        return v


class _Routing:
    """A plane's routing under some failures: ``result`` (see _plane_actions) and, kept for the
    healthy plane (the base that failures patch): per destination leaf its signature per pod
    (the distances of the pod's spines to it), every spine's and core's action per destination,
    (from ``result``), and per leaf its action per signature and how many destinations each
    action serves."""

    def __init__(self) -> None:
        self.view = _View()
        self.result: dict[str, tuple[tuple, dict]] = {}
        self.dest_sig: dict = {}           # pod -> {destination leaf: signature}
        self.sig_dist: dict = {}           # signature -> {spine: distance}
        self.up_key: dict[str, tuple] = {}          # leaf -> its live uplinks (one shared tuple per layout)
        self.sig_act: dict[str, dict] = {}          # leaf -> {signature: action}
        self.counts: dict[str, Counter] = {}        # leaf -> {action: destinations}
        self.rank: dict[str, int] = {}


def _towards(v: _View, dn: str, memo: dict) -> tuple[dict, list, list]:
    """Routing towards one destination leaf: (the spines' distances to it, [(spine, action)],
    [(core, action)]). Distances: 1 (adjacent), 3 (via a core above it), 4 (via a far core)."""
    dead_sw, up, spine_cores, cores = v.dead_sw, v.up, v.spine_cores, v.cores
    spines_above = frozenset() if dn in dead_sw else frozenset(n for _, n in up[dn])
    cores_above = frozenset(c for s in spines_above for c in spine_cores.get(s, ())) if v.has_cores else frozenset()
    far_cores = frozenset(c.name for c in cores if c.name not in cores_above
                          and any(n in cores_above for _, n in v.lat[c.name])) if cores_above else frozenset()
    dist: dict[str, int] = dict.fromkeys(spines_above, 1)
    if v.has_cores:
        for s in v.spines:
            if s.name not in dist:
                sc = spine_cores[s.name]
                if sc & cores_above:
                    dist[s.name] = 3
                elif sc & far_cores:
                    dist[s.name] = 4
    spine_acts = []
    for s in v.spines:
        ds = dist.get(s.name)
        act: tuple | None
        if ds == 1:
            act = v.down_to[s.name].get(dn, DROP)
        elif ds == 3 or ds == 4:
            target = cores_above if ds == 3 else far_cores
            memo_key: tuple = (s.name, target)
            act = memo.get(memo_key)
            if act is None:
                act = memo[memo_key] = tuple(sorted(p for p, n in up[s.name] if n in target))
        else:
            act = DROP
        spine_acts.append((s.name, act))
    core_acts = []
    for c in cores:
        if c.name in cores_above:
            memo_key = (c.name, "down", spines_above)
            act = memo.get(memo_key)
            if act is None:
                act = memo[memo_key] = tuple(sorted(p for p, n in v.down[c.name] if n in spines_above))
        elif c.name in far_cores:
            memo_key = (c.name, "lat", cores_above)
            act = memo.get(memo_key)
            if act is None:
                act = memo[memo_key] = tuple(sorted(p for p, n in v.lat[c.name] if n in cores_above))
        else:
            act = DROP
        core_acts.append((c.name, act))
    return dist, spine_acts, core_acts


def _signature(v: _View, pod, dist: dict) -> frozenset:
    return frozenset((s, dist[s]) for s in v.pod_spines.get(pod, ()) if s in dist)


def _leaf_act(up_x: tuple, dist: Mapping) -> tuple:
    """A leaf's action towards destinations of one signature: its live uplinks to the nearest spines."""
    best, ports = None, []
    for p, s in up_x:
        ds = dist.get(s)
        if ds is None:
            continue
        if best is None or ds < best:
            best, ports = ds, [p]
        elif ds == best:
            ports.append(p)
    return tuple(sorted(ports))


def _table_value(acts: dict[str, tuple]) -> tuple[tuple, dict]:
    """A spine's or core's (default, exceptions) from its action per destination (leaf order)."""
    table_actions = tuple(acts.values())
    action_counts = Counter(table_actions)
    default = _pick(action_counts, DROP) if action_counts else DROP
    return default, {d: a for d, a in acts.items() if a != default}


def _leaf_value(name: str, counts: Mapping, act_of: Mapping[str, tuple], rank: Mapping[str, int]) -> tuple[tuple, dict]:
    """A leaf's (default, exceptions): the most common action by destinations; its own prefix
    drops (its hosts get /32 routes); exceptions in leaf order. ``act_of``: the action of every
    destination that may differ from the default."""
    default = _pick(counts, DROP) if counts else DROP
    exc = {d: a for d, a in act_of.items() if a != default}
    if default != DROP:
        exc[name] = DROP
    else:
        exc.pop(name, None)
    return default, dict(sorted(exc.items(), key=lambda kv: rank[kv[0]]))


def _routing(ix: FabricIndex, plane: int, failures: Failures) -> _Routing:
    """The plane's routing computed from scratch."""
    r = _Routing()
    r.view = v = _View.of(ix, plane, failures)
    r.rank = {s.name: i for i, s in enumerate(v.all_leaves)}
    full: dict[str, dict[str, tuple]] = {s.name: {} for s in v.spines + v.cores}
    dest_sig: dict = {pod: {} for pod in v.leaf_pods}
    groups: dict = {pod: {} for pod in v.leaf_pods}     # pod -> {signature: [destination, ...]}
    memo: dict[tuple, tuple] = {}
    canon: dict[frozenset, frozenset] = {}
    for d in v.all_leaves:
        dn = d.name
        dist, spine_acts, core_acts = _towards(v, dn, memo)
        for pod in v.leaf_pods:
            sig = _signature(v, pod, dist)
            if sig in r.sig_dist:
                sig = canon[sig]     # one object per signature: later lookups compare by identity
            else:
                r.sig_dist[sig], canon[sig] = dist, sig
            dest_sig[pod][dn] = sig
            groups[pod].setdefault(sig, []).append(dn)
        for s, act in spine_acts:
            full[s][dn] = act
        for c, act in core_acts:
            full[c][dn] = act
    r.dest_sig = dest_sig
    shared: dict = {}     # switches with identical tables (e.g. the spines of a pod) share one value
    for name, acts in full.items():
        key = tuple(acts.values())
        value = shared.get(key)
        if value is None:
            value = shared[key] = _table_value(acts)
        r.result[name] = value
    layouts: dict[tuple, tuple] = {}
    for x in v.leaves:
        up_x = tuple(v.up[x.name])
        up_x = r.up_key[x.name] = layouts.setdefault(up_x, up_x)
        sig_act = r.sig_act[x.name] = {sig: _leaf_act(up_x, r.sig_dist[sig]) for sig in groups[x.pod]}
        counts = r.counts[x.name] = Counter()
        for sig, dests in groups[x.pod].items():
            counts[sig_act[sig]] += len(dests)
        default = _pick(counts, DROP) if counts else DROP
        act_of = {d: a for sig, dests in groups[x.pod].items() if (a := sig_act[sig]) != default for d in dests}
        r.result[x.name] = _leaf_value(x.name, counts, act_of, r.rank)
    return r


def _local(ix: FabricIndex, plane: int, failures: Failures) -> set[str] | None:
    """The switches whose live links a plane's failures change, when those failures are only
    leaves and leaf-spine links (what the patch handles); else None."""
    touched: set[str] = set()
    for lid in failures.links:
        if any(n not in ix.sw for n in lid[:2]):
            continue         # a host's link: no route changes (the host's address is simply not reached)
        ends = [ix.sw[n] for n in lid[:2] if ix.sw[n].plane == plane]
        if not ends:
            continue
        if len(ends) != 2 or {s.tier for s in ends} != {1, 2}:
            return None
        touched.update(s.name for s in ends)
    for name in failures.switches:
        s = ix.sw.get(name)
        if s is None or s.plane != plane:
            continue
        if s.tier != 1:
            return None
        touched.add(name)
        touched.update(n for _p, n, _ in s.up)
    return touched


#: above this many switches whose live links changed, a plane is routed anew instead of patched: the patch
#: costs more per changed switch as they add up. hpn-130k plane 0, leaf-spine links of one spine failed
#: (CPU, one run): 33 changed switches patched 376 ms, anew 519 ms; 65: 1,087 and 572 ms; 513 (the spine's
#: every link): 8,815 and 403 ms. The two give the same actions.
PATCH_LIMIT = 48


def _patched_actions(ix: FabricIndex, plane: int, failures: Failures) -> dict[str, tuple[tuple, dict]]:
    """The same as ``_plane_actions(ix, plane, failures)``, made from the healthy plane's routing:
    only the destinations whose live uplinks changed are routed anew, only the spines and cores
    whose action towards them changed are rebuilt, and a leaf whose uplinks are intact moves only
    those destinations between its actions. Whatever does not change is the healthy value itself
    (the same object). Falls back to the full computation for failures of spines, cores and
    links above the spines (they change the distances towards every destination), and where more
    than ``PATCH_LIMIT`` switches are touched."""
    touched = _local(ix, plane, failures)
    if touched is None or len(touched) > PATCH_LIMIT:
        return _plane_actions(ix, plane, failures)
    h = ix.healthy_routing(plane)
    if not touched:
        return h.result
    v = h.view.patched(ix, failures, touched)
    dests = [d for d in v.all_leaves if d.name in touched]      # leaf order
    result = dict(h.result)
    for name in failures.switches:
        result.pop(name, None)
    memo: dict[tuple, tuple] = {}
    new_sig: dict = {pod: {} for pod in v.leaf_pods}
    sig_dist = ChainMap({}, h.sig_dist)
    moved: dict[str, dict[str, tuple]] = {}      # spine/core -> {destination: new action}
    for d in dests:
        dist, spine_acts, core_acts = _towards(v, d.name, memo)
        for pod in v.leaf_pods:
            sig = _signature(v, pod, dist)
            if sig not in sig_dist:
                sig_dist[sig] = dist
            new_sig[pod][d.name] = sig
        for s, act in spine_acts + core_acts:
            default, exc = h.result[s]
            if exc.get(d.name, default) != act:
                moved.setdefault(s, {})[d.name] = act
    for s, changes in moved.items():
        default, exc = h.result[s]
        acts = {d.name: changes.get(d.name, exc.get(d.name, default)) for d in v.all_leaves}
        result[s] = _table_value(acts)
    act_memo: dict[tuple, tuple] = {}
    layouts: dict[tuple, tuple] = {}

    def leaf_act(up_x: tuple, sig: frozenset) -> tuple:
        key = (id(up_x), sig)
        a = act_memo.get(key)
        if a is None:
            a = act_memo[key] = _leaf_act(up_x, sig_dist[sig])
        return a

    for x in v.leaves:
        old_sig, moving = h.dest_sig[x.pod], new_sig[x.pod]
        if x.name not in touched:
            up_x, sig_act = h.up_key[x.name], h.sig_act[x.name]
            changes = {}
            counts: dict | None = None
            for dn, sig in moving.items():
                was, now = sig_act[old_sig[dn]], leaf_act(up_x, sig)
                if was != now:
                    if counts is None:
                        counts = dict(h.counts[x.name])
                    counts[was] -= 1
                    counts[now] = counts.get(now, 0) + 1
                    changes[dn] = now
            if counts is None:
                continue
            counts = {a: n for a, n in counts.items() if n > 0}
            default, exc = h.result[x.name]
            if (_pick(counts, DROP) if counts else DROP) == default:
                exc = dict(exc)
                fresh = False
                for dn, a in changes.items():
                    if a != default:
                        fresh |= dn not in exc
                        exc[dn] = a
                    else:
                        exc.pop(dn, None)
                if fresh:
                    exc = dict(sorted(exc.items(), key=lambda kv: h.rank[kv[0]]))
                result[x.name] = (default, exc)
                continue
        else:
            up_x = tuple(v.up[x.name])
            up_x = layouts.setdefault(up_x, up_x)    # kept alive: the memo is keyed by its id
        # a leaf whose uplinks changed (or whose default moved): every destination anew
        counts = {}
        act_of = {}
        for dn, sig in old_sig.items():
            a = leaf_act(up_x, moving.get(dn, sig))
            counts[a] = counts.get(a, 0) + 1
            act_of[dn] = a
        default = _pick(counts, DROP) if counts else DROP
        result[x.name] = _leaf_value(x.name, counts, {d: a for d, a in act_of.items() if a != default}, h.rank)
    return result


# ---- aggregation along the address hierarchy --------------------------------------------

def _pick(counts: Mapping, default: tuple) -> tuple:
    """The most common action; ties go to a forwarding action, then ``default``, then the smallest."""
    best = max(counts.values())
    top = [a for a, n in counts.items() if n == best]
    if len(top) == 1:
        return top[0]
    fwd = [a for a in top if a != DROP]
    if not fwd:
        return DROP
    return default if default in fwd else min(fwd)


class _Tree:
    """The address hierarchy of one plane: plane > campus > pod > leaf, as level keys."""

    def __init__(self, ix: FabricIndex, plane: int):
        self.children: dict = {}
        self.parent: dict = {}
        self.path: dict[str, tuple] = {}
        for sw in ix.planes[plane]:
            if sw.tier != 1:
                continue
            self.path[sw.name] = sw.path
            parent = None
            for key in sw.path:
                if key not in self.parent:
                    self.parent[key] = parent
                    self.children.setdefault(parent, []).append(key)
                parent = key
        (self.root,) = self.children[None]


def _compress(tree: _Tree, default: tuple, exceptions: Mapping[str, tuple], forced: Mapping) -> list:
    """[(level key, action)] routes: every level whose action differs from its parent's.

    A level's action is the most common action of its children (a leaf level: the
    switch's action towards that leaf). Only levels above an exception (or a forced
    level) are evaluated; every other level has the default action. ``forced`` fixes the
    action of some levels: a switch's own scope drops what no more specific route claims,
    so addresses that belong to no host can never ping-pong between tiers.
    """
    dirty_kids: dict = {}
    for key in list(forced) + [tree.path[d][-1] for d in exceptions]:
        k = key
        while k is not None:
            parent = tree.parent[k]
            kids = dirty_kids.setdefault(parent, {})
            if k in kids:
                break
            kids[k] = True
            k = parent
    chosen: dict = {}

    def solve(key):
        if key[0] == "leaf":
            a = exceptions.get(key[1], default)
        else:
            kids = dirty_kids.get(key, {})
            counts: dict = {}
            for k in kids:
                sub = solve(k)
                counts[sub] = counts.get(sub, 0) + 1
            clean = len(tree.children[key]) - len(kids)
            if clean:
                counts[default] = counts.get(default, 0) + clean
            a = _pick(counts, default)
        a = forced.get(key, a)
        chosen[key] = a
        return a

    root = tree.root
    root_action = solve(root) if None in dirty_kids else default
    routes = []
    if root_action != DROP:
        routes.append((root, root_action))
    stack = [(root, root_action)]
    while stack:
        key, parent_action = stack.pop()
        kids = dirty_kids.get(key, {})
        if parent_action != default:       # clean children (default action) differ: route each
            for k in tree.children.get(key, ()):
                if k not in kids:
                    routes.append((k, default))
        for k in kids:
            a = chosen[k]
            if a != parent_action:
                routes.append((k, a))
            stack.append((k, a))
    return routes


def _scope(ix: FabricIndex, sw: _Sw) -> dict:
    """Levels a switch drops unless a more specific route says otherwise (see _compress)."""
    if sw.tier == 1:
        return {("leaf", sw.name): DROP}
    node = ix.graph.nodes[sw.name]
    plane, campus = sw.plane, node.get("campus", 0)
    if sw.tier == 2:
        return {("pod", plane, campus, node["pod"]): DROP}
    return {("plane", plane): DROP, ("campus", plane, campus): DROP}


# ---- tables ------------------------------------------------------------------------------

def set_id(ports: tuple) -> int:
    """A next-hop set's metadata value: stable across recompiles (a CRC of its ports)."""
    return zlib.crc32(",".join(map(str, ports)).encode()) & FULL or 1


def avoid_meta(meta: int, index: int) -> int:
    """The metadata that selects next-hop set ``meta`` without its port number ``index``."""
    return meta | (index + 1) << 32


def group_id(buckets: tuple) -> int:
    """A fast-failover group's id: stable across recompiles (a CRC of its bucket ports)."""
    return zlib.crc32(("ff:" + ",".join(map(str, buckets))).encode()) & 0x7FFFFFFF or 1


def _rotation(ports: tuple, i: int, width: int) -> tuple:
    n = len(ports)
    return tuple(ports[(i + k) % n] for k in range(min(n, width)))


def _backups(ports: tuple, i: int, neighbour: Mapping[int, str] | None = None) -> tuple:
    """The buckets of a set's group for pattern i: port i, then up to FF_BACKUPS more of the set in
    rotation from it, those to another neighbour than port i's first (parallel links share their
    neighbour's fate: a failed switch takes them all)."""
    turn = _rotation(ports, i, len(ports))
    if neighbour is not None:
        mine = neighbour.get(turn[0])
        turn = turn[:1] + tuple(q for q in turn[1:] if neighbour.get(q) != mine) + tuple(
            q for q in turn[1:] if neighbour.get(q) == mine)
    return turn[:1 + FF_BACKUPS]


def _pattern_flows(meta_match, bonus: int, i: int, off: int, mask: int, out: tuple) -> tuple:
    return (Flow(TABLE_ENTROPY, PRIO_L4 + bonus, (("metadata", meta_match), ("eth_type", ETH_IPV4),
                                                  ("ip_proto", PROTO_UDP), ("udp_src", (i << off, mask << off))), out),
            Flow(TABLE_ENTROPY, PRIO_L4 + bonus, (("metadata", meta_match), ("eth_type", ETH_IPV4),
                                                  ("ip_proto", PROTO_TCP), ("tcp_src", (i << off, mask << off))), out),
            Flow(TABLE_ENTROPY, PRIO_OTHER + bonus, (("metadata", meta_match), ("eth_type", ETH_IPV4),
                                                     ("ipv4_src", (i, mask))), out))


def _layout(n: int, field: tuple[int, int] | int) -> tuple[int, int, int]:
    """(bits, offset, mask) a set of ``n`` ports reads: ``field`` is its role's (offset, bits)
    from the entropy map; an int (a tier) stands for a lone set (offset 0, its own bits)."""
    if isinstance(field, int):
        return entropy_bits(n), 0, (1 << entropy_bits(n)) - 1
    off, bits = field
    return bits, off, (1 << bits) - 1


def _direction(sw: _Sw, ports: tuple) -> str:
    """"up", "across" or "down": which of the switch's links a next-hop set's ports are."""
    p = ports[0]
    if any(q == p for q, _, _ in sw.up):
        return "up"
    if any(q == p for q, _, _ in sw.lateral):
        return "across"
    return "down"


def entropy_map(g: nx.MultiGraph) -> EntropyMap:
    """Per role (tier and direction), the UDP/TCP source-port bits that choose the port of a
    next-hop set, from the healthy fabric's sets (see ``hpnlab.fabric.transport.entropy``).
    The entropy tables are compiled from it; hosts choose their entropy values from it."""
    ix = index_of(g)
    m = ix.shared.get("entropy_map")
    if m is None:
        sizes: dict[tuple[int, str], list[int]] = {}
        for plane, sws in sorted(ix.planes.items()):
            healthy, _tree = ix.healthy(plane)
            for sw in sws:
                default, exceptions = healthy[sw.name]
                sets = {a for a in (default, *exceptions.values()) if len(a) >= 2}
                if _bounces(sw, ix):
                    sets.add(tuple(sorted(p for p, _, _ in sw.up)))
                for ports in sets:
                    sizes.setdefault((sw.tier, _direction(sw, ports)), []).append(len(ports))
        m = ix.shared["entropy_map"] = lay_out(sizes)
    return m


def _field(ix: FabricIndex, sw: _Sw, ports: tuple) -> tuple[int, int]:
    """The (offset, bits) of the entropy map a next-hop set of ``sw`` reads (a role the healthy
    fabric never has -- none on the presets -- reads its own bits from bit 0)."""
    role = f"{TIER_NAMES.get(sw.tier, f'tier{sw.tier}')}-{_direction(sw, ports)}"
    f = entropy_map(ix.graph).field(role)
    if f is None:
        return 0, entropy_bits(len(ports))
    return f.offset, f.bits


@lru_cache(maxsize=4096)
def entropy_flows(ports: tuple, field: tuple[int, int] | int, meta: int, outs: tuple | None = None) -> tuple:
    """The entropy-table entries of one next-hop set (shared by every switch that has it).

    ``field``: the (offset, bits) its role reads (``entropy_map``). Pattern i goes to
    ``outs[i % n]`` (the actions for that port; default: output to it). They match the low
    32 bits of the metadata, so the set's "avoid" entries (avoid_flows) can override them."""
    n = len(ports)
    bits, off, mask = _layout(n, field)
    outs = outs or tuple((("output", p),) for p in ports)
    flows: list[Flow] = []
    for i in range(1 << bits):
        flows.extend(_pattern_flows((meta, FULL), 0, i, off, mask, outs[i % n]))
    return tuple(flows)


@lru_cache(maxsize=4096)
def avoid_flows(ports: tuple, field: tuple[int, int] | int, meta: int, outs: tuple) -> tuple:
    """For each port j of the set: the patterns that go to j, dealt round-robin over the other
    ports, at a higher priority and matching metadata ``avoid_meta(meta, j)`` exactly."""
    n = len(ports)
    bits, off, mask = _layout(n, field)
    flows: list[Flow] = []
    for j in range(n):
        others = list(range(j + 1, n)) + list(range(j))
        m = avoid_meta(meta, j)
        for k, i in enumerate(range(j, 1 << bits, n)):
            flows.extend(_pattern_flows(m, 1, i, off, mask, outs[others[k % (n - 1)]]))
    return tuple(flows)


# ---- weighted multipath: unequal shares of a set's patterns (fabric/routing/weights.py decides) -----

#: weighted mode: a role's sets read enough bits for at least this many patterns per port of its largest set
WEIGHT_PATTERNS_PER_PORT = 4


def _pext(value: int, mask: int) -> int:
    """The bits of ``value`` under ``mask``, packed from bit 0 (low mask bit first)."""
    out, k = 0, 0
    while mask:
        low = mask & -mask
        if value & low:
            out |= 1 << k
        k += 1
        mask ^= low
    return out


def _pdep(pattern: int, mask: int) -> int:
    """The inverse of :func:`_pext`: ``pattern``'s bits spread over ``mask``'s set bits."""
    out, k = 0, 0
    while mask:
        low = mask & -mask
        if pattern >> k & 1:
            out |= low
        k += 1
        mask ^= low
    return out


def weighted_masks(emap: EntropyMap) -> dict[int, int]:
    """Weighted mode: per source-port mask of a role of the entropy map, the wider mask its sets
    read, so that the role's largest set has ``WEIGHT_PATTERNS_PER_PORT`` patterns per port or
    more. The extra bits are taken from the bits no switch reads in ecmp mode (above the map's
    ``width``), each role its own, in the map's order, as many as fit in the 16-bit port (a role
    that finds none keeps its own patterns: its granularity is then 1 / 2**bits). Roles that share
    bits (the map's ``overlaps``) are not widened."""
    shared = {r for pair in emap.overlaps for r in pair}
    free = emap.width
    out: dict[int, int] = {}
    for f in emap.fields:
        if f.role in shared:
            continue
        want = max(f.bits, (WEIGHT_PATTERNS_PER_PORT * f.radix - 1).bit_length())
        extra = min(want - f.bits, PORT_BITS - free)
        if extra <= 0:
            continue
        out[f.mask] = f.mask | ((1 << extra) - 1) << free
        free += extra
    return out


@dataclass(frozen=True)
class EntropySet:
    """One next-hop set's entropy entries on a switch, read back from its compiled state.

    ``meta``: its metadata value (table 2 matches it under the low-32-bit mask); ``mask``: the
    source-port bits it reads; pattern ``p`` stands for the source ports whose bits under
    ``mask`` are ``p`` (low mask bit first) and goes to port ``assignment[p]``; ``outs``: per
    port of the set (sorted), the actions that send there (its fast-failover group)."""
    meta: int
    mask: int
    ports: tuple[int, ...]
    outs: tuple[tuple, ...]
    assignment: tuple[int, ...]

    @property
    def patterns(self) -> int:
        return len(self.assignment)

    def counts(self, assignment: tuple[int, ...] | None = None) -> dict[int, int]:
        """Patterns per port (of ``assignment``, default the set's own)."""
        a = self.assignment if assignment is None else assignment
        return {p: a.count(p) for p in self.ports}


def _port_of(actions: tuple, groups: Mapping[int, Group]) -> int | None:
    """The port an entropy entry's actions send to (its fast-failover group's primary bucket)."""
    for a in actions:
        if a[0] == "output":
            return a[1]
        if a[0] == "group":
            g = groups.get(a[1])
            if g is not None and g.buckets:
                watch, acts = g.buckets[0]
                return watch if watch is not None else _port_of(acts, groups)
    return None


def _set_entry(f: Flow) -> tuple[int, str, int, int] | None:
    """(meta, field, value, mask) of a set's own entropy entry (not an "avoid" entry), else None."""
    if f.table != TABLE_ENTROPY:
        return None
    meta = field_ = None
    value = mask = 0
    for k, v in f.match:
        if k == "metadata":
            if not isinstance(v, tuple) or v[1] != FULL:
                return None
            meta = v[0]
        elif k in ("udp_src", "tcp_src", "ipv4_src"):
            field_, (value, mask) = k, v
    if meta is None or field_ is None:
        return None
    return meta, field_, value, mask


def entropy_sets(state: SwitchState) -> dict[int, EntropySet]:
    """Every next-hop set of a compiled switch state, by metadata value (see :class:`EntropySet`)."""
    groups = {g.group_id: g for g in state.groups}
    found: dict[int, tuple[int, dict[int, tuple]]] = {}
    for f in state.flows:
        e = _set_entry(f)
        if e is None or e[1] != "udp_src":
            continue
        meta, _, value, mask = e
        found.setdefault(meta, (mask, {}))[1][_pext(value, mask)] = f.actions
    out: dict[int, EntropySet] = {}
    for meta, (mask, acts) in found.items():
        n = len(acts)
        if n != 1 << bin(mask).count("1") or sorted(acts) != list(range(n)):
            continue        # not a whole set (never compiled so): left alone
        port_of: dict[tuple, int] = {}
        for a in set(acts.values()):
            port = _port_of(a, groups)
            if port is not None:
                port_of[a] = port
        if len(port_of) < len(set(acts.values())):
            continue
        by_port = {port_of[a]: a for a in acts.values()}
        ports = tuple(sorted(by_port))
        out[meta] = EntropySet(meta, mask, ports, tuple(by_port[p] for p in ports),
                               tuple(port_of[acts[i]] for i in range(n)))
    return out


@lru_cache(maxsize=65536)
def _weighted_entry(meta_match: int | tuple, prio: int, field_: str, value: int, mask: int, actions: tuple) -> Flow:
    """One entropy entry (one value per arguments, so that equal entries of two compiles are one object)."""
    if field_ == "ipv4_src":
        m: tuple = (("metadata", meta_match), ("eth_type", ETH_IPV4), ("ipv4_src", (value, mask)))
    else:
        proto = PROTO_UDP if field_ == "udp_src" else PROTO_TCP
        m = (("metadata", meta_match), ("eth_type", ETH_IPV4), ("ip_proto", proto), (field_, (value, mask)))
    return Flow(TABLE_ENTROPY, prio, m, actions)


def _set_flows(s: EntropySet, assignment: tuple[int, ...]) -> list[Flow]:
    """A set's own entries for ``assignment`` (pattern p -> port), in pattern order."""
    out_of = dict(zip(s.ports, s.outs, strict=True))
    ip_mask = (1 << bin(s.mask).count("1")) - 1
    flows: list[Flow] = []
    for p, port in enumerate(assignment):
        acts = out_of[port]
        value = _pdep(p, s.mask)
        flows += (_weighted_entry((s.meta, FULL), PRIO_L4, "udp_src", value, s.mask, acts),
                  _weighted_entry((s.meta, FULL), PRIO_L4, "tcp_src", value, s.mask, acts),
                  _weighted_entry((s.meta, FULL), PRIO_OTHER, "ipv4_src", p, ip_mask, acts))
    return flows


def _replace_sets(state: SwitchState, new: Mapping[int, list[Flow]]) -> SwitchState:
    """``state`` with the own entries of the sets in ``new`` (by metadata) replaced where the first stood."""
    if not new:
        return state
    flows: list[Flow] = []
    done: set[int] = set()
    for f in state.flows:
        e = _set_entry(f)
        if e is not None and e[0] in new:
            if e[0] not in done:
                done.add(e[0])
                flows += new[e[0]]
            continue
        flows.append(f)
    return SwitchState(state.name, state.dpid, tuple(flows), state.groups)


def widened(state: SwitchState, masks: Mapping[int, int]) -> SwitchState:
    """Weighted mode's tables of a switch: every set whose mask ``masks`` widens (``weighted_masks``)
    reads the wider mask, each new pattern going where its map bits went (equal shares, the same
    ports as ecmp mode for every source port). So that a set's "avoid port j" entries (which read
    only the map's bits) never fall through to a weighted entry that sends to port j, they are
    completed: every pattern that does not go to j gets an avoid entry to its own port."""
    sets = entropy_sets(state)
    new: dict[int, list[Flow]] = {}
    for meta, s in sets.items():
        wide = masks.get(s.mask)
        if wide is None:
            continue
        base = tuple(s.assignment[_pext(_pdep(p, wide), s.mask)] for p in range(1 << bin(wide).count("1")))
        flows = _set_flows(EntropySet(meta, wide, s.ports, s.outs, base), base)
        ip_mask = (1 << bin(s.mask).count("1")) - 1
        for j, port in enumerate(s.ports):
            am = avoid_meta(meta, j)
            for i, to in enumerate(s.assignment):
                if to != port:
                    acts = s.outs[s.ports.index(to)]
                    v = _pdep(i, s.mask)
                    flows += (_weighted_entry(am, PRIO_L4 + 1, "udp_src", v, s.mask, acts),
                              _weighted_entry(am, PRIO_L4 + 1, "tcp_src", v, s.mask, acts),
                              _weighted_entry(am, PRIO_OTHER + 1, "ipv4_src", i, ip_mask, acts))
        new[meta] = flows
    return _replace_sets(state, new)


def weighted(state: SwitchState, assignments: Mapping[int, tuple[int, ...]]) -> SwitchState:
    """``state`` with the sets named in ``assignments`` (metadata -> port per pattern, as many
    patterns as the set has) sending pattern p to port ``assignment[p]``. Entries that do not
    change stay the same objects (the reconciler diffs by identity first)."""
    sets = entropy_sets(state)
    new: dict[int, list[Flow]] = {}
    for meta, a in assignments.items():
        s = sets.get(meta)
        if s is None or len(a) != s.patterns or not set(a) <= set(s.ports) or a == s.assignment:
            continue
        new[meta] = _set_flows(s, tuple(a))
    return _replace_sets(state, new)


def dead_ports(g: nx.MultiGraph, failures: Failures) -> dict[str, set[int]]:
    """Per live switch, its ports whose link or neighbour has failed."""
    return _dead_ports(index_of(g), failures)


#: a leaf's ARP entry below its responders: what they do not answer goes to the controller
ARP_TO_CONTROLLER = Flow(TABLE_CLASSIFY, PRIO_ARP, (("eth_type", ETH_ARP),), (("controller",),))
_CLASSIFY_LEAF = (ARP_TO_CONTROLLER,
                  Flow(TABLE_CLASSIFY, PRIO_IPV4, (("eth_type", ETH_IPV4),), (("goto", TABLE_ROUTE),)))
_CLASSIFY_OTHER = (Flow(TABLE_CLASSIFY, PRIO_IPV4, (("eth_type", ETH_IPV4),), (("goto", TABLE_ROUTE),)),)
_MARKED_TO_BOUNCED = Flow(TABLE_CLASSIFY, PRIO_MARKED, (("eth_type", ETH_IPV4), ("eth_src", BOUNCE_MAC)),
                          (("goto", TABLE_BOUNCED),))
_MARKED_DROP = Flow(TABLE_CLASSIFY, PRIO_MARKED_DROP, (("eth_type", ETH_IPV4), ("eth_src", BOUNCE_MAC)), ())


def arp_responders(ix: FabricIndex, leaf: str, arp: str = DEFAULT_ARP) -> tuple[Flow, ...]:
    """The ARP responder flows of a leaf (table 0, above the ARP-to-controller entry): a request
    from one of its host ports is turned into the reply in the switch and sent back out of the port
    it came in on. Anything else (a reply, a probe from 0.0.0.0, an address outside the plane, an
    address of no host in per-host mode) still goes to the controller. Built once per graph.

    ``arp`` "gateway": per host port two flows, whatever the plane's size. A request from the
    host's own address (``arp_spa``) for any address of its plane (``arp_tpa`` under the plane
    prefix, the host's on-link subnet) is answered "that address is at GATEWAY_MAC": the asked
    address is moved into ``arp_spa`` (the one move action), the rest set from the address plan
    (the asker behind each port is known). The host then sends everything of its plane to the
    gateway MAC, and the leaf in front of the receiver writes the receiver's MAC back (its host
    routes, see ``_switch_state``). Above it, the host asking for its own address (an
    announcement) goes to the controller, which does not answer it: a reply would look like an
    address conflict to the host.

    ``arp`` "per-host": per host port and each other host address of its plane (in_port, arp_op 1,
    arp_tpa) the reply with the target's real MAC (which ``arp_answer`` gives too), set-field only.
    None when the leaf would need more than ``ARP_RESPONDER_MAX_FLOWS`` (planes of thousands of
    hosts)."""
    if arp not in ARP_MODES:
        raise UserError(f"unknown ARP mode {arp!r}: use one of {', '.join(ARP_MODES)}")
    cache = ix.shared.setdefault(("arp_responders", arp), {})
    flows = cache.get(leaf)
    if flows is not None:
        return flows
    sw = ix.sw[leaf]
    if arp == "gateway":
        cache[leaf] = flows = tuple(f for asker in sw.hosts for f in _gateway_responder(ix, sw, asker))
        return flows
    plane_hosts = cache.get(("plane", sw.plane))
    if plane_hosts is None:      # counted once per plane (130k hosts a plane at full scale)
        plane_hosts = cache["plane", sw.plane] = sum(len(other.hosts) for other in ix.planes[sw.plane])
    if len(sw.hosts) * max(plane_hosts - 1, 0) > ARP_RESPONDER_MAX_FLOWS:
        cache[leaf] = ()
        return ()
    peers = [h for other in ix.planes[sw.plane] if other.tier == 1 for h in other.hosts]
    out = []
    for asker in sw.hosts:
        for target in peers:
            if target.ip == asker.ip:
                continue
            match = (("arp_op", ARP_REQUEST), ("arp_tpa", target.ip), ("eth_type", ETH_ARP), ("in_port", asker.port))
            actions = (("set_field", "eth_dst", asker.mac), ("set_field", "eth_src", target.mac),
                       ("set_field", "arp_op", ARP_REPLY), ("set_field", "arp_sha", target.mac),
                       ("set_field", "arp_spa", target.ip), ("set_field", "arp_tha", asker.mac),
                       ("set_field", "arp_tpa", asker.ip), ("output", OFPP_IN_PORT))
            out.append(Flow(TABLE_CLASSIFY, PRIO_ARP_RESPONDER, match, actions))
    cache[leaf] = flows = tuple(out)
    return flows


def with_arp(g: nx.MultiGraph, state: SwitchState, mode: str, compiled: str = DEFAULT_ARP) -> SwitchState:
    """A leaf's ``state`` (compiled with ARP mode ``compiled``) answering ARP in ``mode`` instead: only
    its responder flows change (the last-hop routes are the same in both modes). One value per state,
    so that a state the compile reused stays the same object and diffs skip it. The per-leaf ARP
    fallback's (controller/arp_fallback.py: a switch that rejects the gateway design's actions)."""
    ix = index_of(g)
    sw = ix.sw.get(state.name)
    if mode == compiled or sw is None or sw.tier != 1:
        return state
    memo = ix.shared.setdefault(("with_arp", compiled, mode), {})
    if len(memo) > 4 * len(ix.sw):       # bounded in a long-running controller
        memo.clear()
    hit = memo.get(id(state))
    if hit is not None and hit[0] is state:
        return hit[1]
    old = {f.key() for f in arp_responders(ix, sw.name, compiled)}
    flows = tuple(f for f in state.flows if f.key() not in old) + arp_responders(ix, sw.name, mode)
    out = SwitchState(state.name, state.dpid, flows, state.groups)
    memo[id(state)] = (state, out)
    return out


def _gateway_responder(ix: FabricIndex, sw: _Sw, asker: HostPort) -> tuple[Flow, Flow]:
    """Gateway mode's two flows for one host port (see ``arp_responders``)."""
    plane_net, plane_len = ix.level_prefix[("plane", sw.plane)]
    own = Flow(TABLE_CLASSIFY, PRIO_ARP_OWN, (("arp_op", ARP_REQUEST), ("arp_tpa", asker.ip), ("eth_type", ETH_ARP),
                                              ("in_port", asker.port)), (("controller",),))
    match = (("arp_op", ARP_REQUEST), ("arp_spa", asker.ip), ("arp_tpa", (plane_net, _mask(plane_len))),
             ("eth_type", ETH_ARP), ("in_port", asker.port))
    actions = (("move", "arp_tpa", "arp_spa"), ("set_field", "arp_tpa", asker.ip),
               ("set_field", "arp_tha", asker.mac), ("set_field", "arp_sha", GATEWAY_MAC),
               ("set_field", "arp_op", ARP_REPLY), ("set_field", "eth_dst", asker.mac),
               ("set_field", "eth_src", GATEWAY_MAC), ("output", OFPP_IN_PORT))
    return own, Flow(TABLE_CLASSIFY, PRIO_ARP_RESPONDER, match, actions)


def _route_match(prefix: tuple[int, int]) -> tuple:
    net, length = prefix
    if length == 32:
        return (("eth_type", ETH_IPV4), ("ipv4_dst", net))
    return (("eth_type", ETH_IPV4), ("ipv4_dst", (net, _mask(length))))


def _bounces(sw: _Sw, ix: FabricIndex) -> bool:
    """Does ``sw`` send packets that come down to it for someone else back up (avoiding the sender)?"""
    return sw.tier in (1, 2) and len(sw.up) >= 2 and (sw.tier == 1 or any(ix.sw[n].tier == 3 for _, n, _ in sw.up))


def _returns(ix: FabricIndex, sw: _Sw) -> bool:
    """May ``sw`` send a packet it cannot forward back where it came from? Only if it has nothing
    above it and every neighbour below bounces what comes down to it for someone else (a two-tier
    fabric's spine; a core whose spines each have two cores or more): the sender then sends it up
    another way, marked, and a marked packet never takes a detour, so it cannot come back. What a
    core sends back over a long-haul link, the far core detours down to its own spines instead of
    sending it back again (:func:`_returned_flows`). A spine under cores: :func:`_returns_below`."""
    return (not sw.up and bool(sw.down)
            and all(_bounces(ix.sw[n], ix) for _, n, _ in sw.down))


def _core_pods(ix: FabricIndex, core: str) -> dict:
    """A core's spines per pod below it (computed once per core)."""
    memo = ix.shared.setdefault("core_pods", {})
    pods = memo.get(core)
    if pods is None:
        by_pod: dict = {}
        for _p, n, _k in ix.sw[core].down:
            by_pod.setdefault(ix.sw[n].pod, set()).add(n)
        pods = memo[core] = {pod: frozenset(names) for pod, names in by_pod.items()}
    return pods


def _forwards_anyway(ix: FabricIndex, sw: _Sw) -> bool:
    """Does spine ``sw`` end its groups down with a bucket out of the port itself, live or not,
    instead of back where the packet came from? Where some core above reaches ``sw``'s pod through
    ``sw`` alone (a fat-tree's aggregation switch; a pod with one spine): what such a core brought
    down and got back would have no way left into the pod but down another pod and up again, a
    second down-up turn after the one at ``sw`` (a buffer-dependency risk in a lossless fabric). A
    spine that sees none of its ports live yet gets packets only over links its neighbours see
    live (a switch coming back: its BFD sessions come up a little after theirs); its way down is
    then most likely up too, and the packet goes there, turning nowhere."""
    if sw.tier != 2 or not sw.down:
        return False
    return any(ix.sw[c].tier == 3 and _core_pods(ix, c).get(sw.pod) == {sw.name} for _p, c, _k in sw.up)


def _ending(ix: FabricIndex, sw: _Sw) -> Callable[[int], str | None]:
    """How ``sw``'s groups out of a port end (:meth:`_Protection._end`): a spine whose way down
    :func:`_forwards_anyway` "anyway" for its ports down; else "back" where it may send back what
    it cannot forward (:func:`_returns`, :func:`_returns_below`); else nothing."""
    if sw.tier == 1:
        return lambda _port: "anyway"
    back = "back" if _returns(ix, sw) or _returns_below(ix, sw) else None
    if not _forwards_anyway(ix, sw):
        return lambda _port: back
    down = {p for p, _n, _k in sw.down}
    return lambda port: "anyway" if port in down else back


def _deep(ix: FabricIndex, sw: _Sw) -> bool:
    """Must core ``sw`` detour *deep*? A core's one-port way down into a pod goes through the one
    spine of that pod it is wired to. Its detour is a spine of another pod, which bounces the
    packet up one of its other cores. Where every such core also has that same spine as its only
    way into the pod (a fat-tree: the cores of an aggregation switch's group each reach a pod
    through that pod's switch of the group alone), a failed spine leaves the bounce nowhere to go:
    every core of the group loses the pod at once. Then the core marks the packet ``DEEP_MAC``
    instead, and the spine it reaches sends it down to one of its leaves (table 0, ``PRIO_DEEP``),
    which bounces it up another spine of its own pod, marked (a spine of another group, so up
    other cores, which reach the pod through another of its spines). A packet is marked deep
    once, by a core, and bounced once, by that leaf: it cannot loop. Only spines whose leaves have
    another spine to bounce up count (a pod with one spine, over parallel links, has none: there
    a plain detour is all a failed link needs, and a failed spine leaves its pod unreachable)."""
    if sw.tier != 3:
        return False
    down = {n: ix.sw[n] for _p, n, _k in sw.down}

    def beside(n: _Sw) -> bool:
        """Can a leaf under spine n bounce a packet up another spine of its pod?"""
        return any(m != n.name for _p, leaf, _k in n.down for _q, m, _k2 in ix.sw[leaf].up)

    for t in down.values():
        others = [n for n in down.values() if n.pod != t.pod and _bounces(n, ix) and beside(n)]
        for n in others:
            cores = [ix.sw[c] for _p, c, _k in n.up if c != sw.name and ix.sw[c].tier == 3]
            if cores and all({m for _p, m, _k in c.down if ix.sw[m].pod == t.pod} == {t.name} for c in cores):
                return True
    return False


def _deep_target(ix: FabricIndex, sw: _Sw) -> bool:
    """Does spine ``sw`` get packets a core detours deep (see :func:`_deep`)?"""
    return sw.tier == 2 and any(_deep(ix, ix.sw[c]) for _p, c, _k in sw.up if ix.sw[c].tier == 3)


def _returns_below(ix: FabricIndex, sw: _Sw) -> bool:
    """May spine ``sw``, under cores, send a packet it cannot forward back where it came from? Yes
    when every neighbour below bounces and every neighbour above is a core. A neighbour below
    bounces what it gets back (or drops it, if it is marked already). A core that gets back what it
    brought down sends it into the pod by its other spines (:func:`_returned_flows`), or drops it:
    its route would send it down the link it came back by, and OpenFlow skips an output to the
    ingress port. Where a core reaches the pod through ``sw`` alone, ``sw`` does not send back
    what comes down (:func:`_forwards_anyway`). What a core marked deep never comes back this way
    (the deep group has no such bucket)."""
    if sw.tier != 2 or not sw.down or sw.lateral:
        return False
    return (all(ix.sw[n].tier == 3 for _p, n, _k in sw.up) and bool(sw.up)
            and all(_bounces(ix.sw[n], ix) for _p, n, _k in sw.down))


def _returned_ways(ix: FabricIndex, sw: _Sw, hacts: tuple) -> list[tuple[tuple[int, ...], tuple, tuple]]:
    """Core ``sw``'s ways for what a spine below sends back (:func:`_returned_flows`): per spine t
    that may (:func:`_returns_below`, and not :func:`_forwards_anyway`), (t's ports, t's pod prefix
    match, the core's way into the pod without t's ports)."""
    if sw.tier != 3:
        return []
    default, exceptions = hacts
    out = []
    by_spine: dict[str, list[int]] = {}
    for p, n, _k in sw.down:
        by_spine.setdefault(n, []).append(p)
    for n, ports in by_spine.items():
        t = ix.sw[n]
        if not _returns_below(ix, t) or _forwards_anyway(ix, t):
            continue
        ways = {exceptions.get(d, default) for _q, d, _k2 in t.down}
        if len(ways) != 1:
            continue
        (way,) = ways
        rest = tuple(q for q in way if q not in ports)
        if rest and len(rest) < len(way):
            own = ix.level_prefix[next(iter(_scope(ix, t)))]
            out.append((tuple(sorted(ports)), _route_match(own), rest))
    return out


class _Protection:
    """What a switch holds whatever fails: computed once per graph from its healthy compile.

    metas    healthy next-hop set -> metadata value (its entropy entries are always installed)
    groups   bucket ports -> fast-failover Group
    single   port -> the actions of a one-port choice (its detour group, or a plain output)
    encoded  next-hop set -> route actions, for every set met so far that needs no new entries
    flows    table-0 entries (bounce, marked packets), entropy entries of the healthy sets
             with their avoid entries, and the bounced-packet table (table 3)
    """

    def __init__(self) -> None:
        self.metas: dict[tuple, int] = {}
        self.groups: dict[tuple, Group] = {}
        self.single: dict[int, tuple] = {}
        self.encoded: dict[tuple, tuple | None] = {}
        self.flows: tuple = ()
        self.group_values: tuple = ()
        self.meta_values: set[int] = set()
        self.group_ids: set[int] = set()

    def _interned(self, key: tuple, shared: dict, buckets: Callable[[], tuple], kind: str = "ff") -> tuple:
        """The group action for ``key``: one group (fast-failover unless ``kind`` says) per switch
        and key (its id a CRC of the key, probed on past a collision inside the switch), shared
        between switches."""
        g = self.groups.get(key)
        if g is None:
            gid = group_id(key)
            while gid in self.group_ids:
                gid = gid % 0x7FFFFFFF + 1
            self.group_ids.add(gid)
            g = shared.get((gid, key))
            if g is None:
                g = shared[gid, key] = Group(gid, kind, buckets())
            self.groups[key] = g
        return (("group", g.group_id),)

    def _end(self, shared: dict, end: str | None, port: int) -> tuple:
        """The last bucket of a group (``end``, see :func:`_ending`): None, none; "back", out of the
        port the packet came in on (:meth:`back`); "anyway", out of ``port`` live or not. Both
        watch the indirect group of :meth:`back`, which is always live (Open vSwitch refuses a
        fast-failover bucket that watches nothing)."""
        if end is None:
            return ()
        ((_, gid),) = self.back(shared)
        if end == "back":
            return ((("group", gid), (("group", gid),)),)
        if end == "anyway":
            return ((("group", gid), (("output", port),)),)
        raise ValueError(f"unknown group end {end!r}")

    def group(self, buckets: tuple, shared: dict, end: str | None = None, detours: tuple = ()) -> tuple:
        """A fast-failover group over ``buckets`` (ports), then ``detours`` (each clearing in_port
        first, as in :meth:`detour`), then its ``end`` (:meth:`_end`, of the first port)."""
        key = buckets + ((("detours", *detours),) if detours else ()) + (((end,),) if end else ())
        tail = self._end(shared, end, buckets[0])      # here, not in the lambda: the switch holds its group
        return self._interned(key, shared, lambda: tuple((q, (("output", q),)) for q in buckets) + tuple(
            (q, (("set_field", "in_port", 0), ("output", q))) for q in detours) + tail)

    def detour(self, port: int, detours: tuple, shared: dict, end: str | None = None, deep: bool = False) -> tuple:
        """A one-port choice's fast-failover group: [that port, then its detours]. A detour may
        lead back to the switch the packet came from (a spine's detour for a dead way down to a
        leaf is another leaf, and packets from that leaf take it too): OpenFlow drops an output
        to the ingress port, so each detour bucket first sets in_port to 0 (Open vSwitch takes
        that as an NXM load, as ``ovs-actions(7)`` describes for this case). That leaf bounces
        the packet up another spine as it would any other's.

        ``end`` "back" (see :func:`_returns`) adds a last bucket that sends the packet back out of
        the port it came in on when the port and every detour are dead: the sender bounces it.
        That is the state of a spine coming back from a failure: its leaves may see a link live
        before it does (a BFD session comes up on one end first), and they send it traffic while it
        sees no port live at all. ``end`` "anyway" (see :func:`_forwards_anyway`) instead sends it
        out of the port itself, live or not.

        With ``deep`` (a core, see :func:`_deep`) each detour bucket also marks the packet
        ``DEEP_MAC``."""
        key = ("detour", port, *detours) + ((end,) if end else ()) + (("deep",) if deep else ())
        mark = (("set_field", "eth_src", DEEP_MAC),) if deep else ()
        tail = self._end(shared, end, port)      # here, not in the lambda: the switch holds its group
        return self._interned(key, shared, lambda: ((port, (("output", port),)),) + tuple(
            (q, mark + (("set_field", "in_port", 0), ("output", q))) for q in detours) + tail)

    def returned(self, port: int, detours: tuple, shared: dict) -> tuple:
        """The detours of a one-port choice alone (see :func:`_returned_flows`): the group of
        :meth:`detour` without its first bucket, and with no way back."""
        key = ("returned", port, *detours)
        return self._interned(key, shared, lambda: tuple(
            (q, (("set_field", "in_port", 0), ("output", q))) for q in detours))

    def back(self, shared: dict) -> tuple:
        """The indirect group that sends a packet back out of the port it came in on (OFPP_IN_PORT)."""
        return self._interned(("back",), shared, lambda: ((None, (("output", OFPP_IN_PORT),)),), kind="indirect")

    def set_outs(self, ports: tuple, shared: dict, end: str | None = None, detours: tuple = (),
                 neighbour: Mapping[int, str] | None = None) -> tuple:
        """The entropy actions of a set: pattern i -> FF group [port i, then the next ports of the set
        (those to other neighbours first, see :func:`_backups`), then ``detours``, then ``end``]."""
        return tuple(self.group(_backups(ports, i, neighbour), shared, end, detours) for i in range(len(ports)))

    def encode(self, ports: tuple) -> tuple | None:
        """Route actions for a next-hop set from what is installed anyway, or None (needs new entries)."""
        if ports in self.encoded:
            return self.encoded[ports]
        act: tuple | None = None
        if not ports:
            act = DROP
        elif ports in self.metas:
            act = (("metadata", self.metas[ports]), ("goto", TABLE_ENTROPY))
        elif len(ports) == 1 and ports[0] in self.single:
            act = self.single[ports[0]]
        else:
            have = set(ports)
            for full, meta in sorted(self.metas.items()):
                if len(full) == len(ports) + 1 and have.issubset(full):
                    (gone,) = [i for i, p in enumerate(full) if p not in have]
                    act = (("metadata", avoid_meta(meta, gone)), ("goto", TABLE_ENTROPY))
                    break
            if act is None and len(ports) == 1:
                act = (("output", ports[0]),)
        self.encoded[ports] = act
        return act


def _detours(ix: FabricIndex, sw: _Sw, ports: list[int]) -> dict[int, tuple]:
    """For each one-port choice of ``sw``: where it sends what it would send out of that port
    when the port is dead -- switches below it that bounce such packets back up avoiding it
    (see _bounces), up to DETOURS of them, in rotation from the port's place."""
    below = [(p, ix.sw[n]) for p, n, _ in sw.down if _bounces(ix.sw[n], ix)]
    target = {p: ix.sw[n] for p, n, _ in sw.down}
    up = {p for p, _, _ in sw.up}
    below_ports = [p for p, _ in below]
    out: dict[int, tuple] = {}
    lateral = {p for p, _, _ in sw.lateral}
    for port in ports:
        t = target.get(port)
        if t is None and not (sw.tier == 2 and port in up) and not (sw.tier == 3 and port in lateral):
            continue
        start = bisect.bisect_left(below_ports, port)
        picked: list[int] = []
        for k in range(len(below)):      # in rotation from the port's place; stops after DETOURS
            p, n = below[(start + k) % len(below)]
            if t is None or (n is not t and (sw.tier != 3 or n.pod != t.pod)):
                picked.append(p)
                if len(picked) == DETOURS:
                    break
        out[port] = tuple(picked)
    return out


def _protect(ix: FabricIndex, sw: _Sw, hacts: tuple, tree: _Tree) -> _Protection:
    """A switch's protection; switches alike (same healthy actions or next-hop sets, same
    ports to the same neighbours) share one value."""
    default, exceptions = hacts
    up = tuple((p, n) for p, n, _ in sw.up)
    if sw.tier == 1:
        key: tuple = (1, frozenset((default, *exceptions.values())), up)
    else:
        key = (sw.tier, id(hacts), up, tuple((p, n) for p, n, _ in sw.down),
               tuple((p, n) for p, n, _ in sw.lateral), tuple(_scope(ix, sw)))
    pr = ix.shared.get(("protection", key))
    if pr is None:
        pr = ix.shared["protection", key] = _protect_new(ix, sw, hacts, tree)
    return pr


def _protect_new(ix: FabricIndex, sw: _Sw, hacts: tuple, tree: _Tree) -> _Protection:
    shared = ix.shared
    pr = _Protection()
    default, exceptions = hacts
    actions = {default, *exceptions.values()}
    sets = {a for a in actions if len(a) >= 2}
    up = tuple(sorted(p for p, _, _ in sw.up))
    bounce: list[tuple[int, tuple]] = []
    if _bounces(sw, ix):
        sets.add(up)
        parent_ports: dict[str, list[int]] = {}
        for p, parent, _ in sw.up:
            parent_ports.setdefault(parent, []).append(p)
        for p, parent, _ in sw.up:
            gone = set(parent_ports[parent])
            rest = tuple(q for q in up if q not in gone)
            bounce.append((p, rest))
            if len(rest) >= 2 and len(rest) + 1 != len(up):
                sets.add(rest)
    for _ports, _match, rest in _returned_ways(ix, sw, hacts):
        if len(rest) >= 2 and len(rest) + 1 not in {len(a) for a in sets if set(rest) < set(a)}:
            sets.add(rest)       # a way without a spine's parallel links: its own entries
    for ports in sorted(sets):
        meta = set_id(ports)
        while meta in pr.meta_values:   # a CRC collision inside one switch: probe on
            meta = (meta + 1) & FULL or 1
        pr.metas[ports] = meta
        pr.meta_values.add(meta)
    up_meta = pr.metas.get(up)
    singles = sorted(a[0] for a in actions if len(a) == 1)
    lateral = {p for p, _n, _k in sw.lateral}
    detours = _detours(ix, sw, singles + sorted({s[0] for s in sets if s[0] in lateral}))
    deep = _deep(ix, sw)
    neighbour = {p: n for p, n, _k in sw.up + sw.down + sw.lateral}
    ending = _ending(ix, sw)
    for p in singles:
        d = detours.get(p, ())
        end = ending(p)
        # no detour: a plain output, unless the switch may send back (a pod with one leaf: its spine
        # sends back to the core, which takes the pod's other spines)
        pr.single[p] = pr.detour(p, d, shared, end, deep) if d or end == "back" else (("output", p),)
    flows: list[Flow] = _returned_flows(ix, sw, hacts, pr)
    if sw.tier == 1:
        flows.extend(_CLASSIFY_LEAF)
    else:
        flows.extend(_CLASSIFY_OTHER)
        flows.append(_MARKED_TO_BOUNCED)
        if _deep_target(ix, sw):     # down to a leaf that bounces it, unmarked (it comes down an uplink)
            leaves = tuple(sorted(p for p, n, _ in sw.down if _bounces(ix.sw[n], ix)))
            if leaves:
                flows.append(Flow(TABLE_CLASSIFY, PRIO_DEEP, (("eth_type", ETH_IPV4), ("eth_src", DEEP_MAC)),
                                  (("set_field", "eth_src", GATEWAY_MAC),)
                                  + pr.group(leaves[:1 + FF_BACKUPS], shared)))
    if bounce:
        if sw.tier == 1:
            flows.append(_MARKED_DROP)
        for p, rest in bounce:
            if up_meta is not None and len(rest) + 1 == len(up):
                act: tuple | None = (("metadata", avoid_meta(up_meta, up.index(p))), ("goto", TABLE_ENTROPY))
            else:
                act = pr.encode(rest)
            if act is None:
                act = DROP
            flows.append(Flow(TABLE_CLASSIFY, PRIO_BOUNCE, (("in_port", p), ("eth_type", ETH_IPV4)),
                              (("set_field", "eth_src", BOUNCE_MAC),) + act if act else ()))
    for ports, meta in pr.metas.items():
        # a set across long-haul links detours as its one-port kind does (every link to a far core
        # dead: that core failed); sets up and down do not (the rotation holds another neighbour)
        outs = pr.set_outs(ports, shared, ending(ports[0]),
                           detours.get(ports[0], ()) if ports[0] in lateral else (), neighbour)
        field = _field(ix, sw, ports)
        flows.extend(entropy_flows(ports, field, meta, outs))
        flows.extend(avoid_flows(ports, field, meta, outs))
    if sw.tier >= 2:
        # bounced (marked) packets: the healthy routes, fast failover only inside a next-hop set
        by_prefix: dict = {}
        for level, ports in _compress(tree, default, exceptions, _scope(ix, sw)):
            by_prefix[ix.level_prefix[level]] = ports
        for prefix, ports in by_prefix.items():
            if len(ports) >= 2:
                end = ending(ports[0])
                act = pr.group(_backups(ports, 0, neighbour), shared, end if end == "anyway" else None)
            else:
                act = tuple(("output", p) for p in ports)
            flows.append(Flow(TABLE_BOUNCED, PRIO_ROUTE_BASE + prefix[1], _route_match(prefix), act))
    pr.flows = tuple(flows)
    pr.group_values = tuple(sorted(pr.groups.values()))
    return pr


def _returned_flows(ix: FabricIndex, sw: _Sw, hacts: tuple, pr: _Protection) -> list[Flow]:
    """A core's table-0 entries for what a neighbour sent back because it could not forward it.

    From spine t (:func:`_returns_below`), a packet for t's own pod: it never comes up otherwise
    (a spine sends up only what is for outside its pod). The core's way into the pod would send it
    back down to t, an output to the ingress port, which OpenFlow skips (or, over a parallel link,
    back to t again): the core takes its way without t's links instead, marked bounced (a marked
    packet is never sent back by a spine's table 3: no ping-pong between two spines coming back
    at once). Where t is the core's only way into the pod, t never sends back what comes from
    above (:func:`_forwards_anyway`): any other way would turn twice.

    From far core c over a long-haul link (:func:`_returns`), a packet for c's campus: it never
    comes that way otherwise. The core detours it down to its spines (which bounce it up another
    core, to another core of c's campus), as its own way to c does when that way is dead; with no
    such spine it is dropped here rather than sent over a parallel link back to c."""
    if sw.tier != 3:
        return []
    out = []
    for ports, match, rest in _returned_ways(ix, sw, hacts):
        act = pr.encode(rest)
        if act:
            for p in ports:
                out.append(Flow(TABLE_CLASSIFY, PRIO_RETURNED, (("in_port", p),) + match,
                                (("set_field", "eth_src", BOUNCE_MAC),) + act))
    for q, c, _k in sw.lateral:
        far = ix.sw[c]
        if not _returns(ix, far):
            continue
        detours = _detours(ix, sw, [q]).get(q, ())
        act = pr.returned(q, detours, ix.shared) if detours else DROP
        campus = ix.level_prefix[("campus", far.plane, ix.graph.nodes[c].get("campus", 0))]
        out.append(Flow(TABLE_CLASSIFY, PRIO_RETURNED, (("in_port", q),) + _route_match(campus), act))
    return out


def _own_flow(ix: FabricIndex, sw: _Sw) -> tuple:
    """A bouncing switch's table-0 entry that routes its own prefix (or pod) as usual."""
    if not _bounces(sw, ix):
        return ()
    own = sw.prefix if sw.prefix is not None else ix.level_prefix[next(iter(_scope(ix, sw)))]
    return (Flow(TABLE_CLASSIFY, PRIO_OWN, _route_match(own), (("goto", TABLE_ROUTE),)),)


def _fresh(pr: _Protection, ports: tuple, field: tuple[int, int], metas: dict, groups: dict, flows: list) -> tuple:
    """A next-hop set no installed entries serve: its own metadata, entropy entries and groups."""
    meta = metas.get(ports)
    if meta is None:
        meta = set_id(ports)
        while meta in pr.meta_values or meta in metas.values():
            meta = (meta + 1) & FULL or 1
        metas[ports] = meta
        outs = []
        for i in range(len(ports)):
            buckets = _rotation(ports, i, 1 + FF_BACKUPS)
            g = pr.groups.get(buckets) or groups.get(buckets)
            if g is None:
                gid = group_id(buckets)
                while gid in pr.group_ids or any(x.group_id == gid for x in groups.values()):
                    gid = gid % 0x7FFFFFFF + 1
                g = groups[buckets] = Group(gid, "ff", tuple((q, (("output", q),)) for q in buckets))
            outs.append((("group", g.group_id),))
        flows.extend(entropy_flows(ports, field, meta, tuple(outs)))
    return (("metadata", meta), ("goto", TABLE_ENTROPY))


def _keep_detours(acts: tuple, hacts: tuple, dead: set, pr: _Protection, rank: Mapping[str, int]) -> tuple:
    """A switch whose one-port way to a destination died keeps that route: its fast-failover
    group detours (the upstream switches stop sending there once they converge), so the
    controller's update never turns a detour into a drop."""
    default, exc = acts
    hdef, hexc = hacts

    def keep(f: tuple, h: tuple) -> tuple:
        if f == DROP and len(h) == 1 and h[0] in dead and pr.single.get(h[0], ((None,),))[0][0] == "group":
            return h
        return f

    new_default = keep(default, hdef)
    dests = sorted(set(exc) | set(hexc), key=rank.__getitem__)     # in leaf order, as every exceptions dict
    every = {d: keep(exc.get(d, default), hexc.get(d, hdef)) for d in dests}
    if (new_default == hdef or len(dests) == len(rank)) and all(a == hexc.get(d, hdef) for d, a in every.items()):
        return hacts      # every destination as healthy (its default may have moved): the healthy value
    return new_default, {d: a for d, a in every.items() if a != new_default}


def _switch_state(ix: FabricIndex, sw: _Sw, acts: tuple, policy: str, tree: _Tree,
                  block_cache: dict, pr: _Protection, arp: str = DEFAULT_ARP) -> SwitchState:
    own = ix.own_flows.get(sw.name)
    if own is None:
        own = ix.own_flows[sw.name] = _own_flow(ix, sw)
    flows: list[Flow] = list(own)
    if sw.tier == 1:       # its own (the protection below is shared by leaves alike)
        flows.extend(arp_responders(ix, sw.name, arp))
    flows.extend(pr.flows)
    fresh_metas: dict = {}
    fresh_groups: dict = {}
    fresh_flows: list[Flow] = []

    def encode(ports: tuple) -> tuple:
        act = pr.encode(ports)
        if act is None:
            act = _fresh(pr, ports, _field(ix, sw, ports), fresh_metas, fresh_groups, fresh_flows)
        return act

    default, exceptions = acts
    if sw.tier == 1:
        local = ix.local_routes.get(sw.name)
        if local is None:   # a leaf's own /32 routes never change: built once per graph
            # the last hop: the frame leaves from the gateway to the receiver's own MAC (in gateway
            # mode hosts address their whole plane to GATEWAY_MAC; the same in both modes, so that
            # changing the mode changes the responders only)
            local = ix.local_routes[sw.name] = tuple(
                Flow(TABLE_ROUTE, PRIO_ROUTE_BASE + 32, (("eth_type", ETH_IPV4), ("ipv4_dst", h.ip)),
                     (("set_field", "eth_src", GATEWAY_MAC), ("set_field", "eth_dst", h.mac), ("output", h.port)))
                for h in sw.hosts)
        flows.extend(local)
    if policy == "aggregate":
        scope = _scope(ix, sw)
        memo_key = (id(acts), tuple(scope))
        routes = block_cache.get(memo_key)
        if routes is None:
            # levels in a single-child chain can share one prefix: the deepest one decides
            by_prefix: dict = {}
            for key, ports in _compress(tree, default, exceptions, scope):
                by_prefix[ix.level_prefix[key]] = ports
            routes = block_cache[memo_key] = tuple(by_prefix.items())
        for prefix, ports in routes:
            actions = encode(ports)
            f = block_cache.get((prefix, actions))
            if f is None:    # identical routes of different switches share one value
                f = block_cache[prefix, actions] = Flow(TABLE_ROUTE, PRIO_ROUTE_BASE + prefix[1],
                                                        _route_match(prefix), actions)
            flows.append(f)
    else:
        def block(d, ports):
            actions = encode(ports)
            f = block_cache.get((d, actions))
            if f is None:    # one shared value per (leaf, action): switches hold references
                f = block_cache[d, actions] = Flow(TABLE_ROUTE, PRIO_ROUTE_BASE + 32,
                                                   _route_match(ix.level_prefix[("leaf", d)]), actions,
                                                   ix.leaf_hosts[d])
            return f

        if default:
            default_actions = encode(default)
            base = block_cache.get(("every leaf", default_actions))
            if base is None:   # (leaf, block) for every leaf with hosts, all with the default action
                base = block_cache["every leaf", default_actions] = tuple(
                    (d, block(d, default)) for d in tree.path if ix.leaf_hosts[d])
            flows.extend(f for d, f in base if d not in exceptions)
        for d, ports in exceptions.items():
            if ports and ix.leaf_hosts[d]:
                flows.append(block(d, ports))
    flows.extend(fresh_flows)
    groups = pr.group_values
    if fresh_groups:
        groups = groups + tuple(sorted(fresh_groups.values()))
    return SwitchState(sw.name, sw.dpid, tuple(flows), groups)


def compile_fabric(g: nx.MultiGraph, failures: Failures | None = None, policy: str = DEFAULT_POLICY,
                   switches: Iterable[str] | None = None, fast_failover: bool = DEFAULT_FAST_FAILOVER,
                   incremental: bool = True, arp: str = DEFAULT_ARP) -> dict[str, SwitchState]:
    """The desired state of every live switch (or of ``switches`` only).

    ``arp``: how leaves answer ARP in the switch (``ARP_MODES``, see ``arp_responders``).

    A plane that failures touch is routed by patching its healthy routing (see
    ``_patched_actions``); ``incremental=False`` routes it from scratch instead: the same states
    (tests assert it), for comparisons and benchmarks.

    ``fast_failover=False`` is the controller-only baseline: the same tables, but every
    fast-failover group keeps only its primary bucket, so a switch next to a failure drops
    what it sent there until the controller's update arrives (for side-by-side comparisons)."""
    if policy not in ROUTING_POLICIES:
        raise UserError(f"unknown routing policy {policy!r}: use one of {', '.join(ROUTING_POLICIES)}")
    if arp not in ARP_MODES:
        raise UserError(f"unknown ARP mode {arp!r}: use one of {', '.join(ARP_MODES)}")
    failures = failures or Failures()
    was_enabled = gc.isenabled()
    gc.disable()   # millions of small acyclic tuples: the cyclic GC would rescan them over and over
    try:
        out = _compile(g, failures, policy, switches, incremental, arp)
        if not fast_failover:
            ix = index_of(g)
            out = {name: _unprotected(ix, st) for name, st in out.items()}
        return out
    finally:
        if was_enabled:
            gc.enable()


def _unprotected(ix: FabricIndex, st: SwitchState) -> SwitchState:
    """``st`` with every fast-failover group cut to its primary bucket (one value per state,
    so that a state the compile reused stays the same object and diffs skip it)."""
    memo = ix.shared.setdefault("unprotected", {})
    if len(memo) > 4 * len(ix.sw):       # bounded in a long-running controller
        memo.clear()
    hit = memo.get(id(st))
    if hit is not None and hit[0] is st:
        return hit[1]
    groups = tuple(gr._replace(buckets=gr.buckets[:1]) if gr.kind == "ff" else gr for gr in st.groups)
    out = SwitchState(st.name, st.dpid, st.flows, groups)
    memo[id(st)] = (st, out)
    return out


def _dead_ports(ix: FabricIndex, failures: Failures) -> dict[str, set[int]]:
    """Per live switch, its ports whose link or neighbour has failed."""
    dead: dict[str, set[int]] = {}
    g = ix.graph
    for u, v, k in failures.links:
        ports = g.edges[u, v, k]["ports"]
        for n in (u, v):
            if n in ix.sw:
                dead.setdefault(n, set()).add(ports[n])
    for s in failures.switches:
        for n, keys in g.adj[s].items():
            if n in ix.sw:
                for d in keys.values():
                    dead.setdefault(n, set()).add(d["ports"][n])
    return dead


def _compile(g, failures: Failures, policy: str, switches, incremental: bool = True,
             arp: str = DEFAULT_ARP) -> dict[str, SwitchState]:
    ix = index_of(g)
    wanted = None if switches is None else set(switches)
    out: dict[str, SwitchState] = {}
    dead = _dead_ports(ix, failures) if failures else {}
    touched = {ix.sw[n].plane for lid in failures.links for n in lid[:2] if n in ix.sw}
    touched |= {ix.sw[n].plane for n in failures.switches if n in ix.sw}
    for plane, sws in sorted(ix.planes.items()):
        if wanted is not None and not any(s.name in wanted for s in sws):
            continue
        healthy, tree = ix.healthy(plane)
        # the planes are disjoint: a plane no failure touches routes as if nothing failed
        route = _patched_actions if incremental else _plane_actions
        acts = route(ix, plane, failures) if plane in touched else healthy
        reuse = ix.healthy_states.setdefault((policy, arp), {})
        block_cache: dict = {}
        for sw in sws:
            if sw.name in failures.switches or (wanted is not None and sw.name not in wanted):
                continue
            pr = ix.protection(sw)
            a = acts[sw.name]
            if sw.name in dead and sw.tier >= 2:
                a = block_cache["keep", sw.name] = _keep_detours(a, healthy[sw.name], dead[sw.name], pr,
                                                                 ix.healthy_routing(plane).rank)
            st = reuse.get(sw.name)
            if st is not None and (a is healthy[sw.name] or a == healthy[sw.name]):
                out[sw.name] = st      # what the failure does not change is the healthy value itself
                continue
            st = out[sw.name] = _switch_state(ix, sw, a, policy, tree, block_cache, pr, arp)
            if a is healthy[sw.name]:
                reuse[sw.name] = st
    return out


def switch_actions(g: nx.MultiGraph, failures: Failures | None = None) -> dict[str, tuple[tuple, dict]]:
    """{live switch: (default next-hop set, {destination leaf: set that differs})}: the actions
    ``compile_fabric`` encodes as routes (the same choices as its ``_compile``: the patched plane
    routing, and a switch's kept detours for a dead one-port way). A pure accessor for the flow
    model (hpnlab.fabric.model.forwarding), which forwards over exactly these."""
    failures = failures or Failures()
    ix = index_of(g)
    dead = _dead_ports(ix, failures) if failures else {}
    touched = {ix.sw[n].plane for lid in failures.links for n in lid[:2] if n in ix.sw}
    touched |= {ix.sw[n].plane for n in failures.switches if n in ix.sw}
    out: dict[str, tuple[tuple, dict]] = {}
    for plane, sws in sorted(ix.planes.items()):
        healthy, _tree = ix.healthy(plane)
        acts = _patched_actions(ix, plane, failures) if plane in touched else healthy
        for sw in sws:
            if sw.name in failures.switches:
                continue
            a = acts[sw.name]
            if sw.name in dead and sw.tier >= 2:
                a = _keep_detours(a, healthy[sw.name], dead[sw.name], ix.protection(sw),
                                  ix.healthy_routing(plane).rank)
            out[sw.name] = a
    return out


# ---- counts ---------------------------------------------------------------------------

def minimum_routes(g: nx.MultiGraph) -> dict[str, int]:
    """Lower bound on IPv4 routes per switch for any destination-based routing.

    A leaf must tell apart each of its host ports and "elsewhere" (ports + 1); a spine
    each leaf below it, plus "up" if it has uplinks; a core each pod below it, plus each
    far campus it reaches over long-haul links.
    """
    ix = index_of(g)
    out = {}
    for sw in ix.sw.values():
        if sw.tier == 1:
            out[sw.name] = len(sw.hosts) + (1 if sw.up else 0)
        elif sw.tier == 2:
            out[sw.name] = len({n for _, n, _ in sw.down}) + (1 if sw.up else 0)
        else:
            pods = {ix.sw[n].pod for _, n, _ in sw.down}
            far = {ix.graph.nodes[n].get("campus") for _, n, _ in sw.lateral}
            out[sw.name] = len(pods) + len(far)
    return out


def route_summary(g: nx.MultiGraph, policy: str = DEFAULT_POLICY, failures: Failures | None = None) -> dict:
    """Per-switch and per-POD flow and route counts of the compiled fabric.

    ``switches``: {name: {"flows", "routes", "minimum_routes"}};
    ``pods``: {"c<campus>/pod<pod>": {...sums over the pod's switches of every plane}}
    (cores belong to no pod: "core"); ``totals``; ``max_flows_per_switch``.
    ``routes`` counts table 1 (the IPv4 routing table), ``flows`` every table.
    """
    states = compile_fabric(g, failures, policy)
    ix = index_of(g)
    minimum = minimum_routes(g)
    switches = {}
    pods: dict[str, dict] = {}
    for name, st in states.items():
        sw = ix.sw[name]
        row = {"flows": st.flow_count, "routes": st.route_count,
               "minimum_routes": minimum[name], "tier": sw.tier, "plane": sw.plane}
        switches[name] = row
        pod = "core" if sw.pod is None else f"c{sw.pod[0]}/pod{sw.pod[1]}"
        acc = pods.setdefault(pod, {"switches": 0, "flows": 0, "routes": 0, "minimum_routes": 0})
        acc["switches"] += 1
        for k in ("flows", "routes", "minimum_routes"):
            acc[k] += row[k]
    totals = {k: sum(r[k] for r in switches.values()) for k in ("flows", "routes", "minimum_routes")}
    return {"policy": policy, "switches": switches, "pods": pods, "totals": totals,
            "max_flows_per_switch": max((r["flows"] for r in switches.values()), default=0),
            "max_routes_per_switch": max((r["routes"] for r in switches.values()), default=0)}


def deaggregated(states: Mapping[str, SwitchState], healthy: Mapping[str, SwitchState]) -> int:
    """Routes present only because of failures: table-1 entries absent from the healthy compile."""
    n = 0
    for name, st in states.items():
        base = healthy.get(name)
        keys = {f.key() for f in base.flows if f.table == TABLE_ROUTE} if base else set()
        n += sum(f.entry_count for f in st.flows if f.table == TABLE_ROUTE and f.key() not in keys)
    return n


def arp_answer(g: nx.MultiGraph, leaf: str, target_ip: str, arp: str = DEFAULT_ARP,
               in_port: int | None = None) -> str | None:
    """The MAC a leaf answers for ``target_ip`` (the controller's proxy ARP), or None: only for
    hosts of its plane, and never to the host behind ``in_port`` for its own address (a reply to
    an announcement or a probe would look like an address conflict). ``arp`` "gateway":
    ``GATEWAY_MAC`` (as the responder flows answer); "per-host": the target's own MAC."""
    ix = index_of(g)
    sw = ix.sw.get(leaf)
    if sw is None or sw.tier != 1:
        return None
    try:
        ip = ip_int(target_ip)
    except ValueError:
        return None
    entry = ix.host_addr.get(ip)
    if entry is None or entry[2] != sw.plane:
        return None
    if in_port is not None and any(h.port == in_port and h.ip == ip for h in sw.hosts):
        return None
    return GATEWAY_MAC if arp == "gateway" else entry[0]


def describe_flow(f: Flow) -> str:
    def val(k, v):
        if k in IPV4_FIELDS:
            if isinstance(v, tuple):
                return f"{ip_str(v[0])}/{ip_str(v[1])}"
            return ip_str(v)
        return f"{v[0]:#x}/{v[1]:#x}" if isinstance(v, tuple) else str(v)

    def act(x: tuple) -> str:
        if x[0] == "set_field" and x[1] in IPV4_FIELDS:
            return f"set_field:{x[1]}:{ip_str(x[2])}"
        return ":".join(map(str, x))
    m = ",".join(f"{k}={val(k, v)}" for k, v in f.match)
    a = ",".join(act(x) for x in f.actions) or "drop"
    extra = f" x{len(f.hosts)} hosts" if f.hosts is not None else ""
    return f"table={f.table} priority={f.priority} {m} actions={a}{extra}"
