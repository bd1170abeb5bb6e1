"""Scenario shapes: small scenarios along every structural dimension of the schema.

A *shape* is a scenario whose counts are chosen and whose rates are all alike (every link one
port slot): what the routing compiler's choices depend on is the structure -- how many planes,
rails, leaves per segment, hosts, segments, spines, pods, cores, campuses, and parallel links of
each kind, or a fat-tree's k --, not the rates. Proofs over shapes (``hpnlab.fabric.routing.protection``,
tests/unit/test_local_protection.py) take them from here:

    DIMENSIONS          the structural fields and the values a shape takes (the small range the
                        tests draw from; ``SWEEP`` the larger one of the opt-in sweep)
    shape(**counts)     the scenario mapping of one shape (validated by ``spec.from_dict``)
    sweep(n, seed)      n distinct shapes drawn from ``SWEEP`` (seeded: the same every run)

A dimension that does not apply is left out (no cores in a one-pod, one-campus fabric unless
asked, no long-haul links in one campus). Every shape here builds: the counts respect the
schema's rules (leaves per segment divide rails, cores where pods or campuses need them).
"""
from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any

from hpnlab.fabric.scenario import spec

#: what each structural dimension takes in the tests (small: every event of a shape is walked)
DIMENSIONS: dict[str, tuple[int, ...]] = {
    "planes": (1, 2, 3),
    "rails": (1, 2),
    "leaves_per_plane_per_segment": (1, 2),     # must divide rails
    "hosts_per_segment": (1, 2),
    "segments_per_pod": (1, 2),
    "spines_per_plane": (1, 2, 3),
    "leaf_spine_links": (1, 2),
    "pods": (1, 2),
    "cores_per_plane": (0, 1, 2),               # at least 1 where pods or campuses > 1
    "spine_core_links": (1, 2),
    "campuses": (1, 2, 3),
    "long_haul_links": (1, 2),                  # with campuses > 1
    "k": (2, 4),                                # fat-tree
}
#: the opt-in sweep's ranges (tools/bench/bench_local_protection.py)
SWEEP: dict[str, tuple[int, ...]] = DIMENSIONS | {
    "hosts_per_segment": (1, 2, 3),
    "segments_per_pod": (1, 2, 3),
    "spines_per_plane": (1, 2, 3, 4),
    "leaf_spine_links": (1, 2, 3),
    "pods": (1, 2, 3),
    "cores_per_plane": (0, 1, 2, 3),
    "spine_core_links": (1, 2, 3),
    "long_haul_links": (1, 2, 3),
    "k": (2, 4, 6),
}
HPN_FIELDS = tuple(d for d in DIMENSIONS if d != "k")
#: an HPN shape's counts when not given: the smallest fabric with a spine tier
DEFAULTS: dict[str, int] = {"planes": 1, "rails": 1, "leaves_per_plane_per_segment": 1, "hosts_per_segment": 1,
                            "segments_per_pod": 2, "spines_per_plane": 2, "leaf_spine_links": 1, "pods": 1,
                            "cores_per_plane": 0, "spine_core_links": 1, "campuses": 1, "long_haul_links": 1}


def name_of(counts: Mapping[str, int], kind: str = "hpn") -> str:
    """A shape's name from its counts, e.g. ``hpn-p2r1l1h1s2S2x1P2c2y1C3z2`` or ``fat-tree-k4``."""
    if kind == "fat-tree":
        return f"fat-tree-k{counts['k']}"
    c = {**DEFAULTS, **counts}
    return (f"hpn-p{c['planes']}r{c['rails']}l{c['leaves_per_plane_per_segment']}h{c['hosts_per_segment']}"
            f"s{c['segments_per_pod']}S{c['spines_per_plane']}x{c['leaf_spine_links']}P{c['pods']}"
            f"c{c['cores_per_plane']}y{c['spine_core_links']}C{c['campuses']}z{c['long_haul_links']}")


def fixed(counts: Mapping[str, int]) -> dict[str, int]:
    """``counts`` (an HPN shape's, defaults filled in) made valid: leaves per segment a divisor of
    rails, a core where pods or campuses need one, no long-haul links in one campus."""
    c = {**DEFAULTS, **counts}
    if c["rails"] % c["leaves_per_plane_per_segment"]:
        c["leaves_per_plane_per_segment"] = 1
    if (c["pods"] > 1 or c["campuses"] > 1) and c["cores_per_plane"] == 0:
        c["cores_per_plane"] = 1
    if c["campuses"] == 1:
        c["long_haul_links"] = 1
    if c["cores_per_plane"] == 0:
        c["spine_core_links"] = 1
    return c


