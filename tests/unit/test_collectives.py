"""Collective schedules checked against the definitions of their collectives (pure)."""
from typing import Any

import numpy as np
import pytest

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.workload import collectives as col


def _run(name, n, size, **kw):
    sched = col.build(name, n, size, **kw)
    inputs = [col.rank_input(r, sched.in_count, seed=3) for r in range(n)]
    return sched, col.simulate(sched, inputs), col.reference(sched, inputs)


# halving-doubling is defined for powers of two only
CASES = [(name, n) for name in col.COLLECTIVES for n in (2, 3, 4, 5, 8)
         if not (name == "all_reduce_hd" and n & (n - 1))]


@pytest.mark.parametrize("name,n", CASES)
def test_every_schedule_computes_its_collective(name, n):
    for size in (n * 4, n * 4 * 7 + 12, 4096):
        _sched, got, want = _run(name, n, size)
        for r in range(n):
            assert got[r].shape == want[r].shape, (name, n, size, r)
            assert np.array_equal(got[r], want[r]), (name, n, size, r)


def test_ring_all_reduce_sends_to_the_next_rank_only_in_2n_minus_2_steps():
    sched = col.build("all_reduce", 5, 5 * 400)
    assert len(sched.steps) == 2 * (5 - 1)
    for step in sched.steps:
        assert sorted((t.src, t.dst) for t in step) == [(r, (r + 1) % 5) for r in range(5)]
    assert [t.reduce for t in sched.steps[0]] == [True] * 5
    assert [t.reduce for t in sched.steps[-1]] == [False] * 5


def test_halving_doubling_pairs_ranks_at_halving_then_doubling_distances():
    sched = col.build("all_reduce_hd", 8, 2048)
    distances = [{t.src ^ t.dst for t in step} for step in sched.steps]
    assert distances == [{4}, {2}, {1}, {1}, {2}, {4}]
    # halving: each step moves half of what the previous one did
    sizes = [sched.steps[i][0].nbytes for i in range(3)]
    assert sizes == [1024, 512, 256]


def test_halving_doubling_refuses_a_rank_count_that_is_not_a_power_of_two():
    with pytest.raises(UserError, match="power-of-two"):
        col.build("all_reduce_hd", 6, 4096)


def test_all_to_all_sends_chunk_j_of_every_rank_to_rank_j_in_one_step():
    sched = col.build("all_to_all", 4, 4 * 4 * 10)
    assert len(sched.steps) == 1
    per = 10 * 4
    for t in sched.steps[0]:
        assert t.src != t.dst
        assert (t.src_off, t.dst_off, t.nbytes) == (t.dst * per, t.src * per, per)
    assert len(sched.steps[0]) == 4 * 3


def test_incast_sends_every_rank_to_the_root_at_once():
    sched = col.build("incast", 6, 6 * 4 * 3, root=2)
    assert len(sched.steps) == 1
    assert sorted(t.src for t in sched.steps[0]) == [0, 1, 3, 4, 5]
    assert {t.dst for t in sched.steps[0]} == {2}


def test_permutation_is_a_derangement_crossing_to_the_other_half_by_default():
    sched = col.build("permutation", 8, 1024)
    assert sched.perm == (4, 5, 6, 7, 0, 1, 2, 3)
    assert all(t.nbytes == 1024 for t in sched.steps[0])
    rnd = col.random_perm(9, seed=1)
    assert sorted(rnd) == list(range(9)) and all(rnd[i] != i for i in range(9))
    _, got, want = _run("permutation", 9, 400, perm=rnd)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=False))


def test_permutation_refuses_a_rank_sending_to_itself():
    with pytest.raises(UserError, match="permutation"):
        col.build("permutation", 3, 64, perm=(0, 2, 1))


@pytest.mark.parametrize("name,factor", [
    ("all_reduce", 2 * 7 / 8), ("all_reduce_hd", 2 * 7 / 8), ("all_gather", 7 / 8),
    ("reduce_scatter", 7 / 8), ("all_to_all", 7 / 8), ("incast", 7 / 8),
    ("broadcast", 1.0), ("permutation", 1.0)])
