"""What priority flow control needs to know about a fabric before anything runs (pure).

Every switch port and host NIC gets a global id (*gid*); a switch's ports are numbered from its
*base* (gid = base + OpenFlow port number) so that a tag names a switch's ingress port with only a
few bits. The tag every IPv4 packet carries in its IPv4 ID, written by the transmitter it leaves
(``bpf/pfc.bpf.c``)::

    [ egress gid | egress class (2 bits) | ingress class (2 bits) | ingress port number (kbits) ]

Classes: 0 lossless data, 1 lossless bounced (only when bounced detours have a priority of their
own), 2 lossy, 3 high (control) or none. ``kbits`` holds the largest port number of any switch;
the gids must fit in what is left (``16 - 4 - kbits`` bits): a fabric too large is refused in one
line. This module also lays out the data path's maps (the C structures, as Python struct formats:
``tests/unit/test_pfc_plan.py`` holds them to ``pfc.bpf.c``) and writes the pause agent's
configuration.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.deadlock import needs_bounce_priority
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario.rates import emulated_mbps
from hpnlab.fabric.workload import lossless as ll
from hpnlab.fabric.workload.ecn import frame_bytes

from . import shaping

#: the tag's width (the IPv4 ID) and the classes' bits in it
TAG_BITS, CLASS_BITS = 16, 2
#: as in pfc.bpf.c
MAX_PORTS, MAX_SWITCHES, PRIOS, CLASSES = 4096, 1024, 2, 3
CLS_LOSSLESS, CLS_BOUNCED, CLS_LOSSY, CLS_HIGH = 0, 1, 2, 3
NO_CLASS = 3
CLASS_NAMES = ("lossless", "bounced", "lossy", "high")

# ---- the maps' values (little-endian, as the C structures lay them out) -----------------------
GLOBAL = struct.Struct("<IIII2Q4I")        # kbits bounce dscp ecn marks[2] class_minor[4]
LINK = struct.Struct("<6I")                # peer sw base local headroom lossy_limit
SWCFG = struct.Struct("<QIIII")            # shared alpha_q8 xoff resume reserved
INGRESS = struct.Struct("<II2q8QII")       # lock paused bytes headroom pauses resumes drops drop_bytes paused_ns
#                                          # pause_since pkts octets seq pad
EGRESS = struct.Struct("<3q3QQQ")          # bytes[3] pkts[3] lossy_drops headroom_drops
SWITCH = struct.Struct("<q")               # shared_used
PEAK = struct.Struct("<2q3qqq")            # ingress headroom egress[3] shared pause_ns
COUNTER = struct.Struct("<Q")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
#: the structures as the C source names them, for the layout test
LAYOUTS = {"pfc_global": GLOBAL, "pfc_link": LINK, "pfc_swcfg": SWCFG, "pfc_ingress": INGRESS,
           "pfc_egress": EGRESS, "pfc_switch": SWITCH, "pfc_peak": PEAK}
#: pfc_cnt's slots
COUNTERS = ("events_lost", "foreign_tags", "headroom_drops_applied")


def mac_int(mac: str) -> int:
    """A MAC as the data path compares it: the six bytes as a 48-bit number, first byte highest."""
    return int(mac.replace(":", ""), 16)


def tag(eid: int, eg_cls: int, in_cls: int, in_local: int, kbits: int) -> int:
    """The 16-bit tag (module docstring)."""
    if not (0 <= in_local < 1 << kbits and 0 <= eg_cls <= 3 and 0 <= in_cls <= 3):
        raise ValueError(f"tag fields out of range: {eid} {eg_cls} {in_cls} {in_local} (kbits {kbits})")
    value = eid << (kbits + 2 * CLASS_BITS) | eg_cls << (kbits + CLASS_BITS) | in_cls << kbits | in_local
    if value >= 1 << TAG_BITS:
        raise ValueError(f"egress gid {eid} does not fit a tag with kbits {kbits}")
    return value


def untag(value: int, kbits: int) -> tuple[int, int, int, int]:
    """(egress gid, egress class, ingress class, ingress port number) of a tag."""
    return (value >> (kbits + 2 * CLASS_BITS), value >> (kbits + CLASS_BITS) & 3, value >> kbits & 3,
            value & ((1 << kbits) - 1))


@dataclass(frozen=True)
class PortId:
    """A switch port or host NIC as the data path knows it."""
    gid: int
    node: str
    port: int                  # OpenFlow port number, or a host's interface number
    intf: str                  # its interface (a switch port in the root namespace, a NIC in its host's)
    switch: int                # its switch's index + 1; 0 for a host NIC
    base: int                  # gid of its switch's port 0 (0 for a host NIC)
    peer: int                  # gid at the other end of its link
    rate_mbps: float           # the link's emulated rate
    mac: str | None = None     # a host NIC's MAC
    ip: str | None = None      # a host NIC's address
    headroom: int = 0          # per lossless class (switch ports)
    lossy_limit: int = 0       # the lossy buffer of its egress (switch ports)

    @property
    def is_switch(self) -> bool:
        return self.switch > 0


@dataclass(frozen=True)
class Plan:
    ports: tuple[PortId, ...]
    switches: tuple[str, ...]
    buffers: Mapping[str, ll.SwitchBuffer]
    kbits: int
    priorities: int
    mtu: int

    def by_gid(self) -> dict[int, PortId]:
        return {p.gid: p for p in self.ports}

    def by_intf(self) -> dict[str, PortId]:
        return {p.intf: p for p in self.ports}

    def upstream(self, gid: int) -> PortId:
        """The transmitter a switch ingress port pauses: the port at the other end of its link."""
        return self.by_gid()[self.by_gid()[gid].peer]

    def switch_ports(self) -> list[PortId]:
        return [p for p in self.ports if p.is_switch]

    def host_nics(self) -> list[PortId]:
        return [p for p in self.ports if not p.is_switch]

    def as_dict(self) -> dict[str, Any]:
        return {"kbits": self.kbits, "priorities": self.priorities, "mtu": self.mtu,
                "switches": list(self.switches),
                "ports": [p.__dict__ for p in self.ports],
                "buffers": {n: b.as_dict() for n, b in self.buffers.items()}}


def ingress_rates(g: nx.MultiGraph, switch: str) -> dict[int, float]:
    """A switch's ingress ports (port number -> the emulated rate arriving there)."""
    s = g.graph["scenario"]
    out = {}
    for _, _, d in g.edges(switch, data=True):
        out[d["ports"][switch]] = emulated_mbps(s, d["rate_gbps"])
    return out


