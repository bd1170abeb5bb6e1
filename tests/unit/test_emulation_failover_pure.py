"""Pure parts of failure emulation (no root): one-sided and gray failures in timelines, the
gray-failure tc lines, BFD settings, port liveness and PortStatus parsing, probe endpoints."""
from __future__ import annotations

from datetime import datetime

import pytest

from hpnlab.fabric.emulation import failover, faults, ovsdb, send_trace
from hpnlab.fabric.emulation.mn import host_interfaces
from hpnlab.fabric.emulation.timeline import load as load_timeline
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph, spec


@pytest.fixture(scope="module")
def g():
    return graph.build(spec.load("mini-hpn"))


def test_one_sided_and_gray_failures_default_their_side_to_the_first_node(g):
    events = load_timeline([{"at": 1, "action": "link_down_one_side", "link": "p0l0-p0s0"},
                            {"at": 2, "action": "link_up", "link": "p0l0-p0s0"},
                            {"at": 3, "action": "link_drop", "link": ["p0l0", "p0s0"], "side": "p0s0"},
                            {"at": 4, "action": "link_restore", "link": ["p0l0", "p0s0"], "side": "p0s0"}], g)
    assert [(e.action, e.side) for e in events] == [("link_down_one_side", "p0l0"), ("link_up", None),
                                                    ("link_drop", "p0s0"), ("link_restore", "p0s0")]


@pytest.mark.parametrize("event, message", [
    ({"at": 1, "action": "link_drop", "link": "p0l0-p0s0", "side": "p0l1"}, "'side' must be p0l0 or p0s0"),
    ({"at": 1, "action": "link_down", "link": "p0l0-p0s0", "side": "p0l0"}, "'side' applies to"),
    ({"at": 1, "action": "switch_down", "switch": "p0s0", "side": "p0s0"}, "'side' applies to link actions"),
])
def test_a_wrong_side_is_one_line(g, event, message):
    with pytest.raises(UserError, match=message):
        load_timeline([event], g)


def test_a_gray_failure_is_a_classic_bpf_drop_before_every_other_egress_filter():
    on = faults.drop_lines("p0l0-eth5", True)
    assert on[0] == "qdisc add dev p0l0-eth5 clsact"
    assert on[1] == f"filter add dev p0l0-eth5 egress pref {faults.DROP_PREF} bpf da bytecode '1,6 0 0 2,'"
    assert faults.drop_lines("p0l0-eth5", False) == [f"filter del dev p0l0-eth5 egress pref {faults.DROP_PREF}"]


def test_bfd_is_set_per_interface_with_both_intervals_and_the_multiplier():
    assert ovsdb.bfd_args(["a", "b"], 20) == [
        "--", "set", "Interface", "a", "bfd:enable=true", "bfd:min_rx=20", "bfd:min_tx=20", "bfd:mult=3",
        "--", "set", "Interface", "b", "bfd:enable=true", "bfd:min_rx=20", "bfd:min_tx=20", "bfd:mult=3"]
    assert ovsdb.bfd_args(["a"], 0) == ["--", "remove", "Interface", "a", "bfd", "enable", "min_rx", "min_tx",
                                        "mult"]


PORTS_DESC = """OFPST_PORT_DESC reply (OF1.3) (xid=0x2):
 5(p0l0-eth5): addr:aa:bb:cc:dd:ee:05
     config:     0
     state:      LIVE
     speed: 10000 Mbps now, 0 Mbps max
 6(p0l0-eth6): addr:aa:bb:cc:dd:ee:06
     config:     0
     state:      0
 LOCAL(p0l0): addr:ae:9f:a3:0f:33:4a
     config:     PORT_DOWN
     state:      LINK_DOWN
"""


def test_port_states_are_read_from_dump_ports_desc():
    assert ovsdb.parse_port_states(PORTS_DESC) == {"p0l0-eth5": {"LIVE"}, "p0l0-eth6": set(),
                                                   "p0l0": {"LINK_DOWN"}}


