"""ECN policies (controller/ecn_policy.py) on synthetic telemetry: direction, bounds, damping, settling."""
from __future__ import annotations

import itertools

import pytest
from support.paths import EXAMPLES

from hpnlab.controller import ecn_policy
from hpnlab.controller.ecn_policy import DynamicPolicy, StaticPolicy, Thresholds
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing.telemetry import PortTelemetry
from hpnlab.fabric.workload.ecn import default_thresholds

RATE = 10e6
KEY = ("p0l0", 1)
START = default_thresholds(RATE)
DT = 0.2


def port(t: float, utilisation: float = 0.0, queue: int = 0, marked: float = 0.0, drops: int = 0,
         fan_in: int = 1) -> PortTelemetry:
    return PortTelemetry(t=t, rate_bps=RATE, tx_bps=utilisation * RATE, utilisation=utilisation, queue_bytes=queue,
                         ce_marked_pps=marked * 800, ce_fraction=marked, drops=drops, fan_in=fan_in)


def run(policy, telemetry, steps: int, start: Thresholds = START) -> list[Thresholds]:
    """Feed ``telemetry(t, thresholds)`` for ``steps`` intervals; the thresholds after each."""
    current = {KEY: start}
    seen = []
    for i in range(steps):
        t = i * DT
        current.update(ecn_policy.changes(current, policy.decide(t, {KEY: telemetry(t, current[KEY])}, current)))
        seen.append(current[KEY])
    return seen


PRESSURE = DynamicPolicy().pressure_bytes(RATE)       # half the emulated port buffer


def incast(t, th):
    """Many senders converge and their burst reaches the pressure mark."""
    return port(t, utilisation=0.6, queue=PRESSURE + 3000, marked=0.4, fan_in=6)


def underused_marking(t, th):
    return port(t, utilisation=0.4, queue=th.kmin + 500, marked=0.05, fan_in=1)


def test_incast_lowers_kmin_and_raises_pmax():
    after = run(DynamicPolicy(), incast, 3)[-1]
    assert after.kmin < START.kmin
    assert after.pmax > START.pmax


def test_drops_count_as_pressure():
    after = run(DynamicPolicy(), lambda t, th: port(t, utilisation=0.9, queue=0, drops=4, fan_in=3), 3)[-1]
    assert after.kmin < START.kmin


def test_a_cut_under_fan_in_is_logged_as_an_incast_even_when_the_fan_in_came_an_interval_earlier():
    policy = DynamicPolicy()
    current = {KEY: START}
    current.update(policy.decide(0.0, {KEY: port(0.0, utilisation=0.04, fan_in=5)}, current))   # senders start
    burst = port(0.2, utilisation=1.0, queue=PRESSURE, marked=0.8, fan_in=0)                    # their burst
    cut = policy.decide(0.2, {KEY: burst}, current)[KEY]
    assert cut.kmin < START.kmin and cut.reason.startswith("incast")


def test_the_last_bursts_queue_on_an_idle_port_is_no_pressure():
    """The stage's queue is the backlog its last packet left: an idle port keeps showing its last peak."""
    seen = run(DynamicPolicy(), lambda t, th: port(t, utilisation=0.0, queue=PRESSURE + 3000, fan_in=4), 20)
    assert set(seen) == {START}


def test_a_burst_between_two_ticks_is_pressure_though_the_queue_at_the_tick_is_empty():
    def burst(t, th):
        return PortTelemetry(t=t, rate_bps=RATE, tx_bps=0.6 * RATE, utilisation=0.6, queue_bytes=0,
                             queue_peak_bytes=PRESSURE + 3000, ce_marked_pps=300, ce_fraction=0.4, fan_in=6)
    assert run(DynamicPolicy(), burst, 3)[-1].kmin < START.kmin


