"""ARP answered in the switches (responder flows at each leaf, from the address plan), so a host
can resolve its peers while the controller is away: walked through the table interpreter."""
from __future__ import annotations

import pytest
from fabrics import fabric

from hpnlab.controller import compiler
from hpnlab.controller.oftable import FabricTables
from hpnlab.fabric import graph, spec
from hpnlab.fabric.addressing import ip_int


def arp_request(asker: dict, target_ip: str) -> dict:
    return {"eth_type": compiler.ETH_ARP, "eth_src": asker["mac"], "eth_dst": "ff:ff:ff:ff:ff:ff",
            "arp_op": compiler.ARP_REQUEST, "arp_sha": asker["mac"], "arp_spa": asker["ip"],
            "arp_tha": "00:00:00:00:00:00", "arp_tpa": target_ip}


def plane_ports(g, plane: int) -> list[tuple[str, dict]]:
    return [(h, p) for h in graph.hosts(g) for p in graph.host_ports(g, h) if p["plane"] == plane]


@pytest.mark.parametrize("name", ["mini-hpn", "mini-rail", "mini-spine-leaf"])
def test_every_host_port_gets_the_reply_for_every_peer_of_its_plane_back_from_its_leaf(name):
    g = fabric(name)
    net = FabricTables(g, compiler.compile_fabric(g))
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
                assert reply["arp_sha"] == reply["eth_src"] == target["mac"]
                assert reply["arp_sha"] == compiler.arp_answer(g, asker["leaf"], target["ip"])
                assert reply["arp_spa"] == target["ip"]
                assert (reply["arp_tha"], reply["arp_tpa"], reply["eth_dst"]) == (asker["mac"], asker["ip"],
                                                                                  asker["mac"])
                asked += 1
    assert asked == sum(len(plane_ports(g, p)) * (len(plane_ports(g, p)) - 1) for p in planes)


@pytest.mark.parametrize("target", ["10.0.0.250", "10.1.0.2"])
def test_a_request_for_no_host_of_the_plane_still_goes_to_the_controller(target):
    """10.0.0.250: no host has it; 10.1.0.2: a host of the other plane."""
    g = fabric("mini-hpn")
    net = FabricTables(g, compiler.compile_fabric(g))
    host, asker = plane_ports(g, 0)[0]
    assert ip_int(target) not in {ip_int(p["ip"]) for _h, p in plane_ports(g, 0)}
    pkt = dict(arp_request(asker, target), in_port=asker["leaf_port"])
    flow = net.lookup(asker["leaf"], compiler.TABLE_CLASSIFY, pkt)
    assert flow is not None and flow.actions == (("controller",),)
    assert net.inject(host, asker["intf"], arp_request(asker, target)).result == "dropped"


def test_a_gratuitous_arp_or_a_reply_goes_to_the_controller():
    g = fabric("mini-hpn")
    net = FabricTables(g, compiler.compile_fabric(g))
    (_h, asker), (_p, peer) = plane_ports(g, 0)[:2]
    reply = dict(arp_request(asker, peer["ip"]), arp_op=compiler.ARP_REPLY, in_port=asker["leaf_port"])
    flow = net.lookup(asker["leaf"], compiler.TABLE_CLASSIFY, reply)
    assert flow is not None and flow.actions == (("controller",),)


def test_responders_are_on_leaves_only_and_never_change_with_failures():
    g = fabric("mini-hpn")
    healthy = compiler.compile_fabric(g)
    failed = compiler.compile_fabric(g, compiler.Failures.of([("p0l0", "p0s0", 0)], ["p0s1"]))
    for sw, st in healthy.items():
        arp = [f for f in st.flows if f.priority == compiler.PRIO_ARP_RESPONDER]
        assert bool(arp) == (g.nodes[sw]["tier"] == 1), sw
        if sw in failed:
            assert [f for f in failed[sw].flows if f.priority == compiler.PRIO_ARP_RESPONDER] == arp


def test_a_plane_too_large_for_responder_flows_leaves_arp_to_the_controller(monkeypatch):
    monkeypatch.setattr(compiler, "ARP_RESPONDER_MAX_FLOWS", 10)
    g = graph.build(spec.load("mini-hpn"))       # its own index: the responders are cached per graph
    st = compiler.compile_fabric(g)["p0l0"]
    assert not [f for f in st.flows if f.priority == compiler.PRIO_ARP_RESPONDER]
    to_controller = (compiler.TABLE_CLASSIFY, compiler.PRIO_ARP, (("eth_type", compiler.ETH_ARP),))
    assert to_controller in {f.key() for f in st.flows}


def test_responder_flows_decode_back_from_flow_stats_to_the_same_entries():
    """What a restarted controller reads back equals what it compiled: no responder is re-sent."""
    pytest.importorskip("os_ken")
    from test_controller_app import FakeDatapath, stats_entry

    from hpnlab.controller import reconcile
    from hpnlab.controller.app import decode_flow_stats
    g = fabric("mini-hpn")
    arp = [f for f in compiler.compile_fabric(g)["p0l0"].flows if f.priority == compiler.PRIO_ARP_RESPONDER]
    want = {(f.table, f.priority, reconcile.canonical_match(f.match)): f.actions for f in arp}
    decoded = decode_flow_stats(FakeDatapath(1), [stats_entry(k, a) for k, a in want.items()])
    assert {(e.table, e.priority, e.match): e.actions for e in decoded} == want
