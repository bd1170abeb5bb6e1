"""Shared fixtures. (Additive: each section belongs to the feature that added it.)"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
from support.fabrics import shared_runs_together
from support.paths import BENCH, PROBES, SCRIPTS

#: fixtures shared by folders of tests: the web view's browser, the controller app on fake datapaths, and
#: pytester for the pytest plugin's tests
pytest_plugins = ["support.browser", "support.controller_app", "pytester"]

# The benchmarks, probes and scripts are not installed: their pure parts are tested by name
# (``import bench_failover``, ``import ovs_floor``, ``import code_figures``), as the scripts import each other.
for _folder in (BENCH, PROBES, SCRIPTS):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

# ---- emulation (hpnlab.fabric.emulation): root, real Open vSwitch, Mininet -------------------------

def emulation_missing() -> str | None:
    """Why emulation tests cannot run here (names the missing feature), or None: the pytest
    plugin's check (users' tests skip for the same reasons)."""
    from hpnlab.fabric.emulation.preflight import emulation_missing as missing
    return missing()


@pytest.fixture(scope="session")
def emulation_ready():
    """Skip (naming the missing feature) unless root + running OVS + Mininet are available."""
    reason = emulation_missing()
    if reason:
        pytest.skip(reason)
    return True


_missing: list[str | None] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``emulation`` skips, naming the missing feature, where an emulation cannot be
    built (it need not ask for ``emulation_ready`` itself to get the same skip)."""
    if item.get_closest_marker("emulation") is None:
        return
    if not _missing:
        _missing.append(emulation_missing())
    if _missing[0]:
        pytest.skip(_missing[0])


class SharedEmulation:
    """At most one live emulation, kept from one test module to the next while they ask for the
    same one (a start and a stop of mini-hpn cost ~11 s); only one emulation can run on a machine,
    so it is stopped before any other test runs (``_no_shared_emulation_under_others``)."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.emu: Any = None
        self.at_start: dict[str, Any] = {}

    def get(self, name: str, make: Callable[[], Any]) -> Any:
        if self.name != name:
            self.close()
            emu = make()
            emu.start()
            self.name, self.emu, self.at_start = name, emu, settings(emu)
        return self.emu

    def close(self) -> None:
        emu, self.name, self.emu = self.emu, None, None
        if emu is not None:
            emu.stop()

    def release_if_changed(self, emu: Any) -> None:
        """Stop ``emu`` (if it is still the shared one) when its user left it changed."""
        if self.emu is emu:
            broken = left_broken(emu, self.at_start)
            if broken:
                print(f"{self.name}: not shared further, it was left changed: {'; '.join(broken[:5])}")
                self.close()


def settings(emu) -> dict[str, Any]:
    """What a test may change in an emulation and must put back: the controller's ECN policy and
    every switch port's ECN thresholds."""
    ports = {} if emu.ecn is None else {intf: emu.ecn.thresholds(intf) for intf in emu.ecn.ports}
    return {"ecn_policy": emu.controller.ecn_policy, "ecn_ports": ports}


def left_broken(emu, at_start: dict[str, Any]) -> list[str]:
    """What a test module left changed in a shared emulation (empty: the next module may reuse it):
    the controller process must run, every switch port must be up, the settings as they were."""
    broken = []
    if emu.controller.proc is not None and emu.controller.proc.poll() is not None:
        broken.append(f"the controller exited ({emu.controller.proc.returncode})")
    broken += [f"{p['intf']} is down" for p in emu.switch_ports() if not emu.faults.is_up(p["intf"])]
    now = settings(emu)
    if now["ecn_policy"] != at_start["ecn_policy"]:
        broken.append(f"the ECN policy is {now['ecn_policy']}, not {at_start['ecn_policy']}")
    broken += [f"{intf}'s ECN thresholds changed" for intf, t in sorted(now["ecn_ports"].items())
               if t != at_start["ecn_ports"].get(intf)]
    return broken


_shared = SharedEmulation()


@pytest.fixture(scope="session")
def _shared_emulation():
    try:
        yield _shared
    finally:
        _shared.close()


#: the shared mini-hpn's controller serves its metrics (and /health) here
MINI_HPN_METRICS_PORT = 9377


@pytest.fixture(scope="module")
def mini_hpn(emulation_ready, _shared_emulation):
    """mini-hpn emulated with the hpnlab controller, shared by the test modules that ask for it (they
    run one after another, see ``pytest_collection_modifyitems``). A module must leave it as it found
    it (links up, ECN settings); if it did not, or the controller died, the emulation is stopped and
    the next module gets a fresh one. Stopped at the end of the session at the latest."""
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, SupervisionOptions

    emu = _shared_emulation.get("mini-hpn", lambda: Emulation("mini-hpn", EmulationOptions(
        controller=ControllerOptions(extra_args=("--metrics-port", str(MINI_HPN_METRICS_PORT))),
        supervision=SupervisionOptions(lock_wait_s=300))))
    yield emu
    _shared_emulation.release_if_changed(emu)