def test_busbw_factor_is_the_nccl_tests_definition(name, factor):
    assert col.busbw_factor(name, 8) == pytest.approx(factor)


@pytest.mark.parametrize("name", ["all_reduce", "all_reduce_hd", "all_gather", "reduce_scatter",
                                  "all_to_all", "permutation"])
def test_busbw_factor_equals_the_bytes_each_rank_sends_per_byte_of_size(name):
    # Why busbw compares with link rate: the factor is the share of the array each rank's
    # link must carry (for these symmetric collectives), measured here on the schedule.
    n = 8
    sched = col.build(name, n, n * 4 * 64)
    for r in range(n):
        assert sched.bytes_sent(r) / sched.size_bytes == pytest.approx(sched.busbw_factor)


def test_incast_root_receives_n_minus_1_over_n_of_the_array():
    sched = col.build("incast", 4, 4 * 4 * 100, root=0)
    received = sum(t.nbytes for t in sched.steps[0] if t.dst == 0)
    assert received / sched.size_bytes == pytest.approx(sched.busbw_factor)


def test_broadcast_pipeline_has_every_piece_cross_every_ring_hop_once():
    sched = col.build("broadcast", 4, 4 * 1000, root=1)
    hops: dict[Any, Any] = {}
    for step in sched.steps:
        for t in step:
            hops.setdefault((t.src, t.dst), 0)
            hops[t.src, t.dst] += t.nbytes
    assert hops == {(1, 2): 4000, (2, 3): 4000, (3, 0): 4000}


def test_sizes_are_rounded_down_to_whole_per_rank_elements_like_nccl_tests():
    assert col.fit_count("all_gather", 3, 100) == 24      # 25 elements -> 8 per rank
    assert col.fit_count("all_reduce", 3, 100) == 25
    sched = col.build("all_gather", 3, 100)
    assert (sched.param_count, sched.size_bytes) == (8, 96)


def test_a_size_too_small_for_the_ranks_is_refused_with_the_minimum():
    with pytest.raises(UserError, match="at least 32 B"):
        col.build("all_reduce", 8, 16)


def test_unknown_collective_names_the_known_ones():
    with pytest.raises(UserError, match="known: all_reduce"):
        col.canonical("all_reduse")
    assert col.canonical("All-Reduce") == "all_reduce"
    assert col.canonical("alltoall") == "all_to_all"


def test_sweep_follows_b_e_f_like_nccl_tests():
    assert col.sweep(1024, 8192, 2) == [1024, 2048, 4096, 8192]
    assert col.sweep(1000, 3000, step_bytes=1000) == [1000, 2000, 3000]
    with pytest.raises(UserError):
        col.sweep(4096, 1024)
    with pytest.raises(UserError):
        col.sweep(1, 10, 1)
    assert col.parse_size("64K") == 65536 and col.parse_size("1M") == 1 << 20
    assert col.parse_size("512") == 512
    with pytest.raises(UserError):
        col.parse_size("lots")


def test_in_place_aliases_the_input_where_nccl_defines_it():
    ag = col.build("all_gather", 4, 4 * 4 * 8)
    assert [ag.inplace_offset(r) for r in range(4)] == [0, 32, 64, 96]
    assert col.build("all_reduce", 4, 256).inplace_offset(3) == 0
    assert not col.build("all_to_all", 4, 256).has_inplace


@pytest.mark.parametrize("name,n", CASES)
def test_expected_result_of_one_rank_matches_the_definition(name, n):
    sched = col.build(name, n, n * 4 * 9, root=n - 1)
    inputs = [col.rank_input(r, sched.in_count, seed=5) for r in range(n)]
    want = col.reference(sched, inputs)
    for r in range(n):
        assert np.array_equal(col.expected_for(sched, r, seed=5), want[r])
