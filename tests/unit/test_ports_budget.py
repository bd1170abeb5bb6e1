"""The switch port type choice and the measured budget (pure: no root, no OVS)."""
from __future__ import annotations

import pytest

from hpnlab.fabric.emulation import kernel, ovsdb, shaping, sizing
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.transport import roce
from hpnlab.fabric.workload.ecn import default_thresholds

AFXDP = ["afxdp", "afxdp-nonpmd"]


def _g(name: str = "mini-hpn", **emulation: float):
    return graph.build(spec.load(name, {"emulation": emulation} if emulation else {}))


def _budget(pps_by_type: dict[str, dict[int, list[float]]], hops: int = 3, bringup=()) -> dict:
    ports = {t: {"frames": {str(f): {"pps": reps} for f, reps in frames.items()}} for t, frames in pps_by_type.items()}
    return {**sizing.budget_document(ports, hops=hops, cpus=2, load=[1.0]), "bringup": list(bringup)}


# ---- the port type ---------------------------------------------------------------------------

def test_auto_keeps_system_when_the_run_shapes_switch_ports_and_says_why():
    chosen, why, lost = kernel.choose_port_type("auto", "user", AFXDP, ["shaping"])
    assert chosen == "system"
    assert "shaping" in why and "bypass" in why
    assert lost == []


def test_auto_takes_the_afxdp_type_that_carried_more():
    measured = {"afxdp": 30_000.0, "afxdp-nonpmd": 20_000.0}
    assert kernel.choose_port_type("auto", "user", AFXDP, [], measured)[0] == "afxdp"
    measured = {"afxdp": 10_000.0, "afxdp-nonpmd": 20_000.0}
    assert kernel.choose_port_type("auto", "user", AFXDP, [], measured)[0] == "afxdp-nonpmd"


def test_auto_without_a_measurement_takes_the_afxdp_type_that_leaves_the_cores_to_generators():
    chosen, why, _ = kernel.choose_port_type("auto", "user", AFXDP, [])
    assert chosen == "afxdp-nonpmd" and "nothing measured" in why


def test_auto_is_system_without_afxdp_or_on_the_kernel_datapath():
    assert kernel.choose_port_type("auto", "user", [], [])[0] == "system"
    assert kernel.choose_port_type("auto", "kernel", AFXDP, [])[0] == "system"


def test_auto_leaves_out_an_afxdp_type_the_measurement_found_unable_to_carry_the_frames():
    refused = {"afxdp": "frames up to 1514 B only", "afxdp-nonpmd": "frames up to 1514 B only"}
    chosen, why, _ = kernel.choose_port_type("auto", "user", AFXDP, [], refused=refused)
    assert chosen == "system" and "1514" in why
    chosen, _, _ = kernel.choose_port_type("auto", "user", AFXDP, [], refused={"afxdp": "no"})
    assert chosen == "afxdp-nonpmd"


def test_a_forced_afxdp_type_lists_what_it_cannot_emulate():
    chosen, why, lost = kernel.choose_port_type("afxdp", "user", AFXDP, ["shaping", "ECN marking"])
    assert (chosen, why) == ("afxdp", "forced")
    assert len(lost) == 2 and lost[0].startswith("shaping") and lost[1].startswith("ECN marking")
    assert all("tc egress" in line for line in lost)


def test_a_forced_afxdp_type_that_cannot_work_here_is_one_clear_refusal():
    with pytest.raises(UserError, match="not available here"):
        kernel.choose_port_type("afxdp", "user", [], [])
    with pytest.raises(UserError, match="userspace datapath"):
        kernel.choose_port_type("afxdp", "kernel", AFXDP, [])
    with pytest.raises(UserError, match="cannot carry"):
        kernel.choose_port_type("afxdp", "user", AFXDP, [], refused={"afxdp": "frames up to 1514 B only"})


def test_system_can_always_be_forced():
    assert kernel.choose_port_type("system", "user", AFXDP, [], {"afxdp": 1e6}) == ("system", "forced (AF_PACKET)", [])


def test_the_flag_wins_over_the_environment_and_a_bad_value_names_where_it_came_from():
    env = {kernel.PORT_TYPE_ENV: "afxdp"}
    assert kernel.port_type_request(None, env) == "afxdp"
    assert kernel.port_type_request("system", env) == "system"
    assert kernel.port_type_request(None, {}) == "auto"
    with pytest.raises(UserError, match=kernel.PORT_TYPE_ENV):
        kernel.port_type_request(None, {kernel.PORT_TYPE_ENV: "dpdk"})
    with pytest.raises(UserError, match="--port-type"):
        kernel.port_type_request("dpdk", {})


