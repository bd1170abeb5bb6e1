"""hpnlab.fabric.emulation.kernel: capability probes agree with the machine, and every gap has a fix."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpnlab.fabric.emulation import kernel


@pytest.fixture(scope="module")
def caps():
    return kernel.probe()


def _runs(*cmd: str) -> bool:
    """The program starts and exits 0 (evidence by running it, not by looking it up)."""
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_probe_reports_root_and_cpus_as_proc_does(caps):
    uid = next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("Uid:"))
    assert caps.root == (uid == "0")
    processors = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("processor")]
    assert caps.cpus == len(processors)


@pytest.mark.parametrize("attr,cmd", [("clang", ("clang", "--version")), ("iperf3", ("iperf3", "--version")),
                                      ("bpftool", ("bpftool", "version")), ("ethtool", ("ethtool", "--version"))])
def test_a_tool_is_reported_present_exactly_when_it_runs(caps, attr, cmd):
    assert getattr(caps, attr) == _runs(*cmd)


def test_ovs_running_matches_a_connection_to_the_ovsdb_socket(caps):
    import socket

    sock_path = Path("/var/run/openvswitch/db.sock")
    answered = False
    if sock_path.exists():
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(3)
            try:
                s.connect(str(sock_path))
                s.sendall(b'{"method":"echo","params":[],"id":1}')
                answered = b'"result"' in s.recv(4096)
            except OSError:
                answered = False
    assert caps.ovs_running == answered


def test_datapath_is_kernel_exactly_when_the_kernel_lists_ovs_datapaths(caps):
    if not caps.ovs_installed:
        pytest.skip("Open vSwitch is not installed: nothing to ask for datapaths")
    # ovs-dpctl talks to the kernel's ovs_datapath netlink family; it fails without the module
    assert caps.datapath == ("kernel" if _runs("ovs-dpctl", "dump-dps") else "user")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to try qdiscs in a private network namespace")
@pytest.mark.parametrize("qdisc,args", [("htb", "htb"), ("netem", "netem delay 1ms"),
                                        ("tbf", "tbf rate 1mbit burst 10kb latency 50ms")])
def test_qdisc_probe_matches_what_tc_can_create(caps, qdisc, args):
    created = subprocess.run(["unshare", "-n", "sh", "-c", f"tc qdisc add dev lo root {args}"],
                             capture_output=True).returncode == 0
    assert caps.qdiscs[qdisc] is created


def test_ecn_mechanism_prefers_red_and_falls_back_to_the_bpf_marker():
    full = kernel.Capabilities(bpf=True, clang=True, bpftool=True, tc_bpf=True,
                               qdiscs={"clsact": True, "red": True})
    assert full.ecn_mechanism == "red"
    no_red = kernel.Capabilities(bpf=True, clang=True, bpftool=True, tc_bpf=True,
                                 qdiscs={"clsact": True, "red": False})
    assert no_red.ecn_mechanism == "bpf"
    no_toolchain = kernel.Capabilities(bpf=True, clang=False, bpftool=True, tc_bpf=True,
                                       qdiscs={"clsact": True, "red": False})
    assert no_toolchain.ecn_mechanism is None


def test_every_capability_gap_has_a_fix_command():
    for key in ("root", "ovs_installed", "ovs_running", "ovs_kernel_datapath", "netem", "red", "htb",
                "clang", "bpftool", "os_ken", "mininet", "iperf3", "ping", "ethtool"):
        assert kernel.fix_for(key), key


def test_probe_leaves_no_network_namespace_behind():
    before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    kernel.probe()
    after = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    assert after == before


def _red_value(args, key):
    return int(args[args.index(key) + 1])


def test_red_limit_is_the_port_buffer_whatever_the_thresholds():
    from hpnlab.fabric.emulation.ecn import red_args

    for kmin, kmax in ((6056, 24224), (60000, 60000)):
        args = red_args(kmin, kmax, 0.2, mtu=1500, rate_mbps=10, limit_bytes=62500)
        assert _red_value(args, "limit") == 62500
        assert args[-1] == "ecn"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a red qdisc in a private network namespace")
@pytest.mark.parametrize("kmin,kmax", [(6056, 24224), (60000, 60000), (1514, 1514)])
def test_tc_accepts_the_red_stage_and_keeps_its_thresholds(caps, kmin, kmax):
    """tc itself is the judge of red's arguments (it refuses a burst its EWMA cannot use)."""
    import json

    from hpnlab.fabric.emulation.ecn import red_args

    if not caps.red:
        pytest.skip("this kernel has no sch_red: the ECN stage uses the BPF marker here")
    args = " ".join(red_args(kmin, kmax, 0.2, mtu=1500, rate_mbps=10, limit_bytes=62500))
    r = subprocess.run(["unshare", "-n", "sh", "-c", f"tc qdisc add dev lo root handle 1: {args} && "
                        "tc -j qdisc show dev lo"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    red = next(q for q in json.loads(r.stdout) if q["kind"] == "red")
    assert (red["options"]["min"], red["options"]["max"], red["options"]["limit"]) == (kmin, kmax, 62500)
