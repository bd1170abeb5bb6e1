"""Local protection and remote convergence, proved on the compiled tables (tests/oftable.py).

Local protection: the *healthy* tables, with only the fast-failover groups' port liveness
changed by a failure (no controller reaction at all), deliver every live host pair on every
plane and every entropy branch, with no loop, for every single link failure and every single
switch failure on the small presets. A pair is live when both its ports are up and a
valley-free path joins their leaves (oftable.valley_free_reachable, independent of the
compiler). The controller's recompiled state is proved the same way in
test_oftable_reachability.py.

What local protection does not cover (and the tests below name):
  - a failed leaf loses its own hosts (their pairs are not live);
  - a long-haul link with no parallel link to the same far campus (mini-cross-campus has
    one per plane): no backup exists in that plane, the pair is not live either;
  - one end of a link taken down without the other end noticing (no BFD): the far end
    keeps sending into it until the controller reacts (a black hole, shown below); with
    BFD both ends see the port down, which is the failed-link case.

A switch coming back from a failure: its neighbours may see their links to it live before it does
(a BFD session comes up at one end first); a spine then sends what it cannot forward yet back
where it came from, and the sender bounces it (``not_live`` in the table interpreter, fabric/routing/oftable.py).

Remote convergence: the OpenFlow messages from the healthy state to the state after one
leaf-spine link failure are one route per switch that must change its next-hop set.
"""
from __future__ import annotations

import ast
import functools

import pytest
from support.fabrics import fabric, installed, messages_sent

from hpnlab.controller import reconcile
from hpnlab.fabric.routing import compiler, protection
from hpnlab.fabric.routing.oftable import FabricTables, valley_free_reachable
from hpnlab.fabric.scenario import graph

SMALL = ["mini-hpn", "small-hpn", "mini-spine-leaf", "mini-rail", "mini-cross-campus", "fat-tree-4"]


@functools.cache
def healthy(name: str) -> dict:
    return compiler.compile_fabric(fabric(name))


def fabric_links(g) -> list[tuple]:
    return [compiler.link_id(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] != "host"]


def swept(name: str) -> tuple[list[tuple], list[str]]:
    """The links and switches whose single failures are checked: every one, except on small-hpn
    plane 0's only. small-hpn's planes are copies (one generator, the same ports), the compiler
    protects each plane on its own, and mini-hpn, the same shape with two planes, is swept in
    both; small-hpn is here for its four-port sets (groups that rotate, avoid entries over three
    ports), which plane 0 has as much as plane 1, at half the time."""
    g = fabric(name)
    links, switches = fabric_links(g), list(graph.switches(g))
    if name == "small-hpn":
        links = [lid for lid in links if g.nodes[lid[0]].get("plane", 0) == 0]
        switches = [sw for sw in switches if g.nodes[sw].get("plane", 0) == 0]
    return links, switches


def failed_planes(g, failures: compiler.Failures) -> list[int]:
    """The planes a failure touches: the planes are disjoint graphs, so every other plane keeps
    its healthy tables and liveness (proved by the healthy case)."""
    nodes = {n for lid in failures.links for n in lid[:2]} | set(failures.switches)
    return sorted({g.nodes[n].get("plane", 0) for n in nodes if g.nodes[n]["tier"] > 0})


def problems_of(net: FabricTables, failures: compiler.Failures) -> tuple[list[str], int]:
    """(loops and black holes of every live pair on every entropy branch of the planes the
    failure touches, delivered walks)."""
    g = net.g
    leaf = {(h, p["plane"], p["rail"]): p["leaf"] for h in graph.hosts(g) for p in graph.host_ports(g, h)}
    problems = []
    delivered = 0
    reachable: dict = {}
    for src, dst, plane, sr, dr in net.all_pairs(failed_planes(g, failures) or None):
        pair = (leaf[src, plane, sr], leaf[dst, plane, dr])
        if pair not in reachable:
            reachable[pair] = valley_free_reachable(g, failures, *pair)
        alive = net.live(src, plane, sr) and net.live(dst, plane, dr) and reachable[pair]
        for sport, _fixed, walk in net.send_branches(src, dst, plane, src_rail=sr, dst_rail=dr):
            if walk.result == "loop":
                problems.append(f"LOOP {src}->{dst} plane {plane} sport {sport:#x}: {walk.where} {walk.hops}")
            elif alive and walk.result != "delivered":
                problems.append(f"BLACK HOLE {src}->{dst} plane {plane} rails {sr}->{dr} sport {sport:#x}: "
                                f"{walk.where} {walk.hops}")
            delivered += walk.result == "delivered"
    return problems, delivered


