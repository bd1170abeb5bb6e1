"""Discovery, deployment file and staged rollout on a live fabric: mini-hpn on real Open vSwitch,
cabled wrong on purpose, on datapath ids and port numbers of its own (hpnlab.fabric.emulation.rewire:
the harness writes the deployment file, which gives every port by its name, as for real switches),
with one plane broken before it is installed; the controller
as a real process with ``--rollout staged``. One emulation for the module (about 30 s to bring up)."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from hpnlab.fabric.emulation.reachability import all_pairs
from hpnlab.fabric.emulation.rewire import Rewire
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

SWAP = (("p0l0", "p0s0"), ("p0l1", "p0s1"))
DROP = ("p0l2", "p0s0")
OFFSET = 100
REWIRE = Rewire(swap=[SWAP], drop=[DROP], dpid_base=0xAB00000000000000, port_offset=OFFSET, port_names=True)
BROKEN = ("p1s0", "p1s0-eth1")       # forwards nothing out of its port to p1l0; its carrier stays up
CONTROLLER_COOKIE = "0x68706e6c61620000"


def ofctl(*args: str) -> str:
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", *args], capture_output=True, text=True,
                          timeout=10).stdout


def break_plane_1(emu) -> None:
    subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "mod-port", *BROKEN, "no-forward"], check=True, timeout=10)


@pytest.fixture(scope="module")
def emu(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, PortOptions, SupervisionOptions

    e = Emulation("mini-hpn", EmulationOptions(
        controller=ControllerOptions(extra_args=("--rollout", "staged")), ports=PortOptions(ecn=False, shape=False),
        supervision=SupervisionOptions(verify=False, lock_wait_s=300), rewire=REWIRE), log=None, on_built=break_plane_1)
    e.start()
    try:
        yield e
    finally:
        e.stop()


def plane_of(g, host: str, ip: str) -> int:
    return next(p["plane"] for p in fgraph.host_ports(g, host) if p["ip"] == ip)


def predicted_unreachable(g, held: set) -> set:
    """Plane-0 pairs the scenario leaves without a way once the held-down links count as failed."""
    ix = compiler.index_of(g)
    failures = compiler.Failures.of(links={ix.link_at(sw, p) for sw, p in held})
    net = FabricTables(g, compiler.compile_fabric(g, failures, "aggregate"), failures)
    return {tuple(p) for p in all_pairs(g) if net.send(p[0], p[2], plane=plane_of(g, p[0], p[1])).result != "delivered"}


def wiring_now(emu) -> dict:
    """The controller's latest wiring report (it keeps checking after it decided)."""
    return json.loads(emu.controller.wiring_file.read_text())


def held_in_scenario_ports(emu) -> set:
    return {(sw, port - OFFSET) for sw, port in wiring_now(emu)["decision"]["held_down"]}


def ping_until_none_fails(emu, pairs: list, rounds: int = 3) -> list:
    failed = pairs
    for _ in range(rounds):
        failed = emu.ping_all(pairs=failed)["failed"]
        if not failed:
            break
    return failed


def test_the_miswiring_is_reported_port_by_port_in_the_switches_own_numbers(emu, capsys):
    report = wiring_now(emu)
    found = {(f["kind"], f["switch"], f["port"]) for f in report["findings"]}
    assert found == {("miswired", "p0l0", 105), ("miswired", "p0s1", 102), ("miswired", "p0l1", 106),
                     ("miswired", "p0s0", 101), ("missing", "p0l2", 105), ("missing", "p0s0", 103)}
    assert sum("swapped" in f["line"] for f in report["findings"]) == 4
    assert report["decision"]["planes"] == [0, 1] and len(report["decision"]["held_down"]) == 6
    with open(emu.metadata["controller_log"], errors="replace") as f:
        log = f.read()
    assert all(f["line"] in log for f in report["findings"])
    with capsys.disabled():
        print("\n" + "\n".join(line.split(": ", 1)[1] if "hpnlab.controller: " in line else line
                               for line in log.splitlines() if "wiring: " in line))


def test_switches_with_foreign_dpids_and_ports_run_through_the_deployment_file(emu):
    assert "--deployment" in emu.metadata["controller_cmd"]
    with open(emu.metadata["deployment"]) as f:
        site = yaml.safe_load(f)
    assert site["switches"]["p0l0"]["ports"][6] == "p0l0-eth6"          # ports given by name ...
    resolved = wiring_now(emu)["deployment"]
    assert resolved["errors"] == [] and len(resolved["resolved"]) == 12
    assert resolved["resolved"]["p0l0"]["6"] == 106                     # ... resolved on the switch's numbers
    assert subprocess.run(["ovs-vsctl", "get", "Interface", "p0l0-eth6", "ofport"], capture_output=True,
                          text=True).stdout.strip() == "106"
    flows = ofctl("dump-flows", "p0l3", f"cookie={CONTROLLER_COOKIE}/-1")
    assert "output:105" in flows or "group:" in flows
    groups = ofctl("dump-groups", "p0l3")
    assert "watch_port:105" in groups and "watch_port:5," not in groups


def test_nothing_installed_black_holes_on_the_miswired_plane(emu):
    """Plane 0: every pair the scenario still connects without the held cables pings; the pairs left with
    no way get no route (dropped at their first switch), never a wrong cable."""
    unreachable = predicted_unreachable(emu.graph, held_in_scenario_ports(emu))
    assert unreachable and {plane_of(emu.graph, p[0], p[1]) for p in unreachable} == {0}
    reachable = [p for p in emu.all_pairs() if plane_of(emu.graph, p[0], p[1]) == 0 and tuple(p) not in unreachable]
    assert ping_until_none_fails(emu, reachable) == []
    assert {tuple(p) for p in emu.ping_all(pairs=sorted(unreachable), timeout_s=1.0)["failed"]} == unreachable


def test_the_broken_plane_is_rolled_back_and_the_other_stays(emu, capsys):
    """With host probes (the default): plane 0's probes all came back from the destination hosts themselves
    (their TCP stacks answered), plane 1's did not all."""
    rollout = emu.metadata["rollout"]
    with capsys.disabled():
        print(f"\nrollout stages (probes {rollout['probe']}): {rollout['stages']}")
    assert rollout["probe"] == "hosts"
    assert rollout["passed"] == [0] and rollout["rolled_back"] == [1]
    assert rollout["stages"][0]["arrived"] == rollout["stages"][0]["probes"] > 0
    failed = rollout["stages"][1]
    assert not failed["ok"] and failed["arrived"] < failed["probes"]
    for sw in fgraph.switches(emu.graph):
        ours = [line for line in ofctl("dump-flows", sw, f"cookie={CONTROLLER_COOKIE}/-1").splitlines()
                if "cookie=" in line]
        assert bool(ours) == sw.startswith("p0"), sw
    plane1 = [p for p in emu.all_pairs() if plane_of(emu.graph, p[0], p[1]) == 1][:20]
    assert len(emu.ping_all(pairs=plane1, timeout_s=1.0)["failed"]) == len(plane1)
