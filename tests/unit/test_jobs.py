"""Several different jobs at once: the --jobs syntax, plans of mixed jobs, and per-message
completion times (pure: no process is started)."""
import networkx as nx
import pytest

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec
from hpnlab.fabric.workload import jobspec, report
from hpnlab.fabric.workload.jobs import Job

MIX = "all_reduce:ranks=4,size=4M;incast:ranks=5,msg=16K,iters=20,gap=20ms"


# ---- the syntax ------------------------------------------------------------------------

def test_parse_reads_each_job_and_its_keys():
    ar, inc = jobspec.parse(MIX)
    assert ar == jobspec.JobSpec("all_reduce", ranks=4, sizes=(4 << 20,))
    assert inc == jobspec.JobSpec("incast", ranks=5, msg_bytes=16 << 10, iterations=20, gap_s=0.02)


def test_incast_msg_is_the_per_sender_size():
    (inc,) = jobspec.parse("incast:msg=16K")
    assert inc.sizes_for(5, (1,)) == (5 * 16 << 10,)


def test_unset_keys_fall_back_to_the_plan():
    (ar,) = jobspec.parse("allreduce")
    assert ar.collective == "all_reduce" and ar.sizes_for(4, (64, 128)) == (64, 128)


@pytest.mark.parametrize("text,why", [
    ("", "no job given"),
    ("bogus:ranks=2", "job 1 .*unknown collective 'bogus'"),
    ("all_reduce;incast:rank=5", "job 2 .*unknown key 'rank'"),
    ("incast:ranks", "'ranks' is not key=value"),
    ("incast:ranks=1", "ranks='1' is not a whole number of at least 2"),
    ("incast:ranks=x", "ranks='x' is not a whole number"),
    ("incast:size=lots", "size='lots' is not sizes in bytes"),
    ("incast:gap=soon", "gap='soon' is not a duration"),
    ("incast:gap=-5ms", "gap='-5ms' is not a duration"),
    ("all_reduce:msg=16K", "msg= is the incast's per-sender message size"),
    ("incast:msg=16K,size=64K", "size= or msg=, not both"),
    ("incast:ranks=3,ranks=4", "ranks given twice"),
    ("incast:ranks=3,root=3", "root 3 is not a rank"),
    (":ranks=3", "no collective"),
    ("all_reduce;incast:on=2", "on=2 must name an earlier job"),
    ("all_reduce:on=1", "the first job has none"),
    ("all_reduce;incast:on=0", "on='0' is not the number of an earlier job"),
    ("all_reduce;incast:on=1;incast:on=2", "job 2 runs on job 1's hosts itself; name job 1"),
])
def test_a_mistake_is_one_line_naming_the_job(text, why):
    with pytest.raises(UserError, match=why) as exc:
        jobspec.parse(text)
    assert "\n" not in str(exc.value)


def test_gap_units():
    assert [s.gap_s for s in jobspec.parse("incast:gap=5;incast:gap=2ms;incast:gap=0.5s;incast:gap=300us")] \
        == pytest.approx([0.005, 0.002, 0.5, 0.0003])


def test_describe_round_trips():
    for s in jobspec.parse(MIX):
        assert jobspec.parse_one(s.describe()) == s


def test_a_number_is_the_old_form():
    assert jobspec.is_count(" 2 ") and not jobspec.is_count("incast")


# ---- plans of mixed jobs -----------------------------------------------------------------

@pytest.fixture(scope="module")
def mini():
    return fgraph.build(spec.load("mini-hpn"))


def test_a_mix_is_one_run_per_transport_and_entropy_named_after_its_jobs():
    plan = experiment.Plan(job_specs=MIX, transports="roce", entropies="flow,spray")
    assert [r.collective for r in plan.matrix()] == ["all_reduce+incast"] * 2


