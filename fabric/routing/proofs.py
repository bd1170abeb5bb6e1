"""Failure-tolerance proofs through the compiled tables, at full scale by symmetry.

What is proved, for a failure F (one link, one switch, with flags a pair of links or a whole
plane): the controller's tables for F (``compiler.compile_fabric(g, F)``: the state after it
converged) deliver every *live* host pair on every entropy branch with no loop. A pair of NIC
ports (same plane, different hosts) is live when both ports' links and leaves are up; it is
*cut* when it is live but no valley-free path joins its leaves (``oftable.valley_free_reachable``,
the oracle independent of the compiler). A failure is tolerated when no live pair is cut, none
is black-holed (some branch not delivered) and no branch loops. Beside the verdict each failure
gets its cost in bandwidth (see "Bandwidth" below).

The walker
    ``SetWalker`` walks one packet through the tables like the interpreter
    (``oftable.FabricTables``), but where a switch's entropy table looks at source-port bits it
    takes the *set* of outputs over every pattern of those bits at once, so a pair costs one
    visit per (switch, state) instead of one walk per branch. Each switch's choice is taken
    independently of the others': this can only add paths (two tiers may look at overlapping
    bits, so not every combination is a real branch), never lose one. So "every path delivered,
    none loops" on the walker implies the same for the interpreter; whenever the walker finds a
    path that is not delivered, the pair is walked again by the interpreter's exact
    ``send_branches`` and the interpreter's answer is the verdict. tests/unit/test_proofs.py checks
    walker and interpreter agree on the small presets.

Symmetry (why one failure per class and one pair per class are enough)
    The builders in fabric/scenario/graph.py are symmetric by construction. Give every switch and NIC
    port *coordinates* on a tree of interchangeable siblings:

        HPN        leaf  (campus, pod, segment, position in segment)
                   spine (campus, pod, spine in pod)          core (campus, core in campus)
                   port  leaf's coordinates + (host in segment, rail on the leaf)
        fat-tree   edge  (pod, edge in pod), agg (pod, agg in pod), core (group, core)

    plus *labels* that tie coordinates across subtrees: the plane (every switch and port), the
    host (a host's ports sit on every leaf of its segment, on every plane), the core index (a
    long-haul link joins core i of one campus to core i of every other), and in a fat-tree the
    aggregation position (agg i of every pod reaches core group i). Then each of these
    permutations is an automorphism of the graph (kinds, rates and roles preserved):
    planes; campuses; the pods of a campus; the segments of a pod; the leaf positions of a
    segment (with the hosts' rail blocks there); the hosts of a segment; the rails of one host
    on one leaf; the spines of a pod; the core indices (the same in every campus); parallel
    links; and in a fat-tree, the edges of a pod, the pods, the agg positions (with their core
    groups) and the cores of a group. For this group the orbit of a tuple of objects is fixed
    by (a) the objects' types, (b) for each two of them the length of the common prefix of their
    coordinates, and (c) which of their labels are equal: iterated wreath products of symmetric
    groups act on tuples of tree leaves with exactly these invariants, and the tied labels only
    refine them. ``SymmetryIndex.key`` computes that triple.

    The compiler is equivariant for these automorphisms: it computes per destination leaf a
    next-hop *set* from valley-free distances (invariant), compresses routes along the address
    hierarchy plane > campus > pod > leaf (lossless: each destination keeps its action) and
    deals entropy patterns over a set's ports in port order. An automorphism may change which
    pattern picks which member of a set, and which of two equally common actions becomes the
    aggregate, but not the set of next hops a packet can take at any switch -- and the proof
    takes every branch. So the verdict for failure F and pair P equals the verdict for
    sigma(F) and sigma(P): proving one failure per orbit (the *failure classes*), and under it
    one pair per orbit of its stabiliser (the *pair classes*: one source port per class, then
    every destination class for that source), proves every failure and every pair.

    One choice of the compiler is not equivariant: a fast-failover group's detour buckets are
    the next ports in port order (a spine that lost its link to a leaf detours through the next
    leaves of its pod). Those buckets are taken only while a failure is not yet compiled in (local
    protection); in the tables compiled for the failure no route sends a packet to them, and
    the proof is of those tables. tests/unit/test_proofs.py checks, on the five small presets, that
    the reduced proof gives the exhaustive proof's verdict for every class.

    Pair classes are found without looking at every pair: replacing a coordinate that no
    special object (the failure's anchors, the source) has at that level by one fresh value
    keeps the key, so the candidates are the ports whose every coordinate is a special value or
    the fresh one (as sources: 2 to 16 of alibaba-hpn's 30,720 ports). No sampling: every pair
    class is walked, at 130k too.

    For a graph not built by fabric/scenario/graph.py (edited by hand) the argument does not hold: the
    class key also carries each switch's link counts, which splits classes whose members
    differ locally, but only ``exhaustive=True`` proves such a graph.

Bandwidth
    Each failure's cost is given two ways: ``bisection_loss``, the share of
    ``fabric.analysis.bisection`` (min over tiers of half the capacity above the tier, all
    planes, and the long-haul cut) that the failed links and switches take away; and
    ``uplink_loss``, the share of uplink capacity lost by the worst-hit live switch (what a job
    placed under that leaf or in that pod loses). Both are read off the graph, not the tables.

    proofs = prove(g)                           # every single link and switch, by class
    proofs = prove(g, pairs=True, plane=True)   # also every pair of links, a whole plane
    proofs = prove(g, exhaustive=True)          # every failure and every pair, no symmetry
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import networkx as nx

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import FabricTables, valley_free_reachable

MAX_HOPS = FabricTables.MAX_HOPS
#: the Ethernet sources the compiled tables match (the detours' marks, compiler's "Fast failover")
MARKS = frozenset({compiler.BOUNCE_MAC, compiler.DEEP_MAC})


# ---- objects and their symmetry keys ----------------------------------------------------------

class Obj(NamedTuple):
    """A switch or a NIC port, with its place in the symmetry tree."""
    name: str                  # switch name, or "host:intf"
    kind: str                  # switch role + link counts, or "port"
    path: tuple                # coordinates, root first
    labels: tuple              # ((label, value), ...) tied across subtrees


class Port(NamedTuple):
    """A host NIC port."""
    host: str
    intf: int
    plane: int
    rail: int
    leaf: str
    link: tuple                # link id of its host link
    ip: int


def _common(a: tuple, b: tuple) -> int:
    n = 0
    for x, y in zip(a, b):  # noqa: B905 (paths of different lengths)
        if x != y:
            break
        n += 1
    return n


def _same_labels(la: tuple, lb: tuple) -> tuple:
    """((label, equal?), ...) for the labels two objects both carry (labels sorted by name)."""
    if len(la) == len(lb) and all(x[0] == y[0] for x, y in zip(la, lb, strict=True)):
        return tuple((x[0], x[1] == y[1]) for x, y in zip(la, lb, strict=True))
    db = dict(lb)
    return tuple((n, v == db[n]) for n, v in la if n in db)


class SymmetryIndex:
    """Coordinates of every switch and port of a graph built by fabric/scenario/graph.py."""

    def __init__(self, g: nx.MultiGraph):
        self.g = g
        s = g.graph["scenario"]
        self.fat_tree = s.kind == "fat-tree"
        node = g.nodes
        self.obj: dict[str, Obj] = {}
        self.ports: list[Port] = []
        self.port_obj: dict[tuple[str, int], Obj] = {}
        # position of a spine/agg in its pod, of a core in its campus: rank by index
        ranks: dict[tuple, list] = defaultdict(list)
        for n, d in node.items():
            if d["tier"] in (2, 3):
                ranks[d["tier"], d.get("plane", 0), d.get("campus", 0), d.get("pod")].append((d["index"], n))
        rank = {n: i for members in ranks.values() for i, (_x, n) in enumerate(sorted(members))}
        half = (s.k // 2) if self.fat_tree else 0
        tier_of = {n: d["tier"] for n, d in node.items()}
        self.role = {n: d["role"] for n, d in node.items()}
        adj = g._adj
        for n, d in node.items():
            tier = d["tier"]
            if tier == 0:
                continue
            up = down = side = 0
            for v, keys in adj[n].items():
                t = tier_of[v]
                if t > tier:
                    up += len(keys)
                elif t < tier:
                    down += len(keys)
                else:
                    side += len(keys)
            kind = f"{d['role']} {up}/{down}/{side}"     # role, links up/down/sideways
            plane, campus = d.get("plane", 0), d.get("campus", 0)
            labels: tuple = (("plane", plane),)
            if tier == 1:
                path: tuple = (campus, d["pod"], ("segment", d["segment"]), ("leaf", d.get("leaf", 0)))
            elif tier == 2:
                path = (campus, d["pod"], ("spine", rank[n]))
                if self.fat_tree:
                    labels = (("group", rank[n]),) + labels
            else:
                if self.fat_tree:
                    path = (campus, ("core", d["index"]))
                    labels = (("group", d["index"] // half),) + labels
                else:
                    path = (campus, ("core", rank[n]))
                    labels = (("core", rank[n]),) + labels
            self.obj[n] = Obj(n, kind, path, labels)     # labels sorted by name
        ix = compiler.index_of(g)
        self.host_ip: dict[tuple[str, int], int] = {}
        self._trie: dict = {}       # the ports as a trie on their coordinates, then by plane
        level_values: list[set] = []
        for sw in ix.sw.values():
            if sw.tier != 1:
                continue
            rails = node[sw.name].get("rails") or (0,)
            leaf_path = self.obj[sw.name].path
            for h in sw.hosts:
                slot = h.port - 1
                p = Port(h.host, h.intf, sw.plane, rails[slot % len(rails)], sw.name, h.link, h.ip)
                self.ports.append(p)
                self.host_ip[h.host, h.intf] = h.ip
                path = leaf_path + (("host", slot // len(rails)), ("rail", slot % len(rails)))
                self.port_obj[h.host, h.intf] = Obj(f"{h.host}:{h.intf}", "port", path,
                                                    (("host", h.host), ("plane", sw.plane)))
                t = self._trie
                for i, x in enumerate(path):
                    if i == len(level_values):
                        level_values.append(set())
                    level_values[i].add(x)
                    t = t.setdefault(x, {})
                t[sw.plane] = p
        self._level_values: list[list] = [sorted(vals, key=repr) for vals in level_values]
        by_plane: dict[int, set] = defaultdict(set)
        for n, o in self.obj.items():
            by_plane[dict(o.labels)["plane"]].add(n)
        self.plane_switches = {p: frozenset(members) for p, members in by_plane.items()}
        self._planes = sorted({p.plane for p in self.ports})

    # -- keys ---------------------------------------------------------------------------------
    @staticmethod
    def key(objs: Iterable[Obj]) -> tuple:
        """The orbit invariant of a tuple of objects: kinds, pairwise common-prefix lengths,
        and which labels are equal."""
        objs = list(objs)
        rel = []
        for i, a in enumerate(objs):
            for j in range(i + 1, len(objs)):
                b = objs[j]
                rel.append((_common(a.path, b.path), _same_labels(a.labels, b.labels)))
        return tuple(o.kind for o in objs), tuple(rel)

    def anchors(self, failure: Failure) -> list[Obj]:
        """The objects a failure fixes: its switches, its links' ends (a host end is its port)."""
        switches = failure.failures.switches
        whole = [p for p, members in self.plane_switches.items() if members <= switches]
        # a whole plane down is fixed by the plane alone (one object with its label)
        out = [Obj(f"plane {p}", "plane", (), (("plane", p),)) for p in whole]
        covered = frozenset().union(*(self.plane_switches[p] for p in whole))
        out += [self.obj[s] for s in sorted(switches - covered)]
        for lid in sorted(failure.failures.links):
            out += self.link_anchors(lid)
        return out

    def link_anchors(self, lid: tuple) -> list[Obj]:
        """A link's two ends (a host end is its NIC port)."""
        u, v, k = lid
        out = []
        for n in (u, v):
            o = self.obj.get(n)
            if o is None:
                o = self.port_obj[n, self.g._adj[u][v][k]["ports"][n]]
            out.append(o)
        return out

    # -- pair classes -------------------------------------------------------------------------
    def candidates(self, special: list[Obj]) -> list[Port]:
        """Ports whose every coordinate (and plane) is one a special object has at that level,
        or the level's one fresh value: every pair class relative to ``special`` has a member here."""
        depth = len(self._level_values)
        wanted: list[set] = []
        for i in range(depth):
            vals = {o.path[i] for o in special if len(o.path) > i}
            fresh = next((x for x in self._level_values[i] if x not in vals), None)
            wanted.append(vals | ({fresh} if fresh is not None else set()))
        planes = {dict(o.labels)["plane"] for o in special}
        fresh_plane = next((p for p in self._planes if p not in planes), None)
        planes |= {fresh_plane} if fresh_plane is not None else set()
        out: list[Port] = []

        def descend(t: dict, level: int) -> None:
            if level == depth:
                out.extend(t[pl] for pl in sorted(planes) if pl in t)
                return
            for x in wanted[level]:
                sub = t.get(x)
                if sub is not None:
                    descend(sub, level + 1)
        descend(self._trie, 0)
        return out

    def pair_classes(self, anchors: list[Obj]) -> dict[tuple, tuple[Port, Port]]:
        """One (source, destination) port pair per orbit of pairs (same plane, different hosts)
        under the failure's stabiliser: one source per class, every destination class for it."""
        sources: dict[tuple, Port] = {}
        for p in self.candidates(anchors):
            sources.setdefault(self.key([self.port_obj[p.host, p.intf], *anchors]), p)
        out: dict[tuple, tuple[Port, Port]] = {}
        for src in sources.values():
            so = self.port_obj[src.host, src.intf]
            for dst in self.candidates([*anchors, so]):
                if dst.plane != src.plane or dst.host == src.host:
                    continue
                out.setdefault(self.pair_key(src, dst, anchors), (src, dst))
        return out

    def pair_key(self, src: Port, dst: Port, anchors: list[Obj]) -> tuple:
        return self.key([self.port_obj[src.host, src.intf], self.port_obj[dst.host, dst.intf], *anchors])

    def all_pairs(self) -> Iterator[tuple[Port, Port]]:
        by_plane: dict[int, list[Port]] = defaultdict(list)
        for p in self.ports:
            by_plane[p.plane].append(p)
        for ports in by_plane.values():
            for s in ports:
                for d in ports:
                    if s.host != d.host:
                        yield s, d