MONITOR = """2026-11-30 18:32:55.209: OFPT_PORT_STATUS (OF1.3) (xid=0x0): MOD: 5(p0l0-eth5): addr:f2:d5:2e:1a:9f:78
     config:     0
     state:      0
     current:    10GB-FD COPPER
2026-11-30 18:32:55.230: OFPT_PORT_STATUS (OF1.3) (xid=0x0): MOD: 6(p0l0-eth6): addr:f2:d5:2e:1a:9f:79
     config:     0
     state:      LINK_DOWN
2026-11-30 18:32:55.721: OFPT_PORT_STATUS (OF1.3) (xid=0x0): MOD: 5(p0l0-eth5): addr:f2:d5:2e:1a:9f:78
     config:     0
     state:      LIVE
2026-11-30T18:32:56Z|00001|fatal_signal|WARN|terminating with signal 15 (Terminated)
"""


def _t(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def test_port_status_messages_are_read_with_their_times_from_ofctl_monitor():
    assert failover.port_status_times(MONITOR, "p0l0-eth5") == [(_t("2026-11-30 18:32:55.209"), "0"),
                                                                 (_t("2026-11-30 18:32:55.721"), "LIVE")]


def test_detection_is_the_first_port_status_that_is_not_live_after_the_fault():
    fail = _t("2026-11-30 18:32:55.200")
    det = failover.detection_ms({"p0l0": MONITOR}, {"p0l0": "p0l0-eth5"}, fail, fail + 1)
    assert det == {"p0l0": pytest.approx(9.0)}
    late = failover.detection_ms({"p0l0": MONITOR}, {"p0l0": "p0l0-eth5"}, fail + 0.3, fail + 1)
    assert late == {"p0l0": None}         # the only later message says LIVE


def test_a_port_that_is_not_live_counts_as_down_even_with_carrier():
    assert failover.not_live("0") and failover.not_live("LINK_DOWN") and not failover.not_live("LIVE")


def test_the_probe_sends_from_under_the_failed_links_leaf_to_another_leaf_of_its_plane(g):
    src, sip, dst, dip, link = failover.endpoints(g, ("p0s1", "p0l2"))
    assert link == ("p0l2", "p0s1")
    s = next(p for p in host_interfaces(g, src) if p["ip"] == sip)
    d = next(p for p in host_interfaces(g, dst) if p["ip"] == dip)
    assert s["leaf"] == "p0l2" and d["leaf"] != "p0l2" and s["plane"] == d["plane"] == 0


def test_the_probe_refuses_a_link_that_is_not_leaf_spine(g):
    with pytest.raises(UserError, match="no link p0l0-p1s0"):
        failover.endpoints(g, ("p0l0", "p1s0"))
    with pytest.raises(UserError, match="unknown failure kind"):
        failover.Probe(kind="meteor").check()


def test_the_switch_probe_sends_across_a_failed_core_from_another_campus():
    g2 = graph.build(spec.load("mini-cross-campus", {"cores_per_plane": 2}))
    src, sip, dst, dip, (near, core) = failover.switch_endpoints(g2, None)
    assert core == "p0c0" and g2.nodes[near]["tier"] == 3 and g2.has_edge(near, core)
    s = next(p for p in host_interfaces(g2, src) if p["ip"] == sip)
    d = next(p for p in host_interfaces(g2, dst) if p["ip"] == dip)
    assert g2.nodes[d["leaf"]]["campus"] == g2.nodes[core]["campus"] != g2.nodes[s["leaf"]]["campus"]
    assert s["plane"] == d["plane"] == 0


def test_the_switch_probe_fails_a_spine_from_under_its_pod_and_refuses_a_leaf(g):
    _src, _sip, _dst, _dip, (near, spine) = failover.switch_endpoints(g, "p0s1")
    assert spine == "p0s1" and g.nodes[near]["tier"] == 1 and g.has_edge(near, spine)
    with pytest.raises(UserError, match="takes its hosts with it"):
        failover.switch_endpoints(g, "p0l0")
    with pytest.raises(UserError, match="no switch"):
        failover.switch_endpoints(g, "p9s9")


def _rep(window: float, sending: bool) -> dict:
    event = {"loss_window_ms": window, "lost": 1, "late": 0, "affected": [0], "max_gap_unaffected_ms": 0.0,
             "stalled": [], "max_network_gap_unaffected_ms": 0.0, "max_gap_ms": 0.0}
    return {"events": [event, dict(event, loss_window_ms=0.0)], "detection_ms": {}, "sent": 10, "received": 9,
            "stages": {}, "sending_at_failure": sending}


def test_a_repetition_whose_sender_began_after_the_failure_is_left_out_of_the_summary():
    s = failover.summarise([_rep(10.0, True), _rep(0.0, False), _rep(20.0, True)])
    assert s["left_out"] == 1 and s["loss_window_ms"]["n"] == 2 and s["loss_window_ms"]["min"] == 10.0
    assert "1 repetition(s) left out" in failover.describe("switch", s)


OVS_LOG = """\
2026-12-01T01:02:05.340Z|01620|vconn|DBG|tcp:127.0.0.1:6653: sent (Success): OFPT_ECHO_REQUEST (OF1.3) (xid=0x0)
2026-12-01T01:02:05.347Z|01627|vconn|DBG|tcp:127.0.0.1:6653: sent (Success): OFPT_PORT_STATUS (OF1.3) (xid=0x0): \
MOD: 5(p0l0-eth5): addr:ce:11:7f:84:e0:d4
2026-12-01T01:02:05.348Z|01631|vconn|DBG|tcp:127.0.0.1:6653: sent (Success): OFPT_PORT_STATUS (OF1.3) (xid=0x0): \
MOD: 1(p0s0-eth1): addr:aa:da:3d:90:1c:52
2026-12-01T01:02:06.335Z|01633|vconn|DBG|unix#52: sent (Success): OFPT_PORT_STATUS (OF1.3) (xid=0x0): \
MOD: 5(p0l0-eth5): addr:ce:11:7f:84:e0:d4
"""


def _utc(stamp: str) -> float:
    return datetime.fromisoformat(stamp + "+00:00").timestamp()


def test_port_status_sends_are_read_from_ovs_vswitchds_own_log_in_utc():
    assert failover.port_status_sent(OVS_LOG, "p0l0-eth5") == [_utc("2026-12-01T01:02:05.347"),
                                                               _utc("2026-12-01T01:02:06.335")]
    assert failover.port_status_sent(OVS_LOG, "p0l0-eth1") == []


def test_stages_place_the_fault_the_port_status_and_delivery_after_the_fault_began():
    t0 = _utc("2026-12-01T01:02:05.337")
    records = [{"start_wall": t0, "wall": t0 + 0.002}, {"start_wall": t0 + 0.9, "wall": t0 + 0.901}]
    event = {"delivering_again_ms": 31.5, "max_gap_unaffected_ms": 18.0}
    st = failover.stages(records, event, OVS_LOG, {"p0l0": "p0l0-eth5", "p0s0": "p0s0-eth1"})
    assert st["applied_ms"] == pytest.approx(2.0)
    assert st["port_status_p0l0_ms"] == pytest.approx(10.0)     # the repair's PortStatus is after the window
    assert st["port_status_p0s0_ms"] == pytest.approx(11.0)
    assert st["delivering_again_ms"] == 31.5 and st["stall_unaffected_ms"] == 18.0


class _Proc:
    pid = 4242

    def poll(self):
        return None


def test_the_controller_is_frozen_and_thawed_by_timeline_events_and_never_left_frozen(g, monkeypatch):
    from hpnlab.fabric.emulation import supervisor, timeline
    from hpnlab.fabric.emulation.options import ControllerOptions
    from hpnlab.fabric.emulation.rewire import Rewire
    sent = []
    monkeypatch.setattr(supervisor.os, "killpg", lambda pid, sig: sent.append((pid, sig)))
    controller = supervisor.ControllerSupervisor(ControllerOptions(), g.graph["scenario"], g, Rewire(),
                                                 switches=None, metadata={})   # type: ignore[arg-type]
    controller.proc = _Proc()
    records = faults.Faults(g, lambda host, line: None, controller=controller).run_timeline(
        [{"at": 0, "action": "controller_freeze"}])
    assert [r["action"] for r in records] == ["controller_freeze"]
    assert sent == [(4242, timeline.signal.SIGSTOP), (4242, timeline.signal.SIGCONT)]


def test_a_controller_event_names_no_link():
    g = graph.build(spec.load("mini-hpn"))
    with pytest.raises(UserError, match="controller_freeze takes no 'link'"):
        load_timeline([{"at": 1, "action": "controller_freeze", "link": "p0l0-p0s0"}], g)


def test_a_route_notification_is_about_its_output_interface_an_address_or_link_one_about_its_index():
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
    from pyroute2.netlink.rtnl.rtmsg import rtmsg

    route, addr, link = rtmsg(), ifaddrmsg(), ifinfmsg()
    route["event"], route["attrs"] = "RTM_DELROUTE", [("RTA_DST", "fe80::"), ("RTA_OIF", 7)]
    addr["event"], addr["index"] = "RTM_NEWADDR", 9
    link["event"], link["index"] = "RTM_NEWLINK", 11
    assert [faults.notification_index(m) for m in (route, addr, link)] == [7, 9, 11]
    assert {route["event"], addr["event"]} <= faults.ROUTE_EVENTS and link["event"] not in faults.ROUTE_EVENTS


def test_the_link_idle_stall_probe_is_a_kind_that_fails_and_repairs_nothing_of_the_fabric():
    failover.Probe(kind="link-idle").check()
    assert "link-idle" not in failover.ACTIONS      # its events flap a veth pair outside Open vSwitch
    assert all(len(name) <= 15 for name in failover.IDLE_LINK)   # IFNAMSIZ


TRACE = """# tracer: nop
#
    ovs-vswitchd-4469    [000] ..... 1796316633.460622: sys_sendmmsg -> 0xffffffffffffff9c
    ovs-vswitchd-4469    [001] ..... 1796316633.461788: sys_sendto -> 0xfffffffffffffff5
    ovs-vswitchd-4469    [000] ..... 1796316633.463616: sys_sendmmsg -> 0xffffffffffffff9c
    revalidator231-18822 [001] ..... 1796316633.470000: sys_sendmsg -> 0xffffffffffffff9c
"""


def test_failed_sends_are_the_enetdown_returns_of_the_send_calls_in_wall_time():
    times = send_trace.parse(TRACE, tai_offset_s=37.0)
    assert times == pytest.approx([1796316596.460622, 1796316596.463616, 1796316596.470000])  # EAGAIN (-11) left out


def test_the_dead_port_window_counts_the_failed_sends_between_fault_and_repair():
    t0 = 1000.0
    w = send_trace.window([999.9, 1000.0012, 1000.0051, 1000.0098, 1000.9], t0, t0 + 0.5)
    assert w == {"dead_port_sends": 3, "dead_port_sends_later": 0, "dead_port_first_ms": pytest.approx(1.2),
                 "dead_port_last_ms": pytest.approx(9.8)}
    assert send_trace.window([], t0, t0 + 0.5) == {"dead_port_sends": 0, "dead_port_sends_later": 0,
                                                   "dead_port_first_ms": None, "dead_port_last_ms": None}


def test_the_last_send_into_the_dead_port_ends_the_datapaths_burst_not_at_bfds_later_packets():
    t0 = 1000.0
    datapath = [t0 + 0.001 + k * 0.0005 for k in range(12)]            # every 0.5 ms until 6.5 ms
    bfd = [t0 + 0.05, t0 + 0.1, t0 + 0.946]                             # the session's own packets
    w = send_trace.window(datapath + bfd, t0, t0 + 1.0)
    assert w["dead_port_last_ms"] == pytest.approx(6.5)
    assert w["dead_port_sends"] == 12 and w["dead_port_sends_later"] == 3


def test_stages_place_the_datapaths_last_send_into_the_dead_port_when_traced():
    t0 = _utc("2026-12-01T01:02:05.337")
    records = [{"start_wall": t0, "wall": t0 + 0.002}, {"start_wall": t0 + 0.9, "wall": t0 + 0.901}]
    st = failover.stages(records, {"delivering_again_ms": 11.0}, None, {}, [t0 + 0.001, t0 + 0.0085, t0 + 0.95])
    assert st["dead_port_sends"] == 2 and st["dead_port_last_ms"] == pytest.approx(8.5)
    assert "dead_port_sends" not in failover.stages(records, {}, None, {})     # not traced: no stage


def test_tracing_is_unavailable_without_tracefs_or_syscall_tracepoints(tmp_path):
    assert "no tracefs" in str(send_trace.unavailable(tmp_path / "none"))
    (tmp_path / "instances").mkdir()
    assert "syscall tracepoints" in str(send_trace.unavailable(tmp_path))
    for ev in send_trace.EVENTS:
        (tmp_path / "events" / "syscalls" / ev).mkdir(parents=True)
    assert send_trace.unavailable(tmp_path) is None


def test_a_dead_runs_ftrace_instances_are_removed_by_its_teardown(tmp_path):
    inst = tmp_path / "instances" / "hpnlab-run1-0"
    inst.mkdir(parents=True)
    other = tmp_path / "instances" / "someone-else"
    other.mkdir()
    assert send_trace.teardown({"ftrace_instances": [str(inst)]}) == 1
    assert not inst.exists() and other.exists()


def test_the_summary_gives_each_stage_in_a_failures_order():
    st = {"delivering_again_ms": {"n": 5, "median": 9.5}, "port_status_p0l0_ms": {"n": 5, "median": 1.9},
          "applied_ms": {"n": 5, "median": 1.1}, "dead_port_last_ms": {"n": 5, "median": 8.0},
          "stall_unaffected_ms": {"n": 5, "median": 3.0}}
    assert failover.stages_text(st) == ("; stages (ms after the fault, median): fault in place 1.1, PortStatus p0l0 "
                                        "1.9, last send into the dead port 8.0, delivering again 9.5")
    assert failover.stages_text({}) == ""


def _switch(t: str, prev: tuple[str, int, str], nxt: tuple[str, int]) -> str:
    return (f"   {prev[0]}-{prev[1]} [000] d..2. {t}: sched_switch: prev_comm={prev[0]} prev_pid={prev[1]} "
            f"prev_prio=110 prev_state={prev[2]} ==> next_comm={nxt[0]} next_pid={nxt[1]} next_prio=110")


SCHED = "\n".join(["# tracer: nop",
                   _switch("1000.001000", ("python", 8844, "S"), ("revalidator621", 8706)),
                   _switch("1000.001500", ("revalidator621", 8706, "S"), ("ovs-vswitchd", 4469)),
                   _switch("1000.004000", ("ovs-vswitchd", 4469, "R"), ("revalidator621", 8706)),
                   _switch("1000.004250", ("revalidator621", 8706, "S"), ("swapper/0", 0))])


def test_on_cpu_gives_each_threads_runs_from_the_scheduler_switches():
    runs = send_trace.on_cpu(SCHED, 0.0, {"8706": "revalidator621", "4469": "ovs-vswitchd"})
    assert runs["revalidator621/8706"] == [(1000.001, 1000.0015, "S"), (1000.004, 1000.00425, "S")]
    assert runs["ovs-vswitchd/4469"] == [(1000.0015, 1000.004, "R")]           # preempted, not asleep


def test_on_cpu_leaves_out_a_switch_out_whose_switch_in_was_lost():
    text = SCHED + "\n" + _switch("1000.009000", ("revalidator621", 8706, "S"), ("swapper/0", 0))
    runs = send_trace.on_cpu(text, 0.0, {"8706": "revalidator621"})
    assert [r[:2] for r in runs["revalidator621/8706"]] == [(1000.001, 1000.0015), (1000.004, 1000.00425)]
