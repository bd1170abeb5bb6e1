"""Staged rollout, pure: one plane at a time, each stage proven by probes before the next.

Planes are independent by design (no link joins two planes), so a fabric can be installed plane
by plane: while one plane is being installed and checked, hosts keep the planes that are already
up. ``--rollout staged`` (controller/app.py does the plumbing):

1. ``stages``: the planes the wiring check allows, one per stage, in plane order.
2. The stage's switches are handed to the reconciler; once every one of them has confirmed its
   whole state (barriers answered), the stage is probed.
3. Probes (``probes``): for each leaf of the plane, packets to hosts behind ``fanout`` other
   leaves of the plane, from a host behind it, one per entropy branch the leaf's uplinks take
   (``sports``: consecutive source ports cover every pattern of the masked bits the entropy
   tables match). Only pairs the compiled tables say are delivered are probed (a pair the wiring
   check left without a way has no route on purpose). The controller injects each probe at the
   source leaf as a packet-out with ``in_port`` = the source host's port and action TABLE, so it
   walks the source leaf's real tables and the spines'. Where it ends is the probe mode:

   - ``hosts`` (the default: reachability as users understand it, host to host): the probe is a TCP
     SYN to port ``PROBE_PORT`` of the destination host, its sequence number carrying the probe id
     (``PROBE_SEQ_BASE`` + id). It goes through the destination leaf's last hop to the host itself,
     whose TCP stack answers (a RST from a closed port, or a SYN-ACK from an open one: both
     acknowledge seq + 1) back through the plane; the answer is caught where it enters the source
     leaf, on an uplink (``catch_points``, ``catch_match``: TCP source port ``PROBE_PORT``). So a
     probe proves the way there, the host's port and the way back (the return takes one entropy
     branch: its source port is fixed). Probed pairs are those delivered both ways.
   - ``leaves`` (the former probe): a UDP packet to port ``PROBE_PORT``, caught where it enters the
     destination leaf, on an uplink: the destination leaf's own tables and host port are not proven.

   Either way the catching rule is a temporary table-0 entry (in_port = an uplink, highest priority)
   sending to the controller; this works the same on real switches and in the emulation.
4. ``evaluate``: a probe that did not arrive within the wait (sent twice), or arrived at another
   leaf than it should (``Probe.catch_leaf``), fails the stage. A failed stage is rolled back: its
   switches are taken from the reconciler (they count as failed, which touches no other plane) and
   wiped; the next stage goes on.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import networkx as nx

MODES = ("all", "staged")
#: where a stage's probes end: at the destination host (answered by it) or at the destination leaf's uplink
PROBE_MODES = ("hosts", "leaves")
PROBE_PORT = 47806              # the probes' destination port (0xBABE): UDP (leaves) or TCP (hosts)
PROBE_UDP_PORT = PROBE_PORT
PROBE_MAGIC = b"hpnlab-probe:"
SPORT_BASE = 49152
PROBE_SEQ_BASE = 0x68700000     # hosts mode: a probe's TCP sequence number is this + its id
PROBE_IDS = 1 << 20             # ids a sequence number can carry
ETH_IPV4, IP_TCP, IP_UDP = 0x0800, 6, 17


@dataclass(frozen=True)
class Probe:
    probe_id: int
    plane: int
    src_leaf: str
    in_port: int            # the source host's port on the source leaf
    src_host: str
    src_mac: str
    src_ip: str
    dst_leaf: str
    dst_host: str
    dst_mac: str
    dst_ip: str
    sport: int
    mode: str = "hosts"

    @property
    def payload(self) -> bytes:
        return PROBE_MAGIC + str(self.probe_id).encode()

    @property
    def seq(self) -> int:
        """hosts mode: the TCP SYN's sequence number (its id inside)."""
        return PROBE_SEQ_BASE + self.probe_id

    @property
    def catch_leaf(self) -> str:
        """Where the probe (hosts: the destination host's answer) is caught when the plane works."""
        return self.src_leaf if self.mode == "hosts" else self.dst_leaf


def probe_id_of_ack(ack: int) -> int | None:
    """hosts mode: the probe id a host's answer acknowledges (seq + 1); None for any other number."""
    pid = (ack - 1 - PROBE_SEQ_BASE) & 0xFFFFFFFF
    return pid if 0 < pid < PROBE_IDS else None


def catch_match(mode: str) -> tuple:
    """The catching rule's match besides its in_port: UDP to PROBE_PORT (leaves) or TCP from it (hosts)."""
    if mode == "hosts":
        return (("eth_type", ETH_IPV4), ("ip_proto", IP_TCP), ("tcp_src", PROBE_PORT))
    return (("eth_type", ETH_IPV4), ("ip_proto", IP_UDP), ("udp_dst", PROBE_PORT))


def probe_id_of(payload: bytes) -> int | None:
    """The probe id of a probe's UDP payload; None for anything else."""
    if not payload.startswith(PROBE_MAGIC):
        return None
    try:
        return int(payload[len(PROBE_MAGIC):].split(b"\0")[0])
    except ValueError:
        return None


@dataclass(frozen=True)
class StageResult:
    plane: int
    sent: int
    arrived: int
    missing: tuple[int, ...] = ()                 # probe ids
    misdelivered: tuple[tuple[int, str], ...] = ()  # (probe id, the leaf it arrived at)

    @property
    def ok(self) -> bool:
        return self.sent > 0 and not self.missing and not self.misdelivered

    def as_dict(self) -> dict:
        return {"plane": self.plane, "ok": self.ok, "probes": self.sent, "arrived": self.arrived,
                "missing": len(self.missing), "misdelivered": len(self.misdelivered)}