def shape(kind: str = "hpn", **counts: int) -> dict[str, Any]:
    """The scenario mapping of one shape (``fixed`` counts; a fat-tree takes ``k`` alone)."""
    base: dict[str, Any] = {"description": "a generated shape (hpnlab.fabric.scenario.shapes)",
                            "host_rate_gbps": 100, "leaf_spine_rate_gbps": 100, "spine_core_rate_gbps": 100,
                            "switch_port_rate_gbps": 100, "switch_radix": 1024}
    if kind == "fat-tree":
        return {"name": name_of(counts, kind), "kind": "fat-tree", "k": counts["k"], **base}
    c = fixed(counts)
    out: dict[str, Any] = {"name": name_of(c), "kind": "hpn", "accelerators_per_host": c["rails"], **base}
    out.update({k: c[k] for k in HPN_FIELDS if k != "long_haul_links"})
    if c["campuses"] > 1:
        out["long_haul"] = {"distance_km": 10, "rate_gbps": 100, "links": c["long_haul_links"]}
    return out


def scenario(kind: str = "hpn", **counts: int) -> spec.Scenario:
    """The validated Scenario of one shape."""
    return spec.from_dict(shape(kind, **counts))


def leaves_per_plane(counts: Mapping[str, int]) -> int:
    """How many leaves (edges) a plane of the shape has: what a proof over it costs grows with it."""
    if "k" in counts:
        return counts["k"] ** 2 // 2
    c = fixed(counts)
    return c["campuses"] * c["pods"] * c["segments_per_pod"] * c["leaves_per_plane_per_segment"]


def counts_of(s: spec.Scenario) -> tuple[str, dict[str, int]]:
    """A scenario's kind and structural counts (the dimensions of ``DIMENSIONS``)."""
    if s.kind == "fat-tree":
        return "fat-tree", {"k": s.k}
    counts = {d: getattr(s, d) for d in HPN_FIELDS if d != "long_haul_links"}
    counts["long_haul_links"] = s.long_haul.links if s.long_haul else 1
    return "hpn", counts


def walk_cost(kind: str, counts: Mapping[str, int]) -> int:
    """A rough bound on the walks a local-protection proof of one plane of the shape makes: events
    (about seven per link and one per switch port) x pairs walked (leaves squared) x paths per
    pair (the product of the ways a packet has at each tier it crosses)."""
    if kind == "fat-tree":
        k = counts["k"]
        half = k // 2
        links = k * half * half * 2
        leaves = k * half
        paths = half * half
    else:
        c = fixed(counts)
        leaves = leaves_per_plane(c)
        spines = c["campuses"] * c["pods"] * c["spines_per_plane"]
        cores = c["campuses"] * c["cores_per_plane"]
        links = (leaves * c["spines_per_plane"] * c["leaf_spine_links"] + spines * c["cores_per_plane"]
                 * c["spine_core_links"] + cores * (c["campuses"] - 1) * c["long_haul_links"] // 2)
        paths = c["spines_per_plane"] * c["leaf_spine_links"]
        if cores:
            paths *= (c["cores_per_plane"] * c["spine_core_links"] * c["spines_per_plane"] * c["spine_core_links"]
                      * c["leaf_spine_links"] * (c["long_haul_links"] if c["campuses"] > 1 else 1))
    return (9 * links) * leaves * leaves * paths


def sweep(n: int, seed: int = 54, ranges: Mapping[str, tuple[int, ...]] = SWEEP, max_cost: int = 5_000_000,
          fat_trees: float = 0.15) -> Iterator[tuple[str, dict[str, int]]]:
    """``n`` distinct shapes: (kind, counts), drawn with a seeded generator from ``ranges`` (each at
    most ``max_cost`` by ``walk_cost``; a share ``fat_trees`` of them fat-trees, each k once)."""
    rnd = random.Random(seed)
    seen: set[str] = set()
    ks = list(ranges["k"])
    tries = 0
    while len(seen) < n and tries < 100 * n:
        tries += 1
        if ks and rnd.random() < fat_trees:
            k = ks.pop(0)
            counts = {"k": k}
            kind = "fat-tree"
        else:
            counts = fixed({d: rnd.choice(ranges[d]) for d in HPN_FIELDS})
            kind = "hpn"
        if walk_cost(kind, counts) > max_cost:
            continue
        name = name_of(counts, kind)
        if name in seen:
            continue
        seen.add(name)
        yield kind, counts
