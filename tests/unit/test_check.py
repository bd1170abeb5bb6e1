"""hpnlab check: each design rule fails on a fabric built to break it and names what broke;
the presets pass; the rules file, the table, JSON and JUnit reports; the command's exit codes."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import networkx as nx
import pytest

from hpnlab.cli import main as cli
from hpnlab.fabric.checks import rules as check
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph, spec


def run(target, rules=None, only=None):
    return check.run_checks(target, rules, only=only)


def failing(results, rule):
    return [r for r in results if r.rule == rule and not r.ok]


def mini(**changes) -> nx.MultiGraph:
    """mini-hpn's fabric, its scenario changed in Python (skipping the loader's own refusals)."""
    return graph.build(spec.load("mini-hpn").replace(**changes))


@pytest.fixture(scope="module")
def mini_hpn_graph() -> nx.MultiGraph:
    return graph.build(spec.load("mini-hpn"))


def fresh_mini() -> nx.MultiGraph:
    return graph.build(spec.load("mini-hpn"))


# ---- each rule fails on a fabric built to break it -------------------------------------------

def test_radix_fails_on_switches_with_more_ports_than_the_switch_has():
    # mini-hpn's leaves use 4 x 200G + 2 x 400G = 8 slots of 200G, its spines 4 x 400G = 8
    results = run(mini(switch_radix=6), only=["radix"])
    assert {r.subject for r in failing(results, "radix")} == {f"p{p}{role}{i}" for p in range(2) for role, n in
                                                                (("l", 4), ("s", 2)) for i in range(n)}
    assert all((r.figure, r.limit) == (8, 6) for r in results)


def test_radix_limit_from_the_rules_file_replaces_the_scenarios():
    results = run(fresh_mini(), {"radix": {"spine": 7}}, only=["radix"])
    assert {r.subject for r in failing(results, "radix")} == {"p0s0", "p0s1", "p1s0", "p1s1"}


def test_port_speed_fails_on_a_rate_that_is_no_whole_number_of_slots():
    bad = failing(run(mini(host_rate_gbps=300.0), only=["port-speed"]), "port-speed")
    assert bad and all(r.subject.startswith(("p0l", "p1l")) and "300G" in r.detail for r in bad)


def test_port_speed_fails_on_a_speed_the_rules_file_does_not_allow():
    bad = failing(run(fresh_mini(), {"port-speed": {"speeds_gbps": [200]}}, only=["port-speed"]), "port-speed")
    assert {r.subject[:3] for r in bad} == {"p0l", "p1l", "p0s", "p1s"}


def test_oversubscription_fails_on_a_leaf_that_lost_an_uplink_and_names_it():
    g = fresh_mini()
    g.remove_edge("p0l2", "p0s1", 0)
    (row,) = run(g, only=["oversubscription"])
    assert (row.subject, row.figure, row.limit, row.ok) == ("tier leaf", 2, 1.0, False)
    assert "p0l2" in row.detail


def test_oversubscription_of_a_tier_the_scenario_states_nothing_for_takes_the_rules_files_limit():
    results = run("mini-cross-campus", {"oversubscription": {"spine": 0.5}}, only=["oversubscription"])
    spine = next(r for r in results if r.subject == "tier spine")
    assert (spine.figure, spine.limit, spine.ok) == (1, 0.5, False)


def test_nic_planes_fails_on_a_nic_missing_its_port_in_a_plane():
    g = fresh_mini()
    g.remove_edge("h3", "p1l0")
    (row,) = failing(run(g, only=["nic-planes"]), "nic-planes")
    assert row.subject == "h3 rail 0" and "no port in plane 1" in row.detail


def test_planes_disjoint_fails_on_a_host_port_landing_on_another_planes_leaf():
    g = fresh_mini()
    data = g.edges["h3", "p1l0", 0]
    g.remove_edge("h3", "p1l0")
    g.add_edge("h3", "p0l1", **data)        # h3's plane-1 port on a plane-0 leaf: the planes share p0l1
    bad = failing(run(g, only=["planes-disjoint"]), "planes-disjoint")
    assert [r.subject for r in bad] == ["link h3-p0l1#0"] and "plane 0" in bad[0].detail


def test_planes_disjoint_fails_on_a_link_joining_two_planes():
    g = fresh_mini()
    g.add_edge("p0s0", "p1l3", kind="fabric", rate_gbps=400.0, delay_us=0.0, ports={"p0s0": 99, "p1l3": 99})
    bad = failing(run(g, only=["planes-disjoint"]), "planes-disjoint")
    assert [r.subject for r in bad] == ["link p0s0-p1l3#0"]


def test_route_budget_fails_when_the_switch_tables_are_too_small_for_the_compiled_routes():
    s = spec.load("mini-hpn", {"switch_tables": {"routes": 5}})
    results = run(s, only=["route-budget"])
    bad = failing(results, "route-budget")
    assert {r.subject for r in bad} == {f"p{p}l{i}" for p in range(2) for i in range(4)}
    assert all(r.figure > r.limit == 5 for r in bad)
    assert [r.subject for r in results if r.ok] == ["tier spine"]


def test_flow_budget_fails_against_the_rules_files_limit():
    bad = failing(run(fresh_mini(), {"flow-budget": {"leaf": 10}}, only=["flow-budget"]), "flow-budget")
    assert len(bad) == 8 and all(r.limit == 10 and r.figure > 10 for r in bad)


def test_path_diversity_fails_on_a_single_spine_a_single_point_of_failure():
    s = spec.load("mini-hpn", {"spines_per_plane": 1, "oversubscription": None})
    bad = failing(run(s, only=["path-diversity"]), "path-diversity")
    assert [(r.subject, r.figure, r.limit) for r in bad] == [("plane 0 rail 0", 1, 2), ("plane 1 rail 0", 1, 2)]


def test_blast_radius_of_a_spine_loss_counts_the_leaves_it_served():
    # mini-hpn: a leaf has 2 x 400G up for 4 x 200G down; a spine loss halves the uplinks of
    # the 4 plane-0 leaves, which carry half of a cross-rail job's ports
    results = run(fresh_mini(), {"blast-radius": {"spine_loss_min_share": 0.8}}, only=["blast-radius"])
    row = next(r for r in results if r.subject == "spine loss, cross-rail job")
    assert (row.figure, row.ok) == (0.75, False)
    same_rail = next(r for r in results if r.subject == "spine loss, same-rail job")
    assert (same_rail.figure, same_rail.ok) == (1.0, True)      # under one leaf per plane: no spine


def test_blast_radius_of_a_plane_loss_takes_everything_from_a_job_on_that_plane():
    results = run(fresh_mini(), {"blast-radius": {"plane_loss_min_share": 0.5}}, only=["blast-radius"])
    assert [(r.subject, r.figure) for r in failing(results, "blast-radius")] == [("plane loss, cross-plane job", 0)]


def test_long_haul_fails_against_its_ratio_and_delay_limits():
    results = run("mini-cross-campus", {"long-haul": {"max_ratio": 1.5, "max_delay_us": 50}}, only=["long-haul"])
    assert [(r.subject, r.figure) for r in failing(results, "long-haul")] == [
        ("campus 0 ratio", 2), ("campus 1 ratio", 2), ("long-haul delay", 100)]


def test_long_haul_says_nothing_on_one_campus(mini_hpn_graph):
    assert run(mini_hpn_graph, only=["long-haul"]) == []


# ---- presets ------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["mini-hpn", "mini-rail", "mini-spine-leaf", "small-hpn", "fat-tree"])
def test_every_rule_passes_on_the_small_presets(preset):
    assert check.failed(run(preset)) == []


def test_mini_cross_campus_fails_only_on_its_single_core_per_plane_and_campus():
    """mini-cross-campus has one core per plane per campus joined by one long-haul link: losing
    that core or that link cuts the plane between the campuses (hosts still reach each other
    through the other plane). Every other rule passes; the full-size cross-campus has 8 cores."""
    failed = check.failed(run("mini-cross-campus"))
    assert {r.rule for r in failed} == {"failure-tolerance"}
    assert sorted(r.subject for r in failed) == ["all failures", "link core-core (represents 2)",
                                                 "switch core (represents 4)"]


def test_the_fast_rules_pass_on_alibaba_hpn():
    # the heavy presets once each, the rules that need no compile (hpn-130k: README figures)
    results = run("alibaba-hpn", only=["radix", "port-speed", "oversubscription", "nic-planes", "planes-disjoint",
                                       "path-diversity"])
    assert check.failed(results) == [] and {r.rule for r in results} == {
        "radix", "port-speed", "oversubscription", "nic-planes", "planes-disjoint", "path-diversity"}


@pytest.mark.hpn_scenario("mini-rail")
def test_the_plugins_hpn_check_runs_every_rule(hpn_check):
    # the project's own tests use the same pytest plugin as users (the opt-in rules are not asked for)
    assert {r.rule for r in hpn_check} == set(check.RULES) - check.OPT_IN - {"long-haul"} and not hpn_check.failed


# ---- the rules file -----------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("radix: {maxx: 3}", "radix.maxx: unknown limit (known: enabled, max, leaf"),
    ("radixx: false", "radixx: unknown rule (known: radix, port-speed"),
    ("radix: {leaf: -1}", "radix.leaf: must be at least 0, got -1"),
    ("route-budget: {spine: 1.5}", "route-budget.spine: must be a whole number, got 1.5"),
    ("radix: 3", "radix: must be true, false or a mapping of limits, got 3"),
    ("radix: {enabled: maybe}", "radix.enabled: must be true or false"),
    ("nic-planes: {min: 1}", "nic-planes.min: unknown limit (known: enabled (this rule has no limits))"),
    ("port-speed: {speeds_gbps: 400}", "port-speed.speeds_gbps: must be a list of speeds"),
    ("blast-radius: {placements: [anywhere]}", "blast-radius.placements: must be a list of placements"),
    ("- radix", "(top level): a rules file is a mapping of rule names"),
    ("radix: &a {leaf: 1}\nflow-budget: *a", "aliases"),
    ("radix: {leaf: 1}\nradix: {leaf: 2}", "radix: given twice, at lines 1 and 2"),
])
def test_a_bad_rules_file_is_one_line_naming_the_mistake(tmp_path, text, message):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        check.load_rules(path)
    assert message in str(err.value) and "\n" not in str(err.value) and str(path) in str(err.value)


def test_the_rules_file_turns_rules_off(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("radix: false\nport-speed: {enabled: false}\nfailure-tolerance: false\nlong-haul: true\n")
    config = check.load_rules(path)
    assert check.selected(config) == [r for r in check.RULES if r not in ("radix", "port-speed", "failure-tolerance")
                                      and r not in check.OPT_IN]


def test_an_unknown_rule_name_to_run_is_a_user_error(mini_hpn_graph):
    with pytest.raises(UserError, match="unknown rule 'radius'"):
        check.run_checks(mini_hpn_graph, only=["radius"])


# ---- reports ------------------------------------------------------------------------------

def bad_and_good():
    return [check.RuleResult("radix", "p0l0", 70, 64, False, "leaf: 1 of 8 over 64 ports"),
            check.RuleResult("radix", "tier spine", 8, 64, True, "worst p0s0 of 4"),
            check.RuleResult("failure-tolerance", "fabric", check.NOT_AVAILABLE, None, True, "not installed")]


def test_junit_xml_parses_with_one_testcase_per_rule_and_subject_and_failures_as_failure_elements():
    root = ET.fromstring(check.to_junit("mini-hpn", bad_and_good(), 1.5))
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("hpnlab.check.radix", "p0l0"), ("hpnlab.check.radix", "tier spine"),
        ("hpnlab.check.failure-tolerance", "fabric")]
    failure = cases[0].find("failure")
    assert failure is not None and "figure 70, limit 64" in failure.get("message", "")
    assert cases[1].find("failure") is None and cases[2].find("skipped") is not None


def test_the_table_names_rule_subject_figure_limit_and_verdict():
    lines = check.render_table(bad_and_good()).splitlines()
    assert lines[0].split() == ["RULE", "SUBJECT", "FIGURE", "LIMIT", "RESULT", "DETAIL"]
    assert lines[1].split()[:5] == ["radix", "p0l0", "70", "64", "FAIL"]
    assert lines[3].split()[:6] == ["failure-tolerance", "fabric", "not", "available", "-", "n/a"]


def test_the_table_counts_failing_rows_beyond_its_limit():
    rows = [check.RuleResult("radix", f"p0l{i}", 70, 64, False) for i in range(5)]
    text = check.render_table(rows, max_fail_rows=2)
    assert "p0l1" in text and "p0l2" not in text and "... and 3 more radix failures" in text


# ---- the command --------------------------------------------------------------------------

def test_check_exits_1_naming_the_failing_rule_and_writes_json_and_junit(tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text("route-budget: {leaf: 5}\n")
    out_json, out_xml = tmp_path / "r.json", tmp_path / "r.xml"
    code = cli.main(["check", "mini-hpn", "--rules", str(rules), "--only", "route-budget", "--json", str(out_json),
                     "--junit", str(out_xml)])
    printed = capsys.readouterr().out
    assert code == 1
    assert any(line.split()[:2] == ["route-budget", "p0l0"] and "FAIL" in line for line in printed.splitlines())
    report = json.loads(out_json.read_text())
    assert report["ok"] is False and report["failed"] == 8 and report["results"][0]["rule"] == "route-budget"
    suite = ET.parse(out_xml).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "8"


def test_check_exits_0_when_every_rule_passes(capsys):
    assert cli.main(["check", "mini-hpn", "--skip", "blast-radius", "--skip", "path-diversity"]) == 0
    assert "0 FAILED" in capsys.readouterr().out


def test_check_json_to_stdout_is_only_json(capsys):
    assert cli.main(["check", "mini-hpn", "--only", "radix", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["passed"] == 2 and "RULE" in captured.err


@pytest.mark.parametrize("args, message", [
    (["--rules", "/nonexistent/rules.yaml"], "rules: no such file"),
    (["--only", "radius"], "unknown rule 'radius'"),
    (["--set", "planes=0"], "planes: must be at least 1"),
])
def test_check_bad_input_is_one_line_exit_2(capsys, args, message):
    assert cli.main(["check", "mini-hpn", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_check_with_a_bad_rules_file_is_one_line_exit_2(tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text("route-budget:\n  leaf: lots\n")
    assert cli.main(["check", "mini-hpn", "--rules", str(rules)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"hpnlab: {rules}: route-budget.leaf: must be a whole number, got 'lots'\n"


@pytest.mark.parametrize("preset", ["mini-cross-campus", "mini-spine-leaf", "fat-tree"])
def test_path_counts_to_many_leaves_agree_with_the_one_pair_count(preset):
    from hpnlab.fabric.scenario.analysis import count_shortest_paths

    g = graph.build(spec.load(preset))
    leaves = sorted(n for n, d in g.nodes(data=True) if d["tier"] == 1)
    counts = check.shortest_path_counts(g, leaves[0], set(leaves))
    assert counts == {leaf: count_shortest_paths(g, leaves[0], leaf)[1] for leaf in leaves}
