"""The failover benchmark's plan (tools/bench_failover.py) and the flow model reading its figures:
every failure kind is a valid timeline that repairs what it breaks, and the model takes each mode's
median loss window for a link failure as its detection + convergence time."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hpnlab.cli.cmd_model import detection_from
from hpnlab.fabric import experiment, graph, spec
from hpnlab.fabric.emulation import timeline
from hpnlab.fabric.errors import UserError

_spec = importlib.util.spec_from_file_location(
    "bench_failover", Path(__file__).resolve().parent.parent / "tools" / "bench_failover.py")
assert _spec is not None and _spec.loader is not None
bench_failover = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_failover)


@pytest.mark.parametrize("kind", bench_failover.KINDS)
def test_every_failure_kind_is_a_valid_timeline_that_repairs_what_it_breaks(kind):
    g = graph.build(spec.load("mini-hpn"))
    t = bench_failover.targets(g, sorted(graph.hosts(g)))
    events = timeline.load({"events": bench_failover.timeline(kind, t, 1.0, 0.5)}, g)
    assert [e.at for e in events] == [1.0, 1.5]
    assert experiment.left_failed(events[:1]) and experiment.left_failed(events) == []


def test_local_protection_alone_freezes_the_controller_around_the_failure_and_its_repair():
    g = graph.build(spec.load("mini-hpn"))
    t = bench_failover.targets(g, sorted(graph.hosts(g)))
    events = timeline.load({"events": bench_failover.timeline("link", t, 1.0, 0.5, remote=False)}, g)
    assert [(e.at, e.action) for e in events] == [
        (1.0 - bench_failover.FREEZE_LEAD_S, "controller_freeze"), (1.0, "link_down"), (1.5, "link_up"),
        (1.5 + bench_failover.THAW_AFTER_S, "controller_thaw")]
    assert experiment.left_failed(events) == []


def test_every_mode_but_local_protection_alone_lets_the_controller_notify_upstream():
    assert [m for m, cfg in bench_failover.MODES.items() if not cfg["remote"]] == ["local"]
    assert bench_failover.MODES["local+remote"]["fast_failover"] and bench_failover.MODES["local"]["fast_failover"]


def test_the_model_takes_each_modes_median_link_loss_window(tmp_path):
    runs = {"controller": {"link": [{"loss_window_ms": v} for v in (90, 70, 110)]},
            "local": {"link": [{"loss_window_ms": v} for v in (4, 2, None, 3)], "gray": [{"loss_window_ms": 9}]}}
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"runs": runs}))
    assert detection_from(str(path)) == {"controller": 90, "local": 3}


@pytest.mark.parametrize("text", ["{", "[]", '{"runs": {"local": {"gray": []}}}'])
def test_a_file_that_is_not_a_failover_benchmark_is_one_line(tmp_path, text):
    path = tmp_path / "f.json"
    path.write_text(text)
    with pytest.raises(UserError, match="--detect-from"):
        detection_from(str(path))