def test_afxdp_types_need_both_ovs_and_the_kernel():
    caps = kernel.Capabilities(ovs_iface_types=["afxdp", "afxdp-nonpmd", "system", "tap"], af_xdp=True)
    assert caps.afxdp_types == ["afxdp", "afxdp-nonpmd"]
    assert kernel.Capabilities(ovs_iface_types=["afxdp"], af_xdp=False).afxdp_types == []
    assert kernel.Capabilities(ovs_iface_types=["system"], af_xdp=True).afxdp_types == []


def test_ovs_iface_types_are_parsed_and_afxdp_ports_run_in_generic_xdp_mode():
    assert ovsdb.parse_set('[afxdp, "afxdp-nonpmd", system]\n') == ["afxdp", "afxdp-nonpmd", "system"]
    assert ovsdb.parse_set("[]") == []
    assert ovsdb.port_type_args("system") == ""
    assert ovsdb.port_type_args("afxdp") == " type=afxdp options:xdp-mode=generic"


# ---- the measured budget ---------------------------------------------------------------------

def test_the_budget_at_a_frame_size_is_the_median_repetition_interpolated_between_measured_sizes():
    b = _budget({"system": {64: [10_000, 30_000, 20_000], 1514: [8_000], 4110: [6_000]}})
    assert sizing.pps_at(b, "system", 64) == 20_000
    assert sizing.pps_at(b, "system", 40) == 20_000          # below the smallest: the nearest
    assert sizing.pps_at(b, "system", 2812) == pytest.approx(7_000)
    assert sizing.pps_at(b, "system", 9014) == 6_000         # above the largest: the nearest
    assert sizing.pps_at(b, "afxdp", 1514) is None
    assert sizing.pps_at(None, "system", 1514) is None


def test_a_frame_size_a_port_type_could_not_carry_is_not_part_of_its_budget():
    b = _budget({"afxdp": {64: [50_000], 1514: [40_000]}})
    b["ports"]["afxdp"]["frames"]["4110"] = {"error": "4110 B frames do not get through"}
    assert sizing.max_frame(b, "afxdp") == 1514
    assert sizing.pps_at(b, "afxdp", 4110) == 40_000


def test_without_a_measurement_the_budget_is_the_constant_and_says_so():
    pps, source = sizing.pps_budget(None, cpus=2, frame=1514)
    assert pps == sizing.PPS_PER_CORE * 2 and source.startswith("constant")
    pps, source = sizing.pps_budget(_budget({"system": {1514: [12_345]}}), cpus=2, frame=1514)
    assert pps == 12_345 and source.startswith("measured")


def test_the_size_check_counts_every_switch_hop_the_measurement_made():
    g = _g(host_mbps=10)
    est = sizing.estimate(g, cpus=2, budget=_budget({"system": {1514: [5_000]}}, hops=3))
    assert est["pps_budget"] == 15_000 and est["pps_budget_source"].startswith("measured")


def test_the_size_check_refuses_beyond_the_measured_budget_naming_it():
    g = _g(host_mbps=10)                                    # 32 ports x 10 Mbit/s = 26k packets/s
    with pytest.raises(UserError, match=r"too fast.*measured"):
        sizing.check_fits(g, cpus=2, budget=_budget({"system": {1514: [5_000]}}, hops=3))
    assert sizing.check_fits(g, cpus=2, budget=_budget({"system": {1514: [10_000]}}, hops=3))["fits"]


def test_default_rates_spend_the_headroom_share_of_the_budget_on_the_sending_ports():
    g = _g(mtu=4096)
    rates = sizing.default_rates(g, pps=10_000, sending_ports=16)
    used = 16 * rates["host_mbps"] * 1e6 / (8 * 4110)
    assert used <= sizing.HEADROOM * 10_000
    assert used > 0.9 * sizing.HEADROOM * 10_000
    # mini-hpn's spine links run at twice the host rate
    assert rates["max_mbps"] == pytest.approx(2 * rates["host_mbps"])


def test_default_rates_for_every_port_sending_fit_the_size_check():
    b = _budget({"system": {4110: [3_000]}}, hops=3)
    g = _g(mtu=4096)
    rates = sizing.default_rates(g, sizing.pps_at(b, "system", 4110) or 0)
    g = _g(mtu=4096, host_mbps=rates["host_mbps"], max_mbps=rates["max_mbps"])
    assert sizing.check_fits(g, cpus=2, budget=b)["fits"]


