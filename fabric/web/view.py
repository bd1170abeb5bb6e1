"""The fabric as a picture, pure: layout, frames and SVG as plain values (JSON-ready).

**Layout** (:func:`layout`): one panel per plane, side by side; in each panel a row per tier,
hosts at the bottom, then leaves, spines and cores (long-haul links, between cores of two
campuses, are marked ``long_haul``). A host has a port in every plane, so it is drawn once per
panel (element ``h1@0``, ``h1@1``; node ``id`` ``h1``). Every switch and link has a stable id:
a switch its name, a link ``"<a>-<b>/<key>"`` with ``a`` the end of the lower tier (then the
smaller name) and ``key`` the graph's parallel-link key. A host link carries its ``rail``; a leaf
its rails. Fabrics with more than ``MAX_LINKS`` links are drawn **aggregated**
(:func:`aggregated_layout`): per plane, pod and tier the nodes are binned into at most ``bins``
groups (id ``p0/pod1/leaf/3``) and the links between two groups become one group link whose
rate is their sum.

**Frames** (:func:`frame`): the state of every link at one moment: per direction (``ab``: from
``a`` to ``b``; ``ba``) the utilisation, Mbit/s, CE marks/s and fraction, drops and queue
estimate, and its colour; the link's state (``up``, ``down``, ``gray``: a gray failure drops what
one side sends); failed switches; the collective's progress and the controller's state. The
inputs are what the controller's telemetry file holds (``telemetry.sample_line`` rows: one per
switch egress port, ``switch``, ``port``, ``tx_mbps``, ``rx_mbps``, ``utilisation``, …) and the
failure events as the harness timeline records them (``action``, ``target``, ``key``, ``side``),
folded by :func:`fold_events`. The same function makes a live frame and a replayed one, so a
replay draws the same picture at the same moment.

**SVG** (:func:`svg`): the layout drawn, optionally coloured by a frame; the page inlines it
and recolours its elements (``id`` ``L:<link>:ab``/``:ba``, ``N:<element>``) with each frame,
and a still of any moment is this function's output.
"""
from __future__ import annotations

import gc
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any, ParamSpec, TypeVar

import networkx as nx

from hpnlab.fabric.scenario.rates import emulated_mbps

P = ParamSpec("P")
R = TypeVar("R")
#: above this many links the layout is aggregated by plane, pod and tier
MAX_LINKS = 4000
#: groups per (plane, pod, tier) in an aggregated layout
DEFAULT_BINS = 16
TIER_NAMES = {0: "host", 1: "leaf", 2: "spine", 3: "core"}
#: drawing units
NODE_GAP = 34.0
ROW_GAP = 110.0
PANEL_PAD = 40.0
PANEL_GAP = 30.0
#: colours: failed (red), idle (grey), and the utilisation scale (light to dark blue, then orange)
FAILED = "#d62728"
IDLE = "#c7c7c7"
#: a link direction whose transmitter priority flow control holds paused (its downstream ingress asked)
PAUSED = "#9467bd"
SCALE = ((0.0, (198, 219, 239)), (0.5, (66, 146, 198)), (0.8, (8, 48, 107)), (1.0, (253, 141, 60)))
#: a rail's hue (host links and leaves); rails beyond the list repeat it
RAIL_COLOURS = ("#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666", "#17becf")
#: the fault actions a link or switch can get, and what repairs each (the timeline's names)
LINK_ACTIONS = ("link_down", "link_down_one_side", "link_drop", "link_up", "link_restore")
SWITCH_ACTIONS = ("switch_down", "switch_up")


def link_id(g: nx.MultiGraph, u: str, v: str, key: int) -> str:
    """The stable id of one link: ``a-b/key``, ``a`` the end of the lower tier (then the smaller name)."""
    a, b = sorted((u, v), key=lambda n: (g.nodes[n]["tier"], n))
    return f"{a}-{b}/{key}"


def _plane(d: Mapping[str, Any]) -> int:
    p = d.get("plane")
    return int(p) if p is not None else 0


def _order(d: Mapping[str, Any], name: str) -> tuple:
    return (d.get("campus") or 0, d.get("pod") if d.get("pod") is not None else -1, d.get("segment") or 0,
            d.get("index") or 0, name)


