#!/usr/bin/env python3
"""What ovs-vswitchd's main thread asks the kernel between a link failure and its datapath
leaving the dead port (diagnostic, root).

On the userspace datapath the failover probe's stages (``hpnlab emulate --failover-probe``)
show a few milliseconds between a port's PortStatus (its liveness changed) and the last send
into the dead port (the cached flows moved to the backup). This tool says what fills them:
it brings up a scenario, attaches ``strace`` to ovs-vswitchd's main thread (the one that
polls the ports, handles OpenFlow and ovsdb, and forwards for ``system`` ports), runs one
failover probe repetition (controller frozen) and sorts every netlink request the thread
sent from the fault to the end of its burst of them into:

- ``route dump``: the routing table re-read (RTM_GETROUTE dump): OVS 3.1 does this after any
  link notification in its namespace (``lib/route-table.c``);
- ``link dump`` / ``address dump``: every interface's name and addresses (``getifaddrs``);
- ``per-interface link query``: one RTM_GETLINK for one interface (its cached state refreshed);
  how many distinct interfaces, against the switch ports the run has;
- anything else, by message type.

Beside them it prints how much of ovs-vswitchd's own bookkeeping the repetition (the failure
and its repair: two link events) cost, from its coverage counters (``ovs-appctl
coverage/show``): ``bridge_reconfigure`` (bridge.c reconfigures every bridge when its
interface notifier hears of any link change), ``rev_reconfigure`` and ``rev_port_toggled``
(the reasons its flows were revalidated). Open vSwitch 3.1 counts no routing-table re-read:
the route dumps above show them.

strace stops the thread at every system call it traces, so the times printed are stretched
(a repetition under strace can even miss the failover): read the requests and their order,
and take the durations from the probe's own stages. A second repetition runs without strace
and with a scheduler trace of ovs-vswitchd's threads instead (``sched_switch`` in an ftrace
instance of the run's own, :class:`hpnlab.fabric.emulation.send_trace.Scheduling`): its
stages beside when the revalidator threads ran and how busy the main thread was, ms after
the fault.
"""
from __future__ import annotations

import argparse
import codecs
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

RTM = {16: "RTM_NEWLINK", 18: "RTM_GETLINK", 22: "RTM_GETADDR", 26: "RTM_GETROUTE", 30: "RTM_GETNEIGH"}
NLM_F_DUMP = 0x300
IFLA_IFNAME = 3
_LINE = re.compile(r"^(\d+\.\d+) (sendto|sendmsg)\((\d+), (.*)$")
_DECODED = re.compile(r"nlmsg_type=(\w+), nlmsg_flags=([\w|]+)")
_RAW = re.compile(r'iov_base="((?:[^"\\]|\\.)*)"|^"((?:[^"\\]|\\.)*)"')


def _raw_request(text: str) -> tuple[str, bool, str | None] | None:
    """(message type, dump?, interface name) of a netlink request strace printed as bytes."""
    m = _RAW.search(text)
    if not m:
        return None
    data = codecs.escape_decode((m.group(1) or m.group(2)).encode())[0]
    if len(data) < 16:
        return None
    length, mtype, flags = struct.unpack_from("=IHH", data)
    name = None
    off = 16 + 16                       # nlmsghdr + ifinfomsg
    while mtype in (16, 18) and off + 4 <= min(length, len(data)):
        alen, atype = struct.unpack_from("=HH", data, off)
        if alen < 4:
            break
        if atype == IFLA_IFNAME:
            name = data[off + 4:off + alen].split(b"\0")[0].decode(errors="replace")
        off += (alen + 3) & ~3
    return RTM.get(mtype, f"type {mtype}"), bool(flags & NLM_F_DUMP), name


def requests(lines: Iterable[str], t0: float) -> list[dict[str, Any]]:
    """The netlink requests in strace ``-ttt`` output, ms after ``t0`` (pure): each with its
    message type, whether it is a dump, and the interface it names."""
    out = []
    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        t, rest = float(m.group(1)), m.group(4)
        d = _DECODED.search(rest)
        if d:
            req: tuple[str, bool, str | None] | None = (d.group(1), "NLM_F_DUMP" in d.group(2), None)
        else:
            req = _raw_request(rest)
        if req is None:
            continue
        out.append({"ms": round((t - t0) * 1000, 2), "type": req[0], "dump": req[1], "ifname": req[2]})
    return out


def sort(reqs: list[dict[str, Any]], since_ms: float = 0.0) -> dict[str, dict[str, Any]]:
    """Requests from ``since_ms`` on, by kind: count, first and last ms, distinct interfaces."""
    kinds: dict[str, dict[str, Any]] = {}
    for r in reqs:
        if r["ms"] < since_ms:
            continue
        if r["type"] == "RTM_GETROUTE":
            kind = "route dump"
        elif r["dump"] and r["type"] == "RTM_GETLINK":
            kind = "link dump"
        elif r["dump"] and r["type"] == "RTM_GETADDR":
            kind = "address dump"
        elif r["type"] == "RTM_GETLINK" and r["ifname"]:
            kind = "per-interface link query"
        else:
            kind = r["type"] + (" dump" if r["dump"] else "")
        k = kinds.setdefault(kind, {"count": 0, "first_ms": r["ms"], "last_ms": r["ms"], "interfaces": set()})
        k["count"] += 1
        k["last_ms"] = r["ms"]
        if r["ifname"]:
            k["interfaces"].add(r["ifname"])
    return {k: {**v, "interfaces": len(v["interfaces"])} for k, v in kinds.items()}