def test_mixed_jobs_sit_on_disjoint_hosts_with_their_own_shapes(mini: nx.MultiGraph):
    plan = experiment.Plan(job_specs=MIX, transports="roce")
    (jobs,) = plan.jobs_on(mini).values()
    ar, inc = jobs
    assert (ar.collective, ar.nranks, ar.sizes) == ("all_reduce", 4, [4 << 20])
    assert (inc.collective, inc.nranks, inc.sizes, inc.iters, inc.gap_s) == ("incast", 5, [5 * 16 << 10], 20, 0.02)
    assert not set(ar.labels or []) & set(inc.labels or [])
    assert inc.base_port != ar.base_port


def test_too_many_ranks_for_the_fabric_is_one_line(mini):
    plan = experiment.Plan(job_specs="all_reduce:ranks=9;incast:ranks=9", transports="roce")
    with pytest.raises(UserError, match="need 18 hosts"):
        plan.jobs_on(mini)


def test_specs_and_a_job_count_together_are_refused():
    with pytest.raises(UserError, match="either a number of identical jobs or job specs"):
        experiment.Plan(job_specs=MIX, jobs=2)


SHARED = "all_to_all:ranks=4,size=1M;incast:ranks=3,msg=4K,on=1"


def test_on_reads_the_earlier_job_it_names_and_round_trips():
    a2a, inc = jobspec.parse(SHARED)
    assert a2a.on is None and inc.on == 0
    assert jobspec.parse_one(inc.describe(), 2) == inc


def test_a_job_with_on_runs_on_the_first_hosts_of_the_job_it_names(mini: nx.MultiGraph):
    plan = experiment.Plan(job_specs=SHARED, transports="roce")
    (jobs,) = plan.jobs_on(mini).values()
    a2a, inc = jobs
    assert a2a.labels and inc.labels == a2a.labels[:3] and inc.addrs == a2a.addrs[:3]
    assert inc.base_port != a2a.base_port          # their sockets do not collide on a shared host


def test_a_job_with_on_takes_no_hosts_of_its_own(mini: nx.MultiGraph):
    # 16 hosts: two jobs of 8 fit only if the co-located incast takes none
    plan = experiment.Plan(job_specs="all_reduce:ranks=8;incast:ranks=4,on=1;all_to_all:ranks=8", transports="roce")
    (jobs,) = plan.jobs_on(mini).values()
    first, shared, third = (set(j.labels or ()) for j in jobs)
    assert len(shared) == 4 and shared <= first
    assert not third & first


def test_on_with_more_ranks_than_the_job_it_names_is_one_line():
    with pytest.raises(UserError, match=r"job 2 .*5 ranks on job 1's 4 hosts"):
        experiment.Plan(job_specs="all_reduce:ranks=4;incast:ranks=5,on=1")


def test_jobs_without_on_may_not_share_an_address():
    plan = experiment.Plan(job_specs="all_reduce:ranks=2;incast:ranks=2", transports="tcp", base_port=20000)
    addrs = [[["10.0.0.1"], ["10.0.0.2"]], [["10.0.0.2"], ["10.0.0.3"]]]
    with pytest.raises(UserError, match=r"jobs 1 and 2 share address 10\.0\.0\.2"):
        plan.jobs_at(plan.matrix()[0], addrs, 1e7)


def test_loopback_puts_a_job_with_on_on_the_addresses_of_the_job_it_names():
    plan = experiment.Plan(job_specs=SHARED, transports="tcp", base_port=20000)
    a2a, inc = experiment.Loopback().addresses(plan)
    assert inc == a2a[:3]


def test_loopback_gives_each_job_its_own_rank_count():
    plan = experiment.Plan(job_specs="all_reduce:ranks=2;incast:ranks=3", transports="tcp", base_port=20000)
    addrs = experiment.Loopback().addresses(plan)
    assert [len(a) for a in addrs] == [2, 3]


