"""``--deployment auto`` on a live fabric: mini-spine-leaf (one plane, so the plan's port numbers tell its
leaves apart) on real Open vSwitch, every switch on a datapath id of its own (hpnlab.fabric.emulation.rewire),
the controller started with no deployment file. It hears the switches by LLDP, adopts the map once
discovery settles and installs on it through the wiring check, with no restart; the map is written for
the next start. One emulation for the module (about 30 s)."""
from __future__ import annotations

import pytest

from hpnlab.controller import deployment, wiring
from hpnlab.fabric import graph as fgraph
from hpnlab.fabric.emulation.rewire import Rewire, foreign_dpids

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

DPID_BASE = 0xCD00000000000000
REWIRE = Rewire(dpid_base=DPID_BASE)


@pytest.fixture(scope="module")
def emu(emulation_ready, tmp_path_factory):
    from hpnlab.fabric.emulation import Emulation

    site = tmp_path_factory.mktemp("auto") / "site.yaml"
    e = Emulation("mini-spine-leaf", ecn=False, shape=False, verify=False, lock_wait_s=300, log=None, rewire=REWIRE,
                  controller_args=["--deployment", "auto", "--deployment-out", str(site)])
    e.start()
    try:
        yield e, site
    finally:
        e.stop()


def test_auto_adopts_the_switches_it_hears_and_installs_them_without_a_restart(emu, capsys):
    e, site = emu
    report = e.metadata["wiring"]
    with capsys.disabled():
        print(f"\ndeployment auto: adopted {report['deployment']['adopted']}; installed {report['installed']}")
    switches = len(fgraph.switches(e.graph))
    assert f"{switches} on datapath ids of their own" in report["deployment"]["adopted"]
    assert report["counts"] == {"missing": 0, "miswired": 0, "unexpected": 0}
    assert report["links_ok"] == len(wiring.expected_links(e.graph)) // 2
    assert report["installed"]["switches"] == switches
    assert e.controller_losses == []                 # the same controller process all along
    data = deployment.load(e.graph, site)            # the map it adopted, written with no mistake
    assert {deployment.parse_dpid(s["dpid"]) for s in data["switches"].values()} == set(
        foreign_dpids(e.graph, DPID_BASE).values())
    assert e.ping_all()["failed"] == []
