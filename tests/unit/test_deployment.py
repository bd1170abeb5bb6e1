"""The deployment file (controller/deployment.py): real dpids and port numbers for the scenario's
switches, checked with one line per mistake, applied to the graph, or filled from discovery."""
from __future__ import annotations

import pytest
import yaml

from hpnlab.controller import deployment, wiring
from hpnlab.fabric.emulation.rewire import Rewire, physical
from hpnlab.fabric.emulation.rewire import deployment as rewire_deployment
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec

FOREIGN = Rewire(dpid_base=0xAB00000000000000, port_offset=100)


@pytest.fixture(scope="module")
def g():
    return fgraph.build(spec.load("mini-hpn"))


@pytest.fixture
def good(g) -> dict:
    return yaml.safe_load(yaml.safe_dump(rewire_deployment(g, FOREIGN)))    # as read back from a file


def mistakes(g, data) -> list[str]:
    return deployment.validate(g, data, "d.yaml")[2]


def test_a_complete_file_has_no_mistake(g, good):
    assert mistakes(g, good) == []


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["switches"].__setitem__("p9l9", {"dpid": 7}), "switch p9l9 is not a switch of scenario mini-hpn"),
    (lambda d: d["switches"].pop("p0s1"), "switch p0s1 of scenario mini-hpn is missing"),
    (lambda d: d["switches"]["p0l1"].__setitem__("dpid", d["switches"]["p0l0"]["dpid"]), "is already p0l0's"),
    (lambda d: d["switches"]["p0l1"].__setitem__("dpid", "not-a-dpid"), "is not a datapath id"),
    (lambda d: d["switches"]["p0l1"].__setitem__("dpid", 0), "is not a datapath id"),
    (lambda d: d["switches"]["p0l0"]["ports"].__setitem__(6, 105), "OpenFlow port 105 is used twice"),
    (lambda d: d["switches"]["p0l0"]["ports"].pop(6), "port 6 (to p0s1) is missing from its ports"),
    (lambda d: d["switches"]["p0l0"]["ports"].__setitem__(9, 109), "port 9 is not a port scenario mini-hpn uses"),
    (lambda d: d["switches"]["p0l0"]["ports"].__setitem__(5, -1), "is neither an OpenFlow port number"),
    (lambda d: d["switches"]["p0l0"].__setitem__("speed", 1), "unknown key 'speed'"),
    (lambda d: d.__setitem__("scenario", "fat-tree-4"), "written for scenario 'fat-tree-4'"),
])
def test_each_mistake_is_one_line_naming_it(g, good, edit, needle):
    edit(good)
    found = mistakes(g, good)
    assert len(found) == 1 and needle in found[0], found
    assert found[0].startswith("d.yaml: ")


def test_several_mistakes_give_one_line_each(g, good):
    good["switches"].pop("p0s1")
    good["switches"]["p0l0"]["ports"].pop(6)
    assert len(mistakes(g, good)) == 2


def test_load_raises_a_user_error_with_every_mistake(g, good, tmp_path):
    good["switches"].pop("p0s1")
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(good))
    with pytest.raises(UserError, match="p0s1 of scenario mini-hpn is missing"):
        deployment.load(g, path)
    path.write_text("switches: [")
    with pytest.raises(UserError, match="is not YAML"):
        deployment.load(g, path)
    with pytest.raises(UserError, match=r"deployment file .*nope\.yaml"):
        deployment.load(g, tmp_path / "nope.yaml")


@pytest.mark.parametrize("text, value", [("0xab", 0xAB), ("00:00:00:00:00:00:00:ab", 0xAB), ("171", 171),
                                         ("00000000000000ab", 0xAB)])
def test_dpids_are_read_as_switches_print_them(text, value):
    assert deployment.parse_dpid(text) == value


def test_a_switch_without_ports_keeps_the_scenarios_numbers(g, good):
    del good["switches"]["p1s1"]["ports"]
    out = deployment.apply(g, good)
    assert out.edges["p1s1", "p1l2", 0]["ports"] == {"p1s1": 3, "p1l2": 106}


def test_applied_the_compiler_uses_the_real_dpids_and_ports(g, good):
    out = deployment.apply(g, good)
    states = compiler.compile_fabric(out)
    assert states["p0l0"].dpid == int(good["switches"]["p0l0"]["dpid"], 16)
    outputs = {a[1] for f in states["p0l0"].flows for a in f.actions if a[0] == "output"}
    outputs |= {a[1] for grp in states["p0l0"].groups for _w, acts in grp.buckets for a in acts if a[0] == "output"}
    assert outputs and all(p > 100 for p in outputs)
    assert compiler.index_of(out).is_host_port("p0l0", 101)
    assert wiring.compare(out, wiring.heard(physical(g, FOREIGN))).clean      # LLDP hears the real numbers


