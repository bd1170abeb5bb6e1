"""Design rules for any scenario: ``hpnlab check SCENARIO`` (and the pytest plugin's ``hpn_check``).

Each rule is a pure function of a :class:`CheckContext` (the scenario, its fabric graph, the
rule's section of the rules file, the command-line flags) returning :class:`RuleResult` rows:
the rule, what it looked at (a switch, a tier, a plane, a link, a job placement), the figure
measured on the graph or the compiled tables, the limit it is held against, pass or fail.

Rules (``RULES``, in this order; every one is on unless the rules file turns it off)
    radix              per switch: port slots used (links x their rate in ``switch_port_rate_gbps``
                       units) against ``switch_radix``. Passing switches are summarised per
                       tier (the worst named); every failing switch gets its own row.
    port-speed         per switch: every link rate is a whole number of port slots or an even
                       breakout of one (100G on a 400G slot), and, with ``speeds_gbps`` in the
                       rules file, one of those speeds.
    oversubscription   per tier: the worst switch's down:up capacity against the scenario's
                       stated ``oversubscription`` (leaf / edge tier; a figure at most 1% above
                       passes, as the loader allows) or the rules file's limit per tier.
    nic-planes         every NIC (host, rail) has exactly one port in each plane.
    planes-disjoint    no switch or link is shared between planes: every switch-to-switch link
                       joins two switches of one plane, every host port lands on a leaf of its
                       plane.
    route-budget       per switch: IPv4 routes (table 1) of the compiled policy (``aggregate``,
    flow-budget        the controller's default) and all flow entries, against the scenario's
                       ``switch_tables`` (routes, flows) or the rules file's limit per tier.
    path-diversity     per plane and rail: the fewest equal-cost shortest paths between the
                       first leaf of the rail and a leaf of every other kind (same rail in
                       another segment, another rail, another pod, another campus); default
                       limit 2 (one path is a single point of failure).
    blast-radius       per job placement (``placement.PLACEMENTS``, one job on the whole
                       fabric): the share of the job's bandwidth left after the worst single
                       spine loss and the worst plane loss. A port's bandwidth is its rate
                       capped by its leaf's uplink share (up / down capacity); a plane in which
                       the job sits under a single leaf does not use the spines.
    long-haul          cross-campus only: per campus, host capacity over long-haul capacity,
                       and the longest long-haul delay.
    failure-tolerance  every single link and switch failure (``--pairs``: every pair of links;
                       ``--plane``: a whole plane) leaves every live host pair reachable with
                       no loop, proved on the compiled tables (``hpnlab.fabric.routing.proofs``).
    local-protection   opt-in (``--local-protection``, or ``local-protection: true`` in the rules
                       file): per kind of event (a link down at both ends, at one end with and
                       without BFD, a switch down, a switch coming back, a link coming back at one
                       end first), every event of plane 0 walked through the *healthy* tables
                       with only port liveness changed, every pair and entropy branch: no black
                       hole outside the named exceptions, no loop, at most one down-up turn
                       (``hpnlab.fabric.routing.protection``). Every branch is walked, so a
                       fabric whose estimated walks pass ``max_walks`` (default 3,000,000) is
                       not proved here: the row says so (prove a smaller shape of it).
    deadlock-freedom   under priority flow control: no cyclic buffer dependency in the compiled
                       tables, healthy and under every single failure (detours included), with
                       one lossless priority, and where that has a cycle, with bounced detours in
                       a priority of their own (``emulation.lossless.bounce_priority`` auto or on:
                       what the emulation then does; ``hpnlab.fabric.routing.deadlock``). Fabrics
                       beyond ``max_pairs`` pair walks are not proved (not available).

Rules file (YAML, read with the scenario loader's bounds and checks): one key per rule, set to
``false`` (off), ``true`` (on, default limits) or a mapping of limits (``enabled: false`` turns
it off too). A per-switch limit is given for every switch (``max``) or per tier (``leaf``,
``spine``, ``core``, ``edge``, ``agg``; the tier's wins); a limit given here replaces the
scenario's stated one::

    radix: {leaf: 60}                 # keep 4 spare ports on every leaf
    port-speed: {speeds_gbps: [200, 400]}
    oversubscription: {spine: 1.0}
    route-budget: {max: 1024}
    flow-budget: {leaf: 4096, spine: 4096}
    path-diversity: {min_paths: 4}
    blast-radius: {spine_loss_min_share: 0.9, plane_loss_min_share: 0.5, placements: [cross-rail]}
    long-haul: {max_ratio: 4, max_delay_us: 200}
    failure-tolerance: false
    local-protection: {max_walks: 10000000}
    deadlock-freedom: {max_pairs: 100000}
"""
from __future__ import annotations

import dataclasses
import math
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import networkx as nx

from hpnlab.fabric.errors import UserError, short
from hpnlab.fabric.routing import compiler, deadlock, proofs, protection
from hpnlab.fabric.scenario import analysis, shapes
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec as fspec
from hpnlab.fabric.workload.placement import PLACEMENTS, place

ROLE_ORDER = ("leaf", "edge", "spine", "agg", "core")
NOT_AVAILABLE = "not available"


class RuleResult(NamedTuple):
    rule: str        # "radix", "oversubscription", "failure-tolerance", ...
    subject: str     # "p0l0", "tier leaf", "link p0l0-p0s0#0", "fabric"
    figure: Any      # the measured value (number or short string)
    limit: Any       # the limit it is held against (None when none stated)
    ok: bool
    detail: str = ""


