"""The wiring gate in the os-ken app, on fake datapaths (no root, no switch): LLDP goes out of every
port, the frames are delivered back as packet-ins where a cabling (hpnlab.fabric.emulation.rewire)
puts the peer port, and the app installs only what the wiring decision allows."""
from __future__ import annotations

import json
import time
import types

import pytest

pytest.importorskip("os_ken")

from os_ken.controller import ofp_event
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from support.fake_switch import Fabric, FakeDatapath, scenario, wipes

from hpnlab.controller import app as ctlapp
from hpnlab.controller import codec, wiring_manager
from hpnlab.fabric.emulation.rewire import Rewire, physical
from hpnlab.fabric.scenario import graph, spec

SWAP = (("p0l0", "p0s0"), ("p0l1", "p0s1"))
DROP = ("p0l2", "p0s0")


def test_every_port_sends_lldp_and_a_table0_rule_sends_lldp_back(make_app):
    app = make_app()
    dp = FakeDatapath(scenario().nodes["p0l0"]["dpid"])
    app.on_features(ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(dp, datapath_id=dp.id)))
    first = dp.take()
    ask = [m for m in first if isinstance(m, parser.OFPFlowStatsRequest) and m.cookie == codec.LLDP_COOKIE]
    assert len(ask) == 1                           # is the LLDP rule there already? (none: a fresh switch)
    assert [m for m in first if isinstance(m, parser.OFPFlowMod)] == []     # no rule before the answer
    reply = parser.OFPFlowStatsReply(dp, body=[])
    reply.xid, reply.flags = ask[0].xid, 0
    app.on_flow_stats(ofp_event.EventOFPFlowStatsReply(reply))
    rule = [m for m in dp.take() if isinstance(m, parser.OFPFlowMod)]
    assert [(m.table_id, m.priority, dict(m.match.items())) for m in rule] == [(0, 65535, {"eth_type": 0x88CC})]
    body = [parser.OFPPort(port_no=p, hw_addr="02:00:00:00:00:01", name=b"x", config=0, state=ofp.OFPPS_LIVE,
                           curr=0, advertised=0, supported=0, peer=0, curr_speed=0, max_speed=0) for p in (1, 5, 6)]
    app.on_port_desc(ofp_event.EventOFPPortDescStatsReply(parser.OFPPortDescStatsReply(dp, body=body)))
    outs = [m for m in dp.take() if isinstance(m, parser.OFPPacketOut)]
    assert sorted(m.actions[0].port for m in outs) == [1, 5, 6]
    assert {codec.parse_lldp(m.data) for m in outs} == {(dp.id, 1), (dp.id, 5), (dp.id, 6)}


def test_nothing_is_installed_before_the_wiring_is_decided(make_app):
    app = make_app()
    net = Fabric(app, physical(scenario(), Rewire(drop=[DROP])))    # never complete: waits for the deadline
    net.connect()
    assert app.wiring.decision is None
    assert sum(wipes(m) for m in net.installed.values()) == 0


def test_a_fabric_cabled_as_planned_is_installed_as_soon_as_every_link_is_heard(make_app, tmp_path):
    app = make_app()
    net = Fabric(app, scenario())
    net.connect()
    assert app.wiring.decision is not None and app.wiring.report.clean
    assert all(wipes(m) == 1 for m in net.installed.values())
    net.settle()
    assert app.reconciler.settled and app.reconciler.down_ports == set()
    report = json.loads((tmp_path / "wiring.json").read_text())
    assert report["counts"] == {"missing": 0, "miswired": 0, "unexpected": 0} and report["links_ok"] == 16


def test_the_report_says_installed_only_once_every_switch_holds_its_routes(make_app, tmp_path):
    app = make_app()
    net = Fabric(app, scenario())
    net.connect()
    assert json.loads((tmp_path / "wiring.json").read_text())["installed"] is None   # decided, not yet confirmed
    net.settle()
    installed = json.loads((tmp_path / "wiring.json").read_text())["installed"]
    assert app.reconciler.settled and installed["switches"] == len(net.dps)


def test_refuse_installs_every_switch_and_holds_the_miswired_ports_down(make_app, tmp_path):
    app = make_app("refuse")
    net = Fabric(app, physical(scenario(), Rewire(swap=[SWAP], drop=[DROP])))
    net.connect()
    app.wiring.decide()       # the discovery deadline
    net.deliver()
    assert app.wiring.report.counts() == {"missing": 2, "miswired": 4, "unexpected": 0}
    assert all(wipes(m) == 1 for m in net.installed.values())
    held = {("p0l0", 5), ("p0s0", 1), ("p0l1", 6), ("p0s1", 2), ("p0l2", 5), ("p0s0", 3)}
    assert app.reconciler.down_ports == held
    net.settle()
    assert app.reconciler.settled
    lines = [f["line"] for f in json.loads((tmp_path / "wiring.json").read_text())["findings"]]
    assert len(lines) == 6 and sum("swapped" in line for line in lines) == 4


