"""The ECN stage's queue peaks (fabric/emulation/ecn.py ``window_peak``): the marker keeps the peak
of each 10 ms slot of the monotonic clock in a ring of 64; a reader takes the peak over its own
span from the slots that fall in it. Pure, no root (the marker itself: tests/emulation/test_emulation.py)."""
from hpnlab.fabric.emulation.ecn import PEAK_SLOT_NS, PEAK_SLOTS, window_peak

MS = 1_000_000


def ring(peaks_by_slot: dict[int, int]) -> tuple[list[int], list[int]]:
    ids, peaks = [0] * PEAK_SLOTS, [0] * PEAK_SLOTS
    for slot, peak in peaks_by_slot.items():
        ids[slot % PEAK_SLOTS], peaks[slot % PEAK_SLOTS] = slot & 0xFFFFFFFF, peak
    return ids, peaks


def test_the_peak_is_the_largest_of_the_slots_in_the_span():
    ids, peaks = ring({1000: 5000, 1001: 9000, 1002: 3000})
    assert window_peak(ids, peaks, 1000 * PEAK_SLOT_NS, 1002 * PEAK_SLOT_NS + 5 * MS) == 9000


def test_slots_before_the_span_are_left_out():
    ids, peaks = ring({1000: 9000, 1005: 3000})
    assert window_peak(ids, peaks, 1003 * PEAK_SLOT_NS, 1005 * PEAK_SLOT_NS) == 3000


def test_a_slot_left_from_an_earlier_lap_of_the_ring_is_stale():
    ids, peaks = ring({1000: 9000})                 # the same index, one lap (640 ms) ago
    now = (1000 + PEAK_SLOTS) * PEAK_SLOT_NS
    assert window_peak(ids, peaks, now - 300 * MS, now) == 0


def test_a_span_longer_than_the_ring_reaches_back_only_as_far_as_the_ring():
    ids, peaks = ring({2000: 7000, 2000 + PEAK_SLOTS - 1: 100})
    now = (2000 + PEAK_SLOTS - 1) * PEAK_SLOT_NS
    assert window_peak(ids, peaks, 0, now) == 7000


def test_slot_ids_wrap_at_32_bits():
    top = (1 << 32) - 1
    ids, peaks = ring({top: 8000, top + 1: 2000})    # the id of slot 2**32 is 0
    assert window_peak(ids, peaks, top * PEAK_SLOT_NS, (top + 1) * PEAK_SLOT_NS) == 8000
