"""The web view in a real headless browser (Chromium from the system's packages, driven by
Playwright): a stored run replayed draws the picture the pure frames say; on an emulated mini-hpn
the page shows every switch and link, a failure from the harness timeline turns its link red
within two seconds, and a click on a link fails it in the emulation (checked in Open vSwitch).
Screenshots of each state are kept under results/test-artefacts/web/ (or $HPNLAB_TEST_ARTEFACTS)."""
from __future__ import annotations

import base64
import json

from support.browser import DATA, artefacts, open_page

from hpnlab.fabric.scenario import graph, spec
from hpnlab.fabric.web import server, view


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
