"""Shared fixtures. (Additive: each section belongs to the feature that added it.)"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

# ---- emulation (hpnlab.fabric.emulation): root, real Open vSwitch, Mininet -------------------------

def emulation_missing() -> str | None:
    """Why emulation tests cannot run here (names the missing feature), or None."""
    if os.geteuid() != 0:
        return "needs root (real Open vSwitch and network namespaces)"
    if shutil.which("ovs-vsctl") is None:
        return "needs Open vSwitch (openvswitch-switch)"
    if subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode != 0:
        return "needs Open vSwitch running (make ovs)"
    if shutil.which("mnexec") is None:
        return "needs mnexec (apt package mininet)"
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        return "needs the mininet Python package (make venv)"
    return None


@pytest.fixture(scope="session")
def emulation_ready():
    """Skip (naming the missing feature) unless root + running OVS + Mininet are available."""
    reason = emulation_missing()
    if reason:
        pytest.skip(reason)
    return True


@pytest.fixture(scope="module")
def mini_hpn(emulation_ready):
    """mini-hpn emulated with the hpnlab controller, shared by a test module; always torn down."""
    from hpnlab.fabric.emulation import Emulation

    emu = Emulation("mini-hpn", controller="hpnlab", lock_wait_s=300)
    emu.start()
    try:
        yield emu
    finally:
        emu.stop()



# ---- shared helpers of pure tests ----------------------------------------------------------------
# The cached fabric loader and the reconciler drivers live in tests/fabrics.py (import them with
# ``from fabrics import fabric``): a conftest cannot be imported by name, since pytest's
# prepend import mode registers tests/kernel/conftest.py under the same module name "conftest".
