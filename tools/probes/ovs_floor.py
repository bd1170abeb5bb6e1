#!/usr/bin/env python3
"""The floor of Open vSwitch's own fast failover on this machine, without hpnlab (root).

The failover probe (``hpnlab emulate --failover-probe``) measures the loss window through a
whole emulated fabric, its controller, shaping and ECN stage. This tool asks what is left
when all of that is taken away: two bridges of their own, joined by two parallel veth
links, an OpenFlow 1.3 fast-failover group on the first bridge (bucket 1 watches link 1,
bucket 2 link 2), static flows, no controller, no qdisc unless ``--shape`` asks for htb, no
BFD. One paced UDP sender in a namespace of its own sends through them to a receiver in
another (the probe's own ``udp flows`` / ``udp flowrecv``); after a second link 1 is taken
down (``--kinds``: ``both`` ends, ``near`` the group's own port, ``far`` the peer's, which
loses the group's port its carrier), and a second later brought up again. The loss window
at the receiver comes from :mod:`hpnlab.fabric.emulation.losswindow`, as the probe's does.

Per repetition it prints the loss window, packets lost, when the last affected flow
delivered again, and how long the netlink call that took the link down took (the kernel's
own teardown of a veth: its queue stops at the call's start, its link notification, which is
what Open vSwitch waits for, goes out at its end). ``--idle-links 0,30`` compares port counts
in one run: every round builds the bridges anew for each count, in a rotating order, and runs
each kind once (rotating too). The summary gives, per count, the loss window's median
[min-max] over the kinds, how many repetitions were at or below 5 ms, and the ratio of its
median to the smallest count's, beside the load average.

Everything it makes is named after its own pid (bridges ``hff<pid>a``/``b``, interfaces
``hf<pid>..``, namespaces ``hpnlab-floor-<pid>-s``/``-r``) and removed on exit, signals
included; it kills only the processes it started, by pid. Run it on its own: any other link
event on the machine (an emulation coming up, say) reaches Open vSwitch too.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KINDS = ("both", "near", "far")
SRC, DST, PORT = "10.254.77.1", "10.254.77.2", 5001


class Fail(Exception):
    """A step that could not be done: one line for the user."""


def names(pid: int) -> dict[str, str]:
    """The names of everything one run makes (pure)."""
    p = f"hf{pid}"
    return {"ns_s": f"hpnlab-floor-{pid}-s", "ns_r": f"hpnlab-floor-{pid}-r",
            "br_a": f"hff{pid}a", "br_b": f"hff{pid}b",
            "h0": p + "h0", "as": p + "as", "a1": p + "a1", "b1": p + "b1", "a2": p + "a2", "b2": p + "b2",
            "br": p + "br", "h1": p + "h1"}


def openflow(n: dict[str, str]) -> dict[str, list[str]]:
    """The group and flows of each bridge (pure; ports: a: as=1 a1=2 a2=3; b: b1=1 b2=2 br=3)."""
    return {n["br_a"]: ["group:group_id=1,type=fast_failover,"
                        "bucket=watch_port:2,actions=output:2,bucket=watch_port:3,actions=output:3",
                        "flow:in_port=1,actions=group:1",
                        "flow:in_port=2,actions=output:1", "flow:in_port=3,actions=output:1"],
            n["br_b"]: ["flow:in_port=1,actions=output:3", "flow:in_port=2,actions=output:3",
                        "flow:in_port=3,actions=output:1"]}


def fault_ends(kind: str, n: dict[str, str]) -> list[str]:
    """The interfaces a kind takes down (pure)."""
    return {"both": [n["a1"], n["b1"]], "near": [n["a1"]], "far": [n["b1"]]}[kind]


def live_ports(ports_desc: str) -> set[str]:
    """The names of the ports ``ovs-ofctl dump-ports-desc`` shows live (pure)."""
    live, name = set(), None
    for line in ports_desc.splitlines():
        head = line.strip().split(":", 1)[0]
        if "(" in head and head.endswith(")"):
            name = head[head.index("(") + 1:-1]
        elif head == "state" and name and "LIVE" in line.split(":", 1)[1].split():
            live.add(name)
    return live


def revalidator_runs(runs: dict[str, list[tuple[float, float, str]]], t0: float,
                     window_s: float = 0.02) -> list[float]:
    """When ovs-vswitchd's revalidator threads began to run, ms after ``t0`` and within
    ``window_s`` of it, from :func:`hpnlab.fabric.emulation.send_trace.on_cpu`'s runs (pure);
    runs less than 1 ms apart are one round."""
    starts = sorted(a for name, spans in runs.items() if name.startswith("revalidator")
                    for a, _b, _st in spans if t0 <= a <= t0 + window_s)
    rounds: list[float] = []
    for a in starts:
        ms = (a - t0) * 1e3
        if not rounds or ms - rounds[-1] >= 1.0:
            rounds.append(round(ms, 2))
    return rounds


def run(cmd: list[str], ns: str | None = None, check: bool = True) -> str:
    if ns:
        cmd = ["ip", "netns", "exec", ns] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and r.returncode:
        said = (r.stderr or r.stdout).strip().splitlines()
        raise Fail(f"{' '.join(cmd)}: {said[-1] if said else f'exit status {r.returncode}'}")
    return r.stdout


class Floor:
    def __init__(self, datapath: str, shape_mbps: float | None, bfd_ms: int | None = None, idle_links: int = 0,
                 idle_veths: int = 0):
        self.n = names(os.getpid())
        self.datapath = datapath
        self.shape = shape_mbps
        self.bfd_ms = bfd_ms
        self.idle = [(f"hf{os.getpid()}x{i}", f"hf{os.getpid()}y{i}") for i in range(idle_links)]
        self.outside = [(f"hf{os.getpid()}u{i}", f"hf{os.getpid()}v{i}") for i in range(idle_veths)]
        self.made: dict[str, list[str]] = {"br": [], "ns": [], "veth": []}
        self.procs: list[subprocess.Popen] = []

    # -- build and remove ------------------------------------------------------------------
    def build(self) -> None:
        n = self.n
        for key in ("ns_s", "ns_r"):
            run(["ip", "netns", "add", n[key]])
            self.made["ns"].append(n[key])
        for a, b in (("h0", "as"), ("a1", "b1"), ("a2", "b2"), ("br", "h1")):
            run(["ip", "link", "add", n[a], "type", "veth", "peer", "name", n[b]])
            self.made["veth"].append(n[a])
        for a in ("as", "a1", "b1", "a2", "b2", "br"):
            Path(f"/proc/sys/net/ipv6/conf/{n[a]}/disable_ipv6").write_text("1")
        for host, ns, ip in (("h0", n["ns_s"], SRC), ("h1", n["ns_r"], DST)):
            run(["ip", "link", "set", n[host], "netns", ns])
            run(["sysctl", "-qw", f"net.ipv6.conf.{n[host]}.disable_ipv6=1"], ns=ns)
            run(["ip", "addr", "add", f"{ip}/24", "dev", n[host]], ns=ns)
            run(["ip", "link", "set", n[host], "up"], ns=ns)
            run(["ip", "link", "set", "lo", "up"], ns=ns)
            run(["ethtool", "-K", n[host], "tx", "off"], ns=ns)   # userspace datapath: no checksum offload
        macs = {h: run(["cat", f"/sys/class/net/{n[h]}/address"], ns=ns).strip()
                for h, ns in (("h0", n["ns_s"]), ("h1", n["ns_r"]))}
        run(["ip", "neigh", "replace", DST, "lladdr", macs["h1"], "dev", n["h0"], "nud", "permanent"], ns=n["ns_s"])
        run(["ip", "neigh", "replace", SRC, "lladdr", macs["h0"], "dev", n["h1"], "nud", "permanent"], ns=n["ns_r"])
        for br, ports in ((n["br_a"], ("as", "a1", "a2")), (n["br_b"], ("b1", "b2", "br"))):
            cmd = ["ovs-vsctl", "--", "add-br", br, "--", "set", "bridge", br, f"datapath_type={self.datapath}",
                   "fail_mode=secure", "protocols=OpenFlow13", "other_config:disable-in-band=true"]
            for i, p in enumerate(ports, 1):
                cmd += ["--", "add-port", br, n[p], "--", "set", "interface", n[p], f"ofport_request={i}"]
            self.made["br"].append(br)
            run(cmd)
        for p in ("as", "a1", "b1", "a2", "b2", "br"):
            run(["ip", "link", "set", n[p], "up"])
            if self.shape and p in ("a1", "b1", "a2", "b2"):
                run(["tc", "qdisc", "replace", "dev", n[p], "root", "handle", "1:", "htb", "default", "1"])
                run(["tc", "class", "replace", "dev", n[p], "parent", "1:", "classid", "1:1", "htb",
                     "rate", f"{self.shape}mbit"])
        for i, (x, y) in enumerate(self.idle):      # idle links between the bridges: ports OVS owns
            run(["ip", "link", "add", x, "type", "veth", "peer", "name", y])
            self.made["veth"].append(x)
            for br, end in ((n["br_a"], x), (n["br_b"], y)):
                Path(f"/proc/sys/net/ipv6/conf/{end}/disable_ipv6").write_text("1")
                run(["ovs-vsctl", "add-port", br, end, "--", "set", "interface", end, f"ofport_request={10 + i}"])
                run(["ip", "link", "set", end, "up"])
        for x, y in self.outside:                    # idle veths that Open vSwitch does not own
            run(["ip", "link", "add", x, "type", "veth", "peer", "name", y])
            self.made["veth"].append(x)
            for end in (x, y):
                Path(f"/proc/sys/net/ipv6/conf/{end}/disable_ipv6").write_text("1")
                run(["ip", "link", "set", end, "up"])
        if self.bfd_ms:
            for p in ("a1", "b1", "a2", "b2"):
                run(["ovs-vsctl", "set", "interface", n[p], "bfd:enable=true", f"bfd:min_rx={self.bfd_ms}",
                     f"bfd:min_tx={self.bfd_ms}"])
        for br, lines in openflow(n).items():
            for line in lines:
                what, spec = line.split(":", 1)
                run(["ovs-ofctl", "-O", "OpenFlow13", "add-group" if what == "group" else "add-flow", br, spec])

    def remove(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for br in self.made["br"]:
            run(["ovs-vsctl", "--if-exists", "del-br", br], check=False)
        for v in self.made["veth"]:
            if Path(f"/sys/class/net/{v}").exists():
                run(["ip", "link", "del", v], check=False)
        for ns in self.made["ns"]:
            run(["ip", "netns", "del", ns], check=False)

    def wait_live(self, timeout_s: float = 5.0) -> None:
        """Until both links' ports of the first bridge are live again (the group's first bucket
        is link 1's only then)."""
        want = {self.n["a1"], self.n["a2"]}
        end = time.monotonic() + timeout_s
        while not want <= live_ports(run(["ovs-ofctl", "-O", "OpenFlow13", "dump-ports-desc", self.n["br_a"]])):
            if time.monotonic() > end:
                raise Fail(f"the links' ports of {self.n['br_a']} were not live {timeout_s:g} s after the repair")
            time.sleep(0.05)

    # -- one repetition --------------------------------------------------------------------
    def repetition(self, kind: str, flows: int, pps: float, hold: float, ipr: Any, tmp: Path,
                   trace: bool = False) -> dict:
        from numpy import load

        from hpnlab.fabric.emulation import losswindow, send_trace
        n = self.n
        py = sys.executable
        seconds = 1.0 + hold + 1.0
        out = tmp / f"{kind}-{time.monotonic_ns()}.npz"
        self.wait_live()
        sched = send_trace.Scheduling(f"floor-{os.getpid()}").begin() if trace else None
        rx = subprocess.Popen(["ip", "netns", "exec", n["ns_r"], py, "-m", "hpnlab.fabric.emulation.udp",
                               "flowrecv", DST, str(PORT), "--seconds", str(seconds + 1.0), "--out", str(out)],
                              stdout=subprocess.PIPE, text=True)
        self.procs.append(rx)
        assert rx.stdout is not None
        if rx.stdout.readline().strip() != "listening":
            raise Fail("the receiver did not start")
        tx = subprocess.Popen(["ip", "netns", "exec", n["ns_s"], py, "-m", "hpnlab.fabric.emulation.udp", "flows",
                               DST, str(PORT), "--flows", str(flows), "--pps", str(pps), "--seconds", str(seconds),
                               "--src", SRC], stdout=subprocess.PIPE, text=True)
        self.procs.append(tx)
        time.sleep(1.0)
        idx = [socket.if_nametoindex(i) for i in fault_ends(kind, n)]
        t0 = time.time()
        try:
            for i in idx:
                ipr.link("set", index=i, state="down")
            applied = time.time()
            time.sleep(min(hold, 0.1) if sched is not None else hold)
        finally:
            if sched is not None:
                sched.end()
        if sched is not None:
            time.sleep(max(0.0, hold - 0.1))
        t1 = time.time()
        for i in idx:
            ipr.link("set", index=i, state="up")
        sent = json.loads(tx.communicate(timeout=seconds + 30)[0].strip().splitlines()[-1])
        rx.communicate(timeout=seconds + 30)
        arrivals = dict(load(out))
        res = losswindow.analyse(arrivals, [{"wall": t0, "action": "link_down"}, {"wall": t1, "action": "link_up"}],
                                 sent_per_flow=sent["per_flow"])
        down, up = res["events"]
        return {"kind": kind, "fault_wall": t0, "loss_window_ms": down["loss_window_ms"], "lost": down["lost"],
                "affected": len(down["affected"]), "delivering_again_ms": down["delivering_again_ms"],
                "fault_in_place_ms": round((applied - t0) * 1e3, 2), "repair_loss_window_ms": up["loss_window_ms"],
                "repair_lost": up["lost"],
                "sent": res.get("sent"), "received": res.get("received"), "open": down["open"],
                **({} if sched is None else {"revalidator_runs_ms": revalidator_runs(sched.runs(), t0),
                                             "trace": sched.reason or "taken"})}