def test_run_rates_keep_a_rate_the_user_set_and_the_preset_when_nothing_was_measured():
    g = _g()
    b = _budget({"system": {1514: [9_000]}})
    over, line = sizing.run_rates(g, {"emulation": {"host_mbps": 3}}, b, 2)
    assert over == {} and "rates as set" in line and "MTU 1500" in line
    over, line = sizing.run_rates(g, {}, None, 2)
    assert over == {} and "nothing measured" in line
    over, line = sizing.run_rates(g, {}, b, 2, sending_ports=16)
    assert over == {"emulation": sizing.default_rates(g, 9_000, 16)} and "measured" in line


def test_run_rates_take_the_roce_mtu_where_the_budget_carries_a_higher_rate_with_it():
    g = _g()                                                   # MTU 1500
    more_bytes = _budget({"system": {1514: [9_000], 4110: [6_000]}})
    over, line = sizing.run_rates(g, {}, more_bytes, 2, sending_ports=16)
    assert over["emulation"]["mtu"] == sizing.ROCE_MTU and "MTU 4096" in line
    assert over["emulation"]["host_mbps"] == sizing.default_rates(g, 6_000, 16, mtu=4096)["host_mbps"]
    fewer_bytes = _budget({"system": {1514: [9_000], 4110: [2_000]}})
    assert "mtu" not in sizing.run_rates(g, {}, fewer_bytes, 2, sending_ports=16)[0]["emulation"]
    # an MTU the user set is kept
    assert "mtu" not in sizing.run_rates(g, {"emulation": {"mtu": 1500}}, more_bytes, 2, 16)[0]["emulation"]


def test_the_node_cap_comes_from_recorded_bring_ups_and_the_constant_without_any():
    assert sizing.nodes_max(None, 2)[0] == sizing.NODES_PER_CORE * 2
    one_size = _budget({}, bringup=[{"nodes": 60, "up_s": 30.0}, {"nodes": 4, "up_s": 9.0}])
    assert sizing.nodes_max(one_size, 2, target_s=60.0)[0] == int(sizing.NODES_EXTRAPOLATE * 60)  # not 120
    line = _budget({}, bringup=[{"nodes": 20, "up_s": 20.0}, {"nodes": 80, "up_s": 50.0}])
    n, source = sizing.nodes_max(line, 2, target_s=60.0)
    assert n == 100 and "10.0 s + 0.500 s per node" in source         # the line read at 60 s
    slow = _budget({}, bringup=[{"nodes": 100, "up_s": 300.0}])
    assert sizing.nodes_max(slow, 2, target_s=60.0)[0] == sizing.NODES_PER_CORE   # never below half the constant


def test_the_budget_is_cached_where_the_environment_says_and_keeps_its_bring_ups(tmp_path):
    assert sizing.cache_dir({sizing.CACHE_ENV: str(tmp_path)}) == tmp_path
    assert sizing.cache_dir({}, uid=0) == sizing.Path("/var/cache/hpnlab")
    assert sizing.cache_dir({"HOME": "/home/u"}, uid=1000) == sizing.Path("/home/u/.cache/hpnlab")
    path = tmp_path / "budget.json"
    sizing.record_bringup(28, 12.5, path)
    sizing.save_budget(_budget({"system": {1514: [7_000]}}), path)
    loaded = sizing.load_budget(path)
    assert loaded is not None and sizing.pps_at(loaded, "system", 1514) == 7_000
    assert [s["nodes"] for s in loaded["bringup"]] == [28]
    path.write_text("not json")
    assert sizing.load_budget(path) is None


def test_a_test_runs_many_small_bring_ups_do_not_push_out_the_large_ones_that_set_the_cap(tmp_path):
    path = tmp_path / "budget.json"
    sizing.record_bringup(140, 53.0, path)
    for _ in range(3 * sizing.BRINGUP_KEEP):
        sizing.record_bringup(28, 12.5, path)
    doc = sizing.load_budget(path)
    assert doc is not None
    kept = doc["bringup"]
    assert [s["nodes"] for s in kept] == [140] + [28] * sizing.BRINGUP_PER_SIZE
    assert sizing.nodes_max({"bringup": kept}, 2)[0] > 140


def test_the_bring_ups_kept_are_bounded_in_all():
    many = [{"nodes": n, "up_s": 1.0} for n in range(16, 200)]
    assert [s["nodes"] for s in sizing.trim_bringups(many, keep=10)] == list(range(190, 200))


# ---- RoCE-sized frames: every MTU-dependent piece follows the scenario's MTU --------------------