def switch_buffers(g: nx.MultiGraph, priorities: int = 1) -> dict[str, ll.SwitchBuffer]:
    """Every switch's lossless buffer (``lossless.switch_buffer`` from the scenario's settings)."""
    s = g.graph["scenario"]
    out = {}
    for sw in fgraph.switches(g):
        out[sw] = ll.switch_buffer(s.emulation.lossless, ingress_rates(g, sw), s.emulation.mtu, priorities)
        ll.check_sizes(out[sw], s.emulation.mtu)
    return out


def kbits_for(max_port: int) -> int:
    return max(1, int(max_port).bit_length())


def build(g: nx.MultiGraph, priorities: int = 1) -> Plan:
    """Number every switch port and host NIC of a fabric, and refuse in one line one that the tag
    cannot carry (too many ports, or switches with too many ports)."""
    s = g.graph["scenario"]
    mtu = s.emulation.mtu
    switches = tuple(fgraph.switches(g))
    if len(switches) > MAX_SWITCHES:
        raise UserError(f"priority flow control emulates at most {MAX_SWITCHES} switches, this fabric has "
                        f"{len(switches)}")
    ports_of = {sw: sorted(ingress_rates(g, sw)) for sw in switches}
    max_port = max((max(p) for p in ports_of.values() if p), default=1)
    kbits = kbits_for(max_port)
    base: dict[str, int] = {}
    nxt = 0
    for sw in switches:
        base[sw] = nxt
        nxt += max(ports_of[sw], default=0)
    gid_of: dict[tuple[str, int], int] = {(sw, p): base[sw] + p for sw in switches for p in ports_of[sw]}
    hosts = fgraph.hosts(g)
    host_gid = nxt + 1
    nics: list[tuple[str, dict]] = []
    for h in hosts:
        for nic in fgraph.host_ports(g, h):
            gid_of[h, nic["intf"]] = host_gid
            nics.append((h, nic))
            host_gid += 1
    top = host_gid - 1
    eid_bits = TAG_BITS - 2 * CLASS_BITS - kbits
    limit = min(MAX_PORTS - 1, (1 << eid_bits) - 1)
    if top > limit:
        raise UserError(f"priority flow control tags packets in the 16-bit IPv4 ID: this fabric's {top} switch "
                        f"ports and NICs (switches of up to {max_port} ports) need more than the {limit} ids it "
                        f"holds; emulate a smaller fabric")
    buffers = switch_buffers(g, priorities)
    index = {sw: i + 1 for i, sw in enumerate(switches)}
    lossy = {}
    out: list[PortId] = []
    for u, v, d in g.edges(data=True):
        rate = emulated_mbps(s, d["rate_gbps"])
        for a in (u, v):
            if a in index:
                shape = shaping.Shape(fgraph.intf_name(a, d["ports"][a]), rate, mtu=mtu,
                                      buffer_frames=s.emulation.buffer_frames)
                lossy[a, d["ports"][a]] = shape.queue_bytes
    for sw in switches:
        for _, peer, d in sorted(g.edges(sw, data=True), key=lambda e: e[2]["ports"][sw]):
            p = d["ports"][sw]
            out.append(PortId(gid_of[sw, p], sw, p, fgraph.intf_name(sw, p), index[sw], base[sw],
                              gid_of[peer, d["ports"][peer]], emulated_mbps(s, d["rate_gbps"]),
                              headroom=buffers[sw].headroom_bytes[p], lossy_limit=lossy[sw, p]))
    for h, nic in nics:
        out.append(PortId(gid_of[h, nic["intf"]], h, nic["intf"], fgraph.intf_name(h, nic["intf"]), 0, 0,
                          gid_of[nic["leaf"], nic["leaf_port"]], emulated_mbps(s, nic["rate_gbps"]), nic["mac"],
                          nic["ip"]))
    return Plan(tuple(sorted(out, key=lambda p: p.gid)), switches, buffers, kbits, priorities, mtu)


