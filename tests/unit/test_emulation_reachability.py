"""Reachability walks as pure values (no root): pairs, ping scripts and their parsing, the
entropy branches read from the switches' flow tables, probe plans and the per-branch report."""
from __future__ import annotations

import json

from hpnlab.fabric.emulation import reachability as r
from hpnlab.fabric.emulation.mn import host_interfaces
from hpnlab.fabric.emulation.udp import probe
from hpnlab.fabric.routing.compiler import entropy_flows
from hpnlab.fabric.scenario import graph, spec


def _g(name: str, **over):
    return graph.build(spec.load(name, over))


def test_pairs_are_every_ordered_pair_of_host_ports_on_one_plane():
    g = _g("mini-hpn")
    pairs = r.all_pairs(g)
    s = g.graph["scenario"]
    assert len(pairs) == len(set(pairs)) == s.hosts * (s.hosts - 1) * s.planes
    assert all(p.src != p.dst for p in pairs)
    planes = {p["ip"]: p["plane"] for h in graph.hosts(g) for p in host_interfaces(g, h)}
    assert all(planes[p.src_ip] == planes[p.dst_ip] for p in pairs)


def test_ping_script_runs_at_most_batch_pings_at_once_and_names_each_pair():
    pairs = [("h1", f"10.0.0.{i}", "h2", f"10.0.1.{i}") for i in range(1, 6)]
    lines = r.ping_lines(pairs, count=1, wait_s=2, batch=2)
    assert [line for line in lines if line == "wait"] == ["wait", "wait", "wait"]
    assert sum("ping -n -q -c 1 -W 2 -I 10.0.0.3 10.0.1.3" in line for line in lines) == 1


def test_ping_output_parser_keeps_only_ok_lines():
    out = "OK 10.0.0.1 10.0.1.1\nNO 10.0.0.2 10.0.1.2\nnoise\nOK 10.0.0.3 10.0.1.3 extra\n"
    assert r.parse_ping(out) == {("10.0.0.1", "10.0.1.1")}
    pairs = [("h1", "10.0.0.1", "h2", "10.0.1.1"), ("h1", "10.0.0.2", "h2", "10.0.1.2")]
    assert r.failed_pairs(pairs, r.parse_ping(out)) == [pairs[1]]


DUMP = """\
 table=2, priority=200,udp,metadata=0x1,tp_src=0/0x1 actions=output:3
 table=2, priority=200,udp,metadata=0x1,tp_src=0x1/0x1 actions=output:4
 table=2, priority=200,tcp,metadata=0x1,tp_src=0x1/0x1 actions=output:4
 table=2, priority=100,ip,metadata=0x1,nw_src=0.0.0.1/0.0.0.1 actions=output:4
"""


def test_entropy_patterns_are_read_from_udp_source_port_matches_only():
    assert r.entropy_patterns(DUMP) == {(0, 1), (1, 1)}


def test_one_source_port_per_combination_of_leaf_and_spine_patterns():
    leaf = {(v, 0b11) for v in range(4)}                 # 2 bits at offset 0
    spine = {(v << 5, 0b1 << 5) for v in range(2)}       # 1 bit at offset 5
    ports = r.source_ports(leaf | spine)
    assert len(ports) == len(set(ports)) == 8
    assert {(p & 0b11, p >> 5 & 1) for p in ports} == {(a, b) for a in range(4) for b in range(2)}
    assert all(p & ~0b100011 == r.SOURCE_PORT_BASE & ~0b100011 for p in ports)


def test_every_pattern_the_compiler_installs_is_hit_by_some_source_port():
    # the compiler's own entropy entries (leaf with 3 uplinks, spine with 2), matched by value and mask
    patterns = set()
    for ports, tier in (((1, 2, 3), 1), ((5, 6), 2)):
        for flow in entropy_flows(ports, tier, 7):
            m = dict(flow.match)
            if "udp_src" in m:
                patterns.add(m["udp_src"])
    sports = r.source_ports(patterns)
    for value, mask in patterns:
        assert any(sp & mask == value for sp in sports), (value, mask)


def test_without_multipath_one_source_port_is_walked():
    assert r.source_ports(set()) == [r.SOURCE_PORT_BASE]


def test_probe_plan_sends_every_branch_of_every_pair_from_its_source():
    pairs = [("h1", "10.0.0.1", "h2", "10.0.0.2"), ("h2", "10.0.0.2", "h1", "10.0.0.1")]
    plans = r.probe_plan(pairs, [49152, 49153], {"h1": ["10.0.0.1"], "h2": ["10.0.0.2"]}, repeat=2)
    assert plans["h1"]["send"] == [["10.0.0.1", "10.0.0.2", 49152], ["10.0.0.1", "10.0.0.2", 49153]]
    assert plans["h2"]["listen"] == ["10.0.0.2"] and plans["h2"]["repeat"] == 2
    assert r.probe_seconds(plans["h1"]) == 2 * plans["h1"]["gap_s"] + plans["h1"]["settle_s"]


def test_branch_report_names_each_pair_and_branch_that_did_not_arrive():
    pairs = [("h1", "10.0.0.1", "h2", "10.0.0.2")]
    out = "listening\n" + json.dumps({"sent": 2, "received": [["10.0.0.1", 49152, "10.0.0.2"]]})
    report = r.branch_report(pairs, [49152, 49153], r.parse_probe(out))
    assert (report["probes"], report["arrived"]) == (2, 1)
    assert report["missing"] == [("h1", "10.0.0.1", "h2", "10.0.0.2", 49153)]


def test_probe_program_receives_what_it_sends_over_loopback(monkeypatch, capsys):
    import io
    plan = {"listen": ["127.0.0.1"], "port": 0, "send": [], "repeat": 2, "gap_s": 0.01, "settle_s": 0.2}
    # a free port for the listener, then probes to itself from two source ports
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        plan["port"] = s.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        sports = [a.getsockname()[1], b.getsockname()[1]]
    plan["send"] = [["127.0.0.1", "127.0.0.1", sp] for sp in sports]
    monkeypatch.setattr("sys.stdin", io.StringIO("go\n"))
    result = probe(plan)
    assert capsys.readouterr().out == "listening\n"
    assert result["sent"] == 4
    received = r.parse_probe(json.dumps(result))
    assert received == {("127.0.0.1", sp, "127.0.0.1") for sp in sports}