def test_the_scenarios_graph_is_left_as_it_was(g, good):
    deployment.apply(g, good)
    assert g.edges["p0s0", "p0l0", 0]["ports"] == {"p0l0": 5, "p0s0": 1}


def heard_by_dpid(cabling) -> dict:
    return {(cabling.nodes[rx[0]]["dpid"], rx[1]): (cabling.nodes[tx[0]]["dpid"], tx[1])
            for rx, tx in wiring.heard(cabling).items()}


def test_discovery_fills_the_map_of_foreign_ports_on_derived_dpids(g):
    dpids, maps = deployment.from_discovery(g, heard_by_dpid(physical(g, Rewire(port_offset=100))))
    assert dpids == {n: d["dpid"] for n, d in g.nodes(data=True) if d["tier"] > 0}
    assert maps["p0l0"] == {1: 1, 2: 2, 3: 3, 4: 4, 5: 105, 6: 106}     # host ports cannot be heard
    assert maps["p0s1"] == {1: 101, 2: 102, 3: 103, 4: 104}


def test_discovery_matches_foreign_dpids_by_the_shape_of_the_wiring(g):
    """Symmetric switches may swap names (any leaf of a plane is as good as another): what counts is
    that the file written makes LLDP's observations, named through it, check out cable for cable."""
    heard = heard_by_dpid(physical(g, FOREIGN))
    dpids, maps = deployment.from_discovery(g, heard)
    assert set(dpids.values()) == {0xAB00000000000000 + i for i in range(12)}
    out = deployment.apply(g, yaml.safe_load(deployment.dump(g, dpids, maps)))
    by_dpid = compiler.index_of(out).by_dpid
    named = {(by_dpid[rx[0]], rx[1]): (by_dpid[tx[0]], tx[1]) for rx, tx in heard.items()}
    report = wiring.compare(out, named)
    assert report.clean and report.links_ok == 16


def test_discovery_of_a_wiring_of_another_shape_is_one_line(g):
    heard = heard_by_dpid(physical(g, Rewire(drop=[("p0l2", "p0s0")])))
    with pytest.raises(UserError, match="does not have the shape of scenario mini-hpn"):
        deployment.from_discovery(g, heard)


# ---- port names (resolved against the switch's port descriptions when it connects) ----------------------

NAMED = Rewire(dpid_base=0xAB00000000000000, port_names=True)


@pytest.fixture
def named(g) -> dict:
    return yaml.safe_load(yaml.safe_dump(rewire_deployment(g, NAMED)))


def port_descs(g, switch: str, offset: int = 0) -> dict[str, int]:
    """What a switch's port descriptions say: Open vSwitch names its ports after their interfaces."""
    return {fgraph.intf_name(switch, p): p + offset for p in deployment.switch_ports(g, switch)}


def test_a_file_giving_ports_by_name_has_no_mistake(g, named):
    assert named["switches"]["p0l0"]["ports"][5] == "p0l0-eth5"
    assert mistakes(g, named) == []


def test_scenario_ports_may_be_given_by_the_graphs_name_for_them(g, good):
    ports = good["switches"]["p0l0"]["ports"]
    ports["p0l0-eth5"] = ports.pop(5)
    assert mistakes(g, good) == []
    assert deployment.apply(g, good).edges["p0s0", "p0l0", 0]["ports"]["p0l0"] == 105


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["switches"]["p0l0"]["ports"].__setitem__(6, "p0l0-eth5"), "port name 'p0l0-eth5' is used twice"),
    (lambda d: d["switches"]["p0l0"]["ports"].__setitem__("p0l0-eth9", "x"), "port 'p0l0-eth9' is not a port"),
    (lambda d: d["switches"]["p0l0"]["ports"].__setitem__("p0l1-eth5", "x"), "port 'p0l1-eth5' is not a port"),
    (lambda d: d["switches"]["p0l0"]["ports"].__setitem__("p0l0-eth5", "y"), "scenario port 5 is given twice"),
    (lambda d: d["switches"]["p0l0"]["ports"].__setitem__(5, ""), "is neither an OpenFlow port number"),
])
def test_each_mistake_in_port_names_is_one_line_naming_it(g, named, edit, needle):
    edit(named)
    found = mistakes(g, named)
    assert len(found) == 1 and needle in found[0], found


def test_names_resolve_to_the_numbers_the_switch_reports(g, named):
    resolved, errors = deployment.resolve(g, named, "p0l0", port_descs(g, "p0l0", offset=40))
    assert errors == [] and resolved == {p: p + 40 for p in deployment.switch_ports(g, "p0l0")}
    out = deployment.apply(g, named, {"p0l0": resolved})
    assert out.edges["p0s0", "p0l0", 0]["ports"]["p0l0"] == 45


