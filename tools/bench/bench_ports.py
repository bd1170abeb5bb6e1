#!/usr/bin/env python3
"""Benchmark: the userspace datapath's ceiling per switch port type and frame size (the machine's packet budget).

The measuring code is library code (``hpnlab.fabric.emulation.budget``, which ``hpnlab doctor --measure`` and
the demo use too); this script runs it with the same flags, for ``make bench``."""
from __future__ import annotations

import sys

from hpnlab.fabric.emulation.budget import main

if __name__ == "__main__":
    sys.exit(main())
