"""The project's emulation harness on the full kernel: mini-cross-campus with the hpnlab
controller, as a user on a stock Ubuntu/Debian kernel would run it.

What only a full kernel can show: the harness picks the OVS kernel datapath by itself,
the long-haul links carry the scenario's delay through netem, and the ECN stage is RED
with ECN, changed live and counted. The controller checks are the userspace lane's
(every pair on every plane, installed flows equal to the compiler's, a link failure).

The emulation runs with ecn=False and the ECN test puts the harness's own ECN stage
(``EcnStage.for_emulation`` with the mechanism ``hpnlab.fabric.emulation.kernel`` picks) on the running
fabric, so that a fault in the RED path fails that test alone, not the whole module.

Long-haul delay: 20 km is 100 us one way, below what TCG's timing noise lets a ping
resolve, so the module scales delays by DELAY_SCALE (the scenario's own
emulation.delay_scale knob): 2.5 ms one way, 5 ms more round trip across the campuses.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from support.wait import wait_for

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.kernel, pytest.mark.emulation, pytest.mark.controller]

SCENARIO = "mini-cross-campus"
DELAY_SCALE = 25


#: OVS drops a controller connection that leaves its echo unanswered for the inactivity
#: probe (default 5 s); a CPU-starved controller under TCG misses that and every switch
#: flaps. The lane's switches wait this long (ms).
INACTIVITY_PROBE_MS = 60000
#: Under TCG the controller needs 30-60 s just to import os-ken.
READY_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def emu():
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, PortOptions, SupervisionOptions
    from hpnlab.fabric.scenario import spec

    e = Emulation(spec.load(SCENARIO, {"emulation": {"delay_scale": DELAY_SCALE}}), EmulationOptions(
        controller=ControllerOptions(connect_timeout_s=180, ready_timeout_s=READY_TIMEOUT_S,
                                     inactivity_probe_ms=INACTIVITY_PROBE_MS),
        ports=PortOptions(ecn=False), supervision=SupervisionOptions(verify=False, lock_wait_s=300)))
    e.start()
    try:
        print(f"{SCENARIO} up under the full kernel: " + ", ".join(f"{k} {v:.1f}" for k, v in e.timings.items()))
        yield e
    finally:
        e.stop()


def ovs(*args: str) -> str:
    return subprocess.run(["ovs-vsctl", "--timeout=10", *args], capture_output=True, text=True).stdout.strip()


def flow_count(bridge: str) -> int:
    """The controller's routing flows on ``bridge`` (its cookie: not the LLDP rule of discovery)."""
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge, "cookie=0x68706e6c61620000/-1"],
                         capture_output=True, text=True, timeout=30).stdout
    return sum(1 for line in out.splitlines() if "cookie=" in line)


def expected_counts(emu, failures=None) -> dict[str, int]:
    states = compiler.compile_fabric(emu.graph, failures, "aggregate")
    return {sw: states[sw].flow_count for sw in fgraph.switches(emu.graph)}


def diagnosis(emu) -> str:
    """What to look at when pings fail: controller alive, switch connections, its log's tail."""
    alive = emu.controller.proc is not None and emu.controller.proc.poll() is None
    conn = emu.connected_switches()
    status = subprocess.run(["ovs-vsctl", "--timeout=10", "--columns=target,is_connected,status", "list",
                             "Controller"], capture_output=True, text=True).stdout
    try:
        with open(emu.metadata["controller_log"], errors="replace") as f:
            log = f.read()[-3000:]
    except (KeyError, OSError) as exc:
        log = f"(no controller log: {exc})"
    return (f"\ncontroller alive: {alive}; switches connected: {sum(conn.values())}/{len(conn)}\n"
            f"{status[:1500]}\n--- controller log (tail) ---\n{log}")


def ping_all_patiently(emu, patience_s: float = 120.0) -> dict:
    """emu.ping_all(), then again for the pairs that failed, until none fails or ``patience_s``
    has passed (a black hole still fails: its pairs never answer).

    Every first packet of a pair waits for proxy ARP at the controller; all hosts ask at
    once, and under TCG the controller answers a burst of ~100 ARP packet-ins in tens of
    seconds, past ping's wait; on a loaded host that took more than four rounds. The
    harness's own start-up check retries the same way."""
    deadline = time.monotonic() + patience_s
    result = emu.ping_all(timeout_s=5)
    failed, n = result["failed"], 1
    while failed and time.monotonic() < deadline:
        failed = emu.ping_all(pairs=failed, timeout_s=5)["failed"]
        n += 1
    print(f"ping_all: {result['pairs']} pairs, {len(result['failed'])} failed in round 1, "
          f"{len(failed)} after {n} round(s)")
    return {"pairs": result["pairs"], "failed": failed}


def campus_of(emu, host: str) -> int:
    leaf = emu.interfaces(host)[0]["leaf"]
    return emu.graph.nodes[leaf]["campus"]