def test_an_mtu_of_4096_sizes_shaping_ecn_and_the_roce_transport_by_its_frame():
    frame = 4096 + 14
    shape = shaping.Shape("p0l0-eth1", 10.0, mtu=4096)
    assert shape.queue_bytes >= 32 * frame
    assert any(f"quantum {frame}" in line for line in shaping.tc_lines(shape, netem=False))
    th = default_thresholds(10e6, mtu=4096)
    assert th.kmin >= 4 * frame and th.kmax > th.kmin
    assert roce.packets_for(1 << 20, 4096) < roce.packets_for(1 << 20, 1500) / 2.5
    assert _g(mtu=4096).graph["scenario"].emulation.mtu == 4096


def test_a_budget_measured_on_a_busy_machine_says_it_is_likely_low():
    note = sizing.busy_warning([10.5, 5.6, 2.6], [2.72, 4.0, 3.3], cpus=2)
    assert note is not None and "10.5" in note and "2 core" in note and "quiet" in note


def test_a_budget_measured_on_a_quiet_machine_says_nothing_of_load():
    assert sizing.busy_warning([0.5, 0.4, 0.3], [1.9, 1.0, 0.5], cpus=2) is None


# ---- the generators' ceiling ------------------------------------------------------------------

def _gen(curve: dict[float, list[float]], mtu: int = 4096, ports: int = 16) -> dict:
    return {"mtu": mtu, "sending_ports": ports, "cell": "all_reduce roce spray",
            "rungs": [{"host_mbps": r, "fractions": fs} for r, fs in curve.items()]}


def _mbps(pps: float, ports: int = 16, mtu: int = 4096) -> float:
    return pps / ports * 8 * (mtu + sizing.ETH) / 1e6


def _ceiling(gen: dict) -> tuple[float, str]:
    out = sizing.generator_ceiling(gen)
    assert out is not None
    return out


def test_generator_rungs_run_from_a_quarter_of_the_switches_rate_to_all_of_it():
    assert sizing.generator_rungs(54) == [13, 20, 27, 40, 54]
    assert sizing.generator_rungs(8) == [2, 3, 4, 6, 8]


def test_the_generators_ceiling_is_where_the_median_fraction_falls_below_the_kept_share_of_the_lowest_rungs():
    # 0.95 x 0.96 = 0.912 is crossed a third of the way from 20 (0.93) to 27 (0.876)
    pps, line = _ceiling(_gen({13: [0.96, 0.96], 20: [0.92, 0.94], 27: [0.87, 0.882],
                                               40: [0.7], 54: [0.55]}))
    assert _mbps(pps) == pytest.approx(20 + 7 * (0.93 - 0.912) / (0.93 - 0.876))
    assert "95%" in line and "13 Mbit/s" in line


def test_the_generators_ceiling_is_the_highest_rung_when_the_fraction_never_falls():
    pps, _ = _ceiling(_gen({13: [0.9], 27: [0.91], 54: [0.89]}))
    assert _mbps(pps) == pytest.approx(54)


def test_the_generators_ceiling_stops_at_the_first_fall_even_when_a_higher_rung_recovers():
    pps, _ = _ceiling(_gen({10: [0.9], 20: [0.5], 30: [0.9]}))
    assert _mbps(pps) < 20


def test_without_a_calibration_there_is_no_generators_ceiling():
    assert sizing.generator_ceiling(None) is None
    assert sizing.generator_ceiling(_gen({})) is None


def test_run_rates_take_the_generators_ceiling_where_it_is_below_the_switches_share_and_say_so():
    g = _g()
    b = _budget({"system": {1514: [9_000], 4110: [30_000]}})
    switches, line = sizing.run_rates(g, {}, b, 2, sending_ports=16)
    assert "not measured" in line
    top = switches["emulation"]["host_mbps"]
    b["generators"] = _gen({top / 4: [0.95], top / 2: [0.6]})
    capped, line = sizing.run_rates(g, {}, b, 2, sending_ports=16)
    assert capped["emulation"]["host_mbps"] < top / 2
    assert capped["emulation"]["mtu"] == 4096 and "generators keep up" in line
    # a ceiling above the switches' share changes nothing
    b["generators"] = _gen({top: [0.95], 2 * top: [0.95]})
    assert sizing.run_rates(g, {}, b, 2, sending_ports=16)[0] == switches


