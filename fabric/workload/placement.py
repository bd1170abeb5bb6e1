"""Where the ranks of collective jobs sit on a fabric graph.

Pure (standard library and the fabric graph): nothing here starts a process or opens a socket.
The jobs themselves (:class:`~hpnlab.fabric.workload.jobs.Job`, their validation) are in
``hpnlab.fabric.workload.jobs``, which a rank process imports without the graph.

:func:`place`
    which host NIC (rail) each rank of each job uses on a fabric graph, and its address on
    every plane (the placements: ``PLACEMENTS``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import networkx as nx

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph as fgraph

#: where ranks sit on a fabric graph (see :func:`place`)
PLACEMENTS = ("cross-rail", "same-rail", "cross-plane", "cross-campus")


# ---- placement on a fabric graph ------------------------------------------------------------

@dataclass(frozen=True)
class Placed:
    """One rank on the fabric: its host, the NIC (rail) it uses, and that NIC's address on
    every plane it uses (plane order)."""
    host: str
    rail: int
    addrs: list
    planes: list


def place(g: nx.MultiGraph, placement: str = "cross-rail", nranks: int | None = None,
          jobs: int = 1) -> list[list[Placed]]:
    """Choose each job's ranks on the fabric graph: one rank per NIC (rail) of a host, using
    that NIC's port on every plane (``hpnlab.fabric.scenario.graph.host_ports``). Jobs get disjoint hosts.

    same-rail     ranks on rail 0 of hosts of one segment: every ring neighbour is under the
                  same leaf in each plane (leaf-local traffic, no spine). Job j takes segment j.
    cross-rail    ranks spread over segments and rails, rank i on rail i mod rails, hosts
                  taken round-robin across segments: neighbours sit under different leaves,
                  so traffic crosses the spines (the default).
    cross-plane   as cross-rail, but job j uses only plane j mod planes (one port per rank):
                  concurrent jobs are separated by plane; one job shows the single-plane case.
    cross-campus  ranks alternate between campuses (needs a scenario with campuses > 1):
                  every ring step crosses the long-haul links.
    """

    if placement not in PLACEMENTS:
        raise UserError(f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})")
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")
    s = g.graph["scenario"]
    hosts = sorted(fgraph.hosts(g), key=lambda h: g.nodes[h]["index"])
    ports = {h: fgraph.host_ports(g, h) for h in hosts}

    def rank_on(h: str, rail: int, planes: list[int]) -> Placed:
        mine = sorted((p for p in ports[h] if p["rail"] == rail and p["plane"] in planes),
                      key=lambda p: p["plane"])
        return Placed(h, rail, [p["ip"] for p in mine], [p["plane"] for p in mine])

    all_planes = list(range(s.planes))
    by_segment: dict[Any, list[str]] = {}
    for h in hosts:
        d = g.nodes[h]
        by_segment.setdefault((d["campus"], d["pod"], d["segment"]), []).append(h)
    if placement == "same-rail":
        segs = list(by_segment.values())
        if jobs > len(segs):
            raise UserError(f"same-rail: {jobs} jobs need {jobs} segments, the scenario has {len(segs)}")
        want = nranks or len(segs[0])
        if want > len(segs[0]):
            raise UserError(f"same-rail: a segment has {len(segs[0])} hosts, asked for {want} ranks "
                            f"(lower --ranks or use cross-rail)")
        return [[rank_on(h, 0, all_planes) for h in segs[j][:want]] for j in range(jobs)]
    if placement == "cross-campus":
        if s.campuses < 2:
            raise UserError(f"cross-campus needs a scenario with several campuses ({s.name} has 1; "
                            f"try mini-cross-campus)")
        groups = [[h for h in hosts if g.nodes[h]["campus"] == c] for c in range(s.campuses)]
    else:
        groups = list(by_segment.values())
    order = [h for tup in zip(*groups, strict=False) for h in tup]
    usable = len(order) if jobs == 1 else sum(len(gr) for gr in groups)
    per_job = nranks or usable // jobs
    if per_job < 2:
        raise UserError(f"{placement}: {usable} hosts cannot give {jobs} jobs of at least 2 ranks")
    if per_job * jobs > usable:
        raise UserError(f"{placement}: {jobs} job(s) of {per_job} ranks need {per_job * jobs} hosts, "
                        f"the scenario has {usable} usable")
    chosen = [order[:per_job]] if jobs == 1 else deal(groups, jobs, per_job)
    out = []
    for j in range(jobs):
        mine = chosen[j]
        planes = [j % s.planes] if placement == "cross-plane" else all_planes
        out.append([rank_on(h, (i % s.rails) if placement != "cross-campus" else 0, planes)
                    for i, h in enumerate(mine)])
    return out


def deal(groups: list[list[str]], jobs: int, per_job: int) -> list[list[str]]:
    """Disjoint hosts for ``jobs`` jobs of ``per_job`` ranks, each job's rank i from group i mod
    len(groups) (the next group with a host left when that one has none), the jobs taking turns
    rank by rank (pure). So every job spans every group (segment or campus) as one job does, and
    concurrent jobs share the fabric's leaves and uplinks, as jobs of a cluster do: the jobs
    dealt every ``jobs``-th host of the round-robin order instead (before) sat on disjoint
    segments whenever the segment count was a multiple of ``jobs`` (2 jobs on mini-hpn's 4
    segments: no switch port in common), and 2 cross-campus jobs each on one campus."""
    free = [list(gr) for gr in groups]
    out: list[list[str]] = [[] for _ in range(jobs)]
    for i in range(per_job):
        for j in range(jobs):
            # place() checked that the groups hold jobs * per_job hosts: one is always left
            group = next(gr for k in range(len(free)) if (gr := free[(i + k) % len(free)]))
            out[j].append(group.pop(0))
    return out
