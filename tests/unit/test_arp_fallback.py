"""The per-leaf ARP fallback (controller/arp_fallback.py): a leaf whose switch rejects the gateway-MAC
design's actions answers ARP per host from then on, alone. The decision on plain values; the reconciler's
ArpMode (only that leaf's responders change, every pair still resolves and delivers through the table
interpreter); and the os-ken app on fake datapaths: an OpenFlow error naming a responder's xid."""
from __future__ import annotations

import logging
from typing import Any

import pytest
from support.fabrics import fabric

from hpnlab.controller import arp_fallback, reconcile
from hpnlab.controller.arp_fallback import OFPBAC_BAD_EXP_TYPE, OFPBAC_BAD_SET_TYPE, OFPET_BAD_ACTION
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph

OFPET_FLOW_MOD_FAILED, OFPFMFC_TABLE_FULL = 5, 1


def gateway_responder(g, leaf: str = "p0l0") -> compiler.Flow:
    st = compiler.compile_fabric(g, switches=[leaf])[leaf]
    return next(f for f in st.flows if f.priority == compiler.PRIO_ARP_RESPONDER)


def last_hop(g, leaf: str = "p0l0") -> compiler.Flow:
    st = compiler.compile_fabric(g, switches=[leaf])[leaf]
    return next(f for f in st.flows if f.table == compiler.TABLE_ROUTE and
                ("set_field", "eth_src", compiler.GATEWAY_MAC) in f.actions)


def as_sent(f: compiler.Flow) -> tuple:
    return (f.table, f.priority, f.actions)


@pytest.mark.parametrize("code", sorted(c for _t, c in arp_fallback.REJECTED))
def test_a_leaf_that_rejects_a_gateway_responder_falls_back_to_per_host(code):
    fb = arp_fallback.decide("p0l0", True, "gateway", as_sent(gateway_responder(fabric("mini-hpn"))),
                             OFPET_BAD_ACTION, code)
    assert fb is not None and (fb.leaf, fb.mode, fb.kind) == ("p0l0", "per-host", "responder")
    assert "p0l0" in fb.line() and "\n" not in fb.line()


def test_a_leaf_that_rejects_a_last_hop_set_field_falls_back_too():
    fb = arp_fallback.decide("p0l0", True, "gateway", as_sent(last_hop(fabric("mini-hpn"))), OFPET_BAD_ACTION,
                             OFPBAC_BAD_SET_TYPE)
    assert fb is not None and fb.kind == "last-hop"


@pytest.mark.parametrize("case", ["not a leaf", "per-host already", "unknown flow", "other error", "other flow"])
def test_anything_else_is_no_fallback(case):
    g = fabric("mini-hpn")
    flow = as_sent(gateway_responder(g))
    args: dict[str, Any] = {"switch": "p0l0", "is_leaf": True, "mode": "gateway", "flow": flow,
                            "err_type": OFPET_BAD_ACTION, "err_code": OFPBAC_BAD_EXP_TYPE}
    changes: dict[str, dict[str, Any]] = {
                 "not a leaf": {"switch": "p0s0", "is_leaf": False}, "per-host already": {"mode": "per-host"},
                 "unknown flow": {"flow": None},
                 "other error": {"err_type": OFPET_FLOW_MOD_FAILED, "err_code": OFPFMFC_TABLE_FULL},
                 "other flow": {"flow": as_sent(next(f for f in compiler.compile_fabric(g)["p0l0"].flows
                                                     if f.table == compiler.TABLE_ENTROPY))}}
    args.update(changes[case])
    assert arp_fallback.decide(**args) is None


def test_arp_mode_changes_only_that_leafs_responders():
    g = fabric("mini-hpn")
    rec = reconcile.Reconciler(g)
    before = {sw: dict(t) for sw, t in rec.desired.items()}
    rec.handle(reconcile.ArpMode("p0l0", "per-host"))
    per_host = reconcile.switch_table(compiler.compile_fabric(g, arp="per-host", switches=["p0l0"])["p0l0"])
    assert rec.desired["p0l0"] == per_host
    assert {sw for sw, t in rec.desired.items() if t != before[sw]} == {"p0l0"}
    assert rec.counters["arp_fallbacks"] == 1


def test_a_fallen_back_leaf_keeps_per_host_responders_through_a_failure_recompile():
    g = fabric("mini-hpn")
    rec = reconcile.Reconciler(g)
    rec.handle(reconcile.ArpMode("p0l0", "per-host"))
    (port, _), = graph.link_ports(g, "p0l0", "p0s0")
    rec.handle(reconcile.PortStatus("p0l0", {port: False}))
    failed = compiler.compile_fabric(g, compiler.Failures.of([("p0l0", "p0s0", 0)]), arp="per-host",
                                     switches=["p0l0"])["p0l0"]
    assert rec.desired["p0l0"] == reconcile.switch_table(failed)


