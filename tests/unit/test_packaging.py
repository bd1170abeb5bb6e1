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
