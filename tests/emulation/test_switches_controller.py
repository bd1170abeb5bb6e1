"""The real controller process over TCP against simulated switches (hpnlab switches): what it installs equals
the compiler's tables, the proofs pass on them, and an injected link failure reaches it as PortStatus and its
repair reaches the switches. No root needed: no Open vSwitch, no Mininet."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("os_ken")

from support.fabrics import fabric

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.switches import dump, harness

pytestmark = [pytest.mark.controller]
LLDP = frozenset({0x88CC})       # the controller's LLDP rule: its own, not the compiler's
G = fabric("mini-hpn")


def installed(run: harness.Run, name: str) -> dict:
    run.send(f"dump {run.dir / name}")
    return dump.read(run.dir / name)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with harness.Run("mini-hpn", controller_args=["--ecn-actuator", "none"],
                     directory=tmp_path_factory.mktemp("run")) as r:
        r.wait(r.settled(harness.expected_counts(compiler.compile_fabric(G), extra_flows=1)))
        yield r


def test_the_controller_installs_the_compiler_s_tables_on_every_simulated_switch(run):
    got = installed(run, "cold")
    assert dump.expanded(got, LLDP) == dump.expanded(compiler.compile_fabric(G))


def test_the_proofs_pass_on_what_the_controller_installed(run):
    assert dump.prove_installed(G, installed(run, "proof")).ok


def test_a_link_failure_reaches_the_controller_and_its_repair_reaches_the_switches(run):
    links = [("p0l0", "p0s0", k) for k in G["p0l0"]["p0s0"]]
    failures = compiler.Failures.of(links)
    want = compiler.compile_fabric(G, failures)
    assert dump.expanded(want) != dump.expanded(compiler.compile_fabric(G))     # the failure changes tables
    since = time.time()
    run.send("link down p0l0 p0s0")
    run.wait(run.settled(harness.expected_counts(want, extra_flows=1), since))
    deadline = time.monotonic() + 60
    while dump.expanded(got := installed(run, "failed"), LLDP) != dump.expanded(want) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert dump.expanded(got, LLDP) == dump.expanded(want)
    assert "port" in run.log("controller.log") and "down" in run.log("controller.log")
    assert dump.prove_installed(G, got, failures).ok
    run.send("link up p0l0 p0s0")
    run.wait(run.settled(harness.expected_counts(compiler.compile_fabric(G), extra_flows=1), time.time()))


def test_a_controller_restarted_over_a_running_fabric_changes_nothing(run):
    healthy = harness.expected_counts(compiler.compile_fabric(G), extra_flows=1)
    run.wait(run.settled(healthy))
    before = {n: s["flow_mods"] + s["group_mods"] for n, s in run.stats()["switches"].items()}
    run.stop_the_controller()
    since = time.time()
    run.start_the_controller()
    st = run.wait(lambda st: all((s["read_at"] or 0) > since for s in st["switches"].values()))
    assert run.controller is not None
    run.wait_log("controller.log", "routes installed on", run.controller, 120)   # read back, nothing outstanding
    st = run.wait(run.settled(healthy))
    assert {n: s["flow_mods"] + s["group_mods"] for n, s in st["switches"].items()} == before
