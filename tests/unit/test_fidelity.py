"""Fidelity (hpnlab.fabric.experiments.fidelity): the model against the emulator, pure parts."""
from __future__ import annotations

import pytest

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import fidelity
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.scenario.rates import emulated_mbps
from hpnlab.fabric.workload import collectives as col


@pytest.fixture(scope="module")
def mini():
    return graph.build(spec.load("mini-hpn"))


def _emulated(time_us: float, *, collective: str = "all_to_all", size: int = 1 << 20, **evidence) -> dict:
    ev = {"packets": 1000, "retransmissions": 0, "timeouts": 0, "max_flow_timeouts": 0, "rate_cuts": 0,
          "switch_drops": 0, "min_rto_s": 0.01, "srtt_us_mean": None, "cpu_max_rank_share": 0.2,
          "load_average": None, "cpus": 2, "uplink_imbalance": None}
    ev.update(evidence)
    return {"size_bytes": size, "busbw_gbs": size / time_us / 1e3, "time_us": time_us, "line_rate_bps": 20e6,
            "nranks": 4, "collective": collective, "entropy": "spray", "wrong": 0, "evidence": ev}


def _model(time_us: float, own_us: float | None = None, steps: int = 1) -> dict:
    return {"time_us": time_us, "busbw_gbs": (1 << 20) / time_us / 1e3, "steps": steps,
            "own": {"time_us": own_us, "busbw_gbs": 1.0, "steps": 3} if own_us else None}


def test_flow_mode_maps_to_the_models_per_flow_routing_under_either_name():
    assert fidelity.model_routing("flow", ("ecmp", "spray")) == "ecmp"
    assert fidelity.model_routing("ecmp", ("flow", "flowlet")) == "flow"
    assert fidelity.model_routing("spray", ("ecmp", "spray")) == "spray"


def test_a_mode_the_model_lacks_is_reported_missing_never_substituted():
    assert fidelity.model_routing("flowlet", ("ecmp", "spray")) is None
    assert fidelity.model_routing("adaptive", ("ecmp", "spray")) is None


def test_unknown_mode_is_one_user_error():
    with pytest.raises(UserError, match="unknown mode"):
        fidelity.model_routing("warp", ("ecmp",))


def test_emulated_graph_runs_every_link_at_its_emulated_rate_and_puts_the_ranks_hosts_first(mini):
    s = mini.graph["scenario"]
    ge = fidelity.emulated_graph(mini, ["h9", "h2"])
    for u, v, k, d in mini.edges(keys=True, data=True):
        assert ge.edges[u, v, k]["rate_gbps"] == emulated_mbps(s, d["rate_gbps"]) / 1e3
    assert [n for n in ge.nodes if ge.nodes[n]["tier"] == 0][:2] == ["h9", "h2"]
    assert ge.number_of_edges() == mini.number_of_edges()


def test_the_generators_all_to_all_is_one_step_with_every_pair_at_once():
    [(pairs, nbytes)] = fidelity.schedule_steps("all_to_all", 4, 1 << 20)
    assert sorted(pairs) == [(a, b) for a in range(4) for b in range(4) if a != b]
    assert nbytes == (1 << 20) // 4


def test_the_generators_ring_all_reduce_has_two_n_minus_one_steps():
    steps = fidelity.schedule_steps("all_reduce", 4, 1 << 20)
    assert len(steps) == len(col.build("all_reduce", 4, 1 << 20).steps) == 6
    assert all(sorted(p) == [(0, 1), (1, 2), (2, 3), (3, 0)] for p, _ in steps)


def test_model_ring_on_the_emulated_non_blocking_fabric_reaches_the_emulated_line_rate(mini):
    # 4 ranks on 4 leaves (cross-rail); sprayed over both planes, each step's chunk crosses
    # the NIC's host ports at once: time = steps x chunk / NIC rate (path delays are microseconds)
    hosts = ["h1", "h5", "h9", "h13"]
    ge = fidelity.emulated_graph(mini, hosts)
    size = 1 << 20
    out = fidelity.run_model(ge, [(h, 0) for h in hosts], "spray", "all_reduce", size, switch_latency_us=0.0)
    s = mini.graph["scenario"]
    nic_bps = s.planes * emulated_mbps(s, s.host_rate_gbps) * 1e6
    chunk = size / 4
    expected_s = 6 * chunk * 8 / nic_bps
    assert out["time_us"] == pytest.approx(expected_s * 1e6, rel=0.02)
    assert out["busbw_gbs"] == pytest.approx(nic_bps / 8e9, rel=0.02)


