"""ARP answered in the switches (responder flows at each leaf, from the address plan), so a host
can resolve its peers while the controller is away: walked through the table interpreter.

Gateway mode (the default): every address of the plane is answered with one gateway MAC, two
flows per host port whatever the plane's size, and the leaf in front of the receiver writes the
receiver's MAC back. Per-host mode: each peer's own MAC, one flow per host port and peer."""
from __future__ import annotations

import pytest
from support.arp import arp_request, plane_ports
from support.fabrics import fabric

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.scenario.addressing import ip_int

MODES = compiler.ARP_MODES


def arp_flows(st: compiler.SwitchState) -> list[compiler.Flow]:
    """A switch's ARP entries other than the catch-all to the controller."""
    return [f for f in st.flows if f.table == compiler.TABLE_CLASSIFY and f.priority > compiler.PRIO_ARP]


def to_controller(net: FabricTables, asker: dict, pkt: dict) -> bool:
    flow = net.lookup(asker["leaf"], compiler.TABLE_CLASSIFY, dict(pkt, in_port=asker["leaf_port"],
                                                                     arp_spa=ip_int(pkt["arp_spa"]),
                                                                     arp_tpa=ip_int(pkt["arp_tpa"])))
    return flow is not None and flow.actions == (("controller",),)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["mini-hpn", "mini-rail", "mini-spine-leaf"])
def test_every_host_port_gets_the_reply_for_every_peer_of_its_plane_back_from_its_leaf(name, mode):
    g = fabric(name)
    net = FabricTables(g, compiler.compile_fabric(g, arp=mode))
    planes = sorted({p["plane"] for h in graph.hosts(g) for p in graph.host_ports(g, h)})
    asked = 0
    for plane in planes:
        ports = plane_ports(g, plane)
        for host, asker in ports:
            for _peer, target in ports:
                if target["ip"] == asker["ip"]:
                    continue
                walk = net.inject(host, asker["intf"], arp_request(asker, target["ip"]))
                assert walk.result == "delivered" and walk.delivered_to == (host, asker["intf"]), walk
                assert [hop[0] for hop in walk.hops] == [asker["leaf"]]      # answered by its own leaf
                reply = walk.packet
                assert reply["arp_op"] == compiler.ARP_REPLY
                mac = compiler.GATEWAY_MAC if mode == "gateway" else target["mac"]
                assert reply["arp_sha"] == reply["eth_src"] == mac
                assert reply["arp_sha"] == compiler.arp_answer(g, asker["leaf"], target["ip"], mode)
                assert reply["arp_spa"] == ip_int(target["ip"])
                assert (reply["arp_tha"], reply["arp_tpa"], reply["eth_dst"]) == (asker["mac"], ip_int(asker["ip"]),
                                                                                  asker["mac"])
                asked += 1
    assert asked == sum(len(plane_ports(g, p)) * (len(plane_ports(g, p)) - 1) for p in planes)


@pytest.mark.parametrize("mode", MODES)
def test_a_request_for_an_address_of_another_plane_still_goes_to_the_controller(mode):
    g = fabric("mini-hpn")
    net = FabricTables(g, compiler.compile_fabric(g, arp=mode))
    host, asker = plane_ports(g, 0)[0]
    other = plane_ports(g, 1)[1][1]["ip"]
    assert to_controller(net, asker, arp_request(asker, other))
    assert net.inject(host, asker["intf"], arp_request(asker, other)).result == "dropped"


def test_per_host_mode_leaves_a_request_for_an_address_of_no_host_to_the_controller():
    g = fabric("mini-hpn")
    net = FabricTables(g, compiler.compile_fabric(g, arp="per-host"))
    _host, asker = plane_ports(g, 0)[0]
    assert ip_int("10.0.0.250") not in {ip_int(p["ip"]) for _h, p in plane_ports(g, 0)}
    assert to_controller(net, asker, arp_request(asker, "10.0.0.250"))


