"""`hpnlab run`'s -b/-e (cli/cmd_run.py ``size_bounds``): the sweep as nccl-tests reads it, and
``--compare routing``'s one size per collective."""
from __future__ import annotations

from hpnlab.cli.cmd_run import DEFAULTS, size_bounds

SMALLEST, LARGEST = str(min(DEFAULTS.size_list)), str(max(DEFAULTS.size_list))


def test_no_sizes_given_run_the_default_sweep():
    assert size_bounds(None, None) == (SMALLEST, LARGEST)


def test_a_lone_e_ends_the_default_sweep_there():
    assert size_bounds(None, "4M") == (SMALLEST, "4M")


def test_a_lone_e_below_the_default_sweep_is_its_only_size():
    assert size_bounds(None, "16K") == ("16K", "16K")


def test_compare_routing_runs_a_lone_e_at_that_size():
    assert size_bounds(None, "2M", one_size=True) == ("2M", "2M")


def test_compare_routing_runs_a_lone_b_at_that_size():
    assert size_bounds("2M", None, one_size=True) == ("2M", "2M")


def test_compare_routing_with_both_runs_the_b_size():
    assert size_bounds("256K", "2M", one_size=True) == ("256K", "256K")


def test_compare_routing_without_sizes_leaves_them_to_the_comparison():
    assert size_bounds(None, None, one_size=True) == (SMALLEST, LARGEST)


def test_the_default_sweep_gives_every_rank_32_to_256_kib_whatever_the_rank_count():
    from hpnlab.fabric.experiments import runner as experiment
    assert experiment.run_sizes(4) == experiment.sweep("128K", "1M")
    assert experiment.run_sizes(8) == experiment.sweep("256K", "2M") == DEFAULTS.size_list
    assert size_bounds(None, None, ranks=4) == (str(128 * 1024), str(1024 * 1024))


def test_the_default_ranks_are_the_scenarios_own_when_it_names_them():
    from hpnlab.fabric.experiments.prepare import default_ranks
    from hpnlab.fabric.scenario import graph, spec
    wide = spec.load("mini-hpn-wide")
    assert wide.emulation.ranks == 12
    assert default_ranks(graph.build(wide), 1, wide.emulation.ranks) == 12      # one per host
    assert default_ranks(graph.build(wide), 2, wide.emulation.ranks) == 6       # never more than a job's hosts
    mini = spec.load("mini-hpn")
    assert mini.emulation.ranks is None
    assert default_ranks(graph.build(mini), 1, mini.emulation.ranks) == DEFAULTS.ranks