def test_a_name_the_switch_does_not_have_is_one_line_at_connect_time(g, named):
    descs = port_descs(g, "p0l0")
    descs["Ethernet5"] = descs.pop("p0l0-eth5")
    resolved, errors = deployment.resolve(g, named, "p0l0", descs)
    dpid = named["switches"]["p0l0"]["dpid"]
    assert len(errors) == 1 and f"switch p0l0 (dpid {dpid}) has no port named 'p0l0-eth5'" in errors[0]
    assert "Ethernet5" in errors[0] and 5 not in resolved


def test_a_name_landing_on_a_port_given_by_number_is_two_scenario_ports_onto_one(g, named):
    named["switches"]["p0l0"]["ports"][6] = 5         # scenario port 6 onto OpenFlow port 5 by number ...
    _resolved, errors = deployment.resolve(g, named, "p0l0", port_descs(g, "p0l0"))   # ... and 5's name is port 5
    assert len(errors) == 1 and "scenario ports 6 and 5" in errors[0]


def test_named_ports_stand_on_placeholders_no_switch_has_until_resolved(g, named):
    out = deployment.apply(g, named)
    ports = [d["ports"]["p0l0"] for _u, _v, d in out.edges("p0l0", data=True)]
    assert len(set(ports)) == len(ports) and all(p < 0 for p in ports)
    assert out.edges["p0s0", "p0l0", 0]["ports"]["p0s0"] < 0       # every switch of the file gives names


# ---- --deployment auto adopts what discovery found ------------------------------------------------------

def test_auto_tells_switches_on_dpids_of_their_own_apart_by_the_plans_port_numbers():
    one_plane = fgraph.build(spec.load("mini-spine-leaf"))
    cabling = physical(one_plane, Rewire(dpid_base=0xAB00000000000000))
    data, line = deployment.adoption(one_plane, heard_by_dpid(cabling))
    assert mistakes(one_plane, data) == []
    assert line == "10 switches, 10 on datapath ids of their own, 0 port(s) on numbers other than the scenario's"
    assert {n: deployment.parse_dpid(e["dpid"]) for n, e in data["switches"].items()} == {
        n: cabling.nodes[n]["dpid"] for n in data["switches"]}          # each leaf is the one its hosts are on


def test_auto_on_derived_dpids_learns_the_switches_own_port_numbers(g):
    heard = heard_by_dpid(physical(g, Rewire(port_offset=100)))
    data, line = deployment.adoption(g, heard)
    assert line == "12 switches, 0 on datapath ids of their own, 32 port(s) on numbers other than the scenario's"
    out = deployment.apply(g, data)
    by_dpid = compiler.index_of(out).by_dpid
    assert wiring.compare(out, {(by_dpid[rx[0]], rx[1]): (by_dpid[tx[0]], tx[1]) for rx, tx in heard.items()}).clean


@pytest.mark.parametrize("rewire", [FOREIGN, Rewire(dpid_base=0xAB00000000000000)], ids=["ports", "planes"])
def test_auto_adopts_nothing_when_it_cannot_tell_which_leaf_is_which(g, rewire):
    """Foreign dpids with foreign port numbers, or with the plan's numbers on identical planes: the shape
    matches, but a leaf of one plane or position would do as well as another, and the hosts behind them
    (which send no LLDP) would be routed to the wrong one."""
    with pytest.raises(UserError, match="which leaf is which cannot be told"):
        deployment.adoption(g, heard_by_dpid(physical(g, rewire)))


def hosts_seen(cabling, leaves=None) -> dict:
    """(dpid, port) -> source MAC: one host port behind each leaf (of ``leaves``), as the frames its
    host sends (an ARP request) reach the controller."""
    out: dict[tuple[int, int], str] = {}
    for h in fgraph.hosts(cabling):
        for p in fgraph.host_ports(cabling, h):
            if (leaves is None or p["leaf"] in leaves) and not any(k[0] == cabling.nodes[p["leaf"]]["dpid"]
                                                                  for k in out):
                out[cabling.nodes[p["leaf"]]["dpid"], p["leaf_port"]] = p["mac"]
    return out


@pytest.mark.parametrize("rewire", [FOREIGN, Rewire(dpid_base=0xAB00000000000000)], ids=["ports", "planes"])
def test_auto_tells_identical_planes_apart_by_the_hosts_seen_behind_each_leaf(g, rewire):
    cabling = physical(g, rewire)
    data, line = deployment.adoption(g, heard_by_dpid(cabling), hosts_seen(cabling))
    assert mistakes(g, data) == []
    assert line.startswith("12 switches, 12 on datapath ids of their own")
    leaves = [n for n in data["switches"] if g.nodes[n]["tier"] == 1]
    assert {n: deployment.parse_dpid(data["switches"][n]["dpid"]) for n in leaves} == {
        n: cabling.nodes[n]["dpid"] for n in leaves}                    # each leaf is the one its hosts are on
    out = deployment.apply(g, data)
    by_dpid = compiler.index_of(out).by_dpid
    heard = heard_by_dpid(cabling)
    assert wiring.compare(out, {(by_dpid[rx[0]], rx[1]): (by_dpid[tx[0]], tx[1]) for rx, tx in heard.items()}).clean