def lossless_priorities(g: nx.MultiGraph, needs_own: Callable[[nx.MultiGraph], bool] | None = None) -> int:
    """How many lossless priorities the scenario's ``bounce_priority`` asks for: 2 with ``on``, 1 with
    ``off``; with ``auto`` 2 only when the routing proof finds a cyclic buffer dependency
    (``needs_own(g)``: ``hpnlab.fabric.routing.deadlock.needs_bounce_priority``)."""
    mode = g.graph["scenario"].emulation.lossless.bounce_priority
    if mode == "on":
        return 2
    if mode == "off":
        return 1
    return 2 if (needs_own or needs_bounce_priority)(g) else 1


# ---- the maps' contents -------------------------------------------------------------------------

def global_value(plan: Plan, ecn: bool) -> tuple:
    minors = (shaping.PFC_LOSSLESS_CLASSES[0], shaping.PFC_LOSSLESS_CLASSES[1], shaping.PFC_LOSSY_CLASS,
              shaping.PFC_HIGH_CLASS)
    return (plan.kbits, 1 if plan.priorities > 1 else 0, ll.LOSSLESS_DSCP, 1 if ecn else 0,
            mac_int(compiler.BOUNCE_MAC), mac_int(compiler.DEEP_MAC), *minors)


def link_value(p: PortId) -> tuple:
    return (p.peer, p.switch, p.base, p.port if p.is_switch else 0, p.headroom, p.lossy_limit)


def swcfg_value(b: ll.SwitchBuffer) -> tuple:
    return (b.shared_bytes, b.alpha_q8, b.xoff_bytes, b.resume_offset_bytes, b.reserved_bytes)


# ---- the pause agent's configuration ---------------------------------------------------------------

def agent_config(plan: Plan, events: str, stats: str, netns_of: Callable[[str], str], watchdog_ms: int,
                 restore_ms: int, nicmap: str | None = None, ingress: str | None = None) -> str:
    """The agent's configuration file (``pfc_agent.c``): one target per switch ingress port, the
    transmitter at the other end of its link (``netns_of(node)``: "-" for the root namespace), with the
    transmitter's gid when it is a host NIC (its pause state goes to ``nicmap``, for its transport)."""
    frame = frame_bytes(plan.mtu)
    lines = ["# hpnlab pause agent (written by hpnlab.fabric.emulation.pfc)", f"events {events}", f"stats {stats}",
             *([f"nicmap {nicmap}"] if nicmap else []), *([f"ingress {ingress}"] if ingress else []),
             f"open {shaping.GATE_OPEN_BPS // 8} {shaping.GATE_OPEN_BURST} {shaping.LOSSLESS_LIMIT_BYTES}",
             f"closed 1 {frame}", f"watchdog {watchdog_ms} {restore_ms}"]
    for prio in range(plan.priorities):
        parent, handle = 0x10000 | shaping.PFC_LOSSLESS_CLASSES[prio], shaping.PFC_GATES[prio] << 16
        lines.append(f"gate {prio} {parent:#x} {handle:#x}")
    by_gid = plan.by_gid()
    for p in plan.switch_ports():
        up = by_gid[p.peer]
        lines.append(f"target {p.gid} {netns_of(up.node)} {up.intf}" + ("" if up.is_switch else f" {up.gid}"))
    return "\n".join(lines) + "\n"


