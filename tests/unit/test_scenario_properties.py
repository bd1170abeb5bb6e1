"""Hypothesis properties over generated scenarios, overrides and files (issue 15).

The same contract as tests/unit/test_scenario_fuzz.py (tests/support/scenario_fuzz.py): a generated
input builds a fabric of the computed size with distinct identifiers, or gets one line.
Derandomized, with a fixed number of examples per property, so CI runs the same budget.
Skipped where Hypothesis is not installed (the seeded generator still runs).
"""
from __future__ import annotations

from typing import Any

import pytest
from support.scenario_fuzz import FIELDS, SMALL_PRESETS, check_cli, check_outcome, preset_data, small_limits

from hpnlab.fabric.scenario import spec

HYPOTHESIS_EXAMPLES = 100

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
SETTINGS = hypothesis.settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None, derandomize=True,
                               suppress_health_check=list(hypothesis.HealthCheck))

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10 ** 500), max_value=10 ** 500)
    | st.floats() | st.text(max_size=40) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=6)


@pytest.mark.slow
@SETTINGS
@hypothesis.given(preset=st.sampled_from(SMALL_PRESETS),
                  changes=st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=12), values, max_size=3))
def test_any_field_mutation_builds_a_correct_fabric_or_gets_one_line(preset: str, changes: dict[str, Any]) -> None:
    data = preset_data(preset)
    for key, value in changes.items():
        block, _, sub = key.partition(".")
        if sub and block in ("long_haul", "emulation"):
            inner = data.get(block)
            data[block] = {**inner, sub: value} if isinstance(inner, dict) else {sub: value}
        else:
            data[key] = value
    with small_limits():
        check_outcome(lambda: spec.from_dict(data))


yaml_text = st.text(alphabet=st.sampled_from(list("name:plnes 12[]{},&*!|>-'\"#\n\t.e+~?") + ["\x00", "\u2028", "é"]),
                    max_size=120)


@pytest.mark.slow
@SETTINGS
@hypothesis.given(overrides=st.lists(st.sampled_from(FIELDS).map(lambda f: f + "=") | st.just(""), min_size=1,
                                     max_size=3),
                  tails=st.lists(yaml_text, min_size=3, max_size=3))
def test_any_override_text_builds_or_gets_one_line_from_the_command(overrides: list[str], tails: list[str]) -> None:
    sets = [item for head, tail in zip(overrides, tails, strict=False) for item in ("--set", head + tail)]
    with small_limits():
        check_cli(["topo", "plan", "mini-hpn", *sets, "--hosts", "1"])


@pytest.mark.slow
@SETTINGS
@hypothesis.given(text=yaml_text | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_any_file_text_builds_or_gets_one_line_from_the_command(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    head = "name: fuzz\nrails: 1\nplanes: 1\nhosts_per_segment: 2\n"
    path.write_bytes((head + text).encode("utf-8", "surrogatepass"))
    with small_limits():
        check_cli(["topo", "plan", str(path), "--hosts", "1"])
