"""The pytest plugin's hpn_emulation fixture on real Open vSwitch (root)."""
from __future__ import annotations

import subprocess

import pytest


@pytest.mark.emulation
def test_hpn_emulation_builds_the_scenario_and_tears_it_down(pytester, emulation_ready):
    pytester.makepyfile("import pytest\n@pytest.mark.hpn_scenario('mini-hpn')\n"
                        "def test_pings(hpn_emulation):\n"
                        "    assert hpn_emulation.ping_all()['failed'] == []\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=True).stdout.split()
    assert not [b for b in bridges if b.startswith(("p0", "p1"))]
