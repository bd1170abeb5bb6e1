"""The web view in a real headless browser (Chromium from the system's packages, driven by
Playwright): a stored run replayed draws the picture the pure frames say; on an emulated mini-hpn
the page shows every switch and link, a failure from the harness timeline turns its link red
within two seconds, and a click on a link fails it in the emulation (checked in Open vSwitch).
Screenshots of each state are kept under results/test-artefacts/web/ (or $HPNLAB_TEST_ARTEFACTS)."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpnlab.fabric import graph, spec
from hpnlab.fabric.graph import intf_name
from hpnlab.fabric.web import server, view

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DATA = Path(__file__).parent / "data"


def artefacts() -> Path:
    d = Path(os.environ.get("HPNLAB_TEST_ARTEFACTS") or Path(__file__).parent.parent / "results" / "test-artefacts")
    (d / "web").mkdir(parents=True, exist_ok=True)
    return d / "web"


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"Chromium is missing ({CHROMIUM}: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright for Python is missing (pip install playwright)")
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path_factory.mktemp("chromium-profile")),
                                                   executable_path=CHROMIUM, args=ARGS, headless=True,
                                                   viewport={"width": 1500, "height": 620})
        try:
            yield ctx
        finally:
            ctx.close()


def open_page(browser, url: str):
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector('body[data-ready="1"]', timeout=15000)
    return page


def strokes(page) -> dict[str, str]:
    return page.evaluate("Object.fromEntries([...document.querySelectorAll('#fabric line.lk')]"
                         ".map(e => [e.id, e.getAttribute('stroke')]))")


# ---- replay: no root -----------------------------------------------------------------------------

def test_a_replayed_run_draws_the_same_picture_as_its_frames_at_the_same_moment(browser):
    doc = json.loads((DATA / "web-replay-run.json").read_text())
    lay = view.layout(graph.build(spec.load(doc["meta"]["scenario"])))
    frames = view.replay_frames(lay, doc)
    srv = server.WebServer(server.ReplaySource(lay, frames), "127.0.0.1", 0).start()
    try:
        page = open_page(browser, srv.url)
        for t in (0.0, 1.2, 2.0, 3.5):
            shown = page.evaluate(f"window.hpnlabSeek({t})")
            fr = view.frame_at(frames, t)
            assert shown == fr["t"]
            assert strokes(page) == view.link_colours(fr, lay)
        page.evaluate("window.hpnlabSeek(2.0)")
        assert page.get_attribute('[id="L:p1l2-p1s1/0:ba"]', "class") == "lk gray"   # the gray side
        page.screenshot(path=str(artefacts() / "replay-t2.png"))
        png = page.evaluate("window.hpnlabPng()")
        assert png.startswith("data:image/png;base64,")
        (artefacts() / "replay-t2-export.png").write_bytes(base64.b64decode(png.split(",", 1)[1]))
    finally:
        srv.stop()


# ---- live: an emulated mini-hpn -------------------------------------------------------------------

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
    runner = timeline.Runner(emu, [{"at": 0.1, "action": "link_down", "link": ["p0l1", "p0s1"]},
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