# ---- reading the maps back --------------------------------------------------------------------------

def ingress_fields(values: Iterable[int]) -> dict[str, int]:
    v = list(values)
    return {"paused": v[1], "bytes": v[2], "headroom": v[3], "pauses": v[4], "resumes": v[5], "drops": v[6],
            "drop_bytes": v[7], "paused_ns": v[8], "pause_since": v[9], "packets": v[10], "octets": v[11],
            "seq": v[12]}


def egress_fields(values: Iterable[int]) -> dict[str, Any]:
    v = list(values)
    return {"bytes": v[0:3], "packets": v[3:6], "lossy_drops": v[6], "headroom_drops": v[7]}


def peak_fields(values: Iterable[int]) -> dict[str, Any]:
    v = list(values)
    return {"ingress": v[0], "headroom": v[1], "egress": v[2:5], "shared": v[5], "pause_ns": v[6]}


def reaction_percentiles(hist: list[list[int]], qs: Iterable[float] = (50, 99, 100)) -> dict[float, float | None]:
    """Percentiles (µs) of the agent's reaction histogram ``[[bucket upper bound µs (0: beyond 1 s), count]]``:
    each the upper bound of the bucket it falls in (an overestimate of at most the bucket's width)."""
    pairs = sorted(((u if u else 1_000_000_000, c) for u, c in hist), key=lambda x: x[0])
    total = sum(c for _, c in pairs)
    out: dict[float, float | None] = {}
    for q in qs:
        if not total:
            out[q] = None
            continue
        want = q / 100 * total
        seen = 0
        for upper, c in pairs:
            seen += c
            if seen >= want - 1e-9:
                out[q] = float(upper)
                break
    return out


def summarize(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]],
              switches: dict[str, dict[str, int]], seconds: float) -> dict[str, Any]:
    """One measurement (a cell of a run) from two readings of ``PfcStage.counters`` and one of
    ``PfcStage.switches`` (peaks since the first reading): pauses, paused time and its largest share of
    the measurement on one port, headroom and lossy drops, the largest headroom, ingress and shared
    buffer use, and per port that paused, its own figures."""
    def d(intf: str, key: str) -> float:
        return (after[intf].get(key) or 0) - (before.get(intf, {}).get(key) or 0)

    ports = [k for k, v in after.items() if v.get("switch_port")]
    per_port = {}
    for intf in ports:
        pauses = d(intf, "pauses_sent")
        if pauses or d(intf, "headroom_drops"):
            paused = d(intf, "paused_s")
            per_port[intf] = {"pauses": int(pauses), "paused_s": round(paused, 4),
                              "paused_share": round(paused / seconds, 4) if seconds > 0 else None,
                              "headroom_peak": after[intf].get("headroom_peak", 0),
                              "headroom_drops": int(d(intf, "headroom_drops"))}
    shared = [(s["shared_peak"] / s["shared_bytes"]) if s["shared_bytes"] else 0.0 for s in switches.values()]
    return {"pauses": int(sum(d(i, "pauses_sent") for i in ports)),
            "paused_s": round(sum(d(i, "paused_s") for i in ports), 4),
            "ports_paused": len([i for i in ports if d(i, "pauses_sent") > 0]),
            "paused_share_max": max((p["paused_share"] or 0 for p in per_port.values()), default=0.0),
            "headroom_drops": int(sum(d(i, "headroom_drops") for i in ports)),
            "lossy_drops": int(sum(d(i, "lossy_drops") for i in ports)),
            "headroom_peak_bytes": max((after[i].get("headroom_peak", 0) for i in ports), default=0),
            "longest_pause_ms": round(max((after[i].get("longest_pause_s", 0) for i in ports), default=0) * 1e3, 2),
            "ingress_peak_bytes": max((after[i].get("ingress_peak", 0) for i in ports), default=0),
            "shared_peak_share": round(max(shared, default=0.0), 4),
            "per_port": per_port}


def nic_pause_option(plan: Plan, nicmap: str) -> dict[str, Any]:
    """What the roce transport needs to stop sending a paused priority (its ``pause`` option): the pinned
    array of host NICs' paused priorities and every NIC's index in it, by its address."""
    return {"map": nicmap, "entries": MAX_PORTS, "index": {p.ip: p.gid for p in plan.host_nics() if p.ip}}
