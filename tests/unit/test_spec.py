"""Scenario validation: good presets load, bad input names the field and the rule."""
import subprocess
import sys

import pytest

from hpnlab.fabric.scenario import spec
from hpnlab.fabric.scenario.addressing import AddressPlan


@pytest.mark.parametrize("name", spec.preset_names())
def test_every_preset_loads(name):
    s = spec.load(name)
    assert s.name == name and s.hosts > 0


def test_fat_tree_name_sets_k():
    assert spec.load("fat-tree-6").k == 6


def test_overrides_change_fields_and_subfields():
    s = spec.load("cross-campus", spec.parse_overrides(["planes=4", "long_haul.distance_km=50"]))
    assert s.long_haul is not None
    assert s.planes == 4 and s.long_haul.distance_km == 50 and s.long_haul.delay_us == 250


def test_dotted_keys_nest_into_sub_fields():
    nested = spec.nest_dotted([("long_haul.distance_km", 50), ("long_haul.links", 2), ("planes", 4)])
    assert nested == {"long_haul": {"distance_km": 50, "links": 2}, "planes": 4}


def test_a_later_override_of_the_same_field_wins():
    assert spec.parse_overrides(["planes=2", "planes=4"]) == {"planes": 4}


@pytest.mark.parametrize("items", [["long_haul=1", "long_haul.links=2"], ["long_haul.links=2", "long_haul=1"]])
def test_a_field_given_as_a_value_and_as_a_group_is_refused(items):
    with pytest.raises(spec.ScenarioError, match="both as a value and as a group"):
        spec.parse_overrides(items)


def test_deep_merge_keeps_the_sub_fields_the_extra_does_not_name():
    base = {"name": "x", "long_haul": {"distance_km": 10, "links": 1}}
    merged = spec.deep_merge(base, {"long_haul": {"links": 2}, "planes": 4})
    assert merged == {"name": "x", "long_haul": {"distance_km": 10, "links": 2}, "planes": 4}
    assert base == {"name": "x", "long_haul": {"distance_km": 10, "links": 1}}   # not changed in place


def test_a_plain_value_replaces_a_sub_block_in_a_merge():
    assert spec.deep_merge({"long_haul": {"links": 1}}, {"long_haul": None}) == {"long_haul": None}


def test_missing_spines_are_derived_from_oversubscription():
    s = spec.from_dict({"name": "x", "rails": 1, "planes": 1, "hosts_per_segment": 8,
                        "host_rate_gbps": 100, "leaf_spine_rate_gbps": 200, "oversubscription": 2})
    assert s.spines_per_plane == 2   # 8 x 100G down / 2 = 400G up = 2 x 200G


def _error(data=None, **fields):
    data = data or {"name": "t", "rails": 2, "planes": 2, "hosts_per_segment": 4, "spines_per_plane": 2,
                    "switch_radix": 64}
    data.update(fields)
    with pytest.raises(spec.ScenarioError) as info:
        spec.from_dict(data)
    return info.value


def test_unknown_field_is_named():
    err = _error(planez=2)
    assert err.field == "planez" and "unknown field" in err.rule


def test_negative_rate_is_refused():
    err = _error(host_rate_gbps=-100)
    assert err.field == "host_rate_gbps" and "positive" in err.rule


def test_numbers_that_do_not_divide_are_refused():
    err = _error(rails=8, leaves_per_plane_per_segment=3)
    assert err.field == "leaves_per_plane_per_segment" and "divide" in err.rule


def test_ports_above_radix_are_refused():
    err = _error(hosts_per_segment=100, spines_per_plane=2)
    assert "switch_radix" in err.rule


def test_wrong_oversubscription_is_refused_with_the_actual_ratio():
    err = _error(oversubscription=1.0, hosts_per_segment=4, spines_per_plane=1)
    assert err.field == "oversubscription" and ":1" in err.rule


def test_odd_fat_tree_k_is_refused():
    with pytest.raises(spec.ScenarioError, match="even"):
        spec.load("fat-tree-5")


def test_campuses_need_a_core_tier_and_long_haul():
    assert _error(campuses=2).field == "cores_per_plane"
    assert _error(campuses=2, cores_per_plane=1).field == "long_haul"


def test_non_integer_count_is_refused():
    assert _error(planes=1.5).field == "planes"
    assert _error(planes="two").field == "planes"


def test_unknown_long_haul_field_is_named():
    err = _error(campuses=2, cores_per_plane=1, long_haul={"distance": 3})
    assert err.field == "long_haul.distance"


def test_address_plan_refuses_more_than_24_bits():
    with pytest.raises(ValueError, match="24"):
        AddressPlan(planes=16, campuses=16, pods=16, segments=16, leaves_per_segment=16,
                    ports_per_leaf=1000).check()


