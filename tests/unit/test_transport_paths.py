"""The host-side failover rules as pure functions: scripted sends and credits in, decisions out
(which paths are dead, when to probe, where a one-path flow migrates, which plane answers),
and the bounded per-flow loss accounting with the failure-window figures made from it."""
import pytest

from hpnlab.fabric.transport import TransportError
from hpnlab.fabric.transport.accounting import BurstLog, GapLog, Largest, exactly_once, failure_windows, recovery_join_s
from hpnlab.fabric.transport.nic import interface_of, link_up
from hpnlab.fabric.transport.paths import PathParams, PathTable, ack_plane

P = PathParams(dead_rtts=4, dead_floor_s=0.005, probe_interval_s=0.05, migrate_after_rtos=2)
SRTT = 0.002          # K x srtt = 8 ms, above the 5 ms floor


def _table(planes=1, ports=4):
    return PathTable(planes, ports, P)


def test_a_path_whose_oldest_packet_in_flight_outlives_k_srtt_while_another_delivers_later_ones_is_dead():
    t = _table()
    t.on_delivered(1, sent_t=0.001, now=0.002)   # path 1 delivered what it sent after path 0's packet
    assert t.check(0.008, SRTT, {0: 0.0}) == []    # exactly K x srtt: not yet
    assert t.check(0.0081, SRTT, {0: 0.0}) == [0]
    assert t.dead_paths() == [0] and t.events[-1] == (0.0081, "dead", 0)


def test_the_dead_limit_never_goes_below_the_floor():
    assert P.dead_after(0.0001) == P.dead_floor_s
    assert P.dead_after(None) == P.dead_floor_s
    assert P.dead_after(SRTT) == 4 * SRTT


def test_a_silent_path_is_not_dead_when_the_others_delivered_only_older_packets():
    t = _table()
    t.on_delivered(1, sent_t=0.001, now=0.003)   # sent before path 0's oldest packet in flight
    assert t.check(1.0, SRTT, {0: 0.002}) == []


def test_when_everything_is_silent_nothing_is_declared_dead():
    t = _table()
    assert t.check(1.0, SRTT, dict.fromkeys(range(4), 0.0)) == []
    assert t.live_paths() == [0, 1, 2, 3]


def test_a_path_that_delivered_after_its_oldest_packet_in_flight_is_not_dead():
    t = _table()
    t.on_delivered(0, sent_t=0.003, now=0.004)
    t.on_delivered(1, sent_t=0.005, now=0.006)
    assert t.check(1.0, SRTT, {0: 0.002}) == []     # a lost packet, not a dead path (NACK, RTO)


def test_the_last_live_path_is_never_killed():
    t = _table(ports=2)
    assert t.kill(0, 1.0)
    assert not t.kill(1, 1.0)
    assert t.live_paths() == [1]


def test_a_late_packet_sent_before_the_path_died_does_not_bring_it_back():
    t = _table(ports=2)
    t.kill(0, 1.0)
    assert t.on_delivered(0, sent_t=0.999, now=1.001) is False
    assert not t.live(0)


def test_a_dead_path_is_probed_at_once_then_once_per_interval_and_a_probe_that_arrives_brings_it_back():
    t = _table()
    t.on_delivered(1, sent_t=0.001, now=0.002)
    t.check(0.01, SRTT, {0: 0.0})
    assert t.probes_due(0.01) == [0]
    assert t.probes_due(0.01 + 0.049) == []
    assert t.probes_due(0.061) == [0]
    assert t.probes_due(0.07) == []              # the probe clock restarted
    assert t.next_probe() == pytest.approx(0.111)
    assert t.on_delivered(0, sent_t=0.061, now=0.062) is True
    assert t.live(0) and t.events[-1] == (0.062, "alive", 0)
    assert t.next_probe() is None


def test_a_plane_is_dead_when_every_path_of_it_is():
    t = _table(planes=2, ports=2)
    t.kill(2, 0.0)
    assert t.dead_planes() == set()
    t.kill(3, 0.0)
    assert t.dead_planes() == {1}


def test_a_nic_port_that_cannot_send_takes_its_whole_plane_out_but_never_the_last_one():
    t = _table(planes=2, ports=2)
    assert t.kill_plane(0, 1.0) == [0, 1]
    assert t.events[-1] == (1.0, "plane_down", 0)
    assert t.kill_plane(1, 1.0) == []            # plane 1 is all that is left
    assert t.live_paths() == [2, 3]