def symmetry_of(g: nx.MultiGraph) -> SymmetryIndex:
    idx = g.graph.get("_symmetry_index")
    if idx is None or idx.g is not g:
        idx = g.graph["_symmetry_index"] = SymmetryIndex(g)
    return idx


# ---- failures and their classes ---------------------------------------------------------------

@dataclass(frozen=True)
class Failure:
    name: str                       # e.g. "link p0l0-p0s0#0", "switch p0s0", "plane 1"
    failures: compiler.Failures


@dataclass
class FailureClass:
    label: str                      # e.g. "link leaf-spine"
    key: tuple
    representative: Failure
    size: int                       # how many failures it stands for
    members: list[Failure] | None = None    # kept for small graphs (and the tests)


_ROLES = ("host", "leaf", "edge", "spine", "agg", "core")


def _role(g: nx.MultiGraph, n: str) -> str:
    return g.nodes[n]["role"]


def link_failure(g: nx.MultiGraph, lid: tuple) -> Failure:
    u, v, k = lid
    return Failure(f"link {u}-{v}#{k}", compiler.Failures(frozenset([lid])))


def switch_failure(name: str) -> Failure:
    return Failure(f"switch {name}", compiler.Failures(switches=frozenset([name])))


def all_links(g: nx.MultiGraph) -> list[tuple]:
    return [(u, v, k) for u, v, k, _d in compiler._edges(g)]


