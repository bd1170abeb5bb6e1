"""Local protection proved over scenario shapes (issue 54, ``hpnlab.fabric.routing.protection``).

The healthy tables, with only port liveness changed by an event -- a link down at both ends, at
one end with and without BFD, a switch down, a switch coming back, a link coming back at one end
first --, deliver every live pair on every entropy branch, loop nowhere and turn down-then-up at
most once, on shapes generated across the schema's dimensions (``hpnlab.fabric.scenario.shapes``:
planes, rails, leaves per segment, hosts, segments, spines, pods, cores, campuses, parallel links
of each kind, a fat-tree's k). The shapes are kept small (``MAX_COST`` walks): every event of a
shape is walked, every pair and branch. The larger sweep is tools/bench/bench_local_protection.py.

The three holes of issue 54 are named below, each on the shape it was found on.
"""
from __future__ import annotations

import pytest
from support.fabrics import fabric

from hpnlab.fabric.checks import rules as check
from hpnlab.fabric.routing import compiler, protection
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph, shapes, spec

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

#: the property test's shapes walk at most this many branches (``shapes.walk_cost``), about 5 s each here
MAX_COST = 30_000
HYPOTHESIS_EXAMPLES = 20
SETTINGS = hypothesis.settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None, derandomize=True,
                               suppress_health_check=list(hypothesis.HealthCheck))


def built(kind: str = "hpn", **counts: int):
    return graph.build(shapes.scenario(kind, **counts))


def holes(proof: protection.LocalProof) -> list[str]:
    return [str(p) for r in proof.rows.values() for v in r.failing for p in v.problems[:2]]


hpn_counts = st.fixed_dictionaries({d: st.sampled_from(shapes.DIMENSIONS[d]) for d in shapes.HPN_FIELDS})
#: one shape in eight a fat-tree, the rest HPN shapes (every dimension drawn; ``shapes.fixed`` makes them valid)
shape_strategy = st.tuples(st.integers(0, 7), hpn_counts, st.sampled_from(shapes.DIMENSIONS["k"])).map(
    lambda t: ("fat-tree", {"k": t[2]}) if t[0] == 0 else ("hpn", shapes.fixed(t[1]))).filter(
    lambda kc: shapes.walk_cost(*kc) <= MAX_COST and shapes.leaves_per_plane(kc[1]) >= 2)


@pytest.mark.slow
@SETTINGS
@hypothesis.given(shape=shape_strategy)
def test_every_event_on_any_small_shape_is_protected_with_at_most_one_turn(shape):
    kind, counts = shape
    g = built(kind, **counts)
    proof = protection.prove(g)
    print(f"{shapes.name_of(counts, kind)}: {proof.events} events, {proof.pairs} pairs, {proof.branches} branches")
    assert proof.ok, f"{shapes.name_of(counts, kind)}: {proof.holes()} holes, e.g.\n" + "\n".join(holes(proof)[:6])
    assert proof.events > 0


# ---- the three holes of issue 54 ------------------------------------------------------------

def test_every_failed_core_of_three_campuses_is_detoured_through_another_core_of_its_plane():
    """Three campuses, two cores per campus, two long-haul links between cores i: every single core
    failure lost 128 live pairs (the core facing the failed one had only the long-haul links to it
    as buckets). Now it detours down to a spine of its campus, which bounces the packet up the
    campus's other core, over that core's long-haul links."""
    g = built(campuses=3, cores_per_plane=2, long_haul_links=2, segments_per_pod=2)
    proof = protection.prove(g, ["switch-down"])
    assert proof.ok, holes(proof)
    core, far = "p0c0", "p0c2"                    # core 0 of campus 0, core 0 of campus 1
    net = FabricTables(g, compiler.compile_fabric(g), compiler.Failures(switches=frozenset([core])))
    h_far = next(p["host"] for p in protection._host_ports(g)[0] if g.nodes[p["leaf"]]["campus"] == 1)
    h_near = next(p["host"] for p in protection._host_ports(g)[0] if g.nodes[p["leaf"]]["campus"] == 0)
    via = [b.walk for b in net.walk_branches(h_far, h_near, 0) if far in [h[0] for h in b.walk.hops]]
    assert via, "some branch reaches the core facing the failed one"
    for w in via:
        path = [h[0] for h in w.hops]
        i = path.index(far)
        assert w.result == "delivered", w.hops
        assert g.nodes[path[i + 1]]["role"] == "spine" and g.nodes[path[i + 2]]["role"] == "core", path
        assert path[i + 2] != far and protection.turns(g, w.hops) == 1, path


