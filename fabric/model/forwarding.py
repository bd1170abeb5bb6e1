"""The flow model's forwarding: the controller compiler's routes and entropy selection as arrays.

One source of truth. The model does not route by itself: it reads, per plane, the next-hop
sets the compiler installs (``hpnlab.fabric.routing.compiler.switch_actions``: valley-free
shortest paths over the live links, the same per-destination-leaf actions that the
aggregated longest-prefix routes encode, with de-aggregation after failures and the
detours a switch keeps for a dead one-port way), and how each switch's entropy table
sends a UDP source port to one port of a set:

* a set's role (leaf-up, spine-up, core-across, core-down, spine-down) reads its bit
  field of the controller's entropy map (``compiler.entropy_map``); pattern ``i`` of that
  field goes to port ``i mod n`` of the set (ports sorted);
* a set the compiler encodes as "a healthy set without port j" (after a failure, the
  route writes the healthy set's metadata with "avoid j") sends port j's patterns round
  robin over the set's other ports (``compiler.avoid_flows``);
* every choice goes through a fast-failover group [chosen port, the next 3 of the set]:
  the first live one forwards;
* a one-port way whose port is dead takes its detour group's first live bucket (a switch
  below that bounces), and from there the packet follows the switches' detour entries
  (``compiler``'s "Fast failover", read from the installed flows): a leaf, or a spine under
  cores, that gets a packet down an uplink for someone else (not its own prefix or pod)
  sends it back up avoiding that uplink, marked (``BOUNCE_MAC``); a spine or core sends a
  marked packet by its healthy routes, table 3 (one port: output; a set: the first live of
  its first 4 ports, whatever the entropy); a leaf that bounces drops a marked packet for
  someone else. The walk keeps, beside the switch, the link it came in by and whether the
  packet is marked (:meth:`Forwarding.walk`); a detour adds two links at most (a packet is
  detoured once, :attr:`Forwarding.max_hops`). A fat-tree's core detours *deep*
  (``compiler._deep``): the aggregation switch it reaches sends the packet down to an edge
  switch (its table-0 entry for ``DEEP_MAC``: the first live port of its group), unmarked, and
  that edge bounces it as above; four links more. A bucket back out of the ingress port (a
  switch coming back before its BFD sessions are up) is not modelled: the model's liveness is
  the failures', the same at both ends of a link.

A next-hop set reads only its role's bit field, so its choice is tabulated per value of
that field (a row of the choice table: one column per field pattern, with the row's bit
offset and mask beside it), and any source port -- each connection's own entropy values,
``hpnlab.fabric.routing.entropy.connection_values``, as the RoCE transport binds them --
is routed by array lookups per hop, vectorised over every flow of a step. The
scalar :meth:`Forwarding.leaf_path` answers the same for one source port, which is what
tests/unit/test_model_forwarding.py compares with the table interpreter (fabric/routing/oftable.py)
walking the compiled tables, for every host pair and every entropy pattern, with and
without failures.
"""
from __future__ import annotations

from typing import Any

import networkx as nx
import numpy as np

from hpnlab.fabric.routing import compiler as cc

MAX_HOPS = 6          # leaf, spine, core, far core, spine, leaf: 5 links, and one to spare
DETOUR_HOPS = 2       # a bounced detour's extra links: down to the switch that bounces, back up
DEEP_HOPS = 4         # a deep detour's: down to a spine, down to its leaf, back up twice
#: in ``multi``: the one-port way's detour marks the packet deep (``compiler._deep``), no choice row
DEEP_ROW = -3
SPORTS_LISTED = 4096  # source ports Forwarding.sports lists for the tests at most


def _prefix(value: int | tuple[int, int]) -> tuple[int, int]:
    """(network, mask) of an ``ipv4_dst`` match (an exact address, or (network, mask))."""
    return value if isinstance(value, tuple) else (value, 0xFFFFFFFF)