def _arrange(rows: dict[int, list[tuple[str, dict]]], panel: int, x0: float) -> tuple[list[dict], float]:
    """Place each tier's row centred in a panel starting at x0; returns (nodes, panel width)."""
    width = max((len(r) for r in rows.values()), default=1) * NODE_GAP + 2 * PANEL_PAD
    top = max(rows, default=0)
    out = []
    for tier, row in rows.items():
        span = (len(row) - 1) * NODE_GAP
        left = x0 + (width - span) / 2
        y = PANEL_PAD + 30 + (top - tier) * ROW_GAP
        for i, (el, d) in enumerate(row):
            out.append({**d, "el": el, "panel": panel, "x": round(left + i * NODE_GAP, 2), "y": round(y, 2)})
    return out, width


def _panels(node_rows: dict[int, dict[int, list[tuple[str, dict]]]]) -> tuple[list[dict], list[dict], float, float]:
    panels, nodes = [], []
    x = PANEL_GAP
    height = 0.0
    for plane in sorted(node_rows):
        rows = node_rows[plane]
        placed, width = _arrange(rows, plane, x)
        h = (max(rows, default=0) + 1) * ROW_GAP + 2 * PANEL_PAD
        panels.append({"id": f"plane{plane}", "plane": plane, "title": f"plane {plane}", "x": round(x, 2),
                       "y": PANEL_GAP, "w": round(width, 2), "h": round(h, 2)})
        for n in placed:
            n["y"] = round(n["y"] + PANEL_GAP, 2)
        nodes += placed
        x += width + PANEL_GAP
        height = max(height, h)
    return panels, nodes, round(x, 2), round(height + 2 * PANEL_GAP, 2)


def layout(g: nx.MultiGraph, max_links: int = MAX_LINKS, bins: int = DEFAULT_BINS) -> dict[str, Any]:
    """The drawing of a fabric: link by link, or aggregated above ``max_links`` links."""
    if g.number_of_edges() > max_links:
        return aggregated_layout(g, bins)
    return detailed_layout(g)


def _no_gc(fn: Callable[P, R]) -> Callable[P, R]:
    """Run without the cyclic garbage collector: at 130k scale the graph holds millions of dicts, which
    every collection would rescan (as ``graph.build`` does; nothing here makes cycles)."""
    import functools

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()
    return run


def _emulated_mbps(g: nx.MultiGraph, rate_gbps: float) -> float | None:
    s = g.graph.get("scenario")
    if s is None or getattr(s, "emulation", None) is None:
        return None
    return emulated_mbps(s, rate_gbps)


def detailed_layout(g: nx.MultiGraph) -> dict[str, Any]:
    """Every host, switch and link of the fabric (see the module docstring)."""
    node_rows: dict[int, dict[int, list[tuple[str, dict]]]] = defaultdict(lambda: defaultdict(list))
    planes = sorted({_plane(d) for _, d in g.nodes(data=True) if d["tier"] > 0}) or [0]
    for name, d in sorted(g.nodes(data=True), key=lambda nd: _order(nd[1], nd[0])):
        base = {"id": name, "role": d["role"], "tier": d["tier"], "pod": d.get("pod"), "campus": d.get("campus")}
        if d["tier"] == 0:
            for p in planes:
                node_rows[p][0].append((f"{name}@{p}", {**base, "plane": p}))
        else:
            extra = {"rails": list(d["rails"])} if d.get("rails") is not None else {}
            node_rows[_plane(d)][d["tier"]].append((name, {**base, "plane": _plane(d), **extra}))
    panels, nodes, width, height = _panels(node_rows)
    links = []
    for u, v, k, d in g.edges(keys=True, data=True):
        lid = link_id(g, u, v, k)
        a, b = lid.split("/")[0].split("-")
        plane = _plane(d) if d["kind"] == "host" else _plane(g.nodes[b])
        ends = {n: (f"{n}@{plane}" if g.nodes[n]["tier"] == 0 else n) for n in (a, b)}
        links.append({"id": lid, "a": a, "b": b, "key": k, "ea": ends[a], "eb": ends[b], "kind": d["kind"],
                      "plane": plane, "rail": d.get("rail"), "long_haul": d["kind"] == "long-haul",
                      "rate_gbps": d["rate_gbps"], "rate_mbps": _emulated_mbps(g, d["rate_gbps"]),
                      "ports": {n: int(p) for n, p in d["ports"].items()}})
    return {"scenario": g.graph.get("name") or "", "aggregated": False, "width": width, "height": height,
            "panels": panels, "nodes": nodes, "links": links,
            "counts": {"switches": sum(1 for _, d in g.nodes(data=True) if d["tier"] > 0),
                       "hosts": sum(1 for _, d in g.nodes(data=True) if d["tier"] == 0),
                       "links": g.number_of_edges()}}