def min_rtt_ms(emu, src: str, dst_ip: str, count: int = 15) -> float:
    out = emu.host(src).cmd(f"ping -n -c {count} -i 0.2 -W 2 {dst_ip}")
    rtts = [float(x) for x in re.findall(r"time=([\d.]+) ms", out)]
    assert len(rtts) >= count - 2, out + diagnosis(emu)
    return min(rtts)


def test_the_harness_picks_the_kernel_datapath(emu):
    assert emu.metadata["datapath"] == "kernel"
    switches = fgraph.switches(emu.graph)
    for sw in switches:
        assert ovs("get", "bridge", sw, "datapath_type") in ('""', "system"), sw
    dp = subprocess.run(["ovs-dpctl", "show"], capture_output=True, text=True).stdout
    assert "system@ovs-system" in dp
    # every switch port is a port of the kernel datapath
    for p in emu.switch_ports():
        assert f": {p['intf']}" in dp, p["intf"]


def test_every_pair_on_every_plane_pings(emu):
    result = ping_all_patiently(emu)
    assert result["pairs"] == 8 * 7 * 2
    assert result["failed"] == [], diagnosis(emu)


def test_installed_flow_counts_equal_the_compilers(emu):
    expected = expected_counts(emu)
    assert wait_for(lambda: {sw: flow_count(sw) for sw in expected} == expected, 60.0, 0.5), expected


def test_a_link_taken_down_keeps_every_pair_reachable(emu):
    failures = compiler.Failures.of([("p0l0", "p0s0", 0)])
    normal, degraded = expected_counts(emu), expected_counts(emu, failures)
    changed = {sw: n for sw, n in degraded.items() if n != normal[sw]}   # the switches that must react
    assert changed
    emu.faults.link_down("p0l0", "p0s0")
    try:
        assert wait_for(lambda: {sw: flow_count(sw) for sw in changed} == changed, 60.0, 0.5), \
            (changed, diagnosis(emu))
        result = ping_all_patiently(emu)
        assert result["failed"] == [], diagnosis(emu)
    finally:
        emu.faults.link_up("p0l0", "p0s0")
    back = {sw: normal[sw] for sw in changed}
    assert wait_for(lambda: {sw: flow_count(sw) for sw in back} == back, 60.0, 0.5), (back, diagnosis(emu))


def test_long_haul_ports_carry_the_scenarios_delay_in_netem(emu):
    one_way_us = emu.scenario.long_haul.delay_us * DELAY_SCALE
    long_haul = [p for p in emu.switch_ports() if p["kind"] == "long-haul"]
    assert len(long_haul) == 2 * 2          # one link per plane, both ends
    for p in long_haul:
        assert netem_delays_us(p["intf"]) == [pytest.approx(one_way_us, rel=0.01)], p["intf"]
    assert emu.metadata["delay"] == "netem"
    assert "not_emulated" not in emu.metadata


def test_round_trips_across_the_campuses_show_the_long_haul_delay(emu):
    src = "h1"
    same_campus = next(h for h in emu.hosts if h != src and campus_of(emu, h) == campus_of(emu, src)
                       and emu.interfaces(h)[0]["leaf"] != emu.interfaces(src)[0]["leaf"])
    other_campus = next(h for h in emu.hosts if campus_of(emu, h) != campus_of(emu, src))
    expected_ms = 2 * emu.scenario.long_haul.delay_us * DELAY_SCALE / 1000
    for plane in (0, 1):
        local = min_rtt_ms(emu, src, emu.ip(same_campus, plane=plane))
        across = min_rtt_ms(emu, src, emu.ip(other_campus, plane=plane))
        added = across - local
        print(f"plane {plane}: RTT {src}->{other_campus} (other campus) {across:.2f} ms, "
              f"{src}->{same_campus} (same campus, TCG/OVS offset) {local:.2f} ms: long haul adds "
              f"{added:.2f} ms for {expected_ms:.2f} ms configured")
        assert expected_ms * 0.95 <= added <= expected_ms + 3


