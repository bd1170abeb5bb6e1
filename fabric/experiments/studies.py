"""Studies on the flow model: each a table and a plot, JSON first (``hpnlab model SCENARIO --study NAME``).

Pure except :func:`plot` (matplotlib, writes a PNG). Every study returns a document
``{"study", "scenario", "rows": [...], "notes": [...], "wall_s", "load_average"}``; :func:`table`
prints it; :func:`plot` draws it.

    routing        per-flow ECMP vs flowlet vs spray vs adaptive (the routings the model has;
                   the others are listed as missing) on all-to-all and ring all-reduce as the
                   job grows from 64 accelerators to the scenario's size (x8 per step). The
                   all-to-all is one step with every pair at once, as the generators send it,
                   sampled above ``model.EXACT_PAIRS`` pairs (the rows give the sampling error).
    planes         1/2/4/8 planes from the scenario's NIC (planes x host rate) and switch
                   capacity (radix x port rate): each plane's switches run their capacity as
                   ports of NIC / planes, so the radix grows with the planes. Scale reached in
                   two tiers, switches, links and leaf-to-leaf path diversity, by arithmetic
                   (``spec.size`` on the two-tier scenario each plane count allows).
    routes         route counts per switch and per POD from the controller compiler's tables
                   (``compiler.route_summary``), with aggregation and with host routes, beside
                   Baidu's ~4,000 routes per POD; fabrics too large to compile in a study are
                   counted by ``analysis.route_counts`` (arithmetic: host routes exactly the
                   compiler's, aggregated routes the compiler's minimum, which its tables exceed
                   by at most one per switch; a test checks both on small-hpn) and say so.
    failures       one leaf-spine link, one spine, one plane failing at the start of an
                   all-reduce, per routing and per failover mode, as a chain (detection lost,
                   detour over the fast-failover backups, converged; times: defaults, or the
                   failover comparison's JSON): ``model.failover_chain``.
    cross-campus   data-parallel all-reduce across two campuses (ring through every host of
                   both) vs tensor/expert-parallel all-to-all inside one campus, over long-haul
                   capacity (links per core pair) and distance.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import networkx as nx

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments.fidelity import run_schedule
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import analysis, graph, spec

STUDIES = ("routing", "planes", "routes", "failures", "cross-campus")
ALL_ROUTINGS = ("ecmp", "flowlet", "spray", "adaptive")
#: Baidu's figure for routes per POD (the talk's ~4,000), the reference the routes study prints
BAIDU_ROUTES_PER_POD = 4000
#: compile the tables (rather than count by arithmetic) up to this many switches
COMPILE_MAX_SWITCHES = 400
#: the failover modes' (detection, convergence) times without a failover comparison's JSON: the model's own defaults
DEFAULT_CHAIN_MS = dict(model.FAILOVER_CHAIN_MS)

Say = Callable[[str], None]


def _doc(study: str, scenario: str, rows: list[dict], notes: list[str], t0: float, **extra: Any) -> dict[str, Any]:
    return {"study": study, "scenario": scenario, "rows": rows, "notes": notes,
            "wall_s": round(time.monotonic() - t0, 2), "load_average": [round(x, 2) for x in os.getloadavg()],
            **extra}


def _routings(routings: Sequence[str] | None) -> tuple[list[str], list[str]]:
    wanted = list(routings or ALL_ROUTINGS)
    have = [r for r in wanted if model.ROUTING_ALIASES.get(r, r) in model.ROUTINGS]
    return have, [r for r in wanted if r not in have]


# ---- routing modes as the job grows ------------------------------------------------------------

def rank_grid(max_ranks: int, rails: int, start: int = 64, factor: int = 8) -> list[int]:
    """64, 512, 4096, ... up to the scenario's ranks (its last size included), multiples of rails
    with at least two hosts."""
    out = []
    n = max(start, 2 * rails)
    while n < max_ranks:
        out.append(n - n % rails)
        n *= factor
    out.append(max_ranks)
    return sorted({r for r in out if r >= 2 * rails})


def study_routing(s: spec.Scenario, *, size_bytes: int, routings: Sequence[str] | None = None,
                  collectives: Sequence[str] = ("all_to_all", "all_reduce"), max_steps: int = 4,
                  qps: int = 4, seed: int = 1, max_ranks: int | None = None, a2a_pair_bytes: int = 1 << 20,
                  a2a_max_ranks: int | None = 32768, say: Say | None = None) -> dict[str, Any]:
    """``size_bytes`` per all-reduce; the all-to-all moves ``a2a_pair_bytes`` per rank pair (its
    buffer grows with the job, as an expert-parallel token exchange does: a fixed buffer would
    leave a few KB per pair at 100k ranks and time only latency), up to ``a2a_max_ranks``
    (the model routes every connection of the sampled step: minutes beyond that on 2 cores).
    Sprayed routings use one connection per pair (the model splits it evenly: more add nothing)."""
    t0 = time.monotonic()
    say = say or (lambda _m: None)
    have, missing = _routings(routings)
    g = graph.build(s)
    net = model.Network(g)
    ranks_total = len(graph.hosts(g)) * s.rails
    grid = rank_grid(min(ranks_total, max_ranks or ranks_total), s.rails)
    rows: list[dict[str, Any]] = []
    skipped = []
    for n in grid:
        for coll in collectives:
            if coll == "all_to_all" and a2a_max_ranks and n > a2a_max_ranks:
                skipped.append(n)
                continue
            nbytes = a2a_pair_bytes * n if coll == "all_to_all" else size_bytes
            for routing in have:
                t = time.monotonic()
                r = model.run_collective(g, coll, nbytes, routing=routing, hosts=n // s.rails,
                                         placement="random", qps=1 if routing in model_sprayed() else qps,
                                         seed=seed, max_steps=max_steps, network=net)
                rows.append({"ranks": r.ranks, "collective": coll, "routing": routing, "efficiency": r.efficiency,
                             "busbw_gbs": r.busbw_gbs, "time_s": r.time_s, "size_bytes": nbytes,
                             "steps_modelled": r.steps_modelled, "steps_distinct": r.steps_distinct,
                             "sampled_peers_of": r.steps[0].sampled if r.steps else 1.0,
                             "sampling_error": r.sampling_error, "wall_s": round(time.monotonic() - t, 2)})
                say(f"  {n:>7} ranks {coll:<10} {routing:<6} {r.efficiency:.3f} of line "
                    f"({time.monotonic() - t:.1f} s)")
    notes = [f"{s.name}: {ranks_total:,} ranks at most, random placement, {qps} QPs per pair (per-flow routings), "
             f"all-reduce {size_bytes} B, all-to-all {a2a_pair_bytes} B per pair"]
    sampled = sorted({(int(r["ranks"]), float(r["sampled_peers_of"]), float(r["sampling_error"]))
                      for r in rows if r["sampled_peers_of"] > 1})
    if sampled:
        notes.append("all-to-all sampled: " + ", ".join(f"each pair standing for {k:.1f} at {n:,} ranks "
                                                         f"(relative error {e:.1%})" for n, k, e in sampled))
    if skipped:
        notes.append(f"all-to-all not run at {', '.join(f'{n:,}' for n in skipped)} ranks (above {a2a_max_ranks:,}: "
                     f"model time)")
    if missing:
        notes.append(f"not in the model yet: {', '.join(missing)}")
    return _doc("routing", s.name, rows, notes, t0, missing_routings=missing)


def model_sprayed() -> tuple[str, ...]:
    """The model's routings that split a connection evenly (one connection is as good as many)."""
    return tuple(r for r in model.ROUTINGS if r in ("spray", "adaptive"))