def test_migration_moves_to_another_plane_and_source_port():
    t = _table(planes=2, ports=4)
    target = t.migration_target(1)
    assert t.plane_of(target) == 1 and target != 1 + 4


def test_migration_skips_dead_paths_and_stays_on_the_plane_when_there_is_one():
    t = _table(planes=1, ports=3)
    t.kill(1, 0.0)
    assert t.migration_target(0) == 2


def test_a_single_path_migrates_to_itself_and_the_transport_gives_it_a_new_port():
    assert _table(planes=1, ports=1).migration_target(0) == 0


@pytest.mark.parametrize("bad", [dict(dead_rtts=0), dict(dead_floor_s=-1), dict(probe_interval_s=0),
                                 dict(migrate_after_rtos=0)])
def test_nonsense_path_rules_are_refused(bad):
    with pytest.raises(TransportError):
        PathParams(**bad)


# ---- which plane answers (ACK, NACK, CNP) ---------------------------------------------------

def test_answers_stay_on_the_current_plane_while_it_delivers():
    assert ack_plane([1.009, 1.01], set(), [0.0, 0.0], current=0, now=1.012, fresh_s=0.02) == 0


def test_answers_leave_a_plane_this_rank_finds_dead_for_sending_even_if_data_came_last_on_it():
    assert ack_plane([1.0, 1.01], {1}, [0.0, 0.0], current=1, now=1.012, fresh_s=0.02) == 0


def test_answers_leave_a_plane_whose_acks_seem_lost():
    assert ack_plane([1.0, 1.01], set(), [0.0, 2.0], current=1, now=1.012, fresh_s=0.02) == 0


def test_answers_move_to_the_plane_that_delivered_last_when_the_current_one_went_quiet():
    assert ack_plane([1.0, 1.5], set(), [0.0, 0.0], current=0, now=1.51, fresh_s=0.02) == 1


def test_with_no_fresh_plane_answers_go_where_data_came_last_unless_that_plane_is_dead():
    assert ack_plane([1.0, 2.0], set(), [0.0, 0.0], current=0, now=9.0, fresh_s=0.02) == 1
    assert ack_plane([1.0, 2.0], {1}, [0.0, 0.0], current=1, now=9.0, fresh_s=0.02) == 0


# ---- bounded accounting and the loss window ---------------------------------------------------

def test_largest_keeps_the_n_largest_in_the_order_they_came():
    keep = Largest(3)
    for key in [5, 1, 9, 2, 7, 3]:
        keep.add(key, key)
    assert keep.items() == [5, 9, 7]


def test_gap_log_keeps_only_gaps_above_the_threshold_and_marks_stalls():
    g = GapLog(threshold_s=0.002, max_gaps=4)
    for t, psn, busy in [(1.000, 0, False), (1.001, 1, True), (1.010, 2, True), (1.011, 3, False),
                         (2.0, 4, False)]:
        g.arrival(t, psn, busy)
    assert g.export(100.0) == [[101.001, 101.010, 1, 2, True], [101.011, 102.0, 3, 4, False]]


def test_gap_log_memory_is_bounded_whatever_the_run_length():
    g = GapLog(threshold_s=0.001, max_gaps=5)
    for i in range(10_000):
        g.arrival(i * 0.01 + (0.5 if i == 777 else 0.0), i, True)
    kept = g.export(0.0)
    assert len(kept) == 5
    assert max(b - a for a, b, *_ in kept) == pytest.approx(0.51)


def test_retransmissions_close_in_time_form_one_burst_with_their_reasons():
    b = BurstLog(join_s=0.02, max_bursts=8)
    for t, why in [(1.0, "failover"), (1.01, "failover"), (1.02, "nack"), (2.0, "timeout")]:
        b.retx(t, why)
    assert b.export(0.0) == [[1.0, 1.02, 3, {"failover": 2, "nack": 1}], [2.0, 2.0, 1, {"timeout": 1}]]


def _flow(**over):
    f = {"src": 0, "dst": 1, "app_bytes_sent": 100, "app_bytes_delivered": 100, "app_crc_sent": "0badf00d",
         "app_crc_delivered": "0badf00d", "gaps": [[9.0, 9.5, 1, 2, False], [10.02, 10.05, 7, 8, True]],
         "retx_bursts": [[10.03, 10.04, 6, {"failover": 6}], [50.0, 50.0, 1, {"nack": 1}]],
         "slowest_msgs": [[9.9, 10.2, 100]]}
    f.update(over)
    return f


