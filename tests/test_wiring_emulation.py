"""The wiring check on a live fabric: mini-hpn on real Open vSwitch, cabled wrong on purpose
(hpnlab.fabric.emulation.rewire), the controller as a real process discovering it with LLDP."""
from __future__ import annotations

import pytest

from hpnlab.controller import compiler
from hpnlab.controller.oftable import FabricTables
from hpnlab.fabric import graph as fgraph
from hpnlab.fabric.emulation.reachability import all_pairs
from hpnlab.fabric.emulation.rewire import Rewire

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

SWAP = (("p0l0", "p0s0"), ("p0l1", "p0s1"))
DROP = ("p0l2", "p0s0")


def plane_of(g, host: str, ip: str) -> int:
    return next(p["plane"] for p in fgraph.host_ports(g, host) if p["ip"] == ip)


def predicted_unreachable(g, held: set) -> set:
    """The host pairs the scenario leaves without a way once the held-down links count as failed."""
    ix = compiler.index_of(g)
    failures = compiler.Failures.of(links={ix.link_at(sw, p) for sw, p in held})
    net = FabricTables(g, compiler.compile_fabric(g, failures, "aggregate"), failures)
    return {tuple(p) for p in all_pairs(g) if net.send(p[0], p[2], plane=plane_of(g, p[0], p[1])).result != "delivered"}


def test_a_miswired_fabric_is_reported_port_by_port_and_nothing_installed_black_holes(emulation_ready, capsys):
    from hpnlab.fabric.emulation import Emulation

    emu = Emulation("mini-hpn", ecn=False, shape=False, verify=False, lock_wait_s=300, log=None,
                    rewire=Rewire(swap=[SWAP], drop=[DROP]))
    emu.start()
    try:
        report = emu.metadata["wiring"]
        found = {(f["kind"], f["switch"], f["port"]) for f in report["findings"]}
        assert found == {("miswired", "p0l0", 5), ("miswired", "p0s1", 2), ("miswired", "p0l1", 6),
                         ("miswired", "p0s0", 1), ("missing", "p0l2", 5), ("missing", "p0s0", 3)}
        assert sum("swapped" in f["line"] for f in report["findings"]) == 4
        held = {tuple(p) for p in report["decision"]["held_down"]}
        assert report["decision"]["planes"] == [0, 1] and len(held) == 6
        with capsys.disabled():
            print("\n" + "\n".join(f["line"] for f in report["findings"]))
        unreachable = predicted_unreachable(emu.graph, held)
        assert {plane_of(emu.graph, p[0], p[1]) for p in unreachable} == {0}
        reachable = [p for p in emu.all_pairs() if tuple(p) not in unreachable]
        failed = reachable
        for _ in range(4):            # routes go in once the wiring is decided: give them a few rounds
            failed = emu.ping_all(pairs=failed)["failed"]
            if not failed:
                break
        assert failed == []
        assert {tuple(p) for p in emu.ping_all(pairs=sorted(unreachable), timeout_s=1.0)["failed"]} == unreachable
        with open(emu.metadata["controller_log"], errors="replace") as f:
            log = f.read()
        assert all(f["line"] in log for f in report["findings"])
    finally:
        emu.stop()
