"""The failover probe: paced UDP flows through a link failure, the loss window at the receiver.

One repetition: a receiver on one host records every packet (``udp flowrecv``); a host on
another leaf of the same plane sends N paced flows that differ only in source port
(``udp flows``), so they spread over the spines; a timeline fails one leaf-spine link
``fail_at_s`` into the flows and repairs it ``hold_s`` later; ``ovs-ofctl monitor`` on the
link's two switches timestamps the PortStatus messages (the detection time: fault applied
to the switch telling its controllers the port is down or no longer live). The arrivals go
through ``hpnlab.fabric.emulation.losswindow``. Kinds of failure (``KINDS``):

- ``both``: both interfaces down; ``one-side``: only the leaf's (with veth the spine loses
  carrier too); ``gray``: the leaf's egress drops everything, the link stays up (only BFD
  can see it); ``switch``: a whole switch down (``switch``: default the first core of plane 0,
  else its first spine), with the flows sent across it (``switch_endpoints``: from another
  campus to the core's, from the spine's pod to another leaf) and the detection read at the
  neighbour that sends into it; ``tc-idle``: no failure at all, a pass-through tc filter is added to and
  removed from an interface that carries none of the flows (the stall probe: does a tc
  change alone disturb forwarding?); ``link-idle``: no failure either, a veth pair of the
  root namespace that Open vSwitch does not own is set up and down (the other stall
  probe: does a netlink link event alone, which makes ovs-vswitchd re-read the routing table,
  disturb forwarding?); ``none``: nothing happens at the two times (the noise floor: the gaps
  a busy machine makes by itself).

``freeze_controller`` stops the controller (SIGSTOP) from just before the failure until
the capture ends: the loss window then shows what the switches do alone, and gaps on flows
that never crossed the link cannot come from the controller's flow-mods.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from hpnlab.fabric.emulation import losswindow
from hpnlab.fabric.emulation.mn import host_interfaces
from hpnlab.fabric.stats import spread, spread_text

from ..errors import UserError
from . import send_trace
from . import timeline as tl

KINDS = ("both", "one-side", "gray", "switch", "tc-idle", "link-idle", "none")
#: how each kind fails and repairs (timeline actions)
ACTIONS = {"both": ("link_down", "link_up"), "one-side": ("link_down_one_side", "link_up"),
           "gray": ("link_drop", "link_restore"), "switch": ("switch_down", "switch_up")}
#: a pass-through classic BPF program (TC_ACT_OK) for the tc-idle probe
PASS_BYTECODE = "1,6 0 0 0,"
UDP_PORT = 5999


@dataclass(frozen=True)
class Probe:
    kind: str = "both"
    link: tuple[str, str] | None = None     # (leaf, spine); default: the source leaf's first uplink
    switch: str | None = None               # kind "switch": the switch that fails (see switch_endpoints)
    flows: int = 16
    pps: float = 6000.0
    fail_at_s: float = 1.0
    hold_s: float = 1.0
    after_s: float = 1.0
    size: int = 64
    freeze_controller: bool = False
    #: also read when ovs-vswitchd sent its PortStatus, from its own log (vconn at debug level meanwhile)
    stages: bool = True

    def check(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"unknown failure kind {self.kind!r} (known: {', '.join(KINDS)})")
        if self.flows < 1 or self.pps <= 0 or self.fail_at_s <= 0 or self.hold_s <= 0 or self.after_s <= 0:
            raise UserError("failover probe: flows, pps and the times must be positive")


def endpoints(graph, link: tuple[str, str] | None) -> tuple[str, str, str, str, tuple[str, str]]:
    """(src host, src ip, dst host, dst ip, (leaf, spine)) on one plane, on two different leaves:
    the source sits under the link's leaf, so every flow leaves through that leaf's uplinks."""
    leaves = [n for n, d in graph.nodes(data=True) if d["tier"] == 1]
    if link is None:
        leaf = sorted(leaves)[0]
        spine = sorted(n for n in graph.neighbors(leaf) if graph.nodes[n]["tier"] > 1)[0]
        link = (leaf, spine)
    leaf, spine = link
    if leaf not in graph or spine not in graph or not graph.has_edge(leaf, spine):
        raise UserError(f"failover probe: no link {leaf}-{spine} in this fabric")
    if graph.nodes[leaf]["tier"] != 1:
        leaf, spine = spine, leaf
    if graph.nodes[leaf]["tier"] != 1:
        raise UserError(f"failover probe: {link[0]}-{link[1]} is not a leaf-spine link")
    ports = {h: host_interfaces(graph, h) for h, d in graph.nodes(data=True) if d["tier"] == 0}
    src = next(((h, p) for h, ps in sorted(ports.items()) for p in ps if p["leaf"] == leaf), None)
    if src is None:
        raise UserError(f"failover probe: no host under {leaf}")
    plane = src[1]["plane"]
    dst = next(((h, p) for h, ps in sorted(ports.items()) for p in ps
                if p["plane"] == plane and p["leaf"] != leaf and h != src[0]), None)
    if dst is None:
        raise UserError(f"failover probe: no host on plane {plane} under another leaf than {leaf}")
    return src[0], src[1]["ip"], dst[0], dst[1]["ip"], (leaf, spine)


def default_switch(graph) -> str:
    """The switch a ``switch`` probe fails by default: plane 0's first core, else its first spine."""
    for tier in (3, 2):
        found = sorted((d["index"], n) for n, d in graph.nodes(data=True)
                       if d["tier"] == tier and d.get("plane", 0) == 0)
        if found:
            return found[0][1]
    raise UserError("failover probe: this fabric has no spine or core to fail")