def test_model_own_schedule_is_the_generators_one_step_all_to_all(mini):
    hosts = ["h1", "h5", "h9", "h13"]
    ge = fidelity.emulated_graph(mini, hosts)
    out = fidelity.run_model(ge, [(h, 0) for h in hosts], "spray", "all_to_all", 1 << 20)
    assert out["steps"] == out["own"]["steps"] == 1     # every pair at once, as the generators send it
    assert out["own"]["time_us"] == pytest.approx(out["time_us"])


def test_every_mode_has_a_model_figure(mini):
    hosts = ["h1", "h5", "h9", "h13"]
    ge = fidelity.emulated_graph(mini, hosts)
    for mode in fidelity.MODE_ROUTING:
        out = fidelity.run_model(ge, [(h, 0) for h in hosts], mode, "all_reduce", 1 << 16)
        assert out["busbw_gbs"] > 0 and out["stalled_connections"] == 0, mode


def test_a_mode_without_a_model_routing_gives_a_row_without_model_figures(mini, monkeypatch):
    monkeypatch.setattr(model, "ROUTINGS", tuple(r for r in model.ROUTINGS if r != "adaptive"))
    hosts = ["h1", "h5"]
    out = fidelity.run_model(fidelity.emulated_graph(mini, hosts), [(h, 0) for h in hosts], "adaptive",
                             "all_reduce", 1 << 16)
    row = fidelity.compare(_emulated(1000.0), out)
    assert row["model"] is None and "no 'adaptive' routing" in row["model_missing"]


# ---- the model's entry point for given steps (model.run_steps, model.step_link_bytes) --------------

def test_given_the_collectives_own_steps_run_steps_times_the_collective(mini):
    job = model.make_job(mini, 8, "packed", 1)
    for routing in ("flow", "flowlet", "spray", "adaptive"):
        r = model.run_collective(mini, "all_reduce", 1 << 20, routing=routing, hosts=8, qps=2)
        st = model.steps("all_reduce", job, 1 << 20, max_steps=16, seed=1, rails=1, routing=routing)
        got = model.run_steps(mini, job, st, routing, 2)
        assert sum(x.multiplicity * x.time_s for x in got) == pytest.approx(r.time_s), routing


def test_per_flow_hashing_keeps_a_connections_path_across_steps_and_flowlets_rehash(mini):
    net = model.Network(mini)
    ranks = [("h1", 0), ("h5", 0)]
    loads = {routing: {model.step_link_bytes(net, ranks, [(0, 1)], 1e6, routing, 1, salt=k).tobytes()
                       for k in range(8)} for routing in ("flow", "flowlet")}
    assert len(loads["flow"]) == 1 and len(loads["flowlet"]) > 1


@pytest.mark.parametrize("routing", ["flow", "spray", "adaptive"])
def test_a_steps_link_bytes_are_its_bytes_on_every_link_of_its_paths(mini, routing):
    # h1 -> h5 crosses leaf to leaf: host up, leaf up, spine down, host down: 4 links per path
    net = model.Network(mini)
    load = model.step_link_bytes(net, [("h1", 0), ("h5", 0)], [(0, 1)], 1e6, routing, 1)
    assert load.sum() == pytest.approx(4e6)


def test_relative_error_is_model_minus_emulated_over_emulated():
    assert fidelity.rel_error(90.0, 100.0) == pytest.approx(-0.1)
    assert fidelity.rel_error(1.0, 0.0) is None
    assert fidelity.rel_error(float("inf"), 1.0) is None


def test_within_tolerance_a_row_carries_no_explanation():
    row = fidelity.compare(_emulated(1000.0), _model(950.0))
    assert row["within_tolerance"] and row["causes"] == []


