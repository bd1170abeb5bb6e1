"""One run prepared (hpnlab.fabric.experiments.prepare): the scenario loaded once, its rates sized for the
ranks that send, merged into the Scenario, every cell placed on the sized fabric (pure: no root)."""
from __future__ import annotations

import itertools

import pytest
from support.spy import spy

from hpnlab.fabric.emulation import sizing
from hpnlab.fabric.experiments import prepare as prep
from hpnlab.fabric.experiments.runner import RUN_DEFAULTS, Plan
from hpnlab.fabric.scenario import spec

#: a measured budget that carries more than the presets' rates (the switches' ceiling, no generators)
BUDGET = {**sizing.budget_document({"system": {"frames": {"4110": {"pps": [40_000]}, "1514": {"pps": [45_000]}}}},
                                   hops=3, cpus=2, load=[1.0]), "bringup": []}


@pytest.fixture
def measured(monkeypatch):
    monkeypatch.setattr(sizing, "load_budget", lambda path=None: BUDGET)


@pytest.fixture
def loads(monkeypatch):
    """Every spec.load of the run, by scenario name."""
    return spy(monkeypatch, spec, "load", lambda name, overrides=None: name)


def plan_for(ranks: int) -> Plan:
    return RUN_DEFAULTS.replace(ranks=ranks, sizes=(1 << 20,))


def test_a_run_is_loaded_once_and_its_sized_rates_are_in_the_scenario_it_returns(measured, loads):
    run = prep.prepare("mini-hpn", {}, plan=plan_for)
    assert loads == ["mini-hpn"]
    assert run.rates["emulation"]["host_mbps"] == run.scenario.emulation.host_mbps
    assert run.scenario.emulation.host_mbps != spec.load("mini-hpn").emulation.host_mbps
    assert run.graph.graph["scenario"] is run.scenario
    assert "measured budget" in run.rates_line


def test_the_sized_scenario_is_the_one_loading_it_with_the_rates_would_give(measured):
    over = {"planes": 1}
    run = prep.prepare("mini-hpn", over, plan=plan_for)
    assert run.scenario == spec.load("mini-hpn", spec.deep_merge(over, run.rates))
    assert run.all_overrides == spec.deep_merge(over, run.rates)


def test_a_scenario_already_loaded_is_not_loaded_again(measured, loads):
    scenario = spec.load("mini-hpn")
    loads.clear()
    run = prep.prepare(scenario, {}, plan=plan_for)
    assert loads == [] and run.scenario.name == "mini-hpn"


def test_a_rate_the_user_set_is_kept(measured):
    over = {"emulation": {"host_mbps": 3, "mtu": 1500}}
    run = prep.prepare(spec.load("mini-hpn", over), over, plan=plan_for)
    assert run.rates == {} and run.scenario.emulation.host_mbps == 3 and "rates as set" in run.rates_line


def test_the_rates_are_sized_for_every_rank_of_every_job(measured, monkeypatch):
    sized = []
    real = sizing.rates_for_ranks
    def counted(g, over, ranks):
        sized.append(ranks)
        return real(g, over, ranks)
    monkeypatch.setattr(sizing, "rates_for_ranks", counted)
    run = prep.prepare("mini-hpn", {}, plan=lambda r: RUN_DEFAULTS.replace(ranks=r, jobs=2), jobs=2)
    assert run.ranks is not None and sized == [run.ranks * 2] and run.sending_ranks == run.ranks * 2


def test_every_cell_is_placed_on_the_sized_fabric(measured):
    run = prep.prepare("mini-hpn", {}, plan=plan_for)
    assert run.plan is not None and run.cells == run.plan.jobs_on(run.graph)
    assert len(run.cells) == len(run.plan.matrix())


def test_the_caller_has_the_last_word_on_the_rates(measured):
    run = prep.prepare("mini-hpn", {}, plan=plan_for,
                       adjust_rates=lambda rates, line: ({"emulation": {"host_mbps": 2.5}}, line + "; halved"))
    assert run.scenario.emulation.host_mbps == 2.5 and run.rates_line.endswith("; halved")


def test_without_sizing_the_scenario_keeps_its_rates(measured):
    run = prep.prepare("mini-hpn", {}, size=False)
    assert run.rates == {} and run.scenario == spec.load("mini-hpn") and run.cells == {}


