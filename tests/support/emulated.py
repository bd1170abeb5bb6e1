"""What tests of a live emulation (real Open vSwitch) read off the switches: their flows (``ovs-ofctl``),
whether flows were deleted and added again, whether every pair pings after a repair; and the BFD interval
the live tests use."""
from __future__ import annotations

import re
import signal
import subprocess
import time

from hpnlab.fabric.scenario import graph as fgraph

# 50 ms never flapped on an idle 2-core machine (docs: failures), but a session went down under a
# load average of 6-8 (other jobs on the machine): these tests check what BFD makes the switches
# do, not how fast it detects, so they take an interval that holds under load (detection 3 x 200 ms)
BFD_MS = 200

_STATS = re.compile(r"\b(cookie|duration|n_packets|n_bytes|idle_age|hard_age|reset_counts)=[^,\s]*,?\s*")


def ofctl(*args: str, check: bool = False) -> str:
    """``ovs-ofctl -O OpenFlow13 ARGS``'s output (``check``: it must succeed)."""
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", *args], capture_output=True, text=True, timeout=10)
    assert not check or out.returncode == 0, out.stderr
    return out.stdout


def flow_lines(bridge: str) -> list[str]:
    """The controller's routing flows (its cookie; not the LLDP rule of discovery)."""
    return [line for line in ofctl("dump-flows", bridge, "cookie=0x68706e6c61620000/-1").splitlines()
            if "cookie=" in line]


def flows(emu) -> dict[tuple[str, str], float]:
    """Every flow of every switch, (switch, flow without its counters) -> its duration in seconds."""
    out = {}
    for sw in fgraph.switches(emu.graph):
        for line in ofctl("dump-flows", sw, check=True).splitlines():
            m = re.search(r"duration=([0-9.]+)s", line)
            if m:
                out[sw, _STATS.sub("", line).strip()] = float(m.group(1))
    return out


def not_re_added(before: dict, after: dict, elapsed_s: float) -> list:
    """The flows that are not the same entries, older by the time that passed (a flow deleted and
    added again starts its duration anew)."""
    return [k for k in before.keys() | after.keys()
            if k not in before or k not in after or after[k] < before[k] + elapsed_s - 1.0]


def failed_pings_after_repair(emu) -> list:
    """The pairs that do not ping once a repair has settled (a second try for those that failed
    at first: BFD sessions come back within a second or two)."""
    time.sleep(0.5)
    result = emu.ping_all()
    if result["failed"]:
        time.sleep(1.5)
        result = emu.ping_all(pairs=result["failed"])
    return result["failed"]


def walk(emu, pairs: list) -> dict:
    """Every entropy branch of ``pairs`` probed (``emu.walk_branches``); the pairs that missed, once more
    (a pair's first packets can wait for ARP)."""
    result = emu.walk_branches(pairs=pairs)
    if result["missing"]:
        result = emu.walk_branches(pairs=sorted({m[:4] for m in result["missing"]}))
    return result


def walk_with_switch_down(emu, pairs: list, switch: str) -> dict:
    """:func:`walk` with ``switch`` down and the controller process stopped (SIGSTOP), so that only the
    switches' fast-failover groups act; then the switch back up and the controller continued."""
    emu.controller.signal(signal.SIGSTOP)
    try:
        emu.faults.switch_down(switch)
        time.sleep(0.3)                                  # carrier loss reaches the groups in ms
        return walk(emu, pairs)
    finally:
        emu.faults.switch_up(switch)
        emu.controller.signal(signal.SIGCONT)