def stages(planes: Iterable[int]) -> list[int]:
    """One plane per stage, in plane order."""
    return sorted(set(planes))


def leaves(g: nx.MultiGraph, plane: int) -> list[str]:
    return sorted(n for n, d in g.nodes(data=True) if d["tier"] == 1 and d.get("plane", 0) == plane)


def host_ports_of(g: nx.MultiGraph, leaf: str) -> list[tuple[int, str, str, str]]:
    """(leaf port, host, host mac, host ip) of every host behind a leaf, by port."""
    out = []
    for u, v, d in g.edges(leaf, data=True):
        other = v if u == leaf else u
        if d["kind"] == "host":
            out.append((d["ports"][leaf], other, d["mac"], d["ip"]))
    return sorted(out)


def uplinks(g: nx.MultiGraph, leaf: str) -> list[int]:
    """A leaf's ports towards switches."""
    return sorted(d["ports"][leaf] for u, v, d in g.edges(leaf, data=True)
                  if g.nodes[v if u == leaf else u]["tier"] > 0)


def catch_points(g: nx.MultiGraph, plane: int) -> dict[str, list[int]]:
    """Where probes (or, hosts mode, their answers) are caught: every leaf of the plane, on its uplinks."""
    return {leaf: uplinks(g, leaf) for leaf in leaves(g, plane)}


def sports(n: int) -> list[int]:
    """``n`` consecutive UDP source ports: every pattern of the low log2(n) bits."""
    return [SPORT_BASE + i for i in range(n)]


def probes(g: nx.MultiGraph, plane: int, delivered: Callable[[str, str, str, int], bool] | None = None,
           fanout: int = 3, branches: int = 8, first_id: int = 1, mode: str = "hosts") -> list[Probe]:
    """The stage's probes: each leaf of the plane to the next ``fanout`` leaves (in leaf order, wrapping),
    from its first host to the destination's first host, ``branches`` entropy branches each; pairs for
    which ``delivered(src host, dst host, dst ip, sport)`` is False (the compiled tables drop them) are
    left out, and in hosts mode those whose answer ``delivered(dst host, src host, src ip, PROBE_PORT)``
    would not come back."""
    if mode not in PROBE_MODES:
        raise ValueError(f"unknown probe mode {mode!r}: one of {', '.join(PROBE_MODES)}")
    ls = leaves(g, plane)
    hosts = {leaf: host_ports_of(g, leaf) for leaf in ls}
    out: list[Probe] = []
    pid = first_id
    for i, src in enumerate(ls):
        if not hosts[src]:
            continue
        port, shost, smac, sip = hosts[src][0]
        for j in range(1, min(fanout, len(ls) - 1) + 1):
            dst = ls[(i + j) % len(ls)]
            if not hosts[dst]:
                continue
            _dport, dhost, dmac, dip = hosts[dst][0]
            if mode == "hosts" and delivered is not None and not delivered(dhost, shost, sip, PROBE_PORT):
                continue
            for sport in sports(branches):
                if delivered is not None and not delivered(shost, dhost, dip, sport):
                    continue
                out.append(Probe(pid, plane, src, port, shost, smac, sip, dst, dhost, dmac, dip, sport, mode))
                pid += 1
    return out


def evaluate(plane: int, sent: Iterable[Probe], arrivals: Mapping[int, str]) -> StageResult:
    """``arrivals``: probe id -> the leaf where it (hosts mode: its answer) was caught."""
    sent = list(sent)
    missing = tuple(p.probe_id for p in sent if p.probe_id not in arrivals)
    wrong = tuple((p.probe_id, arrivals[p.probe_id]) for p in sent
                  if p.probe_id in arrivals and arrivals[p.probe_id] != p.catch_leaf)
    return StageResult(plane, len(sent), sum(p.probe_id in arrivals for p in sent), missing, wrong)


@dataclass
class Rollout:
    """The stages and how far they got. ``phase``: "install" (the stage's switches are being installed),
    "probe" (probes sent, waiting), "done"."""
    planes: list[int]
    probe: str = "hosts"           # PROBE_MODES: where its probes end
    index: int = 0
    phase: str = "install"
    results: list[StageResult] = field(default_factory=list)
    passed: list[int] = field(default_factory=list)
    rolled_back: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, planes: Iterable[int], probe: str = "hosts") -> Rollout:
        order = stages(planes)
        return cls(order, probe, phase="install" if order else "done")

    @property
    def current(self) -> int | None:
        return self.planes[self.index] if self.index < len(self.planes) else None

    def allowed(self) -> set[int]:
        """The planes whose switches may be installed now: those that passed and the current stage."""
        return set(self.passed) | ({self.current} if self.current is not None else set())

    def finish(self, result: StageResult) -> None:
        """Record the current stage's result and move on."""
        self.results.append(result)
        (self.passed if result.ok else self.rolled_back).append(result.plane)
        self.index += 1
        self.phase = "install" if self.index < len(self.planes) else "done"

    def as_dict(self) -> dict:
        return {"planes": self.planes, "probe": self.probe, "done": self.phase == "done", "passed": self.passed,
                "rolled_back": self.rolled_back, "stages": [r.as_dict() for r in self.results]}