def test_loss_on_a_fan_in_step_explains_an_optimistic_model():
    emu = _emulated(2000.0, packets=1000, retransmissions=400, switch_drops=300)
    [cause, *_] = fidelity.compare(emu, _model(1000.0))["causes"]
    assert cause["cause"] == "incast_loss"
    assert "400 of 1000" in cause["evidence"]


def test_loss_never_explains_a_model_slower_than_the_emulation():
    emu = _emulated(1000.0, packets=1000, retransmissions=400, switch_drops=300)
    causes = fidelity.compare(emu, _model(2000.0))["causes"]
    assert all(c["cause"] != "incast_loss" for c in causes)


def test_timeouts_account_for_their_minimum_rto_share_of_the_gap():
    emu = _emulated(100_000.0, timeouts=3, max_flow_timeouts=2, min_rto_s=0.01)
    causes = {c["cause"]: c for c in fidelity.compare(emu, _model(60_000.0))["causes"]}
    assert causes["timer_ticks"]["share"] == pytest.approx(2 * 0.01 / 0.04)


def test_a_pairwise_model_schedule_explains_a_pessimistic_model():
    # the emulation (concurrent) is faster than the model's pairwise own schedule and slower
    # than the model on the generators' concurrent schedule: the schedule is the cause
    emu = _emulated(1500.0)
    causes = fidelity.compare(emu, _model(1000.0, own_us=2000.0))["causes"]
    assert causes[0]["cause"] == "schedule"


def test_a_saturated_generator_core_is_named():
    emu = _emulated(3000.0, cpu_max_rank_share=0.97)
    causes = [c["cause"] for c in fidelity.compare(emu, _model(1000.0))["causes"]]
    assert "cpu" in causes


def test_a_busy_machine_during_the_cell_is_named():
    emu = _emulated(3000.0, machine_busy=0.97)
    assert "cpu" in [c["cause"] for c in fidelity.compare(emu, _model(1000.0))["causes"]]


def test_a_quiet_cell_after_a_busy_quarter_hour_does_not_blame_the_cpu():
    # the 5- and 15-minute load averages remember work before the cell; the cell's own busy share decides
    emu = _emulated(3000.0, machine_busy=0.40, load_average=[0.7, 3.4, 5.0])
    assert "cpu" not in [c["cause"] for c in fidelity.compare(emu, _model(1000.0))["causes"]]


def test_without_a_busy_share_only_the_one_minute_load_average_counts():
    quiet_now = _emulated(3000.0, load_average=[0.7, 3.4, 5.0])
    busy_now = _emulated(3000.0, load_average=[4.5, 3.4, 1.0])
    assert "cpu" not in [c["cause"] for c in fidelity.compare(quiet_now, _model(1000.0))["causes"]]
    assert "cpu" in [c["cause"] for c in fidelity.compare(busy_now, _model(1000.0))["causes"]]


def test_the_same_cell_without_congestion_control_measures_its_share_of_the_gap():
    emu = {**_emulated(3000.0, rate_cuts=40), "cc": "dcqcn"}
    free = {**_emulated(1500.0), "cc": "none"}
    row = fidelity.compare(emu, _model(1000.0), without_cc=free)
    cause = {c["cause"]: c for c in row["causes"]}["congestion_control"]
    assert cause["share"] == pytest.approx((3000.0 - 1500.0) / (3000.0 - 1000.0))
    assert "1.5 ms" in cause["evidence"] and "40 rate cuts" in cause["evidence"]
    assert row["without_cc"]["time_us"] == 1500.0


def test_congestion_control_is_not_blamed_when_the_cell_without_it_was_slower():
    emu = {**_emulated(3000.0), "cc": "dcqcn"}
    free = {**_emulated(3500.0), "cc": "none"}
    causes = fidelity.compare(emu, _model(1000.0), without_cc=free)["causes"]
    assert "congestion_control" not in [c["cause"] for c in causes]


def test_the_median_repetition_stands_for_the_cell_with_the_range_of_all():
    reps = [_emulated(t) for t in (900.0, 3000.0, 1200.0, 1000.0)]
    fig, spread = fidelity.median_of(reps)
    assert fig is reps[3]                          # 900, 1000 | 1200, 3000: the lower median, a real run
    assert spread == {"repeat": 4, "time_us_range": [900.0, 3000.0],
                      "busbw_gbs_range": [reps[1]["busbw_gbs"], reps[0]["busbw_gbs"]]}


