"""The pfc-aware ECN policy (controller/ecn_policy.py, PfcAwarePolicy) on synthetic telemetry: pause as a
signal, one behaviour per test."""
from __future__ import annotations

import itertools
import random

import pytest

from hpnlab.controller import ecn_policy
from hpnlab.controller.ecn_policy import DynamicPolicy, PfcAwarePolicy, Thresholds
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing.telemetry import PortTelemetry
from hpnlab.fabric.workload.ecn import default_thresholds

RATE = 10e6
KEY = ("p0l0", 1)
OTHER = ("p0l0", 2)             # another egress port of the same switch
START = default_thresholds(RATE)
DT = 0.2
FRAME = 1538


def port(t: float, utilisation: float = 0.0, queue: int = 0, marked: float = 0.0, drops: int = 0,
         paused: float | None = 0.0, pauses_received: int | None = 0, pausing: float | None = 0.0,
         pauses_sent: int | None = 0) -> PortTelemetry:
    """One interval of a port; the PFC figures default to "PFC on, nothing paused" (None: no PFC)."""
    return PortTelemetry(t=t, rate_bps=RATE, tx_bps=utilisation * RATE, utilisation=utilisation, queue_bytes=queue,
                         ce_marked_pps=marked * 800, ce_fraction=marked, drops=drops, fan_in=1,
                         paused_fraction=paused, pauses_received=pauses_received, pausing_fraction=pausing,
                         pauses_sent=pauses_sent)


def run(policy, telemetry, steps: int, start: Thresholds = START, t0: int = 0) -> list[dict]:
    """Feed ``telemetry(t, current) -> {key: PortTelemetry}`` for ``steps`` intervals; the thresholds in force
    after each (every port of the first interval starts at ``start``)."""
    current: dict = {}
    seen = []
    for i in range(t0, t0 + steps):
        t = i * DT
        ports = telemetry(t, current)
        for key in ports:
            current.setdefault(key, start)
        current.update(ecn_policy.changes(current, policy.decide(t, ports, current)))
        seen.append(dict(current))
    return seen


def elephants(t, current):
    """A busy port that marks a little, nothing pauses, the queue well below the pressure mark."""
    th = current.get(KEY, START)
    return {KEY: port(t, utilisation=0.95, queue=th.kmin + 500, marked=0.02)}


def test_a_port_its_downstream_pauses_lowers_kmin_and_raises_pmax():
    after = run(PfcAwarePolicy(), lambda t, c: {KEY: port(t, utilisation=0.5, queue=2000, paused=0.3,
                                                          pauses_received=12)}, 3)[-1][KEY]
    assert after.kmin < START.kmin
    assert after.pmax > START.pmax


def test_pauses_that_held_the_port_for_less_than_pause_share_of_the_interval_cut_nothing():
    after = run(PfcAwarePolicy(), lambda t, c: {KEY: port(t, utilisation=0.5, queue=2000, paused=0.04,
                                                          pauses_received=3)}, 3)[-1][KEY]
    assert after == START


def test_a_pause_of_pause_share_of_the_interval_is_a_signal():
    after = run(PfcAwarePolicy(), lambda t, c: {KEY: port(t, utilisation=0.5, queue=2000, paused=0.05,
                                                          pauses_received=1)}, 1)[-1][KEY]
    assert after.kmin < START.kmin


def test_pause_spreading_upstream_from_the_switch_cuts_its_ports_that_hold_a_queue():
    def spreading(t, c):         # port 1 queues; port 2 (as an ingress) pauses its upstream and queues nothing
        return {KEY: port(t, utilisation=0.6, queue=4 * FRAME),
                OTHER: port(t, utilisation=0.6, queue=0, pausing=0.4, pauses_sent=9)}
    after = run(PfcAwarePolicy(mtu=1500), spreading, 2)[-1]
    assert after[KEY].kmin < START.kmin
    assert after[OTHER] == START


def test_a_switch_that_paused_its_upstream_briefly_is_no_pause_spreading():
    def brief(t, c):             # port 2 sent pauses that held its upstream 2% of the interval
        return {KEY: port(t, utilisation=0.6, queue=4 * FRAME),
                OTHER: port(t, utilisation=0.6, queue=0, pausing=0.02, pauses_sent=3)}
    after = run(PfcAwarePolicy(mtu=1500), brief, 2)[-1]
    assert after[KEY].kmin >= START.kmin         # not cut (busy and queued, it may rise as dynamic's would)