def local_only(name: str, failures: compiler.Failures, one_sided: frozenset = frozenset()) -> FabricTables:
    """The healthy tables (states of failed switches removed), liveness from the failures."""
    states = {n: st for n, st in healthy(name).items() if n not in failures.switches}
    return FabricTables(fabric(name), states, failures, one_sided)


@pytest.mark.parametrize("name", SMALL)
def test_fast_failover_alone_delivers_every_live_pair_under_any_single_link_failure(name):
    for lid in swept(name)[0]:
        failures = compiler.Failures(frozenset([lid]))
        problems, _ = problems_of(local_only(name, failures), failures)
        assert not problems, f"{len(problems)} problems under {lid}, e.g.:\n" + "\n".join(problems[:5])


@pytest.mark.parametrize("name", SMALL)
def test_fast_failover_alone_delivers_every_live_pair_under_any_single_switch_failure(name):
    for sw in swept(name)[1]:
        failures = compiler.Failures(switches=frozenset([sw]))
        problems, _ = problems_of(local_only(name, failures), failures)
        assert not problems, f"{len(problems)} problems under {sw} down, e.g.:\n" + "\n".join(problems[:5])


def test_only_a_fat_trees_cores_detour_deep():
    """compiler._deep: where a failed spine would take every core that a bounce reaches out of its
    pod at once (a fat-tree's aggregation switch and its group of cores); nowhere else."""
    for name in SMALL:
        g = fabric(name)
        ix = compiler.index_of(g)
        deep = {sw for sw in graph.switches(g) if compiler._deep(ix, ix.sw[sw])}
        cores = {sw for sw in graph.switches(g) if g.nodes[sw]["tier"] == 3}
        assert deep == (cores if name == "fat-tree-4" else set()), name


def test_a_failed_fat_tree_aggregation_switch_is_detoured_deep_by_its_cores():
    """Every core of a0's group lost pod 0 at once: each detours what it has for pod 0 down an
    edge switch of another pod, which bounces it up that pod's other aggregation switch, so up a
    core of the other group. Without the deep mark (a bounce up another core of the same group)
    those packets were dropped until the controller reacted."""
    g = fabric("fat-tree-4")
    agg = "a0"
    cores = {n for n in g.adj[agg] if g.nodes[n]["tier"] == 3}
    net = local_only("fat-tree-4", compiler.Failures(switches=frozenset([agg])))
    pod = g.nodes[agg]["pod"]
    into = [(s, d) for s in graph.hosts(g) for d in graph.hosts(g)
            if g.nodes[graph.host_ports(g, d)[0]["leaf"]]["pod"] == pod
            and g.nodes[graph.host_ports(g, s)[0]["leaf"]]["pod"] != pod]
    via = [w for s, d in into for sp in net.entropy_ports() for w in [net.send(s, d, 0, sport=sp)]
           if any(h[0] in cores for h in w.hops)]
    assert via, "some branch into pod 0 reaches a core of a0's group"
    for w in via:
        path = [h[0] for h in w.hops]
        i = next(i for i, n in enumerate(path) if n in cores)
        assert w.result == "delivered", (w.where, w.hops)
        assert g.nodes[path[i + 2]]["tier"] == 1 and g.nodes[path[i + 2]]["pod"] != pod, path   # the bounce edge
        assert not cores & set(path[i + 1:]), path                                             # another group


def h5_to_h1_via_p0s0(net: FabricTables) -> list:
    """mini-hpn's walks from h5 (under p0l1) to h1 (under p0l0) on the branches p0l1 sends up to p0s0."""
    spine_port = {n: p for p, n, _ in compiler.index_of(net.g).sw["p0l1"].up}
    via = [w for s in net.entropy_ports() for w in [net.send("h5", "h1", 0, sport=s)]
           if w.hops[0][2] == spine_port["p0s0"]]
    assert via, "some branch of h5->h1 leaves p0l1 towards p0s0"
    return via