def switch_endpoints(graph, switch: str | None) -> tuple[str, str, str, str, tuple[str, str]]:
    """(src host, src ip, dst host, dst ip, (neighbour, switch)) for a switch failure: flows that can
    cross the switch, on its plane. A core: the receiver under a leaf of the core's campus, the
    sender in another campus (else another pod); the neighbour is the core of the sender's campus
    with a link to it (else a spine of the sender's pod under it). A spine: the sender under a leaf
    of its pod, the receiver under another leaf (of another pod where the pod has one leaf); the
    neighbour is the sender's leaf. A leaf takes its own hosts with it: refused."""
    switch = switch or default_switch(graph)
    if switch not in graph or graph.nodes[switch]["tier"] == 0:
        raise UserError(f"failover probe: no switch {switch} in this fabric")
    d = graph.nodes[switch]
    if d["tier"] == 1:
        raise UserError(f"failover probe: {switch} is a leaf; a failed leaf takes its hosts with it (fail a spine "
                        "or a core)")
    plane = d.get("plane", 0)
    ports = sorted((h, p) for h, hd in graph.nodes(data=True) if hd["tier"] == 0 for p in host_interfaces(graph, h)
                   if p["plane"] == plane)
    leaf = {n: graph.nodes[n] for n in graph if graph.nodes[n]["tier"] == 1}
    campus = d.get("campus", 0)
    if d["tier"] == 3:
        other_campus = [(h, p) for h, p in ports if leaf[p["leaf"]].get("campus", 0) != campus]
        mine = [(h, p) for h, p in ports if leaf[p["leaf"]].get("campus", 0) == campus]
        if other_campus and mine:
            src, dst = other_campus[0], next(x for x in mine if x[0] != other_campus[0][0])
        else:
            pods = {leaf[p["leaf"]]["pod"] for _h, p in ports}
            if len(pods) < 2:
                raise UserError(f"failover probe: no flow crosses core {switch} (one pod, one campus)")
            src = ports[0]
            dst = next(x for x in ports if leaf[x[1]["leaf"]]["pod"] != leaf[src[1]["leaf"]]["pod"])
        src_campus = leaf[src[1]["leaf"]].get("campus", 0)
        near = sorted(n for n in graph.neighbors(switch) if graph.nodes[n]["tier"] == 3
                      and graph.nodes[n].get("campus", 0) == src_campus)
        if not near:
            near = sorted(n for n in graph.neighbors(switch) if graph.nodes[n]["tier"] == 2
                          and graph.nodes[n]["pod"] == leaf[src[1]["leaf"]]["pod"])
    else:
        inside = [(h, p) for h, p in ports if leaf[p["leaf"]].get("campus", 0) == campus
                  and leaf[p["leaf"]]["pod"] == d["pod"] and graph.has_edge(p["leaf"], switch)]
        if not inside:
            raise UserError(f"failover probe: no host under spine {switch}")
        src = inside[0]
        found = next((x for x in inside if x[1]["leaf"] != src[1]["leaf"] and x[0] != src[0]), None) or next(
            (x for x in ports if x[1]["leaf"] != src[1]["leaf"] and x[0] != src[0]), None)
        if found is None:
            raise UserError(f"failover probe: no receiver for a flow across {switch}")
        dst = found
        near = [src[1]["leaf"]]
    return src[0], src[1]["ip"], dst[0], dst[1]["ip"], (near[0], switch)


