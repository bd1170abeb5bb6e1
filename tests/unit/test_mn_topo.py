"""The Mininet Topo of a scenario mirrors the fabric graph (pure: no root, no OVS)."""
import importlib.util
import ipaddress

import pytest
from support.paths import REPO

pytest.importorskip("mininet.topo", reason="mininet (the emulation extra) is not installed")

from hpnlab.fabric.emulation.mn import topo_for
from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.scenario.addressing import dpid_str
from hpnlab.fabric.scenario.rates import emulated_mbps

ROOT = REPO


@pytest.fixture(scope="module")
def mini():
    scenario = spec.load("mini-hpn")
    g = graph.build(scenario)
    return scenario, g, topo_for(scenario)


def _host_links(topo, host):
    """(intf name, port, ip, mac) of every link of `host` in the Topo."""
    out = []
    for _, _, info in topo.links(withKeys=False, withInfo=True):
        if info["node1"] == host:
            out.append((info["intfName1"], info["port1"], info["params1"]["ip"], info["addr1"]))
    return sorted(out, key=lambda t: t[1])


def test_topo_has_every_host_and_switch_of_the_graph(mini):
    _, g, topo = mini
    assert sorted(topo.hosts()) == sorted(graph.hosts(g))
    assert sorted(topo.switches()) == sorted(graph.switches(g))
    assert len(topo.links()) == g.number_of_edges()


def test_each_host_has_one_interface_per_nic_port_with_planned_address_and_plane_prefix(mini):
    s, g, topo = mini
    plan = g.graph["plan"]
    for host in graph.hosts(g):
        links = _host_links(topo, host)
        ports = graph.host_ports(g, host)
        assert len(links) == s.ports_per_host
        for (name, port, cidr, mac), planned in zip(links, ports, strict=True):
            assert name == f"{host}-eth{planned['intf']}"
            assert port == planned["intf"]
            assert mac == planned["mac"]
            iface = ipaddress.IPv4Interface(cidr)
            assert str(iface.ip) == planned["ip"]
            assert iface.network == ipaddress.IPv4Network(plan.plane_prefix(planned["plane"]))


def test_host_default_address_is_its_lowest_interface(mini):
    _, g, topo = mini
    info = topo.nodeInfo("h3")
    first = graph.host_ports(g, "h3")[0]
    assert info["ip"].split("/")[0] == first["ip"]
    assert info["mac"] == first["mac"]


def test_switches_carry_graph_dpids_and_port_numbers(mini):
    _, g, topo = mini
    for sw in graph.switches(g):
        assert topo.nodeInfo(sw)["dpid"] == dpid_str(g.nodes[sw]["dpid"])
    for _, _, info in topo.links(withKeys=False, withInfo=True):
        u, v = info["node1"], info["node2"]
        planned = graph.link_ports(g, u, v)
        assert (info["port1"], info["port2"]) in planned


def test_links_carry_emulated_rates_scaled_and_capped(mini):
    s, _, topo = mini
    for _, _, info in topo.links(withKeys=False, withInfo=True):
        if info["kind"] == "host":
            assert info["bw"] == s.emulation.host_mbps
        else:
            # mini-hpn: 400G uplinks vs 200G hosts at 10 Mbit/s -> 20 Mbit/s (cap 40)
            assert info["bw"] == pytest.approx(20.0)
    assert emulated_mbps(s, 10_000) == s.emulation.max_mbps


def test_long_haul_links_carry_their_delay():
    s = spec.load("mini-cross-campus")
    topo = topo_for(s)
    kinds: dict[str, set[str | None]] = {}
    for _, _, info in topo.links(withKeys=False, withInfo=True):
        kinds.setdefault(info["kind"], set()).add(info.get("delay"))
    assert kinds["long-haul"] == {"100us"}
    assert kinds["host"] == {None}


def test_multi_rail_hosts_have_several_interfaces_on_one_plane():
    s = spec.load("mini-rail")
    topo = topo_for(s)
    planes = [ipaddress.IPv4Interface(ip).network for _, _, ip, _ in _host_links(topo, "h1")]
    assert len(planes) == 4 and len(set(planes)) == 2


def _load_custom(path):
    module_spec = importlib.util.spec_from_file_location(f"custom_{path.stem}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.topos


def test_mn_custom_files_build_topos_with_overrides():
    hpn = _load_custom(ROOT / "topologies" / "hpn.py")["hpn"](planes=4)
    assert len(hpn.switches()) == 4 * (4 + 2)
    fat = _load_custom(ROOT / "topologies" / "fattree.py")["fattree"](k=4)
    assert len(fat.hosts()) == 16 and len(fat.switches()) == 20
    cross_campus = _load_custom(ROOT / "topologies" / "scenario.py")["scenario"]("mini-cross-campus")
    assert "p0c1" in cross_campus.switches()


def test_mn_custom_overrides_reach_the_emulation_block():
    topo = _load_custom(ROOT / "topologies" / "scenario.py")["scenario"](
        "mini-hpn", **{"emulation.host_mbps": 5})
    assert topo.fabric.graph["scenario"].emulation.host_mbps == 5


def test_mn_custom_files_load_the_way_mn_loads_them():
    """`mn --custom F` exec()s F with no __file__ and takes its `topos` (the repo root need not be on sys.path)."""
    import subprocess
    import sys
    code = ("import sys; sys.path = [p for p in sys.path if p not in ('', '.')]; "
            "f = sys.argv[1]; ns = {}; exec(compile(open(f).read(), f, 'exec'), ns, ns); "
            "print(len(ns['topos']['hpn'](planes=2).hosts()))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "topologies" / "hpn.py")],
                         capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "16"