def test_a_rate_the_user_set_takes_the_roce_mtu_where_the_budget_measured_it_unless_an_mtu_was_set():
    g = _g(host_mbps=8)                                        # MTU 1500
    b = _budget({"system": {1514: [9_000], 4110: [6_000]}})
    over, line = sizing.run_rates(g, {"emulation": {"host_mbps": 8}}, b, 2, sending_ports=16)
    assert over == {"emulation": {"mtu": sizing.ROCE_MTU}} and "8 Mbit/s at MTU 4096" in line
    assert sizing.run_rates(g, {"emulation": {"host_mbps": 8, "mtu": 1500}}, b, 2, 16)[0] == {}
    small_frames_only = _budget({"system": {1514: [9_000]}})
    assert sizing.run_rates(g, {"emulation": {"host_mbps": 8}}, small_frames_only, 2, 16)[0] == {}


def test_a_rate_the_user_set_above_the_generators_ceiling_is_kept_with_a_warning():
    b = {**_budget({"system": {1514: [9_000], 4110: [300_000]}}), "generators": _gen({10: [0.9], 20: [0.5]})}
    ceiling = _mbps(_ceiling(b["generators"])[0])      # per port at MTU 4096, 16 sending as calibrated

    def line_at(mbps: float, mtu: int | None = None) -> tuple[dict, str]:
        given = {"host_mbps": mbps} if mtu is None else {"host_mbps": mbps, "mtu": mtu}
        g = graph.build(spec.load("mini-hpn", {"emulation": given}))
        return sizing.run_rates(g, {"emulation": given}, b, 2, 16)

    under, line = line_at(ceiling * 0.9)
    assert "WARNING" not in line
    over, line = line_at(ceiling * 1.1)
    assert over == under and "WARNING: above the" in line and "generators keep up" in line
    # the same rate at 1500 B is 2.7 times the packets: over the ceiling
    assert "WARNING" in line_at(ceiling * 0.9, mtu=1500)[1]


def test_the_generators_ceiling_is_shared_by_the_sending_ports():
    g = _g()
    b = {**_budget({"system": {4110: [300_000]}}), "generators": _gen({10: [0.9], 20: [0.9]}, ports=16)}
    eight = sizing.run_rates(g, {}, b, 2, sending_ports=8)[0]["emulation"]["host_mbps"]
    sixteen = sizing.run_rates(g, {}, b, 2, sending_ports=16)[0]["emulation"]["host_mbps"]
    assert sixteen == 20 and eight == 40


def test_the_generators_calibration_runs_the_default_matrixs_sprayed_all_reduce_at_its_largest_size():
    from hpnlab.fabric.experiments import calibration as bench_generators
    from hpnlab.fabric.experiments import runner as experiment
    p = bench_generators.plan()
    assert (p.collectives, p.transports, p.entropies) == (("all_reduce",), ("roce",), ("spray",))
    assert p.size_list == (max(experiment.RUN_DEFAULTS.size_list),) and p.ranks == experiment.RUN_DEFAULTS.ranks


def test_the_generators_calibration_takes_its_rungs_from_the_switches_alone():
    from hpnlab.fabric.experiments import calibration as bench_generators
    b = _budget({"system": {4110: [30_000]}})
    alone, sending = bench_generators.switch_rates("mini-hpn", b)
    b["generators"] = _gen({1: [0.9], 2: [0.1]})
    assert bench_generators.switch_rates("mini-hpn", b) == (alone, sending) and sending == 16
    assert sizing.generator_rungs(alone["host_mbps"])[-1] == alone["host_mbps"]


def test_a_probe_budget_without_the_generators_ceiling_takes_the_probe_share_of_the_switches_rate_and_says_so():
    g = _g()
    b = _budget({"system": {4110: [30_000]}})
    probed, line = sizing.run_rates(g, {}, {**b, "probe": True}, 2, sending_ports=16)
    share = sizing.default_rates(g, sizing.HEADROOM * sizing.PROBE_SHARE * 30_000, 16, headroom=1.0, mtu=4096)
    assert probed["emulation"]["host_mbps"] == share["host_mbps"]
    assert "short probe" in line and "doctor --measure" in line


def test_a_measured_generators_ceiling_overrides_the_probe_share():
    g = _g()
    b = {**_budget({"system": {4110: [30_000]}}), "probe": True}
    probed = sizing.run_rates(g, {}, b, 2, sending_ports=16)[0]["emulation"]["host_mbps"]
    b["generators"] = _gen({probed * 2: [0.95], probed * 3: [0.95]})
    assert sizing.run_rates(g, {}, b, 2, sending_ports=16)[0]["emulation"]["host_mbps"] > probed


def test_a_frame_size_where_no_rate_got_through_without_loss_is_not_a_measurement():
    assert sizing.pps_at(_budget({"system": {4110: [0.0]}}), "system", 4110) is None