def test_dynamic_ignores_pause_where_the_queue_is_below_its_pressure_mark():
    after = run(DynamicPolicy(), lambda t, c: {KEY: port(t, utilisation=0.5, queue=2000, paused=0.3,
                                                         pauses_received=12)}, 3)[-1][KEY]
    assert after.kmin >= START.kmin


def test_elephants_without_pause_raise_kmin_where_dynamic_holds_it():
    aware = run(PfcAwarePolicy(), elephants, 10)[-1][KEY]
    dynamic = run(DynamicPolicy(), elephants, 10)[-1][KEY]
    assert aware.kmin > START.kmin
    assert aware.pmax < START.pmax
    assert dynamic == START


def test_elephants_on_a_lossy_fabric_keep_their_thresholds_as_under_dynamic():
    def lossy(t, current):
        th = current.get(KEY, START)
        return {KEY: port(t, utilisation=0.95, queue=th.kmin + 500, marked=0.02, paused=None, pauses_received=None,
                          pausing=None, pauses_sent=None)}
    assert run(PfcAwarePolicy(), lossy, 10)[-1][KEY] == START


def test_nothing_rises_for_calm_s_after_a_pause():
    policy = PfcAwarePolicy()
    paused = run(policy, lambda t, c: {KEY: port(t, utilisation=0.95, queue=2000, paused=0.2)}, 1)
    cut = paused[-1][KEY]
    calm_steps = int(policy.p["calm_s"] / DT)
    later = run(policy, elephants, calm_steps - 1, start=cut, t0=1)
    assert all(s[KEY] == cut for s in later)


def test_an_idle_port_returns_to_its_start_up_thresholds():
    policy = PfcAwarePolicy()
    cut = run(policy, lambda t, c: {KEY: port(t, utilisation=0.5, queue=2000, paused=0.5)}, 3)[-1][KEY]
    assert cut.kmin < START.kmin
    idle = run(policy, lambda t, c: {KEY: port(t)}, 60, start=cut, t0=3)
    assert idle[-1][KEY].kmin == START.kmin
    assert idle[-1][KEY].pmax == pytest.approx(START.pmax)


def test_a_rise_right_after_a_pause_cut_waits_twice_the_hold_time():
    policy = PfcAwarePolicy()
    state = {KEY: START}

    def step(i, feed):
        t = i * DT
        state.update(ecn_policy.changes(state, policy.decide(t, {KEY: feed(t, state)}, state)))
        return state[KEY]

    cut_at = 0
    step(cut_at, lambda t, c: port(t, utilisation=0.95, queue=2000, paused=0.2))
    first_rise = None
    for i in range(1, 40):
        before = state[KEY]
        after = step(i, lambda t, c: elephants(t, c)[KEY])
        if after.kmin > before.kmin:
            first_rise = i
            break
    assert first_rise is not None
    waited = (first_rise - cut_at) * DT
    assert waited >= max(policy.p["calm_s"], 2 * policy.p["hold_up_s"]) - 1e-9


def test_a_port_that_keeps_being_paused_is_cut_every_hold_down_until_its_bound():
    policy = PfcAwarePolicy()
    seen = run(policy, lambda t, c: {KEY: port(t, utilisation=0.5, queue=2000, paused=0.5)}, 30)
    kmins = [s[KEY].kmin for s in seen]
    lo, _ = policy.kmin_bounds(RATE)
    assert kmins[-1] == lo
    assert all(b <= a for a, b in itertools.pairwise(kmins))       # never up while paused


def test_without_pfc_figures_it_decides_as_dynamic_does():
    rng = random.Random(3)
    feed = [port(i * DT, utilisation=rng.choice((0.0, 0.3, 0.7, 0.95)), queue=rng.choice((0, 3000, 20000, 90000)),
                 marked=rng.choice((0.0, 0.01, 0.2)), drops=rng.choice((0, 0, 0, 2)), paused=None,
                 pauses_received=None, pausing=None, pauses_sent=None) for i in range(200)]
    aware, dynamic = PfcAwarePolicy(), DynamicPolicy()
    a_cur, d_cur = {KEY: START}, {KEY: START}
    for s in feed:
        a = aware.decide(s.t, {KEY: s}, a_cur)
        d = dynamic.decide(s.t, {KEY: s}, d_cur)
        assert a == d
        a_cur.update(a)
        d_cur.update(d)


def test_pfc_aware_is_a_built_in_policy_with_its_own_options():
    assert isinstance(ecn_policy.load("pfc-aware", 1500, calm_s=2.0), PfcAwarePolicy)
    with pytest.raises(UserError, match=r"pfc-aware.*no option"):
        ecn_policy.load("pfc-aware", 1500, nonsense=1)
