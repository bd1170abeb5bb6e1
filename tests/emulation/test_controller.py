"""The controller on a live fabric: mini-hpn on real Open vSwitch, Mininet hosts, and the
controller as a real process over TCP (started by hpnlab.fabric.emulation with `python -m hpnlab.controller`).

The emulated network is conftest's shared mini-hpn (shaped, with the ECN stage; other modules use it
too): tests that break something repair it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
from support.emulated import flow_lines, ofctl
from support.wait import wait_for

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

METRICS_PORT = 9377   # the shared mini_hpn's (conftest)


def installed_counts(emu) -> dict[str, int]:
    return {sw: len(flow_lines(sw)) for sw in fgraph.switches(emu.graph)}


def installed_groups(emu) -> dict[str, int]:
    return {sw: sum("group_id=" in line for line in ofctl("dump-groups", sw).splitlines())
            for sw in fgraph.switches(emu.graph)}


def expected_groups(emu) -> dict[str, int]:
    states = compiler.compile_fabric(emu.graph, None, "aggregate")
    return {sw: len(states[sw].groups) for sw in fgraph.switches(emu.graph)}


def expected_counts(emu, failures=None) -> dict[str, int | None]:
    states = compiler.compile_fabric(emu.graph, failures, "aggregate")
    return {sw: states[sw].flow_count if sw in states else None for sw in fgraph.switches(emu.graph)}


def metrics() -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("hpnlab_"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def run_script(emu, host: str, script: str, python: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="hpnlab-ctl-test-", delete=False) as f:
        f.write(script)
    try:
        return emu.host(host).cmd(f"{python} {f.name}; echo sent $?")
    finally:
        os.unlink(f.name)


def controller_log(emu) -> str:
    with open(emu.metadata["controller_log"], errors="replace") as f:
        return f.read()


@pytest.fixture(scope="module")
def emu(mini_hpn):
    """The shared mini-hpn (conftest), its controller serving metrics on METRICS_PORT."""
    args = list(mini_hpn.options.controller.extra_args)
    assert args[args.index("--metrics-port") + 1] == str(METRICS_PORT)
    assert wait_for(lambda: all(mini_hpn.connected_switches().values()), 30)
    return mini_hpn


def test_every_pair_on_every_plane_pings(emu):
    result = emu.ping_all()
    assert result["pairs"] == 16 * 15 * 2
    assert result["failed"] == []


def test_installed_flow_and_group_counts_equal_the_compilers(emu):
    expected = expected_counts(emu)
    assert wait_for(lambda: installed_counts(emu) == expected), (installed_counts(emu), expected)
    groups = expected_groups(emu)
    assert any(groups.values()) and installed_groups(emu) == groups
    # the reconciler's gauges follow within a tick (the controller brings them up to date once a second)
    assert wait_for(lambda: (m := metrics())["hpnlab_switches_connected"] == 12
                    and m['hpnlab_switch_flows{switch="p0l0"}'] == expected["p0l0"]), metrics()


def test_a_link_taken_down_keeps_every_pair_reachable_and_repair_restores_the_tables(emu):
    failures = compiler.Failures.of([("p0l0", "p0s0", 0)])
    recompiles = metrics()["hpnlab_recompiles_total"]
    emu.faults.link_down("p0l0", "p0s0")
    try:
        expected = expected_counts(emu, failures)
        assert wait_for(lambda: installed_counts(emu) == expected), (installed_counts(emu), expected)
        assert wait_for(lambda: (m := metrics())["hpnlab_deaggregated_routes"] == 3
                        and m["hpnlab_recompiles_total"] > recompiles), metrics()
        # the specific route for p0l0's prefix is on the other leaves of the plane
        assert any("nw_dst=10.0.0.0/29" in line for line in flow_lines("p0l1"))
        result = emu.ping_all()
        assert result["failed"] == []
    finally:
        emu.faults.link_up("p0l0", "p0s0")
    expected = expected_counts(emu)
    assert wait_for(lambda: installed_counts(emu) == expected), (installed_counts(emu), expected)
    assert wait_for(lambda: metrics()["hpnlab_deaggregated_routes"] == 0), metrics()


def test_a_failed_spine_is_routed_around_on_its_plane(emu):
    """Every link of p1s0 goes down (as when the switch dies): plane 1 keeps every pair."""
    emu.faults.switch_down("p1s0")
    try:
        links = [(u, v, k) for u, v, k in emu.graph.edges("p1s0", keys=True)]
        expected = expected_counts(emu, compiler.Failures.of(links))
        assert wait_for(lambda: installed_counts(emu) == expected), (installed_counts(emu), expected)
        assert emu.ping_all()["failed"] == []
    finally:
        emu.faults.switch_up("p1s0")
    expected = expected_counts(emu)
    assert wait_for(lambda: installed_counts(emu) == expected), (installed_counts(emu), expected)


def test_a_restarted_switch_gets_its_state_back_and_nothing_is_duplicated(emu):
    """p0s1 loses its controller and its flows (as a restarted switch would); while it is
    away the fabric routes around it; on reconnect it is reinstalled exactly."""
    target = subprocess.run(["ovs-vsctl", "get-controller", "p0s1"], capture_output=True, text=True).stdout.split()
    assert target, "p0s1 has no controller configured"
    subprocess.run(["ovs-vsctl", "del-controller", "p0s1"], check=True)
    try:
        subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "del-flows", "p0s1"], check=True)
        away = compiler.Failures(switches=frozenset(["p0s1"]))
        expected = expected_counts(emu, away)
        expected["p0s1"] = 0
        assert wait_for(lambda: installed_counts(emu) == expected), (installed_counts(emu), expected)
        assert emu.ping_all()["failed"] == []
    finally:
        subprocess.run(["ovs-vsctl", "set-controller", "p0s1", *target], check=True)
    expected = expected_counts(emu)
    assert wait_for(lambda: installed_counts(emu) == expected, 30), (installed_counts(emu), expected)
    lines = flow_lines("p0s1")
    keys = [re.sub(r"duration=[^,]+, |n_packets=\d+, |n_bytes=\d+, ", "", line) for line in lines]
    assert len(set(keys)) == len(keys)
    assert emu.ping_all()["failed"] == []


def test_udp_flows_differing_only_in_source_port_spread_evenly_over_the_uplinks(emu):
    """512 UDP flows h1 -> h16 on plane 0, source ports 49152..49663, one packet each:
    the two uplinks of p0l0 each carry 50% +- 5% of them (counted from port statistics)."""
    src, dst = "h1", "h16"
    src_ip, dst_ip = emu.ip(src, plane=0), emu.ip(dst, plane=0)
    emu.host(src).cmd(f"ping -c1 -W2 {dst_ip}")      # resolve ARP first (through the controller)
    uplinks = [p for p, _, _ in compiler.index_of(emu.graph).sw["p0l0"].up]

    def tx(port):
        out = ofctl("dump-ports", "p0l0", str(port))
        found = re.search(r"tx pkts=(\d+)", out)
        assert found, out
        return int(found.group(1))

    before = {p: tx(p) for p in uplinks}
    script = ("import socket, time\n"
              "for sport in range(49152, 49664):\n"
              "    time.sleep(0.002)   # paced: a burst of new flows overruns the userspace datapath\n"
              "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
              f"    s.bind(('{src_ip}', sport))\n"
              f"    s.sendto(b'x' * 64, ('{dst_ip}', 4791))\n"
              "    s.close()\n")
    out = run_script(emu, src, script, "/usr/bin/python3")
    assert "sent 0" in out, out
    time.sleep(1.0)
    sent = {p: tx(p) - before[p] for p in uplinks}
    total = sum(sent.values())
    assert total >= 0.98 * 512, sent
    for p in uplinks:
        assert 0.45 <= sent[p] / total <= 0.55, sent


def test_malformed_and_unexpected_packet_ins_are_ignored_and_the_app_keeps_serving(emu):
    h1 = emu.host("h1")
    intf = emu.interfaces("h1")[0]["name"]
    script = (
        "from scapy.all import Ether, ARP, Raw, sendp\n"
        "import logging; logging.getLogger('scapy').setLevel(logging.ERROR)\n"
        f"i = '{intf}'\n"
        "pk = [Ether(dst='ff:ff:ff:ff:ff:ff', type=0x0806) / Raw(b'\\x00\\x01\\x08'),\n"           # truncated ARP
        "      Ether(dst='ff:ff:ff:ff:ff:ff', type=0x0806) / Raw(bytes(range(256)) * 2),\n"        # garbage
        "      Ether(dst='ff:ff:ff:ff:ff:ff') / ARP(op=2, psrc='10.0.0.1', pdst='10.0.0.9'),\n"    # reply
        "      Ether(dst='ff:ff:ff:ff:ff:ff') / ARP(op=1, pdst='10.0.0.250'),\n"                   # no such host
        "      Ether(dst='ff:ff:ff:ff:ff:ff') / ARP(op=1, pdst='10.1.0.9'),\n"                     # other plane
        "      Ether(dst='ff:ff:ff:ff:ff:ff') / ARP(op=1, hwtype=99, plen=2, pdst='10.0.0.9'),\n"  # odd sizes
        "      Ether(dst='ff:ff:ff:ff:ff:ff') / ARP(op=7, pdst='10.0.0.9')]\n"                     # unknown op
        "sendp(pk * 5, iface=i, verbose=False)\n"
        "print('crafted', len(pk) * 5)\n")
    out = run_script(emu, "h1", script, sys.executable)   # the venv has scapy
    assert "crafted 35" in out, out
    time.sleep(1.0)
    assert emu.controller.proc.poll() is None, "the controller died"
    m = metrics()
    ignored = sum(v for k, v in m.items() if k.startswith("hpnlab_packet_ins_total{")
                  and 'outcome="arp-reply"' not in k)
    assert ignored >= 20, m
    # still serving: a fresh ARP is answered and traffic flows
    h1.cmd(f"ip neigh flush dev {intf}")
    assert " 0% packet loss" in h1.cmd(f"ping -c2 -W2 {emu.ip('h9', plane=0)}")


def test_a_switch_of_unknown_dpid_is_logged_and_ignored(emu):
    bridge = "hpnxunk9"
    subprocess.run(["ovs-vsctl", "--may-exist", "add-br", bridge, "--", "set", "bridge", bridge,
                    "datapath_type=netdev", "protocols=OpenFlow13", "other-config:datapath-id=00000000deadbeef",
                    "fail-mode=secure"], check=True)
    try:
        subprocess.run(["ovs-vsctl", "set-controller", bridge, f"tcp:127.0.0.1:{emu.controller.ofp_port}"], check=True)
        assert wait_for(lambda: "00000000deadbeef" in controller_log(emu), 20), controller_log(emu)[-2000:]
        assert "unknown datapath id 00000000deadbeef" in controller_log(emu)
        assert flow_lines(bridge) == []
        assert metrics()["hpnlab_unknown_switch_connects_total"] >= 1
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", bridge], check=True)
    assert emu.controller.proc.poll() is None
    assert emu.ping_all()["failed"] == []