@dataclass
class CheckContext:
    """What a rule sees. ``limits`` is the rule's own section of the rules file ({} when none)."""
    name: str
    spec: Any
    graph: nx.MultiGraph
    limits: dict = field(default_factory=dict)
    flags: frozenset = frozenset()
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    def states(self, failures: Any = None) -> dict:
        """The compiled SwitchState of every live switch (policy ``aggregate``); cached when
        ``failures`` is None."""

        if failures is not None:
            return compiler.compile_fabric(self.graph, failures)
        if "states" not in self.cache:
            self.cache["states"] = compiler.compile_fabric(self.graph)
        return self.cache["states"]

    def scan(self) -> dict[str, Any]:
        """``analysis.scan`` of the graph (per-switch port use), computed once."""

        if "scan" not in self.cache:
            self.cache["scan"] = analysis.scan(self.graph)
        return self.cache["scan"]

    def for_rule(self, limits: Mapping[str, Any]) -> CheckContext:
        """The same context (and cache) with another rule's limits."""
        return dataclasses.replace(self, limits=dict(limits), cache=self.cache)


# ---- small helpers ------------------------------------------------------------------------

def _switch_roles(g: nx.MultiGraph) -> dict[str, list[str]]:
    """Switches by role, roles in ROLE_ORDER, switches in graph order."""
    by_role: dict[str, list[str]] = defaultdict(list)
    for node, attrs in g._node.items():
        if attrs["tier"] > 0:
            by_role[attrs["role"]].append(node)
    return {role: by_role[role] for role in sorted(by_role, key=role_rank)}


def role_rank(role: str) -> int:
    return ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER)


