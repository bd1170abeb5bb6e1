"""Make ``hpnlab.*`` importable for the ``mn --custom`` files, installed or not.

Installed (``make venv``), ``hpnlab`` is already importable and this does nothing. Run
from a bare checkout (``mn`` from apt with /usr/bin/python3), it maps the namespace onto the
checkout's folders exactly as ``setup.cfg`` does: ``hpnlab.fabric`` → ``fabric/``,
``hpnlab.controller`` → ``controller/``, ``hpnlab.cli`` → ``cli/``.
"""
import importlib.util
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = {"fabric": "fabric", "controller": "controller", "cli": "cli"}


def ensure() -> None:
    if importlib.util.find_spec("hpnlab") is not None:
        return
    pkg = types.ModuleType("hpnlab")
    pkg.__path__ = []  # a namespace with no folder of its own
    sys.modules["hpnlab"] = pkg
    for name, folder in FOLDERS.items():
        path = os.path.join(ROOT, folder)
        spec = importlib.util.spec_from_file_location(
            f"hpnlab.{name}", os.path.join(path, "__init__.py"), submodule_search_locations=[path])
        if spec is None or spec.loader is None:
            raise ImportError(f"hpnlab.{name}: no package at {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        setattr(pkg, name, module)
        spec.loader.exec_module(module)


ensure()
