"""A controller that restarts while a link is down (pure: hpnlab.controller.reconcile, events in,
messages out). The switches hold the tables the previous controller installed for the failed link;
the new one is handed every switch as the app's wiring gate hands them over (once every switch told
its ports, each with the port states of its descriptions), reads back what each holds, and converges
to the failed-link tables without a single flow or group modification."""
from __future__ import annotations

import pytest
from support.fabrics import answer, fabric, installed

from hpnlab.controller import reconcile
from hpnlab.fabric.scenario import graph as fgraph

LINK = ("p0l0", "p0s0", 0)


@pytest.fixture(scope="module")
def g():
    return fabric("mini-hpn")


@pytest.fixture(scope="module")
def before(g) -> reconcile.Reconciler:
    """The previous controller: installed, then the link failed (both ends report it) and rerouted."""
    rec = installed(g)
    ports = g.edges[LINK]["ports"]
    for sw in ("p0l0", "p0s0"):
        answer(rec, rec.handle(reconcile.PortStatus(sw, {ports[sw]: False})))
    assert rec.settled
    return rec


def descriptions(g, down: set) -> dict[str, dict[int, bool]]:
    """Every switch's ports as its port descriptions give them (``down``: (switch, port) reported down)."""
    out: dict[str, dict[int, bool]] = {sw: {} for sw in fgraph.switches(g)}
    for u, v, d in g.edges(data=True):
        for n in (u, v):
            if n in out:
                out[n][d["ports"][n]] = (n, d["ports"][n]) not in down
    return out


def restart(g, held: dict, ports: dict) -> tuple[reconcile.Reconciler, dict[str, list]]:
    """A new controller beside switches that hold ``held``: every switch handed over with its ports,
    then every read-back answered, then every barrier. Returns it and the modifications per switch."""
    rec = reconcile.Reconciler(g)
    asked = []
    for sw in sorted(held):
        asked += rec.handle(reconcile.SwitchUp(sw, ports[sw]))
    assert {type(m) for m in asked} == {reconcile.FlowStatsRequest, reconcile.GroupDescRequest}   # read back first
    sent = []
    for m in asked:
        table = held[m.switch]
        if isinstance(m, reconcile.FlowStatsRequest):
            flows = tuple(reconcile.FlowEntry(k[0], k[1], k[2], a) for k, a in table.items()
                          if not reconcile.is_group(k))
            sent += rec.handle(reconcile.FlowStatsReply(m.switch, m.xid, flows))
        elif isinstance(m, reconcile.GroupDescRequest):
            groups = tuple(v for k, v in table.items() if reconcile.is_group(k))
            sent += rec.handle(reconcile.GroupDescReply(m.switch, m.xid, groups))
    mods: dict[str, list] = {}
    for m in answer(rec, sent):
        if isinstance(m, (reconcile.FlowMod, reconcile.GroupMod)):
            mods.setdefault(m.switch, []).append(m)
    return rec, mods


def rerouted(g, before: reconcile.Reconciler) -> set[str]:
    """The switches whose tables the failure changed."""
    healthy = installed(g).confirmed
    return {sw for sw, table in before.confirmed.items() if table != healthy[sw]}


def test_restarted_while_a_link_is_down_it_converges_to_the_failed_link_tables_with_no_change(g, before):
    changed = rerouted(g, before)
    assert "p0l0" in changed and len(changed) > 1 and changed < set(before.confirmed)   # not trivially all or none
    ends = {(sw, g.edges[LINK]["ports"][sw]) for sw in ("p0l0", "p0s0")}
    rec, mods = restart(g, {sw: dict(t) for sw, t in before.confirmed.items()}, descriptions(g, ends))
    assert mods == {}
    assert rec.settled and rec.failures == before.failures and rec.confirmed == before.confirmed
    assert rec.desired == before.confirmed


def test_a_link_seen_down_from_one_end_alone_is_enough_to_change_nothing(g, before):
    one_end = {("p0l0", g.edges[LINK]["ports"]["p0l0"])}
    rec, mods = restart(g, {sw: dict(t) for sw, t in before.confirmed.items()}, descriptions(g, one_end))
    assert mods == {} and rec.settled and rec.failures == before.failures


def test_restarted_after_the_link_came_back_only_the_rerouted_switches_are_changed(g, before):
    rec, mods = restart(g, {sw: dict(t) for sw, t in before.confirmed.items()}, descriptions(g, set()))
    assert mods and set(mods) <= rerouted(g, before)
    assert rec.settled and rec.confirmed == installed(g).confirmed