def test_auto_waits_while_a_leaf_has_no_host_seen_behind_it(g):
    cabling = physical(g, FOREIGN)
    with pytest.raises(UserError, match=r"cannot be told yet .* 3 leaf\(s\) with a host seen"):
        deployment.adoption(g, heard_by_dpid(cabling), hosts_seen(cabling, leaves={"p0l0", "p0l1", "p1l0"}))


def test_hosts_of_two_leaves_behind_one_switch_is_one_line(g):
    cabling = physical(g, FOREIGN)
    seen = hosts_seen(cabling)
    (dpid, port), _mac = next(iter(seen.items()))
    other = next(mac for (d, _p), mac in seen.items() if d != dpid)
    with pytest.raises(UserError, match="has hosts of two leaves behind it"):
        deployment.adoption(g, heard_by_dpid(cabling), seen | {(dpid, port + 1): other})


def test_auto_on_the_scenarios_own_numbers_adopts_them_unchanged(g):
    data, line = deployment.adoption(g, heard_by_dpid(g))
    assert line == "12 switches, all on the scenario's datapath ids and port numbers"
    out = deployment.apply(g, data)
    assert all(out.edges[e]["ports"] == g.edges[e]["ports"] for e in g.edges(keys=True))


def test_auto_adopts_nothing_from_a_wiring_of_another_shape(g):
    with pytest.raises(UserError, match="does not have the shape"):
        deployment.adoption(g, heard_by_dpid(physical(g, Rewire(drop=[("p0l2", "p0s0")]))))


def test_the_emulations_file_names_every_port_but_those_of_a_dropped_cable_which_are_not_made(g):
    data = rewire_deployment(g, Rewire(drop=[("p0l2", "p0s0")], port_offset=100, port_names=True))
    assert data["switches"]["p0l2"]["ports"][5] == 105 and data["switches"]["p0s0"]["ports"][3] == 103
    assert data["switches"]["p0l2"]["ports"][6] == "p0l2-eth6"
    assert mistakes(g, data) == []


def test_a_finding_on_a_port_whose_name_is_not_resolved_says_so(g, named):
    out = deployment.apply(g, named)
    report = wiring.compare(out, {})
    assert report.findings and all("name not resolved" in line for line in report.lines())


def _host_mac(g, n: int = 0) -> str:
    return sorted(deployment.host_leaves(g))[n]


def test_a_hosts_mac_behind_a_stranger_port_is_kept(g):
    seen: dict[tuple[int, int], str] = {}
    mac = _host_mac(g)
    assert deployment.note_host(seen, deployment.host_leaves(g), 0xAB01, 3, mac.upper(), 10) == "host-seen"
    assert seen == {(0xAB01, 3): mac}


def test_an_unknown_mac_first_does_not_hold_the_port_against_the_hosts_own(g):
    seen: dict[tuple[int, int], str] = {}
    leaves = deployment.host_leaves(g)
    assert deployment.note_host(seen, leaves, 0xAB01, 3, "02:00:00:00:99:99", 10) == "unknown-mac"
    assert deployment.note_host(seen, leaves, 0xAB01, 3, _host_mac(g), 10) == "host-seen"
    assert seen == {(0xAB01, 3): _host_mac(g)}


def test_the_latest_known_mac_on_a_port_replaces_the_one_held(g):
    leaves = deployment.host_leaves(g)
    seen = {(0xAB01, 3): _host_mac(g, 0)}
    assert deployment.note_host(seen, leaves, 0xAB01, 3, _host_mac(g, 0), 10) == "ignored"
    assert deployment.note_host(seen, leaves, 0xAB01, 3, _host_mac(g, 1), 10) == "host-seen"
    assert seen == {(0xAB01, 3): _host_mac(g, 1)}


def test_no_new_port_is_kept_past_the_limit_but_a_held_one_still_refreshes(g):
    leaves = deployment.host_leaves(g)
    seen = {(0xAB01, 3): _host_mac(g, 0)}
    assert deployment.note_host(seen, leaves, 0xAB01, 4, _host_mac(g, 1), 1) == "ignored"
    assert deployment.note_host(seen, leaves, 0xAB01, 3, _host_mac(g, 1), 1) == "host-seen"
    assert seen == {(0xAB01, 3): _host_mac(g, 1)}