# ---- planes -----------------------------------------------------------------------------------------

def two_tier(s: spec.Scenario, planes: int) -> dict[str, Any]:
    """The largest non-blocking two-tier HPN for ``planes`` planes with the scenario's NIC and
    switch capacity, as scenario fields: ports of NIC / planes, radix = capacity / port rate; a
    leaf gives half its ports to hosts and half to the spines (one link each); a spine reaches
    radix leaves (radix / rails segments of rails leaves)."""
    nic = s.planes * s.host_rate_gbps
    capacity = s.switch_radix * s.switch_port_rate_gbps
    port = nic / planes
    radix = int(capacity // port)
    if radix < 4 or radix % 2:
        raise UserError(f"{planes} planes: a radix of {radix} ports of {port:g}G cannot build a two-tier Clos")
    segments = radix // s.rails
    if segments < 1:
        raise UserError(f"{planes} planes: {s.rails} rails need more than {radix} ports per spine")
    return {"name": f"{s.name}-{planes}p", "kind": "hpn", "accelerators_per_host": s.accelerators_per_host,
            "rails": s.rails, "planes": planes, "hosts_per_segment": radix // 2, "segments_per_pod": segments,
            "leaves_per_plane_per_segment": s.rails, "spines_per_plane": radix // 2, "host_rate_gbps": port,
            "leaf_spine_rate_gbps": port, "switch_radix": radix, "switch_port_rate_gbps": port,
            "oversubscription": 1.0}


def two_tier_size(t: dict[str, Any]) -> dict[str, int]:
    """Hosts, switches and links of :func:`two_tier`'s fabric (``spec.size``'s arithmetic for one
    pod, without building or size-limiting the scenario: a test checks them equal where it can)."""
    leaves = t["segments_per_pod"] * t["leaves_per_plane_per_segment"]
    hosts = t["segments_per_pod"] * t["hosts_per_segment"]
    ports = hosts * t["rails"] * t["planes"]
    return {"hosts": hosts, "switches": (leaves + t["spines_per_plane"]) * t["planes"],
            "links": ports + leaves * t["spines_per_plane"] * t["planes"]}


def study_planes(s: spec.Scenario, planes: Sequence[int] = (1, 2, 4, 8)) -> dict[str, Any]:
    t0 = time.monotonic()
    rows = []
    for p in planes:
        t = two_tier(s, p)
        size = two_tier_size(t)
        nics = size["hosts"] * t["rails"]
        rows.append({"planes": p, "port_gbps": t["host_rate_gbps"], "radix": t["switch_radix"],
                     "accelerators": nics, "hosts": size["hosts"], "switches": size["switches"],
                     "switches_per_1k_accelerators": 1000 * size["switches"] / nics, "links": size["links"],
                     # leaf to leaf in other segments: a spine each, in every plane
                     "paths_between_nics": t["spines_per_plane"] * p})
    notes = [f"NIC {s.planes * s.host_rate_gbps:g} Gbit/s, switch {s.switch_radix * s.switch_port_rate_gbps / 1e3:g} "
             f"Tbit/s, {s.rails} rails; non-blocking two-tier per plane (leaf half down, half up)"]
    return _doc("planes", s.name, rows, notes, t0)


# ---- routes ------------------------------------------------------------------------------------------

def study_routes(scenarios: Sequence[spec.Scenario]) -> dict[str, Any]:

    t0 = time.monotonic()
    rows = []
    for s in scenarios:
        g = graph.build(s)
        switches = len(graph.switches(g))
        for policy in ("aggregate", "host-routes"):
            if switches <= COMPILE_MAX_SWITCHES:

                summary = compiler.route_summary(g, policy)
                per_switch = {n: r["routes"] for n, r in summary["switches"].items()}
                per_pod = {p: r["routes"] for p, r in summary["pods"].items() if p != "core"}
                source = "compiled"
            else:
                counts = analysis.route_counts(g)
                key = "aggregated" if policy == "aggregate" else "host_routes"
                per_switch = {n: c[key] for n, c in counts.items()}
                per_pod = {}
                for n, c in per_switch.items():
                    d = g.nodes[n]
                    if d.get("pod") is not None:
                        pod = f"c{d['campus']}/pod{d['pod']}"
                        per_pod[pod] = per_pod.get(pod, 0) + c
                source = "counted (analysis.route_counts)"
            rows.append({"scenario": s.name, "policy": policy, "switches": switches,
                         "max_per_switch": max(per_switch.values(), default=0),
                         "max_per_pod": max(per_pod.values(), default=0), "pods": len(per_pod),
                         "baidu_per_pod": BAIDU_ROUTES_PER_POD, "source": source})
    notes = [f"Baidu: ~{BAIDU_ROUTES_PER_POD:,} routes per POD; aggregate = the controller's default policy"]
    return _doc("routes", ",".join(s.name for s in scenarios), rows, notes, t0)


# ---- failures ----------------------------------------------------------------------------------------

def failure_sets(g: nx.MultiGraph) -> dict[str, set[tuple[str, str, int]]]:
    """One leaf-spine link, one spine (every link of it), one plane (every link of plane 0's switches)."""
    links = sorted((u, v, k) for u, v, k, d in g.edges(keys=True, data=True) if d["kind"] == "fabric")
    if not links:
        raise UserError("the fabric has no leaf-spine links to fail")
    spine = next(n for n in sorted(g.nodes) if g.nodes[n]["tier"] == 2)
    plane = g.nodes[spine].get("plane", 0)
    return {"link": {links[0]},
            "spine": {(u, v, k) for u, v, k in g.edges(spine, keys=True)},
            "plane": {(u, v, k) for u, v, k in g.edges(keys=True)
                      if (g.nodes[u]["tier"] > 0 and g.nodes[u].get("plane") == plane)
                      or (g.nodes[v]["tier"] > 0 and g.nodes[v].get("plane") == plane)}}


def study_failures(s: spec.Scenario, *, size_bytes: int, times: dict[str, tuple[float, float]] | None = None,
                   routings: Sequence[str] | None = None, collective: str = "all_reduce", hosts: int | None = None,
                   qps: int = 4, seed: int = 1) -> dict[str, Any]:
    """Per failure (one link, one spine, one plane), routing and failover mode, the failover chain
    (``model.failover_chain``: detection lost, detour over the fast-failover backups until
    convergence, then the converged routes); ``times``: mode -> (detection ms, convergence ms),
    default ``model.FAILOVER_CHAIN_MS``."""
    t0 = time.monotonic()
    have, missing = _routings(routings)
    times = times or DEFAULT_CHAIN_MS
    g = graph.build(s)
    rows = []
    for name, failed in failure_sets(g).items():
        for routing in have:
            f = model.failover_chain(g, collective, size_bytes, failed, times=times, routing=routing,
                                     hosts=hosts, placement="packed", qps=qps, seed=seed)
            for mode, d in f["by_mode"].items():
                rows.append({"failure": name, "links": len(failed), "routing": routing, "mode": mode,
                             "detect_ms": d["detect_ms"], "converge_ms": d["converge_ms"], "loss_ms": d["loss_ms"],
                             "detour_ms": d["detour_ms"], "healthy_s": f["healthy_s"], "detour_s": f["detour_s"],
                             "after_repair_s": f["after_repair_s"], "time_s": d["time_s"],
                             "slowdown": d["slowdown"], "connections_hit": f["connections_hit"],
                             "stalled_after_repair": f["stalled_after_repair"]})
    notes = [f"{s.name}: {collective} of {size_bytes} B, failure at its start; failover chain, detection / "
             "convergence " + ", ".join(f"{k} {d:g} / {c:g} ms" for k, (d, c) in times.items())]
    if missing:
        notes.append(f"not in the model yet: {', '.join(missing)}")
    return _doc("failures", s.name, rows, notes, t0, missing_routings=missing)


# ---- cross-campus --------------------------------------------------------------------------------------

def study_cross_campus(s: spec.Scenario, *, size_bytes: int, links: Sequence[int] = (1, 2, 4, 8, 16, 32),
                       distances_km: Sequence[float] = (10, 30, 100, 300), routing: str = "spray",
                       qps: int = 4, seed: int = 1) -> dict[str, Any]:
    """Per long-haul links per core pair and distance:

    * DP ring: a flat ring all-reduce through every host of both campuses (packed: each rail's
      ring crosses the long haul twice), latency-bound by its 2(n-1) steps;
    * DP exchange: the cross-campus step of a hierarchical all-reduce (reduce-scatter inside each
      campus, then every rank swaps its shard, size / hosts-per-campus, with its peer in the other
      campus, then all-gather inside), the step whose speed the long-haul capacity sets:
      its efficiency is the shard's time at the NIC's line rate over the modelled time;
    * TP/EP inside: all-to-all among campus 0's hosts (one step, every pair at once), untouched by the long haul."""
    t0 = time.monotonic()
    if s.campuses < 2 or s.long_haul is None:
        raise UserError(f"the cross-campus study needs a scenario with two campuses and long_haul ({s.name} has "
                        f"{s.campuses})")
    rows = []
    base = spec.to_dict(s)
    inside_cache: dict[int, float] = {}
    for n_links in links:
        for km in distances_km:
            doc = spec.deep_merge(base, {"long_haul": {"links": n_links, "distance_km": km}})
            try:
                t = spec.from_dict(doc)
            except UserError as exc:
                rows.append({"long_haul_links": n_links, "distance_km": km, "error": str(exc)})
                continue
            g = graph.build(t)
            hosts = graph.hosts(g)
            campus0 = sum(1 for h in hosts if g.nodes[next(iter(g[h]))]["campus"] == 0)
            long_haul = sum(d["rate_gbps"] for _, _, d in g.edges(data=True) if d["kind"] == "long-haul")
            inject = sum(d["rate_gbps"] for u, v, d in g.edges(data=True)
                         if d["kind"] == "host" and g.nodes[v if g.nodes[u]["tier"] == 0 else u]["campus"] == 0)
            net = model.Network(g)
            dp = model.run_collective(g, "all_reduce", size_bytes, routing=routing, placement="packed",
                                      qps=qps, seed=seed, network=net)
            order = sorted(hosts, key=lambda h: g.nodes[next(iter(g[h]))]["campus"])
            ranks = [(h, rail) for rail in range(t.rails) for h in order]
            n_host = len(order)
            pairs = [(b + i, b + i + campus0) for b in range(0, len(ranks), n_host) for i in range(campus0)]
            pairs += [(d, c) for c, d in pairs]
            shard = size_bytes / campus0
            ex = run_schedule(g, ranks, [(pairs, shard)], routing, qps, seed=seed)
            line_s = shard * 8 / (t.planes * t.host_rate_gbps * 1e9)
            if n_links not in inside_cache:
                tp = model.run_collective(g, "all_to_all", size_bytes, routing=routing, hosts=campus0,
                                          placement="packed", qps=qps, seed=seed, max_steps=8, network=net)
                inside_cache[n_links] = tp.efficiency
            rows.append({"long_haul_links": n_links, "distance_km": km,
                         "long_haul_to_campus_injection": long_haul / inject if inject else math.nan,
                         "dp_ring_efficiency": dp.efficiency, "dp_ring_time_s": dp.time_s,
                         "dp_exchange_ms": ex["time_s"] * 1e3, "dp_exchange_efficiency": line_s / ex["time_s"],
                         "tp_ep_inside_efficiency": inside_cache[n_links]})
    notes = [f"{s.name}: DP ring = flat ring all-reduce through every host of both campuses; DP exchange = the "
             f"cross-campus shard swap of a hierarchical all-reduce; TP/EP = all-to-all inside campus 0 (one step, "
             f"every pair at once); {routing}, {size_bytes} B; ratio = long-haul capacity (each link once) / one "
             f"campus's host injection"]
    return _doc("cross-campus", s.name, rows, notes, t0)


# ---- table and plot --------------------------------------------------------------------------------------

def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return str(v)
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(doc: dict[str, Any]) -> list[str]:
    rows = doc["rows"]
    out = [f"# study {doc['study']}: {doc['scenario']} ({doc['wall_s']} s, load "
           f"{' '.join(str(x) for x in doc['load_average'])})"]
    out += [f"# {n}" for n in doc["notes"]]
    if not rows:
        return out
    cols = [c for c in dict.fromkeys(k for r in rows for k in r) if c not in ("wall_s",)]
    widths = {c: max(len(c), *(len(_fmt(r.get(c, ""))) for r in rows)) for c in cols}
    out.append("  ".join(f"{c:>{widths[c]}}" for c in cols))
    for r in rows:
        out.append("  ".join(f"{_fmt(r.get(c, '')):>{widths[c]}}" for c in cols))
    return out


def plot(doc: dict[str, Any], path: str) -> str:
    """One PNG per study (matplotlib, Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    rows = [r for r in doc["rows"] if "error" not in r]
    study = doc["study"]
    if study == "routing":
        for key in sorted({(r["collective"], r["routing"]) for r in rows}):
            pts = sorted((r["ranks"], r["efficiency"]) for r in rows if (r["collective"], r["routing"]) == key)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{key[0]} {key[1]}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("accelerators (ranks)")
        ax.set_ylabel("busbw / NIC line rate")
    elif study == "planes":
        ax.bar([str(r["planes"]) for r in rows], [r["accelerators"] for r in rows])
        ax.set_yscale("log")
        ax.set_xlabel("planes")
        ax.set_ylabel("accelerators in two tiers")
        for i, r in enumerate(rows):
            ax.annotate(f"{r['paths_between_nics']} paths", (i, r["accelerators"]), ha="center", va="bottom")
    elif study == "routes":
        labels = [f"{r['scenario']}\n{r['policy']}" for r in rows]
        ax.bar(labels, [r["max_per_pod"] for r in rows])
        ax.axhline(BAIDU_ROUTES_PER_POD, color="red", linestyle="--", label="Baidu ~4,000 per POD")
        ax.set_yscale("log")
        ax.set_ylabel("routes per POD (max)")
        ax.tick_params(axis="x", labelsize=7)
    elif study == "failures":
        keys = sorted({(r["failure"], r["routing"]) for r in rows})
        modes = sorted({r["mode"] for r in rows})
        width = 0.8 / max(1, len(modes))
        for j, mode in enumerate(modes):
            ys = [next((r["slowdown"] for r in rows if (r["failure"], r["routing"]) == k and r["mode"] == mode),
                       0.0) for k in keys]
            ax.bar([i + j * width for i in range(len(keys))], ys, width, label=mode)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], [f"{f}\n{r}" for f, r in keys], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("collective time / healthy")
    elif study == "cross-campus":
        for km in sorted({r["distance_km"] for r in rows}):
            pts = sorted((r["long_haul_to_campus_injection"], r["dp_exchange_efficiency"]) for r in rows
                         if r["distance_km"] == km)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"DP exchange across, {km:g} km")
            pts = sorted((r["long_haul_to_campus_injection"], r["dp_ring_efficiency"]) for r in rows
                         if r["distance_km"] == km)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="x", linestyle=":",
                    label=f"DP flat ring, {km:g} km")
        inside = sorted({(r["long_haul_to_campus_injection"], r["tp_ep_inside_efficiency"]) for r in rows})
        ax.plot([p[0] for p in inside], [p[1] for p in inside], "k--", label="TP/EP inside")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("long-haul capacity / campus injection")
        ax.set_ylabel("busbw / NIC line rate")
    else:
        raise UserError(f"unknown study {study!r}")
    ax.set_title(f"{study}: {doc['scenario']}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
