"""Shared fixtures. (Additive: each section belongs to the feature that added it.)"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess

import networkx as nx
import pytest

from hpnlab.fabric import graph, spec

# ---- emulation (hpnlab.fabric.emulation): root, real Open vSwitch, Mininet -------------------------

def emulation_missing() -> str | None:
    """Why emulation tests cannot run here (names the missing feature), or None."""
    if os.geteuid() != 0:
        return "needs root (real Open vSwitch and network namespaces)"
    if shutil.which("ovs-vsctl") is None:
        return "needs Open vSwitch (openvswitch-switch)"
    if subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode != 0:
        return "needs Open vSwitch running (make ovs)"
    if shutil.which("mnexec") is None:
        return "needs mnexec (apt package mininet)"
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        return "needs the mininet Python package (make venv)"
    return None


@pytest.fixture(scope="session")
def emulation_ready():
    """Skip (naming the missing feature) unless root + running OVS + Mininet are available."""
    reason = emulation_missing()
    if reason:
        pytest.skip(reason)
    return True


@pytest.fixture(scope="module")
def mini_hpn(emulation_ready):
    """mini-hpn emulated with the hpnlab controller, shared by a test module; always torn down."""
    from hpnlab.fabric.emulation import Emulation

    emu = Emulation("mini-hpn", controller="hpnlab", lock_wait_s=300)
    emu.start()
    try:
        yield emu
    finally:
        emu.stop()


# ---- compiled fabrics: one cached graph per preset, shared by every test module -----------------

@functools.cache
def _fabric(name: str, overrides: tuple) -> nx.MultiGraph:
    return graph.build(spec.load(name, dict(overrides)))


def fabric(name: str, **overrides) -> nx.MultiGraph:
    """The fabric graph of a preset (with scenario overrides), built once per test session.
    Shared: a test must not change it (the compiler caches its index and healthy states on it,
    which is what makes sharing it fast). Import it with ``from conftest import fabric``."""
    return _fabric(name, tuple(sorted(overrides.items())))


# ---- the pure reconciler driven to the end (hpnlab.controller.reconcile) ----------------------

def answer(rec, msgs: list, now: float = 0.0) -> list:
    """Answer every barrier (and the barriers of what follows) until the reconciler is quiet;
    return every message it sent on the way."""
    from hpnlab.controller import reconcile

    sent = list(msgs)
    queue = list(msgs)
    while queue:
        m = queue.pop(0)
        if isinstance(m, reconcile.Barrier):
            more = rec.handle(reconcile.BarrierReply(m.switch, m.xid), now)
            sent += more
            queue += more
    return sent


def installed(g, policy: str = "aggregate"):
    """A reconciler whose switches have all connected and confirmed their healthy state."""
    from hpnlab.controller import reconcile

    rec = reconcile.Reconciler(g, policy)
    msgs = []
    for sw in graph.switches(g):
        msgs += rec.handle(reconcile.SwitchUp(sw))
    answer(rec, msgs)
    assert rec.settled
    return rec


def update_messages(rec, *events) -> dict:
    """The OpenFlow messages the reconciler sends, to the end of the update, for ``events``:
    {"flow_mods", "group_mods", "switches"} (switches: how many got any)."""
    from hpnlab.controller import reconcile

    sent = []
    for event in events:
        sent += answer(rec, rec.handle(event))
    assert rec.settled
    mods = [m for m in sent if isinstance(m, (reconcile.FlowMod, reconcile.GroupMod))]
    return {"flow_mods": sum(isinstance(m, reconcile.FlowMod) for m in mods),
            "group_mods": sum(isinstance(m, reconcile.GroupMod) for m in mods),
            "switches": len({m.switch for m in mods})}
