"""Experiments as a library (``hpnlab.fabric.experiments.runner``): the plan is checked when it is made,
its matrix and jobs are plain data, and the README's Python example runs as printed."""
from __future__ import annotations

import contextlib
import io
import re

import pytest
from support.paths import REPO

from hpnlab.fabric.emulation import timeline
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.runner import Plan, Run
from hpnlab.fabric.scenario import graph, spec

README = REPO / "README.md"
TIMELINE_UNREPAIRED = REPO / "tests" / "support" / "data" / "timeline-unrepaired.yaml"


def test_the_matrix_is_collectives_by_transports_by_entropies_with_tcp_once():
    plan = Plan(collectives="all_reduce,alltoall", transports=["roce", "tcp"], entropies=("flow", "spray"))
    assert plan.matrix() == [
        Run("all_reduce", "roce", "flow"), Run("all_reduce", "roce", "spray"), Run("all_reduce", "tcp", None),
        Run("all_to_all", "roce", "flow"), Run("all_to_all", "roce", "spray"), Run("all_to_all", "tcp", None)]


def test_sizes_follow_nccl_tests_b_e_f_and_accept_size_strings():
    assert experiment.sweep("64K", "512K") == (65536, 131072, 262144, 524288)
    assert Plan(sizes=["1K", 4096]).sizes == (1024, 4096)
    assert Plan(sizes="2M").sizes == (2 << 20,)


@pytest.mark.parametrize("fields,message", [
    ({"collectives": "all_reduse"}, "unknown collective 'all_reduse'"),
    ({"collectives": ""}, "no collective given"),
    ({"transports": "rdma"}, "unknown transport 'rdma' (known: tcp, roce)"),
    ({"entropies": "rainbow"}, "unknown entropy 'rainbow'"),
    ({"flowlet_gap_us": 0}, "--flowlet-gap-us must be above 0"),
    ({"sizes": ()}, "no sizes to run"),
    ({"sizes": "lots"}, "not a size"),
    ({"iterations": 0}, "-n must be at least 1"),
    ({"placement": "same-plane"}, "unknown placement 'same-plane'"),
    ({"ranks": 1}, "--ranks must be at least 2"),
    ({"jobs": 0}, "--jobs must be at least 1"),
    ({"perm": "reverse"}, "unknown permutation"),
    ({"recovery": "fast"}, "unknown recovery"),
    ({"pace": 2.0}, "--pace must be between 0.1 and 1"),
])
def test_a_bad_plan_is_refused_in_one_line_when_it_is_made(fields, message):
    with pytest.raises(UserError) as info:
        Plan(**fields)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_jobs_on_a_fabric_graph_carry_the_placed_hosts_addresses_and_emulated_rate():
    g = graph.build(spec.load("mini-hpn"))
    s = g.graph["scenario"]
    plan = Plan(collectives="all_reduce", transports="roce,tcp", entropies="spray", sizes="64K",
                placement="cross-rail", ranks=4, jobs=2)
    cells = plan.jobs_on(g)
    assert list(cells) == plan.matrix()
    roce, tcp = cells[Run("all_reduce", "roce", "spray")], cells[Run("all_reduce", "tcp", None)]
    assert [j.job for j in roce] == [0, 1] and all(j.nranks == 4 for j in roce)
    assert roce[0].labels is not None and roce[1].labels is not None
    assert not set(roce[0].labels) & set(roce[1].labels)            # concurrent jobs: disjoint hosts
    for job in roce:
        for host, addrs in zip(job.labels or [], job.addrs, strict=True):
            ips = {p["ip"] for p in graph.host_ports(g, host)}
            assert len(addrs) == s.planes and set(addrs) <= ips       # one address per plane, its own
    assert roce[0].line_rate_bps == s.emulation.host_mbps * 1e6
    assert roce[1].base_port - roce[0].base_port == 100             # concurrent jobs, disjoint ports
    assert (roce[0].entropy, tcp[0].transport) == ("spray", "tcp")


def test_placement_mistakes_show_before_anything_is_built():
    g = graph.build(spec.load("mini-hpn"))
    with pytest.raises(UserError, match="same-rail: a segment has 4 hosts"):
        Plan(placement="same-rail", ranks=8).jobs_on(g)
    with pytest.raises(UserError, match="cross-campus needs"):
        Plan(placement="cross-campus").jobs_on(g)
    with pytest.raises(UserError, match="too small for all_to_all over 4 ranks"):
        Plan(collectives="all_to_all", sizes=8).jobs_on(g)