COUNTERS = ("bridge_reconfigure", "rev_reconfigure", "rev_port_toggled", "rev_flow_table")
_COVERAGE = re.compile(r"^(\w+)\s+.*total: (\d+)\s*$")


def coverage(text: str) -> dict[str, int]:
    """ovs-vswitchd's coverage counters' totals from ``ovs-appctl coverage/show`` (pure); a
    counter never hit is not listed there and reads 0."""
    out = dict.fromkeys(COUNTERS, 0)
    for line in text.splitlines():
        m = _COVERAGE.match(line.strip())
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def _coverage_now() -> dict[str, int]:
    r = subprocess.run(["ovs-appctl", "coverage/show"], capture_output=True, text=True)
    return coverage(r.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", nargs="?", default="mini-hpn")
    p.add_argument("--kind", choices=("both", "one-side"), default="one-side")
    p.add_argument("--port-type", default="system", choices=("system", "afxdp", "afxdp-nonpmd"))
    p.add_argument("--settle", type=float, default=12.0, metavar="S",
                   help="seconds to wait after bring-up, so the reachability check's megaflows expire (default 12)")
    p.add_argument("--window-ms", type=float, default=100.0, metavar="MS",
                   help="requests up to this long after the fault are sorted (default 100)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("ovs_reaction: needs root (emulation and strace)", file=sys.stderr)
        return 2
    if shutil.which("strace") is None:
        print("ovs_reaction: strace is not installed (apt-get install strace)", file=sys.stderr)
        return 2
    from hpnlab.fabric.emulation import failover, send_trace
    from hpnlab.fabric.emulation.harness import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, PortOptions
    from hpnlab.fabric.errors import UserError
    try:
        emu = Emulation(args.scenario, EmulationOptions(ports=PortOptions(port_type=args.port_type)))
        with emu:
            time.sleep(args.settle)
            pid = send_trace.running_ovs_pid()
            if pid is None:
                raise UserError("ovs-vswitchd is not running")
            state = emu._st
            out = state.run_dir / "ovs-reaction.strace"
            st = subprocess.Popen(["strace", "-p", str(pid), "-e", "trace=sendto,sendmsg", "-ttt", "-s", "256",
                                   "-o", str(out)], stderr=subprocess.DEVNULL)
            state.add_pid(st.pid, "strace (ovs_reaction)")
            try:
                time.sleep(0.5)
                probe = failover.Probe(kind=args.kind, flows=4, pps=4000.0, freeze_controller=True)
                before = _coverage_now()
                result = failover.run_once(emu, probe, 0)
                after = _coverage_now()
            finally:
                st.terminate()
                st.wait(timeout=10)
            t0 = result["timeline"][0]["start_wall"]
            reqs = [r for r in requests(out.read_text().splitlines(), t0) if r["ms"] <= args.window_ms]
            ports = len(state.interfaces)
            sched = send_trace.Scheduling(f"{state.run_id}-sched", pid=pid, state=state).begin()
            try:
                second = failover.run_once(emu, probe, 1)
            finally:
                sched.end()
    except UserError as e:
        print(f"ovs_reaction: {e}", file=sys.stderr)
        return 1
    print(f"{args.scenario}, {args.kind} failure of {'-'.join(result['link'])}, controller frozen, port type "
          f"{args.port_type}; the run's switch-side interfaces: {ports}")
    print(f"probe (under strace, times stretched): stages {result['stages']}")
    print("ovs-vswitchd's counters over the repetition (the failure and its repair: 2 link events): "
          + ", ".join(f"{k} +{after.get(k, 0) - before.get(k, 0)}" for k in COUNTERS))
    print(f"netlink requests of ovs-vswitchd's main thread, 0-{args.window_ms:g} ms after the fault:")
    for kind, k in sorted(sort(reqs).items(), key=lambda kv: kv[1]["first_ms"]):
        extra = f", {k['interfaces']} distinct interfaces" if k["interfaces"] else ""
        print(f"  {kind:26s} {k['count']:4d}  from {k['first_ms']:7.2f} to {k['last_ms']:7.2f} ms{extra}")
    if sched.reason is not None:
        print(f"scheduler trace: not taken ({sched.reason})")
        return 0
    t1 = second["timeline"][0]["start_wall"]
    print(f"without strace, scheduler traced: stages {second['stages']}"
          + (f" ({sched.overrun} scheduler events lost: the runs below may be incomplete)" if sched.overrun else ""))
    for name, spans in sorted(sched.runs().items()):
        near = [(round((a - t1) * 1000, 2), round((b - a) * 1000, 2), st) for a, b, st in spans
                if -1 <= (a - t1) * 1000 <= 15]
        busy = sum(min(b, t1 + 0.015) - max(a, t1) for a, b, _ in spans if b > t1 and a < t1 + 0.015)
        if near or busy > 0:
            print(f"  {name:22s} on the CPU {busy * 1000 / 15 * 100:3.0f}% of 0-15 ms; runs (start ms+length ms, "
                  "then left preempted R or asleep S): "
                  + ", ".join(f"{a}+{d}{st}" for a, d, st in near[:60]) + (" ..." if len(near) > 60 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