def idle_interface(emu, busy: set[str]) -> str:
    """A fabric interface on another plane than the busy switches (carries none of the flows)."""
    planes = {emu.graph.nodes[s].get("plane") for s in busy}
    for name in emu.builder.fabric_interfaces():
        sw = name.split("-")[0]
        if emu.graph.nodes[sw].get("plane") not in planes:
            return name
    return emu.builder.fabric_interfaces()[-1]


def _tc_pass(intf: str, on: bool) -> None:
    lines = ([f"qdisc add dev {intf} clsact", f"filter add dev {intf} egress pref 2 bpf da bytecode '{PASS_BYTECODE}'"]
             if on else [f"filter del dev {intf} egress pref 2"])
    subprocess.run(["tc", "-force", "-batch", "-"], input="\n".join(lines) + "\n", text=True, capture_output=True)


class TcIdle:
    """Timeline target for the tc-idle probe: 'fail' adds a pass filter, 'repair' removes it
    (with no interface: nothing at all, the ``none`` probe)."""

    def __init__(self, emu, intf: str | None):
        self.graph, self.intf = emu.graph, intf

    def link_down(self, *a: Any, **k: Any) -> None:
        if self.intf:
            _tc_pass(self.intf, True)

    def link_up(self, *a: Any, **k: Any) -> None:
        if self.intf:
            _tc_pass(self.intf, False)


#: the link-idle probe's veth pair (root namespace, never an Open vSwitch port; the kernel may lack dummy)
IDLE_LINK = ("hpnl-idle0", "hpnl-idle1")


class LinkIdle:
    """Timeline target for the link-idle probe: 'fail' sets a veth pair up, 'repair' down.
    ``open`` creates it (recorded in the run's state first, so a crash's clean-up removes it),
    ``close`` deletes it."""

    def __init__(self, emu, names: tuple[str, str] = IDLE_LINK):
        self.graph, self.state, self.names = emu.graph, emu.state, names
        self._ipr: Any = None

    def open(self) -> LinkIdle:
        from pyroute2 import IPRoute
        self.state.add_interfaces(list(self.names))
        self._ipr = IPRoute()
        if not self._ipr.link_lookup(ifname=self.names[0]):
            self._ipr.link("add", ifname=self.names[0], kind="veth", peer=self.names[1])
        for name in self.names:   # no IPv6 link-local address or route: only link events when it flaps
            Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1")
        return self

    def _set(self, state: str) -> None:
        for name in self.names:
            self._ipr.link("set", index=self._ipr.link_lookup(ifname=name)[0], state=state)

    def link_down(self, *a: Any, **k: Any) -> None:
        self._set("up")

    def link_up(self, *a: Any, **k: Any) -> None:
        self._set("down")

    def close(self) -> None:
        if self._ipr is not None:
            idx = self._ipr.link_lookup(ifname=self.names[0])
            if idx:
                self._ipr.link("del", index=idx[0])
            self._ipr.close()
            self._ipr = None


def _monitor(bridge: str, out_path) -> subprocess.Popen:
    # a miss length is what makes OVS send asynchronous messages (PortStatus) to a service
    # connection (ofproto/connmgr.c: ofconn_receives_async_msg)
    with open(out_path, "w") as f:
        return subprocess.Popen(["ovs-ofctl", "-O", "OpenFlow13", "--timestamp", "monitor", bridge, "128"],
                                stdout=f, stderr=subprocess.STDOUT)


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?):")


