"""Pure parts of the emulation harness (no root): sizing, loops, shaping, ECN defaults, timelines, state."""
from __future__ import annotations

import pytest

from hpnlab.fabric.emulation import nodes, preflight, shaping
from hpnlab.fabric.emulation.sizing import check_fits, estimate, has_loops
from hpnlab.fabric.emulation.timeline import load as load_timeline
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph, spec


def _g(name, **over):
    return graph.build(spec.load(name, over))


def test_estimate_counts_hosts_switches_links_and_packet_rate():
    est = estimate(_g("mini-hpn"), cpus=2)
    assert (est["hosts"], est["switches"], est["links"], est["host_ports"]) == (16, 12, 48, 32)
    # 32 host ports at 10 Mbit/s in 1514-byte frames
    assert est["pps_full_load_per_hop"] == round(32 * 10e6 / (8 * 1514))
    assert est["fits"]


def test_check_fits_refuses_too_many_nodes_with_the_numbers():
    with pytest.raises(UserError, match=r"128 hosts \+ 80 switches = 208 nodes.*at most 128"):
        check_fits(_g("fat-tree-8"), cpus=2)
    assert check_fits(_g("fat-tree-8", emulation={"host_mbps": 2}), cpus=4)["fits"]


def test_check_fits_refuses_a_packet_rate_beyond_userspace_ovs():
    g = _g("small-hpn", emulation={"host_mbps": 100, "max_mbps": 400})
    with pytest.raises(UserError, match=r"too fast.*packets/s"):
        check_fits(g, cpus=2)


def test_loops_are_found_in_clos_fabrics_and_not_in_trees():
    assert has_loops(_g("mini-hpn"))
    assert not has_loops(_g("mini-hpn", spines_per_plane=1, oversubscription=None))
    assert has_loops(_g("mini-hpn", spines_per_plane=1, leaf_spine_links=2, oversubscription=None))


def test_shaping_uses_htb_and_a_port_buffer_and_netem_only_when_present():
    shape = shaping.Shape("p0l0-eth1", 10.0, delay_us=100.0)
    with_netem = shaping.tc_lines(shape, netem=True)
    without = shaping.tc_lines(shape, netem=False)
    assert "htb rate 10mbit ceil 10mbit" in with_netem[1]
    assert "netem delay 100us" in with_netem[2]
    assert "bfifo limit" in without[2] and "netem" not in " ".join(without)
    assert shape.queue_bytes == max(32 * 1514, int(10e6 / 8 * 0.05))


def test_control_priority_puts_dscp_48_in_a_class_of_its_own_ahead_of_the_port_buffer():
    shape = shaping.Shape("p0l0-eth1", 10.0, control_priority=True)
    lines = shaping.tc_lines(shape, netem=False)
    assert "htb default 11" in lines[0] and "classid 1:1 htb rate 10mbit ceil 10mbit" in lines[1]
    control = next(line for line in lines if "classid 1:10" in line)
    data = next(line for line in lines if "classid 1:11" in line)
    assert "prio 0" in control and "ceil 10mbit" in control and "prio 1" in data and "ceil 10mbit" in data
    assert any("u32 match ip tos 0xc0 0xfc flowid 1:10" in line for line in lines)
    assert f"parent 1:11 handle 10: bfifo limit {shape.queue_bytes}" in lines[-1]
    assert shaping.data_class(shape) == "1:11"
    # the link's delay applies to control packets as to the data
    delayed = shaping.tc_lines(shaping.Shape("x", 10.0, delay_us=500.0, control_priority=True), netem=True)
    assert sum("netem delay 500us" in line for line in delayed) == 2


def test_without_control_priority_the_port_is_one_class_with_the_buffer_under_it():
    shape = shaping.Shape("p0l0-eth1", 10.0)
    lines = shaping.tc_lines(shape, netem=False)
    assert len(lines) == 3 and "htb default 1 " in lines[0] and shaping.data_class(shape) == "1:1"
    assert shaping.tc_lines(shape, netem=False, leaf=False) == lines[:2]