def test_a_size_too_small_for_its_job_names_the_job():
    plan = experiment.Plan(job_specs="all_reduce:ranks=2;incast:ranks=4,size=8", transports="tcp", base_port=20000)
    with pytest.raises(UserError, match=r"job 2 \(incast\): size 8 B is too small"):
        experiment.Loopback().jobs(plan)


# ---- per-message completion times ----------------------------------------------------------

def test_completion_is_arrival_at_the_root_minus_the_senders_start():
    per_rank = {0: {"sent_at": [None, None], "recv_at": [[[1, 10.5], [2, 10.9]], [[1, 20.2], [2, 20.4]]]},
                1: {"sent_at": [10.0, 20.0], "recv_at": [[], []]},
                2: {"sent_at": [10.1, 20.1], "recv_at": [[], []]}}
    assert report.message_completions(per_rank) == pytest.approx([0.5, 0.8, 0.2, 0.3])


def test_a_message_whose_sender_has_no_start_is_skipped():
    per_rank = {0: {"recv_at": [[[1, 5.0], [2, 6.0]]]}, 1: {"sent_at": [4.0]}, 2: None}
    assert report.message_completions(per_rank) == pytest.approx([1.0])


def test_summary_percentiles_in_microseconds():
    s = report.completion_summary([i / 1000 for i in range(1, 101)])    # 1..100 ms
    assert s["messages"] == 100
    assert s["p50_us"] == pytest.approx(50_500)
    assert s["p99_us"] == pytest.approx(99_010)
    assert s["max_us"] == pytest.approx(100_000)


def test_summary_of_no_messages_says_none():
    assert report.completion_summary([])["p99_us"] is None


def test_aggregate_puts_per_message_figures_in_the_row_and_the_table_prints_them():
    def rank(r, sent, recv):
        return {"rank": r, "sizes": [{"size": 48, "count": 12, "param_count": 4, "ip": None,
                                      "oop": {"times_s": [0.001], "wrong": 0,
                                              "messages": {"sent_at": sent, "recv_at": recv}}}]}
    ranks = [rank(0, [None], [[[1, 1.002], [2, 1.004]]]), rank(1, [1.0], [[]]), rank(2, [1.0], [[]])]
    (row,) = report.aggregate(ranks, "incast")
    assert row["oop"]["messages"]["messages"] == 2
    assert row["oop"]["messages"]["max_us"] == pytest.approx(4000)
    result = {"collective": "incast", "nranks": 3, "rows": [row]}
    assert "per-message completion, size 48 B (2 messages" in report.format_table(result)


def test_after_is_a_start_delay_in_the_units_of_gap_and_round_trips():
    first, later = jobspec.parse("all_reduce:ranks=4;incast:ranks=4,msg=4K,on=1,after=1.5s")
    assert (first.after_s, later.after_s) == (0.0, 1.5)
    assert jobspec.parse_one(later.describe()) == later


def test_a_start_delay_that_is_not_a_duration_is_one_line():
    with pytest.raises(UserError, match=r"after='soon' is not a duration"):
        jobspec.parse("incast:after=soon")


def test_each_job_of_a_plan_carries_its_start_delay_to_its_ranks(mini: nx.MultiGraph):
    plan = experiment.Plan(job_specs="all_reduce:ranks=4,size=1M;all_reduce:ranks=4,size=1M,on=1,after=2s",
                           transports="roce")
    (jobs,) = plan.jobs_on(mini).values()
    assert [j.after_s for j in jobs] == [0.0, 2.0]
    assert Job.from_json(jobs[1].to_json()).after_s == 2.0


def test_two_jobs_on_the_same_earlier_job_share_its_hosts(mini: nx.MultiGraph):
    plan = experiment.Plan(job_specs="all_reduce:ranks=4,size=1M;incast:ranks=4,msg=4K,on=1;"
                                     "all_reduce:ranks=4,size=1M,on=1,after=2s", transports="roce")
    (jobs,) = plan.jobs_on(mini).values()
    assert jobs[1].labels == jobs[2].labels == jobs[0].labels