def test_loopback_puts_rank_r_of_job_j_on_plane_p_at_127_p_j_first_plus_r():
    where = experiment.Loopback(planes=2, first=10)
    assert where.addresses(Plan(ranks=3, jobs=2)) == [
        [["127.0.0.10", "127.1.0.10"], ["127.0.0.11", "127.1.0.11"], ["127.0.0.12", "127.1.0.12"]],
        [["127.0.1.10", "127.1.1.10"], ["127.0.1.11", "127.1.1.11"], ["127.0.1.12", "127.1.1.12"]]]


def test_loopback_picks_a_base_port_every_rank_can_bind():
    import socket
    addrs = experiment.Loopback(planes=2).addresses(Plan(ranks=3))
    base = experiment.free_base_port(addrs)
    for r, mine in enumerate(addrs[0]):
        for a in mine:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((a, base + r))


def test_running_on_something_that_is_not_a_target_is_one_line():
    with pytest.raises(UserError, match=r"give an Emulation, experiment\.Loopback or experiment\.Hosts"):
        experiment.run(Plan(), "mini-hpn")


def test_per_plane_bytes_come_from_the_hosts_interface_counters():
    dev = ("Inter-|   Receive                            |  Transmit\n"
           " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs\n"
           "    lo:     100       1    0    0    0     0          0         0      100       1    0\n"
           "h1-eth0: 5000      50    0    0    0     0          0         0     7000      70    0\n"
           "h1-eth1: 6000      60    0    0    0     0          0         0     9000      90    0\n")
    after = experiment.tx_bytes_by_interface(dev)
    assert after == {"lo": 100, "h1-eth0": 7000, "h1-eth1": 9000}
    intfs = [{"name": "h1-eth0", "plane": 0}, {"name": "h1-eth1", "plane": 1}]
    assert experiment.plane_bytes(intfs, {"h1-eth0": 1000, "h1-eth1": 8000}, after) == [6000, 1000]


def events(*rows):
    return [timeline.Event(at, action, tuple(target), key) for at, action, target, key in rows]


def test_a_timeline_that_repairs_everything_it_breaks_leaves_nothing_failed():
    assert experiment.left_failed(events((1, "link_down", ["p0l0", "p0s0"], None),
                                         (2, "switch_down", ["p1s0"], None),
                                         (3, "link_up", ["p0s0", "p0l0"], None),
                                         (4, "switch_up", ["p1s0"], None))) == []


def test_a_timeline_names_what_it_leaves_failed():
    left = experiment.left_failed(events((1, "link_down", ["p0l0", "p0s0"], 0),
                                         (1, "link_down", ["p0l1", "p0s0"], None),
                                         (2, "link_up", ["p0l1", "p0s0"], None),
                                         (3, "switch_down", ["p1s1"], None)))
    assert left == ["link_down p0l0-p0s0#0", "switch_down p1s1"]


def test_a_timeline_on_loopback_is_refused_in_one_line():
    with pytest.raises(UserError, match="a failure timeline needs an emulated fabric"):
        experiment.run(Plan(), experiment.Loopback(), timeline=events((1, "switch_down", ["p1s1"], None)))


def readme_example() -> str:
    """The Python block of the README's 'From Python' section, exactly as printed."""
    text = README.read_text()
    section = text[text.index("### From Python"):]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "README: no python block under 'From Python'"
    return block.group(1)


def test_the_readme_python_example_is_ten_lines_or_fewer():
    lines = [line for line in readme_example().splitlines() if line.strip()]
    assert len(lines) <= 10


def test_the_readme_python_example_runs_and_prints_verified_nccl_tests_tables():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(readme_example(), str(README), "exec"), {})    # the README's own code
    text = out.getvalue()
    tables = text.count("# Avg bus bandwidth")
    assert tables >= 1 and text.count("# Out of bounds values : 0 OK") == tables, text


@pytest.mark.parametrize("argv,message", [
    (["--placement", "same-rail", "--ranks", "8"], "same-rail: a segment has 4 hosts"),
    (["--collective", "all_reduse"], "unknown collective 'all_reduse'"),
    (["--transport", "roce,rdma"], "unknown transport 'rdma'"),
    (["--timeline", "/nonexistent/t.yaml"], "timeline file not found"),
    (["--timeline", str(TIMELINE_UNREPAIRED), "--collective", "all_reduce", "--transport", "roce",
      "--entropy", "flow,spray"],
     "the timeline leaves link_down p0l0-p0s0 failed: with 2 runs it must repair what it breaks"),
])
def test_the_run_command_refuses_a_bad_plan_in_one_line_before_building_anything(argv, message):
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-m", "hpnlab.cli", "run", "mini-hpn", *argv], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "emulating" not in res.stdout
