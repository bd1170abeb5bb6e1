"""The entropy map: which source-port bits choose the port of every multipath choice.

The compiler publishes it (compiler.entropy_map) and compiles the switches' entropy tables
from it; hosts pick their entropy values from it. Proved here on the compiled tables with
the table interpreter (tests/oftable.py): every entropy value the map publishes crosses,
at every switch of its path, the port the map names -- among the equal-cost ports found
independently of the compiler (shortest paths in the fabric graph) -- and N values are N
different paths.
"""
from __future__ import annotations

import networkx as nx
import pytest

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.entropy import EntropyMap, lay_out
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph, spec

SMALL = ["mini-hpn", "mini-hpn-wide", "small-hpn", "mini-spine-leaf", "mini-rail", "mini-cross-campus", "fat-tree-4"]
_G: dict = {}


def fabric(name: str):
    if name not in _G:
        g = graph.build(spec.load(name))
        _G[name] = (g, compiler.compile_fabric(g))
    return _G[name]


def equal_cost_ports(g, dst_leaf: str) -> dict[str, tuple[str, list[int]]]:
    """Per switch of the destination's plane: (direction, its ports on a shortest path to
    ``dst_leaf``), from the graph alone."""
    plane = g.nodes[dst_leaf].get("plane", 0)
    sw = nx.Graph()
    for u, v, d in g.edges(data=True):
        if d["kind"] != "host" and g.nodes[u].get("plane", 0) == plane:
            sw.add_edge(u, v)
    dist = nx.single_source_shortest_path_length(sw, dst_leaf)
    out = {}
    for s in sw:
        ports = sorted(d["ports"][s] for _, n, d in g.edges(s, data=True)
                       if d["kind"] != "host" and dist.get(n, -9) == dist[s] - 1)
        if ports:
            tier = g.nodes[s]["tier"]
            peer = next(n for _, n, d in g.edges(s, data=True) if d["kind"] != "host" and d["ports"][s] == ports[0])
            t2 = g.nodes[peer]["tier"]
            out[s] = ("up" if t2 > tier else "across" if t2 == tier else "down", ports)
    return out


@pytest.mark.parametrize("name", SMALL + ["cross-campus"])
def test_no_two_roles_of_the_map_read_the_same_bits(name):
    m = compiler.entropy_map(graph.build(spec.load(name)))
    assert m.fields and not m.overlaps
    taken = 0
    for f in m.fields:
        assert f.mask & taken == 0 and f.offset + f.bits <= 16
        taken |= f.mask


def test_roles_are_laid_out_in_path_order_from_bit_0():
    m = lay_out({(3, "down"): [16], (1, "up"): [16], (3, "across"): [4], (2, "up"): [8], (2, "down"): [2]})
    assert [(f.role, f.offset, f.bits) for f in m.fields] == [
        ("leaf-up", 0, 4), ("spine-up", 4, 3), ("core-across", 7, 2), ("core-down", 9, 4), ("spine-down", 13, 1)]
    assert m.width == 14 and not m.overlaps and m.path_count() == 16 * 8 * 4 * 16 * 2


def test_roles_that_do_not_fit_in_16_bits_share_the_top_bits_and_say_so():
    m = lay_out({(1, "up"): [256], (2, "up"): [64], (3, "down"): [32]})
    assert [(f.offset, f.bits) for f in m.fields] == [(0, 8), (8, 6), (11, 5)]
    assert m.overlaps == (("spine-up", "core-down"),)
    assert m.path_count() == 256 * 64          # the sharing role adds no distinct paths


def test_entropy_values_name_distinct_combinations_first_hop_first():
    m = lay_out({(1, "up"): [4], (3, "down"): [2]})
    values = m.entropy_values(8)
    combos = [(m.fields[0].index(v, 4), m.fields[1].index(v, 2)) for v in values]
    assert len(set(combos)) == 8
    assert [c[0] for c in combos[:4]] == [0, 1, 2, 3]      # every leaf uplink before a second core-down choice


def test_the_map_round_trips_through_plain_values():
    m = compiler.entropy_map(fabric("mini-cross-campus")[0])
    assert EntropyMap.from_dict(m.as_dict()) == m


@pytest.mark.parametrize("name", SMALL)
def test_every_published_entropy_value_crosses_the_ports_the_map_names(name):
    g, states = fabric(name)
    m = compiler.entropy_map(g)
    net = FabricTables(g, states)
    values = m.entropy_values(m.path_count(), high=0b11 << (m.width % 14))
    leaf_of = {(h, p["plane"], p["rail"]): p["leaf"] for h in graph.hosts(g) for p in graph.host_ports(g, h)}
    ecp: dict = {}
    checked = 0
    for src, dst, plane, sr, dr in net.all_pairs([0]):
        dleaf = leaf_of[dst, plane, dr]
        if dleaf not in ecp:
            ecp[dleaf] = equal_cost_ports(g, dleaf)
        paths = set()
        for v in values:
            walk = net.send(src, dst, plane, sport=v, src_rail=sr, dst_rail=dr)
            assert walk.result == "delivered", (src, dst, v, walk.where)
            for sw, _in_port, out in walk.hops[:-1]:
                direction, ports = ecp[dleaf][sw]
                if len(ports) >= 2:
                    role = f"{compiler.TIER_NAMES[g.nodes[sw]['tier']]}-{direction}"
                    f = m.field(role)
                    assert f is not None and out == ports[f.index(v, len(ports))], (src, dst, v, sw)
                    checked += 1
                else:
                    assert out == ports[0]
            paths.add(tuple(walk.hops))
        crossings = 1
        for sw, _i, _o in net.send(src, dst, plane, sport=values[0], src_rail=sr, dst_rail=dr).hops[:-1]:
            crossings *= len(ecp[dleaf][sw][1])
        assert len(paths) == min(crossings, len(values))    # every equal-cost path, each by its own values
    assert checked


def test_hosts_of_two_campuses_reach_every_equal_cost_path_with_as_many_values():
    """The cores on both sides of a long-haul link read their own bits (on `cross-campus` the
    8,192 equal-cost paths between two hosts of different campuses are 8,192 entropy values,
    where the tier-wide bits reached 2,048)."""
    g = graph.build(spec.load("mini-cross-campus"))
    m = compiler.entropy_map(g)
    net = FabricTables(g, compiler.compile_fabric(g))
    src, dst = "h1", graph.hosts(g)[-1]
    campus = {h: g.nodes[graph.host_ports(g, h)[0]["leaf"]]["campus"] for h in (src, dst)}
    assert campus[src] != campus[dst]
    walks = {tuple(net.send(src, dst, 0, sport=v).hops) for v in m.entropy_values(m.path_count())}
    assert len(walks) == m.path_count() == 4
