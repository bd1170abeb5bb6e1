"""The lossless switch model (fabric/workload/lossless.py): accounting, admission, pause, resume and
the watchdog on recorded packet sequences, both sides of every threshold."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario.spec import Lossless
from hpnlab.fabric.workload import lossless as ll

FRAME = 1514


def static(xoff: int = 10_000, headroom: int = 6_000, reserved: int = 2_000, resume: int = 3_000,
           ports: int = 3, shared: int = 100_000) -> ll.SwitchBuffer:
    return ll.SwitchBuffer(shared, None, xoff, resume, reserved, dict.fromkeys(range(1, ports + 1), headroom))


def dynamic(shared: int = 80_000, alpha: float = 0.125, headroom: int = 6_000, reserved: int = 0,
            resume: int = 1_000, ports: int = 3) -> ll.SwitchBuffer:
    return ll.SwitchBuffer(shared, alpha, 0, resume, reserved, dict.fromkeys(range(1, ports + 1), headroom))


# ---- accounting -------------------------------------------------------------------------------

def test_bytes_within_the_reserve_do_not_use_the_shared_buffer():
    state, _ = ll.replay(static(reserved=2_000), [("in", 1, 1_000), ("in", 1, 1_000)])
    assert state.shared_used == 0 and state.queue(1).bytes == 2_000


def test_only_the_part_above_the_reserve_uses_the_shared_buffer():
    state, _ = ll.replay(static(reserved=2_000), [("in", 1, 1_500), ("in", 1, 1_500)])
    assert state.shared_used == 1_000


def test_every_counter_returns_to_zero_once_every_packet_has_left():
    events = [("in", 1, 1_500)] * 8 + [("in", 2, 700)] * 3 + [("out", 1, 1_500)] * 8 + [("out", 2, 700)] * 3
    state, _ = ll.replay(static(xoff=4_000), events)
    assert state.shared_used == 0
    assert all(q.bytes == 0 and q.headroom == 0 and not q.paused for q in state.queues.values())


def test_a_departure_with_nothing_admitted_is_refused():
    with pytest.raises(ValueError, match="nothing admitted"):
        ll.replay(static(), [("out", 1, 100)])


# ---- Xoff and pause -----------------------------------------------------------------------------

def test_a_queue_reaching_a_static_xoff_pauses():
    # reserve 2000 + Xoff 10000: the shared use reaches Xoff exactly at 12000 bytes
    _, events = ll.replay(static(xoff=10_000, reserved=2_000), [("in", 1, 6_000), ("in", 1, 6_000)])
    assert events == [(1, "pause", 1, 0)]


def test_a_queue_one_byte_below_a_static_xoff_does_not_pause():
    _, events = ll.replay(static(xoff=10_000, reserved=2_000), [("in", 1, 6_000), ("in", 1, 5_999)])
    assert events == []


def test_a_pause_is_asked_once_while_it_stands():
    _, events = ll.replay(static(xoff=3_000, reserved=0, headroom=50_000), [("in", 1, 3_000)] * 4)
    assert [e[1] for e in events] == ["pause"]


def test_the_dynamic_xoff_is_alpha_of_the_free_shared_buffer():
    b = dynamic(shared=80_000, alpha=0.125)
    assert b.xoff(0) == 10_000 and b.xoff(40_000) == 5_000 and b.xoff(90_000) == 0


def test_with_a_dynamic_xoff_one_port_filling_the_buffer_lowers_another_ports_threshold():
    # port 2 alone would hold 8,888 B before it pauses ((80000 - x) / 8 <= x); after port 1 took 8000 B
    # of the shared buffer it pauses at 8000: (80000 - 8000 - 8000) / 8 = 8000
    state, events = ll.replay(dynamic(), [("in", 1, 8_000), ("in", 2, 7_000)])
    assert events == [] and state.threshold() == (80_000 - 15_000) // 8
    _, events = ll.replay(dynamic(), [("in", 1, 8_000), ("in", 2, 7_000), ("in", 2, 1_000)])
    assert events == [(2, "pause", 2, 0)]


def test_bytes_beyond_xoff_go_to_the_headroom_and_pause():
    state, events = ll.replay(static(xoff=3_000, reserved=0, headroom=6_000), [("in", 1, 2_000), ("in", 1, 1_500)])
    q = state.queue(1)
    assert q.headroom == 1_500 and q.bytes == 2_000 and events == [(1, "pause", 1, 0)]


# ---- headroom drops -----------------------------------------------------------------------------

def test_a_packet_that_fits_the_headroom_is_taken():
    cfg = static(xoff=1_000, reserved=0, headroom=3_000)
    state, events = ll.replay(cfg, [("in", 1, 1_000), ("in", 1, 1_500), ("in", 1, 1_500)])
    assert state.queue(1).headroom == 3_000 and "drop" not in [e[1] for e in events]


def test_a_packet_one_byte_beyond_a_full_headroom_is_a_headroom_drop():
    cfg = static(xoff=1_000, reserved=0, headroom=3_000)
    state, events = ll.replay(cfg, [("in", 1, 1_000), ("in", 1, 1_500), ("in", 1, 1_501)])
    q = state.queue(1)
    assert events[-1] == (2, "drop", 1, 0) and q.drops == 1 and q.dropped_bytes == 1_501 and q.headroom == 1_500


def test_a_full_headroom_drops_nothing_while_the_shared_use_is_below_xoff():
    # the admission refuses only when the headroom overflows and the shared use passes Xoff (HPCC)
    cfg = static(xoff=10_000, reserved=0, headroom=1_000)
    assert ll.BufferState(cfg).admits(1, 2_000)


def test_a_dropped_packet_is_not_charged():
    cfg = static(xoff=1_000, reserved=0, headroom=1_000)
    state, _ = ll.replay(cfg, [("in", 1, 1_000), ("in", 1, 1_000), ("in", 1, 1_000)])
    assert state.queue(1).bytes + state.queue(1).headroom == 2_000


# ---- resume -------------------------------------------------------------------------------------

def _paused(cfg: ll.SwitchBuffer) -> ll.BufferState:
    state = ll.BufferState(cfg)
    state.arrive(1, 10_000)
    assert state.queue(1).paused
    return state


def test_a_queue_resumes_when_its_shared_use_is_the_offset_below_xoff():
    state = _paused(static(xoff=10_000, reserved=0, resume=3_000))
    assert state.depart(1, 3_000).resume                  # 7000 + 3000 <= 10000


def test_a_queue_one_byte_short_of_the_offset_stays_paused():
    state = _paused(static(xoff=10_000, reserved=0, resume=3_000))
    assert not state.depart(1, 2_999).resume              # 7001 + 3000 > 10000


def test_a_queue_with_bytes_in_its_headroom_stays_paused():
    state = ll.BufferState(static(xoff=2_000, reserved=0, resume=1_000, headroom=10_000))
    for _ in range(3):
        state.arrive(1, 1_000)                            # the third goes to the headroom
    assert state.queue(1).headroom == 1_000
    assert not state.depart(1, 500).resume                # the headroom empties first
    assert state.depart(1, 500).resume is False and state.queue(1).headroom == 0
    assert state.depart(1, 1_000).resume                  # 1000 + 1000 <= 2000


def test_an_empty_queue_always_resumes():
    state = _paused(static(xoff=10_000, reserved=0, resume=50_000))
    assert state.depart(1, 10_000).resume


# ---- two priorities ----------------------------------------------------------------------------

def test_priorities_of_one_port_are_accounted_apart():
    cfg = ll.SwitchBuffer(100_000, None, 3_000, 1_000, 0, {1: 5_000}, priorities=2)
    state, events = ll.replay(cfg, [("in", 1, 2_000, 0), ("in", 1, 2_000, 1), ("in", 1, 1_000, 1)])
    assert events == [(2, "pause", 1, 1)]
    assert state.queue(1, 0).bytes == 2_000 and state.queue(1, 1).bytes == 3_000


def test_a_priority_the_switch_does_not_have_is_refused():
    with pytest.raises(KeyError):
        ll.BufferState(static()).queue(1, 1)


# ---- properties --------------------------------------------------------------------------------

_sizes = st.integers(min_value=64, max_value=FRAME)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), _sizes), min_size=1, max_size=80), st.booleans())
def test_the_headroom_never_holds_more_than_its_size_and_everything_drains(arrivals, dyn):
    cfg = dynamic(headroom=4_000, reserved=1_000) if dyn else static(xoff=5_000, headroom=4_000)
    state = ll.BufferState(cfg)
    admitted = []
    for port, size in arrivals:
        if state.arrive(port, size).admitted:
            admitted.append((port, size))
        assert all(q.headroom <= cfg.headroom_bytes[p] for (p, _), q in state.queues.items())
        assert state.shared_used <= cfg.shared_bytes
    for port, size in admitted:
        state.depart(port, size)
    assert state.shared_used == 0
    assert all(q.bytes == 0 and q.headroom == 0 and not q.paused for q in state.queues.values())
    assert all(q.pauses == q.resumes for q in state.queues.values())


# ---- the watchdog -------------------------------------------------------------------------------

def test_a_pause_shorter_than_the_detection_time_is_honoured_throughout():
    w = ll.Watchdog(0.25, 0.25)
    w.on_pause(1.0)
    assert w.tick(1.249) is None and w.gate_closed(1.249)
    w.on_resume(1.249)
    assert w.tick(1.5) is None and w.storms == 0


def test_a_pause_lasting_the_detection_time_is_a_storm_and_stops_being_honoured():
    w = ll.Watchdog(0.25, 0.5)
    w.on_pause(1.0)
    assert w.tick(1.25) == "storm" and not w.gate_closed(1.25) and w.storms == 1
    assert w.tick(1.7) is None and not w.gate_closed(1.7)


def test_after_the_restoration_time_a_standing_pause_is_honoured_again_and_timed_afresh():
    w = ll.Watchdog(0.25, 0.5)
    w.on_pause(1.0)
    w.tick(1.25)
    assert w.tick(1.75) == "restored" and w.gate_closed(1.75)
    assert w.next_deadline() == 2.0
    assert w.tick(2.0) == "storm" and w.storms == 2


def test_a_watchdog_with_no_detection_time_never_fires():
    w = ll.Watchdog(0.0, 0.2)
    w.on_pause(0.0)
    assert w.tick(1e6) is None and w.gate_closed(1e6)


# ---- the settings: a named switch scaled by a stated rule ----------------------------------------

def test_a_port_brings_the_reference_switchs_buffer_per_port_in_units_of_kmax():
    ref = ll.REFERENCE
    assert ref.port_share_of_kmax == pytest.approx(12_000_000 / 32 / 200_000)
    # at 10 Mbit/s with MTU 1500 the emulation's Kmax is 4 x max(4 frames, 2 ms) = 24,224 B
    assert ll.port_share_bytes(10, 1500) == int(1.875 * 24_224)


def test_a_switchs_derived_buffer_is_the_sum_of_its_ports_shares():
    b = ll.switch_buffer(Lossless(), {1: 10, 2: 10, 3: 20}, 1500)
    assert b.shared_bytes == 2 * ll.port_share_bytes(10, 1500) + ll.port_share_bytes(20, 1500)
    assert b.alpha == 0.125 and b.reserved_bytes == 4 * FRAME and b.resume_offset_bytes == 3 * FRAME


def test_headroom_covers_the_burst_two_frames_and_the_reaction_budget_at_the_ports_rate():
    assert ll.headroom_bytes(10, 1500) == 2 * FRAME + 2 * FRAME + int(10e6 / 8 * ll.REACTION_BUDGET_S)
    assert ll.headroom_bytes(40, 1500) > ll.headroom_bytes(10, 1500)


def test_sizes_the_scenario_gives_win_over_the_derived_ones():
    b = ll.switch_buffer(Lossless(alpha=None, xoff_bytes=9_000, buffer_bytes=300_000, headroom_bytes=20_000,
                                  reserved_bytes=0, resume_offset_bytes=1_000), {1: 10, 2: 40}, 1500)
    assert (b.shared_bytes, b.alpha, b.xoff_bytes, b.reserved_bytes, b.resume_offset_bytes) == \
        (300_000, None, 9_000, 0, 1_000)
    assert set(b.headroom_bytes.values()) == {20_000}
    assert b.total_bytes == 300_000 + 2 * 20_000


def test_a_headroom_below_one_frame_is_refused_in_one_line():
    with pytest.raises(UserError, match="below one frame"):
        ll.check_sizes(ll.switch_buffer(Lossless(headroom_bytes=100), {1: 10}, 1500), 1500)


def test_the_description_names_the_sizes_in_frames():
    lines = ll.describe({"p0l0": ll.switch_buffer(Lossless(), {1: 10}, 1500)}, 1500)
    assert len(lines) == 1 and "frames" in lines[0] and "alpha 0.125" in lines[0]