def group_of(d: Mapping[str, Any], name: str, index_in_tier: int, count_in_tier: int, bins: int) -> str:
    """The aggregated group of a node: plane, pod (or campus for cores), tier and bin."""
    b = index_in_tier * min(bins, count_in_tier) // max(count_in_tier, 1)
    where = f"pod{d['pod']}" if d.get("pod") is not None else f"campus{d.get('campus') or 0}"
    return f"p{_plane(d)}/{where}/{TIER_NAMES[d['tier']]}/{b}"


@_no_gc
def groups(g: nx.MultiGraph, bins: int = DEFAULT_BINS) -> dict[str, str]:
    """Node name -> its aggregated group id (hosts: one entry per host, in plane 0's groups)."""
    by: dict[tuple, list[tuple[str, dict]]] = defaultdict(list)
    for name, d in g.nodes(data=True):
        where = d.get("pod") if d.get("pod") is not None else ("c", d.get("campus") or 0)
        by[_plane(d), where, d["tier"]].append((name, d))
    out: dict[str, str] = {}
    for members in by.values():
        members.sort(key=lambda nd: _order(nd[1], nd[0]))
        for i, (name, d) in enumerate(members):
            out[name] = group_of(d, name, i, len(members), bins)
    return out


@_no_gc
def aggregated_layout(g: nx.MultiGraph, bins: int = DEFAULT_BINS) -> dict[str, Any]:
    """The fabric by plane, pod and tier: nodes are groups of switches (or hosts), links are the sum
    of the links between two groups (``members``: how many; ``rate_gbps``: their total)."""
    of = groups(g, bins)
    planes = sorted({_plane(d) for _, d in g.nodes(data=True) if d["tier"] > 0}) or [0]
    info: dict[str, dict[str, Any]] = {}
    for name, gid in of.items():
        d = g.nodes[name]
        e = info.setdefault(gid, {"id": gid, "role": d["role"], "tier": d["tier"], "pod": d.get("pod"),
                                  "campus": d.get("campus"), "plane": _plane(d), "size": 0, "first": name})
        e["size"] += 1
    node_rows: dict[int, dict[int, list[tuple[str, dict]]]] = defaultdict(lambda: defaultdict(list))
    for gid, e in sorted(info.items(), key=lambda kv: (kv[1]["campus"] or 0, kv[1]["pod"] or 0,
                                                        int(kv[0].rsplit("/", 1)[1]))):
        if e["tier"] == 0:
            for p in planes:
                node_rows[p][0].append((f"{gid}@{p}", {**e, "plane": p}))
        else:
            node_rows[e["plane"]][e["tier"]].append((gid, e))
    panels, nodes, width, height = _panels(node_rows)
    acc: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    for u, v, d in g.edges(data=True):        # a million links at 130k: keep this loop lean
        tally = acc[of[u], of[v], d["kind"], d.get("plane")]
        tally[0] += 1
        tally[1] += d["rate_gbps"]
    agg: dict[tuple[str, str, int], dict[str, Any]] = {}
    for (gu, gv, kind, host_plane), (members, rate) in acc.items():
        a, b = sorted((gu, gv), key=lambda x: (info[x]["tier"], x))
        plane = int(host_plane) if kind == "host" and host_plane is not None else info[b]["plane"]
        link = agg.get((a, b, plane))
        if link is None:
            ea = f"{a}@{plane}" if info[a]["tier"] == 0 else a
            eb = f"{b}@{plane}" if info[b]["tier"] == 0 else b
            link = agg[a, b, plane] = {"id": f"{a}-{b}/{plane}", "a": a, "b": b, "key": plane, "ea": ea, "eb": eb,
                                    "kind": kind, "plane": plane, "rail": None,
                                    "long_haul": kind == "long-haul", "rate_gbps": 0.0, "members": 0}
        link["rate_gbps"] += rate
        link["members"] += members
    return {"scenario": g.graph.get("name") or "", "aggregated": True, "bins": bins, "width": width,
            "height": height, "panels": panels, "nodes": nodes, "links": list(agg.values()),
            "counts": {"switches": sum(1 for _, d in g.nodes(data=True) if d["tier"] > 0),
                       "hosts": sum(1 for _, d in g.nodes(data=True) if d["tier"] == 0),
                       "links": g.number_of_edges()}}