def test_the_ranks_given_win_and_the_default_is_the_scenarios_own_within_a_jobs_hosts(measured):
    assert prep.prepare("mini-hpn", {}, plan=plan_for, ranks=4).ranks == 4
    run = prep.prepare("mini-hpn-wide", {}, plan=plan_for)
    assert run.ranks == 12 and "emulation.ranks" in run.ranks_line
    assert prep.prepare("mini-hpn-wide", {}, plan=lambda r: RUN_DEFAULTS.replace(ranks=r, jobs=2), jobs=2).ranks == 6


def test_a_plan_that_does_not_fit_the_fabric_is_one_line_before_anything_is_built(measured):
    from hpnlab.fabric.errors import UserError
    with pytest.raises(UserError):
        prep.prepare("mini-hpn", {}, plan=plan_for, ranks=64)


@pytest.mark.parametrize("name", spec.preset_names() + ["fat-tree-4"])
def test_merging_rates_into_a_loaded_scenario_equals_loading_it_with_them(name):
    rates = {"emulation": {"host_mbps": 13.5, "max_mbps": 27.0, "mtu": 4096}}
    assert spec.merged(spec.load(name), rates) == spec.load(name, rates)


# ---- every command that emulates prepares its run with prepare(): the scenario loaded once -----------

class Built(Exception):
    """Raised where the command builds its emulation: the scenario it was handed."""

    def __init__(self, scenario: spec.Scenario):
        super().__init__(scenario.name)
        self.scenario = scenario


@pytest.mark.parametrize("argv", [
    ["emulate", "mini-hpn", "--set", "planes=1"],
    ["run", "mini-hpn", "--set", "planes=1", "--collective", "all_reduce", "--transport", "tcp"],
    ["demo", "mini-hpn", "--set", "planes=1", "--no-measure"],
    ["fidelity", "mini-hpn", "--set", "planes=1"],
], ids=lambda argv: argv[0])
def test_a_command_that_emulates_loads_its_scenario_once_and_emulates_the_prepared_one(argv, measured, loads,
                                                                                        monkeypatch):
    from hpnlab.cli.main import main
    from hpnlab.fabric import emulation

    def built(scenario, options=None, **kw):
        raise Built(scenario)
    monkeypatch.setattr(emulation, "Emulation", built)
    with pytest.raises(Built) as exc:
        main(argv)
    assert loads == ["mini-hpn"]
    assert exc.value.scenario.planes == 1 and exc.value.scenario.name == "mini-hpn"
    preset_mbps = spec.load("mini-hpn").emulation.host_mbps
    sized = argv[0] != "emulate"              # emulate runs the scenario's rates; the others size them
    assert (exc.value.scenario.emulation.host_mbps != preset_mbps) == sized


# ---- the demo's sweep fits its rate ---------------------------------------------------------------

def test_a_sweep_the_rate_carries_in_time_is_kept():
    from hpnlab.fabric.experiments import runner
    sizes = runner.run_sizes(8)                          # 256K-2M
    assert runner.fit_sizes(sizes, 8, 40e6, 2) == sizes  # 2 MiB at 2 x 40 Mbit/s: 0.37 s


def test_a_slow_rate_halves_the_whole_sweep_until_the_largest_all_reduce_fits():
    from hpnlab.fabric.experiments import runner
    from hpnlab.fabric.workload.collectives import busbw_factor
    sizes = runner.run_sizes(8)
    fitted = runner.fit_sizes(sizes, 8, 2e6, 2)
    assert len(fitted) == len(sizes) and all(a * 2 == b for a, b in itertools.pairwise(fitted))
    assert busbw_factor("all_reduce", 8) * fitted[-1] * 8 / 4e6 <= runner.DEMO_LARGEST_S
    assert busbw_factor("all_reduce", 8) * fitted[-1] * 2 * 8 / 4e6 > runner.DEMO_LARGEST_S   # no smaller than needed


def test_the_sweep_never_falls_below_the_floor_per_rank():
    from hpnlab.fabric.experiments import runner
    assert min(runner.fit_sizes(runner.run_sizes(8), 8, 1e3, 1, floor=4096)) >= 4096 * 8
