"""``--on-miswire off`` (no LLDP gate) and a controller restarted while a link is down: the switches kept
the tables the previous controller installed for the failure (fail mode secure). The new controller reads
each switch back as it connects but sends nothing until every switch has told its ports (or discovery
settled, as with the gate on: wiring.release_ungated); so it never installs the healthy routes on a switch
that connected early only to undo them when the failed link's ends report it. A first start, whose switches
hold nothing, is not held. The decision on plain values; the os-ken app on fake datapaths."""
from __future__ import annotations

import pytest
from support.fabrics import answer, fabric, installed

from hpnlab.controller import reconcile, wiring

pytest.importorskip("os_ken")

from os_ken.controller import ofp_event
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from support.fake_switch import (
    FakeDatapath,
    answer_flow_stats,
    answer_group_desc,
    controller_app,
    group_desc,
    stats_entry,
)

LINK = ("p0l0", "p0s0", 0)


def test_a_restart_beside_tables_is_held_until_every_switch_told_its_ports():
    def release(connected: int, told: int) -> bool:
        return wiring.release_ungated(read_back=3, held_entries=120, connected=connected, told=told, expected=12,
                                      quiet_s=0.0, discovery_s=3.0)
    assert not release(3, 3)
    assert not release(12, 11)
    assert release(12, 12)


def test_the_hold_ends_when_discovery_settles_without_every_switch():
    def release(quiet_s: float) -> bool:
        return wiring.release_ungated(read_back=3, held_entries=120, connected=11, told=11, expected=12,
                                      quiet_s=quiet_s, discovery_s=3.0)
    assert not release(3.0 + wiring.SWITCH_WAIT_S - 0.1)
    assert release(3.0 + wiring.SWITCH_WAIT_S)


def test_a_first_start_is_not_held():
    assert wiring.release_ungated(read_back=1, held_entries=0, connected=1, told=1, expected=12, quiet_s=0.0,
                                  discovery_s=3.0)
    assert not wiring.release_ungated(read_back=0, held_entries=0, connected=1, told=1, expected=12, quiet_s=0.0,
                                      discovery_s=3.0)


# ---- the app ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def before():
    """The previous controller: installed, then the link failed (both ends report it) and rerouted."""
    g = fabric("mini-hpn")
    rec = installed(g)
    ports = g.edges[LINK]["ports"]
    for sw in ("p0l0", "p0s0"):
        answer(rec, rec.handle(reconcile.PortStatus(sw, {ports[sw]: False})))
    assert rec.settled
    return g, rec


def off_app(tmp_path, discovery_s: float = 3600):
    return controller_app(tmp_path, on_miswire="off", telemetry_interval_ms=0, discovery_s=discovery_s)


def connect(app, g, dp, name: str, down: set) -> None:
    app.on_features(ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(dp, datapath_id=dp.id)))
    ports = sorted({d["ports"][name] for _u, _v, d in g.edges(name, data=True)})
    body = [parser.OFPPort(port_no=p, hw_addr="02:00:00:00:00:01", name=b"x", config=0,
                           state=ofp.OFPPS_LINK_DOWN if (name, p) in down else ofp.OFPPS_LIVE, curr=0, advertised=0,
                           supported=0, peer=0, curr_speed=0, max_speed=0) for p in ports]
    app.on_port_desc(ofp_event.EventOFPPortDescStatsReply(parser.OFPPortDescStatsReply(dp, body=body)))


def pump(app, dps: dict, held: dict) -> list:
    """Answer every read-back with what the switch holds and every barrier, until quiet; the flow and group
    modifications sent meanwhile."""
    from hpnlab.controller.codec import encode
    mods: list = []
    while True:
        pending = [(name, m) for name, dp in dps.items() for m in dp.take()]
        if not pending:
            return mods
        for name, m in pending:
            dp, table = dps[name], held[name]
            if isinstance(m, parser.OFPFlowStatsRequest):
                answer_flow_stats(app, dp, m, [stats_entry(k, a) for k, a in table.items()
                                               if not reconcile.is_group(k)])
            elif isinstance(m, parser.OFPGroupDescStatsRequest):
                answer_group_desc(app, dp, m, [
                    group_desc(encode(dp, reconcile.GroupMod(name, "add", v.group_id, v.kind, v.buckets))[0])
                    for k, v in table.items() if reconcile.is_group(k)])
            elif isinstance(m, parser.OFPBarrierRequest):
                reply = parser.OFPBarrierReply(dp)
                reply.set_xid(m.xid)
                app.on_barrier_reply(ofp_event.EventOFPBarrierReply(reply))
            elif isinstance(m, (parser.OFPFlowMod, parser.OFPGroupMod)):
                mods.append((name, m))


def restart_during_the_failure(app, g, rec) -> list:
    """Every switch connects in turn (the failed link's ends last), each answered before the next."""
    held = {sw: dict(t) for sw, t in rec.confirmed.items()}
    dps = {sw: FakeDatapath(g.nodes[sw]["dpid"]) for sw in held}
    ends = {(sw, g.edges[LINK]["ports"][sw]) for sw in LINK[:2]}
    mods = []
    for name in sorted(held, key=lambda sw: (sw in LINK[:2], sw)):
        connect(app, g, dps[name], name, ends)
        mods += pump(app, {name: dps[name]}, held)
    return mods + pump(app, dps, held)


def test_restarted_during_a_failure_with_the_gate_off_it_changes_nothing(before, tmp_path):
    g, rec = before
    app = off_app(tmp_path)
    mods = restart_during_the_failure(app, g, rec)
    assert mods == []
    assert not app.reconciler.hold and app.reconciler.settled
    assert app.reconciler.failures == rec.failures and app.reconciler.confirmed == rec.confirmed


def test_without_the_hold_the_early_switches_get_changes_that_are_then_undone(before, tmp_path):
    """What the hold prevents (the app before it): changes, on switches the failure had rerouted."""
    g, rec = before
    app = off_app(tmp_path)
    app.reconciler.hold = False
    mods = restart_during_the_failure(app, g, rec)
    assert mods and app.reconciler.confirmed == rec.confirmed      # sent, then undone
    print(f"flow/group mods without the hold: {len(mods)} on {len({n for n, _m in mods})} switches")


def test_a_switch_that_never_comes_ends_the_hold_once_discovery_settles(before, tmp_path):
    g, rec = before
    app = off_app(tmp_path, discovery_s=0)
    held = {sw: dict(t) for sw, t in rec.confirmed.items() if sw != "p1s1"}
    dps = {sw: FakeDatapath(g.nodes[sw]["dpid"]) for sw in held}
    for name in sorted(held):
        connect(app, g, dps[name], name, set())
    assert pump(app, dps, held) == [] and app.reconciler.hold
    app.wiring.last_connect -= wiring.SWITCH_WAIT_S + 1
    app.wiring.tick()
    assert not app.reconciler.hold and pump(app, dps, held)       # installs: the link's repair, p1s1 failed
