"""The per-switch flow gauge (controller/metrics.py) follows what each switch confirmed, though it is recounted
only for switches whose confirmed table or compiled state changed since the last update."""
from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")


from support.fabrics import fabric

from hpnlab.controller import reconcile
from hpnlab.controller.metrics import Metrics
from hpnlab.fabric.scenario import graph

G = fabric("mini-hpn")


def counted(rec: reconcile.Reconciler, sw: str) -> int:
    """Flows ``sw`` confirmed, counted afresh."""
    return sum(not reconcile.is_group(k) for k in rec.confirmed.get(sw, {}))


def gauge(m: Metrics, sw: str) -> float:
    return m.flows.labels(sw)._value.get()


def test_the_flow_gauge_equals_a_fresh_count_after_every_event():
    rec = reconcile.Reconciler(G, "aggregate")
    m = Metrics()
    pending = []
    for sw in graph.switches(G):
        pending += rec.handle(reconcile.SwitchUp(sw))
    pending += rec.handle(reconcile.PortStatus("p0l0", {5: False}))
    steps = 0
    while pending:
        msg = pending.pop(0)
        if isinstance(msg, reconcile.Barrier):
            pending += rec.handle(reconcile.BarrierReply(msg.switch, msg.xid))
        elif isinstance(msg, reconcile.FlowStatsRequest):
            pending += rec.handle(reconcile.FlowStatsReply(msg.switch, msg.xid))
        elif isinstance(msg, reconcile.GroupDescRequest):
            pending += rec.handle(reconcile.GroupDescReply(msg.switch, msg.xid))
        else:
            continue
        m.update_reconciler(rec, dict(rec.counters), graph.switches(G), len(rec.connected), True)
        steps += 1
        assert {sw: gauge(m, sw) for sw in graph.switches(G)} == {sw: counted(rec, sw) for sw in graph.switches(G)}
    assert steps and rec.settled and counted(rec, "p0l0") > 0