def incast_marks(emu, stage, port: str, seconds: int = 5) -> int:
    """h1 and h3 each send 4 ECN-capable TCP flows to h2 (plane 0): the leaf's port to h2
    is the bottleneck. Returns the CE marks counted there meanwhile."""
    dst_ip = emu.ip("h2", plane=0)
    before = stage.counters(port)["ce_marked"]
    servers = [emu.popen("h2", ["iperf3", "-s", "-1", "-B", dst_ip, "-p", str(5201 + i)]) for i in range(2)]
    clients = []
    try:
        time.sleep(1.5)
        for i, src in enumerate(("h1", "h3")):
            clients.append(emu.popen(src, ["iperf3", "-c", dst_ip, "-B", emu.ip(src, plane=0),
                                           "-p", str(5201 + i), "-t", str(seconds), "-P", "4"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for c in clients:
            c.wait(timeout=seconds + 60)
    finally:
        for p in clients + servers:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
    return stage.counters(port)["ce_marked"] - before


def netem_delays_us(intf: str) -> list[float]:
    out = subprocess.run(["tc", "qdisc", "show", "dev", intf], capture_output=True, text=True).stdout
    return [float(v) * {"us": 1, "ms": 1e3, "s": 1e6}[u]
            for v, u in re.findall(r"netem .*?delay ([\d.]+)(us|ms|s)\b", out)]


def test_the_ecn_stage_is_red_marks_under_incast_and_takes_thresholds_live(emu):
    from hpnlab.fabric.emulation import kernel
    from hpnlab.fabric.emulation.ecn import EcnStage

    mechanism = kernel.probe(deep=False).ecn_mechanism
    assert mechanism == "red"          # the guest image has no clang/bpftool: sch_red is the stage
    long_haul = {p["intf"]: p["delay_us"] for p in emu.switch_ports() if p["kind"] == "long-haul"}
    stage = EcnStage.for_emulation(emu, mechanism=mechanism)
    try:
        assert stage.mechanism == "red"
        # the ECN stage keeps the long-haul delay
        for intf, delay_us in long_haul.items():
            assert netem_delays_us(intf) == [pytest.approx(delay_us, rel=0.01)], intf
        leaf = emu.interfaces("h2")[0]["leaf"]
        port = next(p["intf"] for p in emu.switch_ports() if p["switch"] == leaf and p["peer"] == "h2")
        defaults = stage.thresholds(port)

        at_defaults = incast_marks(emu, stage, port)
        # Raise Kmin/Kmax live above any queue this load builds: marking stops.
        high = 60000
        stage.set_thresholds(kmin=high, kmax=high, ports=[port])
        shown = subprocess.run(["tc", "qdisc", "show", "dev", port], capture_output=True, text=True).stdout
        assert re.search(r"red .*min (60000b|58\d*Kb|60Kb) max (60000b|58\d*Kb|60Kb)", shown), shown
        assert stage.thresholds(port)["kmin"] == high
        raised = incast_marks(emu, stage, port)
        print(f"incast into {port}: {at_defaults} CE marks with Kmin/Kmax {defaults['kmin']}/{defaults['kmax']} B, "
              f"{raised} with {high}/{high} B set live")
        assert at_defaults > 0
        assert raised * 10 <= at_defaults
    finally:
        stage.close()


def test_red_goes_under_the_data_class_beside_a_control_class_and_changes_live_there():
    """``emulation.control_priority`` on a kernel with sch_red: the ECN stage's RED is the port
    buffer under htb class 1:11, beside the control class 1:10, and a live change reaches it.
    On a veth pair of the test's own (no emulation needed), removed after."""
    from hpnlab.fabric.emulation import shaping
    from hpnlab.fabric.emulation.ecn import EcnPort, EcnStage
    from hpnlab.fabric.workload.ecn import Thresholds

    a, b = f"hpk{os.getpid() % 100000}a", f"hpk{os.getpid() % 100000}b"
    subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
    try:
        subprocess.run(["ip", "link", "set", a, "up"], check=True)
        shape = shaping.Shape(a, 10.0, control_priority=True)
        r = subprocess.run(["tc", "-batch", "-"], input="\n".join(shaping.tc_lines(shape, False, leaf=False)) + "\n",
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        port = EcnPort(a, "s", 1, socket.if_nametoindex(a), 10.0, shape.queue_bytes, shaping.data_class(shape))
        stage = EcnStage("red", {a: port}, None)
        stage._apply_red(port, Thresholds(6000, 24000, 0.2), True, "replace")
        stage.set_thresholds(kmin=30000, kmax=60000, ports=[a])
        shown = subprocess.run(["tc", "qdisc", "show", "dev", a], capture_output=True, text=True).stdout
        assert re.search(r"red 20: parent 1:11 .*min (30000b|29\d*Kb|30Kb) max (60000b|58\d*Kb|60Kb)", shown), shown
        assert re.search(r"pfifo 11: parent 1:10", shown), shown
    finally:
        subprocess.run(["ip", "link", "del", a], capture_output=True)


def test_doctor_reports_the_full_kernel():
    r = subprocess.run([sys.executable, "-m", "hpnlab.cli", "doctor", "--json"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    caps = report["capabilities"]
    assert caps["ovs_kernel_datapath"] and caps["datapath"] == "kernel"
    assert caps["netem"] and caps["red"] and caps["qdiscs"]["htb"]
    assert caps["ecn_mechanism"] in ("red", "bpf")
    status = {f["item"]: f["status"] for f in report["findings"]}
    for item in ("OVS kernel datapath", "qdisc netem", "qdisc red", "ECN marking stage"):
        assert status[item] == "ok", report["findings"]
