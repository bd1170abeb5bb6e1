"""Per-link loads of a flow-level model run over its steps, for the web view's replay (pure).

``hpnlab model`` reports a collective's time and busbw, not where its traffic went. This adds
the smallest export that the view needs: for each modelled step, the utilisation of every link
direction over the step: the bits the model routes over it, drained at its capacity, as a share
of the step's time (the model's step time is the busiest link's drain time, ``model.drain_times``,
so the busiest link shows 1.0); per aggregated group link when the fabric is drawn aggregated
(then: the group's bits over the group's capacity). It uses the
model's own routing (``model.route_step``) and steps (``model.steps``), so the loads are those the
model's times come from; a sprayed connection's share of a bundle is spread over the bundle's
links by capacity.

The document (:func:`model_loads`) is what ``hpnlab web model`` writes and ``hpnlab web replay``
replays: ``{"scenario", "model": the ModelResult fields, "loads": {"collective", "routing",
"busbw_gbs", "aggregated", "steps": [{"time_us", "multiplicity", "links": {link id: [ab, ba, peak ab,
peak ba]}}]}}``: utilisation of the (group) link each way, and of its busiest member link.
"""
from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from typing import Any

import networkx as nx
import numpy as np

from hpnlab.fabric import model
from hpnlab.fabric.collectives import canonical

from . import view


def _direction_groups(g: nx.MultiGraph, lay: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """For every directed link id of ``model.Network`` (2j: edge j's u->v, 2j+1: v->u, edges in
    ``g.edges`` order) its layout link index and direction (0: ab, 1: ba); the layout's link ids;
    each layout link's capacity (Gbit/s, one direction)."""
    ids = [lk["id"] for lk in lay["links"]]
    where = {lid: i for i, lid in enumerate(ids)}
    of = view.groups(g, lay.get("bins", view.DEFAULT_BINS)) if lay.get("aggregated") else None
    tier = {n: d["tier"] for n, d in g.nodes(data=True)}
    out_idx, out_dir = [], []
    for u, v, k, d in g.edges(keys=True, data=True):
        if of is None:
            lid = view.link_id(g, u, v, k)
            a = lid.split("-")[0]
        else:
            (ta, a), (_, b) = sorted(((tier[u], of[u]), (tier[v], of[v])))
            upper = v if of[v] == b and tier[v] >= ta else u
            plane = view._plane(d) if d["kind"] == "host" else view._plane(g.nodes[upper])
            lid = f"{a}-{b}/{plane}"
        i = where[lid]
        first_is_a = (u == a) if of is None else (of[u] == a)
        out_idx += [i, i]
        out_dir += [0 if first_is_a else 1, 1 if first_is_a else 0]
    cap = np.array([float(lk["rate_gbps"]) for lk in lay["links"]])
    return np.array(out_idx, dtype=int), np.array(out_dir, dtype=int), ids, cap


def step_bits(net: model.Network, routed: model.RoutedStep) -> np.ndarray:
    """Bits routed over every directed link of ``net`` in one step (what ``model.drain_times``
    drains); a bundle's (sprayed) bits are spread over its links by capacity."""
    load = np.bincount(routed.link_idx, weights=routed.weight * routed.size_bits[routed.flow_idx],
                       minlength=len(net.cap_all)) if len(routed.size_bits) else np.zeros(len(net.cap_all))
    out = load[:net.n_links].copy()
    if len(load) > net.n_links and net.bundle_of:
        members: dict[int, list[int]] = defaultdict(list)
        for link, bundle in net.bundle_of.items():
            members[bundle].append(link)
        for bundle, links in members.items():
            caps = net.cap[links]
            if load[bundle] > 0 and caps.sum() > 0:
                out[links] += load[bundle] * caps / caps.sum()
    return out


@view._no_gc
def model_loads(g: nx.MultiGraph, collective: str, size_bytes: int, *, routing: str = "ecmp",
                hosts: int | None = None, placement: str = "packed", qps: int = 4, seed: int = 1,
                failed: set | None = None, max_steps: int = 16, switch_latency_us: float = 1.0,
                lay: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the model (``model.run_collective``) and export its per-link loads per step (see the
    module docstring). ``lay``: the layout the loads are for (default ``view.layout(g)``)."""
    lay = lay or view.layout(g)
    net = model.Network(g, failed)
    result = model.run_collective(g, collective, size_bytes, routing=routing, hosts=hosts, placement=placement,
                                  qps=qps, seed=seed, max_steps=max_steps, switch_latency_us=switch_latency_us,
                                  network=net)
    idx, direction, ids, cap = _direction_groups(g, lay)
    job = model.make_job(g, hosts, placement, seed)
    rnd = random.Random(seed)
    s = g.graph["scenario"]
    steps = []
    for mult, pairs, nbytes in model.steps(canonical(collective), job, size_bytes, max_steps=max_steps,
                                           seed=seed, rails=s.rails):
        routed = model.route_step(net, job, pairs, nbytes, routing, qps, rnd, switch_latency_us)
        bits = step_bits(net, routed)
        per = np.zeros((len(ids), 2))
        np.add.at(per, (idx, direction), bits)
        # the model's step time: the busiest link's drain time; a link's utilisation is its share of it
        drain = np.divide(bits, net.cap * 1e9, out=np.zeros_like(bits), where=net.cap > 0)
        makespan = float(drain.max()) if len(drain) else 0.0
        util = (np.divide(per, cap[:, None] * 1e9 * makespan, out=np.zeros_like(per), where=cap[:, None] > 0)
                if makespan > 0 else np.zeros_like(per))
        # the busiest single link of each group link and direction (ECMP collisions hide in a group's mean)
        link_util = np.divide(drain, makespan, out=np.zeros_like(drain), where=np.full_like(drain, makespan > 0,
                                                                                            dtype=bool))
        peak = np.zeros((len(ids), 2))
        np.maximum.at(peak, (idx, direction), link_util)
        stalled = routed.stalled > 0
        steps.append({"multiplicity": mult,
                      "time_us": None if stalled else (makespan * 1e6 + routed.latency_us),
                      "stalled": routed.stalled,
                      "links": {ids[i]: [round(float(util[i, 0]), 4), round(float(util[i, 1]), 4),
                                         round(float(peak[i, 0]), 4), round(float(peak[i, 1]), 4)]
                                for i in np.flatnonzero(per.sum(axis=1) > 0)}})
    res = dataclasses.asdict(result)
    res["stalled_pairs"] = len(res["stalled_pairs"])
    return {"scenario": g.graph.get("name") or s.name, "model": res,
            "loads": {"collective": result.collective, "routing": routing, "busbw_gbs": result.busbw_gbs,
                      "aggregated": bool(lay.get("aggregated")), "steps": steps}}