def ovs_nice() -> int | None:
    from hpnlab.fabric.emulation.send_trace import running_ovs_pid
    pid = running_ovs_pid()
    try:
        return None if pid is None else os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/probes/ovs_floor.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="both,near,far", help="comma list of both, near, far")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--flows", type=int, default=4)
    ap.add_argument("--pps", type=float, default=4000.0, help="packets/s, all flows together")
    ap.add_argument("--hold", type=float, default=1.0, help="seconds between failure and repair")
    ap.add_argument("--datapath", choices=("netdev", "system"), default="netdev",
                    help="netdev: the userspace datapath (default); system: the kernel module's")
    ap.add_argument("--shape", type=float, metavar="MBPS", help="htb at this rate on the links' four ports")
    ap.add_argument("--bfd", type=int, metavar="MS", help="BFD on the links' four ports at this interval")
    ap.add_argument("--idle-links", default="0", metavar="N[,N...]",
                    help="N more veth links between the bridges that carry nothing (mini-hpn's switches own 64 "
                         "ports); several counts are interleaved, the bridges built anew for each in every round")
    ap.add_argument("--idle-veths", type=int, default=0, metavar="N",
                    help="N veth pairs in the root namespace that Open vSwitch does not own")
    ap.add_argument("--trace-revalidator", action="store_true",
                    help="trace when ovs-vswitchd's revalidator threads ran after each fault (sched_switch in "
                         "an ftrace instance of this run's own, 100 ms from the fault)")
    ap.add_argument("--json", type=Path, help="write the repetitions and the summary here")
    a = ap.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        ap.error(f"--kinds: {', '.join(bad) or 'empty'}: not one of {', '.join(KINDS)}")
    try:
        counts = sorted({int(c) for c in a.idle_links.split(",") if c.strip()})
    except ValueError:
        ap.error(f"--idle-links {a.idle_links}: not a comma list of whole numbers")
    bounds = {"repeat": (1, 100), "flows": (1, 64), "pps": (10, 50000), "hold": (0.1, 10), "idle_veths": (0, 200),
              "bfd": (1, 10000), "shape": (0.1, 10000)}
    checked = [(key, getattr(a, key), lo, hi) for key, (lo, hi) in bounds.items()]
    checked += [("idle_links", c, 0, 200) for c in counts] + [("idle_links", len(counts), 1, 8)]
    for key, v, lo, hi in checked:
        if v is not None and not lo <= v <= hi:
            ap.error(f"--{key.replace('_', '-')} {v:g}: not between {lo:g} and {hi:g}"
                     + (" (counts given)" if key == "idle_links" and v == len(counts) else ""))
    if os.geteuid():
        print("ovs_floor: needs root (namespaces, veths, Open vSwitch bridges)", file=sys.stderr)
        return 2
    if a.datapath == "system" and not Path("/sys/module/openvswitch").exists():
        print("ovs_floor: --datapath system needs the openvswitch kernel module, which is not loaded here",
              file=sys.stderr)
        return 2
    if subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode:
        print("ovs_floor: Open vSwitch is not running (make install starts it)", file=sys.stderr)
        return 2
    from pyroute2 import IPRoute

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    reps: list[dict] = []
    loads = [os.getloadavg()[0]]
    floor: Floor | None = None
    try:
        with IPRoute() as ipr, tempfile.TemporaryDirectory(prefix="hpnlab-floor-") as tmp:
            for r in range(a.repeat):
                for n in counts[r % len(counts):] + counts[:r % len(counts)]:
                    floor = Floor(a.datapath, a.shape, a.bfd, n, a.idle_veths)
                    floor.build()
                    time.sleep(1.0)
                    for k in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                        rep = floor.repetition(k, a.flows, a.pps, a.hold, ipr, Path(tmp), a.trace_revalidator)
                        rep.update(idle_links=n, ports=6 + 2 * n, load1=os.getloadavg()[0])
                        reps.append(rep)
                        print(f"{6 + 2 * n} ports, {k} #{r}: loss window {rep['loss_window_ms']:.1f} ms, "
                              f"{rep['lost']} lost on {rep['affected']}/{a.flows} flows, delivering again "
                              f"{rep['delivering_again_ms']} ms, fault in place {rep['fault_in_place_ms']} ms, "
                              f"repair {rep['repair_loss_window_ms']:.1f} ms, {rep['received']} of {rep['sent']} "
                              f"received" + (f"; revalidator rounds at {rep['revalidator_runs_ms']} ms"
                                             if "revalidator_runs_ms" in rep else ""), flush=True)
                        time.sleep(0.5)
                    floor.remove()
                    floor = None
    except Fail as e:
        print(f"ovs_floor: {e}", file=sys.stderr)
        return 1
    finally:
        if floor is not None:
            floor.remove()
        loads.append(os.getloadavg()[0])
    summary = summarise(reps, counts, kinds)
    extra = f"BFD {a.bfd} ms" if a.bfd else "no BFD"
    extra += f", {a.idle_veths} veth pairs outside it" if a.idle_veths else ""
    qdisc = f"htb {a.shape:g} Mbit/s" if a.shape else "no qdisc"
    print(f"\nOpen vSwitch alone ({a.datapath} datapath, {qdisc}, no controller, {extra}; {a.flows} flows at "
          f"{a.pps:g} packets/s; ovs-vswitchd nice {ovs_nice()}; load average {min(loads):.1f}-{max(loads):.1f}), "
          f"loss window median [min-max] of {a.repeat} per kind, the kinds pooled, interleaved:")
    for n in counts:
        s = summary[n]
        kinds_line = ", ".join(f"{k} {s['kinds'][k]['median']:.1f}" for k in kinds)
        print(f"  {6 + 2 * n:4d} ports  {s['all']['median']:5.1f} [{s['all']['min']:.1f}-{s['all']['max']:.1f}]  "
              f"{s['at_most_5ms']}/{s['all']['n']} at or below 5 ms  x{s['ratio']:.2f} of {6 + 2 * counts[0]} "
              f"ports'  ({kinds_line}; fault in place {s['fault_in_place']['median']:.1f})")
        if "revalidator" in s:
            rv = s["revalidator"]
            gap = rv["spacing_ms"]
            print(f"        revalidator: {rv['two_rounds_or_more']} of {rv['traced']} repetitions ran two rounds or "
                  f"more in 20 ms" + (f", the first two {gap['median']:.1f} ms [{gap['min']:.1f}-{gap['max']:.1f}] "
                                      f"apart" if gap.get("n") else ""))
    if a.json:
        a.json.write_text(json.dumps({"datapath": a.datapath, "shape_mbps": a.shape, "bfd_ms": a.bfd,
                                      "idle_links": counts, "idle_veths": a.idle_veths, "flows": a.flows,
                                      "pps": a.pps, "ovs_nice": ovs_nice(), "load1": loads, "repetitions": reps,
                                      "summary": summary}, indent=1))
    return 0