def test_the_table_shows_the_repetitions_and_their_range():
    fig, spread = fidelity.median_of([_emulated(t) for t in (2000.0, 2500.0, 1900.0)])
    [line] = [x for x in fidelity.table([fidelity.compare(fig, _model(1000.0), spread=spread)]) if "all_to_all" in x]
    assert " 3 " in line and "[1.9-2.5]" in line


def test_no_measured_cause_says_unexplained_with_the_gap():
    [cause] = fidelity.compare(_emulated(3000.0), _model(1000.0))["causes"]
    assert cause["cause"] == "unexplained" and "2.0 ms" in cause["evidence"]


def test_the_side_whose_hashing_loads_an_uplink_more_is_explained_as_collisions():
    emu = _emulated(1000.0, uplink_imbalance=1.0)
    model_side = {**_model(2000.0), "uplink_imbalance": 2.0}      # the model's hash collided, it is slower
    assert "collisions" in [c["cause"] for c in fidelity.compare(emu, model_side)["causes"]]
    model_side = {**_model(500.0), "uplink_imbalance": 2.0}       # ... but it is faster: not the cause
    assert "collisions" not in [c["cause"] for c in fidelity.compare(emu, model_side)["causes"]]


def test_the_models_uplink_imbalance_counts_every_uplink_of_the_ranks_leaves(mini):
    # two ranks under different leaves, one connection: all its bytes on one uplink of the
    # source leaf, none on the other uplinks of the two leaves in both planes: max / mean = their count
    hosts = ["h1", "h5"]
    ge = fidelity.emulated_graph(mini, hosts)
    steps = [([(0, 1)], 1e6)]
    imb = fidelity.first_step_uplink_imbalance(ge, [(h, 0) for h in hosts], steps, "ecmp", 1)
    leaves = {p["leaf"] for h in hosts for p in graph.host_ports(mini, h)}
    uplinks = sum(1 for u, v, d in mini.edges(data=True) if d["kind"] == "fabric" and ({u, v} & leaves))
    assert imb == pytest.approx(uplinks)


def test_the_table_prints_both_sides_and_the_reasons():
    rows = [fidelity.compare(_emulated(2000.0, retransmissions=400, switch_drops=3), _model(1000.0))]
    text = "\n".join(fidelity.table(rows))
    assert "2.0" in text and "1.0" in text and "+100.0%" in text and "why: incast_loss" in text


def test_a_switch_on_the_emulated_fabric_costs_its_own_latency_and_one_frames_serialization(mini):
    s = mini.graph["scenario"]
    ge = fidelity.emulated_graph(mini)
    frame_us = (s.emulation.mtu + 14) * 8 / emulated_mbps(s, s.host_rate_gbps)
    assert fidelity.hop_latency_us(ge) == pytest.approx(fidelity.EMULATED_SWITCH_LATENCY_US + frame_us)


def test_the_models_step_pays_the_store_and_forward_of_every_switch_on_its_path(mini):
    # two ranks under different leaves of one plane: host - leaf - spine - leaf - host, 3 switches
    ge = fidelity.emulated_graph(mini, ["h1", "h5"])
    ranks = [("h1", 0), ("h5", 0)]
    bare = fidelity.run_model(ge, ranks, "flow", "all_to_all", 1 << 20, switch_latency_us=0.0)
    full = fidelity.run_model(ge, ranks, "flow", "all_to_all", 1 << 20)
    assert full["time_us"] - bare["time_us"] == pytest.approx(3 * fidelity.hop_latency_us(ge))


@pytest.mark.parametrize("argv, message", [
    (["--cc", "reno"], "--cc: unknown congestion control 'reno'"),
    (["--modes", "warp"], "--modes: unknown mode 'warp'"),
])
def test_a_bad_fidelity_flag_is_one_line_before_anything_is_built(capsys, argv, message):
    from hpnlab.cli.main import main

    assert main(["fidelity", "mini-hpn", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
