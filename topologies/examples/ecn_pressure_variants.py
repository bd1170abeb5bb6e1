"""Two variants of the built-in ``dynamic`` policy's pressure rule (rule 1), as policy files
(``--ecn-policy topologies/examples/ecn_pressure_variants.py:DropsOnly``). The README's "Two
variants of that rule" compares them with ``high`` and with the built-in rule, which cuts Kmin
once a port's queue reaches half the emulated buffer.
"""
from typing import ClassVar

from hpnlab.controller.ecn_policy import DynamicPolicy


class DropsOnly(DynamicPolicy):
    """Cut only on drops: the pressure mark lies beyond any buffer (the stage's queue estimate
    never passes the port buffer)."""
    name = "dynamic-drops-only"
    PARAMS: ClassVar[dict[str, float]] = {**DynamicPolicy.PARAMS, "pressure_frames": 10_000, "pressure_ms": 10_000.0}


class LatePressure(DynamicPolicy):
    """Cut at 90% of the emulated buffer (max(32 frames, 50 ms)) instead of half of it."""
    name = "dynamic-late-pressure"
    PARAMS: ClassVar[dict[str, float]] = {**DynamicPolicy.PARAMS, "pressure_frames": 29, "pressure_ms": 45.0}
