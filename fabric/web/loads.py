"""Per-link loads of a flow-level model run over its steps, for the web view's replay (pure).

``hpnlab model`` reports a collective's time and busbw, not where its traffic went. This adds
the smallest export that the view needs: for each distinct modelled step, the utilisation of
every link direction over the step: the bits the model routes over it, over the link's
capacity times the model's time of that step (``StepResult.time_s``: the drain time of the
busiest link plus the step's latency, so the busiest link shows ``1 - latency / time``); per
aggregated group link when the fabric is drawn aggregated (then: the group's bits over the
group's capacity, and its busiest member link beside it).

The loads are the model's own: the same job (``model.make_job``), the same steps
(``model.steps``), the same routing of each step (``model.route_step``, with the seed and
salt ``model.run_collective`` uses), on the same network, so they are the loads the model's
times come from. Per entropy policy (``routing``): ``flow``/``flowlet``, a connection's bytes
on its one path; ``spray``, a pair's bytes split evenly over its live paths; ``adaptive``,
each path (sub-flow) carries its max-min share of the pair's bytes (``model.max_min_rates``,
as ``model.run_step`` times it). A sampled all-to-all step's bits are scaled as the model
scales them (``Step.scale``).

The document (:func:`model_loads`) is what ``hpnlab web model`` writes and ``hpnlab web replay``
replays: ``{"scenario", "model": ModelResult.as_dict(), "loads": {"collective", "routing",
"busbw_gbs", "aggregated", "steps": [{"time_us", "latency_us", "multiplicity", "sampled",
"stalled", "links": {link id: [ab, ba, peak ab, peak ba]}}]}}``: utilisation of the (group)
link each way, and of its busiest member link. A step with a stalled connection has
``time_us`` None and its loads over the drain time of what was routed.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import networkx as nx
import numpy as np

from hpnlab.fabric.model import flow as model

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
    memo: dict[tuple, tuple[int, bool]] = {}     # aggregated: (group u, group v, host link's plane) -> its answer
    for u, v, k, d in g.edges(keys=True, data=True):
        if of is None:
            lid = view.link_id(g, u, v, k)
            a = lid.split("-")[0]
            i, first_is_a = where[lid], u == a
        else:
            key = (of[u], of[v], view._plane(d) if d["kind"] == "host" else None)
            got = memo.get(key)
            if got is None:
                (ta, a), (_, b) = sorted(((tier[u], of[u]), (tier[v], of[v])))
                upper = v if of[v] == b and tier[v] >= ta else u
                plane = key[2] if key[2] is not None else view._plane(g.nodes[upper])
                got = memo[key] = (where[f"{a}-{b}/{plane}"], of[u] == a)
            i, first_is_a = got
        out_idx += [i, i]
        out_dir += [0 if first_is_a else 1, 1 if first_is_a else 0]
    cap = np.array([float(lk["rate_gbps"]) for lk in lay["links"]])
    return np.array(out_idx, dtype=int), np.array(out_dir, dtype=int), ids, cap


@dataclasses.dataclass
class StepLoad:
    """One modelled step's traffic on the network: ``bits`` per directed link of the model's
    :class:`~hpnlab.fabric.model.flow.Network` (ids 2j, 2j + 1: the two directions of edge j);
    ``span_s``: the step's drain time as ``model.run_step`` computes it (without latency)."""
    bits: np.ndarray
    span_s: float
    latency_s: float
    stalled: int


def step_load(net: model.Network, job: model.Job, step: model.Step, routing: str, qps: int, seed: int,
              switch_latency_us: float = 1.0) -> StepLoad:
    """Route one step as ``model.run_collective`` does (``model.route_step`` with its seed and the
    step's salt) and sum the bits each directed link carries (see the module docstring)."""
    r = model.route_step(net, job, (step.src, step.dst), step.nbytes, routing, qps, seed, switch_latency_us,
                         salt=step.salt)
    n = len(net.cap)
    if not len(r.size_bits):
        return StepLoad(np.zeros(n), 0.0, r.latency_us * 1e-6, r.stalled)
    scale = step.scale
    if r.conn is None:            # flow, flowlet: a connection on its path; spray: weight = the path's share
        bits = np.bincount(r.link_idx, weights=r.weight * r.size_bits[r.flow_idx] * scale, minlength=n)
        span = float(model.drain_times(r.flow_idx, r.link_idx, r.weight, net.cap, r.size_bits * scale).max())
    else:                         # adaptive: each sub-flow its max-min share of the pair's bytes
        sub = model.max_min_rates(r.flow_idx, r.link_idx, r.weight * scale, net.cap, len(r.conn))
        pair_rate = np.bincount(r.conn, weights=sub, minlength=len(r.size_bits))
        sub_bits = r.size_bits[r.conn] * sub / np.maximum(pair_rate[r.conn], 1e-30)
        bits = np.bincount(r.link_idx, weights=r.weight * sub_bits[r.flow_idx] * scale, minlength=n)
        span = float((r.size_bits / np.maximum(pair_rate * 1e9, 1e-30)).max())
    return StepLoad(bits, span, r.latency_us * 1e-6, r.stalled)


