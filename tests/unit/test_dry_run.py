"""Dry run: what the controller would add, modify and delete on each switch, from what the switches
hold; nothing but the questions is sent (controller/dryrun.py and the app in dry-run mode)."""
from __future__ import annotations

import json
import threading
import time

import pytest
from support.fabrics import fabric

from hpnlab.controller import dryrun, reconcile
from hpnlab.fabric.routing import compiler


@pytest.fixture(scope="module")
def desired():
    return {sw: reconcile.switch_table(st) for sw, st in compiler.compile_fabric(fabric("mini-hpn")).items()}


def route_key(table: dict) -> tuple:
    return next(k for k in table if not reconcile.is_group(k) and k[0] == compiler.TABLE_ROUTE)


def test_a_switch_that_holds_its_desired_state_has_nothing_to_change(desired):
    assert dryrun.changes(desired["p0l0"], desired["p0l0"]) == {"add": [], "modify": [], "delete": []}


def test_a_flow_deleted_by_hand_is_one_addition_described_as_ovs_ofctl_would(desired):
    held = dict(desired["p0l1"])
    key = route_key(held)
    del held[key]
    out = dryrun.changes(held, desired["p0l1"])
    assert out["modify"] == [] and out["delete"] == []
    (line,) = out["add"]
    assert line.startswith(f"table={key[0]},priority={key[1]},") and "ipv4_dst=10." in line and "actions=" in line


def test_changed_actions_and_group_buckets_are_modifications_and_strays_deletions(desired):
    held = dict(desired["p0l0"])
    key = route_key(held)
    held[key] = (("output", 77),)
    gkey = min(k for k in held if reconcile.is_group(k) and len(set(held[k].buckets)) > 1)
    group = held[gkey]
    held[gkey] = compiler.Group(group.group_id, group.kind, tuple(reversed(group.buckets)))
    held[(0, 5, (("eth_type", 0x88CC),))] = (("controller",),)
    out = dryrun.changes(held, desired["p0l0"])
    assert len(out["modify"]) == 2 and out["add"] == []
    assert any("output:77" in line for line in out["modify"]) and any(f"group_id={gkey.group_id}" in line
                                                                     for line in out["modify"])
    assert out["delete"] == ["table=0,priority=5,eth_type=0x88cc actions=CONTROLLER"]


def test_the_report_counts_per_switch_and_names_who_did_not_answer(desired):
    held = {sw: dict(t) for sw, t in desired.items() if sw != "p1s1"}
    del held["p0l1"][route_key(held["p0l1"])]
    rep = dryrun.report("mini-hpn", desired, held, desired)
    assert rep["missing"] == ["p1s1"] and set(rep["switches"]) == set(desired) - {"p1s1"}
    assert len(rep["switches"]["p0l1"]["add"]) == 1
    assert sum(len(r["add"]) + len(r["modify"]) + len(r["delete"]) for r in rep["switches"].values()) == 1
    assert json.loads(json.dumps(rep)) == rep
    text = dryrun.format_table(rep)
    assert "p0l1 add" in text and "no answer from 1 switch(es): p1s1" in text
    row = next(line for line in text.splitlines() if line.startswith("p0l1 "))
    assert row.split()[3:] == ["1", "0", "0"]


# ---- the app in dry-run mode (fake datapaths, real os-ken messages) ---------------------------

def _answer_every_switch(app, hand_deleted: str = "p0l2") -> None:
    """Every switch of mini-hpn connects to ``app`` (a dry run) and answers its questions with its desired
    tables, less one route flow on ``hand_deleted``; asserts the dry run asks and sends nothing else."""
    from os_ken.controller import ofp_event
    from os_ken.ofproto import ofproto_v1_3_parser as parser
    from support.fake_switch import (
        FakeDatapath,
        answer_flow_stats,
        answer_group_desc,
        dpids,
        group_desc,
        stats_entry,
    )

    from hpnlab.controller.codec import encode
    dps = {name: FakeDatapath(dpid) for name, dpid in dpids().items()}
    for name, dp in dps.items():
        app.on_features(ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(dp, datapath_id=dp.id)))
        sent = dp.take()
        assert all(isinstance(m, (parser.OFPPortDescStatsRequest, parser.OFPFlowStatsRequest,
                                  parser.OFPGroupDescStatsRequest, parser.OFPGroupFeaturesStatsRequest)) for m in sent)
        assert app.dry_run_report() is None
        want = app.reconciler.desired[name]
        flows = {k: a for k, a in want.items() if not reconcile.is_group(k)}
        if name == hand_deleted:
            del flows[route_key(flows)]
        groups = [encode(dp, reconcile.GroupMod(name, "add", g.group_id, g.kind, g.buckets))[0]
                  for k, g in want.items() if reconcile.is_group(k)]
        flow_req = next(m for m in sent if isinstance(m, parser.OFPFlowStatsRequest))
        group_req = next(m for m in sent if isinstance(m, parser.OFPGroupDescStatsRequest))
        answer_flow_stats(app, dp, flow_req, [stats_entry(k, a) for k, a in flows.items()])
        answer_group_desc(app, dp, group_req, [group_desc(g) for g in groups])
        assert dp.take() == [], f"{name}: a dry run sent something"


def test_the_app_in_dry_run_sends_only_the_questions_and_reports_the_difference(tmp_path):
    pytest.importorskip("os_ken")
    from support.fake_switch import controller_app
    app = controller_app(tmp_path, dry_run=True)
    _answer_every_switch(app)
    rep = app.dry_run_report()
    assert rep is not None and rep["missing"] == []
    changed = {sw: r for sw, r in rep["switches"].items() if r["add"] or r["modify"] or r["delete"]}
    assert list(changed) == ["p0l2"] and len(changed["p0l2"]["add"]) == 1


def test_a_dry_runs_gauges_follow_what_the_switches_hold_though_it_runs_no_tick(tmp_path):
    pytest.importorskip("os_ken")
    pytest.importorskip("prometheus_client")
    from support.fake_switch import controller_app

    from hpnlab.controller.app import TICK_S
    app = controller_app(tmp_path, dry_run=True)
    _answer_every_switch(app)
    held = {sw: sum(not reconcile.is_group(k) for k in table) for sw, table in app.reconciler.confirmed.items()}
    assert held["p0l2"] == sum(not reconcile.is_group(k) for k in app.reconciler.desired["p0l2"]) - 1
    # the loop a dry run's app starts in place of the tick (a daemon thread here: a test that fails must not
    # leave the test run waiting for it)
    loop = threading.Thread(target=app._metrics_loop, daemon=True)
    loop.start()

    def gauges():
        return {sw: app.metrics.flows.labels(sw)._value.get() for sw in held}
    deadline = time.monotonic() + 60        # a bound for a loaded machine, not a figure: the loop ticks every TICK_S
    while gauges() != held and time.monotonic() < deadline:
        time.sleep(TICK_S / 4)
    assert gauges() == held
    app.is_active = False           # the app stops (os-ken's stop() then joins its threads)...
    loop.join(60)
    assert not loop.is_alive()      # ...and the loop ends with it: a dry run's process exits once its report is out
