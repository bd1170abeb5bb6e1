"""The controller as a process: `python -m hpnlab.controller` and `hpnlab controller` (real os-ken, real TCP)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from support.controller_process import HPNLAB, ROOT

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph, spec


@pytest.mark.parametrize("argv,needle", [
    (["no-such-preset"], "unknown preset"),
    (["mini-hpn", "--set", "planes=0"], "planes"),
    (["mini-hpn", "--ofp-port", "70000"], "not a TCP port"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, needle):
    r = subprocess.run([sys.executable, "-m", "hpnlab.controller", *argv], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_a_taken_port_is_one_line_and_exit_code_2():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "hpnlab.controller", "mini-hpn", "--ofp-port", str(port)],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and f"127.0.0.1:{port}" in r.stderr


def test_hpnlab_controller_show_prints_a_switchs_compiled_flows():
    r = subprocess.run([HPNLAB, "controller", "mini-hpn", "--show", "p0l1", "--fail", "p0l0-p0s0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    g = graph.build(spec.load("mini-hpn"))
    st = compiler.compile_fabric(g, compiler.Failures.of([("p0l0", "p0s0", 0)]))["p0l1"]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 + st.flow_count
    assert "3 de-aggregated routes" in lines[0]
    # p0l0's prefix avoids p0s0: the uplink set's metadata with "avoid that port" (compiler docstring)
    assert any(line.startswith("table=1 ") and "ipv4_dst=10.0.0.0/255.255.255.248" in line and "goto:2" in line
               for line in lines)


def test_hpnlab_controller_show_rejects_an_unknown_switch_in_one_line():
    r = subprocess.run([HPNLAB, "controller", "mini-hpn", "--show", "p9l9"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "p9l9" in r.stderr
