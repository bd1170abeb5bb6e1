"""The staged rollout in the os-ken app, on fake datapaths: each plane installed alone, its probes
(packet-outs at the source leaf) walked through the installed tables with the table interpreter over
a cabling with a broken link; host probes (the default) walked to the destination host, whose answer
is walked back and caught at the source leaf, leaf probes caught at the destination leaf, as packet-ins;
a plane whose probes do not all arrive is rolled back."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("os_ken")

from os_ken.lib.packet import ethernet, ipv4, packet, tcp
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from support.fake_switch import Fabric, scenario, wipes

from hpnlab.controller import rollout
from hpnlab.fabric.routing.oftable import FabricTables

BROKEN = frozenset({("p1s0", 1)})       # p1s0's cable to p1l0 carries nothing, and neither end notices


class ProbedFabric(Fabric):
    def __init__(self, app, cabling, broken=frozenset()):
        super().__init__(app, cabling)
        self.broken = broken
        self.probes_carried = 0
        self.catchers: list = []       # the catching rules' flow-mods, as sent
        for dp in self.dps.values():
            dp.send_msg = self._noting(dp.send_msg)  # type: ignore[method-assign]

    def _noting(self, send):
        def send_msg(msg, close_socket: bool = False) -> None:
            if isinstance(msg, parser.OFPFlowMod) and msg.priority == 65534 and msg.command == ofp.OFPFC_ADD:
                self.catchers.append(msg)
            send(msg, close_socket)
        return send_msg

    def carry(self, name: str, msg) -> bool:
        if not (isinstance(msg, parser.OFPPacketOut) and msg.actions[0].port == ofp.OFPP_TABLE):
            return False
        pkt = packet.Packet(bytes(msg.data))
        syn = pkt.get_protocol(tcp.tcp)
        pid = syn.seq - rollout.PROBE_SEQ_BASE if syn is not None else rollout.probe_id_of(bytes(pkt.protocols[-1]))
        probe = {p.probe_id: p for p in self.app.rollout.probes}[pid]
        assert (probe.src_leaf, probe.in_port) == (name, msg.in_port)
        assert (syn is not None) == (probe.mode == "hosts")
        rec = self.app.reconciler
        net = FabricTables(self.cabling, rec.states, rec.failures, one_sided=self.broken)
        walk = net.send(probe.src_host, probe.dst_host, plane=probe.plane, sport=probe.sport)
        self.probes_carried += 1
        if probe.mode == "leaves":
            at_leaf = [(sw, port) for sw, port, _out in walk.hops if sw == probe.dst_leaf]
            if walk.result == "delivered" and at_leaf:
                self.packet_in(probe.dst_leaf, at_leaf[0][1], bytes(msg.data))
            return True
        if walk.result != "delivered" or walk.delivered_to is None or walk.delivered_to[0] != probe.dst_host:
            return True
        back = net.send(probe.dst_host, probe.src_host, plane=probe.plane, sport=rollout.PROBE_PORT)
        entered = [(sw, port) for sw, port, _out in back.hops if sw == probe.src_leaf]
        if back.result == "delivered" and entered:     # the host's answer: a RST acknowledging the SYN
            self.packet_in(probe.src_leaf, entered[0][1], answer(probe))
        return True


def answer(probe: rollout.Probe) -> bytes:
    """What the destination host's TCP stack sends back for a probe to a closed port."""
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst="0e:00:00:00:00:02", src=probe.dst_mac, ethertype=0x0800))
    pkt.add_protocol(ipv4.ipv4(src=probe.dst_ip, dst=probe.src_ip, proto=6, ttl=64))
    pkt.add_protocol(tcp.tcp(src_port=rollout.PROBE_PORT, dst_port=probe.sport, seq=0, ack=probe.seq + 1,
                             bits=tcp.TCP_RST | tcp.TCP_ACK))
    pkt.serialize()
    return bytes(pkt.data)


def run(app, net, rounds: int = 20) -> None:
    """Let the rollout's waits pass, round after round, until every stage is done."""
    for _ in range(rounds):
        if app.rollout.state.phase == "done":
            return
        app.rollout.catch_at -= 1
        app.rollout.probe_sent_at -= 2 * ctl_wait()
        app.rollout.poll()
        net.deliver()
        net.settle()
    raise AssertionError(f"the rollout did not finish: {app.rollout.state}")