def failure_classes(g: nx.MultiGraph, *, links: bool = True, switches: bool = True, pairs: bool = False,
                    plane: bool = False, keep_members: bool | None = None) -> list[FailureClass]:
    """The failures to prove, grouped by orbit (see the module docstring): every single link,
    every single switch, with ``pairs`` every unordered pair of links, with ``plane`` every plane.
    ``keep_members`` (default: on graphs under 5,000 links) keeps each class's member list."""
    sym = symmetry_of(g)
    lids = all_links(g)
    if keep_members is None:
        keep_members = len(lids) < 5000
    classes: dict[tuple, FailureClass] = {}

    def add(key: tuple, label: str, f: Callable[[], Failure], weight: int = 1) -> None:
        c = classes.get(key)
        if c is None:
            c = classes[key] = FailureClass(label, key, f(), 0, [] if keep_members else None)
        c.size += weight
        if c.members is not None and weight:
            c.members.append(f())

    link_anchors = sym.link_anchors

    if links or pairs:
        link_keys = {}
        for lid in lids:
            ends = link_anchors(lid)
            label = "-".join(sorted((sym.role[lid[0]], sym.role[lid[1]]), key=_ROLES.index))
            key = ("link", label, sym.key(ends))
            if pairs:
                link_keys[lid] = key
            if links:
                add(key, f"link {label}", partial(link_failure, g, lid))
    if switches:
        for n in sym.obj:
            add(("switch", sym.key([sym.obj[n]])), f"switch {_role(g, n)}", partial(switch_failure, n))
    if pairs:
        _pair_classes(g, sym, lids, link_keys, link_anchors, classes, keep_members)
    if plane:
        planes = sorted({d.get("plane", 0) for _n, d in g.nodes(data=True) if d["tier"] > 0})
        for p in planes:
            members = frozenset(n for n, d in g.nodes(data=True) if d["tier"] > 0 and d.get("plane", 0) == p)
            add(("plane",), "plane", partial(Failure, f"plane {p}", compiler.Failures(switches=members)))
    return sorted(classes.values(), key=lambda c: (c.key[0] != "link", c.key[0] == "pair", c.label, repr(c.key)))


