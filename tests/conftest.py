"""Shared fixtures. (Additive: each section belongs to the feature that added it.)"""
from __future__ import annotations

import pytest

# ---- emulation (hpnlab.fabric.emulation): root, real Open vSwitch, Mininet -------------------------

def emulation_missing() -> str | None:
    """Why emulation tests cannot run here (names the missing feature), or None: the pytest
    plugin's check (users' tests skip for the same reasons)."""
    from hpnlab.fabric.pytest_plugin import emulation_missing as missing
    return missing()


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
