"""Write a fabric graph as JSON (node-link), GraphML or Graphviz DOT.

Exports hold plain values only: the scenario is written as a mapping, each link's
``ports`` as ``port_<node>`` attributes (GraphML and DOT take no nested values).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

import networkx as nx

from hpnlab.fabric.scenario.spec import to_dict

FORMATS = ("json", "graphml", "dot")


def _flat_links(g: nx.MultiGraph) -> Iterator[tuple[str, str, int, dict[str, Any]]]:
    """Every link as (u, v, key, attributes) with ``ports`` flattened to port_a (u's), port_b (v's)."""
    for u, v, k, d in g.edges(keys=True, data=True):
        attrs = {key: value for key, value in d.items() if key != "ports"}
        attrs["port_a"] = d["ports"][u]
        attrs["port_b"] = d["ports"][v]
        yield u, v, k, attrs


def plain_graph(g: nx.MultiGraph) -> nx.MultiGraph:
    """A copy with only GraphML-friendly attributes (str, int, float, bool)."""
    out = nx.MultiGraph(name=g.graph.get("name", ""))
    for n, d in g.nodes(data=True):
        out.add_node(n, **{k: (",".join(map(str, v)) if isinstance(v, tuple) else v)
                           for k, v in d.items() if v is not None})
    for u, v, k, attrs in _flat_links(g):
        out.add_edge(u, v, key=k, **attrs)
    return out


def write(g: nx.MultiGraph, fmt: str, fh: IO[str]) -> None:
    if fmt == "json":
        data = {
            "scenario": to_dict(g.graph["scenario"]),
            "nodes": [{"id": n, **d} for n, d in g.nodes(data=True)],
            "links": [{"source": u, "target": v, "key": k, **attrs} for u, v, k, attrs in _flat_links(g)],
        }
        json.dump(data, fh, default=list)
        fh.write("\n")
    elif fmt == "graphml":
        for line in nx.generate_graphml(plain_graph(g)):
            fh.write(line + "\n")
    elif fmt == "dot":
        fh.write(f'graph "{g.graph.get("name", "fabric")}" {{\n')
        for n, d in g.nodes(data=True):
            label = n if d["tier"] == 0 else f"{n}\\n{d['role']}"
            fh.write(f'  "{n}" [role="{d["role"]}", tier={d["tier"]}, label="{label}"];\n')
        for u, v, _, attrs in _flat_links(g):
            fh.write(f'  "{u}" -- "{v}" [kind="{attrs["kind"]}", rate_gbps={attrs["rate_gbps"]:g}, '
                     f'taillabel="{attrs["port_a"]}", headlabel="{attrs["port_b"]}"];\n')
        fh.write("}\n")
    else:
        raise ValueError(f"unknown export format {fmt!r}")
