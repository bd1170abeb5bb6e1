"""Generated scenarios and overrides never get a traceback (issue 15, fuzzing).

Two generators, one contract: a generated input either builds a fabric whose size is the
one computed from its numbers and whose identifiers are all distinct, or is refused with
one ScenarioError line (exit code 2 through the command line). The size limits are
lowered for these tests so an accepted input builds in milliseconds.

* a seeded generator (always runs, fixed budget: SEEDED_CASES / SEEDED_CLI_CASES inputs) mutates the
  presets' files byte by byte and line by line, their fields value by value, and writes
  random ``--set`` strings;
* Hypothesis (tests/unit/test_scenario_properties.py, when installed) searches the same spaces,
  derandomized, with a fixed number of examples per property.
"""
from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
from support.scenario_fuzz import FIELDS, SMALL_PRESETS, check_cli, check_outcome, preset_data, small_limits

from hpnlab.fabric.scenario import spec

SEEDED_CASES = 300       # field mutations, checked in-process on the loader and the builder
SEEDED_CLI_CASES = 200   # files and overrides, through the command's main (~0.1 s each: argparse)


# ---- the seeded generator -------------------------------------------------------------------

def _value(rng: random.Random) -> Any:
    choices: list[Any] = [
        None, True, False, 0, -1, 1, 2, 3, 7, 8, 255, 256, 257, 1023, 65_536, 10 ** 6, 10 ** 9, 10 ** 30, 10 ** 400,
        0.5, 1.0, 1.5, 1e-320, 1e308, math.inf, -math.inf, math.nan, "", "two", "hpn", "fat-tree", "a\nb",
        "x" * 300, [], [1, 2], {}, {"links": 2}, {"a": {"b": {"c": 1}}},
    ]
    if rng.random() < 0.4:
        return rng.choice([rng.randint(0, 300), rng.uniform(0, 1000), rng.randint(-10, 10 ** 7)])
    return rng.choice(choices)


def mutate_fields(rng: random.Random) -> dict[str, Any]:
    data = preset_data(rng.choice(SMALL_PRESETS))
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(FIELDS + ["nonsense", "planes.x", ""])
        if rng.random() < 0.15 and key in data:
            del data[key]
            continue
        block, _, sub = key.partition(".")
        if sub:
            inner = data.get(block)
            data[block] = {**inner, sub: _value(rng)} if isinstance(inner, dict) else {sub: _value(rng)}
        else:
            data[key] = _value(rng)
    return data


def mutate_bytes(rng: random.Random) -> bytes:
    text = (spec.PRESET_DIR / f"{rng.choice(SMALL_PRESETS)}.yaml").read_bytes()
    lines = text.split(b"\n")
    for _ in range(rng.randint(1, 4)):
        how = rng.randrange(8)
        at = rng.randrange(len(lines))
        if how == 0:      # flip a byte
            line = bytearray(lines[at] or b" ")
            line[rng.randrange(len(line))] = rng.randrange(256)
            lines[at] = bytes(line)
        elif how == 1:    # duplicate a line (a key given twice)
            lines.insert(at, lines[at])
        elif how == 2:    # drop a line
            del lines[at]
        elif how == 3:    # indent a line
            lines[at] = b"  " + lines[at]
        elif how == 4:    # anchors and aliases
            lines.insert(at, rng.choice([b"x: &a [1, 2]", b"y: *a", b"<<: *a", b"planes: &p 2", b"rails: *p"]))
        elif how == 5:    # YAML syntax
            lines[at] += rng.choice([b" [", b" {", b": :", b" !!binary x", b" !!python/none", b"\t", b" #", b" |"])
        elif how == 6:    # nesting
            depth = rng.randint(1, 50)
            lines.insert(at, b"deep: " + b"[" * depth + b"]" * depth)
        else:             # cut the file
            lines = lines[:at]
            if not lines:
                lines = [b""]
    return b"\n".join(lines)


def random_override(rng: random.Random) -> str:
    key = rng.choice(FIELDS + ["", "planes.x", "a..b", "x" * 200, "emulation", "long_haul"])
    value = rng.choice([str(_value(rng)), "[1", "{a: 1}", "&a x", "*a", "1.0e+308", "0x10", "1_000", "~", "!!int x",
                        "'quoted'", "2024-13-45", "[" * 20 + "]" * 20, "".join(chr(rng.randrange(1, 0x3000))
                                                                                 for _ in range(rng.randint(0, 12)))])
    return f"{key}={value}" if rng.random() < 0.95 else key


def test_seeded_field_mutations_build_a_correct_fabric_or_get_one_line() -> None:
    rng = random.Random(15)
    outcomes = []
    with small_limits():
        for _ in range(SEEDED_CASES):
            data = mutate_fields(rng)
            outcomes.append(check_outcome(lambda data=data: spec.from_dict(data)))
    assert set(outcomes) == {"built", "refused"}   # the generator reaches both sides


@pytest.mark.slow
def test_seeded_file_mutations_build_or_get_one_line_from_the_command(tmp_path: Path) -> None:
    rng = random.Random(16)
    codes = []
    with small_limits():
        for i in range(SEEDED_CLI_CASES):
            path = tmp_path / f"m{i}.yaml"
            path.write_bytes(mutate_bytes(rng))
            codes.append(check_cli(["topo", "plan", str(path), "--hosts", "1"]))
    assert set(codes) == {0, 2}


@pytest.mark.slow
def test_seeded_overrides_build_or_get_one_line_from_the_command() -> None:
    rng = random.Random(17)
    codes = []
    with small_limits():
        for _ in range(SEEDED_CLI_CASES):
            sets = [item for _ in range(rng.randint(1, 3)) for item in ("--set", random_override(rng))]
            codes.append(check_cli(["topo", "plan", rng.choice(SMALL_PRESETS), *sets, "--hosts", "1"]))
    assert set(codes) == {0, 2}