def test_the_scenario_s_control_priority_reaches_host_and_switch_ports():
    g = _g("mini-hpn", emulation={"control_priority": True})
    assert any("classid 1:10" in line for line in nodes.host_tc_lines(g, "h1", netem=False))
    assert all(shaping.port_shape(p, 1500).control_priority for p in nodes.switch_ports(g))
    assert not any(shaping.port_shape(p, 1500).control_priority for p in nodes.switch_ports(_g("mini-hpn")))


def test_the_scenario_sets_the_least_frames_of_every_port_buffer_hosts_and_switches_alike():
    g = _g("mini-hpn", emulation={"buffer_frames": 96, "mtu": 4096, "host_mbps": 24, "max_mbps": 48})
    frame = 4096 + 14
    host = [line for line in nodes.host_tc_lines(g, "h1", netem=False) if "bfifo" in line]
    assert host and all(f"bfifo limit {96 * frame}" in line for line in host)     # 96 frames > 50 ms at 24 Mbit/s
    ports = nodes.switch_ports(g)
    assert {shaping.port_shape(p, 4096).queue_bytes for p in ports} == {96 * frame}   # 50 ms at 48: 300 KB
    assert shaping.port_shape(nodes.switch_ports(_g("mini-hpn"))[0], 1500).queue_bytes >= 32 * 1514


def test_a_port_buffer_of_fewer_than_four_frames_is_refused_in_one_line():
    with pytest.raises(UserError, match="buffer_frames"):
        spec.load("mini-hpn", {"emulation": {"buffer_frames": 2}})


def test_hosts_set_the_tcp_congestion_control_the_scenario_names_and_otherwise_leave_the_machines():
    named = nodes.host_commands(_g("mini-hpn", emulation={"tcp_congestion": "cubic"}), "h1", False, None)
    assert "sysctl -qw net.ipv4.tcp_congestion_control=cubic" in named
    assert not any("tcp_congestion_control" in c for c in nodes.host_commands(_g("mini-hpn"), "h1", False, None))


@pytest.mark.parametrize("bad", ["cubic; reboot", "BBR", "a" * 17, "dc-tcp"])
def test_a_tcp_congestion_control_that_is_not_a_plain_name_is_refused_in_one_line(bad):
    with pytest.raises(UserError, match="tcp_congestion"):
        spec.load("mini-hpn", {"emulation": {"tcp_congestion": bad}})


def test_a_tcp_congestion_control_the_kernel_lacks_is_refused_naming_what_it_has():
    with pytest.raises(UserError, match=r"'dctcp' is not available .*available: reno bbr cubic.*modprobe tcp_dctcp"):
        preflight.check_tcp_congestion("dctcp", "reno bbr cubic\n", "reno bbr cubic\n")


def test_a_tcp_congestion_control_only_the_machines_own_namespace_may_use_is_refused_naming_the_fix():
    """The kernel lets a namespace other than the machine's make only an allowed one its default."""
    with pytest.raises(UserError, match=r"'cubic' is available but not allowed .*allowed: reno bbr\).*"
                                        r"tcp_allowed_congestion_control='reno bbr cubic'"):
        preflight.check_tcp_congestion("cubic", "reno bbr cubic\n", "reno bbr\n")


def test_a_tcp_congestion_control_the_hosts_may_use_or_none_named_passes():
    preflight.check_tcp_congestion("bbr", "reno bbr cubic\n", "reno bbr\n")
    preflight.check_tcp_congestion("", "reno", "reno")