# ---- indexes over a layout ----------------------------------------------------------------

@dataclass
class Index:
    """Lookups over a (detailed) layout: a switch port's link and direction; the links of a pair."""
    links: dict[str, dict[str, Any]]
    port: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)     # (switch, port) -> (link, dir)
    pair: dict[frozenset, list[str]] = field(default_factory=dict)                 # {u, v} -> link ids
    of_node: dict[str, list[str]] = field(default_factory=dict)                    # node -> link ids
    switches: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, lay: Mapping[str, Any]) -> Index:
        ix = cls({lk["id"]: lk for lk in lay["links"]})
        tiers = {n["id"]: n["tier"] for n in lay["nodes"]}
        ix.switches = {n for n, t in tiers.items() if t > 0}
        for lk in lay["links"]:
            for end, direction in ((lk["a"], "ab"), (lk["b"], "ba")):
                if "ports" in lk and tiers.get(end, 0) > 0:
                    ix.port[end, int(lk["ports"][end])] = (lk["id"], direction)
                ix.of_node.setdefault(end, []).append(lk["id"])
            ix.pair.setdefault(frozenset((lk["a"], lk["b"])), []).append(lk["id"])
        return ix


# ---- failures: the timeline's records folded into a state -----------------------------------

@dataclass
class Failures:
    """What is failed: interfaces down (link, node), gray ends (link, sending node), switches down."""
    down: set[tuple[str, str]] = field(default_factory=set)
    gray: set[tuple[str, str]] = field(default_factory=set)
    switches: set[str] = field(default_factory=set)

    def link_state(self, lk: Mapping[str, Any]) -> str:
        ends = (lk["a"], lk["b"])
        if any((lk["id"], n) in self.down for n in ends) or any(n in self.switches for n in ends):
            return "down"
        if any((lk["id"], n) in self.gray for n in ends):
            return "gray"
        return "up"

    def gray_side(self, lk: Mapping[str, Any]) -> str | None:
        return next((n for n in (lk["a"], lk["b"]) if (lk["id"], n) in self.gray), None)


def _targets(ix: Index, rec: Mapping[str, Any]) -> list[str]:
    u, v = rec["target"][:2]
    ids = ix.pair.get(frozenset((u, v)), [])
    key = rec.get("key")
    return [i for i in ids if key is None or ix.links[i]["key"] == key]


def fold_events(ix: Index, records: Iterable[Mapping[str, Any]], state: Failures | None = None) -> Failures:
    """Apply failure records (the timeline's: ``action``, ``target``, ``key``, ``side``) in order."""
    st = state or Failures()
    for rec in records:
        action = rec["action"]
        if action in SWITCH_ACTIONS:
            (st.switches.add if action == "switch_down" else st.switches.discard)(rec["target"][0])
            continue
        side = rec.get("side")
        for lid in _targets(ix, rec):
            lk = ix.links[lid]
            ends = [side] if side else [lk["a"], lk["b"]]
            for n in ends:
                if action in ("link_down", "link_down_one_side"):
                    st.down.add((lid, n))
                elif action == "link_up":
                    st.down.discard((lid, n))
                elif action == "link_drop":
                    st.gray.add((lid, side or lk["a"]))
                elif action == "link_restore":
                    st.gray.discard((lid, side or lk["a"]))
    return st