def test_gateway_mode_answers_any_address_of_the_plane_with_the_gateway_mac():
    """A host's or not: an address of no host then drops in the fabric, as it does without ARP."""
    g = fabric("mini-hpn")
    net = FabricTables(g, compiler.compile_fabric(g))
    host, asker = plane_ports(g, 0)[0]
    walk = net.inject(host, asker["intf"], arp_request(asker, "10.0.0.250"))
    assert walk.result == "delivered" and walk.packet["arp_sha"] == compiler.GATEWAY_MAC
    assert walk.packet["arp_spa"] == ip_int("10.0.0.250")


@pytest.mark.parametrize("mode", MODES)
def test_a_reply_goes_to_the_controller(mode):
    g = fabric("mini-hpn")
    net = FabricTables(g, compiler.compile_fabric(g, arp=mode))
    (_h, asker), (_p, peer) = plane_ports(g, 0)[:2]
    assert to_controller(net, asker, dict(arp_request(asker, peer["ip"]), arp_op=compiler.ARP_REPLY))


def test_gateway_mode_never_answers_a_host_about_its_own_address():
    """An announcement (sender = target = its own address) and a probe (sender 0.0.0.0, RFC 5227)
    go to the controller, which does not answer them either: a reply would be an address conflict."""
    g = fabric("mini-hpn")
    net = FabricTables(g, compiler.compile_fabric(g))
    (_h, asker), (_p, peer) = plane_ports(g, 0)[:2]
    assert to_controller(net, asker, arp_request(asker, asker["ip"]))
    assert to_controller(net, asker, arp_request(asker, peer["ip"], sender_ip="0.0.0.0"))
    assert compiler.arp_answer(g, asker["leaf"], asker["ip"], "gateway", asker["leaf_port"]) is None
    assert compiler.arp_answer(g, asker["leaf"], peer["ip"], "gateway", asker["leaf_port"]) == compiler.GATEWAY_MAC


@pytest.mark.parametrize("mode", MODES)
def test_responders_are_on_leaves_only_and_never_change_with_failures(mode):
    g = fabric("mini-hpn")
    healthy = compiler.compile_fabric(g, arp=mode)
    failed = compiler.compile_fabric(g, compiler.Failures.of([("p0l0", "p0s0", 0)], ["p0s1"]), arp=mode)
    for sw, st in healthy.items():
        arp = arp_flows(st)
        assert bool(arp) == (g.nodes[sw]["tier"] == 1), sw
        if sw in failed:
            assert arp_flows(failed[sw]) == arp


@pytest.mark.parametrize("segments", [1, 2, 8])
def test_gateway_responders_per_leaf_do_not_grow_with_the_hosts_of_the_plane(segments):
    """Two per host port of the leaf, whether the plane has 8 hosts' ports or 64."""
    g = fabric("mini-hpn", segments_per_pod=segments)
    st = compiler.compile_fabric(g, switches=["p0l0"])["p0l0"]
    leaf_ports = len([p for h in graph.hosts(g) for p in graph.host_ports(g, h) if p["leaf"] == "p0l0"])
    assert len(plane_ports(g, 0)) == segments * len(plane_ports(fabric("mini-hpn", segments_per_pod=1), 0))
    assert len(arp_flows(st)) == 2 * leaf_ports


def test_per_host_responders_grow_with_the_hosts_of_the_plane():
    """What gateway mode removes: per-host mode's responders of a leaf double with the plane."""
    small = compiler.compile_fabric(fabric("mini-hpn", segments_per_pod=1), arp="per-host", switches=["p0l0"])
    large = compiler.compile_fabric(fabric("mini-hpn", segments_per_pod=2), arp="per-host", switches=["p0l0"])
    assert len(arp_flows(large["p0l0"])) > 1.9 * len(arp_flows(small["p0l0"]))


def test_a_plane_too_large_for_per_host_responder_flows_leaves_arp_to_the_controller(monkeypatch):
    monkeypatch.setattr(compiler, "ARP_RESPONDER_MAX_FLOWS", 10)
    g = graph.build(spec.load("mini-hpn"))       # its own index: the responders are cached per graph
    st = compiler.compile_fabric(g, arp="per-host")["p0l0"]
    assert not arp_flows(st)
    to_controller = (compiler.TABLE_CLASSIFY, compiler.PRIO_ARP, (("eth_type", compiler.ETH_ARP),))
    assert to_controller in {f.key() for f in st.flows}
    assert arp_flows(compiler.compile_fabric(g)["p0l0"])        # gateway mode has no such limit


