"""`hpnlab emulate/clean/doctor`: bad input gets one line and nothing is built; doctor tells the truth.

(mini-cross-campus coming up, two campuses and long-haul links: test_controller_emulation_presets.py.)"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

pytestmark = [pytest.mark.emulation]
ROOT = REPO
HPNLAB = [sys.executable, "-m", "hpnlab.cli"]


def _hpnlab(*args, env=None, user=None, timeout=120):
    cmd = HPNLAB + list(args)
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def _snapshot():
    bridges = set(subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout.split())
    runs = set(os.listdir("/run/hpnlab/runs")) if os.path.isdir("/run/hpnlab/runs") else set()
    return bridges, runs


def _assert_one_line_refusal(result, *words):
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpnlab: "), result.stderr
    assert "Traceback" not in result.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture
def nothing_built(emulation_ready):
    before = _snapshot()
    yield
    assert _snapshot() == before


def test_emulate_refuses_without_root_in_one_line(nothing_built):
    _assert_one_line_refusal(_hpnlab("emulate", "mini-hpn", user=65534), "root", "sudo")


def test_clean_refuses_without_root_in_one_line(nothing_built):
    _assert_one_line_refusal(_hpnlab("clean", user=65534), "root")


def test_emulate_refuses_when_ovs_is_not_running(nothing_built, tmp_path):
    # ovs-vsctl finds no database socket in this run directory: to hpnlab, OVS is not running
    _assert_one_line_refusal(_hpnlab("emulate", "mini-hpn", env={"OVS_RUNDIR": str(tmp_path)}),
                             "Open vSwitch is not running", "ovs-ctl start")


def test_emulate_refuses_a_taken_openflow_port(nothing_built):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _assert_one_line_refusal(_hpnlab("emulate", "mini-hpn", "--ofp-port", str(port)), str(port), "taken")


def test_emulate_refuses_a_scenario_too_large_with_the_numbers(nothing_built):
    r = _hpnlab("emulate", "fat-tree-8")
    _assert_one_line_refusal(r, "too large", "128 hosts", "80 switches", "208 nodes")


def test_emulate_refuses_a_scenario_too_fast_for_userspace_ovs(nothing_built):
    r = _hpnlab("emulate", "small-hpn", "--set", "emulation.host_mbps=200", "--set", "emulation.max_mbps=800")
    _assert_one_line_refusal(r, "too fast", "packets/s")


def test_emulate_refuses_an_unknown_controller(nothing_built):
    _assert_one_line_refusal(_hpnlab("emulate", "mini-hpn", "--controller", "ryu"), "unknown controller", "ryu")


def test_controller_none_refuses_a_fabric_with_loops(nothing_built):
    _assert_one_line_refusal(_hpnlab("emulate", "mini-hpn", "--controller", "none"), "loop")


@pytest.mark.parametrize("args, words", [
    (("--failover-probe", "meteor"), ("unknown failure kind", "meteor")),
    (("--failover-probe", "gray", "--probe-link", "p0l0-p1s0"), ("no link p0l0-p1s0",)),
    (("--bfd", "-5"), ("BFD interval",)),
])
def test_emulate_refuses_a_wrong_failover_probe_or_bfd_setting(nothing_built, args, words):
    _assert_one_line_refusal(_hpnlab("emulate", "mini-hpn", *args), *words)


def test_doctor_reports_what_an_emulation_will_use_here(emulation_ready):
    from hpnlab.fabric.emulation import kernel

    r = _hpnlab("doctor", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    caps = report["capabilities"]
    assert caps["ovs_running"] is True
    # independent checks of what the doctor claims: a qdisc exists iff tc can create it
    qdisc_args = {"htb": "htb", "netem": "netem delay 1ms",
                  "red": "red limit 400000 min 30000 max 90000 avpkt 1000 burst 55 bandwidth 10mbit"}
    for q, args in qdisc_args.items():
        with_tc = subprocess.run(["unshare", "-n", "sh", "-c", f"tc qdisc add dev lo root {args}"],
                                 capture_output=True).returncode == 0
        assert caps["qdiscs"][q] is with_tc, q
    assert caps["datapath"] == ("kernel" if Path("/sys/module/openvswitch").exists() else "user")
    gaps = [f for f in report["findings"] if f["status"] != "ok"]
    assert all(f["fix"] for f in gaps), "every gap names the command that fixes it"
    if not caps["netem"]:
        assert any("NOT emulated" in f["meaning"] for f in gaps)
    assert kernel.probe().ecn_mechanism == caps["ecn_mechanism"]


def test_doctor_estimates_whether_a_scenario_fits(emulation_ready):
    small = json.loads(_hpnlab("doctor", "small-hpn", "--json").stdout)["estimate"]
    big = json.loads(_hpnlab("doctor", "fat-tree-8", "--json").stdout)["estimate"]
    assert small["fits"] is True and small["hosts"] == 32
    assert big["fits"] is False and big["nodes"] == 208

