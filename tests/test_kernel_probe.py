"""hpnlab.fabric.kernel: capability probes agree with the machine, and every gap has a fix."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpnlab.fabric import kernel


@pytest.fixture(scope="module")
def caps():
    return kernel.probe()


def test_probe_reports_root_cpus_and_tools_as_they_are(caps):
    assert caps.root == (os.geteuid() == 0)
    assert caps.cpus == os.cpu_count()
    assert caps.clang == (shutil.which("clang") is not None)
    assert caps.iperf3 == (shutil.which("iperf3") is not None)


def test_ovs_running_matches_ovs_vsctl(caps):
    if not caps.ovs_installed:
        assert caps.ovs_running is False
        return
    answered = subprocess.run(["ovs-vsctl", "--timeout=3", "show"], capture_output=True).returncode == 0
    assert caps.ovs_running == answered


def test_datapath_is_kernel_only_when_the_openvswitch_module_is_loaded(caps):
    assert caps.datapath == ("kernel" if Path("/sys/module/openvswitch").exists() else "user")


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


def test_red_burst_meets_tc_ewma_rule_even_when_kmin_equals_kmax():
    from hpnlab.fabric.emulation.ecn import red_args

    # tc refuses burst < 1 + min/avpkt ("tc_red_eval_ewma() burst 39 is too small ? Try burst 40")
    args = red_args(60000, 60000, 0.2, mtu=1500, rate_mbps=10, limit_bytes=62500)
    assert _red_value(args, "burst") >= 1 + 60000 // 1514
    assert args[-1] == "ecn"


def test_red_limit_is_the_port_buffer_whatever_the_thresholds():
    from hpnlab.fabric.emulation.ecn import red_args

    for kmin, kmax in ((6056, 24224), (60000, 60000)):
        args = red_args(kmin, kmax, 0.2, mtu=1500, rate_mbps=10, limit_bytes=62500)
        assert _red_value(args, "limit") == 62500


def test_red_burst_follows_the_tc_red_rule_of_thumb():
    from hpnlab.fabric.emulation.ecn import red_args

    args = red_args(6056, 24224, 0.2, mtu=1500, rate_mbps=10, limit_bytes=62500)
    assert _red_value(args, "burst") == max((2 * 6056 + 24224) // (3 * 1514), 1 + 6056 // 1514)
    assert args[args.index("probability") + 1] == "0.2" and "10mbit" in args