def _num(value: float) -> float | int:
    """A figure as plain JSON: a whole float as int, others rounded to 4 decimals."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return round(value, 4) if isinstance(value, float) else value


def role_limit(limits: Mapping[str, Any], role: str, stated: Any) -> Any:
    """A per-switch limit: the rules file's tier limit, its ``max``, else the scenario's."""
    if role in limits:
        return limits[role]
    if "max" in limits:
        return limits["max"]
    return stated


def per_switch(rule: str, ctx: CheckContext, figures: Mapping[str, float], stated: Any,
               unit: str = "") -> list[RuleResult]:
    """Rows of a per-switch rule: one passing row per tier (its worst switch named), or one
    row per failing switch of a tier that has any."""
    out: list[RuleResult] = []
    for role, members in _switch_roles(ctx.graph).items():
        members = [m for m in members if m in figures]
        if not members:
            continue
        limit = role_limit(ctx.limits, role, stated)
        worst = max(members, key=lambda m: figures[m])
        if limit is None:
            out.append(RuleResult(rule, f"tier {role}", _num(figures[worst]), None, True,
                                  f"worst {worst} of {len(members)}; no limit stated"))
            continue
        over = [m for m in members if figures[m] > limit + 1e-9]
        if not over:
            out.append(RuleResult(rule, f"tier {role}", _num(figures[worst]), limit, True,
                                  f"worst {worst} of {len(members)}"))
            continue
        for m in over:
            out.append(RuleResult(rule, m, _num(figures[m]), limit, False,
                                  f"{role}: {len(over)} of {len(members)} over {limit}{unit}"))
    return out


# ---- the rules ----------------------------------------------------------------------------

def rule_radix(ctx: CheckContext) -> list[RuleResult]:
    ports = ctx.scan()["ports"]
    return per_switch("radix", ctx, {sw: use["slots"] for sw, use in ports.items()},
                      ctx.spec.switch_radix, " ports")


def _valid_speed(rate: float, slot: float) -> bool:
    """A whole number of slots, or an even breakout of one slot."""
    return any(ratio >= 1 and abs(ratio - round(ratio)) < 1e-9 for ratio in (rate / slot, slot / rate))


def _speeds(values: Iterable[float]) -> str:
    return ",".join(f"{v:g}" for v in sorted(set(values)))


def rule_port_speed(ctx: CheckContext) -> list[RuleResult]:
    g = ctx.graph
    slot = ctx.spec.switch_port_rate_gbps
    allowed = ctx.limits.get("speeds_gbps")
    limit = f"{slot:g}G slots" + (f"; {_speeds(allowed)}" if allowed else "")
    out: list[RuleResult] = []
    for role, members in _switch_roles(g).items():
        role_speeds: set[float] = set()
        bad_rows = []
        for sw in members:
            speeds = {d["rate_gbps"] for keys in g._adj[sw].values() for d in keys.values()}
            role_speeds |= speeds
            bad = {r for r in speeds if not _valid_speed(r, slot)
                   or (allowed and all(abs(r - a) > 1e-9 for a in allowed))}
            if bad:
                bad_rows.append(RuleResult("port-speed", sw, _speeds(speeds), limit, False,
                                           f"{role}: {_speeds(bad)}G is not a whole number of "
                                           f"{slot:g}G slots or an even breakout"
                                           + (" or not an allowed speed" if allowed else "")))
        out.extend(bad_rows or [RuleResult("port-speed", f"tier {role}", _speeds(role_speeds), limit, True,
                                           f"{len(members)} switches")])
    return out


def rule_oversubscription(ctx: CheckContext) -> list[RuleResult]:
    g = ctx.graph
    ports = ctx.scan()["ports"]
    stated = ctx.spec.oversubscription
    out: list[RuleResult] = []
    for role, members in _switch_roles(g).items():
        ratios = {sw: ports[sw]["down_gbps"] / ports[sw]["up_gbps"] for sw in members if ports[sw]["up_gbps"] > 0}
        if not ratios:
            continue
        worst = max(ratios, key=lambda sw: ratios[sw])
        limit = ctx.limits.get(role, stated if role in ("leaf", "edge") else None)
        figure = ratios[worst]
        over = [sw for sw, r in ratios.items() if limit is not None and r > limit * 1.01 + 1e-9]
        detail = f"worst {worst} {figure:.3g}:1 of {len(ratios)}"
        if over:
            detail += f"; {len(over)} over {limit:g}:1" + (f" ({', '.join(over[:4])}...)" if len(over) > 4
                                                             else f" ({', '.join(over)})")
        elif limit is None:
            detail += "; no limit stated"
        out.append(RuleResult("oversubscription", f"tier {role}", _num(figure), limit, not over, detail))
    return out


def rule_nic_planes(ctx: CheckContext) -> list[RuleResult]:
    g = ctx.graph
    planes = list(range(ctx.spec.planes))
    nics = 0
    out: list[RuleResult] = []
    for host, attrs in g._node.items():
        if attrs["tier"] != 0:
            continue
        by_rail: dict[int, list[int]] = defaultdict(list)
        for keys in g._adj[host].values():
            for d in keys.values():
                by_rail[d.get("rail", -1)].append(d.get("plane", -1))
        for rail, got in sorted(by_rail.items()):
            nics += 1
            if sorted(got) != planes:
                counts = Counter(got)
                missing = [p for p in planes if p not in counts]
                twice = sorted(p for p, n in counts.items() if n > 1)
                what = "; ".join(x for x in (f"no port in plane {_listed(missing)}" if missing else "",
                                             f"{_listed(twice)} port(s) twice" if twice else "") if x)
                out.append(RuleResult("nic-planes", f"{host} rail {rail}", _listed(sorted(got)),
                                      "one port per plane", False, what or "a port outside the planes"))
    good = nics - len(out)
    return out or [RuleResult("nic-planes", "hosts", f"{good} of {nics} NICs", "one port per plane", True,
                              f"{len(planes)} plane(s)")]


def _listed(values: Iterable[Any]) -> str:
    return ",".join(str(v) for v in values)


def rule_planes_disjoint(ctx: CheckContext) -> list[RuleResult]:
    g = ctx.graph
    node = g._node
    shared: dict[int, list[RuleResult]] = defaultdict(list)
    for u, nbrs in g._adj.items():
        uattrs = node[u]
        for v, keys in nbrs.items():
            vattrs = node[v]
            for k, d in keys.items():
                if uattrs["tier"] == 0:
                    leaf_plane = vattrs.get("plane")
                    if d.get("plane") != leaf_plane:
                        shared[leaf_plane].append(RuleResult(
                            "planes-disjoint", f"link {u}-{v}#{k}", f"plane {d.get('plane')} port", 0, False,
                            f"{u}'s plane-{d.get('plane')} port lands on {v} of plane {leaf_plane}"))
                elif vattrs["tier"] > 0 and u < v and uattrs.get("plane") != vattrs.get("plane"):
                    shared[uattrs.get("plane")].append(RuleResult(
                        "planes-disjoint", f"link {u}-{v}#{k}", "joins 2 planes", 0, False,
                        f"{u} (plane {uattrs.get('plane')}) to {v} (plane {vattrs.get('plane')})"))
    out: list[RuleResult] = []
    switch_planes = Counter(a.get("plane") for a in node.values() if a["tier"] > 0)
    for plane in sorted(switch_planes, key=lambda p: (p is None, p)):
        rows = shared.get(plane, [])
        out.extend(rows or [RuleResult("planes-disjoint", f"plane {plane}", 0, 0, True,
                                       f"{switch_planes[plane]} switches, none shared")])
    return out


def tables_stated(ctx: CheckContext, what: str) -> Any:
    tables = getattr(ctx.spec, "switch_tables", None)
    return getattr(tables, what, None) if tables is not None else None


def rule_route_budget(ctx: CheckContext) -> list[RuleResult]:
    states = ctx.states()
    return per_switch("route-budget", ctx, {sw: st.route_count for sw, st in states.items()},
                      tables_stated(ctx, "routes"), " routes")


def rule_flow_budget(ctx: CheckContext) -> list[RuleResult]:
    states = ctx.states()
    return per_switch("flow-budget", ctx, {sw: st.flow_count for sw, st in states.items()},
                      tables_stated(ctx, "flows"), " flows")


def _leaf_pairs(g: nx.MultiGraph, plane: int, rail: int) -> dict[str, tuple[str, str]]:
    """(first leaf of the rail, a leaf of each other kind) in one plane."""
    leaves = sorted((a["campus"], a["pod"], a["segment"], a.get("leaf", 0), n) for n, a in g._node.items()
                    if a["tier"] == 1 and a.get("plane") == plane)
    mine = [entry for entry in leaves if rail in g._node[entry[-1]].get("rails", ())]
    if not mine:
        return {}
    first = mine[0]
    pairs: dict[str, tuple[str, str]] = {}
    for entry in leaves:
        leaf = entry[-1]
        if leaf == first[-1]:
            continue
        if entry[0] != first[0]:
            kind = "cross-campus"
        elif entry[1] != first[1]:
            kind = "cross-pod"
        elif rail in g._node[leaf].get("rails", ()):
            kind = "same-rail"
        else:
            kind = "cross-rail"
        pairs.setdefault(kind, (first[-1], leaf))
    return pairs


def path_counts(ctx: CheckContext) -> dict[str, dict[str, int]]:
    """Per "plane P rail R": equal-cost shortest paths from the rail's first leaf to a leaf of
    each other kind (same-rail, cross-rail, cross-pod, cross-campus); computed once."""
    if "paths" not in ctx.cache:
        g, s = ctx.graph, ctx.spec
        out: dict[str, dict[str, int]] = {}
        for plane in range(s.planes):
            for rail in range(s.rails):
                pairs = _leaf_pairs(g, plane, rail)
                if pairs:
                    source = next(iter(pairs.values()))[0]
                    counts = shortest_path_counts(g, source, {b for _, b in pairs.values()})
                    out[f"plane {plane} rail {rail}"] = {kind: counts[b] for kind, (_, b) in sorted(pairs.items())}
        ctx.cache["paths"] = out
    return ctx.cache["paths"]


def shortest_path_counts(g: nx.MultiGraph, source: str, targets: set[str]) -> dict[str, int]:
    """Shortest link-level paths (parallel links counted) from a switch to each target switch,
    walking only switches (0 for a target it cannot reach): ``analysis.shortest_path_counts``."""
    return {t: n for t, (_, n) in analysis.shortest_path_counts(g, source, targets).items()}


def rule_path_diversity(ctx: CheckContext) -> list[RuleResult]:
    limit = ctx.limits.get("min_paths", 2)
    out: list[RuleResult] = []
    for subject, counts in path_counts(ctx).items():
        worst = min(counts.values())
        detail = ", ".join(f"{kind} {n}" for kind, n in counts.items())
        out.append(RuleResult("path-diversity", subject, worst, limit, worst >= limit, detail))
    return out


def _job_ports(g: nx.MultiGraph, job: list) -> list[tuple[str, int, float]]:
    """(leaf, plane, rate) of every port a job's ranks use."""
    out = []
    for rank in job:
        wanted = set(rank.planes)
        for leaf, keys in g._adj[rank.host].items():
            for d in keys.values():
                if d.get("rail") == rank.rail and d.get("plane") in wanted:
                    out.append((leaf, d["plane"], d["rate_gbps"]))
    return out


