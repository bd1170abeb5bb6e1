"""Open vSwitch's own fast failover without hpnlab (tools/probes/ovs_floor.py): what it builds, what
it takes down, and, on a live Open vSwitch, that a link down moves every flow to the backup
and that it leaves nothing of its own behind."""
from __future__ import annotations

import ovs_floor
import pytest


def test_every_name_fits_a_linux_interface_name_for_the_largest_pid():
    n = ovs_floor.names(4194304)          # pid_max's ceiling on 64-bit Linux
    assert all(len(v) <= 15 for k, v in n.items() if not k.startswith("ns_"))
    assert len(set(n.values())) == len(n)


def test_each_kind_takes_down_its_ends_of_link_one():
    n = ovs_floor.names(7)
    assert ovs_floor.fault_ends("both", n) == ["hf7a1", "hf7b1"]
    assert ovs_floor.fault_ends("near", n) == ["hf7a1"]      # the group's own port
    assert ovs_floor.fault_ends("far", n) == ["hf7b1"]       # its peer: the group's port loses carrier


def test_the_first_bridge_sends_through_a_group_that_watches_link_one_then_link_two():
    flows = ovs_floor.openflow(ovs_floor.names(7))
    group, = [line for line in flows["hff7a"] if line.startswith("group:")]
    assert "type=fast_failover" in group
    assert group.index("watch_port:2,actions=output:2") < group.index("watch_port:3,actions=output:3")
    assert "flow:in_port=1,actions=group:1" in flows["hff7a"]


DESC = """OFPST_PORT_DESC reply (OF1.3) (xid=0x2):
 1(hf7as): addr:aa:bb:cc:dd:ee:01
     config:     0
     state:      LIVE
 2(hf7a1): addr:aa:bb:cc:dd:ee:02
     config:     0
     state:      LINK_DOWN
 3(hf7a2): addr:aa:bb:cc:dd:ee:03
     config:     0
     state:      LIVE
 LOCAL(hff7a): addr:aa:bb:cc:dd:ee:04
     config:     PORT_DOWN
     state:      LINK_DOWN
"""


def test_a_port_is_live_only_when_its_state_says_live():
    assert ovs_floor.live_ports(DESC) == {"hf7as", "hf7a2"}


def test_the_summary_pools_the_kinds_per_port_count_and_compares_with_the_fewest_ports():
    windows = {0: (3.0, 4.0, 8.0), 30: (9.0, 10.0, 11.0)}          # both, near, far
    reps = [{"idle_links": n, "kind": k, "loss_window_ms": w, "fault_in_place_ms": 1.0}
            for n, ws in windows.items() for k, w in zip(("both", "near", "far"), ws, strict=True)]
    s = ovs_floor.summarise(reps, [0, 30], ["both", "near", "far"])
    assert s[0]["ports"] == 6 and s[30]["ports"] == 66
    assert s[0]["all"]["median"] == 4.0 and s[30]["all"]["median"] == 10.0
    assert s[0]["at_most_5ms"] == 2 and s[30]["at_most_5ms"] == 0
    assert s[0]["ratio"] == 1.0 and s[30]["ratio"] == 2.5
    assert s[30]["kinds"]["near"]["median"] == 10.0


def test_revalidator_rounds_are_its_threads_runs_after_the_fault_joined_within_a_millisecond():
    t0 = 100.0
    runs = {"revalidator12/77": [(99.99, 99.991, "S"), (100.0021, 100.0022, "S"), (100.0026, 100.0027, "S"),
                                 (100.0072, 100.0075, "S"), (100.5, 100.501, "S")],
            "ovs-vswitchd/70": [(100.001, 100.002, "S")], "revalidator13/78": [(100.0073, 100.0074, "S")]}
    assert ovs_floor.revalidator_runs(runs, t0) == [2.1, 7.2]          # before, and 500 ms after, are not the fault's


def test_the_summary_says_how_far_apart_the_revalidators_first_two_rounds_were():
    reps = [{"idle_links": 0, "kind": "near", "loss_window_ms": w, "fault_in_place_ms": 1.0, "revalidator_runs_ms": r}
            for w, r in ((3.5, [2.5]), (8.5, [2.0, 7.0]), (9.0, [2.2, 7.4]))]
    rv = ovs_floor.summarise(reps, [0], ["near"])[0]["revalidator"]
    assert rv["traced"] == 3 and rv["two_rounds_or_more"] == 2
    assert rv["spacing_ms"]["median"] == pytest.approx(5.1)


@pytest.mark.parametrize("args, says", [(["--idle-links", "0,x"], "not a comma list of whole numbers"),
                                        (["--idle-links", "0,300"], "--idle-links 300: not between 0 and 200"),
                                        (["--repeat", "0"], "--repeat 0: not between 1 and 100")])
def test_a_bad_count_is_refused_in_one_line(capsys, args, says):
    with pytest.raises(SystemExit) as e:
        ovs_floor.main(args)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_an_unknown_kind_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        ovs_floor.main(["--kinds", "both,sideways"])
    assert e.value.code == 2
    assert "sideways: not one of both, near, far" in capsys.readouterr().err
