"""A second machine for real (issue 16, part 8): a small mini-hpn (2 segments of 2 hosts, 1 spine
per plane: 6 switches, 4 hosts) with plane 1's switches and half of the hosts on another server
(the full-kernel lane's qemu guest, booted as a server by tools/scripts/kernel_lane/second_machine.sh),
reached by ssh with the run's own key; links between the machines are ssh Ethernet tunnels
(Mininet's cluster edition), the controller runs here and the guest's Open vSwitch reaches it
over the link.

Runs in the lane (``make test-kernel``): the script boots the guest, then runs this module
on this machine with HPNLAB_SECOND_MACHINE (the guest's address), HPNLAB_SSH_IDENTITY,
HPNLAB_SSH_KNOWN_HOSTS and HPNLAB_REMOTE_PYTHON set. Without them it skips, saying so.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.experiments.runner import Plan
from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.kernel, pytest.mark.emulation, pytest.mark.controller]

SECOND = os.environ.get("HPNLAB_SECOND_MACHINE", "")
#: the guest runs under qemu's software emulation: its ovsdb, sshd and os-ken answers are slow
INACTIVITY_PROBE_MS = 60000
#: the smallest mini-hpn that still has both tiers and two planes: every guest-side step
#: (an ssh session, a tunnel, a Python start) costs seconds under TCG, so fewer nodes is the
#: lever: 6 switches (3 on the guest), 4 hosts (2 on the guest), 4 tunnels
SMALL = {"segments_per_pod": 2, "hosts_per_segment": 2, "spines_per_plane": 1}


@pytest.fixture(scope="module")
def two(emulation_ready):
    if not SECOND:
        pytest.skip("no second machine given (HPNLAB_SECOND_MACHINE unset); the lane boots one: "
                    "make test-kernel (tools/scripts/kernel_lane/second_machine.sh)")
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ClusterOptions, ControllerOptions, EmulationOptions, SupervisionOptions
    from hpnlab.fabric.scenario import spec

    emu = Emulation(spec.load("mini-hpn", SMALL), EmulationOptions(
        controller=ControllerOptions(listen=os.environ.get("HPNLAB_SECOND_MACHINE_CONTROLLER_IP", "127.0.0.1"),
                                     connect_timeout_s=180, ready_timeout_s=120,
                                     inactivity_probe_ms=INACTIVITY_PROBE_MS),
        supervision=SupervisionOptions(verify=False, lock_wait_s=300),
        cluster=ClusterOptions(servers=("localhost", SECOND), placement="plane")))
    emu.start()
    try:
        print("two machines up: " + ", ".join(f"{k} {v:.1f}" for k, v in emu.timings.items())
              + "; on the second machine: " + ", ".join(f"{k} {v:.1f}" for k, v in emu.builder.remote.spent.items()))
        yield emu
    finally:
        emu.stop()


def summary(flows) -> str:
    """The numeric totals of a result's flow record (retransmissions and the like), short."""
    if isinstance(flows, dict):
        return ", ".join(f"{k} {v}" for k, v in flows.items() if isinstance(v, int | float))[:300]
    if isinstance(flows, list):
        keys = {k for f in flows if isinstance(f, dict) for k, v in f.items() if isinstance(v, int | float)}
        return ", ".join(f"{k} {sum(f.get(k, 0) for f in flows):g}" for k in sorted(keys))[:300]
    return str(flows)[:200]


def on_second(emu, script: str) -> str:
    return emu.builder.remote.run(SECOND, script, 60.0).stdout


def server_of(emu, node: str) -> str:
    return emu.net.get(node).server


def test_plane_one_runs_on_the_second_machine_and_its_switches_reach_the_controller_here(two):
    g = two.graph
    for sw in fgraph.switches(g):
        assert server_of(two, sw) == (SECOND if g.nodes[sw]["plane"] == 1 else "localhost"), sw
    assert {server_of(two, h) for h in fgraph.hosts(g)} == {"localhost", SECOND}
    # the guest's own ovsdb holds plane 1's bridges, marked with the run, on the kernel datapath
    marked = on_second(two, f"ovs-vsctl --bare --columns=name find Bridge external_ids:hpnlab-run={two.state.run_id}")
    assert set(marked.split()) == {sw for sw in fgraph.switches(g) if g.nodes[sw]["plane"] == 1}
    assert two.metadata["cluster"]["remote"][SECOND]["datapath"] == "kernel"
    connected = two.connected_switches()          # one ssh session to the guest per call
    assert set(connected) == set(fgraph.switches(g)) and all(connected.values()), connected


