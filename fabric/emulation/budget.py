#!/usr/bin/env python3
"""Benchmark: the userspace datapath's ceiling per switch port type, side by side.

Three userspace (netdev) bridges chained by veth pairs (a leaf-spine-leaf path: every packet
crosses three switches), ``--paths`` parallel paths through them (default 4), each on its own
switch ports with a sender namespace at one end and a receiver at the other: a fabric spreads
its packets over many ports, and with 4 KB frames one port's socket buffer, not the switch,
limits a single path (measured: one path lost packets above ~2.2k packets/s of 4 KB frames while
mini-hpn carried 7.3k packets/s of them). For each
port type this OVS and kernel offer (``system`` = AF_PACKET, ``afxdp``, ``afxdp-nonpmd``; AF_XDP
in generic XDP mode) and each frame size (64 B, the scenario MTU's frame, 4 KB frames), iperf3
offers UDP at rising rates for ``--seconds`` each (the ceiling: the most delivered without
loss), ``--repeat`` times, and the run reports, per
repetition and as median and spread: packets/s and Mbit/s delivered through the chain (counted
on the receiver's interface), packets/s offered (a sender-limited figure is marked), the share
of the machine's CPU left idle while the generator runs (what is left for generators) and the
load average before. A port type that cannot carry a frame size (or cannot be added at all)
is reported with the error, not skipped silently.

``--tc-check`` also answers, per port type, whether packets leaving OVS still pass tc egress
on the veth (where the emulation's htb shaping and ECN stage live): a 10 Mbit/s htb on the
spine's egress port, UDP offered at 50 Mbit/s, and the delivered rate and the packets htb saw.

``--save`` writes the result as the machine's measured budget (``hpnlab.fabric.emulation.sizing``:
the size check and the default emulated rates derive from it; ``hpnlab doctor --measure``
runs this with ``--save``). As during an emulation, ovs-vswitchd's main thread runs at nice -20
while it measures (put back after). Needs root, Open vSwitch and iperf3; without them it says so
and exits 0 (nothing to measure). Takes the emulation lock (/run/hpnlab/lock) while it runs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpnlab.fabric.emulation import kernel, ovs_sched, ovsdb, sizing
from hpnlab.fabric.emulation.state import Lock
from hpnlab.fabric.scenario.rates import ETH_HEADER as ETH
from hpnlab.fabric.workload import report

PREFIX = "hbp"                        # every name this benchmark creates starts with it
BRIDGES = ("hbpL", "hbpS", "hbpR")   # leaf, spine, leaf
IP_UDP = 28
FRAME_4K = 4096 + ETH
#: parallel paths through the three bridges, each on its own ports and with its own generator (set by --paths):
#: a fabric spreads its packets over many ports, and one port's socket buffer is not the switch's ceiling
PATHS = [4]


def _sh(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()[:300]}")
    return r


def _ns(i: int) -> tuple[str, str]:
    return f"hbp-s{i}", f"hbp-d{i}"


def _ips(i: int) -> tuple[str, str]:
    return f"10.250.{i}.1", f"10.250.{i}.2"


def _links(i: int = 0) -> list[tuple[str, str]]:
    """(a, b) veth pairs of path i: src-L, L-S, S-R, R-dst."""
    n = f"{PREFIX}{i}"
    return [(f"{n}s0", f"{n}L1"), (f"{n}L2", f"{n}S1"), (f"{n}S2", f"{n}R1"), (f"{n}R2", f"{n}d0")]


def teardown(paths: int = 16) -> None:
    for br in BRIDGES:
        _sh("ovs-vsctl", "--timeout=10", "--if-exists", "del-br", br, check=False)
    present = {p.name for p in Path("/sys/class/net").iterdir()}
    for i in range(paths):
        for a, b in _links(i):    # deleting either end removes the pair; the ends in a namespace go with it
            end = b if a.endswith("s0") else a
            if end in present:
                _sh("ip", "link", "del", end, check=False)
    netns = _sh("ip", "netns", "list", check=False).stdout.split()
    for i in range(paths):
        for ns in _ns(i):
            if ns in netns:
                _sh("ip", "netns", "del", ns, check=False)


def build(port_type: str, mtu: int, run_id: str) -> None:
    """PATHS[0] paths through the chain, every switch port of ``port_type`` at ``mtu``; raises
    RuntimeError with OVS's error."""
    teardown()
    args: list[str] = []
    for br in BRIDGES:
        args += ["--", "add-br", br, "--", "set", "bridge", br, "datapath_type=netdev", "fail_mode=secure",
                 f"external_ids:{ovsdb.OVS_MARK}={run_id}"]
    cols = ovsdb.port_type_args(port_type).split() + ([f"mtu_request={mtu}"] if mtu != 1500 else [])
    flows: dict[str, list[str]] = {br: [] for br in BRIDGES}
    all_ports = []
    for i in range(PATHS[0]):
        links = _links(i)
        for a, b in links:
            _sh("ip", "link", "add", a, "mtu", str(mtu), "type", "veth", "peer", "name", b, "mtu", str(mtu))
        (s0, _), (_, d0) = links[0], links[3]
        for ns, dev, ip in zip(_ns(i), (s0, d0), _ips(i), strict=True):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "set", dev, "netns", ns)
            _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            # UDP through the userspace datapath needs the sender's checksum computed in software
            _sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off", check=False)
        ports = {BRIDGES[0]: (links[0][1], links[1][0]), BRIDGES[1]: (links[1][1], links[2][0]),
                 BRIDGES[2]: (links[2][1], links[3][0])}
        for br, (p1, p2) in ports.items():
            for j, p in enumerate((p1, p2), 2 * i + 1):
                _sh("ip", "link", "set", p, "up")
                Path(f"/proc/sys/net/ipv6/conf/{p}/disable_ipv6").write_text("1")
                args += ["--", "add-port", br, p, "--", "set", "Interface", p, f"ofport_request={j}", *cols]
                all_ports.append(p)
            flows[br] += [f"in_port={2 * i + 1},actions=output:{2 * i + 2}",
                          f"in_port={2 * i + 2},actions=output:{2 * i + 1}"]
    _sh("ovs-vsctl", "--timeout=60", *args, timeout=90)
    for br, fl in flows.items():
        r = subprocess.run(["ovs-ofctl", "add-flows", br, "-"], input="\n".join(fl) + "\n", text=True,
                           capture_output=True)
        if r.returncode != 0:
            raise RuntimeError(f"flows on {br}: {r.stderr.strip()[:200]}")
    time.sleep(1.0)
    errors = [_sh("ovs-vsctl", "get", "Interface", p, "error", check=False).stdout.strip() for p in all_ports]
    bad = [e for e in errors if e and e != "[]"]
    if bad:
        raise RuntimeError(f"OVS refused the {port_type} port: {bad[0]}")
    for i in range(PATHS[0]):
        deadline = time.monotonic() + 10
        while _sh("ip", "netns", "exec", _ns(i)[0], "ping", "-c1", "-W1", _ips(i)[1], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no ping through the {port_type} chain at MTU {mtu}")


def _ns_counter(ns: str, dev: str, what: str) -> int:
    r = _sh("ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev)
    return int(json.loads(r.stdout)[0]["stats64"][what]["packets"])


def blast(frame: int, seconds: float, rate: str = "0") -> dict[str, float]:
    """UDP frames of ``frame`` bytes on every path for ``seconds`` (iperf3 ``-b rate`` per path, 0: as
    fast as it can); delivered and offered packets/s, Mbit/s (all paths), CPU share left idle,
    counted on the namespaces' interfaces."""
    k = PATHS[0]
    ends = [(_ns(i), _links(i)[0][0], _links(i)[3][1]) for i in range(k)]
    srvs = [subprocess.Popen(["ip", "netns", "exec", ns[1], "iperf3", "-s", "-1", "-p", "5299"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for ns, _, _ in ends]
    try:
        time.sleep(0.4)
        tx0 = sum(_ns_counter(ns[0], s0, "tx") for ns, s0, _ in ends)
        rx0 = sum(_ns_counter(ns[1], d0, "rx") for ns, _, d0 in ends)
        c0 = report.cpu_times()
        t0 = time.monotonic()
        clients = [subprocess.Popen(["ip", "netns", "exec", _ns(i)[0], "iperf3", "-c", _ips(i)[1], "-p", "5299", "-u",
                                     "-b", rate, "-l", str(frame - ETH - IP_UDP), "-t", f"{seconds:g}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(k)]
        for c in clients:
            try:
                c.wait(timeout=seconds + 20)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
        time.sleep(0.3)    # in flight
        dt = time.monotonic() - t0 - 0.3
        c1 = report.cpu_times()
        tx = sum(_ns_counter(ns[0], s0, "tx") for ns, s0, _ in ends) - tx0
        rx = sum(_ns_counter(ns[1], d0, "rx") for ns, _, d0 in ends) - rx0
    finally:
        for srv in srvs:
            srv.kill()
            srv.wait()
    idle = 1.0 - report.busy_share(c0, c1)
    return {"pps": rx / dt, "mbps": rx * frame * 8 / dt / 1e6, "offered_pps": tx / dt, "cpu_idle": idle}


def tc_check(port_type: str, run_id: str, seconds: float) -> dict[str, Any]:
    """htb 10 Mbit/s on the spine's egress towards the right leaf: does it see and hold the traffic?"""
    build(port_type, 1500, run_id)
    dev = _links(0)[2][0]
    if PATHS[0] > 1:
        raise RuntimeError("the tc check runs on one path (PATHS[0] = 1)")
    _sh("tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
    _sh("tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", "10mbit", "ceil",
        "10mbit", "burst", "15000", "cburst", "15000")
    r = blast(1514, max(2.0, seconds), f"{50 / PATHS[0]:g}M")
    text = _sh("tc", "-s", "class", "show", "dev", dev).stdout     # " Sent 5105251 bytes 3561 pkt (dropped ..."
    packets = sum(int(line.split()[3]) for line in text.splitlines() if line.strip().startswith("Sent "))
    return {"port_type": port_type, "shaped_mbps": 10.0, "offered_mbps": round(r["offered_pps"] * 1514 * 8 / 1e6, 1),
            "delivered_mbps": round(r["mbps"], 2), "htb_packets": packets,
            "passes_tc_egress": packets > 0 and r["mbps"] < 12.0}


def boost_ovs() -> tuple[int, int, int, int] | None:
    """ovs-vswitchd's main thread at nice -20, as an emulation runs it (``ovs_sched``); returns
    (pid, old policy, old priority, old nice) to put back."""
    try:
        return ovs_sched.apply()[0]
    except (OSError, ValueError):
        return None


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1)}


#: offered packets/s, raised by LADDER_STEP from here until the chain loses more than LOSS_STOP of them
LADDER_START = 1_500
#: seconds per offered rate in the short probe (``--probe``): iperf3 takes whole seconds (its -t 0.5 runs
#: until killed), so a probe is the full measurement's step on one port type, one frame size, once
PROBE_SECONDS = 1
LADDER_STEP = 1.5
#: the ceiling is the most packets/s delivered with at most this share lost
LOSS_OK = 0.02
LOSS_STOP = 0.10


def ceiling(frame: int, seconds: float, start: float = LADDER_START) -> dict[str, float]:
    """The packets/s the chain delivers without loss at this frame size: offered rates rising
    from ``LADDER_START`` until the loss passes ``LOSS_STOP`` or the sender cannot offer more; the
    ceiling is the most delivered at <= ``LOSS_OK`` loss (overload lowers what gets through, so
    'as fast as possible' alone understates it). A ladder started above ``LADDER_START`` that loses
    at its first steps steps down until a rate passes (a repetition never reads 0 because its start,
    half the first repetition's ceiling, was too high for the machine at that moment). CPU idle is
    read at that point."""
    best = {"pps": 0.0, "mbps": 0.0, "offered_pps": 0.0, "cpu_idle": 0.0}
    most = 0.0
    pps = max(LADDER_START, start)
    descending = pps > LADDER_START
    while True:
        r = blast(frame, seconds, str(int(pps / PATHS[0] * (frame - ETH - IP_UDP) * 8)))
        loss = 1 - r["pps"] / max(1.0, r["offered_pps"])
        most = max(most, r["pps"])
        if loss <= LOSS_OK and r["pps"] > best["pps"]:
            best = r
        descending = descending and loss > LOSS_OK and pps > LADDER_START
        if descending:      # a later repetition's start was too high for the machine at that moment: step down
            pps = max(LADDER_START, pps / LADDER_STEP ** 2)
            continue
        if loss > LOSS_STOP or r["offered_pps"] < 0.8 * pps or pps > 400_000:
            break
        pps *= LADDER_STEP
    best = dict(best, sender_limited=float(loss <= LOSS_STOP), most_pps=most)
    return best


def measure(port_types: list[str], frames: list[int], repeat: int, seconds: float, run_id: str,
            say: Callable[[str], None]) -> dict[str, Any]:
    """Per port type, per frame size: the ceiling at each repetition (``hpnlab.fabric.emulation.sizing`` reads it)."""
    out: dict[str, Any] = {}
    for pt in port_types:
        out[pt] = {"frames": {}}
        for frame in frames:
            mtu = max(1500, frame - ETH)
            try:
                build(pt, mtu, run_id)
                reps = [ceiling(frame, seconds)]
                while len(reps) < repeat:      # later repetitions start the ladder below the first one's ceiling
                    reps.append(ceiling(frame, seconds, 0.5 * reps[0]["pps"]))
                if max(r["most_pps"] for r in reps) < LADDER_START / 2:
                    raise RuntimeError(f"{frame} B frames do not get through (at most "
                                       f"{max(r['most_pps'] for r in reps):.0f} packets/s delivered)")
            except RuntimeError as exc:
                out[pt]["frames"][str(frame)] = {"error": str(exc)}
                say(f"  {pt:<13} {frame:>5} B  cannot: {exc}")
                continue
            keys = ("pps", "mbps", "offered_pps", "cpu_idle", "most_pps")
            row: dict[str, Any] = {k: [round(r[k], 3) for r in reps] for k in keys}
            row["sender_limited"] = any(r["sender_limited"] for r in reps)
            out[pt]["frames"][str(frame)] = row
            p, m, i = summary(row["pps"]), summary(row["mbps"]), summary(row["cpu_idle"])
            say(f"  {pt:<13} {frame:>5} B  {p['median']:>9,.0f} pkt/s [{p['min']:,.0f}-{p['max']:,.0f}]  "
                f"{m['median']:>7,.1f} Mbit/s  (most delivered {statistics.median(row['most_pps']):,.0f} pkt/s)"
                f"{' sender-limited' if row['sender_limited'] else ''}  CPU idle {100 * i['median']:.0f}%")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mtu", type=int, default=1500, help="the scenario MTU (default 1500)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=1, help="per offered rate, whole seconds as iperf3 takes them "
                                                           "(default 1)")
    ap.add_argument("--paths", type=int, default=PATHS[0],
                    help=f"parallel paths through the chain, each with its own ports and generator "
                         f"(default {PATHS[0]})")
    ap.add_argument("--port-types", default="", help="comma list (default: every type available here)")
    ap.add_argument("--tc-check", action="store_true", help="also check whether tc egress sees AF_XDP's packets")
    ap.add_argument("--save", action="store_true", help="write the result as this machine's measured budget")
    ap.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    ap.add_argument("--probe", action="store_true",
                    help="the short probe a first demo runs (about 20 s): the system port type, 4 KB frames, one "
                         "repetition; the budget it saves says so (sizing.PROBE_SHARE)")
    args = ap.parse_args(argv)
    if args.seconds < 1:
        ap.error(f"--seconds must be at least 1, got {args.seconds}")
    if args.probe:
        args.port_types, args.repeat, args.seconds, args.tc_check = "system", 1, PROBE_SECONDS, False
    say = lambda m: print(m, flush=True)  # noqa: E731
    if os.geteuid() != 0 or not shutil.which("ovs-vsctl") or not shutil.which("iperf3"):
        say("bench_ports: needs root, Open vSwitch and iperf3; nothing measured")
        return 0
    caps = kernel.probe(deep=False)
    if not caps.ovs_running:
        say("bench_ports: Open vSwitch is not running; nothing measured")
        return 0
    available = ["system", *caps.afxdp_types]
    wanted = [t for t in args.port_types.split(",") if t] or available
    frames = [FRAME_4K] if args.probe else sorted({64, args.mtu + ETH, FRAME_4K})


    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # unwind (teardown) on SIGTERM too
    lock = Lock()
    lock.acquire("bench_ports", wait_s=600)
    old_sched = boost_ovs()
    run_id = f"bench-ports-{os.getpid()}"
    load = os.getloadavg()
    say(f"bench_ports: leaf-spine-leaf chain (3 userspace bridges, {args.paths} parallel paths), {caps.cpus} cores, "
        f"load average "
        f"{load[0]:.2f} {load[1]:.2f}; port types {', '.join(wanted)} (available: {', '.join(available)})")
    try:
        PATHS[0] = max(1, args.paths)
        ports = measure(wanted, frames, args.repeat, args.seconds, run_id, say)
        PATHS[0] = 1
        checks = [tc_check(pt, run_id, args.seconds) for pt in wanted] if args.tc_check else []
    finally:
        teardown()
        if old_sched is not None:
            try:
                ovs_sched.restore(*old_sched)
            except OSError:
                pass
        lock.release()
    for c in checks:
        say(f"  tc egress with {c['port_type']:<13}: htb saw {c['htb_packets']} packets, "
            f"{c['delivered_mbps']} Mbit/s delivered through a {c['shaped_mbps']:g} Mbit/s shaper "
            f"({'passes' if c['passes_tc_egress'] else 'BYPASSED'})")
    doc = sizing.budget_document(ports, hops=len(BRIDGES), cpus=caps.cpus, load=list(load),
                                 tc_egress={c["port_type"]: c["passes_tc_egress"] for c in checks} or None,
                                 repeat=args.repeat, seconds=args.seconds, paths=max(1, args.paths),
                                 probe=args.probe,
                                 load_after=[round(v, 2) for v in os.getloadavg()])
    for pt in wanted:
        b = sizing.pps_at(doc, pt, args.mtu + ETH)
        if b:
            say(f"  budget {pt:<13}: {b:,.0f} packets/s through the chain at the scenario MTU {args.mtu}")
    busy = sizing.busy_warning(list(load), doc.get("load_after") or [], caps.cpus)
    if busy:
        say(f"  note: {busy}")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.save:
        path = sizing.save_budget(doc)
        say(f"saved as this machine's measured budget: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