def _pair_classes(g: nx.MultiGraph, sym: SymmetryIndex, lids: list, link_keys: dict,
                  link_anchors: Callable, classes: dict, keep_members: bool) -> None:
    """Unordered pairs of links {a, b}: for each single-link class's representative a, every
    other link b gives the ordered key; the unordered key is the smaller of the two orders.
    Each unordered pair is met twice (once from each end's class), so counts are halved."""
    anchors = {lid: link_anchors(lid) for lid in lids} if keep_members else {}

    def ukey(a: tuple, b: tuple, aa: list, ab: list) -> tuple:
        ka = ("pair", link_keys[a][1], link_keys[b][1], sym.key(aa + ab))
        kb = ("pair", link_keys[b][1], link_keys[a][1], sym.key(ab + aa))
        return min(ka, kb)

    def pair_failure(a: tuple, b: tuple) -> Failure:
        return Failure(f"links {a[0]}-{a[1]}#{a[2]} + {b[0]}-{b[1]}#{b[2]}", compiler.Failures(frozenset([a, b])))

    if keep_members:
        for i, a in enumerate(lids):
            for b in lids[i + 1:]:
                key = ukey(a, b, anchors[a], anchors[b])
                c = classes.get(key)
                if c is None:
                    c = classes[key] = FailureClass(f"links {key[1]} + {key[2]}", key, pair_failure(a, b), 0, [])
                c.size += 1
                assert c.members is not None
                c.members.append(pair_failure(a, b))
        return
    by_class: dict[tuple, list] = defaultdict(list)
    for lid in lids:
        by_class[link_keys[lid]].append(lid)
    counts: Counter = Counter()
    reps: dict[tuple, tuple] = {}
    for members in by_class.values():
        a = members[0]
        aa = link_anchors(a)
        for b in lids:
            if b == a:
                continue
            key = ukey(a, b, aa, link_anchors(b))
            counts[key] += len(members)
            reps.setdefault(key, (a, b))
    for key, n in counts.items():
        a, b = reps[key]
        classes[key] = FailureClass(f"links {key[1]} + {key[2]}", key, pair_failure(a, b), n // 2)


# ---- the set walker ---------------------------------------------------------------------------

class SetWalker:
    """Walks a packet over every entropy branch at once (see the module docstring)."""

    def __init__(self, net: FabricTables):
        self.net = net
        self._specs: dict[tuple, tuple] = {}
        self._uses_sport: dict[tuple[str, int], bool] = {}
        self._memo: dict[tuple, tuple] = {}
        self._visits: dict[tuple, tuple[frozenset, int]] = {}   # shared by every walk of this failure
        self._sport_tables: dict[tuple, dict] = {}
        self._host_ip = symmetry_of(net.g).host_ip
        self._conforms: dict[str, bool] = {}
        self.shared = True      # walks share their results (see _check)
        self._src_mask = 0
        self._gen = 0
        self._in_ports: dict[str, frozenset | None] = {}   # in_port values a switch's tables match

    # What a walk's packet may differ in, at a switch the walker visits, for walks to share
    # their results: every other field is the same in every walk, set inside the pipeline
    # (metadata), in the visit's state (in_port) or enumerated (source ports).
    _SHARED_FIELDS: frozenset = frozenset({"eth_type", "ip_proto", "udp_dst", "metadata", "udp_src", "tcp_src",
                                           "ipv4_dst"})

    def _check(self, switch: str) -> bool:
        """Do ``switch``'s tables look at no more of a packet than the shared results key on
        (the destination, its detour mark if any, the source address's bits in ``_src_mask``)?
        A switch that looks at more source bits widens the mask (and drops what was shared)."""
        ok = self._conforms.get(switch)
        if ok is None:
            ok = True
            for k, values, mask in self._spec(switch, 0):
                if k == "eth_src":
                    ok &= values is not None and values <= MARKS
                elif k == "ipv4_src":
                    ok &= values is None
                    if mask & ~self._src_mask:
                        self._src_mask |= mask
                        self._visits.clear()
                        self._gen += 1      # results computed under the narrower mask are not kept
                elif k == "in_port":
                    self._in_ports[switch] = values if values is not None else None
                else:
                    ok &= k in self._SHARED_FIELDS
            self._conforms[switch] = ok
        return ok

    def _spec(self, switch: str | None, table: int = 0) -> tuple:
        """What the tables ``table``.. of ``switch`` (None: of every switch) can tell apart in a
        packet: ((field, values or None, mask), ...). A field matched only exactly to a few
        values is kept when it is one of them (else None); a masked field as its masked bits."""
        key = (switch, table)
        spec = self._specs.get(key)
        if spec is None:
            exact: dict[str, set] = defaultdict(set)
            masks: dict[str, int] = defaultdict(int)
            for sw in ([switch] if switch is not None else list(set(self.net.states) | set(self.net._entries))):
                for t, entries in self.net.tables(sw).items():
                    if t < table:
                        continue
                    for e in entries:
                        for k, v in e.match:
                            if e.hosts is not None and k == "ipv4_dst":
                                masks[k] = -1
                            elif isinstance(v, tuple):
                                masks[k] |= v[1]
                            else:
                                exact[k].add(v)
            fields: list[tuple[str, frozenset | None, int]] = []
            for k in sorted(exact.keys() | masks.keys()):
                if k in masks and k in exact:
                    fields.append((k, None, -1))
                elif k in masks:
                    fields.append((k, None, masks[k]))
                else:
                    fields.append((k, frozenset(exact[k]), 0))
            spec = self._specs[key] = tuple(fields)
        return spec

    def _norm(self, spec: tuple, pkt: dict) -> tuple:
        out: list = []
        for k, values, mask in spec:
            v = pkt.get(k)
            if v is None:
                out.append(None)
            elif values is not None:
                out.append(v if v in values else ())
            else:
                out.append(v & mask)
        return tuple(out)

    def _sport_lookup(self, switch: str, table: int, pkt: dict) -> dict[int, compiler.Flow | None]:
        """{source-port pattern over the table's mask bits: the entry it hits} (exact: highest
        priority wins, as in ``FabricTables.lookup``)."""
        key = (switch, table) + self._norm(self._spec(switch, table), pkt)
        hit = self._sport_tables.get(key)
        if hit is not None:
            return hit
        net = self.net
        mask = 0
        cands = []
        probe = dict(pkt)
        for e in net.tables(switch).get(table, ()):
            sp = dict(e.match).get("udp_src")
            if sp is None:
                if net._matches(e, probe):
                    cands.append((e, 0, 0))
                continue
            value, m = sp if isinstance(sp, tuple) else (sp, 0xFFFF)
            probe["udp_src"] = value
            if net._matches(e, probe):
                cands.append((e, value, m))
                mask |= m
        bits = [b for b in range(16) if mask >> b & 1]
        by_mask: dict[int, dict[int, compiler.Flow]] = defaultdict(dict)
        for e, value, m in cands:      # sorted by priority, highest first: keep the first per value
            by_mask[m].setdefault(value, e)
        out: dict[int, compiler.Flow | None] = {}
        for pattern in range(1 << len(bits)):
            sport = 0
            for i, b in enumerate(bits):
                if pattern >> i & 1:
                    sport |= 1 << b
            best = None
            for m, entries in by_mask.items():
                e = entries.get(sport & m)
                if e is not None and (best is None or e.priority > best.priority):
                    best = e
            out[sport] = best
        self._sport_tables[key] = out
        return out

    def choices(self, switch: str, pkt: dict, table: int = 0) -> frozenset:
        """Every (output port or None, fields set) ``switch`` may give ``pkt`` over all the
        source-port patterns its tables look at (``pkt`` carries no udp_src)."""
        key = (switch, table) + self._norm(self._spec(switch, table), pkt)
        hit = self._memo.get(key)
        if hit is not None:
            return hit[0]
        net = self.net
        pkt = dict(pkt)
        changes: list = []
        result: frozenset
        for _ in range(8):
            tables = net.tables(switch)
            uses_sport = self._uses_sport.get((switch, table))
            if uses_sport is None:
                uses_sport = self._uses_sport[switch, table] = any(
                    k == "udp_src" for e in tables.get(table, ()) for k, _v in e.match)
            if uses_sport and "udp_src" not in pkt:
                outs = set()
                for sport, e in self._sport_lookup(switch, table, pkt).items():
                    sub = dict(pkt, udp_src=sport)
                    for out, ch in self._apply(switch, table, e, sub) or ():
                        outs.add((out, tuple(changes) + ch))
                result = frozenset(outs)
                break
            f = net.lookup(switch, table, pkt)
            res = self._apply(switch, table, f, pkt, changes)
            if res is not None:
                result = frozenset(res)
                break
            table = pkt.pop("_goto")
        else:
            result = frozenset([(None, ())])
        self._memo[key] = (result,)
        return result

    def _apply(self, switch: str, table: int, f: compiler.Flow | None, pkt: dict,
               changes: list | None = None) -> set | None:
        """Apply one entry's actions: a set of (out, changes) when the pipeline ends here, or
        None after recording a goto in ``pkt["_goto"]`` (``changes`` collects set-fields)."""
        if f is None:
            return {(None, ())}
        ch = changes if changes is not None else []
        out, goto = self.net.apply_entry(switch, table, f, pkt, ch)
        if out is not None:
            return {(out, tuple(ch))}
        if goto is None:
            return {(None, ())}
        if changes is None:      # a branch of an entropy table: finish its pipeline on its own
            rest = self.choices(switch, {k: v for k, v in pkt.items() if k != "_goto"}, goto)
            return {(o, tuple(ch) + c) for o, c in rest}
        pkt["_goto"] = goto
        return None

    def walk(self, src: Port, dst: Port) -> set[str]:
        """The outcomes ("delivered", "dropped", "loop") some path of src -> dst may end in."""
        net = self.net
        s_ip = self._host_ip[src.host, src.intf]
        pkt0 = {"eth_type": compiler.ETH_IPV4, "eth_src": net.g.edges[src.link]["mac"], "ipv4_src": s_ip,
                "ipv4_dst": dst.ip, "ip_proto": compiler.PROTO_UDP, "udp_dst": 4791}
        local: dict[tuple, tuple[frozenset, int]] = {}
        on_stack: set = set()
        any_loop = [False]      # a walk that met a cycle keeps its partial results to itself

        def visit(node: str, port: int, pkt: dict) -> tuple[frozenset, int]:
            """Outcomes (and longest hop count) of sending ``pkt`` out of ``node``'s ``port``."""
            nxt = net.peer.get((node, port))
            if nxt is None:
                return frozenset(["dropped"]), 0
            peer, peer_port, lid = nxt
            if not net.carries(lid, peer):
                return frozenset(["dropped"]), 0
            if net.g.nodes[peer]["tier"] == 0:
                ok = self._host_ip.get((peer, peer_port)) == pkt["ipv4_dst"]
                return frozenset(["delivered" if ok else "dropped"]), 0
            if not net.has_state(peer):
                return frozenset(["dropped"]), 0
            state = (peer, peer_port, pkt.get("eth_src"))
            if state in on_stack:
                any_loop[0] = True
                return frozenset(["loop"]), MAX_HOPS + 1
            if self.shared and not self._check(peer):
                self.shared = False
                self._visits.clear()
            gen = self._gen
            if self.shared:
                memo = self._visits
                # the port a packet came in by matters only where the tables match it
                seen = self._in_ports.get(peer, frozenset())
                in_port = peer_port if seen is None or peer_port in seen else ()
                mark = pkt.get("eth_src")
                mkey: tuple = (peer, in_port, pkt["ipv4_dst"], mark if mark in MARKS else None,
                               pkt["ipv4_src"] & self._src_mask)
            else:
                memo, mkey = local, (peer, peer_port) + tuple(sorted(pkt.items()))
            hit = memo.get(mkey)
            if hit is not None:
                return hit
            on_stack.add(state)
            outcomes: set[str] = set()
            longest = 0
            for out, changes in self.choices(peer, dict(pkt, in_port=peer_port)):
                if out is None:
                    outcomes.add("dropped")
                    continue
                o, n = visit(peer, out, dict(pkt, **dict(changes)) if changes else pkt)
                outcomes |= o
                longest = max(longest, n + 1)
            on_stack.discard(state)
            res = (frozenset(outcomes), longest)
            if not any_loop[0] and (memo is local or (self.shared and gen == self._gen)):
                memo[mkey] = res
            return res

        outcomes, longest = visit(src.host, src.intf, pkt0)
        return set(outcomes) | ({"loop"} if longest > MAX_HOPS else set())


# ---- proving ----------------------------------------------------------------------------------

@dataclass
class PairProblem:
    kind: str          # "cut", "black hole", "loop"
    src: Port
    dst: Port
    detail: str = ""

    def __str__(self) -> str:
        return (f"{self.kind}: {self.src.host} -> {self.dst.host} plane {self.src.plane} "
                f"rails {self.src.rail}->{self.dst.rail}{': ' + self.detail if self.detail else ''}")


class Findings:
    """What a proof found, as a list of problems each of a ``kind``: ok when there are none (the base
    of this module's :class:`Verdict` and of ``protection.EventVerdict``)."""
    problems: list

    @property
    def ok(self) -> bool:
        return not self.problems

    def count(self, kind: str) -> int:
        return sum(1 for p in self.problems if p.kind == kind)

    @property
    def kinds(self) -> frozenset:
        return frozenset(p.kind for p in self.problems)


@dataclass
class Verdict(Findings):
    failure: Failure
    pairs: int = 0                  # pairs walked
    live: int = 0                   # of which live (both ports up, a valley-free path)
    delivered: int = 0              # live pairs delivered on every branch
    problems: list[PairProblem] = field(default_factory=list)
    bisection_loss: float = 0.0
    uplink_loss: float = 0.0
    seconds: float = 0.0


def prove_failure(g: nx.MultiGraph, failure: Failure, pairs: Iterable[tuple[Port, Port]],
                  states: Mapping | None = None, policy: str = compiler.DEFAULT_POLICY, exact: bool = False,
                  costs: Costs | None = None, net: FabricTables | None = None) -> Verdict:
    """Walk ``pairs`` through the tables compiled for ``failure`` (``states`` if given).
    ``exact``: every pair by the interpreter's send_branches instead of the set walker.
    ``net``: an interpreter over ``g`` to reuse (its tables are replaced)."""
    t0 = time.perf_counter()
    fl = failure.failures
    if states is None:
        states = compiler.compile_fabric(g, fl, policy)
    if net is None:
        net = FabricTables(g, dict(states), fl)
    else:
        net.reload(dict(states), fl)
    walker = SetWalker(net)
    v = Verdict(failure)
    reach: dict[tuple[str, str], bool] = {}
    oracle: dict = {}

    def port_live(p: Port) -> bool:
        return p.link not in fl.links and p.leaf not in fl.switches

    for src, dst in pairs:
        v.pairs += 1
        ends_live = port_live(src) and port_live(dst)
        path = False
        if ends_live:
            lk = (src.leaf, dst.leaf)
            path = reach.get(lk)  # type: ignore[assignment]
            if path is None:
                path = reach[lk] = valley_free_reachable(g, fl, src.leaf, dst.leaf, oracle)
        alive = ends_live and path
        if ends_live and not path:
            v.problems.append(PairProblem("cut", src, dst, "no valley-free path left"))
            continue
        outcomes: set[str] | None = None
        if not exact:
            outcomes = walker.walk(src, dst)
            if outcomes != {"delivered"} and (alive or "loop" in outcomes):
                outcomes = None          # the set walker over-approximates: ask the interpreter
        detail = ""
        if outcomes is None:
            outcomes = set()
            for sport, _f, w in net.send_branches(src.host, dst.host, src.plane, src_rail=src.rail,
                                                  dst_rail=dst.rail):
                outcomes.add(w.result)
                if w.result != "delivered" and not detail:
                    detail = f"sport {sport:#x}: {w.result} at {w.where}"
        if "loop" in outcomes:
            v.problems.append(PairProblem("loop", src, dst, detail))
        elif alive and outcomes != {"delivered"}:
            v.problems.append(PairProblem("black hole", src, dst, detail))
        if alive:
            v.live += 1
            v.delivered += outcomes == {"delivered"}
    costs = costs or Costs(g)
    v.bisection_loss, v.uplink_loss = costs.loss(fl)
    v.seconds = time.perf_counter() - t0
    return v


class Costs:
    """What a failure costs in capacity: see "Bandwidth" in the module docstring."""

    def __init__(self, g: nx.MultiGraph):
        self.g = g
        s = g.graph["scenario"]
        self.up: dict[str, float] = defaultdict(float)      # switch -> uplink capacity
        tier_up: dict[int, float] = defaultdict(float)
        host = 0.0
        for u, v, _k, d in compiler._edges(g):
            tu, tv = g.nodes[u]["tier"], g.nodes[v]["tier"]
            if tu == tv:
                continue
            lo = u if tu < tv else v
            if g.nodes[lo]["tier"] == 0:
                host += d["rate_gbps"]
            else:
                self.up[lo] += d["rate_gbps"]
                tier_up[g.nodes[lo]["tier"]] += d["rate_gbps"]
        self.cuts = {"hosts": host / 2} | {f"tier{t}": c / 2 for t, c in tier_up.items() if c > 0}
        self.long_haul_links = 0
        if s.campuses > 1 and s.long_haul:
            half = s.campuses // 2
            per_pair = s.planes * s.cores_per_plane * s.long_haul.links * s.long_haul.rate_gbps
            self.cuts["long_haul"] = half * (s.campuses - half) * per_pair
        self.bisection = min(self.cuts.values())

    def _links_of(self, fl: compiler.Failures) -> set[tuple]:
        out = set(fl.links)
        for n in fl.switches:
            for v, keys in self.g.adj[n].items():
                out.update(compiler.link_id(n, v, k) for k in keys)
        return out

    def loss(self, fl: compiler.Failures) -> tuple[float, float]:
        """(share of the bisection lost, share of uplink capacity lost at the worst-hit live switch)."""
        g = self.g
        cuts = dict(self.cuts)
        lost_up: dict[str, float] = defaultdict(float)
        for u, v, k in self._links_of(fl):
            d = g.edges[u, v, k]
            tu, tv = g.nodes[u]["tier"], g.nodes[v]["tier"]
            rate = d["rate_gbps"]
            if tu == tv:
                if "long_haul" in cuts:
                    cuts["long_haul"] -= rate
                continue
            lo = u if tu < tv else v
            t = g.nodes[lo]["tier"]
            if t == 0:
                cuts["hosts"] -= rate / 2
            else:
                cuts[f"tier{t}"] -= rate / 2
                if lo not in fl.switches:
                    lost_up[lo] += rate
        after = min(cuts.values())
        bis = 1 - after / self.bisection if self.bisection else 0.0
        worst = max((lost / self.up[n] for n, lost in lost_up.items() if self.up[n]), default=0.0)
        return max(bis, 0.0), worst


@dataclass
class ClassProof:
    cls: FailureClass
    verdict: Verdict
    pair_classes: int               # pairs walked for the representative


@dataclass
class Proof:
    scenario: str
    classes: list[ClassProof]
    healthy: Verdict
    exhaustive: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.healthy.ok and all(c.verdict.ok for c in self.classes)

    @property
    def failures(self) -> int:
        return sum(c.cls.size for c in self.classes)


def _reduced_pairs(sym: SymmetryIndex, failure: Failure) -> list[tuple[Port, Port]]:
    return list(sym.pair_classes(sym.anchors(failure)).values())


def prove(g: nx.MultiGraph, *, links: bool = True, switches: bool = True, pairs: bool = False,
          plane: bool = False, exhaustive: bool = False, policy: str = compiler.DEFAULT_POLICY,
          states: Callable[[compiler.Failures | None], Mapping] | None = None,
          progress: Callable[[str], None] | None = None) -> Proof:
    """Prove failure tolerance of ``g``: the healthy fabric, then each failure class.

    Reduced (default): each class's representative, on one pair per pair class. Exhaustive:
    every member of every class on every pair (small graphs only). ``states(failures)``
    gives the compiled tables (default: ``compiler.compile_fabric``)."""
    t0 = time.perf_counter()
    sym = symmetry_of(g)
    costs = Costs(g)
    compile_ = states or (lambda fl: compiler.compile_fabric(g, fl, policy))
    classes = failure_classes(g, links=links, switches=switches, pairs=pairs, plane=plane,
                              keep_members=True if exhaustive else None)
    every = list(sym.all_pairs()) if exhaustive else None
    none = Failure("no failure", compiler.Failures())
    healthy_states = compile_(None)
    net = FabricTables(g, dict(healthy_states))
    healthy = prove_failure(g, none, every if every is not None else _reduced_pairs(sym, none),
                            healthy_states, costs=costs, net=net)
    out = []
    for c in classes:
        if exhaustive:
            assert c.members is not None and every is not None
            worst = None
            for f in c.members:      # the class's verdict: its first failing member, else its costliest
                v = prove_failure(g, f, every, compile_(f.failures), costs=costs, net=net)
                if worst is None or (worst.ok and (not v.ok or v.bisection_loss > worst.bisection_loss)):
                    worst = v
            assert worst is not None
            out.append(ClassProof(c, worst, len(every)))
        else:
            ps = _reduced_pairs(sym, c.representative)
            v = prove_failure(g, c.representative, ps, compile_(c.representative.failures), costs=costs, net=net)
            out.append(ClassProof(c, v, len(ps)))
        if progress:
            progress(f"{c.label}: {'ok' if out[-1].verdict.ok else 'FAILS'} ({out[-1].verdict.seconds:.1f} s)")
    return Proof(g.graph["scenario"].name, out, healthy, exhaustive, time.perf_counter() - t0)


# ---- the `hpnlab check` rule ------------------------------------------------------------------

def pct(x: float) -> str:
    return f"{100 * x:.1f}%".replace("-", "\u2212")


def figure(v: Verdict) -> str:
    """e.g. "delivered 100.0% / 0 loops / 0 cut / bisection -0.4% / worst uplink -1.7%": the share
    of the pairs walked whose ports are both up that were delivered on every branch (a cut pair
    counts as not delivered), loops and cut pairs (pairs walked: one per pair class when reduced)."""
    up = v.live + v.count("cut")
    share = v.delivered / up if up else 1.0
    return (f"delivered {pct(share)} / {v.count('loop')} loops / {v.count('cut')} cut / "
            f"bisection \u2212{100 * v.bisection_loss:.1f}% / worst uplink \u2212{100 * v.uplink_loss:.1f}%")