def test_a_spine_that_loses_its_link_to_a_leaf_detours_through_another_leaf_that_bounces_up():
    """mini-hpn: p0s0-p0l0 fails; p0s0 sends what it has for p0l0 down to another leaf, which
    marks it and sends it up a different spine; that spine takes it straight down to p0l0."""
    net = local_only("mini-hpn", compiler.Failures.of([("p0l0", "p0s0", 0)]))
    for walk in h5_to_h1_via_p0s0(net):
        path = [h[0] for h in walk.hops]
        assert walk.result == "delivered"
        assert path[:2] == ["p0l1", "p0s0"] and path[-2:] == ["p0s1", "p0l0"]
        assert path[2].startswith("p0l") and path[2] != "p0l0"      # the bounce leaf


def test_bounced_packets_are_never_bounced_twice_when_the_destination_leaf_is_gone():
    """Every spine loses p0l0 at once (p0l0 failed): detours end in a drop, not a loop."""
    failures = compiler.Failures(switches=frozenset(["p0l0"]))
    net = local_only("mini-hpn", failures)
    walks = [w for s in net.entropy_ports() for w in [net.send("h5", "h1", 0, sport=s)]]
    assert {w.result for w in walks} == {"dropped"}


def test_without_bfd_a_link_down_at_one_end_black_holes_what_the_other_end_sends():
    """p0s0's port to p0l0 is down and p0l0 does not notice: p0l0 keeps using its uplink to
    p0s0 for some branches (lost), while p0s0 itself detours. With BFD (both ends down) the
    same failure delivers everything (the single-link test above)."""
    g = fabric("mini-hpn")
    spine_port = {n: p for p, n, _ in compiler.index_of(g).sw["p0s0"].down}["p0l0"]
    net = local_only("mini-hpn", compiler.Failures(), one_sided=frozenset([("p0s0", spine_port)]))
    results = {w.result for s in net.entropy_ports() for w in [net.send("h1", "h5", 0, sport=s)]}
    assert results == {"delivered", "dropped"}
    towards = {w.result for s in net.entropy_ports() for w in [net.send("h5", "h1", 0, sport=s)]}
    assert towards == {"delivered"}          # the side that sees its port down detours


def test_a_long_haul_link_without_a_parallel_link_is_not_protected():
    """mini-cross-campus has one long-haul link per plane: when it fails, no cross-campus pair
    of that plane is live, and the healthy tables drop those packets (no loop)."""
    g = fabric("mini-cross-campus")
    lid = next(lid for lid in fabric_links(g) if g.nodes[lid[0]]["tier"] == 3 and g.nodes[lid[1]]["tier"] == 3)
    failures = compiler.Failures(frozenset([lid]))
    net = local_only("mini-cross-campus", failures)
    problems, delivered = problems_of(net, failures)
    assert not problems and delivered > 0
    far = [p for p in net.all_pairs() if p[2] == g.nodes[lid[0]]["plane"]
           and g.nodes[graph.host_ports(g, p[0])[0]["leaf"]].get("campus")
           != g.nodes[graph.host_ports(g, p[1])[0]["leaf"]].get("campus")]
    assert far and all(net.send(s, d, pl, src_rail=sr, dst_rail=dr).result == "dropped" for s, d, pl, sr, dr in far)


# ---- a switch coming back: its neighbours may see a link live before it does ----------------

def coming_back(name: str, sw: str, live_ports: tuple = ()) -> FabricTables:
    """The healthy tables, every link up, ``sw`` seeing only ``live_ports`` live (its BFD sessions
    not yet up) while every neighbour sees its link to ``sw`` live: the state of a switch coming
    back from a failure, when a session comes up at the neighbour's end first."""
    g = fabric(name)
    ports = {d["ports"][sw] for _u, _v, d in g.edges(sw, data=True)}
    return FabricTables(g, healthy(name), compiler.Failures(),
                        not_live=frozenset((sw, p) for p in ports - set(live_ports)))


def returning(name: str, rule=compiler._returns) -> list[str]:
    g = fabric(name)
    ix = compiler.index_of(g)
    return [sw for sw in graph.switches(g) if rule(ix, ix.sw[sw])]


def tier(name: str, t: int) -> list[str]:
    g = fabric(name)
    return sorted(n for n in graph.switches(g) if g.nodes[n]["tier"] == t)


