"""A module of this checkout as it was at another git revision, for benchmarks that measure
today's code beside an earlier one on the same inputs (``--baseline REV`` and the like)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]      # tools/bench/gitrev.py -> the checkout
#: where a module lived before the layers change (c9025e0), for revisions older than it
FORMERLY = {"fabric/routing/compiler.py": "controller/compiler.py", "fabric/model/flow.py": "fabric/model.py",
            "fabric/model/forwarding.py": "fabric/model_forwarding.py"}


def module_at(rev: str, relpath: str, name: str, *, who: str, edit: Callable[[str], str] | None = None) -> ModuleType:
    """``relpath`` (e.g. ``fabric/routing/compiler.py``) at git revision ``rev``, imported as module
    ``name`` (a name inside a package, such as ``hpnlab.fabric._model_baseline``, lets its relative
    imports resolve); ``edit`` rewrites its text first. A revision git cannot show is one line
    (``who``: the benchmark's name)."""
    text = None
    for path_at_rev in (relpath, FORMERLY.get(relpath)):
        if path_at_rev is None:
            continue
        try:
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path_at_rev}"],
                                  capture_output=True, text=True, check=True).stdout
            break
        except (OSError, subprocess.CalledProcessError) as e:
            error = e
    if text is None:
        raise SystemExit(f"{who}: cannot read {relpath} at {rev!r} with git: {error}") from None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / (name.rsplit(".", 1)[-1] + ".py")
        path.write_text(edit(text) if edit else text)
        spec_ = importlib.util.spec_from_file_location(name, path)
        assert spec_ is not None and spec_.loader is not None
        module = importlib.util.module_from_spec(spec_)
        sys.modules[name] = module
        spec_.loader.exec_module(module)
    return module