def port_status_times(text: str, intf: str) -> list[tuple[float, str]]:
    """(wall time, state flags) of every PortStatus about ``intf`` in ``ovs-ofctl --timestamp
    monitor`` output (pure; its stamps are local time, in milliseconds)."""
    out = []
    for block in re.split(r"(?m)^(?=\d{4}-\d\d-\d\d[ T])", text):
        m = _STAMP.match(block)
        if not m or "OFPT_PORT_STATUS" not in block or f"({intf})" not in block:
            continue
        state = re.search(r"state:[ \t]*(.*)", block)
        out.append((datetime.fromisoformat(m.group(1)).timestamp(), state.group(1).strip() if state else ""))
    return out


def not_live(state: str) -> bool:
    """A PortStatus state that a controller must read as down: LINK_DOWN, or not LIVE."""
    flags = state.split()
    return "LINK_DOWN" in flags or "LIVE" not in flags


def detection_ms(texts: dict[str, str], intfs: dict[str, str], fail_wall: float,
                 repair_wall: float) -> dict[str, float | None]:
    """Per switch: ms from the fault to its first PortStatus saying the port is down or not live."""
    out: dict[str, float | None] = {}
    for sw, text in texts.items():
        hits = [t for t, state in port_status_times(text, intfs[sw])
                if fail_wall - 0.005 <= t < repair_wall and not_live(state)]
        out[sw] = round((min(hits) - fail_wall) * 1000, 3) if hits else None
    return out


OVS_LOG = "/var/log/openvswitch/ovs-vswitchd.log"
_OVS_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z\|")


def port_status_sent(text: str, intf: str) -> list[float]:
    """Wall times (UTC stamps of ovs-vswitchd's own log, ms resolution) at which ovs-vswitchd
    sent a PortStatus about ``intf`` to any OpenFlow connection (vconn at debug level; pure)."""
    out = []
    for line in text.splitlines():
        m = _OVS_STAMP.match(line)
        if m and "sent (Success): OFPT_PORT_STATUS" in line and f"({intf})" in line:
            out.append(datetime.fromisoformat(m.group(1)).replace(tzinfo=timezone.utc).timestamp())
    return out


def stages(records: list[dict[str, Any]], event: dict[str, Any], ovs_log: str | None,
           intfs: dict[str, str], dead_sends: list[float] | None = None) -> dict[str, Any]:
    """Where the loss window's time goes, ms after the fault began (pure): the fault in place
    (the netlink calls returned), ovs-vswitchd sending its PortStatus per switch (its own log:
    it noticed the carrier and updated the port's liveness, which the fast-failover buckets
    read), its datapath's last failed send into the downed port (``dead_sends``: wall times
    from :mod:`.send_trace`; after it the cached flows point at the backup), and the last
    affected flow delivering again (receiver); beside them the largest gap on flows that never
    crossed the link (a stall of the whole datapath)."""
    t0 = records[0]["start_wall"]
    end = records[1]["start_wall"] if len(records) > 1 else float("inf")       # the repair
    out: dict[str, Any] = {"applied_ms": round((records[0]["wall"] - t0) * 1000, 3),
                           "delivering_again_ms": event.get("delivering_again_ms"),
                           "stall_unaffected_ms": event.get("max_gap_unaffected_ms")}
    if ovs_log is not None:
        for sw, intf in intfs.items():
            hits = [t for t in port_status_sent(ovs_log, intf) if t0 - 0.002 <= t < end]
            out[f"port_status_{sw}_ms"] = round((min(hits) - t0) * 1000, 1) if hits else None
    if dead_sends is not None:
        out.update(send_trace.window(dead_sends, t0, end))
    return out


