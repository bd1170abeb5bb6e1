"""hpnlab snapshot: a stable, sorted summary of the compiled fabric; check --against says what
changed in readable terms and exits 1 when something changed."""
from __future__ import annotations

import json

import pytest

from hpnlab.cli import main as cli
from hpnlab.fabric.checks import rules as check
from hpnlab.fabric.checks import snapshot
from hpnlab.fabric.scenario import graph, spec


def take(name: str = "mini-hpn", overrides: dict | None = None, rules: check.RulesConfig | None = None) -> dict:
    s = spec.load(name, overrides or {})
    ctx = check.CheckContext(s.name, s, graph.build(s))
    return snapshot.take(ctx, rules=rules, ran=[r for r in check.RULES if r != "failure-tolerance"])


@pytest.fixture(scope="module")
def mini_snapshot() -> dict:
    return take()


def test_a_snapshot_counts_the_compiled_tables_per_switch_and_role(mini_snapshot):
    s = spec.load("mini-hpn")
    from hpnlab.fabric.routing import compiler

    states = compiler.compile_fabric(graph.build(s))
    assert {name: (row["routes"], row["flows"], row["groups"]) for name, row in mini_snapshot["switches"].items()} \
        == {name: (st.route_count, st.flow_count, len(st.groups)) for name, st in states.items()}
    leaf = mini_snapshot["roles"]["leaf"]
    assert leaf["switches"] == 8 and leaf["routes"]["max"] == max(st.route_count for n, st in states.items()
                                                                    if "l" in n)
    assert mini_snapshot["switches"]["p0l1"]["prefix"] == str(graph.build(s).nodes["p0l1"]["prefix"])


def test_switches_are_in_natural_order():
    assert snapshot.natural_key("p0l2") < snapshot.natural_key("p0l10") < snapshot.natural_key("p1l0")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_written_snapshot_reads_back_equal_and_diffs_to_nothing(tmp_path, mini_snapshot, suffix):
    path = tmp_path / f"snap{suffix}"
    path.write_text(snapshot.dumps(mini_snapshot, snapshot.format_for(str(path))))
    assert snapshot.load(path) == json.loads(json.dumps(mini_snapshot))
    assert snapshot.diff(snapshot.load(path), mini_snapshot) == []


def test_the_yaml_snapshot_has_one_line_per_switch(mini_snapshot):
    lines = snapshot.dumps(mini_snapshot).splitlines()
    assert [line.split(":")[0].strip() for line in lines if line.startswith("  p0l")] == ["p0l0", "p0l1", "p0l2",
                                                                                          "p0l3"]


def test_another_segment_is_said_in_readable_terms(mini_snapshot):
    changed = take(overrides={"segments_per_pod": 5})
    texts = [c.text for c in snapshot.diff(mini_snapshot, changed)]
    assert "+2 switch(es): p0l4, p1l4" in texts
    assert "spine p0s0: +1 routes, +2 flows, +1 groups" in texts
    assert "scenario hosts: 16 → 20" in texts
    assert "spine routes budget: max 4 → 5" in texts


def test_a_budget_change_says_the_figure_against_its_limit(mini_snapshot):
    changed = take(overrides={"segments_per_pod": 5, "switch_tables": {"routes": 8}})
    texts = [c.text for c in snapshot.diff(mini_snapshot, changed)]
    assert "spine routes budget: max 4 → 5 of 8" in texts
    assert "check route-budget | tier spine: 4 → 5, limit none → 8" in texts


def test_a_check_turning_red_is_said(mini_snapshot):
    changed = take(rules=check.rules_from_dict({"radix": {"leaf": 7}}))
    texts = [c.text for c in snapshot.diff(mini_snapshot, changed)]
    assert "check radix | tier leaf: gone" in texts
    assert "check radix | p0l0: new (8, FAIL)" in texts


def test_only_the_description_is_informational(mini_snapshot):
    changed = json.loads(json.dumps(mini_snapshot))
    changed["scenario"]["description"] = "another text"
    assert [(c.text, c.matters) for c in snapshot.diff(mini_snapshot, changed)] == [
        ("scenario description changed", False)]


def test_checks_of_rules_run_in_only_one_snapshot_are_not_compared(mini_snapshot):
    changed = json.loads(json.dumps(mini_snapshot))
    changed["rules"] = ["radix"]
    changed["checks"] = {k: v for k, v in changed["checks"].items() if k.startswith("radix |")}
    assert snapshot.diff(mini_snapshot, changed) == []


def test_check_against_exits_1_and_prints_the_changes(tmp_path, capsys):
    path = tmp_path / "mini.yaml"
    assert cli.main(["snapshot", "mini-hpn", "-o", str(path), "--only", "radix", "--only", "route-budget"]) == 0
    assert cli.main(["check", "mini-hpn", "--against", str(path), "--only", "radix", "--only", "route-budget"]) == 0
    assert "no change" in capsys.readouterr().out
    assert cli.main(["check", "mini-hpn", "--set", "segments_per_pod=5", "--against", str(path),
                     "--only", "radix", "--only", "route-budget"]) == 1
    out = capsys.readouterr().out
    assert "  +2 switch(es): p0l4, p1l4" in out
    # aggregation: the old leaves get no route for the new segment (and, with gateway ARP, no responder
    # for its hosts either: they do not change at all), the spines one aggregate route each
    leaves = [line for line in out.splitlines() if line.startswith("  leaf p")]
    assert leaves == [], leaves
    assert "  spine p0s0: +1 routes" in out


@pytest.mark.parametrize("text, message", [
    ("just: text\n", "is not an hpnlab snapshot"),
    ("format: hpnlab-snapshot 1\nscenario: 3\n", "section 'scenario' is missing or not a mapping"),
    ("format: &a hpnlab-snapshot 1\nx: *a\n", "aliases are not allowed"),
    ("{not json", "is not valid JSON"),
    ("a: [\n", "is not valid YAML"),
    ("a: " + "[" * 50 + "]" * 50 + "\n", "nested more than 16 levels deep"),
    ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),
])
def test_a_bad_snapshot_is_one_line_exit_2(tmp_path, capsys, text, message):
    path = tmp_path / "snap.yaml"
    path.write_text(text)
    assert cli.main(["check", "mini-hpn", "--against", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