def test_failure_window_is_the_stall_containing_the_event_with_its_cost():
    [w] = failure_windows([_flow()], [("link_down", 10.03)])
    assert w["loss_window_s"] == pytest.approx(0.03)
    assert (w["last_before"], w["first_after"]) == (10.02, 10.05)
    assert w["packets_lost"] == 6 and w["resent_by_cause"] == {"failover": 6}
    assert w["completion_s"] == pytest.approx(0.3)
    assert w["exactly_once"] is True


def test_a_stall_that_starts_just_after_the_event_is_its_loss_window():
    [w] = failure_windows([_flow()], [("link_down", 10.0)], horizon_s=0.5)
    assert (w["last_before"], w["first_after"]) == (10.02, 10.05)


def test_an_idle_gap_is_not_a_loss_window():
    [w] = failure_windows([_flow(gaps=[[9.0, 9.5, 1, 2, False]], retx_bursts=[])], [("link_down", 9.2)])
    assert w["loss_window_s"] == 0.0 and w["packets_lost"] == 0


def test_a_flow_that_re_sent_nothing_near_the_event_was_not_hurt_by_it():
    """A pause of a few ms that any flow has is no loss window, even at the failure's time."""
    [w] = failure_windows([_flow(retx_bursts=[[50.0, 50.0, 1, {"nack": 1}]])], [("link_down", 10.03)])
    assert w["loss_window_s"] == 0.0 and w["packets_lost"] == 0


def test_a_gray_failure_s_loss_window_is_the_largest_stall_of_the_flow_s_recovery():
    """Packets dropped silently on one path while the others deliver: the flow pauses a little
    at once, then stalls once its window is spent, until its re-sends get through."""
    gaps = [[10.001, 10.006, 5, 6, True], [10.04, 10.10, 40, 12, True], [10.3, 10.35, 90, 91, True]]
    bursts = [[10.02, 10.02, 1, {"nack": 1}], [10.09, 10.12, 6, {"timeout": 1, "nack": 5}]]
    [w] = failure_windows([_flow(gaps=gaps, retx_bursts=bursts)], [("link_drop", 10.0)])
    assert (w["last_before"], w["first_after"]) == (10.04, 10.10)
    assert w["packets_lost"] == 7


def test_a_stall_after_the_flow_s_recovery_is_not_the_failure_s():
    gaps = [[10.001, 10.006, 5, 6, True], [10.3, 10.5, 90, 91, True]]
    [w] = failure_windows([_flow(gaps=gaps, retx_bursts=[[10.002, 10.002, 1, {"nack": 1}]])], [("link_down", 10.0)])
    assert (w["last_before"], w["first_after"]) == (10.001, 10.006)


def test_the_repair_s_re_sends_do_not_count_for_the_failure_before_it():
    bursts = [[10.002, 10.002, 1, {"nack": 1}], [11.01, 11.02, 4, {"nack": 4}]]
    gaps = [[10.001, 10.006, 5, 6, True], [11.0, 11.3, 90, 91, True]]
    down, up = failure_windows([_flow(gaps=gaps, retx_bursts=bursts)], [("link_down", 10.0), ("link_up", 11.0)])
    assert down["packets_lost"] == 1 and down["loss_window_s"] == pytest.approx(0.005)
    assert up["packets_lost"] == 4 and up["loss_window_s"] == pytest.approx(0.3)


def test_a_re_send_long_after_the_failure_s_recovery_is_not_the_failure_s():
    """A flow that re-sends one reordered packet half a second after the failure, having re-sent
    nothing before, was not hurt by it: its largest gap until then is no loss window."""
    gaps = [[10.001, 10.006, 5, 6, True], [10.45, 10.47, 90, 91, True]]
    [w] = failure_windows([_flow(gaps=gaps, retx_bursts=[[10.5, 10.5, 1, {"nack": 1}]])], [("link_down", 10.0)])
    assert w["loss_window_s"] == 0.0 and w["packets_lost"] == 0


def test_re_sends_that_follow_each_other_within_the_join_are_one_recovery():
    """Timer-paced rounds (a gray failure, a dead plane) stay one recovery; the largest gap of it counts."""
    gaps = [[10.001, 10.006, 5, 6, True], [10.30, 10.45, 90, 91, True]]
    bursts = [[10.1, 10.1, 1, {"timeout": 1}], [10.3, 10.3, 1, {"timeout": 1}], [10.5, 10.5, 1, {"timeout": 1}],
              [11.5, 11.5, 1, {"nack": 1}]]
    [w] = failure_windows([_flow(gaps=gaps, retx_bursts=bursts)], [("link_drop", 10.0)], horizon_s=5.0)
    assert w["packets_lost"] == 3 and w["loss_window_s"] == pytest.approx(0.15)