def summarise(reps: list[dict], counts: list[int], kinds: list[str]) -> dict[int, dict[str, Any]]:
    """Per idle-link count: the loss window pooled over the kinds and per kind, how many
    repetitions were at or below 5 ms, the fault's own time, and the pooled median's ratio to
    the smallest count's (pure)."""
    from hpnlab.fabric.stats import spread
    out: dict[int, dict[str, Any]] = {}
    for n in counts:
        mine = [r for r in reps if r["idle_links"] == n]
        out[n] = {"ports": 6 + 2 * n, "all": spread(r["loss_window_ms"] for r in mine),
                  "kinds": {k: spread(r["loss_window_ms"] for r in mine if r["kind"] == k) for k in kinds},
                  "fault_in_place": spread(r["fault_in_place_ms"] for r in mine),
                  "at_most_5ms": sum(r["loss_window_ms"] <= 5.0 for r in mine)}
        traced = [r["revalidator_runs_ms"] for r in mine if r.get("revalidator_runs_ms")]
        if traced:
            # a repetition whose flows waited for a second revalidation round, and how far apart the two were
            out[n]["revalidator"] = {"traced": len(traced), "two_rounds_or_more": sum(len(t) > 1 for t in traced),
                                     "spacing_ms": spread(t[1] - t[0] for t in traced if len(t) > 1)}
    base = out[counts[0]]["all"].get("median") if counts else None
    for n in counts:
        med = out[n]["all"].get("median")
        out[n]["ratio"] = med / base if med is not None and base else float("nan")
    return out

if __name__ == "__main__":
    sys.exit(main())
