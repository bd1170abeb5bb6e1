"""``--deployment auto`` on a live fabric, every switch on a datapath id of its own
(hpnlab.fabric.emulation.rewire), the controller started with no deployment file: mini-spine-leaf (one
plane, so the plan's port numbers tell its leaves apart) and mini-hpn (two identical planes, which only
the hosts behind its leaves tell apart: one host port behind each leaf pings while the switches connect,
and its ARP requests reach the controller). It hears the switches by LLDP, adopts the map once it can
tell every leaf apart and installs on it through the wiring check, with no restart; the map is written
for the next start. One emulation per scenario (about 30 s each)."""
from __future__ import annotations

import time

import pytest

from hpnlab.controller import deployment, wiring
from hpnlab.fabric.emulation.rewire import Rewire, foreign_dpids
from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

DPID_BASE = 0xCD00000000000000
REWIRE = Rewire(dpid_base=DPID_BASE)


def _hosts_talk(e) -> None:
    """on_built: one host port behind every leaf pings a peer of its plane for 30 s, so that its ARP requests
    reach the controller while the switches are still strangers to it (what a site's hosts do anyway)."""
    first: dict[str, dict] = {}
    for h in fgraph.hosts(e.graph):
        for p in fgraph.host_ports(e.graph, h):
            first.setdefault(p["leaf"], dict(p, host=h))
    for leaf, p in sorted(first.items()):
        peer = next(q for q in first.values() if q["plane"] == p["plane"] and q["leaf"] != leaf)
        e.host(p["host"]).cmd(f"ping -c 60 -i 0.5 -W 1 -I {fgraph.intf_name(p['host'], p['intf'])} {peer['ip']} "
                              f">/dev/null 2>&1 &")


def _arp_cycle_s(e) -> float:
    """How long a host's ARP resolution that began before the routes were installed can still fail after
    them: the kernel sends ``mcast_solicit`` broadcast probes ``retrans_time_ms`` apart, and when the last
    one goes unanswered every packet queued for that neighbour, a new ping's included, is returned as
    'Destination Host Unreachable' (the talking hosts' pings kept such resolutions going while the
    switches were strangers)."""
    h = fgraph.hosts(e.graph)[0]
    intf = fgraph.intf_name(h, fgraph.host_ports(e.graph, h)[0]["intf"])
    probes, retrans_ms = (int(e.host(h).cmd(f"cat /proc/sys/net/ipv4/neigh/{intf}/{k}"))
                          for k in ("mcast_solicit", "retrans_time_ms"))
    return probes * retrans_ms / 1000 + 0.5


@pytest.fixture(scope="module", params=["mini-spine-leaf", "mini-hpn"])
def emu(request, emulation_ready, tmp_path_factory):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, PortOptions, SupervisionOptions

    site = tmp_path_factory.mktemp("auto") / "site.yaml"
    e = Emulation(request.param, EmulationOptions(
        controller=ControllerOptions(extra_args=("--deployment", "auto", "--deployment-out", str(site))),
        ports=PortOptions(ecn=False, shape=False), supervision=SupervisionOptions(verify=False, lock_wait_s=300),
        rewire=REWIRE), log=None, on_built=_hosts_talk)
    e.start()
    try:
        time.sleep(_arp_cycle_s(e))
        yield e, site
    finally:
        e.stop()


def test_auto_adopts_the_switches_it_hears_and_installs_them_without_a_restart(emu, capsys):
    e, site = emu
    report = e.metadata["wiring"]
    with capsys.disabled():
        print(f"\ndeployment auto ({e.scenario.name}): adopted {report['deployment']['adopted']}; "
              f"installed {report['installed']}")
    switches = len(fgraph.switches(e.graph))
    assert f"{switches} on datapath ids of their own" in report["deployment"]["adopted"]
    assert report["counts"] == {"missing": 0, "miswired": 0, "unexpected": 0}
    assert report["links_ok"] == len(wiring.expected_links(e.graph)) // 2
    assert report["installed"]["switches"] == switches
    assert e.controller.losses == []                 # the same controller process all along
    data = deployment.load(e.graph, site)            # the map it adopted, written with no mistake
    assert {deployment.parse_dpid(s["dpid"]) for s in data["switches"].values()} == set(
        foreign_dpids(e.graph, DPID_BASE).values())
    leaves = [n for n in data["switches"] if e.graph.nodes[n]["tier"] == 1]
    assert {n: deployment.parse_dpid(data["switches"][n]["dpid"]) for n in leaves} == {
        n: foreign_dpids(e.graph, DPID_BASE)[n] for n in leaves}        # each leaf where its hosts are
    assert e.ping_all()["failed"] == []
