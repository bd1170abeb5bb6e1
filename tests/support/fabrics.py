"""Helpers shared by pure test modules: fabric graphs built once per session, and the pure
reconciler driven on them (plain functions; import with ``from support.fabrics import ...``)."""
from __future__ import annotations

import functools

import networkx as nx

from hpnlab.controller import reconcile
from hpnlab.fabric.scenario import graph, spec

# ---- compiled fabrics: one cached graph per preset, shared by every test module -----------------

@functools.cache
def _fabric(name: str, overrides: tuple) -> nx.MultiGraph:
    return graph.build(spec.load(name, dict(overrides)))


def fabric(name: str, **overrides) -> nx.MultiGraph:
    """The fabric graph of a preset (with scenario overrides), built once per test session.
    Shared: a test must not change it (the compiler caches its index and healthy states on it,
    which is what makes sharing it fast). Import it with ``from support.fabrics import fabric``."""
    return _fabric(name, tuple(sorted(overrides.items())))


# ---- the pure reconciler driven to the end (hpnlab.controller.reconcile) ----------------------

def answer(rec, msgs: list, now: float = 0.0) -> list:
    """Answer every barrier (and the barriers of what follows) until the reconciler is quiet;
    return every message it sent on the way. A switch asked what it holds (it connected, or is
    resynchronised) answers that it holds nothing: a fresh switch."""
    sent = list(msgs)
    queue = list(msgs)
    while queue:
        m = queue.pop(0)
        more = []
        if isinstance(m, reconcile.Barrier):
            more = rec.handle(reconcile.BarrierReply(m.switch, m.xid), now)
        elif isinstance(m, reconcile.FlowStatsRequest):
            more = rec.handle(reconcile.FlowStatsReply(m.switch, m.xid), now)
        elif isinstance(m, reconcile.GroupDescRequest):
            more = rec.handle(reconcile.GroupDescReply(m.switch, m.xid), now)
        sent += more
        queue += more
    return sent


def installed(g, policy: str = "aggregate"):
    """A reconciler whose switches have all connected and confirmed their healthy state."""
    rec = reconcile.Reconciler(g, policy)
    msgs = []
    for sw in graph.switches(g):
        msgs += rec.handle(reconcile.SwitchUp(sw))
    answer(rec, msgs)
    assert rec.settled
    return rec


def messages_sent(rec, *events) -> dict:
    """The OpenFlow messages the reconciler sends, to the end of the update, for ``events``:
    {"flow_mods", "group_mods", "switches"} (switches: how many got any)."""
    sent = []
    for event in events:
        sent += answer(rec, rec.handle(event))
    assert rec.settled
    mods = [m for m in sent if isinstance(m, (reconcile.FlowMod, reconcile.GroupMod))]
    return {"flow_mods": sum(isinstance(m, reconcile.FlowMod) for m in mods),
            "group_mods": sum(isinstance(m, reconcile.GroupMod) for m in mods),
            "switches": len({m.switch for m in mods})}


# ---- the order of emulation tests (used by conftest.py) -----------------------------------------

def shared_runs_together(shares: list[str | None]) -> list[int]:
    """The order to run tests in, given the shared emulation each one's module uses (None: none):
    the tests of one shared emulation one after another, at the place of the first of them, in
    their own order; every other test where it was."""
    first: dict[str, int] = {}
    for i, name in enumerate(shares):
        if name is not None:
            first.setdefault(name, i)
    return sorted(range(len(shares)), key=lambda i: first[n] if (n := shares[i]) is not None else i)


def random_sharing(rng, n_flows: int, n_links: int, longest: int, weights: list[float]
                   ) -> tuple[list[int], list[int], list[float]]:
    """Random (flow, link, weight) entries for max-min tests: every flow crosses 1 to ``longest - 1``
    distinct links, each with a weight drawn from ``weights``."""
    f: list[int] = []
    lk: list[int] = []
    w: list[float] = []
    for i in range(n_flows):
        for link in rng.choice(n_links, size=rng.integers(1, longest), replace=False):
            f.append(i)
            lk.append(int(link))
            w.append(float(rng.choice(weights)))
    return f, lk, w
