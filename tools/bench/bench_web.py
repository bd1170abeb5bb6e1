"""The web view's update rate and CPU cost while an emulation runs (figures for its closing note).

Runs ``hpnlab run mini-hpn --collective all_to_all ... --timeline (one link down) --web`` as a
child process, opens the page in headless Chromium (Playwright, /usr/bin/chromium), and over a
window of the collective measures: frames per second the page received; CPU seconds of the
view's own threads (the server's ``/stats.json``: the frame loop and the event streams), of the
whole ``hpnlab run`` process, and of the browser's processes; a screenshot while the link is
failed. Needs root and Open vSwitch: run it under the emulation lock::

    flock /tmp/hpnlab-emu-tests.lock .venv/bin/python tools/bench/bench_web.py --out /work/notes/web
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench_emulation import proc_cpu_s

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def pids_with(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (our own browser's unique profile folder)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/bench-web", help="folder for the figures and screenshots")
    ap.add_argument("--port", type=int, default=8799)
    ap.add_argument("--window", type=float, default=10.0, help="seconds measured")
    ap.add_argument("--link", default="p0l0-p0s0", help="the link the timeline fails")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="hpnlab-bench-web-"))
    tl = tmp / "timeline.yaml"
    tl.write_text(f"events:\n  - {{at: 2.0, action: link_down, link: {args.link}}}\n")
    hpnlab = str(Path(sys.executable).parent / "hpnlab")
    cmd = [hpnlab, "run", "mini-hpn", "--collective", "all_to_all", "--transport", "roce", "--entropy", "flow",
           "--minbytes", "256K", "--maxbytes", "1M", "--iters", "20", "--timeline", str(tl), "--quiet",
           "--web", f"127.0.0.1:{args.port}", "--out", str(tmp / "run")]
    print("$", " ".join(cmd), flush=True)
    run = subprocess.Popen(cmd, stdout=open(tmp / "run.log", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    url = f"http://127.0.0.1:{args.port}/"
    figures: dict[str, Any] = {"command": " ".join(cmd)}
    try:
        deadline = time.time() + 180
        while True:
            try:
                get(url + "stats.json")
                break
            except OSError:
                if run.poll() is not None or time.time() > deadline:
                    print((tmp / "run.log").read_text()[-2000:])
                    return 1
                time.sleep(0.5)
        from playwright.sync_api import sync_playwright
        profile = tmp / "chromium-profile"
        with sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, args=ARGS,
                                                       headless=True, viewport={"width": 1500, "height": 560})
            page = ctx.new_page()
            page.goto(url)
            page.wait_for_selector('body[data-ready="1"]', timeout=20000)
            eid = f"L:{args.link}/0:ab"
            deadline = time.time() + 120
            while page.get_attribute(f'[id="{eid}"]', "stroke") != "#d62728":
                if run.poll() is not None or time.time() > deadline:
                    page.screenshot(path=str(tmp / "no-failure-seen.png"))
                    print("the failed link never turned red:", get(url + "stats.json") if run.poll() is None else "",
                          (tmp / "run.log").read_text()[-1500:])
                    return 1
                time.sleep(0.2)
            browser = pids_with(str(profile))
            s0, f0 = get(url + "stats.json"), page.evaluate("window.hpnlabStats.frames")
            c_run0, c_br0, t0 = proc_cpu_s([run.pid]), proc_cpu_s(browser), time.monotonic()
            shot_at = t0 + min(4.0, args.window / 2)
            shot = False
            while time.monotonic() - t0 < args.window and run.poll() is None:
                time.sleep(0.25)
                if not shot and time.monotonic() >= shot_at:
                    page.screenshot(path=str(out / "mini-hpn-all-to-all-link-failed.png"))
                    shot = True
            s1, f1 = get(url + "stats.json"), page.evaluate("window.hpnlabStats.frames")
            c_run1, c_br1, t1 = proc_cpu_s([run.pid]), proc_cpu_s(browser), time.monotonic()
            if not shot:
                page.screenshot(path=str(out / "mini-hpn-all-to-all-link-failed.png"))
            dt = t1 - t0
            figures.update({
                "window_s": round(dt, 2),
                "page_frames_per_s": round((f1 - f0) / dt, 2),
                "server_frames_per_s": round((s1["frames_made"] - s0["frames_made"]) / dt, 2),
                "view_threads_cpu_share": round((s1["frame_cpu_s"] - s0["frame_cpu_s"]
                                                 + s1["send_cpu_s"] - s0["send_cpu_s"]) / dt, 4),
                "hpnlab_run_process_cpu_share": round((c_run1 - c_run0) / dt, 4),
                "browser_cpu_share": round((c_br1 - c_br0) / dt, 4),
                "browser_processes": len(browser),
                "collective_during_window": page.evaluate("document.getElementById('collective').textContent"),
                "loadavg": os.getloadavg(), "cpus": os.cpu_count()})
            ctx.close()
        run.wait(timeout=600)
        figures["run_exit"] = run.returncode
    finally:
        if run.poll() is None:
            run.terminate()
            try:
                run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                run.kill()
    (out / "bench-web.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    print(f"run log: {tmp / 'run.log'}; results: {tmp / 'run'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
