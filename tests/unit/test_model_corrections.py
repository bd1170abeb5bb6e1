"""The corrections to the flow model, mechanism by mechanism (hpnlab.fabric.model.corrections)."""
from __future__ import annotations

import json
import math

import pytest

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.model import corrections as mc
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph, spec

T = mc.Transport()          # htsim_uec's defaults at 100 Gbit/s, three tiers
RATE = T.rate_bps


def lone(size: float, hops: int = 6, hop_us: float = 1.0) -> mc.StepShape:
    """One flow alone on its path, as the model times it: its payload over the rate, hops x 1 us."""
    return mc.StepShape(drain_s=size * 8 / RATE, latency_s=hops * hop_us * 1e-6, hops=hops, flow_bytes=size)


def test_no_corrections_leave_a_result_as_the_model_timed_it():
    g = graph.build(spec.load("mini-hpn"))
    r = model.run_collective(g, "all_reduce", 1 << 20, hosts=8, placement="packed")
    assert mc.correct_result(r, mc.NONE)["time_s"] == r.time_s


@pytest.mark.parametrize("size, htsim_us", [(16_000, 14.991), (1_000_000, 94.945)])
def test_headers_and_the_last_packets_round_trip_give_a_lone_flows_time_in_htsim(size, htsim_us):
    # htsim_uec 40ccb05, 128-host fat-tree, one flow host 0 -> host 127 (six hops): "finished at"
    c = mc.Corrections(transport=T)
    assert mc.step_time(lone(size), c, "ecmp") * 1e6 == pytest.approx(htsim_us, abs=0.05)


def test_the_tail_is_two_one_way_latencies_a_store_and_forward_mtu_per_switch_and_the_acks():
    assert T.tail_s(6e-6, 6) == pytest.approx(12e-6 + (5 * T.mtu_bytes + 6 * T.ack_bytes) * 8 / RATE)


def test_first_windows_meeting_on_a_link_overflow_its_queue_by_what_it_cannot_hold():
    w0 = T.window_bdp * T.bdp_bytes
    assert T.overflow_bytes(4, 10e6) == pytest.approx(3 * w0 - T.queue_bdp * T.bdp_bytes)


def test_a_flow_smaller_than_the_window_overflows_by_its_size():
    assert T.overflow_bytes(4, 100e3) == pytest.approx(max(0.0, 3 * 100e3 * T.wire - T.bdp_bytes))


@pytest.mark.parametrize("fan_in", [0.0, 1.0])
def test_one_flows_worth_or_less_on_the_busiest_link_overflows_nothing(fan_in):
    assert T.overflow_bytes(fan_in, 10e6) == 0.0


def test_a_lossless_fabric_sends_nothing_again():
    lossless = mc.Transport(lossless=True)
    assert lossless.overflow_bytes(8, 10e6) == 0.0
    c = mc.Corrections(transport=T)
    shape = mc.StepShape(1e-3, 6e-6, 6, 10e6, fan_in=8)
    assert mc.step_time(shape, mc.with_transport(c, lossless=True), "ecmp") < mc.step_time(shape, c, "ecmp")


def test_a_policys_efficiency_divides_the_drain_with_its_headers():
    shape = mc.StepShape(1e-3, 0.0, 0, 10e6, fan_in=4)
    plain = mc.Corrections(transport=T)
    slow = mc.Corrections(transport=T, policies={"ecmp": mc.Policy(efficiency=0.5)})
    assert mc.step_time(shape, slow, "ecmp") - mc.step_time(shape, plain, "ecmp") == \
        pytest.approx(shape.drain_s * T.wire)


def test_the_resent_bytes_cost_their_serialisation_times_the_policys_resend():
    shape = mc.StepShape(1e-3, 0.0, 0, 10e6, fan_in=4)
    none = mc.Corrections(transport=T, policies={"ecmp": mc.Policy(resend=0.0)})
    twice = mc.Corrections(transport=T, policies={"ecmp": mc.Policy(resend=2.0)})
    assert mc.step_time(shape, twice, "ecmp") - mc.step_time(shape, none, "ecmp") == \
        pytest.approx(2 * T.overflow_bytes(4, 10e6) * 8 / RATE)