def _utilisation(bits: np.ndarray, cap_gbps: np.ndarray, time_s: float) -> np.ndarray:
    """bits / (capacity x time); 0 where the capacity or the time is 0."""
    denom = cap_gbps * 1e9 * time_s
    return np.divide(bits, denom, out=np.zeros_like(bits, dtype=float), where=denom > 0)


def _check_network(g: nx.MultiGraph, net: model.Network, probes: int = 64) -> None:
    """The network's directed link ids follow ``g``'s edge order (a cached network and a fresh
    graph of the same scenario): the link counts, the hosts, and ``probes`` edges' switch ports."""
    hosts = [n for n, d in g.nodes(data=True) if d["tier"] == 0]
    m = g.number_of_edges()
    same = net.n_links == 2 * m and net.hosts == hosts
    every = max(1, m // probes)
    for i, (u, v, d) in enumerate(itertools.islice(g.edges(data=True), 0, None, every)):
        j = i * every
        for end, link in ((u, 2 * j), (v, 2 * j + 1)):
            if same and end in net.sw_index:
                same = net.link_at(end, d["ports"][end]) == link
    if not same:
        raise ValueError("the model network was not built from this fabric graph (its links differ)")


def _plain(value: Any, max_pairs: int = 16) -> Any:
    """Strict JSON values: a non-finite float (a stalled run's inf) as None; lists of stalled pairs
    cut to their first ``max_pairs`` (``stalled_connections`` keeps the count)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _plain(v[:max_pairs] if k == "stalled_pairs" else v, max_pairs) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, max_pairs) for v in value]
    return value


@view._no_gc
def model_loads(g: nx.MultiGraph, collective: str, size_bytes: int, *, routing: str = "flow",
                hosts: int | None = None, placement: str = "packed", qps: int = 4, seed: int = 1,
                failed: set | None = None, max_steps: int = 16, switch_latency_us: float = 1.0,
                lay: dict[str, Any] | None = None, network: model.Network | None = None,
                exact_pairs: int = model.EXACT_PAIRS) -> dict[str, Any]:
    """Run the model (``model.run_collective``) and export its per-link loads per distinct step
    (see the module docstring). ``lay``: the layout the loads are for (default ``view.layout(g)``);
    ``network``: the model network of ``g`` (e.g. ``model.cached_network``; built with ``failed``
    when not given, and ``failed`` is then ignored)."""
    lay = lay or view.layout(g)
    routing = model.routing_name(routing)
    net = network or model.Network(g, failed)
    _check_network(g, net)
    job = model.make_job(g, hosts, placement, seed, network=net)
    result = model.run_collective(g, collective, size_bytes, routing=routing, hosts=hosts, placement=placement,
                                  qps=qps, seed=seed, max_steps=max_steps, switch_latency_us=switch_latency_us,
                                  network=net, job=job, exact_pairs=exact_pairs)
    distinct = model.steps(result.collective, job, size_bytes, max_steps=max_steps, seed=seed, rails=net.s.rails,
                           routing=routing, exact_pairs=exact_pairs)
    idx, direction, ids, cap = _direction_groups(g, lay)
    steps = []
    for st, res in zip(distinct, result.steps, strict=True):
        load = step_load(net, job, st, routing, qps, 0, switch_latency_us)   # run_collective's flow-hash salt
        # the model's time of the step; a stalled step (inf) is drawn over what was routed
        time_s = res.time_s if math.isfinite(res.time_s) else load.span_s + load.latency_s
        per = np.zeros((len(ids), 2))
        np.add.at(per, (idx, direction), load.bits)
        util = _utilisation(per, cap[:, None], time_s)
        # the busiest single link of each group link and direction (ECMP collisions hide in a group's mean)
        peak = np.zeros((len(ids), 2))
        np.maximum.at(peak, (idx, direction), _utilisation(load.bits, net.cap, time_s))
        steps.append({"multiplicity": st.multiplicity, "sampled": st.scale,
                      "time_us": res.time_s * 1e6 if math.isfinite(res.time_s) else None,
                      "latency_us": load.latency_s * 1e6, "stalled": res.stalled,
                      "links": {ids[i]: [round(float(util[i, 0]), 4), round(float(util[i, 1]), 4),
                                         round(float(peak[i, 0]), 4), round(float(peak[i, 1]), 4)]
                                for i in np.flatnonzero(per.sum(axis=1) > 0).tolist()}})
    return {"scenario": g.graph.get("name") or net.s.name, "model": _plain(result.as_dict()),
            "loads": {"collective": result.collective, "routing": routing, "busbw_gbs": result.busbw_gbs,
                      "aggregated": bool(lay.get("aggregated")), "steps": steps}}
