"""What the emulation runs on a second machine (hpnlab.fabric.emulation.remote), checked without one:
the ssh command lines, the marked remote command, the port configuration, the placement
record and the teardown script (run here against a process of its own)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import uuid

import pytest

from hpnlab.fabric.emulation import remote
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario import spec


def test_ssh_pins_the_key_and_the_known_host_and_multiplexes_per_run():
    ssh = remote.Ssh(identity="/k/id", known_hosts="/k/kh", control_dir="/run/x")
    argv = ssh.argv("10.0.0.2", tty=True)
    assert argv[0] == "ssh" and argv[-1] == "root@10.0.0.2" and "-tt" in argv
    joined = " ".join(argv)
    assert "-i /k/id" in joined and "IdentitiesOnly=yes" in joined
    assert "UserKnownHostsFile=/k/kh" in joined and "StrictHostKeyChecking=yes" in joined
    assert "BatchMode=yes" in joined and "ControlPath=/run/x/ssh-%C" in joined
    assert "ControlPath=none" in " ".join(ssh.argv("10.0.0.2", mux=False))


def test_ssh_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("HPNLAB_SSH_IDENTITY", "/a/id")
    monkeypatch.setenv("HPNLAB_SSH_KNOWN_HOSTS", "/a/kh")
    monkeypatch.setenv("HPNLAB_REMOTE_PYTHON", "/opt/py")
    monkeypatch.delenv("HPNLAB_SSH_USER", raising=False)
    s = remote.Ssh.from_env()
    assert (s.user, s.identity, s.known_hosts, s.python) == ("root", "/a/id", "/a/kh", "/opt/py")


def test_a_remote_command_carries_the_run_mark_and_its_arguments_intact():
    # what the server's shell gets: run here by a shell, as sshd would
    arg = '{"job": 1, "hosts": ["h1", "h2"]} $HOME; rm -rf /nothing'
    line = remote.remote_command([sys.executable, "-c", "import os, sys; print(os.environ['HPNLAB_RUN']); "
                                  "print(sys.argv[1])", arg], "run-7")
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["run-7", arg]


def test_this_machines_python_is_replaced_by_the_servers():
    assert remote.rewrite_python([sys.executable, "-m", "x"], sys.executable, "/opt/py") == ["/opt/py", "-m", "x"]
    assert remote.rewrite_python(f"{sys.executable} -m x", sys.executable, "/opt/py") == "/opt/py -m x"
    assert remote.rewrite_python(["ping", "-c1"], sys.executable, "/opt/py") == ["ping", "-c1"]


def test_server_features_are_read_from_the_probe():
    caps = remote.parse_caps("openvswitch yes\nsch_netem yes\nsch_red no\nsch_htb yes\novs 3.1.0\n")
    assert caps == {"openvswitch": True, "sch_netem": True, "sch_red": False, "sch_htb": True, "ovs": "3.1.0"}
    assert remote.parse_caps("ovs\n")["ovs"] is None
    assert all(m in remote.caps_script() for m in remote.FEATURE_MODULES)


PORT = {"intf": "s9-eth1", "rate_mbps": 100.0, "delay_us": 0.0}


def test_remote_ports_get_htb_and_red_with_ecn_under_it():
    sh, tc = remote.port_lines([PORT], 4096, shape=True, netem=True, red=True)
    assert "ip link set dev s9-eth1 mtu 4096" in sh and any("disable_ipv6" in line for line in sh)
    assert tc[0].startswith("qdisc replace dev s9-eth1 root handle 1: htb")
    assert "rate 100mbit ceil 100mbit" in tc[1]
    assert tc[2].startswith("qdisc add dev s9-eth1 parent 1:1 handle 20: red") and " ecn" in tc[2]
    assert len(tc) == 3                       # no delay asked: no netem


def test_a_delayed_remote_port_keeps_its_delay_under_red_or_alone():
    delayed = dict(PORT, delay_us=250.0)
    _, with_red = remote.port_lines([delayed], 1500, shape=True, netem=True, red=True)
    _, alone = remote.port_lines([delayed], 1500, shape=True, netem=True, red=False)
    assert "netem delay 250us" in alone[-1] and "handle 10:" in alone[-1]
    limit = alone[-1].split(" limit ")[1]     # the netem queue the local shaping would give it
    assert with_red[-1] == f"qdisc add dev s9-eth1 parent 20: handle 30: netem delay 250us limit {limit}"
    _, none = remote.port_lines([delayed], 1500, shape=False, netem=True, red=True)
    assert none == []


def test_connected_and_removed_counts_are_parsed():
    assert remote.parse_connected("s1 true\ns2 false\n", ["s1", "s2", "s3"]) == {"s1": True, "s2": False, "s3": False}
    assert remote.parse_removed("removed processes 3\nremoved bridges 2\nnoise\n") == {"processes": 3, "bridges": 2}


def test_placement_is_decided_before_building_and_lists_what_each_server_holds():
    from hpnlab.fabric.emulation.mn import FabricTopo

    g = fgraph.build(spec.load("mini-hpn", {"segments_per_pod": 2}))
    topo = FabricTopo(g)
    where = remote.place(topo, g, ["localhost", "10.0.0.2"], "plane")
    assert all(topo.nodeInfo(n)["server"] == s for n, s in where.items())   # MininetCluster keeps these
    plan = remote.planned(g, where)
    far_switches = {sw for sw in fgraph.switches(g) if g.nodes[sw]["plane"] == 1}
    assert set(plan["10.0.0.2"][0]) == far_switches
    assert set(plan["localhost"][0]) == set(fgraph.switches(g)) - far_switches
    assert all(i.split("-eth")[0] in far_switches for i in plan["10.0.0.2"][1])


def test_the_teardown_script_ends_exactly_the_runs_marked_processes(tmp_path):
    run = f"test-{uuid.uuid4().hex[:8]}"
    stub = tmp_path / "ovs-vsctl"        # no OVS here: the bridge and QoS steps find nothing
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    mine = subprocess.Popen(["sleep", "60"], env=dict(env, HPNLAB_RUN=run))
    other = subprocess.Popen(["sleep", "60"], env=dict(env, HPNLAB_RUN=run + "x"))
    try:
        out = subprocess.run(["sh", "-c", remote.teardown_script(run, ["hpnlab-none0"])], env=env,
                             capture_output=True, text=True, timeout=30).stdout
        assert mine.wait(timeout=5) == -9
        assert other.poll() is None
        assert remote.parse_removed(out) == {"processes": 1, "bridges": 0, "interfaces": 0}
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


@pytest.mark.parametrize("name", ["s1", "s1; reboot"])
def test_bridge_names_are_quoted_in_scripts(name):
    assert shlex.quote(name) in remote.connected_script([name])


def test_a_tunnel_end_on_the_server_is_moved_and_renamed_in_one_command():
    line = remote.tunnel_end_script(4242, "h2-eth0", "02:00:00:00:00:02")
    move, rename = line.split(" && ")
    assert move == f"ip link set {remote.TUNNEL_TAP} netns 4242"
    assert rename == f"nsenter -t 4242 -n ip link set {remote.TUNNEL_TAP} name h2-eth0 address 02:00:00:00:00:02"
    assert "address" not in remote.tunnel_end_script(1, "s1-eth3", None)
