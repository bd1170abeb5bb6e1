"""hpnlab installs one import namespace, ``hpnlab.*``, and coexists with the distributions that
own the folder names it maps from (``fabric`` is Fabric's, the SSH library).

The wheel is built from this checkout the way pip builds it for a user; the coexistence test
installs that wheel and Fabric into one fresh venv, in both orders, and removes each in turn.
"""
from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.paths import REPO

ROOT = REPO
FABRIC_SSH = "fabric==3.2.3"   # the release the namespace clash was found with


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # a copy (setuptools builds in the source tree, and the checkout stays clean), with the git
    # metadata, from which the build records its commit
    src = build / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", "build", "results", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", ".cache"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out), str(src)], capture_output=True, text=True, cwd=build, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    wheels = list(out.glob("hpnlab-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_the_wheel_installs_no_top_level_name_but_hpnlab(wheel):
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/", 1)[0] for name in z.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"hpnlab"}


def test_every_python_package_folder_is_in_the_wheel(wheel):
    """A new subpackage that setup.cfg forgets would be missing from a user's install."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    mapping = dict(line.split(" = ") for line in cfg["options"]["package_dir"].strip().splitlines())
    expected = set()
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            expected.add(".".join([package, *rel.parts]))
    with zipfile.ZipFile(wheel) as z:
        shipped = {n.rsplit("/", 1)[0].replace("/", ".") for n in z.namelist() if n.endswith("/__init__.py")}
    assert expected <= shipped, f"missing from the wheel: {sorted(expected - shipped)}"


def test_the_wheel_carries_the_commit_it_was_built_from(wheel):
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as z:
        assert z.read("hpnlab/cli/_commit.txt").decode().startswith(head)


def test_the_wheel_carries_the_presets_and_the_ecn_program_source(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    presets = {f"hpnlab/topologies/{p.name}" for p in (ROOT / "topologies").glob("*.yaml")}
    assert presets and presets <= names
    assert "hpnlab/fabric/emulation/bpf/ecn_marker.bpf.c" in names


def _pypi_reachable(python: str) -> bool:
    r = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--no-deps", "-q", FABRIC_SSH],
                       capture_output=True, text=True, timeout=120)
    return r.returncode == 0


@pytest.mark.slow
def test_hpnlab_and_fabric_coexist_in_one_venv_in_either_order(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    if not _pypi_reachable(py):
        pytest.skip("needs PyPI to install Fabric (the SSH library) into a fresh venv")

    def pip(*args: str) -> None:
        r = subprocess.run([py, "-m", "pip", "-q", "--disable-pip-version-check", *args], capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f"pip {' '.join(args)}: {r.stderr[-2000:]}"

    def works(code: str) -> subprocess.CompletedProcess:
        # cwd outside the checkout: nothing but the venv can provide the imports
        return subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)

    hpnlab_works = ("from hpnlab.fabric.scenario import graph, spec; g = graph.build(spec.load('mini-hpn')); "
                    "from hpnlab.fabric.routing import compiler; assert g.number_of_nodes() == 28; print('ok')")
    fabric_works = ("from fabric import Connection; c = Connection('localhost'); "
                    "assert c.host == 'localhost'; print('ok')")

    pip("install", str(wheel))                     # hpnlab first, then Fabric
    pip("install", FABRIC_SSH)
    for code in (hpnlab_works, fabric_works):
        r = works(code)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-1500:]
    pip("check")

    pip("uninstall", "-y", "hpnlab")               # removing hpnlab leaves Fabric whole
    r = works(fabric_works)
    assert r.returncode == 0, r.stderr[-1500:]

    pip("install", str(wheel))                     # Fabric first, then hpnlab
    for code in (hpnlab_works, fabric_works):
        r = works(code)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-1500:]

    pip("uninstall", "-y", "fabric")               # removing Fabric leaves hpnlab whole
    r = works(hpnlab_works)
    assert r.returncode == 0, r.stderr[-1500:]


# ---- the installed wheel, outside the checkout: the four ways users start hpnlab ---------------------

@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[str, Path]:
    """A fresh venv with the wheel and its controller and emulation extras, and pytest; (python, a folder
    outside the checkout to run in)."""
    base = tmp_path_factory.mktemp("installed")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    if not _pypi_reachable(py):
        pytest.skip("needs PyPI (or the configured index) to install the wheel's dependencies into a fresh venv")
    r = subprocess.run([py, "-m", "pip", "-q", "--disable-pip-version-check", "install",
                        f"{wheel}[controller,emulation]", "pytest"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    work = base / "elsewhere"
    work.mkdir()
    return py, work


def _run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout)


def _ready(argv: list[str], cwd: Path) -> str:
    """Start a controller, return its ready line, stop it (by its pid)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        return line if "ready" in line else line + (proc.stderr.read() if proc.poll() is not None else "")
    finally:
        proc.terminate()
        proc.wait(30)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_installed_wheel_starts_the_controller_with_python_dash_m(installed):
    py, work = installed
    line = _ready([py, "-m", "hpnlab.controller", "mini-hpn", "--ofp-port", str(_free_port())], work)
    assert "hpnlab controller ready" in line and "mini-hpn" in line, line


@pytest.mark.slow
def test_the_installed_wheel_starts_the_controller_with_hpnlab_controller(installed):
    py, work = installed
    hpnlab = str(Path(py).with_name("hpnlab"))
    line = _ready([hpnlab, "controller", "mini-hpn", "--ofp-port", str(_free_port())], work)
    assert "hpnlab controller ready" in line, line


@pytest.mark.slow
def test_the_installed_mn_custom_file_gives_mininet_the_fabric(installed):
    py, work = installed
    # what `mn --custom FILE --topo hpn,planes=2` does with the file: exec it, call topos["hpn"]
    code = ("import hpnlab.topologies, os, runpy\n"
            "path = os.path.join(os.path.dirname(hpnlab.topologies.__file__), 'hpn.py')\n"
            "ns = runpy.run_path(path)\n"
            "topo = ns['topos']['hpn'](planes=2)\n"
            "print(len(topo.hosts()), len(topo.switches()))\n")
    r = _run([py, "-c", code], work)
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout.split() == ["16", "12"]         # mini-hpn: 16 hosts, 12 switches (2 planes)


@pytest.mark.slow
def test_the_installed_pytest_plugin_checks_a_fabric_in_a_users_project(installed):
    py, work = installed
    (work / "test_my_fabric.py").write_text(
        "def test_rules_pass(hpn_check):\n    assert not hpn_check.failed\n\n"
        "def test_a_host_reaches_another(hpn_walker):\n"
        "    assert hpn_walker.send('h1', 'h5', plane=0).result == 'delivered'\n")
    r = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_fabric.py"], work, timeout=300)
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout[-2000:] + r.stderr[-1000:]
