"""An emulation killed at any moment leaves nothing `hpnlab clean` does not remove, and
`hpnlab clean` removes only what hpnlab made; SIGINT/SIGTERM clean up by themselves."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support.paths import REPO

from hpnlab.fabric.emulation import kernel

pytestmark = [pytest.mark.emulation]
ROOT = REPO
HPNLAB = [sys.executable, "-m", "hpnlab.cli"]

RUNNER = """
import signal, sys, time
from hpnlab.fabric.emulation import Emulation
from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, SupervisionOptions
from hpnlab.fabric.scenario import spec
signal.signal(signal.SIGINT, signal.default_int_handler)   # a parent that ignores SIGINT passes that on
controller = sys.argv[1]
over = {"segments_per_pod": 2}
if sys.argv[2:] == ["pfc"]:
    over["emulation"] = {"lossless": {"pfc": True}}
if controller == "none":
    over.update(spines_per_plane=1, oversubscription=None)
options = EmulationOptions(controller=ControllerOptions(kind=controller),
                           supervision=SupervisionOptions(lock_wait_s=300))
with Emulation(spec.load("mini-hpn", over), options) as emu:
    emu.popen("h1", ["iperf3", "-s", "-B", emu.ip("h1")])
    print("READY", emu.state.path, flush=True)
    time.sleep(600)
"""


def _start(controller: str, *extra: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, controller, *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        proc.kill()
        proc.wait()
        pytest.fail(f"the emulation did not come up (got {line!r})")
    return proc, json.loads(Path(line[1]).read_text())


def _send_buffer(entry: dict) -> int:
    """The send buffer of a socket a run recorded (``state.send_buffers``), as SO_SNDBUF reports it."""
    import socket

    from hpnlab.fabric.emulation.datapath_socket import _with_socket
    return _with_socket(entry["pid"], entry["fd"], lambda s: s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))


def _bridges() -> set[str]:
    return set(subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout.split())


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _netns_in_use() -> set[int]:
    out = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            ino = _netns_inode(int(entry.name))
            if ino:
                out.add(ino)
    return out


def _marked_processes(run_id: str) -> list[int]:
    from hpnlab.fabric.emulation.cleanup import marked_pids
    return marked_pids({run_id})


def _leftovers(state: dict, host_netns: set[int | None]) -> dict[str, list]:
    present = {p.name for p in Path("/sys/class/net").iterdir()}
    qdisc_devs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    bpf_progs = "".join(subprocess.run(["bpftool", "prog", "show", "name", name], capture_output=True,
                                       text=True).stdout for name in ("hpn_ecn", "sw_in", "sw_out", "host_in"))
    qos = subprocess.run(["ovs-vsctl", "--columns=external_ids", "list", "QoS"], capture_output=True,
                         text=True).stdout
    return {
        "bridges": sorted(_bridges() & set(state["bridges"])),
        "interfaces": sorted(present & set(state["interfaces"])),
        "qdiscs": [i for i in state["interfaces"] if f"dev {i} " in qdisc_devs],
        "namespaces": sorted(host_netns & _netns_in_use()),
        "processes": [p["pid"] for p in state["pids"] if _alive(p)] + _marked_processes(state["run_id"]),
        "bpf_pins": [p for p in state["bpf_pins"] if Path(p).exists()],
        "bpf_programs": [bpf_progs] if bpf_progs.strip() else [],
        "qos_rows": [state["run_id"]] if state["run_id"] in qos else [],
        "state_file": [state["run_id"]] if Path(f"/run/hpnlab/runs/{state['run_id']}.json").exists() else [],
    }


def _alive(p: dict) -> bool:
    from hpnlab.fabric.emulation.state import pid_alive
    return pid_alive(p["pid"], p.get("start"))


@pytest.fixture
def bystanders(emulation_ready):
    """An OVS bridge, a veth pair and a process that are not hpnlab's: they must survive."""
    tag = uuid.uuid4().hex[:6]
    br, veth = f"keep{tag}", f"keepv{tag}"
    subprocess.run(["ovs-vsctl", "add-br", br, "--", "set", "bridge", br, "datapath_type=netdev"], check=True)
    subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"], check=True)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        yield {"bridge": br, "veth": veth, "process": sleeper}
    finally:
        sleeper.kill()
        sleeper.wait()
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", br])
        subprocess.run(["ip", "link", "del", veth], capture_output=True)


def _assert_bystanders_survive(b):
    assert b["bridge"] in _bridges()
    assert Path(f"/sys/class/net/{b['veth']}").exists()
    assert b["process"].poll() is None


