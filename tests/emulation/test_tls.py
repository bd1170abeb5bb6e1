"""OpenFlow over TLS with real Open vSwitch: switches with a certificate of the controller's CA
connect over ``ssl:`` and get their flows; a switch with a certificate of another CA does not.

Open vSwitch's SSL setting is machine-wide (one row per ovsdb): each test reads it first and
the emulation's teardown (or the test's ``finally``) puts it back; both tests check that.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.emulated import flow_lines
from support.paths import REPO, SCRIPTS
from support.wait import wait_for

from hpnlab.fabric.emulation import ovsdb
from hpnlab.fabric.emulation.controller_process import free_port, tls_args, tls_files
from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

ROOT = REPO
SMALL = {"segments_per_pod": 2, "hosts_per_segment": 2, "spines_per_plane": 1}   # mini-hpn cut to 6 switches


def make_ca(directory: Path, name: str) -> Path:
    subprocess.run(["sh", str(SCRIPTS / "make_test_ca.sh"), str(directory), name], check=True,
                   capture_output=True, timeout=60)
    return directory


def vsctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ovs-vsctl", "--timeout=10", *args], capture_output=True, text=True, timeout=20)


def test_switches_connect_over_tls_with_the_test_cas_certificates_and_get_their_flows(emulation_ready, tmp_path):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, PortOptions, SupervisionOptions

    ca = make_ca(tmp_path / "ca", "hpnlab trusted")
    before = ovsdb.get_ssl()
    emu = Emulation(spec.load("mini-hpn", SMALL), EmulationOptions(
        controller=ControllerOptions(telemetry_interval_ms=0, tls_dir=ca), ports=PortOptions(ecn=False, shape=False),
        supervision=SupervisionOptions(verify=False, lock_wait_s=300)), log=None)
    try:
        emu.start()
        switches = fgraph.switches(emu.graph)
        targets = {vsctl("get-controller", sw).stdout.strip() for sw in switches}
        assert targets == {f"ssl:127.0.0.1:{emu.controller.ofp_port}"}
        assert ovsdb.get_ssl() == {"private_key": str(ca / "switch-key.pem"),
                                   "certificate": str(ca / "switch-cert.pem"),
                                   "ca_cert": str(ca / "ca-cert.pem"), "bootstrap_ca_cert": False}
        states = compiler.compile_fabric(emu.graph, None, "aggregate")
        want = {sw: states[sw].flow_count for sw in switches}
        assert wait_for(lambda: {sw: len(flow_lines(sw)) for sw in switches} == want,
                        15), "flows not installed over TLS"
        assert emu.ping_all()["failed"] == []
    finally:
        emu.stop()
    assert ovsdb.get_ssl() == before, "Open vSwitch's SSL setting was not put back"


def test_a_switch_presenting_a_certificate_of_another_ca_is_refused(emulation_ready, tmp_path):
    from hpnlab.fabric.emulation.state import Lock

    trusted = tls_files(make_ca(tmp_path / "trusted", "hpnlab trusted"))
    stranger = tls_files(make_ca(tmp_path / "stranger", "hpnlab stranger"))
    g = fgraph.build(spec.load("mini-hpn"))
    switch = fgraph.switches(g)[0]
    bridge = "hpnlabtls0"
    port = free_port(6653)
    log = tmp_path / "controller.log"
    lock = Lock()
    lock.acquire("test_tls_emulation: an untrusted switch", 300)
    before = ovsdb.get_ssl()
    proc = None
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "hpnlab.controller", "mini-hpn", "--ofp-port", str(port),
                                     "--telemetry-interval-ms", "0", *tls_args(trusted)],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        assert wait_for(lambda: "ready" in log.read_text(errors="replace"), 30), log.read_text(errors="replace")
        # the switch trusts the controller (its CA file is the controller's CA) but presents a stranger's certificate
        assert ovsdb.set_ssl(stranger["switch_key"], stranger["switch_cert"], trusted["ca"]) is None
        dpid = f"{g.nodes[switch]['dpid']:016x}"
        r = vsctl("add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev", "fail_mode=secure",
                  "protocols=OpenFlow13", f"other-config:datapath-id={dpid}", "--",
                  "set-controller", bridge, f"ssl:127.0.0.1:{port}")
        assert r.returncode == 0, r.stderr
        refused = wait_for(lambda: "TLS handshake refused" in log.read_text(errors="replace"), 15)
        text = log.read_text(errors="replace")
        assert refused, text
        assert re.search(r"handshake refused: .*(unknown ca|certificate verify failed)", text, re.I), text
        assert ovsdb.connected([bridge]) == {bridge: False}
        assert len(flow_lines(bridge)) == 0
        assert f"{switch} (dpid" not in text       # the controller never saw the switch
    finally:
        vsctl("--if-exists", "del-br", bridge)
        ovsdb.restore_ssl(before)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        lock.release()
    assert ovsdb.get_ssl() == before