def test_the_join_is_two_and_a_half_of_the_runs_longest_retransmission_timeouts():
    assert recovery_join_s(0.1) == pytest.approx(0.25)
    assert recovery_join_s(1.0) == pytest.approx(2.5)
    assert recovery_join_s(None) == pytest.approx(0.25) and recovery_join_s(0) == pytest.approx(0.25)


def test_a_recovery_paced_by_a_timer_backed_off_to_one_second_stays_one_recovery_where_the_run_allows_it():
    """Without host-side failover the roce timer backs off to 1 s: its rounds 0.2, 0.4 and 0.8 s
    apart are one recovery, and the stall before the last one is its loss window."""
    gaps = [[10.001, 10.006, 5, 6, True], [10.7, 11.5, 90, 91, True]]
    bursts = [[10.1, 10.1, 1, {"timeout": 1}], [10.3, 10.3, 1, {"timeout": 1}], [10.7, 10.7, 1, {"timeout": 1}],
              [11.5, 11.5, 1, {"timeout": 1}]]
    flow = _flow(gaps=gaps, retx_bursts=bursts)
    [cut] = failure_windows([flow], [("link_down", 10.0)], horizon_s=5.0, join_s=recovery_join_s(0.1))
    [whole] = failure_windows([flow], [("link_down", 10.0)], horizon_s=5.0, join_s=recovery_join_s(1.0))
    assert cut["packets_lost"] == 2 and cut["loss_window_s"] == pytest.approx(0.005)   # cut at the 0.4 s round
    assert whole["packets_lost"] == 4 and whole["loss_window_s"] == pytest.approx(0.8)


def test_a_boundary_ends_an_event_s_figures_without_figures_of_its_own():
    bursts = [[10.002, 10.002, 1, {"nack": 1}], [10.31, 10.32, 4, {"nack": 4}]]
    gaps = [[10.001, 10.006, 5, 6, True], [10.30, 10.40, 90, 91, True]]
    [w] = failure_windows([_flow(gaps=gaps, retx_bursts=bursts)], [("link_down", 10.0)], boundaries=[10.2])
    assert w["packets_lost"] == 1 and w["loss_window_s"] == pytest.approx(0.005)


@pytest.mark.parametrize("over", [dict(app_bytes_delivered=99), dict(app_crc_delivered="deadbeef")])
def test_a_byte_missing_or_corrupted_breaks_exactly_once(over):
    assert exactly_once(_flow(**over)) is False


def test_exactly_once_is_unknown_without_both_ends():
    assert exactly_once({"src": 0, "dst": 1, "app_bytes_sent": 5}) is None


def test_the_in_order_stall_is_reported_beside_the_loss_window():
    [w] = failure_windows([_flow(hol_gaps=[[10.01, 10.06, 6, 7, True]])], [("link_down", 10.03)])
    assert w["stall_s"] == pytest.approx(0.05) and w["loss_window_s"] == pytest.approx(0.03)


def test_a_timeout_on_a_path_kills_it_when_another_delivered_a_packet_sent_shortly_before():
    t = _table()
    t.on_delivered(1, sent_t=0.999, now=1.001)      # the message's other packets got through
    assert t.on_timeout(0, sent_t=1.0, now=1.04, srtt=SRTT) is True
    assert t.dead_paths() == [0]


def test_a_timeout_kills_nothing_when_the_other_paths_are_quiet_too():
    t = _table()
    t.on_delivered(1, sent_t=0.5, now=0.501)        # long before: no evidence they still work
    assert t.on_timeout(0, sent_t=1.0, now=1.04, srtt=SRTT) is False
    assert t.live_paths() == [0, 1, 2, 3]


# ---- the NIC port of a plane (reads the kernel's view; no root) -------------------------------

def test_the_loopback_address_belongs_to_lo_and_lo_is_up():
    assert interface_of("127.0.0.1") == "lo"
    assert link_up("lo") is True


def test_an_address_no_interface_owns_is_not_watched_and_an_unknown_port_has_no_state():
    assert interface_of("127.0.0.2") is None
    assert link_up("no-such-port0") is None


def test_a_silent_tail_packet_kills_its_path_when_another_delivered_a_packet_sent_shortly_before():
    t = _table()
    t.on_delivered(1, sent_t=0.999, now=1.001)      # the message's other packets got through
    assert t.check(1.0081, SRTT, {0: 1.0}, last_sent=1.0) == [0]