def test_a_long_haul_link_down_is_detoured_where_its_campus_has_another_core():
    """One long-haul link between cores i: no parallel link, but the other cores still join the
    campuses (the pair is live): the core detours as for a failed far core."""
    proof = protection.prove(built(campuses=2, cores_per_plane=2, long_haul_links=1), ["link-down"])
    assert proof.ok, holes(proof)
    assert proof.rows["link-down"].live > 0


def test_a_spine_coming_back_over_parallel_links_sends_back_from_its_multi_port_groups():
    """Two links per leaf-spine pair: the spine's way down to a leaf is a two-port set, whose groups
    had no bucket back; the spine dropped what its leaves sent it while its sessions came up."""
    proof = protection.prove(built(leaf_spine_links=2, segments_per_pod=2), ["switch-back"])
    assert proof.ok, holes(proof)


def test_a_core_coming_back_with_several_spines_per_pod_sends_back_from_its_multi_port_groups():
    proof = protection.prove(built(pods=2, cores_per_plane=2, spines_per_plane=2), ["switch-back"])
    assert proof.ok, holes(proof)


def test_a_fat_tree_aggregation_switch_coming_back_turns_no_packet_twice():
    """fat-tree-4: what a core brought down to an aggregation switch coming back went back up, then
    down another pod and up again (768 branches turned twice). It goes down anyway now."""
    proof = protection.prove(fabric("fat-tree-4"), ["switch-back"])
    assert proof.ok, holes(proof)
    assert proof.rows["switch-back"].double_bounces == 0 and proof.rows["switch-back"].branches > 0


# ---- what the proof checks ------------------------------------------------------------------

@pytest.mark.parametrize("path, expected", [
    (["e0", "a0", "e1"], 0),                                   # up, down
    (["e0", "a0", "c0", "a2", "e2"], 0),                       # up, up, down, down
    (["e0", "a0", "e1", "a1", "e2"], 1),                       # a leaf bounce
    (["e2", "a2", "c1", "a0", "c1", "a2", "e2", "a3", "c2", "a1", "e0"], 2),   # issue 54's double bounce
])
def test_turns_count_every_climb_after_a_descent(path, expected):
    g = fabric("fat-tree-4")
    assert protection.turns(g, [(n, 0, 0) for n in path]) == expected


def test_sideways_hops_neither_climb_nor_descend():
    g = built(campuses=2, cores_per_plane=1)
    path = ["p0l0", "p0s0", "p0c0", "p0c1", "p0s2", "p0l2"]
    assert all(n in g for n in path)
    assert protection.turns(g, [(n, 0, 0) for n in path]) == 0
    assert protection.turns(g, [(n, 0, 0) for n in ["p0l0", "p0s0", "p0c0", "p0c1", "p0s2", "p0c1", "p0s3"]]) == 1


def test_one_end_down_without_bfd_loses_only_what_the_unaware_end_sends_into_the_link(monkeypatch):
    g = fabric("mini-hpn")
    named = protection.prove(g, ["link-down-one-end"]).rows["link-down-one-end"]
    assert named.ok and named.excepted.get("unaware-end", 0) > 0
    monkeypatch.setattr(protection, "EXCEPTIONS", {})
    unnamed = protection.prove(g, ["link-down-one-end"]).rows["link-down-one-end"]
    assert unnamed.black_holes == named.excepted["unaware-end"]