def test_the_start_adds_base_rtts_and_the_burst_the_busiest_of_the_links_excess():
    shape = mc.StepShape(64_000 * 8 / RATE, 6e-6, 6, 64_000, links=500)
    c = mc.Corrections(transport=T, policies={"mixed": mc.Policy(start_rtts=2.0, burst=0.5)})
    extra = mc.step_time(shape, c, "mixed") - mc.step_time(shape, mc.Corrections(transport=T), "mixed")
    packets = 64_000 * T.wire / T.mtu_bytes
    excess = (2 * math.log(500) * packets) ** 0.5          # balls into bins: the busiest of 500 links
    assert extra == pytest.approx(2.0 * T.base_rtt_us * 1e-6 + 0.5 * excess * T.mtu_bytes * 8 / RATE)


def test_the_burst_grows_with_the_links_a_step_spreads_over():
    c = mc.Corrections(transport=T, policies={"mixed": mc.Policy(burst=1.0)})
    small, large = (mc.StepShape(1e-4, 6e-6, 6, 1e6, links=n) for n in (256, 2 ** 21))
    assert mc.terms(large, c, "mixed")["burst"] > mc.terms(small, c, "mixed")["burst"]


def test_a_window_larger_than_the_flow_bursts_no_more_than_the_window():
    c = mc.Corrections(transport=T, policies={"mixed": mc.Policy(burst=1.0)})
    big, bigger = lone(10e6), lone(40e6)
    assert mc.terms(big, c, "mixed")["burst"] == mc.terms(bigger, c, "mixed")["burst"]


def test_the_terms_add_up_to_the_corrected_time():
    shape = mc.StepShape(2e-4, 6e-6, 6, 1e6, fan_in=3)
    c = mc.Corrections(transport=T, policies={"ecmp": mc.Policy(start_rtts=0.3, burst=0.2, efficiency=0.9)})
    assert sum(mc.terms(shape, c, "ecmp").values()) == pytest.approx(mc.step_time(shape, c, "ecmp"))


def test_a_model_routing_takes_the_policy_of_the_mode_it_stands_for():
    c = mc.Corrections(policies={"mixed": mc.Policy(efficiency=0.8)}, routing_policy={"spray": "mixed"})
    assert c.policy("spray").efficiency == 0.8 and c.policy("flow") == mc.Policy()


def test_a_corrected_result_is_the_sum_of_its_corrected_steps():
    g = graph.build(spec.load("mini-hpn"))
    r = model.run_collective(g, "all_reduce", 1 << 20, routing="flowlet", hosts=8, placement="packed")
    assert len(r.steps) > 4
    c = mc.HTSIM_100G
    want = sum(s.multiplicity * mc.step_time(mc.shape_of(s), c, "flowlet") for s in r.steps)
    out = mc.correct_result(r, c)
    assert out["time_s"] == pytest.approx(want)
    assert out["busbw_gbs"] == pytest.approx(r.busbw_gbs * r.time_s / want)


def test_on_another_fabric_the_transport_takes_its_rate_and_its_longest_round_trip():
    g = graph.build(spec.load("mini-hpn"))
    r = model.run_collective(g, "all_to_all", 1 << 20, hosts=8, placement="packed")
    c = mc.for_fabric(mc.HTSIM_100G, 400.0, [r])
    step = r.steps[0]
    assert c.transport.rate_gbps == 400.0
    assert c.transport.base_rtt_us == pytest.approx(
        (c.transport.tail_s(step.latency_s, step.hops) + c.transport.mtu_bytes * 8 / 400e9) * 1e6)


def test_the_fit_recovers_the_constants_that_made_the_cells():
    truth = mc.Policy(start_rtts=0.7, burst=0.4, efficiency=0.85, resend=0.6)
    c = mc.Corrections(transport=T, policies={"ecmp": truth})
    cells = []
    for size, steps, fan_in in ((1e6, 1, 4), (4e6, 1, 5), (64e3, 127, 3), (250e3, 1, 4)):
        shapes = [(mc.StepShape(fan_in * size * 8 / RATE, 6e-6, 6, size, fan_in), steps)]
        cells.append({"peer_s": sum(m * mc.step_time(s, c, "ecmp") for s, m in shapes), "steps": [shapes]})
    got = mc.fit_policy(cells, T)
    for name in ("start_rtts", "burst", "efficiency", "resend"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), abs=1e-3)


def test_a_constant_no_cell_tells_apart_keeps_its_default():
    truth = mc.Policy(start_rtts=0.2, burst=0.3, efficiency=0.9)
    c = mc.Corrections(transport=T, policies={"mixed": truth})
    cells = [{"peer_s": mc.step_time(lone(size), c, "mixed") * steps, "steps": [[(lone(size), steps)]]}
             for size, steps in ((1e6, 1), (4e6, 1), (64e3, 127))]       # one flow each: nothing re-sent
    got = mc.fit_policy(cells, T)
    assert got.resend == mc.Policy().resend
    assert got.efficiency == pytest.approx(0.9, abs=1e-3) and got.start_rtts == pytest.approx(0.2, abs=1e-3)