def test_a_quiet_interval_is_no_pressure_though_the_last_packet_left_a_deep_queue():
    def quiet(t, th):
        return PortTelemetry(t=t, rate_bps=RATE, tx_bps=0.3 * RATE, utilisation=0.3, queue_bytes=PRESSURE + 3000,
                             queue_peak_bytes=2 * 1514, fan_in=1)
    assert all(th.kmin >= START.kmin for th in run(DynamicPolicy(), quiet, 5))


def test_a_busy_port_keeps_its_thresholds_since_a_higher_kmin_would_only_add_queue():
    seen = run(DynamicPolicy(), lambda t, th: port(t, utilisation=0.98, queue=th.kmin + 1514, marked=0.05,
                                                    fan_in=1), 10)
    assert set(seen) == {START}


def test_low_utilisation_while_marking_raises_kmin_and_lowers_pmax():
    after = run(DynamicPolicy(), underused_marking, 3)[-1]
    assert after.kmin > START.kmin
    assert after.pmax < START.pmax


def test_an_incast_burst_the_buffer_holds_raises_kmin_above_it():
    """Marks on a burst that drains by itself only slow its senders down."""
    seen = run(DynamicPolicy(), lambda t, th: port(t, utilisation=0.3, queue=12000, marked=0.1 if th.kmin < 12000
                                                    else 0.0, fan_in=4), 20)
    assert seen[-1].kmin >= 12000


def test_the_interval_after_a_burst_changes_nothing_before_the_port_has_been_idle_for_relax_s():
    policy = DynamicPolicy()
    current = {KEY: START}
    burst = port(0.0, utilisation=0.5, queue=0, marked=0.3, fan_in=1)
    after = port(0.2, utilisation=0.0, queue=0, marked=0.0, fan_in=0)        # the average still marks
    current.update(policy.decide(0.0, {KEY: burst}, current))
    raised = current[KEY]
    current.update(policy.decide(1.0, {KEY: after}, current))
    assert current[KEY] == raised


@pytest.mark.parametrize("feed", [incast, underused_marking], ids=["incast", "underused-marking"])
def test_thresholds_stay_within_bounds_and_keep_the_marking_shape(feed):
    policy = DynamicPolicy()
    lo, hi = policy.kmin_bounds(RATE)
    for th in run(policy, feed, 200):
        assert lo <= th.kmin <= hi
        assert th.kmax == int(th.kmin * policy.p["kmax_ratio"])
        assert policy.p["pmax_min"] <= th.pmax <= policy.p["pmax_max"]
    assert th.kmin in (lo, hi)        # a steady push ends at the bound, not past it


def test_the_bounds_span_the_low_and_high_presets():
    from hpnlab.fabric.workload.ecn import preset
    lo, hi = DynamicPolicy(mtu=4096).kmin_bounds(33e6)
    assert (lo, hi) == (preset("low", 33, 4096).kmin, preset("high", 33, 4096).kmin)


@pytest.mark.parametrize("feed", [incast, underused_marking], ids=["incast", "underused-marking"])
def test_a_steady_push_settles_at_its_bound_and_moves_one_way_only(feed):
    seen = [th.kmin for th in run(DynamicPolicy(), feed, 200)]
    steps = [b - a for a, b in itertools.pairwise(seen) if b != a]
    assert steps and (all(s < 0 for s in steps) or all(s > 0 for s in steps))
    assert len(set(seen[-100:])) == 1


def test_a_closed_loop_settles_where_marking_stops_without_oscillating():
    """A port whose queue stands at 9 kB, under-used: marks stop once Kmin passes the queue."""
    def plant(t, th):
        return port(t, utilisation=0.5, queue=9000, marked=0.1 if th.kmin < 9000 else 0.0)
    seen = [th.kmin for th in run(DynamicPolicy(), plant, 100)]
    assert seen[-1] >= 9000
    assert len(set(seen[-60:])) == 1
    assert seen == sorted(seen)