def _hpnlab(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hpnlab.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize("content,field", [
    ("name: x\nplanez: 2\n", "planez"),
    ("name: x\nhost_rate_gbps: -1\n", "host_rate_gbps"),
    ("name: x\nrails: 8\nleaves_per_plane_per_segment: 3\n", "leaves_per_plane_per_segment"),
    ("name: x\nhosts_per_segment: 1000\nswitch_radix: 64\n", "switch_radix"),
    ("name: [unclosed\n", "YAML"),
    ("", "empty"),
])
def test_cli_prints_one_line_and_exits_2_on_a_bad_scenario(tmp_path, content, field):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    result = _hpnlab("topo", "inspect", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert field in lines[0] and str(path) in lines[0]


def test_cli_refuses_a_field_set_as_a_value_and_as_a_group_in_one_line():
    result = _hpnlab("topo", "inspect", "cross-campus", "--set", "long_haul=1", "--set", "long_haul.links=2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "long_haul" in result.stderr


def test_cli_names_unknown_presets():
    result = _hpnlab("topo", "inspect", "no-such-fabric")
    assert result.returncode == 2 and "unknown preset" in result.stderr


def test_cli_inspect_json_has_the_documented_keys():
    import json
    result = _hpnlab("topo", "inspect", "mini-hpn", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for key in ("accelerators", "hosts", "switches", "links", "max_ports_used", "radix", "oversubscription"):
        assert key in report
    assert set(report["routes"]) >= {"host_routes_max", "aggregated_max", "per_pod_total"}


@pytest.mark.parametrize("fmt", ["json", "graphml", "dot"])
def test_cli_exports_every_format(tmp_path, fmt):
    out = tmp_path / f"g.{fmt}"
    result = _hpnlab("topo", "export", "mini-hpn", "--format", fmt, "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "p0l0" in text and "h16" in text
    if fmt == "graphml":
        import networkx as nx
        g = nx.read_graphml(out)
        assert g.number_of_edges() == 48


# ---- the JSON Schema: made from the same rules, shipped beside the presets ----------------

def test_the_shipped_schema_is_the_one_the_rules_make():
    import json
    shipped = json.loads((spec.PRESET_DIR / spec.SCHEMA_FILE).read_text())
    assert shipped == spec.json_schema(), "run: hpnlab topo schema > topologies/scenario.schema.json"


@pytest.mark.parametrize("name", spec.preset_names())
def test_every_preset_names_the_schema_and_satisfies_it(name):
    jsonschema = pytest.importorskip("jsonschema")
    text = (spec.PRESET_DIR / f"{name}.yaml").read_text()
    assert text.splitlines()[0] == f"# yaml-language-server: $schema={spec.SCHEMA_FILE}"
    jsonschema.validate(spec._yaml_load(text, name), spec.json_schema())


@pytest.mark.parametrize("fields", [
    {"planes": "two"}, {"planes": 1.5}, {"planes": 0}, {"planes": 257}, {"campuses": 300}, {"planes": True},
    {"host_rate_gbps": -1}, {"host_rate_gbps": 0}, {"host_rate_gbps": "fast"}, {"kind": "torus"},
    {"name": 3}, {"name": "n" * 200}, {"planez": 2}, {"long_haul": 3}, {"long_haul": {"distance": 3}},
    {"long_haul": {"deep_buffer": "yes"}}, {"emulation": {"mtu": 10}}, {"emulation": {"mtu": 1e9}},
    {"oversubscription": 0}, {"switch_radix": 10 ** 6}, {"k": -2},
])
def test_the_schema_rejects_by_type_and_range_what_the_loader_rejects(fields):
    jsonschema = pytest.importorskip("jsonschema")
    data = {"name": "x", "rails": 1, "planes": 1, "hosts_per_segment": 2, **fields}
    with pytest.raises(spec.ScenarioError):
        spec.from_dict(data)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, spec.json_schema())


def test_the_schema_command_prints_the_schema():
    import json
    result = _hpnlab("topo", "schema")
    assert result.returncode == 0 and json.loads(result.stdout) == spec.json_schema()


def test_the_fields_command_lists_every_field_with_its_range():
    result = _hpnlab("topo", "fields")
    assert result.returncode == 0
    for name in spec.SCENARIO_FIELDS:
        assert f"\n{name} " in "\n" + result.stdout
    assert "planes" in result.stdout and "<= 256" in result.stdout and "HPNLAB_MAX_LINKS" in result.stdout


def test_bfd_is_off_unless_the_scenario_turns_it_on():
    assert spec.load("mini-hpn").bfd == spec.Bfd(enabled=False)


def test_bfd_fields_are_set_with_dotted_overrides_and_give_the_detection_time():
    s = spec.load("mini-hpn", spec.parse_overrides(["bfd.enabled=true", "bfd.min_tx_ms=10", "bfd.min_rx_ms=20"]))
    assert (s.bfd.enabled, s.bfd.min_tx_ms, s.bfd.min_rx_ms, s.bfd.mult) == (True, 10, 20, 3)
    assert s.bfd.detect_ms == 60


@pytest.mark.parametrize("override, message", [
    ("bfd.min_tx_ms=0", "bfd.min_tx_ms: must be at least 1, got 0"),
    ("bfd.min_rx_ms=2.5", "bfd.min_rx_ms: must be a whole number"),
    ("bfd.mult=256", "bfd.mult: must be at most 255"),
    ("bfd.enabled=yes please", "bfd.enabled: must be true or false"),
    ("bfd.interval_ms=5", "bfd.interval_ms: unknown field"),
])
def test_a_wrong_bfd_field_is_one_line(override, message):
    with pytest.raises(spec.ScenarioError, match=message) as err:
        spec.load("mini-hpn", spec.parse_overrides([override]))
    assert "\n" not in str(err.value)


def test_a_scenarios_default_ranks_below_two_is_one_line_naming_the_field():
    err = _error(emulation={"ranks": 1})
    assert err.field == "emulation.ranks"


@pytest.mark.parametrize("fields,says", [
    ({"spine_core_rate_gbps": -10 ** 400}, "must be positive"),
    ({"long_haul": {"buffer_mb": -10 ** 400}}, "must not be negative"),
    ({"spine_core_rate_gbps": 10 ** 400}, "at most"),
])
def test_a_number_too_large_for_a_float_gets_one_line_whatever_its_sign(fields, says):
    """Found by Hypothesis (2026-12-04): a huge negative int did not convert to float (a traceback)."""
    with pytest.raises(spec.ScenarioError, match=says):
        spec.load("mini-hpn", fields)