def test_planes_installs_only_the_plane_that_checks_out(make_app):
    app = make_app("planes")
    net = Fabric(app, physical(scenario(), Rewire(swap=[SWAP])))
    net.connect()
    app.wiring.decide()
    net.deliver()
    assert app.wiring.decision.planes == (1,)
    assert {n for n, m in net.installed.items() if wipes(m)} == {n for n in net.dps if n.startswith("p1")}
    assert app.wiring.released == {n for n in net.dps if n.startswith("p1")}


def test_a_cable_put_right_later_is_no_longer_held_down(make_app):
    app = make_app("refuse")
    wrong = Fabric(app, physical(scenario(), Rewire(drop=[DROP])))
    wrong.connect()
    app.wiring.decide()
    assert app.reconciler.down_ports == {("p0l2", 5), ("p0s0", 3)}
    right = Fabric(app, scenario())       # the same switches, now cabled as planned
    right.dps = wrong.dps
    right.installed = wrong.installed
    for name, port in (("p0l2", 5), ("p0s0", 3)):     # the cable is plugged in: both ports come up
        dp = right.dps[name]
        desc = parser.OFPPort(port_no=port, hw_addr="02:00:00:00:00:01", name=b"x", config=0, state=ofp.OFPPS_LIVE,
                              curr=0, advertised=0, supported=0, peer=0, curr_speed=0, max_speed=0)
        app.on_port_status(ofp_event.EventOFPPortStatus(parser.OFPPortStatus(dp, reason=ofp.OFPPR_ADD, desc=desc)))
    right.deliver()
    app.wiring.decide()
    assert app.wiring.report.clean and app.reconciler.down_ports == set()


def test_a_port_that_keeps_coming_up_on_one_switch_does_not_stop_the_others_lldp(make_app, monkeypatch):
    """Before 2026-12-04 the LLDP of a port coming up reset the fabric-wide LLDP timer: a port coming
    up every 2 s (the failover probe's failures) kept every other switch from sending again, and 16 s
    later the app held all their links down as missing and routed around them."""
    clock = [1000.0]
    for module in (ctlapp, wiring_manager):
        monkeypatch.setattr(module, "time", types.SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    app = make_app()
    fab = Fabric(app, scenario())
    fab.connect()
    assert app.wiring.report is not None and app.wiring.report.clean
    desc = parser.OFPPort(port_no=5, hw_addr="02:00:00:00:00:05", name=b"x", config=0, state=ofp.OFPPS_LIVE,
                          curr=0, advertised=0, supported=0, peer=0, curr_speed=0, max_speed=0)
    for second in range(1, 41):
        clock[0] += 1.0
        if second % 2 == 0:
            msg = parser.OFPPortStatus(fab.dps["p0l0"], reason=ofp.OFPPR_MODIFY, desc=desc)
            app.on_port_status(ofp_event.EventOFPPortStatus(msg))
        app.wiring.tick()
        fab.deliver()
    assert app.wiring.report.clean and app.reconciler.down_ports == set()


def test_deployment_auto_adopts_what_it_hears_and_installs_foreign_switches_without_a_restart(make_app, tmp_path):
    from hpnlab.controller import deployment
    out = tmp_path / "discovered.yaml"
    app = make_app("refuse", deployment="auto", deployment_out=str(out), discovery_s=0,
                   scenario="mini-spine-leaf")        # one plane: told apart by the plan's port numbers
    one_plane = graph.build(spec.load("mini-spine-leaf"))
    net = Fabric(app, physical(one_plane, Rewire(dpid_base=0xAB00000000000000)))
    net.connect()
    assert len(app.adoption.strangers) == 10 and app.wiring.released == set()     # none known before discovery settles
    app.wiring.tick()         # discovery settled (nothing new learnt for the discovery time, here 0 s)
    net.deliver()
    assert app.adoption.strangers == {} and app.wiring.released == set(net.dps) and app.wiring.report.clean
    assert all(wipes(m) == 1 for m in net.installed.values())       # each read back once, then installed
    assert "10 on datapath ids of their own" in app.adoption.adopted
    data = deployment.load(one_plane, out)                           # the file written: no mistake
    assert {deployment.parse_dpid(e["dpid"]) for e in data["switches"].values()} == {
        0xAB00000000000000 + i for i in range(10)}
    net.settle()
    assert app.reconciler.settled and app.reconciler.down_ports == set()
    assert {n: app.graph.nodes[n]["dpid"] for n in net.dps} == {n: dp.id for n, dp in net.dps.items()}


def arp_frame(port: dict) -> bytes:
    """The ARP request a host sends out of ``port`` (graph.host_ports' entry) for the first address of its plane."""
    from os_ken.lib.packet import arp, ethernet, packet
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst="ff:ff:ff:ff:ff:ff", src=port["mac"], ethertype=0x0806))
    pkt.add_protocol(arp.arp(opcode=1, src_mac=port["mac"], src_ip=port["ip"], dst_ip="10.0.0.1"))
    pkt.serialize()
    return bytes(pkt.data)


