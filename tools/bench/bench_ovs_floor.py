#!/usr/bin/env python3
"""Benchmark: Open vSwitch's own local repair of a link, without hpnlab, by how many ports it owns.

Runs ``tools/probes/ovs_floor.py`` (two bridges of its own, two parallel links, a fast-failover group,
no controller, userspace datapath) with 0 and 30 idle links between the bridges (6 and 66
ports: mini-hpn's switches own 64), interleaved in one run, 5 rounds of the three kinds of
link failure: the loss window at the receiver, median [min-max], how many repetitions were at
or below 5 ms (the fast-failover issue's goal), and the ratio of the medians. This is the
floor under hpnlab's own failover figures on the userspace datapath (README: "Open vSwitch
alone"). About 3 minutes; root and a running Open vSwitch, skipped otherwise. No goal is
checked: it prints what this machine does.
"""
from __future__ import annotations

import os
import subprocess
import sys

import ovs_floor


def main(argv: list[str] | None = None) -> int:
    if os.geteuid() != 0:
        print("bench_ovs_floor skipped: needs root and Open vSwitch (sudo make bench)")
        return 0
    if subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode:
        print("bench_ovs_floor skipped: Open vSwitch is not running (make install starts it)")
        return 0
    return ovs_floor.main(["--idle-links", "0,30", "--repeat", "5"] + list(argv or []))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
