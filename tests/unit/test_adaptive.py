"""Host-side adaptive routing (fabric/transport/adaptive.py) and flowlets, on scripted feedback.

A scripted fabric: every packet a policy sends is answered one window later (what is in
flight), with a congestion mark if its path is hot at that moment, else a clean ACK. The
policy must move off a path whose marks rise, come back when they clear, and never send on
a path the dead-path detection (PathTable) marks dead.
"""
from __future__ import annotations

from collections import Counter, deque
from types import SimpleNamespace

import pytest

from hpnlab.fabric.transport import TransportError
from hpnlab.fabric.transport.adaptive import AdaptiveParams, AdaptivePaths, WeightedPaths, WeightParams
from hpnlab.fabric.transport.entropy import AdaptiveEntropy, EcmpEntropy, FlowletEntropy, RepsEntropy, SprayEntropy
from hpnlab.fabric.transport.paths import PathTable

PATHS = 4
PKT_S = 0.0001          # one packet every 100 us
RTT_PKTS = 20           # feedback comes back 20 packets (2 ms) later


class Fabric:
    """Drives an AdaptivePaths with feedback: ``hot`` paths mark every packet."""

    def __init__(self, policy: AdaptivePaths, live=lambda p: True):
        self.policy, self.live = policy, live
        self.t = 0.0
        self.inflight: deque = deque()
        self.hot: set[int] = set()

    def run(self, packets: int) -> Counter:
        used: Counter = Counter()
        for _ in range(packets):
            self.t += PKT_S
            p = self.policy.choose(self.t, self.live)
            used[p] += 1
            self.inflight.append(p)
            if len(self.inflight) > RTT_PKTS:
                q = self.inflight.popleft()
                self.policy.on_rtt(q, RTT_PKTS * PKT_S)
                if q in self.hot:
                    self.policy.on_mark(q, self.t)
                else:
                    self.policy.on_ack(q, self.t)
        return used