def test_a_silent_packet_that_is_not_the_tail_needs_a_later_delivery():
    t = _table()
    t.on_delivered(1, sent_t=0.999, now=1.001)
    assert t.check(1.0081, SRTT, {0: 1.0}, last_sent=1.0005) == []   # path 2 holds a later one


def test_answers_follow_a_sender_that_stopped_using_the_current_plane_within_the_hysteresis():
    assert ack_plane([1.005, 1.0], set(), [0.0, 0.0], current=1, now=1.006, fresh_s=0.02,
                     hysteresis_s=0.002) == 0
    assert ack_plane([1.0015, 1.0], set(), [0.0, 0.0], current=1, now=1.002, fresh_s=0.02,
                     hysteresis_s=0.002) == 1     # spraying: the planes alternate, answers stay


# ---- which packet a path is judged by (PathTable.silent) -------------------------------

def test_a_path_is_judged_by_its_second_silent_packet_so_one_queue_drop_does_not_condemn_it():
    t = _table()
    t.on_delivered(1, sent_t=0.0007, now=0.002)
    since, _ = t.silent([(0, 0.0005), (1, 0.0011), (1, 0.0012)])
    assert 0 not in since                           # one overdue packet: a drop, not a death
    since, _ = t.silent([(0, 0.0005), (0, 0.0009), (1, 0.0012)])
    assert since[0] == 0.0009                       # two: the second one's age counts
    assert t.check(0.0009 + 0.008 + 1e-4, SRTT, since) == []   # no other path delivered after it
    t.on_delivered(2, sent_t=0.001, now=0.003)
    assert t.check(0.0009 + 0.008 + 1e-4, SRTT, since) == [0]


def test_packets_a_path_already_delivered_past_do_not_count_as_silent():
    t = _table()
    t.on_delivered(0, sent_t=0.002, now=0.003)
    since, last = t.silent([(0, 0.001), (0, 0.0015), (0, 0.003), (0, 0.004)])
    assert since == {0: 0.004} and last == 0.004     # 0.003 and 0.004 are silent: the second


def test_a_lone_silent_packet_that_is_the_flows_newest_is_judged_as_a_message_tail():
    t = _table()
    since, last = t.silent([(1, 0.001), (0, 0.002)])
    assert since == {0: 0.002} and last == 0.002     # path 1's lone packet is not the newest


def test_judging_by_the_first_silent_packet_is_one_setting_away():
    t = PathTable(1, 4, PathParams(dead_losses=1))
    since, _ = t.silent([(0, 0.0005), (0, 0.0009), (1, 0.0012)])
    assert since == {0: 0.0005, 1: 0.0012}


def test_dead_losses_below_one_is_refused():
    with pytest.raises(TransportError, match="dead_losses"):
        PathParams(dead_losses=0)


def test_a_flows_only_silent_packet_counts_when_the_flow_can_send_nothing_more_to_follow_it():
    t = _table()
    for path in (1, 2):
        t.on_delivered(path, sent_t=0.0012, now=0.003)
    sends = [(0, 0.0005), (1, 0.0011), (2, 0.0012)]     # paths 1 and 2: delivered past these
    assert t.silent(sends, more_coming=True)[0] == {}
    assert t.silent(sends, more_coming=False)[0] == {0: 0.0005}   # window full or data all sent


def test_a_lone_silent_packet_among_others_still_in_flight_waits_for_a_second():
    t = _table()
    sends = [(0, 0.0005), (1, 0.0011), (1, 0.0012), (2, 0.0013)]   # a queue still holds 1 and 2
    assert 0 not in t.silent(sends, more_coming=False)[0]


def test_each_path_keeps_its_own_rtt_estimate_and_timeout():
    t = PathTable(1, 2)
    assert t.rto(0) is None
    for _ in range(20):
        t.on_rtt(0, 0.010)
        t.on_rtt(1, 0.060)
    assert t.rto(0) == pytest.approx(0.010, rel=0.05)       # steady: srtt, and rttvar decays toward 0
    assert t.rto(1) == pytest.approx(0.060, rel=0.05)
    t.on_rtt(0, 0.030)                  # a jump: srtt 0.0125, rttvar ~ a quarter of the 0.020 jump
    assert t.rto(0) == pytest.approx(0.0125 + 4 * 0.005, rel=0.02)
    assert t.rto(1) == pytest.approx(0.060, rel=0.05)          # the other path's is its own
