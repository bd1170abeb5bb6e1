#!/usr/bin/env python3
"""Benchmark: the rate up to which the collective generators keep up on this machine.

The measuring code is library code (``hpnlab.fabric.experiments.calibration``, which ``hpnlab doctor --measure`` and
the demo use too); this script runs it with the same flags, for ``make bench``."""
from __future__ import annotations

import sys

from hpnlab.fabric.experiments.calibration import main

if __name__ == "__main__":
    sys.exit(main())
