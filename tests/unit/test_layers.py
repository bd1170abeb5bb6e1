"""The architecture as a checked table: which package may import which (docs/architecture.md).

Every import of an ``hpnlab`` module counts, at module top or inside a function, and so does an
``importlib.import_module`` of a literal name: a layer imports only layers below it (and itself),
and no two modules import each other, directly or round a circle."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import networkx as nx
import pytest
from support.layers import LAYERS, SIDEWAYS
from support.paths import REPO

FOLDERS = {"fabric": "hpnlab.fabric", "controller": "hpnlab.controller", "cli": "hpnlab.cli",
           "topologies": "hpnlab.topologies"}


def modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


def package(module: str) -> str:
    """The layer table's package of a module: fabric's top-level modules are the base."""
    for pkg in sorted(LAYERS, key=len, reverse=True):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return "hpnlab.fabric.base"


def imports(mods: dict[str, Path]) -> list[tuple[str, str]]:
    """(importer, imported module) for every import of a project module, anywhere in the file."""
    edges = []
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_pkg else name.split(".")[:-1]
                    here = here[:len(here) - node.level + 1]
                    base = ".".join(here + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) ==
                  "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
                targets = [str(node.args[0].value)]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.append((name, t))
    return edges


MODS = modules()
EDGES = imports(MODS)


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