def test_the_switches_that_send_back_what_they_cannot_forward_have_only_bouncing_neighbours():
    """Two-tier spines and a fat-tree's cores (every neighbour below and bouncing); not a core
    with a long-haul link."""
    assert sorted(returning("fat-tree-4")) == tier("fat-tree-4", 3)
    assert sorted(returning("mini-hpn")) == sorted(graph.switches(fabric("mini-hpn"), "spine"))
    assert returning("mini-cross-campus") == []


def test_a_spine_under_cores_sends_back_when_its_leaves_bounce_and_each_core_has_one_link_to_it():
    """A fat-tree's aggregation switches and mini-cross-campus's spines: what they send back to a
    leaf is bounced, and what they send back to a core is detoured by the core (its only link
    into the pod is the one the packet came back by, ``compiler._returned_flows``)."""
    assert sorted(returning("fat-tree-4", compiler._returns_below)) == tier("fat-tree-4", 2)
    assert sorted(returning("mini-cross-campus", compiler._returns_below)) == tier("mini-cross-campus", 2)
    assert returning("mini-hpn", compiler._returns_below) == []


@pytest.mark.parametrize("name", ["mini-hpn", "mini-spine-leaf", "mini-rail", "fat-tree-4"])
def test_a_switch_coming_back_that_sees_no_port_live_sends_it_back_to_be_bounced(name):
    """Every switch above the leaves (spines; a fat-tree's aggregation switches and cores). Without
    the last bucket (back out of the ingress port) every branch its neighbours sent it was dropped
    until its own sessions came up: in the failover benchmark, a spine's repair under local
    protection alone cost flows 24-109 ms (a lost packet's retransmission timer); before
    2026-12-04 a fat-tree aggregation switch coming back lost 208 of 928 branches here."""
    g = fabric(name)
    for sw in [n for n in graph.switches(g) if g.nodes[n]["tier"] >= 2]:
        problems, delivered = problems_of(coming_back(name, sw), compiler.Failures())
        assert not problems and delivered, f"{sw}: {len(problems)} problems, e.g.:\n" + "\n".join(problems[:5])


def test_what_a_core_brings_down_to_an_aggregation_switch_coming_back_goes_down_anyway_turning_nowhere():
    """fat-tree-4, a0 coming back (no port live): what core c brings down to a0 for its pod leaves a0
    by the way down it would take anyway (``compiler._forwards_anyway``): the link carries (c sees it
    live, and so do the edges), a0 just does not see it live yet. Sent back up, it could reach the
    pod only down another pod and up again: a second down-up turn (issue 54: 768 such branches)."""
    net = coming_back("fat-tree-4", "a0")
    g = net.g
    pod = g.nodes["a0"]["pod"]
    into = [(s, d) for s in graph.hosts(g) for d in graph.hosts(g)
            if g.nodes[graph.host_ports(g, d)[0]["leaf"]]["pod"] == pod
            and g.nodes[graph.host_ports(g, s)[0]["leaf"]]["pod"] != pod]
    down = [w for s, d in into for sp in net.entropy_ports() for w in [net.send(s, d, 0, sport=sp)]
            if "a0" in [h[0] for h in w.hops]]
    assert down, "some branch into pod 0 comes down to a0"
    for w in down:
        path = [h[0] for h in w.hops]
        i = path.index("a0")
        assert w.result == "delivered" and path.count("a0") == 1, w.hops
        assert g.nodes[path[i - 1]]["tier"] == 3 and path[i + 1] == path[-1], path      # from a core, straight down
        assert protection.turns(g, w.hops) == 0, path


def test_a_cross_campus_spine_coming_back_delivers_every_branch():
    """What a spine coming back sends back to its core (which reaches the pod through the other
    spine too) goes down that other spine, marked, instead of being dropped at the core (an
    output to the port it came in by); before 2026-12-04 a spine here lost 56-72 of its 336-352
    branches."""
    for sw in tier("mini-cross-campus", 2):
        problems, delivered = problems_of(coming_back("mini-cross-campus", sw), compiler.Failures())
        assert not problems and delivered, f"{sw}: {len(problems)} problems, e.g.:\n" + "\n".join(problems[:5])


