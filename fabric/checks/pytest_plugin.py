"""hpnlab's pytest plugin: a user's fabric regression test in a few lines.

Registered through the ``pytest11`` entry point (name ``hpnlab``), so it loads in every pytest
run once hpnlab is installed; ``pytest -p no:hpnlab`` turns it off. It costs nothing to a test
that uses none of its fixtures: the fixtures import hpnlab's modules only when first used.

Fixtures (function scope; what they build is cached per scenario for the session, so treat
the graph and tables as read-only)
    hpn_scenario   the validated ``Scenario``. Which one: the test's marker
                   ``@pytest.mark.hpn_scenario("mini-hpn", "my-fabric.yaml")`` (the test runs
                   once per name), else every ``--hpn-scenario NAME`` given on the command
                   line, else ``mini-hpn``.
    hpn_graph      its fabric graph (``hpnlab.fabric.scenario.graph.build``).
    hpn_tables     the compiled state of every switch (``compiler.compile_fabric``, policy
                   ``aggregate``): {switch: SwitchState}.
    hpn_walker     a packet walker over those tables (``hpnlab.fabric.routing.oftable.FabricTables``:
                   ``hpn_walker.send("h1", "h5", plane=0).result == "delivered"``); skips with
                   "table interpreter not installed" when that module is missing.
    hpn_check      the design rules (``hpnlab.fabric.checks.rules``) run on the scenario, with the
                   rules file ``--hpn-rules FILE`` if given: a list of RuleResult with
                   ``.failed`` (the failing rows) and ``.rule(name)``.
    hpn_emulation  the scenario emulated (``hpnlab.fabric.emulation.Emulation``: real Open
                   vSwitch, the hpnlab controller), torn down after the test; skips naming
                   what is missing (root, Open vSwitch, Mininet). One emulation per machine:
                   it waits up to 300 s for hpnlab's lock.

    import pytest

    @pytest.mark.hpn_scenario("my-fabric.yaml")
    def test_design_rules_pass(hpn_check):
        assert not hpn_check.failed, hpn_check.failed
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

DEFAULT_SCENARIO = "mini-hpn"
MARKER = "hpn_scenario"
_CACHE_KEY = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hpnlab", "hpnlab fabric fixtures")
    group.addoption("--hpn-scenario", action="append", default=[], metavar="SCENARIO",
                    help="scenario (preset name or YAML file) for hpnlab's fixtures in tests without an "
                         "hpn_scenario marker (repeatable: the tests run once per scenario)")
    group.addoption("--hpn-rules", default=None, metavar="FILE", help="rules file for the hpn_check fixture")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(*scenarios): run the test with hpnlab's fixtures on these "
                                       "scenarios (preset names or YAML files), once per scenario")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if MARKER not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if MARKER in (names.replace(" ", "").split(",") if isinstance(names, str) else names):
            return      # the test parametrizes the scenario itself
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is not None:
        scenarios = list(marker.args)
        if not scenarios:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.{MARKER} needs a scenario name")
    else:
        scenarios = list(metafunc.config.getoption("hpn_scenario") or [DEFAULT_SCENARIO])
    metafunc.parametrize(MARKER, scenarios, indirect=True, ids=[os.path.basename(str(s)) for s in scenarios])


def _cache(config: pytest.Config) -> dict:
    if _CACHE_KEY not in config.stash:
        config.stash[_CACHE_KEY] = {}
    return config.stash[_CACHE_KEY]


def _cached(request: pytest.FixtureRequest, what: str, name: Any, build: Any) -> Any:
    cache = _cache(request.config)
    key = (what, str(name))
    if key not in cache:
        cache[key] = build()
    return cache[key]


@pytest.fixture
def hpn_scenario(request: pytest.FixtureRequest) -> Any:
    """The validated Scenario (see the module docstring for which one)."""
    from hpnlab.fabric.errors import UserError
    from hpnlab.fabric.scenario import spec

    name = getattr(request, "param", None)
    if name is None:
        options = request.config.getoption("hpn_scenario") or [DEFAULT_SCENARIO]
        name = options[0]
    try:
        return _cached(request, "scenario", name, lambda: spec.load(name))
    except UserError as exc:
        message = f"hpn_scenario {name}: {exc}"
    pytest.fail(message, pytrace=False)      # outside the except: no chained traceback


@pytest.fixture
def hpn_graph(request: pytest.FixtureRequest, hpn_scenario: Any) -> Any:
    """The scenario's fabric graph (networkx MultiGraph; shared, read-only)."""
    from hpnlab.fabric.scenario import graph

    return _cached(request, "graph", _key(hpn_scenario), lambda: graph.build(hpn_scenario))


def _key(scenario: Any) -> str:
    return f"{scenario.source or scenario.name}:{hash(scenario)}"


@pytest.fixture
def hpn_tables(request: pytest.FixtureRequest, hpn_scenario: Any, hpn_graph: Any) -> dict:
    """{switch: SwitchState}: the compiled tables of every switch (policy aggregate)."""
    from hpnlab.fabric.routing import compiler

    return _cached(request, "tables", _key(hpn_scenario), lambda: compiler.compile_fabric(hpn_graph))


@pytest.fixture
def hpn_walker(hpn_graph: Any, hpn_tables: dict) -> Any:
    """A packet walker over the compiled tables (a fresh one per test: it holds failures)."""
    try:
        from hpnlab.fabric.routing.oftable import FabricTables  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pytest.skip("table interpreter not installed (hpnlab.fabric.routing.oftable)")
    return FabricTables(hpn_graph, hpn_tables)


class CheckResults(list):
    """The design rules' RuleResult rows, with the failing ones at hand."""

    @property
    def failed(self) -> list:
        return [r for r in self if not r.ok]

    def rule(self, name: str) -> list:
        return [r for r in self if r.rule == name]


@pytest.fixture
def hpn_check(request: pytest.FixtureRequest, hpn_scenario: Any, hpn_graph: Any) -> CheckResults:
    """The design rules run on the scenario (rules file: ``--hpn-rules``)."""
    from hpnlab.fabric.checks import rules as check
    from hpnlab.fabric.errors import UserError

    rules_file = request.config.getoption("hpn_rules")

    def run() -> CheckResults:
        ctx = check.CheckContext(hpn_scenario.name, hpn_scenario, hpn_graph)
        return CheckResults(check.run_checks(ctx, check.load_rules(rules_file)))

    try:
        return _cached(request, "check", f"{_key(hpn_scenario)}:{rules_file}", run)
    except UserError as exc:
        message = f"hpn_check: {exc}"
    pytest.fail(message, pytrace=False)




@pytest.fixture
def hpn_emulation(hpn_scenario: Any) -> Iterator[Any]:
    """The scenario emulated with the hpnlab controller (root), always torn down."""
    from hpnlab.fabric.emulation.preflight import emulation_missing  # start-up cost: emulation is optional
    reason = emulation_missing()
    if reason:
        pytest.skip(f"hpn_emulation {reason}")
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, SupervisionOptions

    emu = Emulation(hpn_scenario, EmulationOptions(supervision=SupervisionOptions(lock_wait_s=300)))
    emu.start()
    try:
        yield emu
    finally:
        emu.stop()