@pytest.mark.controller
def test_kill_9_mid_run_then_clean_leaves_nothing_and_spares_other_bridges(bystanders):
    proc, state = _start("hpnlab")
    host_netns = {_netns_inode(p["pid"]) for p in state["pids"] if p["what"].startswith("host ")} - {None}
    assert host_netns, "the hosts' namespaces should be recorded"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(0.2)
    left = _leftovers(state, host_netns)
    # SIGKILL really left things behind (else this test could not fail)
    assert left["bridges"] and left["processes"] and left["bpf_pins"]
    sched = state.get("scheduling") or []
    buffers = state.get("send_buffers") or []
    if kernel.probe(deep=False).datapath == "user":   # its ovs-vswitchd thread was raised to nice -20: still is
        assert sched and os.getpriority(os.PRIO_PROCESS, sched[0]["pid"]) == -20 != sched[0]["nice"]
        assert buffers and all(_send_buffer(e) > e["size"] for e in buffers)    # and its send socket raised

    done = subprocess.run(HPNLAB + ["clean"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cleaned 1 run" in done.stdout
    assert _leftovers(state, host_netns) == {k: [] for k in left}
    for entry in sched:                   # and clean put its scheduling policy and nice value back
        assert (os.sched_getscheduler(entry["pid"]), os.sched_getparam(entry["pid"]).sched_priority,
                os.getpriority(os.PRIO_PROCESS, entry["pid"])) == (entry["policy"], entry["priority"], entry["nice"])
    assert [_send_buffer(e) for e in buffers] == [e["size"] for e in buffers]     # and its send buffer
    _assert_bystanders_survive(bystanders)


@pytest.mark.controller
def test_kill_9_of_a_run_with_pfc_then_clean_leaves_nothing(bystanders):
    """Priority flow control adds a pinned data path, its gates and the pause agent (by pid, raised to
    SCHED_FIFO): after SIGKILL of the run, `hpnlab clean` removes them as everything else."""
    proc, state = _start("hpnlab", "pfc")
    host_netns = {_netns_inode(p["pid"]) for p in state["pids"] if p["what"].startswith("host ")} - {None}
    agent = [p for p in state["pids"] if p["what"] == "pfc agent"]
    assert agent and _alive(agent[0])
    assert any(p.endswith("-pfc") for p in state["bpf_pins"])
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(0.2)
    assert _alive(agent[0])                      # SIGKILL really left the agent running
    done = subprocess.run(HPNLAB + ["clean"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    left = _leftovers(state, host_netns)
    assert left == {k: [] for k in left}
    _assert_bystanders_survive(bystanders)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_and_sigint_clean_up_by_themselves(bystanders, sig):
    proc, state = _start("none")
    host_netns = {_netns_inode(p["pid"]) for p in state["pids"] if p["what"].startswith("host ")} - {None}
    proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)      # leave nothing running for the tests after this one
        proc.wait(timeout=60)
        pytest.fail(f"the run did not end within 60 s of {sig.name}")
    left = _leftovers(state, host_netns)
    assert left == {k: [] for k in left}
    _assert_bystanders_survive(bystanders)


def test_clean_leaves_a_live_run_alone(bystanders):
    proc, state = _start("none")
    try:
        done = subprocess.run(HPNLAB + ["clean"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0
        assert "still running" in done.stdout
        assert set(state["bridges"]) <= _bridges()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _state_of(pid: int, timeout: float = 10.0) -> dict | None:
    """The state file written by the run whose owner is `pid` (None if it never wrote one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in Path("/run/hpnlab/runs").glob("*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if data.get("owner_pid") == pid:
                return data
        time.sleep(0.05)
    return None


@pytest.mark.controller
@pytest.mark.parametrize("after_s", [2.0, 4.0], ids=["while-building", "while-connecting"])
def test_kill_9_during_start_then_clean_leaves_nothing(bystanders, after_s):
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, "hpnlab"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    state = _state_of(proc.pid)
    assert state is not None, "the run should have written its state file"
    time.sleep(after_s)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = _state_of(proc.pid)            # as the killed run left it
    assert state is not None
    host_netns = {_netns_inode(p["pid"]) for p in state["pids"] if p["what"].startswith("host ")} - {None}
    done = subprocess.run(HPNLAB + ["clean"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    left = _leftovers(state, host_netns)
    assert left == {k: [] for k in left}
    _assert_bystanders_survive(bystanders)


def test_a_second_run_waits_for_the_first_instead_of_calling_its_bridges_leftovers(emulation_ready):
    """The names are checked under the machine-wide lock: a run in progress holds it, so a second
    run of the same fabric is told another is running (after its wait), not that the first one's
    bridges are left over (which told the user to clean a live run)."""
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, PortOptions, SupervisionOptions
    from hpnlab.fabric.errors import UserError

    first = Emulation("mini-spine-leaf", EmulationOptions(
        ports=PortOptions(ecn=False, shape=False),
        supervision=SupervisionOptions(verify=False, lock_wait_s=300)), log=None)
    first.start()
    try:
        second = Emulation("mini-spine-leaf", EmulationOptions(
            ports=PortOptions(ecn=False, shape=False),
            supervision=SupervisionOptions(verify=False, lock_wait_s=1)), log=None)
        with pytest.raises(UserError, match="another emulation is running"):
            second.start()
    finally:
        first.stop()
    assert not any(b.startswith("p0") for b in _bridges())


def test_a_foreign_bridge_with_a_switchs_name_is_refused_left_alone_and_the_lock_freed(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, PortOptions, SupervisionOptions
    from hpnlab.fabric.emulation.state import Lock
    from hpnlab.fabric.errors import UserError

    subprocess.run(["ovs-vsctl", "add-br", "p0l0", "--", "set", "bridge", "p0l0", "datapath_type=netdev"], check=True)
    try:
        e = Emulation("mini-spine-leaf", EmulationOptions(
            ports=PortOptions(ecn=False, shape=False),
            supervision=SupervisionOptions(verify=False, lock_wait_s=60)), log=None)
        with pytest.raises(UserError, match="p0l0 exists and is not hpnlab's"):
            e.start()
        assert "p0l0" in _bridges()
        lock = Lock()
        lock.acquire("the test", wait_s=0)         # free again: nothing waits behind a refused run
        lock.release()
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", "p0l0"])
