"""Several jobs at once in the flow model from `hpnlab run`'s --jobs syntax (model.mix_jobs,
`hpnlab model --jobs ... --background ...`)."""
from __future__ import annotations

import json

import pytest

from hpnlab.cli.main import main
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.model import flow as model
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.workload import jobspec


@pytest.fixture(scope="module")
def mini():
    return graph.build(spec.load("mini-hpn"))


@pytest.fixture(scope="module")
def railed():
    return graph.build(spec.load("mini-rail"))          # 2 rails per host


def _mix(g, jobs, background="", **kw):
    kw.setdefault("default_size", 1 << 20)
    return model.mix_jobs(g, jobspec.parse(jobs), jobspec.parse(background) if background else (), **kw)


def test_jobs_take_disjoint_hosts_in_the_fabrics_order(mini):
    a, b = _mix(mini, "all_reduce:ranks=4,size=4M;all_to_all:ranks=6")
    hosts = graph.hosts(mini)
    assert a.hosts == hosts[:4] and b.hosts == hosts[4:10]
    assert (a.size_bytes, b.size_bytes) == (4 << 20, 1 << 20)          # b: the default size


def test_a_random_placement_is_seeded_and_still_disjoint(mini):
    a, b = _mix(mini, "all_reduce:ranks=4;all_to_all:ranks=4", placement="random", seed=3)
    again = _mix(mini, "all_reduce:ranks=4;all_to_all:ranks=4", placement="random", seed=3)
    assert [a.hosts, b.hosts] == [again[0].hosts, again[1].hosts] and not set(a.hosts) & set(b.hosts)


def test_ranks_count_every_rail_of_a_host(railed):
    [job] = _mix(railed, "all_reduce:ranks=8")
    assert len(job.hosts) == 4
    with pytest.raises(UserError, match="ranks=7 is not a whole number of hosts"):
        _mix(railed, "all_reduce:ranks=7")


def test_an_incast_message_size_makes_the_job_size_as_in_the_emulator(mini):
    [job] = _mix(mini, "incast:ranks=5,msg=16K")
    assert job.size_bytes == 5 * 16 * 1024


def test_a_job_with_on_shares_the_first_hosts_of_the_job_it_names(mini):
    a2a, inc, other = _mix(mini, "all_to_all:ranks=4;incast:ranks=3,on=1;all_reduce:ranks=2")
    hosts = graph.hosts(mini)
    assert inc.hosts == a2a.hosts[:3] and other.hosts == hosts[4:6]     # it took no hosts of its own


def test_a_background_job_with_on_is_one_line(mini):
    with pytest.raises(UserError, match="on= is for --jobs"):
        _mix(mini, "all_reduce:ranks=4", "permutation:ranks=4;incast:ranks=2,on=1")


def test_background_jobs_come_after_the_timed_ones_and_are_marked(mini):
    a, bg = _mix(mini, "all_reduce:ranks=4", "permutation:ranks=4,size=1G")
    assert (a.background, bg.background) == (False, True) and bg.size_bytes == 1 << 30


@pytest.mark.parametrize("jobs, message", [
    ("all_reduce:ranks=4,gap=20ms", "gap is the emulator's"),
    ("all_reduce:ranks=4;all_reduce:ranks=4,after=1s", "after is the emulator's start delay"),
    ("broadcast:ranks=4,root=2", "rank 0 as the root"),
    ("all_reduce:ranks=4,size=1M/4M", "one size per job"),
    ("all_reduce:ranks=12;all_to_all:ranks=8", "more than the 16 hosts"),
])
def test_what_the_model_cannot_honour_is_one_line_naming_the_job(mini, jobs, message):
    with pytest.raises(UserError, match=message):
        _mix(mini, jobs)


def test_the_command_prints_each_jobs_time_together_and_alone(capsys):
    assert main(["model", "mini-hpn", "--placement", "packed", "--routing", "flow",
                 "--jobs", "all_reduce:ranks=4,size=1M;all_to_all:ranks=4,size=1M",
                 "--background", "permutation:ranks=4,size=64M"]) == 0
    out = capsys.readouterr().out
    assert "2 job(s) at once" in out and "beside 1 background job(s)" in out
    assert len([x for x in out.splitlines() if x.strip().startswith("flow ")]) == 2


def test_the_commands_json_has_every_timed_job_per_routing_with_its_slowdown(capsys):
    assert main(["model", "mini-hpn", "--placement", "packed", "--routing", "flow,spray", "--json",
                 "--jobs", "all_reduce:ranks=4,size=1M", "--background", "permutation:ranks=4,size=64M"]) == 0
    doc = json.loads(capsys.readouterr().out)
    runs = doc["runs"]
    assert doc["background_jobs"] == [{"collective": "permutation", "hosts": 4, "size_bytes": 64 << 20}]
    assert [(r["routing"], r["collective"]) for r in runs] == [("flow", "all_reduce"), ("spray", "all_reduce")]
    for r in runs:
        assert r["slowdown"] == pytest.approx(r["time_s"] / r["alone_time_s"]) and r["slowdown"] >= 1.0


@pytest.mark.parametrize("argv, message", [
    (["--background", "permutation:ranks=4"], "--background needs --jobs"),
    (["--jobs", "all_reduce:ranks=4", "--fail-links", "1"], "--fail-links does not combine with --jobs"),
    (["--jobs", "warp:ranks=4"], "unknown collective"),
])
def test_a_bad_jobs_flag_is_one_line(capsys, argv, message):
    assert main(["model", "mini-hpn", *argv]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
