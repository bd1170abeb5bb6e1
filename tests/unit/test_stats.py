"""Repeated measurements as one spread everywhere (hpnlab.fabric.stats)."""
from __future__ import annotations

import math

from hpnlab.fabric.stats import median_of, median_range, spread, spread_text


def test_a_spread_gives_median_quartiles_range_and_count_of_the_values_that_exist():
    s = spread([5.0, 1.0, 3.0, None, 9.0, 7.0, math.nan])
    assert s == {"n": 5, "median": 5.0, "min": 1.0, "q1": 3.0, "q3": 7.0, "max": 9.0}


def test_a_spread_of_nothing_still_answers_its_count():
    assert spread([]) == spread([None, math.nan]) == {"n": 0}
    assert median_of(spread([])) is None and median_of(None) is None


def test_a_spread_prints_as_median_min_max_scaled_with_its_unit():
    assert spread_text(spread([3.0, 1.0, 2.0]), "{:.1f}", scale=10, unit=" ms") == "20.0 ms [10.0-30.0]"
    assert median_range([0.5, 0.25, 1.0], "{:.2f}") == "0.50 [0.25-1.00]"


def test_a_spread_with_no_value_prints_as_a_dash_whatever_its_shape():
    assert spread_text(spread([None])) == spread_text(None) == "-"
    assert spread_text({"mean": None, "min": None, "max": None, "n": 0}, centre="mean") == "-"