def test_timeline_is_validated_against_the_fabric():
    g = _g("mini-hpn")
    events = load_timeline([{"at": 2, "action": "link_up", "link": "p0l0-p0s0"},
                            {"at": 1, "action": "link_down", "link": ["p0l0", "p0s0"]},
                            {"at": 1.5, "action": "switch_down", "switch": "p1s1"}], g)
    assert [e.at for e in events] == [1, 1.5, 2]
    bad = [
        ([{"at": 1, "action": "explode", "link": "p0l0-p0s0"}], "action must be one of"),
        ([{"at": -1, "action": "link_down", "link": "p0l0-p0s0"}], "'at' must be"),
        ([{"at": 1, "action": "link_down", "link": "p0l0-p1s0"}], "no link between p0l0 and p1s0"),
        ([{"at": 1, "action": "switch_down", "switch": "h1"}], "must name a switch"),
        ([{"at": 1, "action": "link_down", "link": "p0l0-p0s0", "key": 3}], "no parallel link 3"),
        ([{"at": 1, "action": "link_down", "lnk": "p0l0-p0s0"}], "unknown field 'lnk'"),
        ([], "non-empty list"),
    ]
    for data, message in bad:
        with pytest.raises(UserError, match=message):
            load_timeline(data, g)


def test_timeline_file_errors_are_one_line(tmp_path):
    g = _g("mini-hpn")
    with pytest.raises(UserError, match="not found"):
        load_timeline(tmp_path / "missing.yaml", g)
    broken = tmp_path / "t.yaml"
    broken.write_text("events: [\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_timeline(broken, g)
    good = tmp_path / "t.json"
    good.write_text('{"events": [{"at": 0.5, "action": "switch_up", "switch": "p0s1"}]}')
    assert load_timeline(good, g)[0].target == ("p0s1",)


def test_state_file_records_before_creation_and_round_trips(tmp_path, monkeypatch):
    from hpnlab.fabric.emulation import state
    monkeypatch.setattr(state, "RUN_DIR", tmp_path)
    run = state.RunState.new("mini-hpn")
    run.add_bridges(["p0l0", "p0l0"])
    run.add_interfaces(["p0l0-eth1"])
    run.add_bpf_pin("/sys/fs/bpf/hpnlab-x")
    again = state.RunState.load(run.path)
    assert again.bridges == ["p0l0"] and again.interfaces == ["p0l0-eth1"]
    assert again.owner_alive()
    assert [r.run_id for r in state.all_runs()] == [run.run_id]


def test_processes_recorded_from_several_threads_at_once_are_all_in_the_state_file(tmp_path, monkeypatch):
    # a test's traffic thread starts processes while the main thread starts others
    import threading

    from hpnlab.fabric.emulation import state
    monkeypatch.setattr(state, "RUN_DIR", tmp_path)
    run = state.RunState.new("mini-hpn")
    errors: list[BaseException] = []

    def record(base: int) -> None:
        try:
            for i in range(50):
                run.add_pid(base + i, f"thread {base}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=record, args=(1_000_000 * (n + 1),)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(state.RunState.load(run.path).pids) == 200
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run.path.name]


def test_priority_flow_control_with_cluster_servers_is_refused_when_the_emulation_is_made():
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ClusterOptions, EmulationOptions, PortOptions
    with pytest.raises(UserError, match="priority flow control runs on one machine only"):
        Emulation(spec.load("mini-hpn"), EmulationOptions(ports=PortOptions(pfc=True),
                                                          cluster=ClusterOptions(servers=("localhost", "node2"))))


def test_unknown_controller_is_refused_in_one_line():
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions
    with pytest.raises(UserError, match="unknown controller 'ryu'"):
        EmulationOptions(controller=ControllerOptions(kind="ryu"))


def test_fault_ends_name_both_interfaces_of_a_link_and_every_link_of_a_switch():
    from hpnlab.fabric.emulation.faults import link_ends, switch_ends

    g = _g("mini-hpn")
    (pu, pv), = graph.link_ports(g, "p0l0", "p0s0")
    assert link_ends(g, "p0l0", "p0s0") == [("p0l0", f"p0l0-eth{pu}"), ("p0s0", f"p0s0-eth{pv}")]
    ends = switch_ends(g, "p0s0")
    assert len(ends) == 2 * g.degree("p0s0")
    assert sorted(name for node, name in ends if node == "p0s0") == sorted(
        f"p0s0-eth{d['ports']['p0s0']}" for _, _, d in g.edges("p0s0", data=True))
    with pytest.raises(UserError, match="no link between p0l0 and p1s0"):
        link_ends(g, "p0l0", "p1s0")
    with pytest.raises(UserError, match="no switch 'h1'"):
        switch_ends(g, "h1")


def test_a_one_sided_fault_touches_only_that_side():
    from hpnlab.fabric.emulation.faults import Faults

    g = _g("mini-hpn")
    host = next(n for n in g.neighbors("p0l0") if g.nodes[n]["tier"] == 0)
    calls = []
    faults = Faults(g, lambda node, line: calls.append((node, line)), is_local=lambda node: False)
    faults.link_down("p0l0", host, side=host)
    (_, host_port), = graph.link_ports(g, "p0l0", host)
    assert calls == [(host, f"ip link set dev {host}-eth{host_port} down")]
    with pytest.raises(UserError, match="neither end"):
        faults.link_down("p0l0", host, side="p0s0")


def test_doctor_sizes_a_scenario_without_loading_the_harness_or_mininet():
    import subprocess
    import sys

    code = ("import sys; from hpnlab.cli.main import main; rc = main(['doctor', 'mini-hpn', '--json']); "
            "print('LOADED', sorted(m for m in ('hpnlab.fabric.emulation.harness', 'mininet') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert '"fits": true' in out
    assert out.strip().splitlines()[-1] == "LOADED []"


def test_the_emulation_takes_bfd_from_the_scenario_unless_an_interval_is_given():
    from hpnlab.fabric.emulation import Emulation, EmulationOptions
    from hpnlab.fabric.emulation.options import FailoverOptions
    on = spec.load("mini-hpn", {"bfd": {"enabled": True, "min_tx_ms": 10, "min_rx_ms": 30, "mult": 5}})
    built = Emulation(on, log=None).builder
    assert (built.bfd_tx_ms, built.bfd_ms, built.bfd_mult) == (10, 30, 5)
    built = Emulation(on, EmulationOptions(failover=FailoverOptions(bfd_ms=50)), log=None).builder
    assert (built.bfd_tx_ms, built.bfd_ms, built.bfd_mult) == (50, 50, 3)
    assert Emulation("mini-hpn", log=None).builder.bfd_ms == 0


def test_the_emulation_hands_its_arp_mode_to_the_controller():
    from hpnlab.fabric.emulation.options import ControllerOptions
    from hpnlab.fabric.emulation.supervisor import own_args
    assert own_args(ControllerOptions(arp="per-host"))[-2:] == ["--arp", "per-host"]
    assert own_args(ControllerOptions())[-2:] == ["--arp", "gateway"]


@pytest.mark.parametrize("kwargs,words", [({"arp": "per-leaf"}, "--arp 'per-leaf': one of gateway, per-host"),
                                          ({"arp": "per-host", "kind": "none"}, "needs the hpnlab controller")])
def test_a_wrong_arp_mode_is_refused_in_one_line_before_anything_is_built(kwargs, words):
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions
    with pytest.raises(UserError, match=words):
        EmulationOptions(controller=ControllerOptions(**kwargs))


@pytest.mark.parametrize("command", ["run", "emulate"])
def test_run_and_emulate_take_the_arp_mode(command):
    from hpnlab.cli.main import build_parser
    args = build_parser().parse_args([command, "mini-hpn", "--arp", "per-host"])
    assert args.arp == "per-host"
    assert build_parser().parse_args([command, "mini-hpn"]).arp == "gateway"


@pytest.mark.parametrize("argv, mode", [([], "nice"), (["--ovs-sched", "deadline"], "deadline"),
                                        (["--no-ovs-realtime"], "off")])
def test_ovs_sched_defaults_to_nice_and_the_old_flag_still_leaves_the_daemon_alone(argv, mode):
    import argparse

    from hpnlab.cli import cmd_emulate
    p = argparse.ArgumentParser()
    cmd_emulate.register(p.add_subparsers())
    assert p.parse_args(["emulate", "mini-hpn", *argv]).ovs_sched == mode
