"""The live web view of a running emulation in headless Chromium."""
from __future__ import annotations

import subprocess
import time

import pytest
from support.browser import artefacts, open_page

from hpnlab.fabric.scenario import graph
from hpnlab.fabric.scenario.graph import intf_name
from hpnlab.fabric.web import view


@pytest.fixture(scope="module")
def live(mini_hpn, browser):
    from hpnlab.fabric.web.live import LiveWeb
    with LiveWeb(mini_hpn, "127.0.0.1", 0, say=lambda m: None) as web:
        page = open_page(browser, web.server.url)
        yield mini_hpn, web, page


def is_red(page, eid: str) -> bool:
    return page.get_attribute(f'[id="{eid}"]', "stroke") == view.FAILED


def ovs_link_state(intf: str) -> str:
    return subprocess.run(["ovs-vsctl", "get", "Interface", intf, "link_state"], capture_output=True,
                          text=True, timeout=10).stdout.strip()


@pytest.mark.emulation
@pytest.mark.controller
def test_the_live_page_shows_every_switch_and_link_of_mini_hpn(live):
    emu, _web, page = live
    g = emu.graph
    shown = page.evaluate("[...document.querySelectorAll('#fabric line.lk')].map(e => e.dataset.link)")
    assert sorted(set(shown)) == sorted(view.link_id(g, u, v, k) for u, v, k in g.edges(keys=True))
    assert all(page.locator(f'[id="N:{s}"]').count() == 1 for s in graph.switches(g))
    page.wait_for_function("window.hpnlabStats.frames >= 3", timeout=10000)
    page.screenshot(path=str(artefacts() / "live-loaded.png"))


@pytest.mark.emulation
@pytest.mark.controller
def test_a_failure_from_the_timeline_turns_its_link_red_within_two_seconds(live):
    from hpnlab.fabric.emulation import timeline
    emu, _web, page = live
    eid = "L:p0l1-p0s1/0:ab"
    assert not is_red(page, eid)
    runner = timeline.Runner(emu.faults, [{"at": 0.1, "action": "link_down", "link": ["p0l1", "p0s1"]},
                                   {"at": 2.6, "action": "link_up", "link": ["p0l1", "p0s1"]}]).start()
    page.wait_for_function(f"document.getElementById('{eid}').getAttribute('stroke') === '{view.FAILED}'",
                           timeout=5000)
    seen = time.time()
    page.screenshot(path=str(artefacts() / "live-timeline-failure.png"))
    records = runner.join(timeout=10)
    assert seen - records[0]["wall"] < 2.0
    page.wait_for_function(f"document.getElementById('{eid}').getAttribute('stroke') !== '{view.FAILED}'",
                           timeout=5000)


@pytest.mark.emulation
@pytest.mark.controller
def test_a_click_on_a_link_fails_it_in_the_emulation_and_a_click_repairs_it(live):
    emu, web, page = live
    g = emu.graph
    lid = "p1l2-p1s0/0"
    ports = g.edges["p1l2", "p1s0", 0]["ports"]
    leaf_if, spine_if = intf_name("p1l2", ports["p1l2"]), intf_name("p1s0", ports["p1s0"])
    assert ovs_link_state(leaf_if) == "up"
    page.select_option("#click", "link_down")
    page.click(f'[id="L:{lid}:ab"]')
    deadline = time.time() + 5
    while ovs_link_state(leaf_if) != "down" and time.time() < deadline:
        time.sleep(0.1)
    assert ovs_link_state(leaf_if) == "down" and ovs_link_state(spine_if) == "down"
    assert [r["action"] for r in web.records] == ["link_down"] and web.records[0]["source"] == "web"
    page.wait_for_function(f"document.getElementById('L:{lid}:ab').getAttribute('stroke') === '{view.FAILED}'",
                           timeout=3000)
    page.screenshot(path=str(artefacts() / "live-click-failure.png"))
    page.select_option("#click", "repair")
    page.click(f'[id="L:{lid}:ba"]')
    deadline = time.time() + 5
    while ovs_link_state(leaf_if) != "up" and time.time() < deadline:
        time.sleep(0.1)
    assert ovs_link_state(leaf_if) == "up"
    assert [r["action"] for r in web.records] == ["link_down", "link_up"]
