"""hpnlab's pytest plugin, used as a user would: test files in a folder outside the repository,
run by pytest with the plugin loaded from its ``pytest11`` entry point."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from support.paths import EXAMPLES

EXAMPLES = EXAMPLES

USER_TESTS = '''
import os

import pytest

@pytest.mark.hpn_scenario("mini-rail")
def test_scenario_from_the_marker(hpn_scenario):
    assert hpn_scenario.name == "mini-rail"

@pytest.mark.hpn_scenario("mini-hpn", "mini-spine-leaf")
def test_graph_once_per_scenario(hpn_scenario, hpn_graph):
    assert hpn_graph.graph["scenario"] == hpn_scenario

def test_unmarked_runs_once_per_command_line_scenario(hpn_scenario):
    assert hpn_scenario.name in ("mini-cross-campus", "small-hpn")

@pytest.mark.hpn_scenario("mini-hpn")
def test_tables_of_every_switch(hpn_graph, hpn_tables):
    switches = {n for n, d in hpn_graph.nodes(data=True) if d["tier"] > 0}
    assert set(hpn_tables) == switches and all(st.route_count > 0 for st in hpn_tables.values())

@pytest.mark.hpn_scenario("mini-hpn")
def test_check_results(hpn_check):
    assert hpn_check.rule("radix") and not hpn_check.failed

@pytest.mark.hpn_scenario("mini-hpn")
def test_walker(hpn_walker):
    assert hpn_walker.send("h1", "h16", plane=1).result == "delivered"

@pytest.mark.hpn_scenario("no-such-fabric")
def test_bad_scenario(hpn_graph):
    pass

@pytest.fixture
def not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

@pytest.mark.hpn_scenario("mini-hpn")
def test_emulation_not_root(not_root, hpn_emulation):
    raise AssertionError("must not run")
'''


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    """{test name[id]: outcome} from pytest's -rA summary (PASSED/FAILED/ERROR name - reason)."""
    out = {}
    for line in result.outlines:
        verdict, _, rest = line.partition(" ")
        if verdict in ("PASSED", "FAILED", "ERROR"):
            out[rest.split(" - ")[0].split("::")[-1]] = verdict
        elif verdict == "SKIPPED":
            out[rest] = verdict
    return out


def walker_installed() -> bool:
    try:
        return importlib.util.find_spec("hpnlab.fabric.routing.oftable") is not None
    except ImportError:
        return False


def test_the_fixtures_and_the_sample_work_from_test_files_outside_the_repository(pytester):
    # one pytest process (the plugin loaded from its entry point) for every fixture: pytest
    # starts slowly, and this costs one start
    pytester.makepyfile(test_my_fabric=USER_TESTS)
    for name in ("test_sample.py", "my-fabric.yaml"):        # the sample beside the presets, as a user copies it
        (pytester.path / name).write_text((EXAMPLES / name.replace("test_sample", "test_my_fabric")).read_text())
    result = pytester.runpytest_subprocess("-rA", "-p", "no:cacheprovider",
                                           "--hpn-scenario", "mini-cross-campus", "--hpn-scenario", "small-hpn")
    got = outcomes(result)
    expected = {
        "test_scenario_from_the_marker[mini-rail]": "PASSED",
        "test_graph_once_per_scenario[mini-hpn]": "PASSED",
        "test_graph_once_per_scenario[mini-spine-leaf]": "PASSED",
        "test_unmarked_runs_once_per_command_line_scenario[mini-cross-campus]": "PASSED",
        "test_unmarked_runs_once_per_command_line_scenario[small-hpn]": "PASSED",
        "test_tables_of_every_switch[mini-hpn]": "PASSED",
        "test_check_results[mini-hpn]": "PASSED",
        "test_bad_scenario[no-such-fabric]": "ERROR",
        "test_design_rules_pass[my-fabric.yaml]": "PASSED",
        "test_every_switch_keeps_half_its_route_table_free[my-fabric.yaml]": "PASSED",
    }
    if walker_installed():
        expected["test_walker[mini-hpn]"] = "PASSED"
        expected["test_first_and_last_host_reach_each_other_on_every_plane[my-fabric.yaml]"] = "PASSED"
    assert {k: v for k, v in got.items() if v != "SKIPPED"} == expected, result.outlines
    skipped = [k for k, v in got.items() if v == "SKIPPED"]
    assert any("hpn_emulation needs root" in line for line in skipped), skipped
    assert walker_installed() or any("table interpreter not installed" in line for line in skipped), skipped
    result.stdout.fnmatch_lines(["hpn_scenario no-such-fabric: scenario: unknown preset or file*"])


def test_loading_the_plugin_imports_nothing_of_hpnlab_or_networkx():
    code = ("import sys, hpnlab.fabric.checks.pytest_plugin; "
            "print(sorted(m for m in sys.modules if m.startswith(('networkx', 'numpy', 'hpnlab.fabric.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['hpnlab.fabric.checks', 'hpnlab.fabric.checks.pytest_plugin']"
