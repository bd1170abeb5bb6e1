"""Replay proofs: the reconciler's messages applied one at a time to interpreted tables
(tests/support/replay.py, tests/oftable.py), with every host pair on every plane walked on every
entropy branch after every single table change.

Invariants, for each failure below and its repair:
- no packet ever loops;
- no (pair, branch) that was delivered stops being delivered at the next message (for a
  repair: nothing that worked before is ever black-holed; for a failure: what the failure
  broke is only ever repaired);
- at the end every pair the live fabric connects is delivered on every branch, and the
  reconciler's confirmed state is exactly what the switches hold;
- a switch that returns is installed whole, strictly before any other switch changes where it
  sends an address (reading what it holds is the first step, its tables the second).

Coverage, within a time budget (the interpreter walks some ten thousand branches a second
here; an exhaustive sweep of the five small presets takes about two minutes):
- exhaustive on mini-spine-leaf and mini-rail: every fabric link taken down at both ends (one
  end reports, then the other) and repaired; every link cut with only one end noticing and
  mended (the lower tier's end for every other link, the upper tier's for the rest, so both
  sides of each role are covered); every switch failed and repaired;
- by symmetry on mini-hpn, fat-tree-4 and mini-cross-campus, the same for one link per role
  and position and one switch per tier and position (``representatives``). The argument: the
  planes are copies (same ports, same generator), so plane 0 stands for all; within a plane the
  compiler sees a link only through the tiers of its ends and the places of its ports in its
  ends' sorted port lists (entropy patterns are dealt round-robin over a set, fast-failover and
  detour buckets rotate from a port's place, ties between equally common actions go to the
  smallest ports). Every set here has at most four ports, so a group holds the whole set and
  the rotations are the same up to a cyclic shift; what a cyclic shift can still change is the
  tie-break at the ends, so the first and the last place of each role are replayed.
- the aggregate policy and the switch-by-switch interleaving everywhere; the host-routes policy
  and the reverse interleaving on the symmetric samples of mini-hpn and mini-cross-campus.
Each test asserts its coverage (failures x pairs x branches x states) is what it claims.
"""
from __future__ import annotations

import functools

import pytest
from support.fabrics import fabric
from support.replay import Replay, reverse_switch_by_switch, switch_by_switch

from hpnlab.controller import reconcile
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph

INTERLEAVINGS = {"switch-by-switch": switch_by_switch, "reverse": reverse_switch_by_switch}
EXHAUSTIVE = ["mini-spine-leaf", "mini-rail"]
BY_SYMMETRY = ["mini-hpn", "fat-tree-4", "mini-cross-campus"]


def problems(replay: Replay) -> str:
    return f"{len(replay.counts.problems)} problems, e.g.:\n" + "\n".join(replay.counts.problems[:5])


def fabric_links(g) -> list[tuple]:
    return [compiler.link_id(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] != "host"]


def _ends(g, lid: tuple) -> tuple[str, str]:
    """(lower tier's end, upper tier's end); a lateral link: name order."""
    u, v = lid[:2]
    return (u, v) if (g.nodes[u]["tier"], u) <= (g.nodes[v]["tier"], v) else (v, u)


def _place(ports: list[int], port: int) -> str:
    """A port's place in a switch's sorted ports of one kind: first, last or between."""
    ports = sorted(ports)
    return "first" if port == ports[0] else "last" if port == ports[-1] else "between"


def _kind_ports(g, sw: str, peer_tier: int) -> list[int]:
    return [d["ports"][sw] for _u, n, d in g.edges(sw, data=True) if g.nodes[n]["tier"] == peer_tier]


@functools.cache
def representatives(name: str) -> tuple[list[tuple], list[str]]:
    """Plane 0's links, one per role (tiers and pod relation of its ends) and place (first or last
    at both ends), and its switches, one per tier and place (first or last of the tier)."""
    g = fabric(name)
    links: dict[tuple, tuple] = {}
    for lid in fabric_links(g):
        lo, hi = _ends(g, lid)
        if g.nodes[lo].get("plane", 0) != 0:
            continue
        ports = g.edges[lid]["ports"]
        places = (_place(_kind_ports(g, lo, g.nodes[hi]["tier"]), ports[lo]),
                  _place(_kind_ports(g, hi, g.nodes[lo]["tier"]), ports[hi]))
        if places in (("first", "first"), ("last", "last")):
            role = (g.nodes[lo]["tier"], g.nodes[hi]["tier"], g.nodes[lo].get("pod") == g.nodes[hi].get("pod"))
            links.setdefault((role, places), lid)
    switches: dict[tuple, str] = {}
    by_tier: dict[int, list[str]] = {}
    for sw in graph.switches(g):
        if g.nodes[sw].get("plane", 0) == 0:
            by_tier.setdefault(g.nodes[sw]["tier"], []).append(sw)
    for tier, names in by_tier.items():
        switches[tier, "first"], switches[tier, "last"] = names[0], names[-1]
    return list(links.values()), sorted(set(switches.values()))