def test_changing_the_arp_mode_changes_only_the_leaves_responders():
    """The last hop writes the receiver's MAC in both modes: a controller restarted in the other
    mode replaces table-0 ARP entries and nothing else."""
    g = fabric("mini-hpn")
    gw, ph = compiler.compile_fabric(g), compiler.compile_fabric(g, arp="per-host")
    for sw in gw:
        a, b = set(gw[sw].expanded().items()), set(ph[sw].expanded().items())
        assert {k for k, _v in a ^ b} <= {f.key() for f in arp_flows(gw[sw]) + arp_flows(ph[sw])}, sw
        assert gw[sw].groups == ph[sw].groups


@pytest.mark.parametrize("mode", MODES)
def test_responder_flows_decode_back_from_flow_stats_to_the_same_entries(mode):
    """What a restarted controller reads back equals what it compiled: no responder is re-sent
    (the gateway responders' move action included)."""
    pytest.importorskip("os_ken")
    from support.fake_switch import FakeDatapath, stats_entry

    from hpnlab.controller import reconcile
    from hpnlab.controller.codec import decode_flow_stats
    g = fabric("mini-hpn")
    arp = arp_flows(compiler.compile_fabric(g, arp=mode)["p0l0"])
    want = {(f.table, f.priority, reconcile.canonical_match(f.match)): f.actions for f in arp}
    decoded = decode_flow_stats(FakeDatapath(1), [stats_entry(k, a) for k, a in want.items()])
    assert {(e.table, e.priority, e.match): e.actions for e in decoded} == want


@pytest.mark.parametrize("name", ["mini-hpn", "mini-rail", "mini-spine-leaf", "mini-cross-campus", "fat-tree-4"])
def test_gateway_mode_delivers_every_pair_from_the_gateway_to_the_receivers_own_mac(name):
    g = fabric(name)
    net = FabricTables(g, compiler.compile_fabric(g))
    pairs = net.all_pairs()
    for src, dst, plane, src_rail, dst_rail in pairs:
        sent = net.packet(src, dst, plane, src_rail=src_rail, dst_rail=dst_rail)[1]
        assert sent["eth_dst"] == compiler.GATEWAY_MAC         # what the host learnt by ARP from its leaf
        walk = net.send(src, dst, plane, src_rail=src_rail, dst_rail=dst_rail)
        assert walk.result == "delivered", walk
        assert walk.delivered_to is not None
        mac = next(p["mac"] for p in graph.host_ports(g, dst) if p["intf"] == walk.delivered_to[1])
        assert (walk.packet["eth_dst"], walk.packet["eth_src"]) == (mac, compiler.GATEWAY_MAC)
    assert pairs


def test_the_move_action_as_open_vswitch_reports_it_decodes_to_the_compiled_one():
    """Open vSwitch sends the move back with NXM field headers (os-ken calls them "arp_tpa_nxm"),
    whatever headers the controller installed it with."""
    pytest.importorskip("os_ken")
    import struct

    from os_ken.ofproto import ofproto_v1_3 as ofp
    from os_ken.ofproto import ofproto_v1_3_parser as parser

    from hpnlab.controller.codec import decode_action

    def nxm(field: int) -> int:      # class 0 (NXM_OF_*), 4-byte field
        return field << 9 | 4
    nxm_of_arp_spa, nxm_of_arp_tpa = nxm(16), nxm(17)
    raw = struct.pack("!HHIHHHHII", 0xFFFF, 24, 0x2320, 6, 32, 0, 0, nxm_of_arp_tpa, nxm_of_arp_spa)   # NXAST_REG_MOVE
    assert decode_action(ofp, parser, parser.OFPAction.parser(raw, 0)) == ("move", "arp_tpa", "arp_spa")
