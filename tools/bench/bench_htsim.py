#!/usr/bin/env python3
"""Benchmark: the flow model against UEC's htsim (a packet-level simulator) side by side.

The measuring code is library code (``hpnlab.fabric.experiments.htsim``, which ``hpnlab doctor --measure`` and
the demo use too); this script runs it with the same flags, for ``make bench``."""
from __future__ import annotations

import sys

from hpnlab.fabric.experiments.htsim import main

if __name__ == "__main__":
    sys.exit(main())