def blast_radius(g: nx.MultiGraph, job: list, ports: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """Share of a job's bandwidth left after the worst spine loss and the worst plane loss.

    A port's bandwidth is its rate times min(1, its leaf's up / down capacity); in a plane where
    the job sits under a single leaf, its ports do not use the spines (leaf-local traffic)."""
    used = _job_ports(g, job)
    leaves_per_plane: dict[int, set[str]] = defaultdict(set)
    for leaf, plane, _ in used:
        leaves_per_plane[plane].add(leaf)
    on_leaf: dict[str, float] = defaultdict(float)    # the job's port rate per leaf that uses uplinks
    plane_bw: dict[int, float] = defaultdict(float)
    total = 0.0
    for leaf, plane, rate in used:
        if len(leaves_per_plane[plane]) > 1:
            share = min(1.0, ports[leaf]["up_gbps"] / ports[leaf]["down_gbps"]) if ports[leaf]["down_gbps"] else 1.0
            on_leaf[leaf] += rate
        else:
            share = 1.0
        plane_bw[plane] += rate * share
        total += rate * share
    if total <= 0:
        return {"spine": 1.0, "spine_worst": None, "plane": 1.0, "plane_worst": None}
    worst_spine, worst_spine_left = None, total
    node = g._node
    for sw, attrs in node.items():
        if attrs["tier"] != 2:
            continue
        lost = 0.0
        for leaf, keys in g._adj[sw].items():
            rate = on_leaf.get(leaf, 0.0)
            if not rate or node[leaf]["tier"] != 1:
                continue
            cut = sum(d["rate_gbps"] for d in keys.values())
            use = ports[leaf]
            before = min(1.0, use["up_gbps"] / use["down_gbps"])
            after = min(1.0, (use["up_gbps"] - cut) / use["down_gbps"])
            lost += rate * (before - after)
        if total - lost < worst_spine_left - 1e-12:
            worst_spine, worst_spine_left = sw, total - lost
    worst_plane = max(plane_bw, key=lambda p: plane_bw[p]) if plane_bw else None
    plane_left = total - plane_bw[worst_plane] if worst_plane is not None else total
    return {"spine": worst_spine_left / total, "spine_worst": worst_spine,
            "plane": plane_left / total, "plane_worst": worst_plane}


def rule_blast_radius(ctx: CheckContext) -> list[RuleResult]:

    g, s = ctx.graph, ctx.spec
    ports = ctx.scan()["ports"]
    spine_limit = ctx.limits.get("spine_loss_min_share")
    plane_limit = ctx.limits.get("plane_loss_min_share")
    out: list[RuleResult] = []
    for placement in ctx.limits.get("placements", PLACEMENTS):
        if placement == "cross-campus" and s.campuses < 2:
            continue
        try:
            job = place(g, placement)[0]
        except UserError as exc:
            out.append(RuleResult("blast-radius", f"{placement} job", "n/a", None, True, short(str(exc), 80)))
            continue
        br = blast_radius(g, job, ports)
        for what, limit, worst in (("spine", spine_limit, br["spine_worst"]),
                                   ("plane", plane_limit, br["plane_worst"])):
            share = br[what]
            where = (f"worst {worst}" if worst else "no spine used") if what == "spine" else f"worst plane {worst}"
            ok = limit is None or share >= limit - 1e-9
            detail = f"{len(job)} ranks; {where}" + ("; no limit stated" if limit is None else "")
            out.append(RuleResult("blast-radius", f"{what} loss, {placement} job", round(share, 4), limit, ok,
                                  detail))
    return out


def rule_long_haul(ctx: CheckContext) -> list[RuleResult]:
    g, s = ctx.graph, ctx.spec
    if s.campuses < 2:
        return []
    host_gbps: dict[int, float] = defaultdict(float)
    long_gbps: dict[int, float] = defaultdict(float)
    delay = 0.0
    node = g._node
    for u, nbrs in g._adj.items():
        for keys in nbrs.values():
            for d in keys.values():
                if d["kind"] == "host" and node[u]["tier"] == 0:
                    host_gbps[node[u]["campus"]] += d["rate_gbps"]
                elif d["kind"] == "long-haul":
                    long_gbps[node[u]["campus"]] += d["rate_gbps"]
                    delay = max(delay, d["delay_us"])
    max_ratio = ctx.limits.get("max_ratio")
    max_delay = ctx.limits.get("max_delay_us")
    out: list[RuleResult] = []
    for campus in sorted(host_gbps):
        cap = long_gbps.get(campus, 0.0)
        ratio = host_gbps[campus] / cap if cap else math.inf
        ok = (max_ratio is None or ratio <= max_ratio + 1e-9) and cap > 0
        figure: Any = _num(round(ratio, 3)) if cap else "no long-haul link"
        out.append(RuleResult("long-haul", f"campus {campus} ratio", figure, max_ratio, ok,
                              f"{host_gbps[campus]:g}G of hosts over {cap:g}G long-haul"
                              + ("; no limit stated" if max_ratio is None else "")))
    out.append(RuleResult("long-haul", "long-haul delay", _num(delay), max_delay,
                          max_delay is None or delay <= max_delay + 1e-9,
                          "one way, us" + ("; no limit stated" if max_delay is None else "")))
    return out


def rule_failure_tolerance(ctx: CheckContext) -> list[RuleResult]:
    """Every single link and switch failure proved on the compiled tables (``hpnlab.fabric.routing.proofs``):
    one result per failure class, then a summary.

    ctx.limits (the rules file's section for this rule): ``max_bisection_loss`` and
    ``max_uplink_loss`` (shares, 0..1; none: not checked), ``exhaustive`` (bool), ``pairs``
    and ``plane`` (bool, like the flags). ctx.flags: "pairs", "plane"."""
    limits: Mapping = ctx.limits or {}
    flags = frozenset(getattr(ctx, "flags", frozenset()))
    max_bis = limits.get("max_bisection_loss")
    max_up = limits.get("max_uplink_loss")
    proof = proofs.prove(ctx.graph, pairs="pairs" in flags or bool(limits.get("pairs")),
                  plane="plane" in flags or bool(limits.get("plane")),
                  exhaustive=bool(limits.get("exhaustive")),
                  states=lambda fl: ctx.states(failures=fl if fl else None))
    limit = " / ".join(x for x in (
        "every live pair delivered, no loop, none cut",
        f"bisection loss \u2264 {proofs.pct(max_bis)}" if max_bis is not None else "",
        f"uplink loss \u2264 {proofs.pct(max_up)}" if max_up is not None else "") if x)
    results = []
    bad = 0
    healthy = proofs.FailureClass("no failure", ("healthy",), proof.healthy.failure, 1)
    for cp in [proofs.ClassProof(healthy, proof.healthy, 0), *proof.classes]:
        v = cp.verdict
        ok = v.ok and (max_bis is None or v.bisection_loss <= max_bis) and (max_up is None or v.uplink_loss <= max_up)
        bad += 0 if ok else cp.cls.size
        subject = cp.cls.label if cp.cls.key == ("healthy",) else f"{cp.cls.label} (represents {cp.cls.size:,})"
        detail = f"e.g. {v.failure.name}"
        if v.problems:
            detail += f": {v.problems[0]}"
            if len(v.problems) > 1:
                detail += f" (+{len(v.problems) - 1} more)"
        results.append(RuleResult("failure-tolerance", subject, proofs.figure(v), limit, ok, detail))
    how = "every failure, every pair" if proof.exhaustive else "one failure per symmetry class, one pair per pair class"
    results.append(RuleResult("failure-tolerance", "all failures",
                              f"{proof.failures - bad:,} of {proof.failures:,} tolerated", "all", bad == 0,
                              f"{len(proof.classes)} classes ({how}), {proof.seconds:.1f} s"))
    return results


#: a local-protection proof walks every branch: above this many (``shapes.walk_cost``) it is not run
LOCAL_PROTECTION_MAX_WALKS = 3_000_000


def rule_local_protection(ctx: CheckContext) -> list[RuleResult]:
    """Local protection proved on the healthy tables (``hpnlab.fabric.routing.protection``): one
    result per kind of event, then a summary; or one "not available" row naming the estimated
    walks when they pass ``max_walks`` (ctx.limits; default ``LOCAL_PROTECTION_MAX_WALKS``).
    ctx.limits ``all_planes`` (bool): every plane's events, not plane 0's alone."""
    limits: Mapping = ctx.limits or {}
    most = int(limits.get("max_walks", LOCAL_PROTECTION_MAX_WALKS))
    kind, counts = shapes.counts_of(ctx.spec)
    cost = shapes.walk_cost(kind, counts)
    if cost > most:
        return [RuleResult("local-protection", "fabric", NOT_AVAILABLE, f"\u2264 {most:,} walks", True,
                           f"about {cost:,} walks (every branch of every pair, every event): prove a smaller "
                           f"shape of this fabric (fewer pods, segments or hosts; hpnlab.fabric.scenario.shapes), "
                           f"or raise local-protection.max_walks in the rules file")]
    proof = protection.prove(ctx.graph, all_planes=bool(limits.get("all_planes")), healthy=ctx.states())
    limit = "no black hole but the named exceptions, no loop, at most one down-up turn"
    results = []
    for row in proof.rows.values():
        excepted = "".join(f" (+{n:,} branches excepted: {name})" for name, n in sorted(row.excepted.items()))
        figure = (f"{row.black_holes:,} black holes / {row.loops:,} loops / {row.double_bounces:,} double bounces"
                  f"{excepted}")
        detail = f"{row.events:,} events, {row.pairs:,} pairs, {row.branches:,} branches, {row.seconds:.1f} s"
        if row.failing:
            first = row.failing[0]
            detail += f"; e.g. {first.problems[0]}"
        results.append(RuleResult("local-protection", protection.EVENT_NAMES[row.kind], figure, limit, row.ok, detail))
    bad = sum(len(r.failing) for r in proof.rows.values())
    planes = ", ".join(map(str, proof.planes_walked))
    results.append(RuleResult("local-protection", "all events", f"{proof.events - bad:,} of {proof.events:,} protected",
                              "all", bad == 0, f"plane(s) {planes}; {proof.pairs:,} pairs, {proof.branches:,} "
                                               f"branches walked, {proof.seconds:.1f} s"))
    return results
def rule_deadlock_freedom(ctx: CheckContext) -> list[RuleResult]:
    """No cyclic buffer dependency under PFC (``hpnlab.fabric.routing.deadlock``): one row for one lossless
    priority, and where it has a cycle one for bounced detours in a priority of their own (what the
    scenario's ``bounce_priority`` auto or on makes the emulation do). ctx.limits: ``max_pairs``."""
    limits: Mapping = ctx.limits or {}
    budget = int(limits.get("max_pairs", deadlock.MAX_WORK))
    size = deadlock.work(ctx.graph)
    limit = "no cyclic buffer dependency, healthy and every single failure"
    if size > budget:
        return [RuleResult("deadlock-freedom", "fabric", NOT_AVAILABLE, limit, True,
                           f"{size:,} pair walks, above max_pairs {budget:,}: the proof is sized for fabrics "
                           f"one machine emulates (raise deadlock-freedom.max_pairs in a rules file to run it)")]
    mode = ctx.spec.emulation.lossless.bounce_priority

    def states(fl: Any) -> dict:
        return ctx.states(failures=fl if fl else None)

    def figure(p: deadlock.DeadlockProof) -> str:
        return "no cycle" if p.ok else f"{len(p.cycles)} of {len(p.states)} states cyclic"

    one = deadlock.prove(ctx.graph, compile_states=states)
    own = not one.ok and mode != "off"
    rows = [RuleResult("deadlock-freedom", "one lossless priority", figure(one), limit, one.ok or own,
                       deadlock.summary(one) + ("; bounced detours get a priority of their own "
                                                f"(bounce_priority {mode})" if own else ""))]
    if not one.ok and mode != "off":
        two = deadlock.prove(ctx.graph, bounce=True, compile_states=states)
        rows.append(RuleResult("deadlock-freedom", "bounced detours in priority 1", figure(two), limit, two.ok,
                               deadlock.summary(two)))
    return rows


RULES: dict[str, Callable[[CheckContext], Iterable[RuleResult]]] = {
    "radix": rule_radix,
    "port-speed": rule_port_speed,
    "oversubscription": rule_oversubscription,
    "nic-planes": rule_nic_planes,
    "planes-disjoint": rule_planes_disjoint,
    "route-budget": rule_route_budget,
    "flow-budget": rule_flow_budget,
    "path-diversity": rule_path_diversity,
    "blast-radius": rule_blast_radius,
    "long-haul": rule_long_haul,
    "failure-tolerance": rule_failure_tolerance,
    "local-protection": rule_local_protection,
    "deadlock-freedom": rule_deadlock_freedom,
}
#: rules that run only when asked for (``--local-protection``, ``--only``, or named in the rules file)
OPT_IN = frozenset({"local-protection"})


# ---- the rules file -----------------------------------------------------------------------

_TIER_LIMIT = fspec.Rule("int", "a per-switch limit", 0, fspec.MAX_COUNT * 1000)
_RATIO = fspec.Rule("number", "a ratio", 0.0, 1_000_000.0, positive=True)
_SHARE = fspec.Rule("number", "a share of bandwidth (0..1)", 0.0, 1.0)
_PER_TIER = {"max": _TIER_LIMIT} | dict.fromkeys(ROLE_ORDER, _TIER_LIMIT)

#: Limits each rule's section of the rules file accepts (None: any plain values, read by the rule).
RULE_LIMITS: dict[str, dict[str, fspec.Rule] | None] = {
    "radix": _PER_TIER,
    "port-speed": {"speeds_gbps": fspec.Rule("list", "allowed link speeds (Gbit/s)")},
    "oversubscription": dict.fromkeys(ROLE_ORDER, _RATIO),
    "nic-planes": {},
    "planes-disjoint": {},
    "route-budget": _PER_TIER,
    "flow-budget": _PER_TIER,
    "path-diversity": {"min_paths": fspec.Rule("int", "fewest shortest paths", 1, fspec.MAX_COUNT)},
    "blast-radius": {"spine_loss_min_share": _SHARE, "plane_loss_min_share": _SHARE,
                     "placements": fspec.Rule("placements", "job placements to look at (default: all)")},
    "long-haul": {"max_ratio": _RATIO, "max_delay_us": fspec.Rule("number", "us", 0.0, fspec.MAX_QUANTITY)},
    "failure-tolerance": None,
    "local-protection": {"max_walks": fspec.Rule("int", "most walks to make", 1, fspec.MAX_COUNT * 1000),
                         "all_planes": fspec.Rule("bool", "every plane's events, not plane 0's alone")},
    "deadlock-freedom": {"max_pairs": fspec.Rule("int", "the most pair walks the proof takes", 1,
                                                 fspec.MAX_COUNT * 1000)},
}


@dataclass(frozen=True)
class RulesConfig:
    """A validated rules file: the rules turned off, each rule's limits, and the opt-in rules it
    turns on (``OPT_IN``: named with true or limits)."""
    disabled: frozenset = frozenset()
    limits: Mapping[str, dict] = field(default_factory=dict)
    source: str | None = None
    enabled: frozenset = frozenset()



def _rule_error(field_name: str, rule: str, source: str | None) -> fspec.ScenarioError:
    return fspec.ScenarioError(field_name, rule, source)


def _check_limit(value: Any, name: str, rule: fspec.Rule, source: str | None) -> Any:
    try:
        if rule.type == "placements":

            if not isinstance(value, list) or not value or any(v not in PLACEMENTS for v in value):
                raise fspec.ScenarioError(name, f"must be a list of placements ({', '.join(PLACEMENTS)}), "
                                                f"got {short(value)}")
            return list(value)
        if rule.type == "list":
            if not isinstance(value, list) or not value:
                raise fspec.ScenarioError(name, f"must be a list of speeds, e.g. [200, 400], got {short(value)}")
            return [fspec._check_number(v, name, fspec.Rule("number", "", 0.0, fspec.MAX_QUANTITY, positive=True))
                    for v in value]
        return fspec._check_value(value, name, rule)
    except fspec.ScenarioError as exc:
        raise _rule_error(exc.field, exc.rule, source) from None


def rules_from_dict(data: Any, source: str | None = None) -> RulesConfig:
    """Validate a rules mapping (as read from YAML): each mistake one ScenarioError line."""
    if data is None:
        return RulesConfig(source=source)
    if not isinstance(data, Mapping):
        raise _rule_error("(top level)", "a rules file is a mapping of rule names "
                                         f"(known: {', '.join(RULES)})", source)
    disabled = set()
    enabled = set()
    limits: dict[str, dict] = {}
    for key, value in data.items():
        name = key if isinstance(key, str) else short(key)
        if key not in RULES:
            raise _rule_error(name, f"unknown rule (known: {', '.join(RULES)})", source)
        if isinstance(value, bool) or value is None:
            if value is False:
                disabled.add(key)
            elif value is True:
                enabled.add(key)
            continue
        enabled.add(key)
        if not isinstance(value, Mapping):
            raise _rule_error(name, f"must be true, false or a mapping of limits, got {short(value)}", source)
        section: dict[str, Any] = {}
        allowed = RULE_LIMITS[key]
        for lkey, lvalue in value.items():
            lname = f"{key}.{lkey if isinstance(lkey, str) else short(lkey)}"
            if lkey == "enabled":
                if not isinstance(lvalue, bool):
                    raise _rule_error(lname, f"must be true or false, got {short(lvalue)}", source)
                if not lvalue:
                    disabled.add(key)
                continue
            if allowed is None:
                if not isinstance(lkey, str) or (isinstance(lvalue, (Mapping, list)) and len(lvalue) > 64):
                    raise _rule_error(lname, "must be a name with a plain value", source)
                section[lkey] = lvalue
                continue
            if lkey not in allowed:
                known = ", ".join(["enabled", *allowed]) if allowed else "enabled (this rule has no limits)"
                raise _rule_error(lname, f"unknown limit (known: {known})", source)
            section[lkey] = _check_limit(lvalue, lname, allowed[lkey], source)
        limits[key] = section
    return RulesConfig(frozenset(disabled), limits, source, frozenset(enabled - disabled))


def load_rules(path: str | Path | None) -> RulesConfig:
    """Read and validate a rules file (YAML, bounded as scenario files are)."""
    if path is None:
        return RulesConfig()
    source = str(path)
    p = Path(path)
    if not p.is_file():
        raise _rule_error("rules", f"no such file: {short(source, 200)}", None)
    data = fspec._yaml_load(fspec.read_text(p, source), source)
    return rules_from_dict(data, source)


# ---- running ------------------------------------------------------------------------------

def context(scenario: Any, flags: Iterable[str] = (), graph: nx.MultiGraph | None = None) -> CheckContext:
    """A CheckContext from a preset name, a file, a Scenario or a built fabric graph."""

    if isinstance(scenario, nx.MultiGraph):
        graph, scenario = scenario, scenario.graph["scenario"]
    if not isinstance(scenario, fspec.Scenario):
        scenario = fspec.load(scenario)
    if graph is None:
        graph = fgraph.build(scenario)
    return CheckContext(scenario.name, scenario, graph, {}, frozenset(flags))


def selected(config: RulesConfig | None = None, only: Iterable[str] | None = None,
             skip: Iterable[str] = (), opt_in: Iterable[str] = ()) -> list[str]:
    """The rules that run, in RULES order: ``only`` (by default every rule but the ``OPT_IN`` ones
    that neither ``opt_in`` nor the rules file names) less ``skip`` and the ones the rules file
    turns off. An unknown name is a one-line UserError."""
    asked = set(opt_in) | (config.enabled if config else frozenset())
    wanted = [r for r in RULES if r not in OPT_IN or r in asked] if only is None else list(only)
    skip = list(skip)
    for name in [*wanted, *skip]:
        if name not in RULES:
            raise UserError(f"unknown rule {short(name)} (known: {', '.join(RULES)})")
    disabled = config.disabled if config else frozenset()
    return [name for name in RULES if name in wanted and name not in skip and name not in disabled]


def run_checks(target: Any, rules: RulesConfig | Mapping | None = None, flags: Iterable[str] = (),
               only: Iterable[str] | None = None, skip: Iterable[str] = (),
               timings: dict[str, float] | None = None) -> list[RuleResult]:
    """Run every enabled rule on ``target`` (a CheckContext, graph, Scenario, preset or file).

    ``rules``: a RulesConfig or a rules mapping; ``only``/``skip``: rule names (checked);
    ``timings``, when given, receives each rule's seconds."""
    ctx = target if isinstance(target, CheckContext) else context(target, flags)
    if flags:
        ctx = dataclasses.replace(ctx, flags=frozenset(flags), cache=ctx.cache)
    config = rules if isinstance(rules, RulesConfig) else rules_from_dict(rules)
    results: list[RuleResult] = []
    for name in selected(config, only, skip, opt_in=ctx.flags & OPT_IN):
        start = time.perf_counter()
        results.extend(RULES[name](ctx.for_rule(config.limits.get(name, {}))))
        if timings is not None:
            timings[name] = time.perf_counter() - start
    return results


def failed(results: Iterable[RuleResult]) -> list[RuleResult]:
    return [r for r in results if not r.ok]


# ---- reports: table, JSON, JUnit XML ------------------------------------------------------

def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_table(results: list[RuleResult], max_fail_rows: int = 20) -> str:
    """The results as a text table; at most ``max_fail_rows`` failing rows per rule are shown
    (the rest counted), passing rows all."""
    rows = [("RULE", "SUBJECT", "FIGURE", "LIMIT", "RESULT", "DETAIL")]
    shown: Counter[str] = Counter()
    hidden: Counter[str] = Counter()
    for r in results:
        if not r.ok:
            shown[r.rule] += 1
            if shown[r.rule] > max_fail_rows:
                hidden[r.rule] += 1
                continue
        verdict = "pass" if r.ok else "FAIL"
        if r.figure == NOT_AVAILABLE:
            verdict = "n/a"
        rows.append((r.rule, r.subject, _cell(r.figure), _cell(r.limit), verdict, r.detail))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(widths[i]) if i < 5 else cell for i, cell in enumerate(row)).rstrip()
             for row in rows]
    for rule, n in hidden.items():
        lines.append(f"... and {n:,} more {rule} failures (see --json)")
    return "\n".join(lines)


