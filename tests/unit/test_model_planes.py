"""The model puts each connection where the RoCE transport does (pure, no root).

Per-flow hashing decides a connection's plane and entropy value; the transport's entropy
policies (``flow``, ``ecmp``, ``flowlet``) decide it per packet, the model per connection.
Both call the same functions (``routing.entropy.flow_hash``, ``connection_path``,
``connection_values``); these tests hold the model's per-connection (plane, source port)
against what the transport's own policy objects send, for every ordered rank pair of
mini-hpn (2 planes), so a change to either side that parts them fails here.
"""
from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from hpnlab.fabric.model import flow as model
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.entropy import connection_values, flow_hash
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.transport.entropy import ENTROPY_POLICIES
from hpnlab.fabric.transport.paths import PathTable
from hpnlab.fabric.transport.roce import TxFlow


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@cache
def mini_net() -> model.Network:
    return model.Network(graph.build(spec.load("mini-hpn")))


def ranks(net: model.Network) -> list[tuple[int, int]]:
    n = len(net.hosts)
    return [(a, b) for a in range(n) for b in range(n) if a != b]


def transport_sends(policy: str, net: model.Network, a: int, b: int, steps: int = 1) -> list[tuple[int, int]]:
    """(plane, switch-read bits of the source port) of every packet rank a's transport sends
    rank b in ``steps`` bursts separated by idle gaps (one packet per connection per burst)."""
    planes, ports = net.s.planes, net.entropy_values
    emap = compiler.entropy_map(net.g)
    assert ports == min(8, emap.path_count())        # the transport's ports_per_nic for this map
    clock = Clock()
    pol = ENTROPY_POLICIES[policy](planes, ports, clock=clock)
    flow = TxFlow(a, b, 0.0, None, PathTable(planes, ports))
    per_burst = 1 if policy == "flow" else planes
    out = []
    seq = 0
    for _ in range(steps):
        clock.t += 1.0                                  # far longer than any flowlet gap
        for _k in range(per_burst):
            plane, j = divmod(pol.path(flow, seq), ports)
            out.append((plane, emap.low_bits(connection_values(emap, a, b, plane, ports)[j])))
            seq += 1
    return out


def model_sends(net: model.Network, a: int, b: int, qps: int, steps: int = 1) -> list[tuple[int, int]]:
    out = []
    for s in range(steps):
        conn = np.arange(qps)
        plane, j = model.connection_planes(net, a, b, conn, qps, moves=s)
        sport = model.entropy_sports(net, a, b, plane, j)
        out += [(int(p), int(x)) for p, x in zip(plane, sport, strict=True)]
    return out


def test_one_connection_per_pair_takes_the_transports_flow_path():
    net = mini_net()
    for a, b in ranks(net):
        assert model_sends(net, a, b, 1) == transport_sends("flow", net, a, b), (a, b)


def test_one_connection_per_plane_takes_the_transports_ecmp_plane_and_source_port():
    net = mini_net()
    seen_planes = set()
    for a, b in ranks(net):
        got = model_sends(net, a, b, net.s.planes)
        assert got == transport_sends("ecmp", net, a, b), (a, b)
        seen_planes.add(tuple(p for p, _ in got))
    assert seen_planes == {(0, 1)}                     # connection c on plane c, never hashed across


def test_flowlets_move_to_their_planes_next_value_each_step_as_the_transports_do():
    net = mini_net()
    for a, b in ranks(net):
        assert model_sends(net, a, b, net.s.planes, steps=3) == transport_sends("flowlet", net, a, b, steps=3), (a, b)


def test_the_routed_step_uses_those_planes():
    # the model's routing of a step reads connection_planes: every connection's first link is
    # the host's uplink in the plane connection_planes names
    net = mini_net()
    job = model.Job(ranks=[(h, 0) for h in net.hosts])
    pairs = ranks(net)
    r = model.route_step(net, job, pairs, 1e6, "flow", net.s.planes)
    first = r.link_idx[np.r_[True, r.flow_idx[1:] != r.flow_idx[:-1]]]
    _leaf, up, _down, _host = net.rank_table(job)
    a = np.repeat([p[0] for p in pairs], net.s.planes)
    b = np.repeat([p[1] for p in pairs], net.s.planes)
    plane, _j = model.connection_planes(net, a, b, np.tile(np.arange(net.s.planes), len(pairs)), net.s.planes)
    assert np.array_equal(first, up[a, plane])


@pytest.mark.parametrize("src,dst", [(0, 1), (70_000, 131_071), (131_071, 3)])
def test_the_flow_hash_is_the_same_on_python_ints_and_numpy_arrays_past_16_bit_ranks(src, dst):
    arr = flow_hash(np.array([src], dtype=np.uint64), np.array([dst], dtype=np.uint64))
    assert int(arr[0]) == flow_hash(src, dst)