@pytest.mark.parametrize("stray_first", [False, True], ids=["hosts", "stray-mac-first"])
def test_deployment_auto_tells_identical_planes_apart_by_the_hosts_behind_the_leaves(make_app, tmp_path,
                                                                                     stray_first):
    """mini-hpn on datapath ids of its own: its two planes look alike to LLDP. Strangers get the leaves'
    ARP-to-controller entry; once a host behind every leaf has sent an ARP request, the map is adopted with
    each leaf on the datapath its hosts are behind -- also when a frame from a MAC the scenario does not
    know reached those ports first (it does not hold the port against the host's own)."""
    app = make_app("refuse", deployment="auto", deployment_out=str(tmp_path / "d.yaml"),
                   discovery_s=0)
    cabling = physical(scenario(), Rewire(dpid_base=0xAB00000000000000))
    net = Fabric(app, cabling)
    net.connect()
    arp_rules = {n: [m for m in msgs if isinstance(m, parser.OFPFlowMod) and m.match.get("eth_type") == 0x0806]
                 for n, msgs in net.installed.items()}
    assert all(len(rules) == 1 and rules[0].cookie == codec.COOKIE for rules in arp_rules.values()), arp_rules
    app.wiring.tick()
    net.deliver()
    assert app.adoption.adopted is None and len(app.adoption.strangers) == 12        # which leaf is which: not yet
    first: dict[str, dict] = {}
    for h in graph.hosts(cabling):
        for p in graph.host_ports(cabling, h):
            first.setdefault(p["leaf"], p)
    for leaf, p in sorted(first.items()):
        if stray_first:
            net.packet_in(leaf, p["leaf_port"], arp_frame({**p, "mac": "02:00:00:00:99:99"}))
        net.packet_in(leaf, p["leaf_port"], arp_frame(p))
    app.wiring.tick()
    net.deliver()
    assert app.adoption.adopted is not None and "12 on datapath ids of their own" in app.adoption.adopted
    assert app.adoption.strangers == {} and app.wiring.released == set(net.dps) and app.wiring.report.clean
    leaves = [n for n in net.dps if cabling.nodes[n]["tier"] == 1]
    assert {n: app.graph.nodes[n]["dpid"] for n in leaves} == {n: net.dps[n].id for n in leaves}


def named_deployment(tmp_path, rewire: Rewire, edit=None) -> str:
    import yaml

    from hpnlab.fabric.emulation.rewire import deployment as rewire_deployment
    data = rewire_deployment(scenario(), rewire)
    if edit:
        edit(data)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


NAMED = Rewire(dpid_base=0xAB00000000000000, port_offset=100, port_names=True)


def test_port_names_are_resolved_as_switches_connect_and_routes_installed_on_their_numbers(make_app, tmp_path):
    app = make_app("refuse", deployment=named_deployment(tmp_path, NAMED))
    net = Fabric(app, physical(scenario(), Rewire(dpid_base=NAMED.dpid_base, port_offset=100)))
    net.connect()              # names resolved, discovery complete on the resolved numbers: decided
    assert app.wiring.decision is not None and app.wiring.report.clean
    assert all(wipes(m) == 1 for m in net.installed.values())
    net.settle()
    assert app.reconciler.settled and app.reconciler.down_ports == set()
    assert app.adoption.resolved["p0l0"] == {p: p + 100 for p in range(1, 7)}
    groups = app.reconciler.states["p0l3"].groups
    assert {w for grp in groups for w, _acts in grp.buckets if isinstance(w, int)} == {105, 106}


def test_telemetry_and_weighted_sets_follow_the_ports_a_deployment_resolves_at_run_time(make_app, tmp_path):
    app = make_app("refuse", deployment=named_deployment(tmp_path, NAMED), telemetry_interval_ms=200,
                   routing_weights="weighted")
    net = Fabric(app, physical(scenario(), Rewire(dpid_base=NAMED.dpid_base, port_offset=100)))
    net.connect()
    assert {port for sw, port in app.telemetry.ecn.telemetry.ports if sw == "p0l0"} == set(range(101, 107))
    net.settle()
    ports = {p for es in app.telemetry.weighted.sets().get("p0l3", {}).values() for p in es.ports}
    assert ports == {105, 106}