def ctl_wait() -> float:
    from hpnlab.controller.rollout_manager import PROBE_WAIT_S
    return PROBE_WAIT_S


def rolled_out(app, broken=frozenset()) -> ProbedFabric:
    """The fabric connected and the staged rollout run to its end."""
    net = ProbedFabric(app, scenario(), broken=broken)
    net.connect()
    net.settle()
    run(app, net)
    return net


def staged(make_app, tmp_path):
    return make_app("refuse", rollout="staged", rollout_out=str(tmp_path / "rollout.json"))


def test_only_the_first_plane_is_installed_until_it_passes(make_app, tmp_path):
    app = staged(make_app, tmp_path)
    net = ProbedFabric(app, scenario())
    net.connect()
    assert app.rollout.state.planes == [0, 1] and app.rollout.state.current == 0
    assert {n for n, m in net.installed.items() if wipes(m)} == {n for n in net.dps if n.startswith("p0")}


def test_a_healthy_fabric_passes_every_stage(make_app, tmp_path):
    app = staged(make_app, tmp_path)
    net = ProbedFabric(app, scenario())
    net.connect()
    net.settle()
    run(app, net)
    assert app.rollout.state.passed == [0, 1] and app.rollout.state.rolled_back == []
    assert app.wiring.released == set(net.dps) and app.reconciler.settled
    report = json.loads((tmp_path / "rollout.json").read_text())
    assert report["done"] and all(s["ok"] and s["probes"] == s["arrived"] == 96 for s in report["stages"])
    assert net.probes_carried == 2 * 96


def test_a_plane_whose_probes_are_lost_is_rolled_back_and_the_others_stay(make_app, tmp_path):
    app = staged(make_app, tmp_path)
    net = rolled_out(app, BROKEN)
    assert app.rollout.state.passed == [0] and app.rollout.state.rolled_back == [1]
    plane1 = {n for n in net.dps if n.startswith("p1")}
    assert app.wiring.released == set(net.dps) - plane1
    assert app.reconciler.failed_switches == plane1 and not (app.reconciler.failures.switches - plane1)
    rec = app.reconciler
    assert all(rec.confirmed[n] == rec.desired[n] for n in set(net.dps) - plane1)   # plane 0 kept its tables
    report = json.loads((tmp_path / "rollout.json").read_text())
    failed = report["stages"][1]
    assert not failed["ok"] and 0 < failed["arrived"] < failed["probes"]


def catching_matches(net) -> set:
    return {tuple(sorted((k, v) for k, v in m.match.items() if k != "in_port"))
            for m in net.catchers}


def test_host_probes_are_the_default_and_a_broken_plane_is_rolled_back_with_them(make_app, tmp_path):
    app = staged(make_app, tmp_path)
    net = rolled_out(app, BROKEN)
    assert app.rollout.probe == "hosts" and {p.mode for p in app.rollout.probes} == {"hosts"}
    assert catching_matches(net) == {tuple(sorted(rollout.catch_match("hosts")))}
    assert app.rollout.state.rolled_back == [1]
    assert json.loads((tmp_path / "rollout.json").read_text())["probe"] == "hosts"


def test_leaf_probes_stay_selectable_and_roll_a_broken_plane_back_too(make_app, tmp_path):
    app = make_app("refuse", rollout="staged", rollout_out=str(tmp_path / "rollout.json"),
                   rollout_probe="leaves")
    net = rolled_out(app, BROKEN)
    assert {p.mode for p in app.rollout.probes} == {"leaves"}
    assert catching_matches(net) == {tuple(sorted(rollout.catch_match("leaves")))}
    assert app.rollout.state.passed == [0] and app.rollout.state.rolled_back == [1]


def test_a_bad_probe_mode_stops_the_app_at_init_in_one_line(make_app):
    from hpnlab.fabric.errors import UserError
    with pytest.raises(UserError, match="rollout_probe: 'host' is not one of hosts, leaves"):
        make_app("refuse", rollout_probe="host")