def summary(results: list[RuleResult]) -> dict[str, int]:
    bad = len(failed(results))
    na = sum(1 for r in results if r.figure == NOT_AVAILABLE)
    return {"rows": len(results), "passed": len(results) - bad - na, "failed": bad, "not_available": na,
            "rules": len({r.rule for r in results})}


def plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


def to_json(name: str, results: list[RuleResult]) -> dict[str, Any]:
    return {"scenario": name, "ok": not failed(results), **summary(results),
            "results": [{"rule": r.rule, "subject": r.subject, "figure": plain(r.figure),
                         "limit": plain(r.limit), "ok": r.ok, "detail": r.detail} for r in results]}


def to_junit(name: str, results: list[RuleResult], seconds: float = 0.0) -> str:
    """JUnit XML: one testsuite, one testcase per rule and subject, failures as <failure>."""
    s = summary(results)
    suites = ET.Element("testsuites", name="hpnlab check")
    suite = ET.SubElement(suites, "testsuite", name=f"hpnlab check {name}", tests=str(s["rows"]),
                          failures=str(s["failed"]), errors="0", skipped=str(s["not_available"]),
                          time=f"{seconds:.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=f"hpnlab.check.{r.rule}", name=r.subject)
        text = f"{r.rule} {r.subject}: figure {_cell(r.figure)}, limit {_cell(r.limit)}. {r.detail}".strip()
        if r.figure == NOT_AVAILABLE:
            ET.SubElement(case, "skipped", message=r.detail or NOT_AVAILABLE)
        elif not r.ok:
            failure = ET.SubElement(case, "failure", message=text, type="DesignRuleFailed")
            failure.text = text
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
