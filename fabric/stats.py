"""Repeated measurements summarised one way everywhere: a spread and its text (pure).

Every comparison, benchmark and probe reports a figure measured several times as its median
with the range beside it, ``median [min-max]``: :func:`spread` computes it, :func:`spread_text`
prints it, :func:`median_range` does both."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


def spread(values: Iterable[float | int | None]) -> dict[str, Any]:
    """Median, min, quartiles, max and count of the values that exist (None and NaN are left
    out); ``{"n": 0}`` when none does, so ``spread(...)["n"]`` always answers."""
    v = np.asarray([x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))],
                   dtype=float)
    if not len(v):
        return {"n": 0}
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return {"n": len(v), "median": float(med), "min": float(v.min()), "q1": float(q1), "q3": float(q3),
            "max": float(v.max())}


def median_of(sp: Mapping[str, Any] | None) -> float | None:
    """A spread's median (None when it has no value)."""
    return sp.get("median") if sp else None


def spread_text(sp: Mapping[str, Any] | None, fmt: str = "{:.3g}", scale: float = 1.0, unit: str = "",
                centre: str = "median") -> str:
    """A spread (:func:`spread`, or any mapping with ``n``, ``min``, ``max`` and ``centre``) as
    ``centre [min-max]``, each ``fmt`` of the value times ``scale``, ``unit`` after the centre; "-"
    when it has no value."""
    if not sp or not sp.get("n", 1) or sp.get(centre) is None:
        return "-"
    return f"{fmt.format(sp[centre] * scale)}{unit} [{fmt.format(sp['min'] * scale)}-{fmt.format(sp['max'] * scale)}]"


def median_range(values: Iterable[float | int | None], fmt: str = "{:.3g}", scale: float = 1.0) -> str:
    """Repeated figures as ``median [min-max]``: :func:`spread_text` of their :func:`spread`."""
    return spread_text(spread(values), fmt, scale)