def test_every_host_pair_on_every_plane_reaches_across_both_machines(two):
    first = two.ping_all()
    again = two.ping_all(pairs=first["failed"]) if first["failed"] else first   # ARP may lag once
    reached = first["pairs"] - len(again["failed"])
    print(f"second machine: reachability {reached}/{first['pairs']} host-port pairs "
          f"(first round {first['pairs'] - len(first['failed'])})")
    hosts = fgraph.hosts(two.graph)
    assert {len(fgraph.host_ports(two.graph, h)) for h in hosts} == {2}        # one port per plane
    assert first["pairs"] == len(hosts) * (len(hosts) - 1) * 2
    assert again["failed"] == []


def test_shaping_and_red_ecn_are_on_the_second_machines_switch_ports(two):
    far = [p for p in two.switch_ports() if not p["local"]]
    assert far and {server_of(two, p["switch"]) for p in far} == {SECOND}
    shown = two.builder.remote.qdiscs(SECOND, [p["intf"] for p in far], classes=True)   # one ssh session for all
    for p in far:
        assert "qdisc htb 1: root" in shown[p["intf"]], shown[p["intf"]]
        [leaf] = [line for line in shown[p["intf"]].splitlines() if line.startswith("class htb 1:1 ")]
        assert f" rate {p['rate_mbps']:g}Mbit " in leaf + " ", leaf
        assert "qdisc red 20:" in shown[p["intf"]] and " ecn " in shown[p["intf"]] + " ", shown[p["intf"]]


def test_an_all_reduce_across_both_machines_delivers_every_byte(two):
    # 4 ranks, 2 on each machine (the hosts alternate between them); one timed iteration, no
    # warm-up: every element is still checked at every rank. timeout_s: a rank waits this long
    # for a silent peer; a rank on the guest takes longer than the default 15 s just to start
    # its Python under qemu's software emulation
    plan = Plan(collectives="all_reduce", transports="roce", entropies="flow", ranks=4, placement="cross-rail",
                sizes="64K", iterations=1, warmup=0, timeout_s=120)
    t0 = time.monotonic()
    [res] = experiment.run(plan, two, progress=False)["results"]
    wall = time.monotonic() - t0
    assert {server_of(two, h) for h in res["hosts"]} == {"localhost", SECOND}
    [row] = res["rows"]
    cell = row["oop"]
    print(f"second machine: all_reduce 4 ranks 64 KiB roce: busbw {cell['busbw_gbs'] * 1e3:.4f} MB/s, "
          f"time {cell['time_us']:.0f} us, wrong elements {cell['wrong']}; {wall:.1f} s in all")
    # where that time went: the cell (ranks started to ranks done) and, per rank, the span after
    # its barrier over the data network (the rest of the cell is the ranks' start-up and barrier)
    cell_s = res["telemetry_t"][1] - res["telemetry_t"][0]
    print(f"second machine: cell {cell_s:.1f} s; per rank after its barrier: " + ", ".join(
        f"{r['host'] or '?'} {r['cpu']['total_wall_s']:.1f} s (cpu {r['cpu']['total_cpu_s']:.1f})"
        for r in res["ranks"]) + f"; flows {summary(res['flows'])}")
    assert cell["wrong"] == 0 and cell["busbw_gbs"] > 0


def test_stopping_removes_everything_the_run_made_on_both_machines(two):
    from hpnlab.fabric.emulation.remote import run_script

    run_id, far_intfs = two.state.run_id, two.state.remote[SECOND]["interfaces"]
    ssh = two.state.remote[SECOND]["ssh"]          # as recorded for `hpnlab clean`
    two.stop()
    left = run_script(ssh, f"""ovs-vsctl --bare --columns=name find Bridge external_ids:hpnlab-run={run_id}
grep -lzx HPNLAB_RUN={run_id} /proc/[0-9]*/environ 2>/dev/null
for i in {' '.join(far_intfs)}; do [ -e /sys/class/net/$i ] && echo "interface $i"; done
""", 60.0).stdout
    assert left.strip() == ""
    here = subprocess.run(["ovs-vsctl", "--bare", "--columns=name", "find", "Bridge",
                           f"external_ids:hpnlab-run={run_id}"], capture_output=True, text=True).stdout
    assert here.strip() == ""
