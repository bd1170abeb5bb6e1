"""The flow model forwards exactly as the compiled tables do (one source of truth).

For every host pair on every plane and every entropy pattern the switches look at, the
model's path (hpnlab.fabric.model.forwarding, read from the compiler's actions and entropy
map) is the table interpreter's walk of ``compile_fabric``'s tables (fabric/routing/oftable.py),
link for link: on the healthy fabric and under every single fabric-link failure of the small
presets (converged: the tables compiled for the failed fabric). A pair the tables drop has no
model path and the other way round. Pure, no root.
"""
from __future__ import annotations

import pytest
from support.fabrics import fabric
from support.model_checks import PRESETS, compare, every_pattern, fabric_links, leaf_pairs

from hpnlab.fabric.model import flow as model
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph


@pytest.mark.parametrize("name", PRESETS)
def test_model_paths_equal_the_compiled_tables_for_every_host_pair_and_entropy_pattern(name):
    g = fabric(name)
    sports = every_pattern(g)
    hosts = graph.hosts(g)
    pairs = []
    for s in hosts:
        for sp in graph.host_ports(g, s):
            if sp["rail"] != 0:
                continue
            for d in hosts:
                if d != s:
                    dp = next(p for p in graph.host_ports(g, d) if p["plane"] == sp["plane"] and p["rail"] == 0)
                    pairs.append((s, d, sp["plane"], sp["leaf"], dp["leaf"], 0, 0))
    assert compare(g, set(), pairs, sports) == len(pairs) * len(sports)


@pytest.mark.parametrize("name", PRESETS)
def test_model_paths_equal_the_compiled_tables_under_every_single_link_failure(name):
    g = fabric(name)
    sports = every_pattern(g)
    pairs = leaf_pairs(g)
    for link in fabric_links(g):
        assert compare(g, {link}, pairs, sports) == len(pairs) * len(sports)


def test_each_connection_takes_as_many_values_as_the_transport_binds_from_the_whole_map():
    """As the RoCE transport's ports_per_nic (capped at the map's path count), from every value
    of the map (tests/unit/test_entropy_connections.py: which ones, the transport's)."""
    g = fabric("fat-tree-4")
    net = model.Network(g)
    emap = compiler.entropy_map(g)
    assert net.entropy_values == min(model.ENTROPY_VALUES, emap.path_count())
    assert net.entropy_space == emap.path_count()


@pytest.mark.parametrize("routing", ["flow", "spray"])
def test_no_connection_stalls_where_the_compiled_tables_connect_the_pair(routing):
    """mini-hpn with p0l0-p0s0 down (the model used to leave 46 connections stalled there): the
    compiled tables deliver every host pair on some plane, and the model stalls none of them."""
    g = fabric("mini-hpn")
    link = next((u, v, k) for u, v, k in fabric_links(g) if {u, v} == {"p0l0", "p0s0"})
    failures = compiler.Failures.of({link})
    tables = FabricTables(g, compiler.compile_fabric(g, failures), failures)
    hosts = graph.hosts(g)
    planes = g.graph["scenario"].planes
    assert all(any(tables.send(a, b, p).result == "delivered" for p in range(planes))
               for a in hosts for b in hosts if a != b)
    r = model.run_collective(g, "all_to_all", 1 << 20, routing=routing, failed={link}, qps=4, placement="packed")
    assert (r.stalled_connections, r.stalled_pairs) == (0, [])
