"""A fabric of interpreted switches driven by the pure reconciler, message by message.

The reconciler's messages go into one FIFO queue per switch; an *interleaving* picks which
switch's queue moves next (each switch keeps its own order, as a real switch does). A
FlowMod, GroupMod or WipeTables changes that switch's interpreted tables (tests/oftable.py); a
Barrier is answered at once (everything before it in that queue is applied); a
FlowStatsRequest or GroupDescRequest is answered with the switch's interpreted tables. After
every table change every host pair on every plane is walked on every entropy branch, and
``check`` decides whether the state is acceptable.

``compile_fn`` replaces the compiler (a test can give switch states with groups made by
hand, see :func:`with_uplink_ff_groups`).

    replay = Replay(graph, "aggregate")
    replay.start()                                    # every switch connects and is installed
    replay.fail_link(("p0l0", "p0s0", 0))             # the link dies, then one end reports it
    replay.repair_link(("p0l0", "p0s0", 0))
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx

from hpnlab.controller import reconcile
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import FabricTables, valley_free_reachable
from hpnlab.fabric.scenario import graph as fgraph

Interleaving = Callable[[list[str], int], str]


def switch_by_switch(ready: list[str], step: int) -> str:
    """Drain the first switch (name order) that has messages."""
    return ready[0]


def reverse_switch_by_switch(ready: list[str], step: int) -> str:
    return ready[-1]


def round_robin(ready: list[str], step: int) -> str:
    """One message from each switch in turn."""
    return ready[step % len(ready)]


INTERLEAVINGS = {"switch-by-switch": switch_by_switch, "reverse": reverse_switch_by_switch,
                 "round-robin": round_robin}


@dataclass
class Counts:
    events: int = 0
    states: int = 0                 # intermediate table states checked (one per table change)
    pair_branches: int = 0          # (pair, entropy branch) outcomes checked over all states
    walks: int = 0                  # walks actually run (a walk not crossing the changed switch is reused)
    problems: list = field(default_factory=list)

    def add(self, other: Counts) -> None:
        self.events += other.events
        self.states += other.states
        self.pair_branches += other.pair_branches
        self.walks += other.walks
        self.problems += other.problems


class Replay:
    def __init__(self, g: nx.MultiGraph, policy: str, interleaving: Interleaving = switch_by_switch,
                 compile_fn: reconcile.CompileFn = compiler.compile_fabric):
        self.g = g
        self.reconciler = reconcile.Reconciler(g, policy, compile_fn=compile_fn)
        self.net = FabricTables(g, {}, compiler.Failures())
        self.interleaving = interleaving
        self.queues: dict[str, deque] = {sw: deque() for sw in fgraph.switches(g)}
        self.now = 0.0
        self.pairs = self.net.all_pairs()
        self.sports: list[int] = []
        self.outcome: dict[tuple, tuple[str, frozenset]] = {}    # (pair, sport) -> (result, switches crossed)
        self.at_fault: dict[tuple, tuple[str, frozenset]] = {}   # the outcomes when the fault happened
        self.counts = Counts()
        self.sent: list = []        # every message the reconciler sent
        self.mode = "monotone"

    # ---- driving ----------------------------------------------------------------------
    def feed(self, event) -> list:
        self.counts.events += 1
        msgs = self.reconciler.handle(event, self.now)
        self.sent += msgs
        for m in msgs:
            self.queues[m.switch].append(m)
        return msgs

    def drain(self, check: bool = True) -> None:
        step = 0
        while True:
            ready = sorted(sw for sw, q in self.queues.items() if q)
            if not ready:
                return
            sw = self.interleaving(ready, step)
            step += 1
            msg = self.queues[sw].popleft()
            if isinstance(msg, (reconcile.FlowMod, reconcile.GroupMod, reconcile.WipeTables)):
                self.net.apply(msg)
                if check:
                    self.check(changed=msg.switch)
            elif isinstance(msg, reconcile.Barrier):
                self.feed(reconcile.BarrierReply(sw, msg.xid))
            elif isinstance(msg, reconcile.FlowStatsRequest):
                flows = tuple(reconcile.FlowEntry(k[0], k[1], k[2], a) for k, a in self.net.entries(sw).items())
                self.feed(reconcile.FlowStatsReply(sw, msg.xid, flows))
            elif isinstance(msg, reconcile.GroupDescRequest):
                self.net.entries(sw)
                self.feed(reconcile.GroupDescReply(sw, msg.xid, tuple(self.net.group_table(sw).values())))

    def table(self, sw: str) -> dict:
        """What ``sw`` holds, as the reconciler's SwitchTable (flows and groups)."""
        out = self.net.entries(sw)
        for gid, group in self.net.group_table(sw).items():
            out[reconcile.GroupKey(gid)] = reconcile.canonical_group(group)
        return out

    def start(self) -> None:
        """Every switch connects, reports its ports up and is installed (not checked: nothing
        forwards before the fabric is installed)."""
        for sw in fgraph.switches(self.g):
            self.net.load(sw, {})
            self.feed(reconcile.SwitchUp(sw))
            self.feed(reconcile.PortStatus(sw, dict.fromkeys(self._ports(sw), True)))
        self.drain(check=False)
        assert self.reconciler.settled

    def _ports(self, sw: str) -> list[int]:
        return [d["ports"][sw] for _u, _v, d in self.g.edges(sw, data=True)]

    # ---- faults -----------------------------------------------------------------------
    def _physical(self, links=None, switches=None) -> None:
        """The fabric changes (before any switch reports it); the entropy branches walked from
        now on cover every bit pattern of the tables now and of the tables the change leads to."""
        f = self.net.failures
        after = compiler.Failures(frozenset(f.links if links is None else links),
                           frozenset(f.switches if switches is None else switches))
        self.net.failures = after
        mask = 0
        for st in self.reconciler.compile_fn(self.g, after, self.reconciler.policy).values():
            for flow in st.flows:
                for name, value in flow.match:
                    if name == "udp_src":
                        mask |= value[1]
        self.sports = self.net.entropy_ports(extra_mask=mask)

    def fail_link(self, lid: tuple) -> list:
        """The link dies; one end reports it; then the other end (which must change nothing)."""
        u, v, _k = lid
        port = self.g.edges[lid]["ports"]
        self._physical(links=self.net.failures.links | {lid})
        self.begin("monotone")
        first = self.feed(reconcile.PortStatus(u, {port[u]: False}))
        self.drain()
        second = self.feed(reconcile.PortStatus(v, {port[v]: False}))
        self.drain()
        self.end()
        return [first, second]

    def repair_link(self, lid: tuple) -> list:
        """The link comes back; one end reports it up (the other still says down: nothing
        changes), then the other."""
        u, v, _k = lid
        port = self.g.edges[lid]["ports"]
        self._physical(links=self.net.failures.links - {lid})
        self.begin("monotone")
        first = self.feed(reconcile.PortStatus(u, {port[u]: True}))
        self.drain()
        second = self.feed(reconcile.PortStatus(v, {port[v]: True}))
        self.drain()
        self.end()
        return [first, second]

    def fail_switch(self, sw: str) -> None:
        self._physical(switches=self.net.failures.switches | {sw})
        self.net.forget(sw)
        self.begin("monotone")
        self.feed(reconcile.SwitchDown(sw))
        self.drain()
        self.end()

    def repair_switch(self, sw: str) -> None:
        """The switch returns with empty tables, connects and reports its ports."""
        self._physical(switches=self.net.failures.switches - {sw})
        self.net.load(sw, {})
        self.begin("monotone")
        self.feed(reconcile.SwitchUp(sw, dict.fromkeys(self._ports(sw), True)))
        self.drain()
        self.end()

    # ---- checking ----------------------------------------------------------------------
    def begin(self, mode: str) -> None:
        self.mode = mode
        self.outcome = {}
        self.check(changed=None)
        self.at_fault = dict(self.outcome)

    def check(self, changed: str | None) -> None:
        """Walk every pair on every branch (re-walking only those that crossed ``changed``) and
        record loops and delivered outcomes lost since the previous state."""
        self.counts.states += 1
        for pair in self.pairs:
            src, dst, plane, sr, dr = pair
            for sport in self.sports:
                key = (pair, sport)
                self.counts.pair_branches += 1
                before = self.outcome.get(key)
                if before is not None and changed is not None and changed not in before[1]:
                    continue
                walk = self.net.send(src, dst, plane, src_rail=sr, dst_rail=dr, sport=sport)
                self.counts.walks += 1
                now = (walk.result, frozenset(h[0] for h in walk.hops))
                self.outcome[key] = now
                if walk.result == "loop":
                    self.counts.problems.append(f"LOOP {key}: {walk.where} {walk.hops}")
                elif before is not None and before[0] == "delivered" and walk.result != "delivered":
                    self.counts.problems.append(f"LOST {key} after a change on {changed}: {walk.where} {walk.hops}")

    def end(self) -> None:
        """Settled, and every pair the live fabric connects is delivered on every branch."""
        assert self.reconciler.settled, "the reconciler did not settle"
        for sw, table in self.reconciler.confirmed.items():
            assert table == self.table(sw), f"{sw}: confirmed state differs from the switch's tables"
        for sw in self.reconciler.connected:
            assert self.reconciler.confirmed.get(sw) == self.reconciler.desired.get(sw, {}), \
                f"{sw}: settled, but what it holds is not its desired table"
        failures = self.net.failures
        leaf = {(h, p["plane"], p["rail"]): p["leaf"] for h in fgraph.hosts(self.g)
                for p in fgraph.host_ports(self.g, h)}
        reachable: dict[tuple[str, str], bool] = {}     # per leaf pair (many host pairs share one)
        for pair in self.pairs:
            src, dst, plane, sr, dr = pair
            leaves = (leaf[src, plane, sr], leaf[dst, plane, dr])
            if leaves not in reachable:
                reachable[leaves] = valley_free_reachable(self.g, failures, *leaves)
            connected = self.net.live(src, plane, sr) and self.net.live(dst, plane, dr) and reachable[leaves]
            for sport in self.sports:
                result = self.outcome[pair, sport][0]
                if connected and result != "delivered":
                    self.counts.problems.append(f"NOT REPAIRED {pair} sport {sport:#x}: {result}")