def test_at_start_every_path_is_explored_in_turn():
    fab = Fabric(AdaptivePaths(PATHS))
    used = fab.run(RTT_PKTS)                      # no feedback yet: nothing to recycle
    assert used == dict.fromkeys(range(PATHS), RTT_PKTS // PATHS)


def test_clean_paths_are_reused_evenly():
    fab = Fabric(AdaptivePaths(PATHS))
    fab.run(2000)
    used = fab.run(4000)
    assert all(abs(n / 4000 - 1 / PATHS) < 0.05 for n in used.values())


def test_traffic_moves_off_a_path_whose_marks_rise_and_back_when_they_clear():
    fab = Fabric(AdaptivePaths(PATHS))
    fab.run(2000)
    fab.hot = {2}
    fab.run(1000)                                 # the marks come back one RTT later
    during = fab.run(4000)
    assert during[2] / 4000 < 0.05                # only exploration touches it
    fab.hot = set()
    fab.run(4000)
    after = fab.run(4000)
    assert after[2] / 4000 > 0.8 / PATHS          # back to about its share


def test_a_path_that_keeps_marking_rests_longer_each_time():
    a = AdaptivePaths(PATHS, AdaptiveParams(hold_floor_s=0.001, hold_rtts=0))
    a.on_mark(1, 0.0)
    first = a.rest_until[1]
    a.on_mark(1, 0.0005)                          # marked again while resting
    assert a.rest_until[1] - 0.0005 == pytest.approx(2 * first)
    a.on_ack(1, 0.01)                             # a clean ACK after the rest: forgiven
    a.on_mark(1, 0.02)
    assert a.rest_until[1] - 0.02 == pytest.approx(first)


def test_a_mark_throws_away_the_tokens_of_its_path_only():
    a = AdaptivePaths(PATHS)
    for p in (0, 1, 0, 2):
        a.on_ack(p, 0.0)
    a.on_mark(0, 0.0)
    assert list(a.tokens) == [1, 2]


def test_a_slow_path_gets_no_tokens_back():
    a = AdaptivePaths(PATHS, AdaptiveParams(rtt_factor=2))
    a.on_rtt(0, 0.001)
    for _ in range(20):
        a.on_rtt(1, 0.010)
    a.on_ack(0, 0.0)
    a.on_ack(1, 0.0)
    assert list(a.tokens) == [0]


def test_a_dead_path_is_never_used_even_with_its_tokens_in_the_buffer():
    table = PathTable(2, 2)
    fab = Fabric(AdaptivePaths(PATHS), live=table.live)
    assert fab.run(500)[3] > 0
    table.kill(3, fab.t)
    used: Counter = Counter()
    token_seen = False
    for _ in range(3000):
        used += fab.run(1)
        token_seen |= 3 in fab.policy.tokens      # its packets in flight were ACKed: tokens came back
    assert token_seen and used[3] == 0 and set(used) == {0, 1, 2}


def test_when_every_live_path_rests_it_still_sends_on_a_live_one():
    table = PathTable(1, PATHS)
    table.kill(0, 0.0)
    a = AdaptivePaths(PATHS)
    for p in range(PATHS):
        a.on_mark(p, 0.0)
    picks = {a.choose(0.0001, table.live) for _ in range(20)}
    assert picks and 0 not in picks


def test_bad_adaptive_parameters_are_one_clear_error():
    with pytest.raises(TransportError, match="rtt_factor"):
        AdaptiveParams(rtt_factor=0.5)
    with pytest.raises(TransportError, match="bad adaptive entropy parameters"):
        AdaptiveEntropy(1, 2, adaptive={"colour": 1})
    with pytest.raises(TransportError, match="bad reps entropy parameters"):
        RepsEntropy(1, 2, adaptive={"colour": 1})
    with pytest.raises(TransportError, match="w_min"):
        WeightParams(w_min=0)


# ---- the policies as the transport sees them -----------------------------------------

def _flow(planes: int, ports: int, dst: int = 1) -> SimpleNamespace:
    return SimpleNamespace(dst=dst, hash=0, paths=PathTable(planes, ports))


def test_reps_entropy_reads_the_transports_feedback_per_flow():
    pol = RepsEntropy(2, 2, clock=lambda: 1.0)
    f, g = _flow(2, 2, dst=1), _flow(2, 2, dst=2)
    pol.on_feedback(f, 3, "ack", 1.0)
    assert list(pol.of(f).tokens) == [3] and not pol.of(g).tokens
    assert pol.path(f, 0) == 3
    pol.on_feedback(f, 3, "ce", 1.0)
    assert pol.path(f, 1) != 3


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_flowlet_keeps_its_path_on_each_plane_while_packets_follow_closely():
    clock = Clock()
    pol = FlowletEntropy(2, 2, clock=clock, flowlet_gap_s=0.001)
    f = _flow(2, 2)
    first = [pol.path(f, 0), pol.path(f, 1)]
    assert [p // 2 for p in first] == [0, 1]                    # one connection per plane
    for k in range(2, 100):
        clock.t += 0.0004
        assert pol.path(f, k) == first[k % 2]


def test_a_flowlet_moves_to_its_planes_next_value_after_an_idle_gap():
    clock = Clock()
    pol = FlowletEntropy(1, 3, clock=clock, flowlet_gap_s=0.001)
    f = _flow(1, 3)
    seen = [pol.path(f, 0)]
    for k in range(1, 3):
        clock.t += 0.0011
        seen.append(pol.path(f, k))
    assert sorted(seen) == [0, 1, 2]
    assert pol.summary(f)["flowlets"] == 3


def test_a_flowlet_leaves_a_dead_path_at_once():
    clock = Clock()
    pol = FlowletEntropy(1, 3, clock=clock, flowlet_gap_s=1.0)
    f = _flow(1, 3)
    p = pol.path(f, 0)
    f.paths.kill(p, 0.0)
    assert pol.path(f, 1) != p


def test_ecmp_deals_packets_over_one_hashed_connection_per_plane():
    pol = EcmpEntropy(2, 4)
    f = _flow(2, 4)
    paths = [pol.path(f, k) for k in range(8)]
    assert [p // 4 for p in paths] == [0, 1] * 4                # connection k on plane k
    assert len(set(paths)) == 2                                 # each keeps its hashed entropy value


# ---- the adaptive entropy: spray weighted by each path's own evidence -------------------

class WeightedFabric:
    """Drives a WeightedPaths: every packet's RTT comes back one window later, ``base`` plus the
    queue of its path (``queue_s``); a packet on a ``hot`` path is marked."""

    def __init__(self, policy: WeightedPaths, base: float = 0.002):
        self.policy, self.base = policy, base
        self.t = 0.0
        self.inflight: deque = deque()
        self.queue_s: dict[int, float] = {}
        self.hot: set[int] = set()

    def run(self, packets: int, live=lambda p: True) -> Counter:
        used: Counter = Counter()
        for _ in range(packets):
            self.t += PKT_S
            p = self.policy.choose(self.t, live)
            used[p] += 1
            self.inflight.append(p)
            if len(self.inflight) > RTT_PKTS:
                q = self.inflight.popleft()
                self.policy.on_rtt(q, self.base + self.queue_s.get(q, 0.0), self.t)
                if q in self.hot:
                    self.policy.on_mark(q, self.t)
        return used


def test_with_nothing_to_tell_paths_apart_adaptive_is_sprays_rotation():
    pol, spray = AdaptiveEntropy(2, 4, clock=lambda: 1.0), SprayEntropy(2, 4)
    f = _flow(2, 4)
    assert [pol.path(f, k) for k in range(16)] == [spray.path(f, k) for k in range(16)]


def test_congestion_every_path_shares_moves_no_traffic():
    fab = WeightedFabric(WeightedPaths(PATHS))
    fab.queue_s = dict.fromkeys(range(PATHS), 0.040)        # the receiver's port: every path waits as long
    used = fab.run(4000)
    assert set(used.values()) == {1000}


def test_a_path_with_a_longer_queue_than_the_others_carries_less_and_comes_back_when_it_drains():
    fab = WeightedFabric(WeightedPaths(PATHS))
    fab.run(1000)
    fab.queue_s = {2: 0.020}                                # 10 x the base RTT on path 2 alone
    fab.run(1000)
    during = fab.run(4000)
    assert during[2] / 4000 < 0.1 and during[2] > 0         # less, not nothing: it is still sampled
    fab.queue_s = {}
    fab.run(4000)
    after = fab.run(4000)
    assert after[2] / 4000 > 0.8 / PATHS


def test_a_path_that_marks_carries_less_while_it_marks_and_its_share_returns_after():
    fab = WeightedFabric(WeightedPaths(PATHS))
    fab.run(1000)
    fab.hot = {1}
    fab.run(1000)
    during = fab.run(4000)
    assert during[1] / 4000 < 0.5 / PATHS
    fab.hot = set()
    fab.run(4000)
    after = fab.run(4000)
    assert after[1] / 4000 > 0.8 / PATHS


def test_the_weighted_rule_never_sends_on_a_dead_path():
    table = PathTable(2, 2)
    fab = WeightedFabric(WeightedPaths(PATHS))
    fab.run(100)
    table.kill(3, fab.t)
    used = fab.run(2000, live=table.live)
    assert used[3] == 0 and set(used) == {0, 1, 2}


def test_a_loss_cuts_a_path_more_than_a_mark_and_both_recover_with_time():
    w = WeightedPaths(4)                                    # paths 2 and 3 stay clean
    w.on_mark(0, 1.0)
    w.on_loss(1, 1.0)
    now = w.weights(1.0, lambda _p: True)
    assert now[1] < now[0] < 1.0 and now[2:] == [1.0, 1.0]
    later = w.weights(1.0 + 10 * w.p.recover_s, lambda _p: True)     # 10 time constants on
    assert later == pytest.approx([1.0] * 4, abs=1e-3)


def test_marks_every_path_shares_move_no_traffic():
    fab = WeightedFabric(WeightedPaths(PATHS))
    fab.hot = set(range(PATHS))                             # the receiver's port marks every path alike
    fab.run(1000)
    used = fab.run(4000)
    assert all(abs(n / 4000 - 1 / PATHS) < 0.02 for n in used.values()) and len(used) == PATHS


def test_a_mark_counts_against_the_median_path_not_against_a_clean_one():
    rel, absolute = WeightedPaths(4), WeightedPaths(4, WeightParams(reference="best"))
    for w in (rel, absolute):
        for p in range(4):
            w.on_mark(p, 1.0)                               # every path marked once ...
        w.on_mark(0, 1.0)                                   # ... and path 0 once more
    assert rel.weights(1.0, lambda _p: True) == pytest.approx([0.5, 1.0, 1.0, 1.0])
    assert absolute.weights(1.0, lambda _p: True) == pytest.approx([0.25, 0.5, 0.5, 0.5])


def test_an_rtt_counts_against_the_median_path_so_only_paths_slower_than_most_lose_weight():
    rel, best = WeightedPaths(4), WeightedPaths(4, WeightParams(reference="best"))
    for w in (rel, best):
        for p, rtt in enumerate((0.010, 0.020, 0.030, 0.040)):
            w.on_rtt(p, rtt, 1.0)
    assert rel.weights(1.0, lambda _p: True) == pytest.approx([1.0, 1.0, 1.0, 0.025 * 1.25 / 0.040])
    assert best.weights(1.0, lambda _p: True) == pytest.approx([1.0, 0.0125 / 0.020, 0.0125 / 0.030, 0.0125 / 0.040])


def test_a_reference_other_than_median_or_best_is_refused():
    with pytest.raises(TransportError, match="reference"):
        WeightParams(reference="mean")


def test_a_timeout_moves_no_weight_by_default_where_a_path_loss_does():
    """On a sprayed connection a timeout is most often a packet still queued; a loss on the path
    shows in its own sequence (PATH_LOSS) as soon as a later packet of the path arrives."""
    w = WeightedPaths(4)
    w.on_timeout(0, 1.0)
    assert w.weights(1.0, lambda _p: True) == [1.0] * 4 and w.stats["timeouts"] == 1
    w.on_loss(1, 1.0)
    assert w.weights(1.0, lambda _p: True)[1] < 1.0


def test_a_timeout_cuts_by_timeout_cut_when_one_is_set():
    w = WeightedPaths(4, WeightParams(timeout_cut=0.5))
    w.on_timeout(0, 1.0)
    assert w.weights(1.0, lambda _p: True)[0] == pytest.approx(0.5)
    with pytest.raises(TransportError, match="timeout_cut"):
        WeightParams(timeout_cut=1.0)


def test_the_transports_timeout_reaches_the_policy_as_a_timeout_and_reps_counts_it_a_loss():
    pol, reps = AdaptiveEntropy(2, 2, clock=lambda: 1.0), RepsEntropy(2, 2, clock=lambda: 1.0)
    f = _flow(2, 2)
    for p in (pol, reps):
        p.path(f, 0)
        p.on_feedback(f, 1, "timeout", 1.0)
    assert pol.of(f).stats["timeouts"] == 1 and pol.of(f).stats["losses"] == 0
    assert reps.of(f).stats["losses"] == 1
