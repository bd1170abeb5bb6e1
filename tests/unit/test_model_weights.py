"""Weighted switches in the flow model (pure, no root).

``model.weighted_network`` feeds the controller's own weighted-mode policy
(``controller.weights.Weights``) the loads the model gives, re-deals the widened entropy sets as
it decides, and routes again until nothing changes. With equal loads it changes nothing, and the
model then forwards exactly as with ecmp; with one uplink at half the rate of its sibling, the
policy moves patterns off it and its share of the leaf's traffic falls.
"""
from __future__ import annotations

import numpy as np
import pytest
from support.model_checks import half_rate_uplink, permutation_step

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph, spec


@pytest.mark.parametrize("routing", ["spray", "adaptive"])
def test_with_equal_loads_weighted_switches_forward_exactly_as_ecmp(routing):
    g = graph.build(spec.load("mini-hpn"))
    ecmp = model.run_collective(g, "all_reduce", 1 << 20, routing=routing, placement="random", seed=3)
    weighted = model.run_collective(g, "all_reduce", 1 << 20, routing=routing, placement="random", seed=3,
                                    switch_weights="weighted")
    assert weighted.detail["weighting"]["changes"] == 0
    assert weighted.detail["weighting"]["converged"]
    assert weighted.time_s == ecmp.time_s
    assert np.array_equal(weighted.steps[0].rates_gbps, ecmp.steps[0].rates_gbps)


def leaf_uplink_share(net, link_bytes, leaf: str, spine: str) -> float:
    ups = {v: net.link_at(leaf, d["ports"][leaf]) for _u, v, d in net.g.edges(leaf, data=True) if d["kind"] == "fabric"}
    return float(link_bytes[ups[spine]] / sum(link_bytes[x] for x in ups.values()))


@pytest.mark.parametrize("routing", ["spray", "adaptive"])
def test_weighted_switches_move_traffic_off_a_half_rate_uplink(routing):
    g = graph.build(spec.load("mini-hpn"))
    half_rate_uplink(g, "p0l0", "p0s0")
    net = model.Network(g)
    job, step = permutation_step(g, net)
    pairs = (step.src, step.dst)
    before = model.step_link_bytes(net, job, pairs, step.nbytes, routing, 4)
    wnet, info = model.weighted_network(net, job, step, routing, 4)
    after = model.step_link_bytes(wnet, job, pairs, step.nbytes, routing, 4)
    assert info["changes"] > 0
    assert leaf_uplink_share(net, after, "p0l0", "p0s0") < leaf_uplink_share(net, before, "p0l0", "p0s0")


def test_weighted_iterations_are_bounded_and_reported():
    g = graph.build(spec.load("mini-hpn"))
    half_rate_uplink(g, "p0l0", "p0s0")
    r = model.run_collective(g, "permutation", 1 << 20, routing="spray", placement="random", seed=3,
                             switch_weights="weighted", weight_iterations=1)
    assert r.detail["weighting"]["iterations"] == 1
    assert not r.detail["weighting"]["converged"]


def test_unknown_switch_weights_is_one_clear_error():
    g = graph.build(spec.load("mini-hpn"))
    with pytest.raises(UserError, match="switch weights"):
        model.run_collective(g, "permutation", 1 << 20, switch_weights="wcmp")


def test_weighted_forwarding_is_the_table_interpreters_walk_of_the_weighted_tables():
    """The model's re-dealt sets are the controller's weighted tables (compiler.widened, then
    compiler.weighted with the same assignments), path for path, every entropy pattern."""
    from support.model_checks import leaf_pairs

    from hpnlab.fabric.routing import compiler
    from hpnlab.fabric.routing.oftable import FabricTables
    g = graph.build(spec.load("mini-hpn"))
    half_rate_uplink(g, "p0l0", "p0s0")
    net = model.Network(g)
    job, step = permutation_step(g, net)
    wnet, info = model.weighted_network(net, job, step, "spray", 4)
    assert info["changes"] > 0
    fwd, ix = wnet.fwd, compiler.index_of(g)
    masks = compiler.weighted_masks(compiler.entropy_map(g))
    assignments: dict[str, dict[int, tuple[int, ...]]] = {}
    for r, assignment in fwd.assignments.items():
        si, full, _gone, _links = fwd.sets[r]
        name = fwd.switches[si]
        assignments.setdefault(name, {})[ix.protection(ix.sw[name]).metas[full]] = assignment
    states = {sw: compiler.widened(st, masks) for sw, st in compiler.compile_fabric(g).items()}
    states = {sw: compiler.weighted(st, assignments[sw]) if sw in assignments else st for sw, st in states.items()}
    tables = FabricTables(g, states)
    walked = 0
    for src, dst, plane, sleaf, dleaf, srail, drail in leaf_pairs(g):
        for sport in tables.entropy_ports():
            walk = tables.send(src, dst, plane, sport=sport, src_rail=srail, dst_rail=drail)
            assert walk.result == "delivered"
            links = [net.link_at(sw, out) for sw, _in, out in walk.hops[:-1]]
            assert fwd.leaf_path(sleaf, dleaf, sport) == links, (src, dst, sport, walk.hops)
            walked += 1
    assert walked
