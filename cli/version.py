"""What ``hpnlab --version`` prints: the release and the commit it was built from.

From a git checkout (an editable install, ``make venv``) the commit is read from git, with
``+modified`` when the work tree has changes; a wheel carries the commit it was built from in
``_commit.txt`` beside this module (written by setup.py at build time); otherwise it says it
does not know."""
from __future__ import annotations

import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILT_COMMIT = HERE / "_commit.txt"


def release() -> str:
    try:
        return version("hpnlab")
    except PackageNotFoundError:
        return "unknown"


def commit() -> str | None:
    """The commit this code is (git, when it runs from a checkout), or was built from."""
    try:
        head = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=5)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(["git", "-C", str(HERE), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=5).stdout.strip()
            return head.stdout.strip() + ("+modified" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    if BUILT_COMMIT.is_file():
        return BUILT_COMMIT.read_text().strip() or None
    return None


def text() -> str:
    c = commit()
    return f"hpnlab {release()} ({'commit ' + c if c else 'commit unknown: not built from a git checkout'})"
