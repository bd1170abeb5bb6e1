"""A fabric under regression tests, with hpnlab's pytest plugin (installed with hpnlab):

    pytest topologies/examples/test_my_fabric.py
    pytest topologies/examples/test_my_fabric.py --hpn-rules topologies/examples/rules.yaml
"""
from pathlib import Path

import pytest

MY_FABRIC = str(Path(__file__).with_name("my-fabric.yaml"))


@pytest.mark.hpn_scenario(MY_FABRIC)
def test_design_rules_pass(hpn_check):
    assert not hpn_check.failed, "\n".join(f"{r.rule} {r.subject}: {r.figure} > {r.limit}" for r in hpn_check.failed)


@pytest.mark.hpn_scenario(MY_FABRIC)
def test_every_switch_keeps_half_its_route_table_free(hpn_scenario, hpn_tables):
    assert max(st.route_count for st in hpn_tables.values()) <= hpn_scenario.switch_tables.routes // 2


@pytest.mark.hpn_scenario(MY_FABRIC)
def test_first_and_last_host_reach_each_other_on_every_plane(hpn_scenario, hpn_walker):
    for plane in range(hpn_scenario.planes):
        assert hpn_walker.send("h1", f"h{hpn_scenario.hosts}", plane=plane).result == "delivered"