def test_a_fabric_with_one_leaf_fallen_back_resolves_and_delivers_every_pair():
    """The last hops are the same in both modes: a per-host leaf beside gateway leaves delivers every pair,
    and its hosts learn their peers' own MACs."""
    from support.arp import arp_request, plane_ports

    g = fabric("mini-hpn")
    rec = reconcile.Reconciler(g)
    rec.handle(reconcile.ArpMode("p0l0", "per-host"))
    net = FabricTables(g, rec.states)
    for host, asker in plane_ports(g, 0):
        for _peer, target in plane_ports(g, 0):
            if target["ip"] == asker["ip"]:
                continue
            walk = net.inject(host, asker["intf"], arp_request(asker, target["ip"]))
            assert walk.result == "delivered", walk
            want = target["mac"] if asker["leaf"] == "p0l0" else compiler.GATEWAY_MAC
            assert walk.packet["arp_sha"] == want
    pairs = net.all_pairs()
    assert pairs and all(net.send(s, d, p, src_rail=sr, dst_rail=dr).result == "delivered"
                         for s, d, p, sr, dr in pairs)


# ---- the app (fake datapaths) ----------------------------------------------------------------------

def test_the_app_falls_back_on_the_leaf_whose_switch_rejects_a_responder_and_counts_it_once(caplog, tmp_path):
    pytest.importorskip("os_ken")
    from os_ken.controller import ofp_event
    from os_ken.ofproto import ofproto_v1_3 as ofp
    from os_ken.ofproto import ofproto_v1_3_parser as parser
    from support.fake_switch import (
        FakeDatapath,
        answer_barriers,
        answer_flow_stats,
        answer_group_desc,
        controller_app,
        dpids,
        group_desc,
        stats_entry,
    )

    from hpnlab.controller.codec import encode
    app = controller_app(tmp_path, on_miswire="off")
    dps = {name: FakeDatapath(dpid) for name, dpid in dpids().items()}
    for dp in dps.values():
        app.on_features(ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(dp, datapath_id=dp.id)))
    sent = answer_barriers(app, dps)
    leaf = dps["p0l0"]
    responders = [m for d, m in sent if d is leaf and isinstance(m, parser.OFPFlowMod)
                  and m.priority == compiler.PRIO_ARP_RESPONDER]
    assert responders
    held = {k: a for k, a in app.reconciler.desired["p0l0"].items()
            if not reconcile.is_group(k) and k[1] != compiler.PRIO_ARP_RESPONDER}     # the switch refused them
    groups = [group_desc(encode(leaf, reconcile.GroupMod("p0l0", "add", g.group_id, g.kind, g.buckets))[0])
              for k, g in app.reconciler.desired["p0l0"].items() if reconcile.is_group(k)]
    with caplog.at_level(logging.WARNING, logger="hpnlab.controller"):
        for m in responders:        # the switch answers each responder with an error
            error = parser.OFPErrorMsg(leaf, type_=ofp.OFPET_BAD_ACTION, code=ofp.OFPBAC_BAD_EXP_TYPE, data=b"")
            error.set_xid(m.xid)
            app.on_error(ofp_event.EventOFPErrorMsg(error))
    lines = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("p0l0 ")
    assert app.metrics is not None
    assert app.metrics.registry.get_sample_value("hpnlab_arp_fallbacks_total", {"switch": "p0l0"}) == 1
    assert app.reconciler.arp_leaves == {"p0l0": "per-host"}
    for m in leaf.take():           # the resync: the switch tells what it holds
        if isinstance(m, parser.OFPFlowStatsRequest):
            answer_flow_stats(app, leaf, m, [stats_entry(k, a) for k, a in held.items()])
        elif isinstance(m, parser.OFPGroupDescStatsRequest):
            answer_group_desc(app, leaf, m, groups)
    after = answer_barriers(app, dps)
    mods = [m for d, m in after if isinstance(m, parser.OFPFlowMod)]
    assert {d for d, m in after if isinstance(m, parser.OFPFlowMod)} == {leaf}     # no other switch changes
    added = [m for m in mods if m.command == ofp.OFPFC_ADD]
    per_host = [f for f in compiler.compile_fabric(fabric("mini-hpn"), arp="per-host", switches=["p0l0"])["p0l0"].flows
                if f.priority == compiler.PRIO_ARP_RESPONDER]
    assert len(added) == len(per_host) and all(m.priority == compiler.PRIO_ARP_RESPONDER for m in added)
    assert all(m.command == ofp.OFPFC_DELETE_STRICT and m.priority == compiler.PRIO_ARP_OWN
               for m in mods if m.command != ofp.OFPFC_ADD)        # the gateway design's own-address entries go
    assert app.reconciler.settled
