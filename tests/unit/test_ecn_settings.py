"""Static ECN settings: presets computed from the port rate, and the --ecn syntax."""
import pytest

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.workload import ecn as es
from hpnlab.fabric.workload.ecn import default_thresholds

FRAME = 1514


@pytest.mark.parametrize("rate", [1, 10, 20, 40, 1000, 100_000])
def test_default_preset_is_what_the_ecn_stage_starts_with(rate):
    th = es.preset("default", rate)
    assert th == default_thresholds(rate * 1e6)


@pytest.mark.parametrize("rate", [10, 20, 40, 1000])
def test_low_marks_before_default_and_high_after(rate):
    low, default, high = (es.preset(n, rate) for n in ("low", "default", "high"))
    assert low.kmin < default.kmin < high.kmin
    assert low.kmax < default.kmax < high.kmax


def test_presets_grow_with_the_rate_once_above_their_frame_floors():
    slow, fast = es.preset("high", 100), es.preset("high", 1000)
    assert fast.kmin == pytest.approx(10 * slow.kmin, rel=1e-6)


def test_dcqcn_at_its_own_rate_is_the_published_setting():
    th = es.preset("dcqcn", 40_000)
    assert (th.kmin, th.kmax, th.pmax) == (5_000, 200_000, 0.01)
    assert th.floored == ()


def test_dcqcn_scales_linearly_with_the_rate():
    th = es.preset("dcqcn", 400_000)
    assert (th.kmin, th.kmax) == (50_000, 2_000_000)


def test_dcqcn_scaled_below_a_frame_is_floored_to_one_frame_and_a_one_frame_ramp():
    th = es.preset("dcqcn", 10)          # scaled: 1.25 B and 50 B
    assert (th.kmin, th.kmax, th.pmax) == (FRAME, 2 * FRAME, 0.01)
    assert th.floored == ("kmin", "kmax")


def test_dcqcn_floors_only_what_is_below_a_frame():
    th = es.preset("dcqcn", 1000)        # scaled: 125 B and 5000 B
    assert th.kmin == FRAME and th.kmax == 5000
    assert th.floored == ("kmin",)


def test_frame_floor_follows_the_mtu():
    assert es.preset("dcqcn", 10, mtu=9000).kmin == 9014


def test_kmax_is_capped_at_the_port_buffer():
    th = es.preset("high", 10, buffer_bytes=30_000)
    assert th.kmax == 30_000 and th.capped == ("kmax",)
    assert es.preset("high", 10, buffer_bytes=10**9).capped == ()


def test_unknown_preset_is_one_line():
    with pytest.raises(UserError, match="unknown ECN preset 'medium'"):
        es.preset("medium", 10)


@pytest.mark.parametrize("rate", [0, -5, float("nan")])
def test_rate_must_be_positive(rate):
    with pytest.raises(UserError, match="positive"):
        es.preset("low", rate)


def test_parse_accepts_a_preset_name_in_any_case():
    assert es.parse(" DCQCN ") == "dcqcn"


def test_parse_accepts_kmin_kmax_pmax_with_size_suffixes():
    assert es.parse("3000,6K,0.5") == es.Thresholds(3000, 6144, 0.5)


@pytest.mark.parametrize("text,why", [
    ("3000,6000", "neither a preset"),
    ("abc,6000,0.1", "kmin 'abc' is not a size"),
    ("3000,6000,x", "pmax 'x' is not a number"),
    ("6000,3000,0.1", "kmin <= kmax"),
    ("3000,6000,1.5", "between 0 and 1"),
    ("-1,6000,0.1", "0 or more bytes"),
])
def test_parse_refuses_a_bad_setting_in_one_line(text, why):
    with pytest.raises(UserError, match=why) as exc:
        es.parse(text)
    assert "\n" not in str(exc.value)


def test_from_value_takes_a_dict_and_names_what_is_missing():
    assert es.from_value({"kmin": 1, "kmax": 2, "pmax": 0.1}) == es.Thresholds(1, 2, 0.1)
    with pytest.raises(UserError, match="missing pmax"):
        es.from_value({"kmin": 1, "kmax": 2})


def test_for_ports_computes_each_port_at_its_own_rate():
    per = es.for_ports("default", {"a": (10.0, 62_500), "b": (20.0, 125_000)})
    assert per["a"].kmin == default_thresholds(10e6).kmin and per["b"].kmin == default_thresholds(20e6).kmin


def test_for_ports_puts_a_user_setting_on_every_port():
    th = es.Thresholds(1, 2, 0.3)
    assert es.for_ports(th, {"a": (10.0, 1), "b": (20.0, 1)}) == {"a": th, "b": th}


def test_describe_says_what_was_floored():
    per = es.for_ports("dcqcn", {"a": (10.0, 62_500)})
    (line,) = es.describe(per, {"a": 10.0})
    assert "Kmin 1514 B" in line and "kmin floored to whole frames" in line