@pytest.fixture
def mini_cross_campus(emulation_ready, _shared_emulation):
    """mini-cross-campus emulated with the hpnlab controller, shared by the tests that ask for it
    (one after another); a test must leave it as it found it, as ``mini_hpn``."""
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import EmulationOptions, SupervisionOptions

    emu = _shared_emulation.get("mini-cross-campus",
                                lambda: Emulation("mini-cross-campus", EmulationOptions(
                                    supervision=SupervisionOptions(lock_wait_s=300))))
    yield emu
    _shared_emulation.release_if_changed(emu)


#: fixtures that hand out a shared emulation (the value: its name)
SHARED_FIXTURES = {"mini_hpn": "mini-hpn", "mini_cross_campus": "mini-cross-campus"}
_module_shares: dict[str, str | None] = {}


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def _own_share(item: pytest.Item) -> str | None:
    return next((SHARED_FIXTURES[n] for n in getattr(item, "fixturenames", ()) if n in SHARED_FIXTURES), None)


def _shared_name(item: pytest.Item) -> str | None:
    """The shared emulation a test's module uses (a module uses at most one), or None."""
    module = _module_of(item)
    if module not in _module_shares:
        _module_shares[module] = _own_share(item)
    return _module_shares[module]


#: a test's folder says what it needs, and its markers must say the same: unit/ none (no root, no
#: process of the project's), emulation/ ``emulation`` or ``controller``, kernel/ ``kernel``
FOLDER_MARKERS = {"unit": set(), "emulation": {"emulation", "controller"}, "kernel": {"kernel"}}
NEEDS = ("emulation", "controller", "kernel")


def misplaced(folder: str, markers: set[str]) -> str | None:
    """Why a test with these markers does not belong in this folder of tests/ (None: it does)."""
    wanted = FOLDER_MARKERS.get(folder)
    if wanted is None:
        return None
    has = markers & set(NEEDS)
    if not wanted and has:
        return f"marked {', '.join(sorted(has))}: it belongs in tests/emulation or tests/kernel"
    if wanted and not has & wanted:
        return f"in tests/{folder} but marked none of {', '.join(sorted(wanted))}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test sits in the folder its markers name (else collection stops, naming it); modules
    that share an emulation run one after another, at the place of the first of them; everything
    else keeps its order."""
    wrong = []
    for item in items:
        parts = item.path.relative_to(config.rootpath).parts if item.path.is_relative_to(config.rootpath) else ()
        if len(parts) > 2 and parts[0] == "tests":
            why = misplaced(parts[1], {m.name for m in item.iter_markers()})
            if why:
                wrong.append(f"{item.nodeid}: {why}")
    if wrong:
        raise pytest.UsageError("tests in the wrong folder:\n  " + "\n  ".join(wrong))
    _module_shares.clear()
    for item in items:
        if _module_shares.get(_module_of(item)) is None:
            _module_shares[_module_of(item)] = _own_share(item)
    order = shared_runs_together([_shared_name(item) for item in items])
    items[:] = [items[i] for i in order]


@pytest.fixture(scope="module", autouse=True)
def _no_shared_emulation_under_other_modules(request: pytest.FixtureRequest) -> None:
    """A module that does not use the live shared emulation gets it stopped at its start: its own
    module-scoped emulation fixture is set up before any test's fixtures (the one below)."""
    if _shared.emu is not None and _module_shares.get(_module_of(request.node)) != _shared.name:
        _shared.close()


@pytest.fixture(autouse=True)
def _no_shared_emulation_under_others(request: pytest.FixtureRequest) -> None:
    """A test that may build its own emulation (marked emulation or controller, not using the live
    shared one) gets the shared one stopped first; so does any test of another module."""
    if _shared.emu is None or _shared.name in {SHARED_FIXTURES.get(n) for n in request.fixturenames}:
        return
    marked = any(request.node.get_closest_marker(m) for m in ("emulation", "controller"))
    if marked or _shared_name(request.node) != _shared.name:
        _shared.close()


# ---- shared helpers of pure tests ----------------------------------------------------------------
# The cached fabric loader and the reconciler drivers live in tests/support/fabrics.py (import them with
# ``from support.fabrics import fabric``): a conftest cannot be imported by name, since pytest's
# prepend import mode registers tests/kernel/conftest.py under the same module name "conftest".