def test_the_ecn_stage_is_read_under_the_numbers_a_deployment_resolves_at_run_time(make_app, tmp_path):
    """The emulated ECN stage knows its ports by the scenario's numbers (p0l0-eth6 is p0l0 port 6); once the
    names resolve to 101-106, its counters reach telemetry under those."""
    from types import SimpleNamespace
    app = make_app("refuse", deployment=named_deployment(tmp_path, NAMED), telemetry_interval_ms=200,
                   ecn_actuator="emulated")
    net = Fabric(app, physical(scenario(), Rewire(dpid_base=NAMED.dpid_base, port_offset=100)))
    net.connect()
    assert app.telemetry.ecn is not None
    assert app.telemetry.ecn.stage_keys[("p0l0", 6)] == ("p0l0", 106)

    class Stage:
        mechanism = "bpf"

        def __init__(self):
            self.ports = {"p0l0-eth6": SimpleNamespace(switch="p0l0", port=6)}

        def thresholds(self, intf):
            return {"kmin": 6000, "kmax": 24000, "pmax": 0.2}

        def counters(self, since=None):
            return {"p0l0-eth6": {"bytes": 10, "packets": 2, "ect": 2, "ce_marked": 1, "queue_bytes": 1500}}

        def queue_drops(self):
            return {}
    app.telemetry.ecn._open_stage = lambda run: Stage()
    app.telemetry.ecn.tick(1.0, list(app.datapaths))
    assert app.telemetry.ecn.last[("p0l0", 106)].queue_bytes == 1500


def test_a_port_name_the_switch_lacks_is_one_line_and_holds_its_plane_back(make_app, tmp_path, caplog):
    def rename(data):
        data["switches"]["p1l0"]["ports"][5] = "Ethernet5"
    app = make_app("refuse", deployment=named_deployment(tmp_path, NAMED, rename))
    net = Fabric(app, physical(scenario(), Rewire(dpid_base=NAMED.dpid_base, port_offset=100)))
    net.connect()
    app.wiring.decide()       # the discovery deadline (p1l0's uplink cannot be checked)
    net.deliver()
    assert app.wiring.decision.planes == (0,) and app.wiring.decision.blocked_planes == (1,)
    assert {n for n, m in net.installed.items() if wipes(m)} == {n for n in net.dps if n.startswith("p0")}
    errors = json.loads((tmp_path / "wiring.json").read_text())["deployment"]["errors"]
    assert len(errors) == 1 and "switch p1l0" in errors[0] and "no port named 'Ethernet5'" in errors[0]
    assert sum("no port named 'Ethernet5'" in r.getMessage() for r in caplog.records) == 1


def test_a_switch_that_still_holds_the_lldp_rule_does_not_get_it_again(make_app):
    """A restarted controller re-adds nothing the switch holds (an add would reset the rule)."""
    app = make_app()
    dp = FakeDatapath(scenario().nodes["p0l0"]["dpid"])
    app.on_features(ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(dp, datapath_id=dp.id)))
    ask = next(m for m in dp.take() if isinstance(m, parser.OFPFlowStatsRequest) and m.cookie == codec.LLDP_COOKIE)
    held = parser.OFPFlowStats(table_id=0, duration_sec=5, duration_nsec=0, priority=65535, idle_timeout=0,
                               hard_timeout=0, flags=0, cookie=codec.LLDP_COOKIE, packet_count=0, byte_count=0,
                               match=parser.OFPMatch(eth_type=0x88CC), instructions=[])
    reply = parser.OFPFlowStatsReply(dp, body=[held])
    reply.xid, reply.flags = ask.xid, 0
    app.on_flow_stats(ofp_event.EventOFPFlowStatsReply(reply))
    assert [m for m in dp.take() if isinstance(m, parser.OFPFlowMod)] == []


def test_port_names_without_the_wiring_gate_install_each_switch_once_its_names_are_resolved(make_app, tmp_path):
    app = make_app("off", deployment=named_deployment(tmp_path, NAMED))
    net = Fabric(app, physical(scenario(), Rewire(dpid_base=NAMED.dpid_base, port_offset=100)))
    net.connect()
    assert app.wiring.released == set(net.dps) and app.adoption.errors == {}
    net.settle()
    assert app.reconciler.settled and app.reconciler.down_ports == set()
    assert all(p > 100 for sw in net.dps for f in app.reconciler.states[sw].flows for a in f.actions
               if a[0] == "output" for p in [a[1]])
