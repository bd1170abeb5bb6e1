"""Reachability walks as plain values: which pairs to try, the scripts that try them, and
the parsers of what came back. Pure: no root, no Mininet (the harness runs the scripts).

Two walks:

``ping``      one ICMP echo per host-port pair on the same plane (``ping_lines`` /
              ``parse_ping``): fast, but the switches spread ICMP by the source address,
              so each pair exercises one multipath branch.
``branches``  UDP probes from every host port to every other on its plane with one
              source port per entropy pattern the switches match (``entropy_patterns``
              reads them from the switches' entropy table, ``source_ports`` makes one
              port per combination): every multipath branch of every pair is walked.
              ``probe_plan`` says what each host sends and listens on; each host runs
              ``python -m hpnlab.fabric.emulation.udp probe PLAN`` and prints one JSON
              line, ``parse_probe`` reads it and ``branch_report`` says per (pair,
              branch) whether it arrived.
"""
from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

import networkx as nx

from hpnlab.fabric.emulation.mn import host_interfaces
from hpnlab.fabric.scenario import graph as fgraph

PROBE_PORT = 47_000          # the probes' UDP destination port
SOURCE_PORT_BASE = 0xC000    # entropy source ports: this base with the matched bits set per pattern
MAX_BRANCHES = 256           # at most this many source ports per pair (a bound on the walk's time)
PING_BATCH = 8               # pings one source host runs at once


class Pair(NamedTuple):
    src: str
    src_ip: str
    dst: str
    dst_ip: str


def all_pairs(graph: nx.MultiGraph) -> list[Pair]:
    """Every ordered pair of host ports (of different hosts) on the same plane."""
    hosts = fgraph.hosts(graph)
    ports = {h: host_interfaces(graph, h) for h in hosts}
    return [Pair(a, pa["ip"], b, pb["ip"]) for a in hosts for b in hosts if a != b
            for pa in ports[a] for pb in ports[b] if pa["plane"] == pb["plane"]]


# ---- ping ------------------------------------------------------------------------------

def ping_lines(pairs: Iterable[tuple[str, str, str, str]], count: int = 1, wait_s: int = 2,
               batch: int = PING_BATCH) -> list[str]:
    """A shell script (one source host's pairs) that pings each pair from its source address,
    ``batch`` at once, and prints ``OK sip dip`` or ``NO sip dip`` per pair."""
    lines = []
    for i, (_, sip, _, dip) in enumerate(pairs):
        lines.append(f"(ping -n -q -c {count} -W {wait_s} -I {sip} {dip} >/dev/null 2>&1 "
                     f"&& echo OK {sip} {dip} || echo NO {sip} {dip}) &")
        if i % batch == batch - 1:
            lines.append("wait")
    lines.append("wait")
    return lines


def parse_ping(text: str) -> set[tuple[str, str]]:
    """(source ip, destination ip) of every pair a ping script reported OK."""
    ok = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "OK":
            ok.add((parts[1], parts[2]))
    return ok


def failed_pairs(pairs: Iterable[tuple[str, str, str, str]], ok: set[tuple[str, str]]) -> list:
    return [p for p in pairs if (p[1], p[3]) not in ok]


# ---- entropy branches --------------------------------------------------------------------

_NUM = r"(0x[0-9a-fA-F]+|\d+)"
_SPORT = re.compile(rf"\b(?:udp_src|tp_src)={_NUM}(?:/{_NUM})?")


def entropy_patterns(flow_dump: str) -> set[tuple[int, int]]:
    """(value, mask) of every UDP source-port match in ``ovs-ofctl dump-flows`` output."""
    out = set()
    for line in flow_dump.splitlines():
        if "udp" not in line:
            continue
        m = _SPORT.search(line)
        if m:
            value = int(m.group(1), 0)
            mask = int(m.group(2), 0) if m.group(2) else 0xFFFF
            out.add((value & mask, mask))
    return out


def source_ports(patterns: Iterable[tuple[int, int]], base: int = SOURCE_PORT_BASE,
                 limit: int = MAX_BRANCHES) -> list[int]:
    """Source ports that together hit every pattern, and every combination of patterns with
    disjoint masks (a leaf's bits and a spine's bits): one port per branch of a path.

    Masks are grouped; ports are the product of each group's values set into ``base``
    (conflicting overlaps are skipped). No patterns (no multipath): one port."""
    by_mask: dict[int, set[int]] = {}
    for value, mask in patterns:
        by_mask.setdefault(mask, set()).add(value & mask)
    # masks that overlap are merged: their values must agree on the common bits
    groups: list[tuple[int, set[int]]] = []
    for mask, values in sorted(by_mask.items()):
        for i, (gmask, gvalues) in enumerate(groups):
            if gmask & mask:
                merged = {a | b for a in gvalues for b in values if (a ^ b) & gmask & mask == 0}
                groups[i] = (gmask | mask, merged)
                break
        else:
            groups.append((mask, set(values)))
    union = 0
    for gmask, _ in groups:
        union |= gmask
    start = base & ~union & 0xFFFF
    ports = []
    for combo in itertools.product(*[sorted(v) for _, v in groups]):
        port = start
        for value in combo:
            port |= value
        if 0 < port != PROBE_PORT and port not in ports:
            ports.append(port)
        if len(ports) >= limit:
            break
    return ports or [base]


def probe_plan(pairs: Iterable[tuple[str, str, str, str]], sports: list[int], listen: dict[str, list[str]],
               repeat: int = 3, gap_s: float = 0.05, settle_s: float = 1.0,
               dport: int = PROBE_PORT) -> dict[str, dict[str, Any]]:
    """Per host: the addresses it listens on and the (source ip, destination ip, source port)
    probes it sends, each ``repeat`` times ``gap_s`` apart; it listens ``settle_s`` after its
    last send. Every host of ``listen`` gets a plan (it may only receive)."""
    plans: dict[str, dict[str, Any]] = {h: {"listen": ips, "port": dport, "send": [], "repeat": repeat,
                                            "gap_s": gap_s, "settle_s": settle_s} for h, ips in listen.items()}
    for src, sip, _, dip in pairs:
        plans[src]["send"] += [[sip, dip, sp] for sp in sports]
    return plans


def probe_seconds(plan: dict[str, Any]) -> float:
    """How long one host's probe runs after 'go' (the walk's time bound)."""
    return plan["repeat"] * plan["gap_s"] + plan["settle_s"]


def parse_probe(text: str) -> set[tuple[str, int, str]]:
    """(source ip, source port, destination ip) of every probe a host received (its last JSON line)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            return {(s, int(p), d) for s, p, d in data.get("received", [])}
    return set()


def branch_report(pairs: Iterable[tuple[str, str, str, str]], sports: list[int],
                  received: set[tuple[str, int, str]]) -> dict[str, Any]:
    """Per (pair, branch): arrived or not. ``missing`` lists (src, src ip, dst, dst ip, source port)."""
    pairs = list(pairs)
    missing = [(a, sip, b, dip, sp) for a, sip, b, dip in pairs for sp in sports if (sip, sp, dip) not in received]
    return {"pairs": len(pairs), "branches": len(sports), "source_ports": list(sports),
            "probes": len(pairs) * len(sports), "arrived": len(pairs) * len(sports) - len(missing),
            "missing": missing}
