"""The contract of generated scenarios (issue 15), shared by the seeded generator
(tests/unit/test_scenario_fuzz.py) and the Hypothesis properties (tests/unit/test_scenario_properties.py):
a generated input builds a fabric whose size is the one computed from its numbers and whose identifiers
are all distinct (``check_outcome``), or is refused with one line (``check_cli``: exit code 2); the size
limits lowered so an accepted input builds in milliseconds (``small_limits``)."""
from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import yaml

from hpnlab.cli.main import main
from hpnlab.fabric.errors import MESSAGE_LIMIT
from hpnlab.fabric.scenario import graph, spec

SMALL_LIMITS = {"HPNLAB_MAX_LINKS": "20000", "HPNLAB_MAX_NODES": "10000"}
SMALL_PRESETS = ["mini-hpn", "mini-rail", "mini-spine-leaf", "mini-cross-campus", "fat-tree", "small-hpn"]
FIELDS = sorted(spec.SCENARIO_FIELDS) + [f"long_haul.{f}" for f in spec.LONG_HAUL_FIELDS] \
    + [f"emulation.{f}" for f in spec.EMULATION_FIELDS]


@contextlib.contextmanager
def small_limits() -> Iterator[None]:
    with mock.patch.dict(os.environ, SMALL_LIMITS):
        yield


def preset_data(name: str) -> dict[str, Any]:
    return yaml.safe_load((spec.PRESET_DIR / f"{name}.yaml").read_text())


def check_outcome(make: Any) -> str:
    """Run ``make()`` (returns a Scenario); the contract holds whatever it does. Returns "built" or "refused"."""
    try:
        scenario = make()
    except spec.ScenarioError as exc:
        message = str(exc)
        assert "\n" not in message and 0 < len(message) <= MESSAGE_LIMIT
        return "refused"
    g = graph.build(scenario)
    size = spec.size(scenario)
    assert size["links"] == g.number_of_edges() and size["nodes"] == g.number_of_nodes()
    dpids = [g.nodes[n]["dpid"] for n in graph.switches(g)]
    host_links = [d for _, _, d in g.edges(data=True) if d["kind"] == "host"]
    assert len(set(dpids)) == len(dpids)
    assert len({d["mac"] for d in host_links}) == len(host_links)
    assert len({d["ip"] for d in host_links}) == len(host_links)
    return "built"


def check_cli(argv: list[str]) -> int:
    """``hpnlab`` in-process: exit 0, or exit 2 with exactly one line on stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    text = err.getvalue()
    if code == 0:
        assert text == ""
    else:
        assert code == 2, text
        assert text.count("\n") == 1 and text.startswith("hpnlab: ") and "Traceback" not in text, text[:300]
    return code