def test_input_in_the_dead_band_changes_nothing():
    seen = run(DynamicPolicy(), lambda t, th: port(t, utilisation=0.5, queue=th.kmin // 2, marked=0.0, fan_in=3), 50)
    assert set(seen) == {START}


def _change_times(seen: list[Thresholds]) -> list[float]:
    return [i * DT for i, (a, b) in enumerate(zip([START, *seen], seen, strict=False)) if a != b]


def test_a_cut_comes_every_interval_under_pressure():
    times = _change_times(run(DynamicPolicy(), incast, 3))
    assert times == pytest.approx([0.0, 0.2, 0.4])


def test_a_rise_comes_at_most_once_per_hold_time():
    marking = lambda t, th: port(t, utilisation=0.4, marked=0.05)       # noqa: E731 (a feed)
    times = _change_times(run(DynamicPolicy(hold_up_s=1.0, kmin_max_ms=1000), marking, 26))   # 5 s
    assert times[:3] == pytest.approx([0.0, 1.0, 2.0])
    assert all(b - a >= 1.0 - 1e-9 for a, b in itertools.pairwise(times))


def test_a_rise_right_after_a_cut_waits_twice_the_hold_time():
    policy = DynamicPolicy(hold_up_s=0.6)
    current = {KEY: START}
    current.update(policy.decide(0.0, {KEY: incast(0.0, START)}, current))
    lowered = current[KEY]
    assert lowered.kmin < START.kmin
    for t in (0.8, 1.0):                          # past one hold time, within two
        assert policy.decide(t, {KEY: underused_marking(t, lowered)}, current) == {}
    assert policy.decide(1.4, {KEY: underused_marking(1.4, lowered)}, current)[KEY].kmin > lowered.kmin


def test_input_that_keeps_pushing_both_ways_is_followed_upwards_ever_more_slowly_and_downwards_at_once():
    hold = 0.6
    policy = DynamicPolicy(hold_up_s=hold)

    def flipping(t, th):        # incast and under-used marking take turns every second
        return incast(t, th) if int(t) % 2 == 0 else underused_marking(t, th)
    seen = run(policy, flipping, 300)                     # 60 s
    moves = [(i * DT, 1 if b.kmin > a.kmin else -1) for i, (a, b) in enumerate(itertools.pairwise([START, *seen]))
             if a.kmin != b.kmin]
    rise_waits = [t1 - t0 for (t0, d0), (t1, d1) in itertools.pairwise(moves) if d0 < 0 < d1]
    cut_waits = [t1 - t0 for (t0, d0), (t1, d1) in itertools.pairwise(moves) if d0 > 0 > d1]
    assert len(rise_waits) >= 3
    assert rise_waits == sorted(rise_waits)
    assert rise_waits[0] >= 2 * hold - 1e-9 and rise_waits[-1] >= 16 * hold - 1e-9
    assert max(cut_waits) <= 1.0 + 1e-9             # a cut waits for the incast only, never for the back-off


def test_an_idle_port_returns_to_its_start_up_thresholds_and_stays():
    policy = DynamicPolicy(relax_s=1.0)
    lowered = run(policy, incast, 30)[-1]
    assert lowered.kmin < START.kmin
    current = {KEY: lowered}
    seen = []
    for i in range(30, 150):
        t = i * DT
        current.update(policy.decide(t, {KEY: port(t)}, current))
        seen.append(current[KEY])
    assert seen[-1] == START
    assert len(set(seen[-40:])) == 1


def test_ports_are_tuned_independently():
    policy = DynamicPolicy()
    other = ("p0l1", 2)
    current = {KEY: START, other: START}
    for i in range(5):
        t = i * DT
        ports = {KEY: incast(t, current[KEY]), other: underused_marking(t, current[other])}
        current.update(policy.decide(t, ports, current))
    assert current[KEY].kmin < START.kmin < current[other].kmin


def test_static_never_changes_anything():
    feeds = [incast, underused_marking, lambda t, th: port(t)]
    for feed in feeds:
        assert set(run(StaticPolicy(), feed, 50)) == {START}


def test_changes_keeps_only_differences():
    a, b = Thresholds(1, 4, 0.2), Thresholds(2, 8, 0.2)
    assert ecn_policy.changes({KEY: a}, {KEY: Thresholds(1, 4, 0.2, reason="same")}) == {}
    assert ecn_policy.changes({KEY: a}, {KEY: b}) == {KEY: b}


# ---- naming a policy ----------------------------------------------------------------------------------------

def test_a_policy_in_a_file_is_loaded_by_path(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text("from hpnlab.controller.ecn_policy import EcnPolicy\n"
                 "class Mine(EcnPolicy):\n    name = 'mine'\n")
    assert ecn_policy.load(str(f)).name == "mine"
    assert ecn_policy.load(f"{f}:Mine").name == "mine"


def test_a_policy_file_may_use_dataclasses(tmp_path):
    # a dataclass looks its module up in sys.modules while the file is being executed
    f = tmp_path / "with_state.py"
    f.write_text("from __future__ import annotations\nfrom dataclasses import dataclass\n"
                 "from hpnlab.controller.ecn_policy import EcnPolicy\n"
                 "@dataclass\nclass State:\n    kmin: int = 0\n"
                 "class WithState(EcnPolicy):\n    name = 'with-state'\n")
    assert ecn_policy.load(str(f)).name == "with-state"


def test_a_policy_is_loaded_as_module_colon_class():
    assert isinstance(ecn_policy.load("hpnlab.controller.ecn_policy:DynamicPolicy"), DynamicPolicy)


@pytest.mark.parametrize("name, message", [
    ("nonesuch", "unknown ECN policy"),
    ("/no/such/file.py", "does not exist"),
    ("hpnlab.controller.ecn_policy:Thresholds", "not an EcnPolicy"),
    ("no_such_module_x:Policy", "cannot import"),
])
def test_a_bad_policy_name_is_one_line(name, message):
    with pytest.raises(UserError, match=message):
        ecn_policy.load(name)


def test_an_unknown_option_of_the_dynamic_policy_is_one_line():
    with pytest.raises(UserError, match="no option"):
        DynamicPolicy(speed=3)


@pytest.mark.parametrize("argv, needle", [
    (["--ecn-policy", "nonesuch"], "unknown ECN policy"),
    (["--ecn-actuator", "sonic"], "--ecn-actuator"),
    (["--ecn-policy", "dynamic", "--telemetry-interval-ms", "0"], "needs telemetry"),
    (["--telemetry-interval-ms", "-5"], ">= 0"),
    (["--telemetry-out", "/no/such/dir/tel.jsonl"], "does not exist"),
])
def test_the_controller_refuses_bad_ecn_flags_in_one_line(argv, needle, capsys):
    from hpnlab.controller.__main__ import main
    assert main(["mini-hpn", "--ofp-port", "6699", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_the_pressure_variants_in_the_examples_move_only_the_pressure_mark():
    path = EXAMPLES / "ecn_pressure_variants.py"
    drops, late = (ecn_policy.load(f"{path}:{cls}", mtu=1500) for cls in ("DropsOnly", "LatePressure"))
    base = DynamicPolicy(mtu=1500)
    assert isinstance(drops, DynamicPolicy) and isinstance(late, DynamicPolicy)
    assert drops.pressure_bytes(10e6) > 1 << 20                    # beyond any port buffer
    assert late.pressure_bytes(10e6) == 56250                       # 45 ms at 10 Mbit/s: 90% of 50 ms
    assert base.pressure_bytes(10e6) == 31250                       # half
    for p in (drops, late):
        assert {k: v for k, v in p.p.items() if not k.startswith("pressure")} == \
               {k: v for k, v in base.p.items() if not k.startswith("pressure")}