def repair_events(ix: Index, st: Failures, target: Sequence[str], key: int | None = None) -> list[dict[str, Any]]:
    """The timeline events that repair a link (or a switch) in the state ``st``: ``link_up`` for
    what is down, ``link_restore`` per gray side, ``switch_up``; empty if nothing is failed."""
    if len(target) == 1:
        return [{"action": "switch_up", "switch": target[0]}] if target[0] in st.switches else []
    out: list[dict[str, Any]] = []
    for lid in _targets(ix, {"target": target, "key": key}):
        lk = ix.links[lid]
        k = lk["key"]
        if any((lid, n) in st.down for n in (lk["a"], lk["b"])):
            out.append({"action": "link_up", "link": [lk["a"], lk["b"]], "key": k})
        for n in (lk["a"], lk["b"]):
            if (lid, n) in st.gray:
                out.append({"action": "link_restore", "link": [lk["a"], lk["b"]], "key": k, "side": n})
    return out


# ---- frames ---------------------------------------------------------------------------------

def util_colour(util: float | None, state: str = "up") -> str:
    """A link direction's colour: red when failed, grey when idle, else the utilisation scale."""
    if state == "down":
        return FAILED
    if util is None or util <= 0.005:
        return IDLE
    u = min(max(util, 0.0), 1.0)
    for (x0, c0), (x1, c1) in itertools.pairwise(SCALE):
        if u <= x1:
            f = (u - x0) / (x1 - x0) if x1 > x0 else 1.0
            return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(c0, c1, strict=True))
    return "#" + "".join(f"{c:02x}" for c in SCALE[-1][1])


def _dir_values(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"util": round(float(row.get("utilisation") or 0.0), 4), "mbps": round(float(row.get("tx_mbps") or 0.0), 3),
            "ce_pps": round(float(row.get("ce_marked_pps") or 0.0), 2),
            "ce_fraction": round(float(row.get("ce_fraction") or 0.0), 4), "drops": int(row.get("drops") or 0),
            "queue_bytes": row.get("queue_bytes")}


