#!/usr/bin/env python3
"""The architecture's figures, measured from the code of a checkout (the layers issue's before/after).

    tools/scripts/code_figures.py [CHECKOUT]      (default: this one)

Prints the package import graph's cycles and upward arrows (imports inside functions counted),
imports inside functions, the largest classes and functions, the emulation's and the
controller's parameter counts and the ``HPNLAB_*`` environment variables the controller reads.
It reads the folders the checkout has (before the layers change ``tools/`` was ``hpnlab.cli``)."""
from __future__ import annotations

import ast
import collections
import re
import sys
from pathlib import Path

import networkx as nx

HERE = Path(__file__).resolve().parents[2]


def modules(root: Path = HERE) -> dict[str, Path]:
    """Every module of a checkout by its import name (tests/unit/test_layers.py reads the same)."""
    folders = {"fabric": "hpnlab.fabric", "controller": "hpnlab.controller", "topologies": "hpnlab.topologies",
               "cli" if (root / "cli").is_dir() else "tools": "hpnlab.cli"}
    out = {}
    for folder, pkg in folders.items():
        for path in sorted((root / folder).rglob("*.py")):
            if folder == "tools" and "kernel_lane" in path.parts:
                continue
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


def package(m: str, mods: dict[str, Path]) -> str:
    """A module's package: its folder (fabric's flat modules count as one package each, as
    fabric/ had them before the layers change; after it they are the base layer)."""
    parts = m.split(".")
    pkg = ".".join(parts[:3])
    return pkg if pkg in mods and mods[pkg].name == "__init__.py" else ".".join(parts[:2])


def edges(mods: dict[str, Path]) -> tuple[list[tuple[str, str]], int]:
    """(importer, imported module) for every import of a project module anywhere in a file (at
    module top, inside a function, ``importlib.import_module`` of a literal name), and how many of
    those imports are inside functions."""
    out, inner = [], 0
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    here = here[:len(here) - node.level + 1]
                    base = ".".join(here + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) ==
                  "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
                targets = [str(node.args[0].value)]
            hit = False
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    out.append((name, t))
                    hit = True
            if hit and id(node) in nested:
                inner += 1
    return out, inner


def sizes(mods: dict[str, Path]) -> tuple[list, list]:
    classes, funcs = [], []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                classes.append((n, methods, f"{name}.{node.name}"))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append((n, f"{name}.{node.name}"))
    return sorted(classes, reverse=True), sorted(funcs, reverse=True)


def params(path: Path, cls: str, meth: str = "__init__") -> int:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == meth:
                    a = f.args
                    return len(a.args) + len(a.kwonlyargs) - 1
    return -1


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    mods = modules(root)
    es, inner = edges(mods)
    pk = collections.Counter((package(a, mods), package(b, mods)) for a, b in es
                             if package(a, mods) != package(b, mods))
    g = nx.DiGraph(list(pk))
    print(f"checkout {root}: {len(mods)} modules, {len(es)} imports of project modules, {inner} inside functions")
    module_cycles = list(nx.simple_cycles(nx.DiGraph(es)))
    print(f"package cycles: {len(list(nx.simple_cycles(g)))}; module cycles: {len(module_cycles)}")
    for c in nx.simple_cycles(g):
        print("  package cycle:", " -> ".join(c + [c[0]]))
    classes, funcs = sizes(mods)
    print("largest classes (lines, methods):")
    for n, m, name in classes[:5]:
        print(f"  {n:5d} {m:3d}  {name}")
    print("largest functions (lines):")
    for n, name in funcs[:5]:
        print(f"  {n:5d}  {name}")
    harness = next((p for m, p in mods.items() if m.endswith("emulation.harness")), None)
    if harness:
        print(f"Emulation.__init__ parameters: {params(harness, 'Emulation')}")
    env = set()
    for m, p in mods.items():
        if m.startswith("hpnlab.controller"):
            env |= set(re.findall(r"HPNLAB_[A-Z_]+", p.read_text()))
    print(f"HPNLAB_* environment variables the controller reads or names: {len(env)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