def test_a_cross_campus_core_coming_back_loses_only_what_comes_over_its_long_haul_link():
    """mini-cross-campus has one core per campus and plane, and one long-haul link between them:
    what the far core sends over it has no other way into the campus in that plane (the host side
    moves such flows to the other plane). Everything from its spines is sent back and bounced;
    nothing loops."""
    name = "mini-cross-campus"
    g = fabric(name)
    for sw in tier(name, 3):
        problems, delivered = problems_of(coming_back(name, sw), compiler.Failures())
        assert delivered and not [p for p in problems if p.startswith("LOOP")]
        for p in problems:
            path = [h[0] for h in ast.literal_eval(p[p.index("[("):])]
            assert path[-1] == sw and g.nodes[path[-2]]["tier"] == 3, p      # came over the long-haul


def test_a_spine_coming_back_with_one_port_live_delivers_every_branch():
    """mini-hpn, p0s0 sees only its link to p0l1 live: what it has for other leaves detours
    through p0l1 or goes back where it came from; nothing is lost, nothing loops."""
    g = fabric("mini-hpn")
    down = {n: p for p, n, _ in compiler.index_of(g).sw["p0s0"].down}
    problems, delivered = problems_of(coming_back("mini-hpn", "p0s0", (down["p0l1"],)), compiler.Failures())
    assert not problems and delivered


def test_a_packet_sent_back_is_bounced_once_by_its_sender():
    for walk in h5_to_h1_via_p0s0(coming_back("mini-hpn", "p0s0")):
        path = [h[0] for h in walk.hops]
        assert walk.result == "delivered"
        assert path[:3] == ["p0l1", "p0s0", "p0l1"] and path[3] != "p0s0" and path[-1] == "p0l0"


# ---- remote convergence: what one failure costs ---------------------------------------------

def port_status(g, link: tuple, up: bool) -> list:
    """Both ends of a link report it (down or up)."""
    ports = g.edges[link]["ports"]
    return [reconcile.PortStatus(n, {ports[n]: up}) for n in link[:2]]


def test_one_leaf_spine_link_failure_costs_one_route_per_leaf_of_its_plane():
    """small-hpn, counted on the reconciler's messages: the leaf next to the failure moves its
    plane route to "its uplinks but that one"; every other leaf of the plane adds one route for
    the leaf's prefix avoiding the spine; the spine keeps its route (its group detours); no group
    and no entropy entry changes."""
    g = fabric("small-hpn")
    rec = installed(g)
    cost = messages_sent(rec, *port_status(g, ("p0l0", "p0s0", 0), False))
    leaves_in_plane = sum(1 for n in graph.switches(g, "leaf") if g.nodes[n]["plane"] == 0)
    assert cost == {"flow_mods": leaves_in_plane, "group_mods": 0, "switches": leaves_in_plane}
    changed = {f.table for n in rec.states for f in set(rec.states[n].flows) - set(healthy("small-hpn")[n].flows)}
    assert changed == {compiler.TABLE_ROUTE}


def test_repair_costs_the_same_messages_back():
    g = fabric("small-hpn")
    rec = installed(g)
    there = messages_sent(rec, *port_status(g, ("p0l0", "p0s0", 0), False))
    back = messages_sent(rec, *port_status(g, ("p0l0", "p0s0", 0), True))
    assert back == there


def test_a_set_neither_healthy_nor_missing_one_port_gets_its_own_entropy_table():
    """Two uplinks of one leaf down (small-hpn: 4 uplinks -> 2): a fresh set, with its own
    entropy entries and fast-failover groups, still delivering every live pair."""
    g = fabric("small-hpn")
    failures = compiler.Failures.of([("p0l0", "p0s0", 0), ("p0l0", "p0s1", 0)])
    after = compiler.compile_fabric(g, failures)
    new_groups = set(after["p0l0"].groups) - set(healthy("small-hpn")["p0l0"].groups)
    assert new_groups
    new_entropy = [f for f in set(after["p0l0"].flows) - set(healthy("small-hpn")["p0l0"].flows)
                   if f.table == compiler.TABLE_ENTROPY]
    assert new_entropy
    problems, _ = problems_of(FabricTables(g, after, failures), failures)
    assert not problems, problems[:3]


