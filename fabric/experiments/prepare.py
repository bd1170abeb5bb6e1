"""One run prepared: the scenario loaded once, its rates sized for this machine, its ranks placed.

Every command that emulates (``hpnlab emulate``, ``run``, ``demo``, ``fidelity``) and the
benchmarks that do the same call :func:`prepare`; the Scenario it returns is what the emulation is
built from (``Emulation(prepared.scenario, options)``), never loaded again. In order:

1. **load**: the scenario (a preset, ``fat-tree-K`` or a file) with the user's overrides (``--set``),
   validated once; or a Scenario already loaded (its overrides then only say what the user set);
2. **ranks**: per job, as given, else the scenario's ``emulation.ranks``, else ``RUN_DEFAULTS.ranks``,
   never more than the hosts a job gets (:func:`default_ranks`); the plan is made for them;
3. **rates**: the emulated rates the machine's measured budget carries for the ranks that send at
   once (``hpnlab.fabric.emulation.sizing.rates_for_ranks``; a rate the user set is kept), then
   whatever the caller adjusts (``adjust_rates``: the routing comparison's share), merged into the
   Scenario (``spec.merged``) and the graph built again from it;
4. **placement**: every cell of the plan placed on that graph (``Plan.jobs_on``): every mistake in
   the plan shows here, before anything is built.

The result, :class:`PreparedRun`, is a plain value: the Scenario with the rates applied, its graph,
the plan and its cells, and each decision with the line that says why.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from hpnlab.fabric.emulation import sizing
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec

from .runner import RUN_DEFAULTS, Plan

__all__ = ["PreparedRun", "default_ranks", "prepare", "ranks_in_all"]

#: adjusts the sized rates: (rates overrides, why) -> (rates overrides, why)
RatesAdjust = Callable[[dict[str, Any], str], tuple[dict[str, Any], str]]


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to be emulated (see the module docstring)."""
    #: the validated Scenario, the sized rates merged into it
    scenario: spec.Scenario
    #: its fabric graph
    graph: nx.MultiGraph
    #: the user's overrides (``--set``), as given
    overrides: dict[str, Any] = field(default_factory=dict)
    #: the overrides the sizing added ({}: none), and where the rates come from
    rates: dict[str, Any] = field(default_factory=dict)
    rates_line: str = ""
    #: ranks per job and why; the ranks that send at once, in all jobs together
    ranks: int | None = None
    ranks_line: str = ""
    sending_ranks: int | None = None
    #: the plan made for those ranks, and every cell of it placed on ``graph`` (``Plan.jobs_on``)
    plan: Plan | None = None
    cells: dict[Any, Any] = field(default_factory=dict)

    @property
    def all_overrides(self) -> dict[str, Any]:
        """The user's overrides with the sized rates on top: what the Scenario is the preset plus."""
        return spec.deep_merge(self.overrides, self.rates)


def default_ranks(g: nx.MultiGraph, jobs: int, preferred: int | None = None) -> int:
    """The default ranks per job: the scenario's ``emulation.ranks`` (``preferred``) or
    ``RUN_DEFAULTS.ranks``, and never more than the hosts a job gets."""
    return max(2, min(preferred or RUN_DEFAULTS.ranks, len(fgraph.hosts(g)) // max(1, jobs)))


def _ranks_line(g: nx.MultiGraph, jobs: int, given: int | None, preferred: int | None, ranks: int) -> str:
    if given is not None:
        return f"{ranks} ranks per job, as given"
    source = "the scenario's emulation.ranks" if preferred else "the default"
    cap = len(fgraph.hosts(g)) // max(1, jobs)
    return (f"{ranks} ranks per job ({source}" + (f", at most the {cap} hosts a job gets" if ranks == cap else "")
            + ")")


def ranks_in_all(plan: Plan) -> int:
    """The ranks of every job of ``plan`` together (each sends on its host's ports)."""
    return sum(plan.ranks_of(j) for j in plan.host_jobs()) if plan.specs else plan.ranks * plan.jobs


def prepare(scenario: str | spec.Scenario, overrides: Mapping[str, Any] | None = None, *,
            plan: Plan | Callable[[int], Plan] | None = None, jobs: int = 1, ranks: int | None = None,
            size: bool = True, adjust_rates: RatesAdjust | None = None) -> PreparedRun:
    """Load, size and place one run (see the module docstring).

    ``scenario``: a preset name, ``fat-tree-K`` or a YAML file, loaded with ``overrides``; or a
    Scenario already loaded with them (``overrides`` then say only which fields the user set: a rate
    the user set is kept). ``plan``: the run's Plan, or a function of the ranks per job that makes it
    (``jobs``: how many jobs share the hosts, for the default ranks); None: no ranks are placed, and
    the rates are sized for ``ranks`` ranks (default: every host). ``size``: False keeps the
    scenario's rates as they are. ``adjust_rates``: a last word on the sized rates (e.g.
    ``compare_routing.comparison_rates``)."""
    given = dict(overrides or {})
    loaded = scenario if isinstance(scenario, spec.Scenario) else spec.load(scenario, given)
    g = fgraph.build(loaded)
    per_job = ranks if ranks is not None else default_ranks(g, jobs, loaded.emulation.ranks)
    ranks_line = _ranks_line(g, jobs, ranks, loaded.emulation.ranks, per_job)
    the_plan = plan(per_job) if callable(plan) else plan
    sending = ranks_in_all(the_plan) if the_plan is not None else ranks
    rates: dict[str, Any] = {}
    rates_line = f"rates of the scenario: host ports {loaded.emulation.host_mbps:g} Mbit/s"
    if size:
        rates, rates_line = sizing.rates_for_ranks(g, given, sending or len(fgraph.hosts(g)))
        if adjust_rates is not None:
            rates, rates_line = adjust_rates(rates, rates_line)
        if rates:
            loaded = spec.merged(loaded, rates)
            g = fgraph.build(loaded)
    cells = the_plan.jobs_on(g) if the_plan is not None else {}
    return PreparedRun(scenario=loaded, graph=g, overrides=given, rates=rates, rates_line=rates_line,
                       ranks=per_job if the_plan is not None or ranks is not None else None,
                       ranks_line=ranks_line, sending_ranks=sending, plan=the_plan, cells=cells)
