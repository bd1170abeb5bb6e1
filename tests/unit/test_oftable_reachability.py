"""Reachability proofs on the compiled tables, with no switch running (tests/oftable.py).

Every host pair on every plane is walked through the tables on every entropy branch (one
UDP source port per bit pattern the switches' entropy tables look at, so every multipath
choice of every switch is taken); on the small presets this is repeated for every
single-link failure and every single-switch failure: every pair whose two ports are live
must be delivered on every branch, and no packet may loop.
"""
from __future__ import annotations

import random
from typing import Any

import pytest
from support.fabrics import fabric

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import FabricTables, valley_free_reachable
from hpnlab.fabric.scenario import graph, spec

SMALL = ["mini-hpn", "mini-hpn-wide", "fat-tree-4", "mini-rail", "mini-cross-campus", "mini-spine-leaf"]
WALK_BUDGET = 20_000    # per failure trial on a large preset (cross-campus: 512 branches per pair)


def check_all_pairs(g, failures: compiler.Failures, policy: str) -> tuple[int, int]:
    """Assert every live pair is delivered on every entropy branch and nothing loops.
    Returns (delivered pairs, dead pairs): a pair counts as delivered when every branch is.

    A pair is live when both ports' links and leaves are up and a valley-free path joins
    their leaves in the live graph (the oracle in oftable, independent of the compiler)."""
    net = FabricTables(g, compiler.compile_fabric(g, failures, policy), failures)
    delivered = dead = 0
    problems = []
    leaf = {(h, p["plane"], p["rail"]): p["leaf"] for h in graph.hosts(g) for p in graph.host_ports(g, h)}
    for src, dst, plane, sr, dr in net.all_pairs():
        alive = (net.live(src, plane, sr) and net.live(dst, plane, dr)
                 and valley_free_reachable(g, failures, leaf[src, plane, sr], leaf[dst, plane, dr]))
        results = set()
        for sport, _fixed, walk in net.send_branches(src, dst, plane, src_rail=sr, dst_rail=dr):
            results.add(walk.result)
            if walk.result == "loop":
                problems.append(f"LOOP {src}->{dst} plane {plane} sport {sport:#x}: {walk.where} {walk.hops}")
            elif alive and walk.result != "delivered":
                problems.append(f"BLACK HOLE {src}->{dst} plane {plane} rails {sr}->{dr} sport {sport:#x}: "
                                f"{walk.where} {walk.hops}")
        if results == {"delivered"}:
            delivered += 1
        elif "delivered" not in results:
            dead += 1
    assert not problems, f"{len(problems)} problems under {failures}, e.g.:\n" + "\n".join(problems[:5])
    return delivered, dead


@pytest.mark.parametrize("name", ["fat-tree-4", "mini-cross-campus"])
def test_split_walks_take_the_same_paths_as_walking_every_source_port_pattern(name):
    """send_branches splits a walk only where a switch looks at unfixed bits: the paths it finds
    for a pair are exactly those of walking one port per pattern of every entropy bit, under a
    failure that gives some switch a three-port set (more bits) too."""
    g = fabric(name)
    failures = compiler.Failures(frozenset([fabric_links(g)[0]]))
    net = FabricTables(g, compiler.compile_fabric(g, failures), failures)
    for src, dst, plane, sr, dr in net.all_pairs()[::7]:
        every = {tuple(net.send(src, dst, plane, src_rail=sr, dst_rail=dr, sport=s).hops)
                 for s in net.entropy_ports()}
        split = {tuple(w.hops) for _s, _f, w in net.send_branches(src, dst, plane, src_rail=sr, dst_rail=dr)}
        assert split == every


def test_the_walks_take_every_multipath_choice_of_the_first_switch():
    """mini-hpn: a leaf has two uplinks and splits on one source-port bit: the branches the
    walks use leave the leaf by both."""
    g = fabric("mini-hpn")
    net = FabricTables(g, compiler.compile_fabric(g))
    sports = net.entropy_ports()
    first_hops = {net.send("h1", "h16", 0, sport=s).hops[0][2] for s in sports}
    assert len(sports) == 2 and len(first_hops) == 2


def fabric_links(g) -> list[tuple]:
    return [compiler.link_id(u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] != "host"]


@pytest.mark.parametrize("policy", compiler.ROUTING_POLICIES)
@pytest.mark.parametrize("name", SMALL)
def test_every_pair_on_every_plane_is_delivered_in_a_healthy_fabric(name, policy):
    g = fabric(name)
    delivered, dead = check_all_pairs(g, compiler.Failures(), policy)
    assert dead == 0 and delivered == len(FabricTables(g, {}).all_pairs())