class Forwarding:
    """Per switch and destination leaf, the compiler's next-hop choice for every entropy value.

    ``port_link[s, port]``: the directed link id (of the model's :class:`Network`) out of switch
    ``s`` (index in sorted switch names) by that port; ``head``: directed link id -> index of
    the switch it leads to (-1: a host). Every source port is routed (:meth:`walk`); ``sports``
    only lists some for the tests (default: the map's first values, up to ``SPORTS_LISTED``).
    ``converged=False``: the healthy routes with the failed ports dead (what the fast-failover
    groups alone do before the controller's update).
    """

    def __init__(self, g: nx.MultiGraph, port_link: np.ndarray, head_switch: np.ndarray,
                 failed: set | None = None, sports: list[int] | None = None, converged: bool = True):
        self.g: nx.MultiGraph | None = g
        self.ix: Any = cc.index_of(g)
        ix = self.ix
        self.emap = cc.entropy_map(g)
        self.failures = cc.Failures.of(failed or ())
        if sports is None:             # for the tests: the map's first values (every one on small fabrics)
            sports = [self.emap.low_bits(k) for k in range(min(self.emap.path_count(), SPORTS_LISTED))]
        self.sports = list(sports)
        self.switches = sorted(ix.sw)
        self.sw_index = sw_index = {s: i for i, s in enumerate(self.switches)}
        leaves = [s for s in self.switches if ix.sw[s].tier == 1]
        self.leaves = leaves
        self.leaf_index = leaf_index = {s: i for i, s in enumerate(leaves)}
        self.leaf_sw = np.array([sw_index[s] for s in leaves], dtype=np.int64)
        self.head = head_switch
        self.port_link = port_link
        self.max_hops = MAX_HOPS
        self._detour_links: set[int] = set()    # the links dead one-port ways' detour groups pick
        self._deep = False                      # does one of them detour deep (``DEEP_ROW``)?
        dead_ports = cc._dead_ports(ix, self.failures) if self.failures else {}
        self.dead_ports = dead_ports
        acts = cc.switch_actions(g, self.failures) if converged else cc.switch_actions(g, None)
        n_sw, n_leaf = len(self.switches), len(leaves)
        # single[s, d]: directed link of a one-port way (-1: none); multi[s, d]: row of the choice table
        self.single = np.full((n_sw, n_leaf), -1, dtype=np.int32)
        self.multi = np.full((n_sw, n_leaf), -1, dtype=np.int32)
        choice_rows: list[tuple] = []     # (switch, set, avoided port, links, bit offset, bits): _choose
        plane_leaves: dict[int, list[int]] = {}
        for name in leaves:
            plane_leaves.setdefault(ix.sw[name].plane, []).append(leaf_index[name])
        plane_cols = {p: np.array(v, dtype=np.int64) for p, v in plane_leaves.items()}
        one_s: list[int] = []          # one-port ways of live ports, assigned at once below
        one_d: list[int] = []
        one_p: list[int] = []
        for name, (default, exceptions) in acts.items():
            sw = ix.sw[name]
            cols = plane_cols.get(sw.plane)
            if cols is None:
                continue
            si = sw_index[name]
            dead = dead_ports.get(name, set())
            memo: dict[tuple, tuple[int, int]] = {}
            s0, m0 = self._encode(cc, sw, si, default, dead, memo, choice_rows)
            self.single[si, cols] = s0
            self.multi[si, cols] = m0
            for dn, ports in exceptions.items():
                if len(ports) == 1 and ports[0] not in dead:
                    one_s.append(si)
                    one_d.append(leaf_index[dn])
                    one_p.append(ports[0])
                    continue
                d = leaf_index[dn]
                self.single[si, d], self.multi[si, d] = self._encode(cc, sw, si, ports, dead, memo, choice_rows)
        if one_s:
            si_a, d_a = np.array(one_s), np.array(one_d)
            self.single[si_a, d_a] = port_link[si_a, np.array(one_p)]
            self.multi[si_a, d_a] = -1
        self.bounce: tuple | None = None
        if self._detour_links:
            self._detour_tables(cc, dead_ports, plane_cols, choice_rows)
        self.ff_backups = cc.FF_BACKUPS
        self.sets = [(si, full, gone, links) for si, full, gone, links, _o, _b in choice_rows]
        self.row_off = np.array([o for *_x, o, _b in choice_rows], dtype=np.int64)
        self.row_mask = np.array([(1 << b) - 1 for *_x, b in choice_rows], dtype=np.int64)
        self.wide: dict[int, tuple[int, int]] = {}        # row -> (offset, bits) of its weighted-mode extra bits
        self.assignments: dict[int, tuple[int, ...]] = {}
        self._deal()

    def _deal(self) -> None:
        """The choice table from the sets (``sets``), their extra bits (``wide``) and weights (``assignments``)."""
        rows = [self._row(r) for r in range(len(self.sets))]
        width = max((len(row) for row in rows), default=1)
        self.choice = np.full((len(rows), width), -1, dtype=np.int32)
        for r, row in enumerate(rows):
            self.choice[r, :len(row)] = row
        self.row_off2 = np.array([self.wide.get(r, (0, 0))[0] for r in range(len(rows))], dtype=np.int64)
        self.row_mask2 = np.array([(1 << self.wide.get(r, (0, 0))[1]) - 1 for r in range(len(rows))], dtype=np.int64)
        self.row_shift2 = np.array([int(m).bit_length() for m in self.row_mask], dtype=np.int64)
        self.reads_high = bool(self.wide)

    def _row(self, r: int) -> np.ndarray:
        """Per pattern of row ``r`` (its map bits, then its extra bits in weighted mode), the directed
        link a switch's entropy table and fast-failover group send it to (-1: every bucket dead)."""
        _si, full, gone, links = self.sets[r]
        n = len(full)
        bits = int(self.row_mask[r]).bit_length()
        i = np.arange(1 << (bits + self.wide.get(r, (0, 0))[1]))
        assignment = self.assignments.get(r)
        if assignment is not None:               # weighted: pattern i to the port its assignment names
            j = np.array([full.index(p) for p in assignment], dtype=np.int64)
        else:
            j = (i & ((1 << bits) - 1)) % n      # pattern i of the map's bits to port i mod n (ecmp)
        if gone is not None:                     # port gone's patterns dealt over the others in turn
            others = np.array(list(range(gone + 1, n)) + list(range(gone)), dtype=np.int64)
            on_gone = j == gone
            j[on_gone] = others[((i[on_gone] - gone) // n) % (n - 1)]
        out = np.full(len(i), -1, dtype=np.int64)
        for t in range(min(n, 1 + self.ff_backups)):      # the fast-failover group [j, j+1, ...]: first live
            cand = links[(j + t) % n]
            pick = (out < 0) & (cand >= 0)
            out[pick] = cand[pick]
        return out

    def planes_copied(self, switches: list[str], leaves: list[str], sw_map: np.ndarray, leaf_map: np.ndarray,
                      link_map: np.ndarray, head: np.ndarray, port_link: np.ndarray) -> Forwarding:
        """This healthy forwarding of plane 0 copied to every plane (``Network.planes_copied``: plane p's
        copy of plane-0 switch i is ``sw_map[p, i]``, of leaf d ``leaf_map[p, d]``, of directed link l
        ``link_map[p, l]``): plane p's switches forward as plane 0's twins do, over their twins' links.
        Choice rows plane by plane, as the compiler lists the switches (plane by plane)."""
        assert not self.dead_ports and self.bounce is None and not self.wide and not self.assignments
        planes = len(sw_map)
        out = object.__new__(Forwarding)        # not copy.copy: __getstate__ leaves the compiler's parts out
        out.__dict__.update(self.__dict__)
        out.g = out.ix = None
        out.switches = switches
        out.sw_index = {s: i for i, s in enumerate(switches)}
        out.leaves = leaves
        out.leaf_index = {s: i for i, s in enumerate(leaves)}
        out.leaf_sw = np.array([out.sw_index[s] for s in leaves], dtype=np.int64)
        out.head, out.port_link = head, port_link
        n_rows = len(self.sets)
        single = np.full((len(switches), len(leaves)), -1, dtype=self.single.dtype)
        multi = np.full_like(single, -1, dtype=self.multi.dtype)
        sets = []
        for p in range(planes):
            rows, cols = np.ix_(sw_map[p], leaf_map[p])
            single[rows, cols] = np.where(self.single >= 0, link_map[p][np.maximum(self.single, 0)], self.single)
            multi[rows, cols] = np.where(self.multi >= 0, self.multi + p * n_rows, self.multi)
            sets += [(int(sw_map[p, si]), full, gone, np.where(links >= 0, link_map[p][np.maximum(links, 0)], -1))
                     for si, full, gone, links in self.sets]
        out.single, out.multi, out.sets = single, multi, sets
        out.row_off, out.row_mask = np.tile(self.row_off, planes), np.tile(self.row_mask, planes)
        out.wide, out.assignments = {}, {}
        out._deal()
        return out

    def weighted_sets(self, masks: dict[int, int]) -> dict[int, tuple[str, tuple[int, ...], int]]:
        """Weighted mode's sets (``compiler.weighted_masks``: per field mask, the wider mask its sets
        read): per choice row that the controller re-weights (a healthy set; "avoid" sets read only
        the map's bits), (switch, ports, wider mask). Widens those rows (equal shares: every source
        port still takes ecmp's port) and sources then need their high bits (:attr:`reads_high`)."""
        out = {}
        for r, (si, full, gone, _links) in enumerate(self.sets):
            mask = int(self.row_mask[r]) << int(self.row_off[r])
            wide = masks.get(mask)
            if gone is not None or wide is None:
                continue
            extra = wide & ~mask
            off = (extra & -extra).bit_length() - 1
            self.wide[r] = (off, bin(extra).count("1"))
            out[r] = (self.switches[si], full, wide)
        self._deal()
        return out

    def reweight(self, assignments: dict[int, tuple[int, ...]]) -> None:
        """Deal the rows named (choice row -> port per pattern, weighted_sets' rows) as the controller's
        weights say."""
        self.assignments.update(assignments)
        self._deal()

    # -- the compiler's selection, one set at a time -------------------------------------------------

    def _encode(self, cc: Any, sw: Any, si: int, ports: tuple, dead: set, memo: dict,
                choice_rows: list) -> tuple[int, int]:
        """(one-port link, row of the choice table) of a next-hop set at ``sw`` (-1: none)."""
        got = memo.get(ports)
        if got is None:
            if not ports:
                got = (-1, -1)
            elif len(ports) == 1:
                p = ports[0]
                if p in dead:            # the route's fast-failover group: the first live detour
                    pr = self.ix.protection(sw)
                    got = self._decode(cc, sw, si, pr, pr.single.get(p, (("output", p),)), dead, choice_rows)
                    if got[0] >= 0:
                        self._detour_links.add(got[0])
                    self._deep |= got[1] == DEEP_ROW
                else:
                    got = (int(self.port_link[si, p]), -1)
            else:
                choice_rows.append(self._choose(cc, sw, si, ports, dead))
                got = (-1, len(choice_rows) - 1)
            memo[ports] = got
        return got

    def _choose(self, cc: Any, sw: Any, si: int, ports: tuple, dead: set) -> tuple:
        """(switch, the healthy set, the port it avoids or None, per port its directed link (-1: dead),
        bit offset, bits) of a next-hop set: one row of the choice table (:meth:`_row`)."""
        pr = self.ix.protection(sw)
        enc = pr.encode(ports)
        full, gone = ports, None
        if enc is not None and enc and enc[0][0] == "metadata":
            full, gone = self._meta_set(cc, pr, enc[0][1])
        return self._set_row(cc, sw, si, full, gone, dead)

    @staticmethod
    def _meta_set(cc: Any, pr: Any, meta: int) -> tuple[tuple, int | None]:
        """(the healthy set, the port index it avoids or None) that route metadata ``meta`` selects."""
        if not meta >> 32:
            return next(p for p, m in pr.metas.items() if m == meta), None
        base = meta & cc.FULL                    # "the healthy set ``full`` without its port ``gone``"
        return next(p for p, m in pr.metas.items() if m == base), (meta >> 32) - 1

    def _set_row(self, cc: Any, sw: Any, si: int, full: tuple, gone: int | None, dead: set) -> tuple:
        off, bits = cc._field(self.ix, sw, full)
        links = np.array([-1 if p in dead else int(self.port_link[si, p]) for p in full], dtype=np.int64)
        return si, tuple(full), gone, links, off, bits

    def _decode(self, cc: Any, sw: Any, si: int, pr: Any, actions: tuple, dead: set,
                choice_rows: list) -> tuple[int, int]:
        """(one-port link, row of the choice table) of installed actions (-1: none): drop; output
        (dead: dropped); a fast-failover group (its first live bucket, fixed while liveness is);
        a next-hop set's metadata (a new row; its fast-failover groups in :meth:`_row`)."""
        act = [a for a in actions if a[0] not in ("set_field", "goto")]
        if not act:
            return -1, -1
        kind, value = act[0][0], act[0][1]
        if kind == "metadata":
            full, gone = self._meta_set(cc, pr, value)
            choice_rows.append(self._set_row(cc, sw, si, full, gone, dead))
            return -1, len(choice_rows) - 1
        if kind == "group":
            buckets = next(g.buckets for g in pr.groups.values() if g.group_id == value)
            # a bucket that watches a group sends the packet back where it came from: not modelled (a drop)
            port, out = next(((q, o) for q, o in buckets if isinstance(q, int) and q not in dead), (None, ()))
            if port is not None and ("set_field", "eth_src", cc.DEEP_MAC) in out:
                return int(self.port_link[si, port]), DEEP_ROW      # a core's deep detour
        else:
            assert kind == "output", actions
            port = None if value in dead else value
        return (-1 if port is None else int(self.port_link[si, port])), -1

    def _detour_tables(self, cc: Any, dead_ports: dict, plane_cols: dict, choice_rows: list) -> None:
        """The switches' detour entries, for the planes with a dead port (read from what every switch
        holds whatever fails, ``compiler._Protection.flows``):

        * ``bounce``: per directed link into a switch (last: none, a walk's start), the row of the
          bounce entry (table 0, in_port = an uplink) for packets that come in by it (-1: none),
          and per row: its action (one-port link, choice row) and the switch's own prefix (net,
          mask), which it routes as usual. Only the links the detour groups pick get a row: an
          unmarked packet comes down an uplink for someone else by a detour only (routes go down
          only towards the destination);
        * ``marked``: per switch and destination leaf, where a marked packet goes: table 3's
          healthy route (spines and cores: longest prefix first; one port, or a set's group, both
          fixed by liveness), dropped (-1: also a leaf that bounces), or -2: its table-1 route as
          any packet (a leaf without detour entries)."""
        ix = self.ix
        n_sw, n_leaf = len(self.switches), len(self.leaves)
        prefixes = [ix.sw[s].prefix or (0, 0) for s in self.leaves]
        leaf_net = np.array([p[0] for p in prefixes], dtype=np.int64)
        leaf_len = np.array([p[1] for p in prefixes], dtype=np.int64)
        marked = np.full((n_sw, n_leaf), -1, dtype=np.int32)
        memo: dict = {}
        planes = {ix.sw[n].plane for n in dead_ports}
        for name in self.switches:
            sw = ix.sw[name]
            if sw.plane not in planes or name in self.failures.switches:
                continue
            si = self.sw_index[name]
            pr = ix.protection(sw)
            marked_drop, _bounce, table3 = self._entries(cc, pr, memo)
            if sw.tier == 1:
                if not marked_drop:
                    marked[si] = -2
                continue
            cols = plane_cols[sw.plane]
            which = memo.get((id(pr), sw.plane))      # per column: its longest prefix's entry (-1: none)
            if which is None:
                which = memo[id(pr), sw.plane] = np.full(len(cols), -1, dtype=np.int64)
                for e, (net, mask, _ports) in enumerate(table3):
                    hit = (which < 0) & ((leaf_net[cols] & mask) == net) & (leaf_len[cols] >= mask.bit_count())
                    which[hit] = e
            dead = dead_ports.get(name, set())
            out = [next((int(self.port_link[si, p]) for p in ports if p not in dead), -1) for _n, _m, ports in table3]
            marked[si, cols] = np.array(out + [-1], dtype=np.int32)[which]
        # a deep detour (``compiler._deep``): the spine it reaches sends it down to a leaf that bounces
        deep_way = np.full(n_sw, -1, dtype=np.int32)
        deep_links: set[int] = set()
        if self._deep:
            for name in self.switches:
                sw = ix.sw[name]
                if sw.tier != 2 or sw.plane not in planes or name in self.failures.switches:
                    continue
                pr = ix.protection(sw)
                down = next((f.actions for f in pr.flows if f.table == cc.TABLE_CLASSIFY
                             and f.priority == cc.PRIO_DEEP), None)
                if down is not None:
                    si = self.sw_index[name]
                    lk, _row = self._decode(cc, sw, si, pr, down, dead_ports.get(name, set()), choice_rows)
                    deep_way[si] = lk
                    if lk >= 0:
                        deep_links.add(lk)
        self.deep_way = deep_way
        in_row = np.full(len(self.head) + 1, -1, dtype=np.int32)
        rows: list[tuple[int, int, int, int]] = []
        for link in sorted(self._detour_links | deep_links):
            si = int(self.head[link])
            sw = ix.sw[self.switches[si]]
            pr = ix.protection(sw)
            bounce = self._entries(cc, pr, memo)[1]
            port = int(np.flatnonzero(self.port_link[si] == link ^ 1)[0])    # where it comes in
            if port not in bounce:
                continue
            net, mask = _prefix(dict(next(iter(cc._own_flow(ix, sw))).match)["ipv4_dst"])
            lk, row = self._decode(cc, sw, si, pr, bounce[port], dead_ports.get(sw.name, set()), choice_rows)
            in_row[link] = len(rows)
            rows.append((lk, row, net, mask))
        self.marked = marked
        b = np.array(rows, dtype=np.int64).reshape(-1, 4)
        self.bounce = (in_row, b[:, 0].astype(np.int32), b[:, 1].astype(np.int32), b[:, 2], b[:, 3], leaf_net)
        self.max_hops = MAX_HOPS + (DEEP_HOPS if self._deep else DETOUR_HOPS)

    @staticmethod
    def _entries(cc: Any, pr: Any, memo: dict) -> tuple[bool, dict, list]:
        """A protection's detour entries (read once per protection: switches alike share one):
        (does it drop marked packets, {in_port: bounce actions}, table 3 as (net, mask, ports
        whose first live one forwards) longest prefix first)."""
        got = memo.get(id(pr))
        if got is None:
            # a bucket that watches a group (back where the packet came from) is not modelled: a drop
            groups = {g.group_id: tuple(q for q, _out in g.buckets if isinstance(q, int)) for g in pr.groups.values()}
            drop, bounce, table3 = False, {}, []
            for f in pr.flows:
                if f.table == cc.TABLE_CLASSIFY:
                    drop |= f.priority == cc.PRIO_MARKED_DROP
                    if f.priority == cc.PRIO_BOUNCE:
                        bounce[dict(f.match)["in_port"]] = f.actions
                elif f.table == cc.TABLE_BOUNCED:
                    act = f.actions[0] if f.actions else ("drop", None)
                    ports = groups[act[1]] if act[0] == "group" else (act[1],) if act[0] == "output" else ()
                    table3.append((-f.priority, *_prefix(dict(f.match)["ipv4_dst"]), ports))
            got = memo[id(pr)] = (drop, bounce, [t[1:] for t in sorted(table3)])
        return got

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for k in ("g", "ix", "emap", "failures", "dead_ports"):
            state.pop(k, None)
        return state

    # -- paths -------------------------------------------------------------------------------------

    def walk(self, src_leaf: np.ndarray, dst_leaf: np.ndarray, sport: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Directed link ids from leaf to leaf (leaf indices), for UDP source port ``sport``:
        (links (m, ``max_hops``), -1 padded (a view of a hop-major array: ``links[:, h]`` is
        contiguous); ok (m,) bool: the walk reached its leaf). Each hop looks up only the walks
        still on their way, kept compact; where a one-port way detours (:attr:`bounce`), each
        walk also keeps the link it came in by and whether its packet is marked."""
        m = len(src_leaf)
        sport = np.broadcast_to(np.asarray(sport, dtype=np.int64), (m,))
        dst_leaf = np.broadcast_to(np.asarray(dst_leaf, dtype=np.int64), (m,))
        by_hop = np.full((self.max_hops, m), -1, dtype=np.int32)
        target = self.leaf_sw[dst_leaf]
        cur = self.leaf_sw[src_leaf]
        idx = np.flatnonzero(cur != target)             # the walks on their way, and for each:
        ok = np.ones(m, dtype=bool)
        ok[idx] = False
        cur, dst, tgt, sp = cur[idx], dst_leaf[idx], target[idx], sport[idx]
        n_leaf = self.single.shape[1]
        single, multi = self.single.ravel(), self.multi.ravel()
        choice, width = self.choice.ravel(), self.choice.shape[1]
        detours = self.bounce is not None
        if detours:                                     # the link each came in by (-1: a host), marked? deep?
            came = np.full(len(idx), -1, dtype=np.int64)
            marked = np.zeros(len(idx), dtype=bool)
            deep = np.zeros(len(idx), dtype=bool)
        for h in range(self.max_hops):
            if not len(idx):
                break
            at = cur * n_leaf + dst
            lk = single[at]
            row = multi[at]
            if detours:
                marked, deep = self._detour_step(at, dst, came, marked, deep, lk, row)
            chosen = np.flatnonzero(row >= 0)
            if len(chosen):
                r = row[chosen]
                pattern = (sp[chosen] >> self.row_off[r]) & self.row_mask[r]
                if self.reads_high:             # weighted mode: the extra bits above the map's pattern
                    pattern |= ((sp[chosen] >> self.row_off2[r]) & self.row_mask2[r]) << self.row_shift2[r]
                lk[chosen] = choice[r * width + pattern]
            by_hop[h, idx] = lk
            nxt = self.head[np.maximum(lk, 0)]
            dead_end = lk < 0
            arrived = (nxt == tgt) & ~dead_end
            ok[idx[arrived]] = True
            if dead_end.any():
                by_hop[:, idx[dead_end]] = -1
            on = ~(arrived | dead_end)
            idx, cur, dst, tgt, sp = idx[on], nxt[on], dst[on], tgt[on], sp[on]
            if detours:
                came, marked, deep = lk[on], marked[on], deep[on]
        if len(idx):                                    # out of hops: no path
            by_hop[:, idx] = -1
        return by_hop.T, ok

    def _detour_step(self, at: np.ndarray, dst: np.ndarray, came: np.ndarray, marked: np.ndarray,
                     deep: np.ndarray, lk: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Table 0's detour entries for the walks at switch/destination ``at`` (``cur * leaves +
        dst``): a marked packet takes the switch's :attr:`marked` way; a packet marked deep, the
        spine's way down to a leaf (:attr:`deep_way`), unmarked from then on; an unmarked one that
        came down an uplink of a switch that bounces, for someone outside its own prefix, that
        switch's bounce entry (and is marked from then on); one whose one-port way here detours
        deep (``DEEP_ROW``) is marked deep. Changes ``lk`` and ``row`` in place; returns the walks'
        marks."""
        assert self.bounce is not None
        in_row, b_link, b_row, b_net, b_mask, leaf_net = self.bounce
        was_deep = deep
        if deep.any():
            on = np.flatnonzero(deep)
            lk[on] = self.deep_way[at[on] // self.single.shape[1]]
            row[on] = -1
            deep = np.zeros_like(deep)
        if marked.any():
            on = np.flatnonzero(marked)
            way = self.marked.ravel()[at[on]]
            table3 = way != -2                          # -2: a leaf without detour entries, table 1
            on, way = on[table3], way[table3]
            lk[on] = way
            row[on] = -1
        b = in_row[came]
        bounced = np.flatnonzero((b >= 0) & ~marked & ~was_deep)
        if len(bounced):
            bb = b[bounced]
            out = (leaf_net[dst[bounced]] & b_mask[bb]) != b_net[bb]       # not its own prefix
            bounced, bb = bounced[out], bb[out]
            lk[bounced] = b_link[bb]
            row[bounced] = b_row[bb]
            marked = marked.copy()
            marked[bounced] = True
        going = row == DEEP_ROW
        if going.any():
            deep = going & ~marked
            row[going] = -1
        return marked, deep

    def leaf_path(self, src_leaf: str, dst_leaf: str, sport: int) -> list[int] | None:
        """One source port's directed links from leaf to leaf (None: no path), for the tests."""
        links, ok = self.walk(np.array([self.leaf_index[src_leaf]]), np.array([self.leaf_index[dst_leaf]]),
                              np.array([sport]))
        return [int(x) for x in links[0] if x >= 0] if ok[0] else None

    def reaches(self, src_leaf: str, dst_leaf: str) -> bool:
        return self.leaf_path(src_leaf, dst_leaf, 0) is not None