@pytest.mark.parametrize("failed", [[("p0l0", "p0s0", 0)], [("p0l0", "p0s0", 0), ("p0l3", "p0s2", 0)],
                                    [("p1l2", "p1s1", 0), ("p0l0", "p0s0", 0), ("p0l0", "p0s1", 0)]])
@pytest.mark.parametrize("policy", compiler.ROUTING_POLICIES)
def test_the_reconciler_sends_one_message_per_concrete_entry_and_group_that_differs(failed, policy):
    """Its flow-mods and group-mods, to the end of the update for the last link's failure (the
    others already failed), against a brute-force diff of every expanded entry and group of the
    compiles before and after it."""
    g = fabric("small-hpn")
    before = compiler.compile_fabric(g, compiler.Failures.of(failed[:-1]), policy)
    after = compiler.compile_fabric(g, compiler.Failures.of(failed), policy)
    flows = groups = 0
    switches = set()
    for name in set(before) | set(after):
        a, b = before[name].expanded(), after[name].expanded()
        ga, gb = set(before[name].groups), set(after[name].groups)
        n = sum(1 for k in b if a.get(k) != b[k]) + sum(1 for k in a if k not in b)
        m = len({x.group_id for x in ga ^ gb})
        flows, groups = flows + n, groups + m
        if n or m:
            switches.add(name)
    rec = installed(g, policy)
    messages_sent(rec, *[e for lid in failed[:-1] for e in port_status(g, lid, False)])
    events = port_status(g, failed[-1], False)
    assert messages_sent(rec, *events) == {"flow_mods": flows, "group_mods": groups, "switches": len(switches)}
    assert messages_sent(rec, *events) == {"flow_mods": 0, "group_mods": 0, "switches": 0}


def test_a_route_avoiding_one_port_resolves_to_the_set_without_it():
    """The reconciler's resolution of a route (the next hops its update order follows): the
    metadata's entropy entries, of a pattern only the "avoid" entry where it hides the set's."""
    g = fabric("small-hpn")
    after = compiler.compile_fabric(g, compiler.Failures.of([("p0l0", "p0s0", 0)]))
    st = after["p0l1"]
    forwarding = reconcile._Forwarding(reconcile.TableIndex(reconcile.switch_table(st)), lambda port: True)
    prefix = g.nodes["p0l0"]["prefix"]
    (route,) = [f for f in st.flows if f.table == compiler.TABLE_ROUTE and f not in healthy("small-hpn")["p0l1"].flows]
    assert route.match == compiler._route_match(compiler.prefix_int(prefix))
    up = {p: n for p, n, _ in compiler.index_of(g).sw["p0l1"].up}
    assert forwarding.resolve(route.actions)[0] == {p for p, n in up.items() if n != "p0s0"}
    plane = compiler._route_match(compiler.prefix_int(g.graph["plan"].plane_prefix(0)))
    (plane_route,) = [f for f in st.flows if f.table == compiler.TABLE_ROUTE and f.match == plane]
    assert forwarding.resolve(plane_route.actions)[0] == set(up)


def test_without_fast_failover_the_same_tables_keep_only_the_primary_bucket():
    g = fabric("small-hpn")
    bare = compiler.compile_fabric(g, fast_failover=False)
    for name, st in healthy("small-hpn").items():
        assert bare[name].flows is st.flows
        assert [(gr.group_id, gr.buckets[:1]) for gr in st.groups] == \
            [(gr.group_id, gr.buckets) for gr in bare[name].groups]
    assert any(len(gr.buckets) > 1 for st in healthy("small-hpn").values() for gr in st.groups)


def test_without_fast_failover_a_link_failure_black_holes_until_the_controller_reacts():
    g = fabric("small-hpn")
    lid = next(lid for lid in fabric_links(g) if {g.nodes[n]["tier"] for n in lid[:2]} == {1, 2})
    failures = compiler.Failures(frozenset([lid]))
    net = FabricTables(g, compiler.compile_fabric(g, fast_failover=False), failures)
    problems, _ = problems_of(net, failures)
    assert any(p.startswith("BLACK HOLE") for p in problems)
    # and the controller's recompiled state (also without backups) delivers them again
    after = FabricTables(g, compiler.compile_fabric(g, failures, fast_failover=False), failures)
    assert problems_of(after, failures)[0] == []
