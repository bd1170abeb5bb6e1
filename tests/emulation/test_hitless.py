"""Hitless restart on a live fabric (mini-hpn, real Open vSwitch, the controller as a process): the
controller killed during a collective is restarted, every byte arrives exactly once, and no flow is
deleted and re-added (Open vSwitch's own flow durations keep growing); a dry run beside a fabric
with one flow deleted by hand names exactly that flow and changes nothing; a host whose ARP entry
is flushed while the controller is down still reaches its peers (ARP responder flows: the gateway MAC,
written back to the receiver's own MAC by the last leaf).

One emulated network for the module; each test leaves the controller running."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from support.emulated import flows, not_re_added, ofctl
from support.wait import wait_for

from hpnlab.controller import reconcile
from hpnlab.fabric.emulation import timeline
from hpnlab.fabric.experiments.runner import Plan, run
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

@pytest.fixture(scope="module")
def emu(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, SupervisionOptions

    with Emulation("mini-hpn", EmulationOptions(
        controller=ControllerOptions(on_loss="restart"), supervision=SupervisionOptions(lock_wait_s=300))) as emu:
        yield emu


def udp_stream(emu, src: str, dst: str, seconds: float, port: int = 5999) -> tuple:
    """A paced UDP stream src -> dst on plane 0 through the fabric (hpnlab.fabric.emulation.udp):
    (sender, receiver) processes; each prints one JSON line at its end."""
    recv = emu.popen(dst, [sys.executable, "-m", "hpnlab.fabric.emulation.udp", "recv", emu.ip(dst, plane=0),
                           str(port), "--seconds", f"{seconds + 4:g}"], stdout=subprocess.PIPE, text=True)
    assert recv.stdout is not None and recv.stdout.readline().strip() == "listening"
    send = emu.popen(src, [sys.executable, "-m", "hpnlab.fabric.emulation.udp", "send", emu.ip(dst, plane=0),
                           str(port), "--rate-mbps", "2", "--seconds", f"{seconds:g}", "--tos", "0"],
                     stdout=subprocess.PIPE, text=True)
    return send, recv


def last_json(proc) -> dict:
    out = proc.communicate(timeout=60)[0]
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def test_the_controller_killed_during_a_collective_is_restarted_every_byte_arrives_and_no_flow_is_re_added(emu):
    assert all(ovsdb_fail_mode(sw) == "secure" for sw in fgraph.switches(emu.graph))
    plan = Plan(collectives="all_reduce", transports="roce", entropies="spray", ranks=4,
                placement="cross-rail", sizes="1M", iterations=4)
    before, t0 = flows(emu), time.monotonic()
    # the stream runs between hosts the collective does not use (it takes h1, h5, h9 and h13). From h1
    # to h13 it shared their NIC and host port with the all-reduce at line rate, and once (CI,
    # 2026-12-04, a faster machine) lost 1 of 3,572 packets while the collective re-sent one: most
    # likely that shared queue (not proven); the controller's restart is what this test is about
    src, dst = "h2", "h14"
    assert not {src, dst} & set(next(iter(plan.jobs_on(emu.graph).values()))[0].labels or [])
    send, recv = udp_stream(emu, src, dst, seconds=20.0)
    tl = timeline.load({"events": [{"at": 1.0, "action": "controller_kill"}]}, emu.graph)
    [res] = run(plan, emu, progress=False, timeline=tl)["results"]
    assert wait_for(lambda: emu.controller.losses and "restart_s" in emu.controller.losses[0], 60)
    sent, got = last_json(send), last_json(recv)
    after, elapsed = flows(emu), time.monotonic() - t0
    assert all(row["oop"]["wrong"] == 0 for row in res["rows"])       # every element checked at every rank
    [loss] = emu.controller.losses
    assert loss["action"] == "restart" and loss["code"] == -9
    [kill] = res["failover"]
    assert kill["event"] == "controller_kill controller" and kill["exactly_once"]     # every byte, once
    print(f"controller killed under load and restarted in {loss['restart_s']:.1f} s: UDP stream {src}->{dst} "
          f"{sent['sent']} sent, {got['packets']} received, {sent['sent'] - got['packets']} lost; collective: "
          f"{kill['packets_lost']} packets re-sent, {kill['flows_hurt']} of {kill['flows']} flows with a loss "
          f"window (max {kill['loss_window_ms_max']:.1f} ms), every byte exactly once")
    assert got["packets"] == sent["sent"] > 0
    assert not_re_added(before, after, elapsed) == []


def ovsdb_fail_mode(bridge: str) -> str:
    return subprocess.run(["ovs-vsctl", "get-fail-mode", bridge], capture_output=True, text=True,
                          timeout=5).stdout.strip()


def ofctl_match(match: tuple) -> str:
    fields = dict(match)
    assert set(fields) == {"eth_type", "ipv4_dst"} and fields["eth_type"] == compiler.ETH_IPV4
    net, mask = fields["ipv4_dst"] if isinstance(fields["ipv4_dst"], tuple) else (fields["ipv4_dst"], compiler.FULL)
    from hpnlab.fabric.scenario.addressing import ip_str
    return f"ip,nw_dst={ip_str(net)}/{ip_str(mask)}"


def test_a_dry_run_names_the_one_flow_deleted_by_hand_and_changes_nothing(emu):
    emu.controller.on_loss = "continue"
    try:
        emu.controller.kill()
        assert wait_for(lambda: not any(emu.connected_switches().values()), 20.0)
        table = reconcile.switch_table(compiler.compile_fabric(emu.graph)["p0l1"])
        key = next(k for k in sorted(table, key=repr) if not reconcile.is_group(k) and k[0] == compiler.TABLE_ROUTE
                   and dict(k[2]).keys() == {"eth_type", "ipv4_dst"})
        what = f"table={key[0]},priority={key[1]},{ofctl_match(key[2])}"
        ofctl("--strict", "del-flows", "p0l1", what, check=True)
        before = flows(emu)
        cmd = [sys.executable, "-m", "hpnlab.controller", str(emu._st.run_dir / "scenario.yaml"), "--ofp-port",
               str(emu.controller.ofp_port), "--telemetry-interval-ms", "0", "--dry-run", "--json",
               "--dry-run-timeout", "20"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-500:]
        rep = json.loads(out.stdout)
        changed = {sw: {c: r[c] for c in ("add", "modify", "delete") if r[c]} for sw, r in rep["switches"].items()
                   if r["add"] or r["modify"] or r["delete"]}
        assert rep["missing"] == [] and list(changed) == ["p0l1"] and list(changed["p0l1"]) == ["add"]
        [line] = changed["p0l1"]["add"]
        assert line.startswith(f"table={key[0]},priority={key[1]},")
        assert not_re_added(before, flows(emu), 0.0) == []          # the dry run changed nothing
        t0 = time.monotonic()
    finally:
        emu.controller.on_loss = "restart"
        emu.controller.restart()
    assert wait_for(lambda: len(flows(emu)) == len(before) + 1, 20.0)
    after = flows(emu)
    [(sw, _flow)] = set(after) - set(before)        # the restarted controller put back that flow only
    assert sw == "p0l1"
    assert not_re_added(before, {k: v for k, v in after.items() if k in before}, time.monotonic() - t0) == []


def test_a_host_whose_arp_entries_are_flushed_while_the_controller_is_down_still_reaches_its_peers(emu):
    emu.controller.on_loss = "continue"
    try:
        emu.controller.kill()
        assert wait_for(lambda: not any(emu.connected_switches().values()), 20.0)
        h1 = emu.host("h1")
        h1.cmd("ip neigh flush all")
        assert "lladdr" not in h1.cmd("ip neigh show")
        pairs = [p for p in emu.all_pairs() if p[0] == "h1"]
        assert {emu.graph.nodes[n]["plane"] for n in emu.graph.adj["h1"]} == {0, 1} and len(pairs) > 2
        assert emu.ping_all(pairs)["failed"] == []
        learned = h1.cmd("ip neigh show")
        for _src, _sip, _dst, dip in pairs:      # every peer resolved to the gateway MAC, by its leaf
            assert re.search(rf"^{re.escape(dip)} .*lladdr {compiler.GATEWAY_MAC}", learned, re.M), (dip, learned)
    finally:
        emu.controller.on_loss = "restart"
        emu.controller.restart()


def test_a_run_asked_to_stop_is_interrupted_with_one_line_when_its_controller_is_killed(emu):
    from hpnlab.fabric.emulation import ControllerLost
    emu.controller.on_loss = "stop"
    try:
        with pytest.raises(ControllerLost, match=r"exited with code -9: stopping the run \(--on-controller-loss stop"):
            emu.controller.kill()
            time.sleep(30)          # the watch interrupts the run's main thread long before this ends
        assert [loss["action"] for loss in emu.controller.losses][-1] == "stop"
    finally:
        emu.controller.on_loss = "restart"
        emu.controller.restart()