def test_with_bfd_one_end_down_is_both_ends_down_for_every_port_and_link():
    g = fabric("mini-rail")
    net = protection.EventTables(g, compiler.compile_fabric(g))
    down = {e.name.split(" down")[0]: e for e in protection.events(g, ["link-down"])}

    def view(ev: protection.Event) -> tuple:
        net.set_event(ev)
        return (frozenset(sp for sp in net.peer if not net.port_live(*sp)),
                frozenset(lid for (n, _p), (_peer, _pp, lid) in net.peer.items() if not net.carries(lid, _peer)))

    bfd = list(protection.events(g, ["link-down-bfd"]))
    assert len(bfd) == 2 * len(down)
    for ev in bfd:
        assert view(ev) == view(down[ev.name.split(" down")[0]]), ev.name


def test_the_walked_pairs_give_the_verdict_of_every_pair():
    """One source per leaf and one destination per leaf stand for every pair (the tables tell
    neither apart): on tables with holes (no fast failover), every event that fails on all pairs
    fails on the pairs walked, and the same leaf pairs fail."""
    g = fabric("mini-hpn")
    bare = compiler.compile_fabric(g, fast_failover=False)
    net = protection.EventTables(g, bare)
    for ev in protection.events(g, ["link-down", "switch-down"], planes=[0]):
        v = protection.prove_event(g, ev, bare, net, examples=10**6)
        walked = {(p.src, p.dst) for p in v.problems}
        full = FabricTables(g, {n: s for n, s in bare.items() if n not in ev.failures.switches}, ev.failures)
        leaf = {(h, q["plane"]): q["leaf"] for h in graph.hosts(g) for q in graph.host_ports(g, h)}
        bad = set()
        for s, d, plane, sr, dr in full.all_pairs([0]):
            if not (full.live(s, plane, sr) and full.live(d, plane, dr)):
                continue
            if any(w.result != "delivered" for _sp, _f, w in full.send_branches(s, d, plane, src_rail=sr, dst_rail=dr)):
                bad.add((leaf[s, plane], leaf[d, plane]))
        assert {(leaf[s, 0], leaf[d, 0]) for s, d in walked} == bad, ev.name


def test_the_branches_cover_every_source_port_and_take_the_interpreters_paths():
    g = built(pods=2, cores_per_plane=2, leaf_spine_links=2)
    net = FabricTables(g, compiler.compile_fabric(g), compiler.Failures(switches=frozenset(["p0s0"])))
    for s, d in [("h1", "h3"), ("h3", "h1"), ("h1", "h2")]:
        branches = net.walk_branches(s, d, 0)
        assert sum(b.ports for b in branches) == 1 << 16
        for sport, _fixed, w in net.send_branches(s, d, 0):
            (b,) = [b for b in branches if sport & b.mask in b.patterns]
            assert (b.walk.result, b.walk.hops) == (w.result, w.hops)


def test_planes_are_copies_so_plane_0_stands_for_every_plane():
    g = built(planes=2, segments_per_pod=2)
    one, every = protection.prove(g), protection.prove(g, all_planes=True)
    assert one.planes_walked == [0] and every.planes_walked == [0, 1]
    for kind in protection.EVENT_KINDS:
        a, b = one.rows[kind], every.rows[kind]
        assert (2 * a.events, 2 * a.branches, a.ok) == (b.events, b.branches, b.ok), kind


# ---- hpnlab check --------------------------------------------------------------------------

def test_hpnlab_check_proves_local_protection_only_when_asked():
    assert "local-protection" not in check.selected()
    assert "local-protection" in check.selected(opt_in={"local-protection"})
    assert "local-protection" in check.selected(check.rules_from_dict({"local-protection": True}))
    results = check.run_checks("mini-hpn", only=["local-protection"])
    assert [r.subject for r in results] == [protection.EVENT_NAMES[k] for k in protection.EVENT_KINDS] + ["all events"]
    assert all(r.ok for r in results)


def test_hpnlab_check_says_why_it_does_not_prove_a_fabric_too_large_to_walk():
    s = spec.load("alibaba-hpn")
    (row,) = check.rule_local_protection(check.CheckContext(s.name, s, fabric("mini-hpn")))
    assert row.figure == check.NOT_AVAILABLE and row.ok and "walks" in row.detail