class VconnDebug:
    """ovs-vswitchd's vconn module at debug level in its log file between ``begin`` and ``end``
    (every OpenFlow message it sends, stamped by its own clock), then back to the level it had."""

    def __init__(self) -> None:
        self.old = "info"
        self.start = 0

    def begin(self) -> VconnDebug:
        r = subprocess.run(["ovs-appctl", "vlog/list"], capture_output=True, text=True)
        row = next((ln.split() for ln in r.stdout.splitlines() if ln.split()[:1] == ["vconn"]), [])
        self.old = row[3].lower() if len(row) >= 4 else "info"
        try:
            self.start = os.path.getsize(OVS_LOG)
        except OSError:
            self.start = 0
        subprocess.run(["ovs-appctl", "vlog/set", "vconn:file:dbg"], capture_output=True)
        return self

    def end(self) -> None:
        subprocess.run(["ovs-appctl", "vlog/set", f"vconn:file:{self.old}"], capture_output=True)

    def text(self) -> str | None:
        try:
            with open(OVS_LOG, errors="replace") as fh:
                fh.seek(self.start)
                return fh.read()
        except OSError:
            return None


def run_once(emu, probe: Probe, rep: int = 0, log=lambda m: None) -> dict[str, Any]:
    """One repetition; returns the loss-window analysis of its two events plus detection times."""
    probe.check()
    if probe.kind == "switch":      # (the neighbour that sends into it, the switch)
        src, sip, dst, dip, (leaf, spine) = switch_endpoints(emu.graph, probe.switch)
    else:
        src, sip, dst, dip, (leaf, spine) = endpoints(emu.graph, probe.link)
    run_dir = emu.state.run_dir
    out = run_dir / f"failover-{probe.kind}-{rep}.npz"
    seconds = probe.fail_at_s + probe.hold_s + probe.after_s
    py = sys.executable
    idle = LinkIdle(emu).open() if probe.kind == "link-idle" else None
    recv = emu.popen(dst, [py, "-m", "hpnlab.fabric.emulation.udp", "flowrecv", dip, str(UDP_PORT),
                           "--seconds", f"{seconds + 1.0:.3f}", "--out", str(out)],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = recv.stdout.readline() if recv.stdout else ""
    if "listening" not in line:
        raise UserError(f"failover probe: the receiver on {dst} did not start: {line.strip()[:200]}")
    d = emu.graph.get_edge_data(leaf, spine)
    k0 = sorted(d)[0]
    intfs = {sw: f"{sw}-eth{d[k0]['ports'][sw]}" for sw in (leaf, spine)}
    mons = {sw: _monitor(sw, run_dir / f"monitor-{sw}-{rep}.txt") for sw in (leaf, spine)}
    for m in mons.values():
        emu.state.add_pid(m.pid, f"ovs-ofctl monitor ({probe.kind} {rep})")
    time.sleep(0.3)
    send = emu.popen(src, [py, "-m", "hpnlab.fabric.emulation.udp", "flows", dip, str(UDP_PORT), "--flows",
                           str(probe.flows), "--pps", str(probe.pps), "--seconds", f"{seconds:.3f}", "--src", sip,
                           "--size", str(probe.size)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    frozen = False
    vconn = VconnDebug().begin() if probe.stages else None
    sends = (send_trace.FailedSends(f"{emu.state.run_id}-{rep}", state=emu.state).begin()
             if probe.stages and emu.state is not None and not emu.options.cluster.servers else None)
    try:
        if probe.kind in ("tc-idle", "link-idle", "none"):
            target: Any = idle or TcIdle(emu, idle_interface(emu, {leaf, spine}) if probe.kind == "tc-idle" else None)
            events = [tl.Event(probe.fail_at_s, "link_down", (leaf, spine), k0),
                      tl.Event(probe.fail_at_s + probe.hold_s, "link_up", (leaf, spine), k0)]
        elif probe.kind == "switch":
            target = emu
            events = [tl.Event(probe.fail_at_s, "switch_down", (spine,)),
                      tl.Event(probe.fail_at_s + probe.hold_s, "switch_up", (spine,))]
        else:
            target = emu.faults
            fail, repair = ACTIONS[probe.kind]
            side = leaf if probe.kind != "both" else None
            events = [tl.Event(probe.fail_at_s, fail, (leaf, spine), k0, side),
                      tl.Event(probe.fail_at_s + probe.hold_s, repair, (leaf, spine), k0, side)]
        if probe.freeze_controller and emu.controller.proc is not None:
            time.sleep(max(0.0, probe.fail_at_s - 0.3))
            os.killpg(emu.controller.proc.pid, signal.SIGSTOP)
            frozen = True
            events = [tl.Event(e.at - (probe.fail_at_s - 0.3), e.action, e.target, e.key, e.side) for e in events]
        records = tl.run(target, events)
        send_out, _ = send.communicate(timeout=seconds + 30)
        recv.communicate(timeout=seconds + 30)
    finally:
        if vconn is not None:
            vconn.end()
        if sends is not None:
            sends.end()
        if idle is not None:
            idle.close()
        if frozen:
            os.killpg(emu.controller.proc.pid, signal.SIGCONT)
        for m in mons.values():
            m.terminate()
            try:
                m.wait(timeout=5)
            except subprocess.TimeoutExpired:
                m.kill()
                m.wait()
    sent = _last_json(send_out)
    with np.load(out) as z:
        arrivals = {k: z[k] for k in z.files}
    result = losswindow.analyse(arrivals, records, horizon_s=min(0.5, probe.hold_s), end_s=sent.get("end_wall"),
                                sent_per_flow=sent.get("per_flow"))
    # a sender starved of CPU can begin after the failure: then the repetition measures nothing
    first = float(np.min(arrivals["sent_ns"])) / 1e9 if len(arrivals["sent_ns"]) else None
    result["first_sent_wall"] = first
    result["sending_at_failure"] = first is not None and first < records[0]["start_wall"]
    texts = {sw: (run_dir / f"monitor-{sw}-{rep}.txt").read_text() for sw in mons}
    result["detection_ms"] = detection_ms(texts, intfs, records[0]["wall"], records[1]["wall"])
    result["stages"] = stages(records, result["events"][0], vconn.text() if vconn else None, intfs,
                              sends.times() if sends is not None and sends.reason is None else None)
    if sends is not None and sends.reason is not None:
        result["stages"]["dead_port_trace"] = sends.reason
    result.update(kind=probe.kind, rep=rep, load_avg_1min=round(os.getloadavg()[0], 2), link=[leaf, spine],
                  switch=spine if probe.kind == "switch" else None,
                  src=src, dst=dst, sent=sent.get("sent"),
                  timeline=records, controller_frozen=frozen)
    for ev in result["events"]:
        ev.pop("flows")   # per-flow detail stays in the .npz; the summary is enough for the JSON
    e0 = result["events"][0]
    log(f"{probe.kind} #{rep}: loss window {e0['loss_window_ms']:.1f} ms on {len(e0['affected'])}/"
        f"{result['flows']} flows, {e0['lost']} lost ({e0['late']} of them late), largest gap on the others "
        f"{e0['max_gap_unaffected_ms']:.1f} ms ({len(e0['stalled'])} stalled), detection "
        f"{result['detection_ms']}" + (f", stages {result['stages']}" if probe.stages else "")
        + f"; {result.get('received', result['packets'])} of {result.get('sent')} packets received"
        + "".join(f"; flows {e['open']} never delivered again after the {e['action']}"
                  for e in result["events"] if e.get("open"))
        + (f"; flows {result['stopped_before_events']} stopped delivering before the failure"
           if result.get("stopped_before_events") else "")
        + (f"; nothing of flows {result['never_heard']} arrived" if result.get("never_heard") else ""))
    return result


def _last_json(text: str | None) -> dict[str, Any]:
    import json
    for line in reversed((text or "").splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def run(emu, kinds: list[str], repeat: int, probe: Probe = Probe(), log=lambda m: None,
        settle_s: float = 1.5) -> dict[str, Any]:
    """``repeat`` repetitions of each kind; per kind the spread of the figures over repetitions."""
    for k in kinds:
        Probe(kind=k).check()
    runs: dict[str, list[dict[str, Any]]] = {}
    for kind in kinds:
        for rep in range(repeat):
            runs.setdefault(kind, []).append(run_once(emu, Probe(**{**probe.__dict__, "kind": kind}), rep, log))
            time.sleep(settle_s)
    summary = {kind: summarise(rs) for kind, rs in runs.items()}
    return {"probe": {**probe.__dict__, "kinds": kinds, "repeat": repeat}, "summary": summary, "runs": runs}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Spread over repetitions of: the failure's loss window, lost packets, affected flows,
    gaps on unaffected flows, detection per switch, and the repair's loss window. Repetitions whose
    sender began only after the failure (``sending_at_failure`` false) measure nothing: left out,
    and counted (``left_out``)."""
    left_out = sum(1 for r in runs if not r.get("sending_at_failure", True))
    runs = [r for r in runs if r.get("sending_at_failure", True)] or runs
    fail = [r["events"][0] for r in runs]
    repair = [r["events"][1] for r in runs]
    det: dict[str, list[float]] = {}
    for r in runs:
        for sw, ms in r["detection_ms"].items():
            det.setdefault(sw, []).append(ms)
    return {"left_out": left_out, "loss_window_ms": spread(e["loss_window_ms"] for e in fail),
            # packets sent and never received, whatever the events (a fabric that stopped delivering)
            "undelivered": spread(r["sent"] - r["received"] for r in runs if "received" in r),
            "lost": spread(e["lost"] for e in fail),
            "late": spread(e.get("late", 0) for e in fail),
            "affected_flows": spread(len(e["affected"]) for e in fail),
            "max_gap_unaffected_ms": spread(e["max_gap_unaffected_ms"] for e in fail),
            "stalled_flows": spread(len(e["stalled"]) for e in fail),
            "max_network_gap_unaffected_ms": spread(e["max_network_gap_unaffected_ms"] for e in fail),
            "detection_ms": {sw: spread(v for v in vals if v is not None) | {
                "missed": sum(v is None for v in vals)} for sw, vals in det.items()},
            "repair_loss_window_ms": spread(e["loss_window_ms"] for e in repair),
            "repair_max_gap_ms": spread(e["max_gap_ms"] for e in repair),
            "stages": {k: spread(r["stages"].get(k) for r in runs)
                       for k in sorted({k for r in runs for k, v in r.get("stages", {}).items()
                                        if k.endswith("_ms") and isinstance(v, (int, float))})}}


def describe(kind: str, s: dict[str, Any]) -> str:
    """One line per kind: median [min-max] of the figures over repetitions."""
    def f(d: dict[str, Any], unit: str = "") -> str:
        return spread_text(d, "{:.1f}", unit=unit)
    det = ", ".join(f"{sw} {f(d, ' ms')}" + (f" ({d['missed']} missed)" if d.get("missed") else "")
                    for sw, d in s["detection_ms"].items())
    late = f", of them late {f(s['late'])}" if s.get("late", {}).get("max") else ""
    return (f"{kind}: loss window {f(s['loss_window_ms'], ' ms')}, lost {f(s['lost'])}{late}, affected flows "
            f"{f(s['affected_flows'])}, largest gap on unaffected flows {f(s['max_gap_unaffected_ms'], ' ms')} "
            f"(stalled {f(s['stalled_flows'])}; the network's share {f(s['max_network_gap_unaffected_ms'], ' ms')}); "
            f"detection: {det or '-'}; after repair: loss window "
            f"{f(s['repair_loss_window_ms'], ' ms')}"
            + (f"; packets never received {f(s['undelivered'])}" if s.get("undelivered", {}).get("n") else "")
            + (f"; {s['left_out']} repetition(s) left out: the sender began after the failure"
               if s.get("left_out") else "")
            + stages_text(s.get("stages", {})))


#: the stages in the order a failure goes through them, and how the summary names them
STAGE_NAMES = (("applied_ms", "fault in place"), ("port_status", "PortStatus"),
               ("dead_port_last_ms", "last send into the dead port"),
               ("delivering_again_ms", "delivering again"))


def stages_text(st: dict[str, Any]) -> str:
    """The stages' medians in a failure's order, e.g. "; stages (ms after the fault, median):
    fault in place 1.2, PortStatus p0l0 1.9, ..." (empty without stages)."""
    parts = []
    for key, name in STAGE_NAMES:
        for k in sorted(st):
            if (k == key or (key == "port_status" and k.startswith("port_status_"))) and st[k].get("n"):
                who = f" {k[len('port_status_'):-3]}" if key == "port_status" else ""
                parts.append(f"{name}{who} {st[k]['median']:.1f}")
    return f"; stages (ms after the fault, median): {', '.join(parts)}" if parts else ""
