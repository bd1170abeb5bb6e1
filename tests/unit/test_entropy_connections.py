"""Which entropy values each connection takes (``routing.entropy.connection_values``).

Every connection (rank pair, plane) takes its own N values from the controller's entropy
map, from an offset a hash of (src, dst, plane, connection) places in the map's value space:
N values of one connection are N distinct paths (walked on the compiled tables with the
table interpreter), and over the connections of a permutation every leaf uplink is used
evenly -- within a bound derived from the variance of the count -- where one fixed set of N
values for every connection (what the transport bound before) leaves the other uplinks idle.
The flow model routes each connection on exactly those values (the same function).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from support.fabrics import fabric

from hpnlab.fabric.model import flow as model
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.entropy import FIRST_FREE_PORT, connection_value, connection_values, first_high
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph
from hpnlab.fabric.workload import collectives

WIDE = dict(planes=1, spines_per_plane=16, leaf_spine_rate_gbps=50)    # mini-hpn, 16 uplinks per leaf


def test_the_same_connection_always_gets_the_same_values_and_arrays_agree_with_ints():
    space = 1000
    conns = ((3, 5, 1, 0), (5, 3, 1, 0), (3, 5, 0, 2))
    ints = [connection_values(space, s, d, p, 8, q) for s, d, p, q in conns]
    assert ints == [connection_values(space, s, d, p, 8, q) for s, d, p, q in conns]
    assert len({tuple(v) for v in ints}) == 3
    u = np.uint64
    arr = connection_value(space, np.array([3, 5, 3], u), np.array([5, 3, 5], u), np.array([1, 1, 0], u),
                           np.array([7, 7, 7], u), np.array([0, 0, 2], u))
    assert arr.tolist() == [v[7] for v in ints]


def test_n_values_are_consecutive_from_the_offset_wrapping_and_never_more_than_the_space():
    vs = connection_values(5, 1, 2, 0, 8)
    assert len(vs) == 5 and sorted(vs) == [0, 1, 2, 3, 4]
    assert all((b - a) % 5 == 1 for a, b in itertools.pairwise(vs))


@pytest.mark.parametrize("name,overrides", [("small-hpn", {}), ("mini-hpn", WIDE)])
def test_a_connections_n_values_are_n_distinct_paths_through_the_compiled_tables(name, overrides):
    g = fabric(name, **overrides)
    emap = compiler.entropy_map(g)
    tables = FabricTables(g, compiler.compile_fabric(g))
    n = min(8, emap.path_count())
    hosts = graph.hosts(g)
    leaf = {h: graph.host_ports(g, h)[0]["leaf"] for h in hosts}
    pairs = [(a, b) for a in hosts[:4] for b in hosts if leaf[a] != leaf[b]][:12]
    assert pairs and n >= 4
    for i, (a, b) in enumerate(pairs):
        values = connection_values(emap, i, i + 1, 0, n)
        walks = {tuple(tables.send(a, b, 0, sport=emap.source_port(k, high=1)).hops) for k in values}
        assert len(walks) == n, (a, b, values)


def test_over_a_permutation_every_leaf_uplink_carries_an_even_share_within_the_binomial_bound():
    """Each connection's N consecutive values cover N of a leaf's U uplinks from a uniform
    offset (independent for distinct connections), so an uplink is covered by a connection
    with probability p = N/U; with C connections from its leaf it carries Binomial(C, p) of
    them: every count must lie within 5 standard deviations of C p (a fixed set of N values
    would give C on N uplinks, 0 on the rest)."""
    g = fabric("mini-hpn", **WIDE)
    net = model.Network(g, entropy_values=4)
    n = net.entropy_values
    job = model.make_job(g, None, "packed", 0)
    leaf, _up, _down, host = net.rank_table(job)
    pairs: set[tuple[int, int]] = set()
    for seed in range(40):                  # the distinct connections of 40 permutations, each counted once
        perm = collectives.random_perm(job.n, seed)
        pairs |= {(a, perm[a]) for a in range(job.n) if host[a] != host[perm[a]]}
    a, b = np.array(sorted(pairs)).T
    sl, dl = leaf[a, 0], leaf[b, 0]
    cross = sl != dl
    a, b, sl, dl = a[cross], b[cross], sl[cross], dl[cross]
    first = np.stack([net.fwd.walk(sl, dl, model.entropy_sports(net, a, b, 0, i))[0][:, 0]   # leaf uplinks
                      for i in range(n)], 1)
    uplinks = 16
    for li in np.unique(sl):
        mine = first[sl == li]
        assert all(len(set(row)) == n for row in mine.tolist())      # N different uplinks per connection
        used, count = np.unique(mine, return_counts=True)
        c, p = len(mine), n / uplinks
        sd = math.sqrt(c * p * (1 - p))
        assert len(used) == uplinks, (li, used)
        assert np.all(np.abs(count - c * p) <= 5 * sd), (li, count.tolist(), c * p, sd)


@pytest.mark.parametrize("name,overrides", [("small-hpn", {}), ("mini-hpn", WIDE)])
def test_the_model_routes_each_connection_on_the_values_the_transport_binds(name, overrides):
    g = fabric(name, **overrides)
    emap = compiler.entropy_map(g)
    net = model.Network(g)
    tables = FabricTables(g, compiler.compile_fabric(g))
    job = model.make_job(g, None, "packed", 0)
    leaf, _up, _down, _host = net.rank_table(job)
    for a, b in [(0, job.n - 1), (1, job.n // 2), (job.n - 2, 3)]:
        want = connection_values(emap, a, b, 0, net.entropy_values)
        got = model.entropy_sports(net, a, b, 0, np.arange(net.entropy_values))
        assert got.tolist() == [emap.low_bits(k) for k in want]
        (ha, ra), (hb, rb) = job.ranks[a], job.ranks[b]
        for sport in got.tolist():
            walk = tables.send(ha, hb, 0, sport=sport, src_rail=ra, dst_rail=rb)
            path = net.fwd.walk(np.array([leaf[a, 0]]), np.array([leaf[b, 0]]), np.array([sport]))[0][0]
            assert [net.link_at(sw, out) for sw, _in, out in walk.hops[:-1]] == [x for x in path.tolist() if x >= 0]


def test_the_first_high_bits_never_name_a_port_below_1024_for_any_rank():
    emap = compiler.entropy_map(fabric("mini-hpn"))
    ranks = np.arange(emap.high_values() + 3)
    for low in range(1 << emap.width):
        ports = first_high(emap, low, ranks) << emap.width | low
        assert ports.min() >= FIRST_FREE_PORT
        assert [first_high(emap, low, int(r)) for r in ranks[:600]] == first_high(emap, low, ranks[:600]).tolist()


def test_weighted_switches_see_the_source_ports_the_transport_binds():
    """Weighted switches read the bits above the map's pattern, so the model must take the
    transport's high bits too, past the ports below 1024 it skips (ranks 1 to 512 on mini-hpn)."""
    from support.model_checks import half_rate_uplink, permutation_step

    from hpnlab.fabric.scenario import spec
    from hpnlab.fabric.transport.roce import RoceTransport
    g = graph.build(spec.load("mini-hpn"))             # its own: the shared fabric() must not change
    half_rate_uplink(g, "p0l0", "p0s0")
    net = model.Network(g)
    job, step = permutation_step(g, net)
    wnet, _info = model.weighted_network(net, job, step, "spray", 4)
    assert wnet.fwd.reads_high
    emap = wnet.emap
    for rank in (0, 1, 5):
        ip = f"127.0.3.{rank + 2}"
        t = RoceTransport(rank, [[f"127.0.3.{r + 2}"] for r in range(6)], base_port=29000, entropy_map=emap.as_dict())
        try:
            for k in range(emap.path_count()):
                sock, _value = t.endpoint.entropy_socket(ip, k)
                bound = sock.getsockname()[1]
                sock.close()
                low = np.array([emap.low_bits(k)])
                assert model.with_high_bits(wnet, low, np.array([rank])).tolist() == [bound], (rank, k)
        finally:
            t.close(linger_s=0)