@pytest.mark.parametrize("policy", compiler.ROUTING_POLICIES)
@pytest.mark.parametrize("name", SMALL)
def test_no_live_pair_is_black_holed_under_any_single_link_failure(name, policy):
    g = fabric(name)
    links = [compiler.link_id(u, v, k) for u, v, k in g.edges(keys=True)]
    for lid in links:
        check_all_pairs(g, compiler.Failures(frozenset([lid])), policy)


@pytest.mark.parametrize("name", SMALL)
def test_no_live_pair_is_black_holed_under_any_single_switch_failure(name):
    g = fabric(name)
    for sw in graph.switches(g):
        check_all_pairs(g, compiler.Failures(switches=frozenset([sw])), "aggregate")


def test_a_failed_host_link_makes_only_that_port_unreachable():
    g = fabric("mini-hpn")
    lid = compiler.link_id("h1", "p0l0", 0)
    _, dead = check_all_pairs(g, compiler.Failures(frozenset([lid])), "aggregate")
    # h1's plane-0 port is dead: 15 pairs towards it and 15 from it
    assert dead == 30


@pytest.mark.parametrize("name", ["mini-hpn", "fat-tree-4", "mini-cross-campus"])
def test_no_live_pair_is_black_holed_under_random_double_link_failures(name):
    g = fabric(name)
    links = fabric_links(g)
    rng = random.Random(7)
    for _ in range(25):
        pair = frozenset(rng.sample(links, 2))
        check_all_pairs(g, compiler.Failures(pair), "aggregate")


@pytest.mark.parametrize("name,failures", [("fat-tree-8", 2), ("cross-campus", 2), ("small-hpn", 2),
                                           ("alibaba-hpn", 1), ("spine-leaf-rail", 1)])
def test_sampled_pairs_are_delivered_on_large_presets(name, failures):
    g = graph.build(spec.load(name))
    rng = random.Random(11)
    links = fabric_links(g)
    for trial in range(failures + 1):
        failed = compiler.Failures(frozenset(rng.sample(links, trial)))
        net = FabricTables(g, compiler.compile_fabric(g, failed, "aggregate"), failed)
        hs = graph.hosts(g)
        planes = sorted({p["plane"] for p in graph.host_ports(g, hs[0])})
        walks = 0
        for _ in range(150):
            if walks > WALK_BUDGET:     # presets with many entropy bits: fewer pairs, every branch each
                break
            src, dst = rng.sample(hs, 2)
            plane = rng.choice(planes)
            dports = [p for p in graph.host_ports(g, dst) if p["plane"] == plane]
            dr = rng.choice(dports)["rail"]
            branches = net.send_branches(src, dst, plane, dst_rail=dr)
            walks += len(branches)
            for sport, _fixed, walk in branches:
                assert walk.result == "delivered", (name, failed, src, dst, plane, sport, walk)


def test_a_packet_to_an_address_of_no_host_is_dropped_not_looped():
    g = fabric("mini-cross-campus")
    net = FabricTables(g, compiler.compile_fabric(g, None, "aggregate"))
    plan = g.graph["plan"]
    base = int.from_bytes(bytes(int(x) for x in plan.plane_prefix(0).split("/")[0].split(".")), "big")
    src_port = graph.host_ports(g, "h1")[0]
    for offset in range(64):
        pkt = {"eth_type": compiler.ETH_IPV4, "ip_proto": 1, "ipv4_src": 0x0A000001, "ipv4_dst": base + offset}
        walk = net.inject("h1", src_port["intf"], pkt)
        assert walk.result in ("delivered", "dropped"), (offset, walk)


@pytest.mark.parametrize("name", ["mini-hpn", "fat-tree-4", "mini-cross-campus"])
def test_udp_flows_differing_only_in_source_port_spread_evenly_over_uplinks(name):
    """Entropy: 1024 flows, same addresses, source ports 49152.. -> every uplink of the first
    switch gets exactly its share (the uplink counts here are powers of two)."""
    g = fabric(name)
    net = FabricTables(g, compiler.compile_fabric(g))
    hs = graph.hosts(g)
    src, dst = hs[0], hs[-1]
    first_out: dict[Any, Any] = {}
    second_out: dict[Any, Any] = {}
    for sport in range(49152, 49152 + 1024):
        walk = net.send(src, dst, 0, sport=sport)
        assert walk.result == "delivered"
        first_out[walk.hops[0][2]] = first_out.get(walk.hops[0][2], 0) + 1
        key = (walk.hops[1][0], walk.hops[1][2])
        second_out[key] = second_out.get(key, 0) + 1
    leaf = walk.hops[0][0]
    uplinks = len(compiler.index_of(g).sw[leaf].up)
    assert len(first_out) == uplinks
    assert set(first_out.values()) == {1024 // uplinks}
    # the second tier uses other bits: its choice is independent of the first tier's
    assert len(second_out) >= 2