def covered(name: str) -> tuple[list[tuple], list[str]]:
    g = fabric(name)
    if name in EXHAUSTIVE:
        return fabric_links(g), list(graph.switches(g))
    return representatives(name)


class OneSided(Replay):
    """A replay that can also cut a link with only one end noticing (its port goes down, the
    peer's stays up: the peer's fast-failover groups keep sending into it until the controller
    routes around it)."""

    def cut_link(self, lid: tuple, end: str) -> list:
        port = self.g.edges[lid]["ports"][end]
        self._one_sided(frozenset([(end, port)]), after=self.net.failures.links | {lid})
        self.begin("monotone")
        msgs = self.feed(reconcile.PortStatus(end, {port: False}))
        self.drain()
        self.end_cut(lid)
        return msgs

    def mend_link(self, lid: tuple, end: str) -> list:
        port = self.g.edges[lid]["ports"][end]
        self._one_sided(frozenset(), after=self.net.failures.links)
        self.begin("monotone")
        msgs = self.feed(reconcile.PortStatus(end, {port: True}))
        self.drain()
        self.end()
        return msgs

    def _one_sided(self, ports: frozenset, after: frozenset) -> None:
        net = self.net
        net.one_sided = ports
        net._cut = {net.peer[sp][2] for sp in ports}
        self._physical(links=after)          # the branches of the tables the change leads to
        self.net.failures = compiler.Failures(frozenset(self.net.failures.links & after) - net._cut,
                                              self.net.failures.switches)

    def end_cut(self, lid: tuple) -> None:
        """``end``, with the cut link counted as failed for what the live fabric connects."""
        live = self.net.failures
        self.net.failures = compiler.Failures(live.links | {lid}, live.switches)
        try:
            self.end()
        finally:
            self.net.failures = live


def returning_switch_goes_first(replay: Replay, sw: str, since: int) -> None:
    """Of the messages sent since ``since``: reading back what the returning switch holds (nothing)
    is the whole first step, its tables all go before any other switch's route or group changes."""
    sent = replay.sent[since:]
    mods = [(i, m) for i, m in enumerate(sent) if isinstance(m, (reconcile.FlowMod, reconcile.GroupMod))]
    assert isinstance(sent[0], reconcile.FlowStatsRequest) and sent[0].switch == sw
    assert isinstance(sent[1], reconcile.GroupDescRequest) and sent[1].switch == sw
    own = [i for i, m in mods if m.switch == sw]
    assert own, f"{sw} got no tables"
    others = [i for i, m in mods if m.switch != sw
              and (isinstance(m, reconcile.GroupMod) or m.table == compiler.TABLE_ROUTE)]
    assert not others or min(others) > max(own), f"another switch changed its forwarding before {sw} was installed"


def replay_every_failure(name: str, policy: str, interleaving: str) -> OneSided:
    g = fabric(name)
    links, switches = covered(name)
    replay = OneSided(g, policy, INTERLEAVINGS[interleaving])
    replay.start()
    for i, lid in enumerate(links):
        _first, second = replay.fail_link(lid)
        assert second == [], "the second end's report of a link already down must change nothing"
        first, _second = replay.repair_link(lid)
        assert first == [], "a link that one end still reports down must stay down"
        end = _ends(g, lid)[i % 2]
        assert replay.cut_link(lid, end), "one end's report alone reroutes"
        replay.mend_link(lid, end)
        assert not replay.counts.problems, f"{lid}: " + problems(replay)
    for sw in switches:
        replay.fail_switch(sw)
        since = len(replay.sent)
        replay.repair_switch(sw)
        returning_switch_goes_first(replay, sw, since)
        assert not replay.counts.problems, f"{sw}: " + problems(replay)
    # the coverage claimed: four events per link, two per switch, each checked at every state on
    # every pair and branch
    assert replay.counts.events >= 4 * len(links) + 2 * len(switches)
    assert replay.counts.pair_branches >= replay.counts.states * len(replay.pairs) * 2
    return replay


@pytest.mark.parametrize("name", EXHAUSTIVE + BY_SYMMETRY)
def test_every_covered_failure_and_repair_never_loops_or_loses_a_delivered_branch(name):
    replay_every_failure(name, "aggregate", "switch-by-switch")


@pytest.mark.parametrize("name", ["mini-hpn", "mini-cross-campus"])
def test_the_host_routes_policy_in_reverse_order_never_loops_or_loses_a_delivered_branch(name):
    replay_every_failure(name, "host-routes", "reverse")


