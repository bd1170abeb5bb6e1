"""The architecture as a checked table: which package may import which (docs/architecture.md).

Every import of an ``hpnlab`` module counts, at module top or inside a function, and so does an
``importlib.import_module`` of a literal name: a layer imports only layers below it (and itself),
and no two modules import each other, directly or round a circle."""
from __future__ import annotations

from collections import defaultdict

import networkx as nx
import pytest
from code_figures import edges, modules
from support.layers import LAYERS, SIDEWAYS
from support.paths import REPO


def package(module: str) -> str:
    """The layer table's package of a module: fabric's top-level modules are the base."""
    for pkg in sorted(LAYERS, key=len, reverse=True):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return "hpnlab.fabric.base"


MODS = modules(REPO)
EDGES = edges(MODS)[0]


def allowed(a: str, b: str) -> bool:
    return a == b or LAYERS.get(b, 0) < LAYERS.get(a, 0) or (a, b) in SIDEWAYS


def test_every_module_is_in_a_package_of_the_layer_table():
    assert {package(m) for m in MODS} <= set(LAYERS)


def test_no_package_imports_one_above_it_or_beside_it():
    up = sorted({f"{a} -> {b}" for a, b in EDGES if not allowed(package(a), package(b))})
    assert up == []


def test_the_packages_import_one_another_without_a_circle():
    g = nx.DiGraph((package(a), package(b)) for a, b in EDGES if package(a) != package(b))
    assert list(nx.simple_cycles(g)) == []


def test_no_two_modules_import_each_other_round_a_circle():
    g = nx.DiGraph(EDGES)
    assert [sorted(c) for c in nx.simple_cycles(g)] == []


@pytest.mark.parametrize("pkg", ["hpnlab.fabric.routing", "hpnlab.fabric.scenario"])
def test_the_routing_and_scenario_layers_import_no_engine(pkg):
    below = defaultdict(set)
    for a, b in EDGES:
        if package(a) == pkg:
            below[package(b)].add(b)
    assert set(below) <= {p for p, n in LAYERS.items() if n <= LAYERS[pkg]} | {"hpnlab.fabric.base"}


def test_a_rank_process_imports_neither_the_fabric_graph_nor_networkx():
    """Every rank of every collective is a process of its own: what ``ranks`` imports, each pays at
    its start (networkx and the scenario graph were half of it). The job it runs is plain data."""
    import subprocess
    import sys
    code = ("import sys, hpnlab.fabric.transport.ranks; "
            "print(sorted(m for m in sys.modules if m == 'networkx' or m.startswith('hpnlab.fabric.scenario.')"
            " and m != 'hpnlab.fabric.scenario.addressing'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