def test_constants_shared_by_modes_are_fitted_on_all_of_their_cells():
    truth = {"mixed": mc.Policy(start_rtts=0.3, burst=0.5, efficiency=0.9),
             "reps": mc.Policy(start_rtts=0.3, burst=0.5, efficiency=0.7)}
    c = mc.Corrections(transport=T, policies=truth)
    cells = {m: [{"peer_s": mc.step_time(lone(size), c, m) * steps, "steps": [[(lone(size), steps)]]}
                 for size, steps in ((1e6, 1), (4e6, 1), (64e3, 127))] for m in truth}
    got = mc.fit_group(cells, T, shared=("start", "burst"), own=("steady",))
    for m, want in truth.items():
        assert got[m].efficiency == pytest.approx(want.efficiency, abs=1e-3)
        assert (got[m].start_rtts, got[m].burst) == pytest.approx((0.3, 0.5), abs=1e-3)


def test_a_fitted_cost_is_never_a_gain():
    # a peer faster than the fluid model's drain allows cannot make the start negative
    cells = [{"peer_s": 0.5 * mc.step_time(lone(size), mc.Corrections(transport=T), "m"), "steps": [[(lone(size), 1)]]}
             for size in (1e6, 4e6, 64e3)]
    got = mc.fit_policy(cells, T)
    assert got.start_rtts >= 0 and got.burst >= 0 and got.resend >= 0


def test_corrections_survive_their_json():
    doc = json.loads(json.dumps(mc.HTSIM_100G.as_dict()))
    assert mc.Corrections.from_dict(doc) == mc.HTSIM_100G


@pytest.mark.parametrize("bad", [dict(efficiency=0.0), dict(efficiency=2.0), dict(start_rtts=-10.0)])
def test_impossible_constants_are_one_user_error(bad):
    with pytest.raises(UserError):
        mc.Policy(**bad)


def test_a_document_that_is_not_corrections_is_one_user_error():
    with pytest.raises(UserError, match="not a corrections document"):
        mc.Corrections.from_dict({"policies": {}})


# ---- hpnlab model --corrections -------------------------------------------------------------------

def _model_cli(capsys, monkeypatch, tmp_path, *extra: str) -> str:
    from hpnlab.cli.main import main
    monkeypatch.setenv("HPNLAB_CACHE", str(tmp_path))
    assert main(["model", "mini-hpn", "-c", "all_reduce", "-b", "1M", "--routing", "flow,spray", *extra]) == 0
    return capsys.readouterr().out


def test_the_model_command_reports_the_corrected_figures_beside_the_raw_ones(capsys, monkeypatch, tmp_path):
    doc = json.loads(_model_cli(capsys, monkeypatch, tmp_path, "--json"))
    assert doc["corrections"]["name"] == mc.DEFAULT_PRESET
    assert doc["corrections"]["source"] == mc.PRESETS[mc.DEFAULT_PRESET].source
    g = graph.build(spec.load("mini-hpn"))
    raws = [model.run_collective(g, "all_reduce", 1 << 20, routing=row["routing"], placement="random")
            for row in doc["results"]]
    c = mc.for_fabric(mc.PRESETS[mc.DEFAULT_PRESET], g.graph["scenario"].host_rate_gbps, raws)
    for row, raw in zip(doc["results"], raws, strict=True):
        assert row["efficiency"] == pytest.approx(raw.efficiency, rel=1e-12)
        assert row["corrected"]["efficiency"] == pytest.approx(mc.correct_result(raw, c)["efficiency"], rel=1e-12)
        assert row["corrected"]["time_s"] > row["time_s"]          # a round trip per step at least


def test_the_table_shows_both_efficiencies_and_where_the_constants_were_fitted(capsys, monkeypatch, tmp_path):
    out = _model_cli(capsys, monkeypatch, tmp_path)
    assert "corrected us" in out and mc.HTSIM_100G.source in out


def test_corrections_none_prints_the_raw_model_only(capsys, monkeypatch, tmp_path):
    out = _model_cli(capsys, monkeypatch, tmp_path, "--corrections", "none")
    assert "corrected" not in out
    doc = json.loads(_model_cli(capsys, monkeypatch, tmp_path, "--corrections", "none", "--json"))
    assert all("corrected" not in row for row in doc["results"])


def test_an_unknown_corrections_name_is_one_user_error():
    with pytest.raises(UserError, match="htsim-100g"):
        mc.preset("htsim-400g")