def test_the_symmetric_samples_cover_every_role_at_both_ends():
    """mini-hpn: leaf-spine links at (first, first) and (last, last); the first and last leaf and
    spine. fat-tree-4: edge-aggregation and aggregation-core links likewise."""
    links, switches = representatives("mini-hpn")
    assert links == [("p0l0", "p0s0", 0), ("p0l3", "p0s1", 0)] and switches == ["p0l0", "p0l3", "p0s0", "p0s1"]
    links, _switches = representatives("fat-tree-4")
    g = fabric("fat-tree-4")
    assert sorted({tuple(sorted(g.nodes[n]["tier"] for n in lid[:2])) for lid in links}) == [(1, 2), (2, 3)]


def test_walks_cover_every_entropy_branch_of_the_tables():
    """fat-tree-4: edges split on one source-port bit, aggregation switches on another (bit 5):
    four branches per pair, each leaving its edge and aggregation switch by a different port pair."""
    g = fabric("fat-tree-4")
    replay = Replay(g, "aggregate")
    replay.start()
    sports = replay.net.entropy_ports()
    assert len(sports) == 4
    paths = {tuple((h[0], h[2]) for h in replay.net.send("h1", "h16", 0, sport=s).hops) for s in sports}
    assert len(paths) == 4


def test_sending_every_switch_its_changes_at_once_black_holes_traffic_during_a_failure(monkeypatch):
    """The order the old app used (all switches at once) loses delivered branches mid-update:
    when e0-a0 fails, a2 (whose cores can no longer reach e0) drops e0's prefix while e2 still
    sends there (through c0 and a0's detour the branch was still delivered). The replay must
    see it (this is what the upstream-first order of a drop fixes)."""
    def everything_at_once(ix, confirmed, desired, items, failures=None, indexes=None):
        return items, 0, False

    monkeypatch.setattr(reconcile, "plan", everything_at_once)
    replay = Replay(fabric("fat-tree-4"), "aggregate", switch_by_switch)
    replay.start()
    replay.fail_link(compiler.link_id("e0", "a0", 0))
    assert any(p.startswith("LOST") for p in replay.counts.problems)


# ---- local protection: fast-failover groups ------------------------------------------------

GROUP_LINKS = {"mini-hpn": ("p0l0", "p0s0"), "fat-tree-4": ("e0", "a0")}


def source_leaf(g, pair: tuple) -> str:
    src, _dst, plane, rail, _ = pair
    return next(p["leaf"] for p in graph.host_ports(g, src) if p["plane"] == plane and p["rail"] == rail)


@pytest.mark.parametrize("name", GROUP_LINKS)
def test_before_the_controller_reacts_the_leaf_next_to_a_failure_already_delivers_every_branch(name):
    """The real compiler's fast-failover groups: before the controller hears of the failure the leaf
    next to it already sends every packet up another uplink; the update and the repair then
    lose nothing (every GroupMod checked by the interpreted switch)."""
    g = fabric(name)
    replay = Replay(g, "aggregate", switch_by_switch)
    replay.start()
    leaf, spine = GROUP_LINKS[name]
    lid = compiler.link_id(leaf, spine, 0)
    replay.fail_link(lid)
    assert not replay.counts.problems, problems(replay)
    from_leaf = {k: r for k, (r, _crossed) in replay.at_fault.items() if source_leaf(g, k[0]) == leaf}
    assert from_leaf and set(from_leaf.values()) == {"delivered"}, "local protection failed at the leaf"
    replay.repair_link(lid)
    assert not replay.counts.problems, problems(replay)


def test_without_fast_failover_the_leaf_next_to_a_failure_loses_traffic_until_the_controller_reacts():
    """The counterpart of the test above: the controller-only baseline (every group cut to its
    primary bucket) black-holes the branches hashed onto the dead uplink until the update arrives."""
    g = fabric("mini-hpn")
    replay = Replay(g, "aggregate", compile_fn=functools.partial(compiler.compile_fabric, fast_failover=False))
    replay.start()
    replay.fail_link(compiler.link_id("p0l0", "p0s0", 0))
    from_leaf = [r for k, (r, _crossed) in replay.at_fault.items() if source_leaf(g, k[0]) == "p0l0"]
    assert "dropped" in from_leaf


@pytest.mark.parametrize("rebuild_above", [0.0, float("inf")])
def test_patched_or_rebuilt_tables_make_the_same_safe_update(rebuild_above):
    """Changed switches' tables patched and diffed on the touched keys only, or built anew and diffed whole."""
    g = fabric("fat-tree-4")
    replay = Replay(g, "aggregate", switch_by_switch)
    replay.reconciler.rebuild_above = rebuild_above
    replay.start()
    for a, b in (("e0", "a0"), ("a0", "c0")):
        lid = compiler.link_id(a, b, 0)
        replay.fail_link(lid)
        replay.repair_link(lid)
    assert not replay.counts.problems, problems(replay)
