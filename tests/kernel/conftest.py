"""Tests of the full-kernel lane (`make test-kernel`): they need a kernel with the
openvswitch datapath, sch_netem, sch_red and sch_htb, root, and a running Open vSwitch.

The lane boots a stock Debian kernel under qemu and runs them there (see
tools/scripts/kernel_lane/). On a host without those features every test here is skipped with a
reason naming what is missing; `make test`'s host runs deselect them with -m.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# kernel module -> what the project uses it for
FULL_KERNEL_MODULES = {
    "openvswitch": "openvswitch kernel datapath",
    "sch_netem": "sch_netem (link delay)",
    "sch_red": "sch_red (RED/ECN queues)",
    "sch_htb": "sch_htb (link rates)",
}


def _module_available(name: str) -> bool:
    """Loaded, built in, or loadable now (modprobe is what tc/ovs-ctl would run anyway)."""
    if Path("/sys/module", name).exists():
        return True
    builtin = Path("/lib/modules", os.uname().release, "modules.builtin")
    if builtin.exists() and f"/{name}.ko" in builtin.read_text():
        return True
    if os.geteuid() != 0 or shutil.which("modprobe") is None:
        return False
    return subprocess.run(["modprobe", "-q", name], capture_output=True).returncode == 0


def missing_full_kernel_features() -> list[str]:
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    missing += [what for mod, what in FULL_KERNEL_MODULES.items() if not _module_available(mod)]
    if shutil.which("ovs-vsctl") is None or subprocess.run(
            ["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode != 0:
        missing.append("a running Open vSwitch")
    return missing


@pytest.fixture(scope="session")
def full_kernel() -> None:
    """Skip (naming what is missing) unless this machine has the full kernel's features."""
    missing = missing_full_kernel_features()
    if missing:
        pytest.skip("needs the full kernel (missing: " + ", ".join(missing)
                    + "); runs in the qemu lane: make test-kernel")


@pytest.fixture(autouse=True)
def _require_full_kernel(full_kernel) -> None:
    pass
