"""The wiring check, pure: the links LLDP observed held against the scenario's graph.

The controller (controller/app.py) sends an LLDP frame out of every port of every switch it
knows (chassis id: the datapath id; port id: the OpenFlow port number) and a table-0 rule
sends every LLDP frame a switch receives back to it, so each packet-in says "port P of
switch B received what port Q of switch A sent": one *observation* (``Observed`` maps the
receiving (switch, port) to the sending one). This module compares those observations with
the links the graph expects between switches and decides what may be installed.

Findings, by switch and port (one line each, ``Finding.line``):

missing     an expected link on which no LLDP was seen from either end (cable pulled,
            switch not connected, port down). Routing treats it as a failed link.
miswired    a port that sees a neighbour other than the one the graph puts there; when two
            expected cables are seen crossed (A-B and C-D observed as A-D and C-B) the line
            names both cables as swapped.
unexpected  a port the graph gives no switch neighbour (a host port or an unused port) that
            sees a switch, or LLDP from a datapath that is not in the scenario.

What may be installed (``decide``), by ``--on-miswire``:

refuse      (default) nothing that a miswiring would break: every port of a miswired or
            missing cable, and every used port with an unexpected neighbour, is held down, so
            the compiler routes around them as around failed links (de-aggregating where it
            must) and no installed route sends a packet over a wrong cable. Pairs that are left
            with no way get no route (dropped at their first switch), never a wrong one.
planes      only the planes that check out (no miswired port and no unexpected neighbour on a
            used port) are installed at all; missing links of the planes installed count as
            failed links. The other planes' switches stay empty (hosts use their other planes).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import networkx as nx

MODES = ("refuse", "planes")
KINDS = ("missing", "miswired", "unexpected")

Port = tuple[str, int]          # (switch name, OpenFlow port)
Observed = Mapping[Port, Port]  # receiving port -> the sending port it heard


@dataclass(frozen=True)
class Finding:
    """One finding at one switch port. ``expected``/``observed``: the neighbour port the graph puts
    there and the one LLDP saw (None: none). ``swapped_with``: for a miswired port whose cable is seen
    crossed with another expected cable, that cable (its two ends)."""
    kind: str
    switch: str
    port: int
    expected: Port | None = None
    observed: Port | None = None
    swapped_with: tuple[Port, Port] | None = None
    planes: tuple[int, ...] = ()
    note: str = ""

    def line(self) -> str:
        where = _p((self.switch, self.port))
        if self.kind == "missing":
            return f"missing: {where} -> {_p(self.expected)}: no LLDP seen on either end{self.note}"
        if self.kind == "miswired":
            text = f"miswired: {where} expected {_p(self.expected)}, sees {_p(self.observed)}"
            if self.swapped_with is not None:
                a, b = self.swapped_with
                text += f" (cable {where}-{_p(self.expected)} swapped with cable {_p(a)}-{_p(b)})"
            return text + self.note
        return f"unexpected: {where} sees {_p(self.observed)}{self.note}"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "switch": self.switch, "port": self.port,
                "expected": list(self.expected) if self.expected else None,
                "observed": list(self.observed) if self.observed else None,
                "swapped_with": [list(p) for p in self.swapped_with] if self.swapped_with else None,
                "planes": list(self.planes), "line": self.line()}


def _p(port: Port | None) -> str:
    if port is None:
        return "nothing"
    if port[1] < 0:      # a port given by a name its switch has not resolved (controller/deployment.py)
        return f"{port[0]} port (name not resolved)"
    return f"{port[0]} port {port[1]}"


@dataclass(frozen=True)
class Report:
    """Findings (sorted by kind, switch, port) and what the graph expected."""
    findings: tuple[Finding, ...]
    links_expected: int
    links_ok: int

    def counts(self) -> dict[str, int]:
        return {kind: sum(f.kind == kind for f in self.findings) for kind in KINDS}

    def lines(self) -> list[str]:
        return [f.line() for f in self.findings]

    @property
    def clean(self) -> bool:
        return not self.findings


@dataclass(frozen=True)
class Decision:
    """What may be installed: the planes to install and the ports to hold down (routed around)."""
    mode: str
    planes: tuple[int, ...]
    blocked_planes: tuple[int, ...]
    held_down: frozenset[Port] = field(default_factory=frozenset)

    def as_dict(self) -> dict:
        return {"mode": self.mode, "planes": list(self.planes), "blocked_planes": list(self.blocked_planes),
                "held_down": sorted([list(p) for p in self.held_down])}


def expected_links(g: nx.MultiGraph) -> dict[Port, Port]:
    """Every switch-to-switch link of the graph, from both ends: (switch, port) -> (peer, peer port)."""
    out: dict[Port, Port] = {}
    for u, v, d in g.edges(data=True):
        if g.nodes[u]["tier"] == 0 or g.nodes[v]["tier"] == 0:
            continue
        a, b = (u, d["ports"][u]), (v, d["ports"][v])
        out[a], out[b] = b, a
    return out


def used_ports(g: nx.MultiGraph) -> set[Port]:
    """Every switch port the graph uses (towards a switch or a host)."""
    return {(n, d["ports"][n]) for u, v, d in g.edges(data=True) for n in (u, v) if g.nodes[n]["tier"] > 0}


def plane_of(g: nx.MultiGraph, switch: str) -> int | None:
    return g.nodes[switch].get("plane", 0) if switch in g.nodes and g.nodes[switch]["tier"] > 0 else None


def heard(g: nx.MultiGraph) -> dict[Port, Port]:
    """What LLDP hears on a cabling given as a graph (both directions of every switch-to-switch
    cable; OpenFlow ports are an edge's ``ofports`` where it has them, else its ``ports``)."""
    out: dict[Port, Port] = {}
    for u, v, d in g.edges(data=True):
        if g.nodes[u]["tier"] == 0 or g.nodes[v]["tier"] == 0:
            continue
        ports = d.get("ofports", d["ports"])
        out[u, ports[u]], out[v, ports[v]] = (v, ports[v]), (u, ports[u])
    return out


def compare(g: nx.MultiGraph, observed: Observed) -> Report:
    """The observed wiring held against the graph's switch-to-switch links."""
    expected = expected_links(g)
    used = used_ports(g)

    def planes(*ports: Port | None) -> tuple[int, ...]:
        return tuple(sorted({p for port in ports if port is not None
                             for p in [plane_of(g, port[0])] if p is not None}))

    findings: list[Finding] = []
    ok = 0
    wrong: dict[Port, Port | None] = {}   # port -> what it sees, for ports seeing the wrong neighbour
    for a, b in sorted(expected.items()):
        if a > b:
            continue
        seen_a, seen_b = observed.get(a), observed.get(b)
        if seen_a is None and seen_b is None:
            findings.append(Finding("missing", a[0], a[1], b, None, planes=planes(a, b)))
            findings.append(Finding("missing", b[0], b[1], a, None, planes=planes(a, b)))
            continue
        if all(seen is None or seen == peer for seen, peer in ((seen_a, b), (seen_b, a))):
            ok += 1      # seen from one end or both, and nothing contradicts it
            continue
        for end, seen, peer in ((a, seen_a, b), (b, seen_b, a)):
            if seen != peer:
                wrong[end] = seen
    # the ends that see nothing or the wrong neighbour, on cables where something contradicts the graph
    for port, seen in sorted(wrong.items()):
        exp = expected[port]
        swapped = _swap_partner(port, seen, expected, observed)
        findings.append(Finding("miswired", port[0], port[1], exp, seen, swapped,
                                planes=planes(port, exp, seen)))
    for port, seen in sorted(observed.items()):
        if port in expected or port[0] not in g.nodes:
            continue     # a port outside the scenario: it shows up where it is the sender
        note = " (the scenario puts a host there)" if port in used else " (a port the scenario does not use)"
        findings.append(Finding("unexpected", port[0], port[1], None, seen, planes=planes(port, seen), note=note))
    order = {k: i for i, k in enumerate(KINDS)}
    findings.sort(key=lambda f: (order[f.kind], f.switch, f.port))
    links = sum(1 for a, b in expected.items() if a < b)
    return Report(tuple(findings), links, ok)


def _swap_partner(port: Port, seen: Port | None, expected: Mapping[Port, Port],
                  observed: Observed) -> tuple[Port, Port] | None:
    """For a port A expected to B that sees D: when D is expected to some C and C sees B (or
    nothing seen at C contradicts: C sees B), cables A-B and C-D are swapped: returns (C, D)."""
    if seen is None or seen not in expected:
        return None
    exp = expected[port]
    partner = expected[seen]               # C, whose cable to D was expected
    if observed.get(partner) == exp or observed.get(exp) == partner:
        return (partner, seen)
    return None


#: LLDP goes out of every port of every switch this often: until the wiring is decided, and after
LLDP_DISCOVERY_EVERY_S, LLDP_EVERY_S = 1.0, 5.0
#: an LLDP observation this old is forgotten: the link counts as missing until it is heard again
STALE_S = 16.0


def lldp_due(last_sent: Mapping[str, float], switches: Iterable[str], now: float, decided: bool) -> list[str]:
    """The switches whose LLDP is due (pure): never sent, or last sent ``LLDP_EVERY_S`` ago or more
    (``LLDP_DISCOVERY_EVERY_S`` until the wiring is decided). Each switch keeps its own time, so a
    switch that sends out of turn (a port of it came up: who is on the other end now?) puts off no
    other. Before 2026-12-04 one time was shared: a port coming up every few seconds on one switch
    stopped every other switch's LLDP, and ``STALE_S`` later the controller held every link it had
    not heard again down as missing and routed around them (the failover probe, failing one link
    every 6 s, lost 1.9 s of its flows, on every link of the fabric but that switch's)."""
    every = LLDP_EVERY_S if decided else LLDP_DISCOVERY_EVERY_S
    return [sw for sw in switches if now - last_sent.get(sw, -math.inf) >= every]


#: Open vSwitch retries a lost controller connection with a backoff of up to 8 s (``max_backoff``)
SWITCH_WAIT_S = 8.0


def settled(quiet_s: float, discovery_s: float, connected: int, expected: int) -> bool:
    """Has discovery learnt all it will (when it is not complete: some expected link unheard)? Nothing
    new learnt for ``discovery_s``, or, while fewer switches than the scenario's have connected, for
    ``discovery_s + SWITCH_WAIT_S``: after a controller restart the switches come back as their
    reconnect backoff allows, and deciding without one would hold its links down as missing and
    reroute switches that hold the right tables (flow-mods for nothing, twice)."""
    return quiet_s >= discovery_s + (SWITCH_WAIT_S if connected < expected else 0.0)


def release_ungated(read_back: int, held_entries: int, connected: int, told: int, expected: int, quiet_s: float,
                    discovery_s: float) -> bool:
    """``--on-miswire off`` (no LLDP): may the controller send its changes yet? A controller that restarts
    beside switches that kept their tables (a failure among them) must not change a switch before it knows
    the links the others report down, or it sends changes that it then undoes. So changes wait until the
    wiring has been observed as far as it can be without LLDP -- every switch of the scenario connected and
    its port states told (``connected``, ``told``, ``expected``) -- or until discovery settled as with the
    gate on (``settled``). A first start is not held: once a switch has been read back (``read_back``) and
    none held any entry (``held_entries``), there is nothing that installing early could undo."""
    if read_back > 0 and held_entries == 0:
        return True
    if connected >= expected and told >= expected:
        return True
    return settled(quiet_s, discovery_s, connected, expected)


def decide(g: nx.MultiGraph, report: Report, mode: str = "refuse", hold_planes: Iterable[int] = ()) -> Decision:
    """The planes to install and the ports to hold down, given the report (see the module docstring).
    ``hold_planes``: planes held back whatever the mode (a switch of theirs whose deployment does not
    check out, e.g. a port name the switch does not have: controller/deployment.py)."""
    if mode not in MODES:
        raise ValueError(f"unknown miswiring mode {mode!r}: one of {', '.join(MODES)}")
    all_planes = sorted({d.get("plane", 0) for _n, d in g.nodes(data=True) if d["tier"] > 0})
    used = used_ports(g)
    harmful = [f for f in report.findings
               if f.kind == "miswired" or (f.kind == "unexpected" and (f.switch, f.port) in used)]
    blocked = sorted(({p for f in harmful for p in f.planes} if mode == "planes" else set()) | set(hold_planes))
    held = {(f.switch, f.port) for f in report.findings if f.kind == "missing" or f in harmful}
    if mode == "refuse":
        # both ends of a miswired port's expected cable: the compiler's link is failed either way
        held |= {f.expected for f in harmful if f.expected is not None}
    planes = tuple(p for p in all_planes if p not in blocked)
    held = {p for p in held if plane_of(g, p[0]) in planes}
    return Decision(mode, planes, tuple(blocked), frozenset(held))


def report_dict(report: Report, decision: Decision) -> dict:
    """The JSON the controller writes (the harness reads it into the run's metadata)."""
    return {"links_expected": report.links_expected, "links_ok": report.links_ok, "counts": report.counts(),
            "findings": [f.as_dict() for f in report.findings], "decision": decision.as_dict()}