def link_loads(ix: Index, rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per link and direction the values of telemetry rows (one per switch egress port). A direction
    no switch sends in (a host's uplink) takes the receiving port's ``rx_mbps``."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    rx: dict[tuple[str, str], float] = {}
    for row in rows:
        hit = ix.port.get((row["switch"], int(row["port"])))
        if hit is None:
            continue
        lid, direction = hit
        out.setdefault(lid, {})[direction] = _dir_values(row)
        if row.get("rx_mbps"):
            rx[lid, "ba" if direction == "ab" else "ab"] = float(row["rx_mbps"])
    for (lid, direction), mbps in rx.items():
        if direction in out.get(lid, {}):
            continue
        rate = ix.links[lid].get("rate_mbps")
        out.setdefault(lid, {})[direction] = {"util": round(mbps / rate, 4) if rate else 0.0, "mbps": round(mbps, 3),
                                              "ce_pps": 0.0, "ce_fraction": 0.0, "drops": 0, "queue_bytes": None}
    return out


def paused_directions(ix: Index, paused: Iterable[tuple[str, int]]) -> set[tuple[str, str]]:
    """(link, direction) of every transmitter held paused, from the switch ingress ports that pause them
    ((switch, port): priority flow control's ``PfcStage.paused``): the direction towards that port."""
    out = set()
    for sw, port in paused:
        hit = ix.port.get((sw, int(port)))
        if hit is not None:
            lid, direction = hit
            out.add((lid, "ba" if direction == "ab" else "ab"))
    return out


def frame(lay: Mapping[str, Any], t: float, loads: Mapping[str, Mapping[str, Mapping[str, Any]]],
          failures: Failures | None = None, *, collective: Mapping[str, Any] | None = None,
          controller: Mapping[str, Any] | None = None, events: Sequence[Mapping[str, Any]] = (),
          ix: Index | None = None, paused: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
    """The state of the fabric at ``t`` (seconds from the start): every link that is loaded, failed or
    paused (a link absent is up, idle and not paused), failed switches, and what goes beside the picture.
    ``paused``: (link, direction) held paused by priority flow control (:func:`paused_directions`), drawn
    ``PAUSED`` and marked ``paused``."""
    st = failures or Failures()
    ix = ix or Index.of(lay)
    held = set(paused)
    held_links = {lid for lid, _ in held}
    links: dict[str, Any] = {}
    for lid, lk in ix.links.items():
        state = st.link_state(lk)
        dirs = loads.get(lid, {})
        if state == "up" and not dirs and lid not in held_links:
            continue
        entry: dict[str, Any] = {"state": state}
        gray = st.gray_side(lk) if state == "gray" else None
        for direction in ("ab", "ba"):
            vals = dict(dirs.get(direction) or {})
            sender = lk["a"] if direction == "ab" else lk["b"]
            dstate = "down" if state == "down" or gray == sender else "up"
            vals["colour"] = util_colour(vals.get("util"), dstate)
            if (lid, direction) in held and dstate == "up":
                vals["paused"] = True
                vals["colour"] = PAUSED
            entry[direction] = vals
        if gray:
            entry["gray_side"] = gray
        links[lid] = entry
    return {"t": round(float(t), 9), "links": links, "switches_down": sorted(st.switches),
            "collective": dict(collective or {}), "controller": dict(controller or {}), "events": list(events)}


def link_colours(fr: Mapping[str, Any], lay: Mapping[str, Any]) -> dict[str, str]:
    """Element id -> colour of every link half in a frame: the picture, as the page draws it."""
    out = {}
    for lk in lay["links"]:
        entry = fr["links"].get(lk["id"])
        for direction in ("ab", "ba"):
            out[f"L:{lk['id']}:{direction}"] = entry[direction]["colour"] if entry else IDLE
    return out


# ---- the controller's state from its Prometheus metrics -------------------------------------

def controller_state(metrics_text: str) -> dict[str, Any]:
    """The controller's state from its Prometheus metrics page (``controller/metrics.py``):
    connected switches, recompiles, failed links and switches, last convergence."""
    from prometheus_client.parser import text_string_to_metric_families
    want = {"hpnlab_switches_expected": "switches_expected", "hpnlab_switches_connected": "switches_connected",
            "hpnlab_recompiles_total": "recompiles", "hpnlab_failed_links": "failed_links",
            "hpnlab_failed_switches": "failed_switches", "hpnlab_last_convergence_seconds": "convergence_s",
            "hpnlab_ecn_threshold_changes_total": "ecn_changes", "hpnlab_resyncs_total": "resyncs"}
    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.name in want:
                out[want[s.name]] = int(s.value) if float(s.value).is_integer() else round(s.value, 6)
    return out


# ---- replay ---------------------------------------------------------------------------------

def _wall_start(doc: Mapping[str, Any]) -> float | None:
    meta = doc.get("meta") or {}
    if "time" in meta and "wall_s" in meta:
        return float(meta["time"]) - float(meta["wall_s"])
    return None


def timeline_records(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every failure record of a results file with its time ``t`` in seconds from the run's start:
    an `hpnlab run` document (each result's ``timeline``, by wall clock from ``meta``), an
    `hpnlab emulate --json` document (``timeline``, by ``applied_s``), and the web view's own
    injections (``web_events``)."""
    t0 = _wall_start(doc)
    seen: dict[tuple, dict[str, Any]] = {}
    recs = [r for res in doc.get("results") or () for r in res.get("timeline") or ()]
    recs += list(doc.get("timeline") or ()) + list(doc.get("web_events") or ())
    for r in recs:
        if t0 is not None and r.get("wall") is not None:
            t = float(r["wall"]) - t0
        else:
            t = float(r.get("t", r.get("applied_s", r.get("at", 0.0))))
        key = (round(float(r.get("wall") or t), 6), r["action"], tuple(r["target"]), r.get("key"), r.get("side"))
        seen[key] = {**r, "t": round(t, 4)}
    return sorted(seen.values(), key=lambda r: r["t"])


def telemetry_rows(doc: Mapping[str, Any]) -> list[tuple[float, list[dict[str, Any]]]]:
    """The run's ``telemetry`` key (``telemetry.summarise``: per port its series) back into
    (t, rows) samples, t in seconds from the run's start, rows as the telemetry file has them."""
    tel = doc.get("telemetry") or {}
    by_t: dict[float, list[dict[str, Any]]] = defaultdict(list)
    fields = ("tx_mbps", "utilisation", "rx_mbps", "queue_bytes", "ce_marked_pps", "ce_fraction", "drops")
    for key, series in (tel.get("ports") or {}).items():
        switch, port = key.rsplit(":", 1)
        for i, t in enumerate(series.get("t") or ()):
            row = {"switch": switch, "port": int(port), "peer": series.get("peer", "")}
            for f in fields:
                vals = series.get(f) or []
                row[f] = vals[i] if i < len(vals) else None
            by_t[float(t)].append(row)
    return sorted(by_t.items())


def replay_frames(lay: Mapping[str, Any], doc: Mapping[str, Any], step_s: float = 0.5) -> list[dict[str, Any]]:
    """Frames of a finished run, every ``step_s`` seconds from its start to its end: at each moment
    the latest telemetry sample and every failure record applied by then (what the live view showed).
    A model run's document (``loads``: see ``hpnlab.fabric.web.loads``) is replayed step by step."""
    if "loads" in doc:
        return model_frames(lay, doc)
    ix = Index.of(lay)
    samples = telemetry_rows(doc)
    records = timeline_records(doc)
    meta = doc.get("meta") or {}
    end = max([float(meta.get("wall_s") or 0.0)] + [t for t, _ in samples] + [r["t"] for r in records])
    frames = []
    n = math.floor(end / step_s) + 1
    si = ri = 0
    current: list[dict[str, Any]] = []
    st = Failures()
    done: list[Mapping[str, Any]] = []
    for i in range(n + 1):
        t = round(i * step_s, 6)
        while si < len(samples) and samples[si][0] <= t:
            current = samples[si][1]
            si += 1
        while ri < len(records) and records[ri]["t"] <= t:
            fold_events(ix, [records[ri]], st)
            done.append(records[ri])
            ri += 1
        frames.append(frame(lay, t, link_loads(ix, current), st, ix=ix,
                            events=[_event_line(r) for r in done[-8:]]))
    return frames


def _event_line(r: Mapping[str, Any]) -> dict[str, Any]:
    what = "-".join(r["target"]) + (f"#{r['key']}" if r.get("key") is not None else "")
    side = f" (side {r['side']})" if r.get("side") else ""
    return {"t": r.get("t"), "text": f"{r['action']} {what}{side}", "source": r.get("source", "timeline")}


def model_frames(lay: Mapping[str, Any], doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Frames of a model run: one per modelled step, at the step's start, each link (or group
    link) coloured by the step's utilisation (``loads.steps[i].links``: link id -> [ab, ba, peak ab, peak ba]; the
    peak, its busiest member link's, shows on hover)."""
    loads = doc["loads"]
    frames = []
    t = 0.0
    for i, step in enumerate(loads["steps"]):
        per = {lid: {"ab": {"util": u[0], "mbps": None, "peak": u[2] if len(u) > 2 else u[0]},
                     "ba": {"util": u[1], "mbps": None, "peak": u[3] if len(u) > 3 else u[1]}}
               for lid, u in step["links"].items()}
        collective = {"collective": loads.get("collective"), "routing": loads.get("routing"),
                      "step": i + 1, "steps": len(loads["steps"]), "busbw_gbs": loads.get("busbw_gbs"),
                      "step_time_us": step.get("time_us")}
        frames.append(frame(lay, t, per, collective=collective))
        t += float(step.get("time_us") or 0.0) * 1e-6
    return frames


def frame_at(frames: Sequence[Mapping[str, Any]], t: float) -> Mapping[str, Any]:
    """The frame shown at time ``t``: the last one at or before it (the first if t is earlier)."""
    best = frames[0]
    for fr in frames:
        if fr["t"] <= t + 1e-9:
            best = fr
        else:
            break
    return best


# ---- SVG --------------------------------------------------------------------------------------

def _rail_colour(rail: int | None) -> str | None:
    return None if rail is None else RAIL_COLOURS[rail % len(RAIL_COLOURS)]


def svg(lay: Mapping[str, Any], fr: Mapping[str, Any] | None = None) -> str:
    """The picture: panels, link halves (``L:<id>:ab`` from ``a`` to the middle, ``:ba`` from ``b``),
    nodes (``N:<element>``), rails as coloured ticks on host links and leaves. With a frame, its colours."""
    pos = {n["el"]: (n["x"], n["y"]) for n in lay["nodes"]}
    colours = link_colours(fr, lay) if fr is not None else {}
    failed = set(fr["switches_down"]) if fr is not None else set()
    states = {lid: e.get("state") for lid, e in (fr["links"].items() if fr is not None else ())}
    w, h = lay["width"], lay["height"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="10">',
           '<style>.lk{stroke-width:2.5;fill:none}.lk.gray{stroke-dasharray:4 3}.lh{stroke-width:4}'
           '.nd{stroke:#333;stroke-width:1}.nd.down{fill:#d62728}.nd.host{fill:#fff}.nd.leaf{fill:#dde}'
           '.nd.spine{fill:#ccd}.nd.core{fill:#bbc}.nd.group{fill:#eef}</style>',
           f'<rect width="{w}" height="{h}" fill="#fff"/>']
    for p in lay["panels"]:
        out.append(f'<g id="P:{escape(p["id"])}"><rect x="{p["x"]}" y="{p["y"]}" width="{p["w"]}" height="{p["h"]}" '
                   f'fill="#fafafa" stroke="#ddd"/><text x="{p["x"] + 8}" y="{p["y"] + 16}" font-size="13" '
                   f'font-weight="bold">{escape(p["title"])}</text></g>')
    for lk in lay["links"]:
        (x1, y1), (x2, y2) = pos[lk["ea"]], pos[lk["eb"]]
        mx, my = round((x1 + x2) / 2, 2), round((y1 + y2) / 2, 2)
        cls = "lk" + (" lh" if lk.get("long_haul") else "") + (" gray" if states.get(lk["id"]) == "gray" else "")
        for direction, (sx, sy) in (("ab", (x1, y1)), ("ba", (x2, y2))):
            eid = f"L:{lk['id']}:{direction}"
            out.append(f'<line id="{escape(eid)}" class="{cls}" data-link="{escape(lk["id"])}" x1="{sx}" y1="{sy}" '
                       f'x2="{mx}" y2="{my}" stroke="{colours.get(eid, IDLE)}"/>')
        rc = _rail_colour(lk.get("rail"))
        if rc:
            out.append(f'<circle cx="{round(x1 + (x2 - x1) * 0.15, 2)}" cy="{round(y1 + (y2 - y1) * 0.15, 2)}" '
                       f'r="2.5" fill="{rc}"/>')
    for n in lay["nodes"]:
        x, y = n["x"], n["y"]
        role = "group" if lay.get("aggregated") and n["tier"] > 0 else n["role"]
        cls = f"nd {role}" + (" down" if n["id"] in failed else "")
        label = n["id"].split("/")[-2] + "/" + n["id"].split("/")[-1] if lay.get("aggregated") else n["id"]
        title = f'{n["id"]}' + (f' ({n["size"]} {n["role"]}s)' if "size" in n else "")
        if n["tier"] == 0:
            shape = f'<rect class="{cls}" x="{x - 6}" y="{y - 6}" width="12" height="12"/>'
        else:
            shape = f'<circle class="{cls}" cx="{x}" cy="{y}" r="9"/>'
        rails = "".join(f'<circle cx="{x - 6 + 6 * i}" cy="{y + 12}" r="2" fill="{_rail_colour(r)}"/>'
                        for i, r in enumerate(n.get("rails") or ()))
        out.append(f'<g id="N:{escape(n["el"])}" data-node="{escape(n["id"])}"><title>{escape(title)}</title>'
                   f'{shape}{rails}<text x="{x}" y="{y - 12 if n["tier"] else y + 20}" text-anchor="middle">'
                   f'{escape(label if n["tier"] else n["id"].split("/")[0])}</text></g>')
    out.append("</svg>")
    return "\n".join(out)
