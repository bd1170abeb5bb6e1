"""Where things are in the checkout, for tests that read its files or run its scripts."""
from __future__ import annotations

from pathlib import Path

#: the checkout's root (tests/support/paths.py is two folders below it)
REPO = Path(__file__).resolve().parents[2]
#: scripts that are not installed: the CA maker, the kernel lane
SCRIPTS = REPO / "tools" / "scripts"
#: benchmarks (``make bench``) and probes: not installed; their pure parts are tested from here
BENCH = REPO / "tools" / "bench"
PROBES = REPO / "tools" / "probes"
EXAMPLES = REPO / "topologies" / "examples"
