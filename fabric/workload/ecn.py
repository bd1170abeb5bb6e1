"""ECN thresholds: the one type (:class:`Thresholds`), the one default rule (:func:`default_thresholds`),
the static settings (named presets computed from a port's rate), and parsing.

The controller's policies (``hpnlab.controller.ecn_policy``), the emulation's ECN stage
(``hpnlab.fabric.emulation.ecn``, the one writer of a port's thresholds and rate) and the
experiments all use this type and this rule.

Pure (standard library). The ECN stage (``hpnlab.fabric.emulation.ecn``) marks CE on ECT
packets that find a queue above Kmin, with a probability rising linearly to Pmax at Kmax and
1 above it (RED/DCQCN). A *setting* gives (Kmin bytes, Kmax bytes, Pmax) for every switch
egress port; a preset computes them from the port's emulated rate, so one name fits a fabric
whose links run at different rates.

Presets (``frame`` = one MTU-sized Ethernet frame, MTU + 14 bytes; a time is queueing time
at the port's rate)
    default   what the stage starts with (:func:`default_thresholds`): Kmin = max(4 frames,
              2 ms), Kmax = 4 Kmin, Pmax 0.2.
    low       marks early: Kmin = max(1 frame, 0.5 ms), Kmax = 4 Kmin, Pmax 0.2 (short queues,
              may cost throughput).
    high      marks late: Kmin = max(16 frames, 8 ms), Kmax = 4 Kmin, Pmax 0.2 (throughput
              first, long queues before any mark).
    dcqcn     DCQCN's recommended switch setting, Kmin 5 KB, Kmax 200 KB, Pmax 1% at 40 Gbit/s
              (Zhu et al., SIGCOMM 2015), scaled by rate: Kmin = 5000 B x rate / 40 Gbit/s,
              Kmax = 200000 B x rate / 40 Gbit/s. At emulated rates (Mbit/s) both are below one
              frame (10 Mbit/s: 1.25 B and 50 B), and a queue is made of whole frames, so they
              are floored: Kmin to one frame, Kmax to Kmin + one frame (so that the 1% ramp
              still spans one frame of queue). ``floored`` says which were.
Whatever the preset, Kmax is capped at the port buffer when it is given (a queue cannot grow
beyond it, so a higher Kmax never marks at probability 1); ``capped`` says so.

A user setting is ``kmin,kmax,pmax`` (bytes, bytes, probability; sizes may be "6K"), the same
on every port.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario.rates import frame_bytes

PRESETS = ("low", "high", "dcqcn", "default")
#: the controller's ECN policy unless told otherwise: the thresholds set at start-up never change
#: (``hpnlab.controller.ecn_policy.StaticPolicy``; the controller and the emulation's options default to it)
STATIC_POLICY = "static"
#: DCQCN's published setting and the rate it was given for
DCQCN_KMIN_BYTES, DCQCN_KMAX_BYTES, DCQCN_PMAX, DCQCN_RATE_BPS = 5_000, 200_000, 0.01, 40e9


@dataclass(frozen=True)
class Thresholds:
    """RED/DCQCN marking thresholds of one port: Kmin and Kmax in bytes, Pmax as a probability.
    ``floored``/``capped`` name the thresholds a preset raised to whole frames or lowered to the
    port buffer; ``reason`` (why a controller policy chose them) is not part of the value."""
    kmin: int
    kmax: int
    pmax: float
    floored: tuple[str, ...] = field(default=(), kw_only=True)
    capped: tuple[str, ...] = field(default=(), kw_only=True)
    reason: str = field(default="", compare=False, kw_only=True)

    def as_dict(self) -> dict[str, Any]:
        """The value, as the controller logs and publishes it (Pmax to 4 places)."""
        return {"kmin": self.kmin, "kmax": self.kmax, "pmax": round(self.pmax, 4)}

    def as_setting(self) -> dict[str, Any]:
        """The value with what a preset floored or capped, as a run records its static setting."""
        return {"kmin": self.kmin, "kmax": self.kmax, "pmax": self.pmax,
                "floored": list(self.floored), "capped": list(self.capped)}


def default_thresholds(rate_bps: float, mtu: int = 1500) -> Thresholds:
    """The start-up thresholds of a port sending ``rate_bps`` (bit/s), the one default rule:
    Kmin = max(4 frames, 2 ms of queue at the rate), Kmax = 4 Kmin, Pmax 0.2.

    DCQCN's published switch setting is Kmin 5 KB, Kmax 200 KB, Pmax 1% at 40 Gbit/s (Zhu et
    al., SIGCOMM 2015); HPCC's evaluation uses Kmin 100 KB, Kmax 400 KB, Pmax 20% at 100 Gbit/s.
    Scaled by rate to a 10 Mbit/s emulated port these are below one packet, so the rule keeps the
    *shape* (Kmax = 4 x Kmin, Pmax 20%) and expresses Kmin as queueing time at the port rate, never
    less than 4 MTU-sized frames. A 10 Mbit/s port with MTU 1500: Kmin 6,056 B, Kmax 24,224 B."""
    kmin = int(max(4 * frame_bytes(mtu), rate_bps / 8 * 0.002))
    return Thresholds(kmin, 4 * kmin, 0.2)


def _time_bytes(rate_mbps: float, seconds: float) -> float:
    return rate_mbps * 1e6 / 8 * seconds


def preset(name: str, rate_mbps: float, mtu: int = 1500, buffer_bytes: int | None = None) -> Thresholds:
    """The thresholds of preset ``name`` on a port of ``rate_mbps`` (see the module docstring)."""
    if rate_mbps <= 0 or not math.isfinite(rate_mbps):
        raise UserError(f"a port rate must be positive, got {rate_mbps}")
    frame = frame_bytes(mtu)
    floored: list[str] = []
    if name == "default":
        start = default_thresholds(rate_mbps * 1e6, mtu)
        kmin, kmax, pmax = start.kmin, start.kmax, start.pmax
    elif name == "low":
        kmin = int(max(frame, _time_bytes(rate_mbps, 0.0005)))
        kmax, pmax = 4 * kmin, 0.2
    elif name == "high":
        kmin = int(max(16 * frame, _time_bytes(rate_mbps, 0.008)))
        kmax, pmax = 4 * kmin, 0.2
    elif name == "dcqcn":
        scale = rate_mbps * 1e6 / DCQCN_RATE_BPS
        kmin_f, kmax_f = DCQCN_KMIN_BYTES * scale, DCQCN_KMAX_BYTES * scale
        kmin = int(kmin_f)
        if kmin_f < frame:
            kmin = frame
            floored.append("kmin")
        kmax = int(kmax_f)
        if kmax_f < kmin + frame:
            kmax = kmin + frame
            floored.append("kmax")
        pmax = DCQCN_PMAX
    else:
        raise UserError(f"unknown ECN preset {name!r} (known: {', '.join(PRESETS)}, or kmin,kmax,pmax)")
    capped: list[str] = []
    if buffer_bytes is not None and kmax > buffer_bytes:
        kmax = max(kmin, int(buffer_bytes))
        capped.append("kmax")
    return Thresholds(kmin, kmax, pmax, floored=tuple(floored), capped=tuple(capped))


def _size(text: str, what: str) -> int:
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise UserError(f"--ecn: {what} {text.strip()!r} is not a size in bytes (examples: 3000, 6K)") from None
    if not math.isfinite(value) or value < 0:
        raise UserError(f"--ecn: {what} must be a size of 0 or more bytes, got {text.strip()!r}")
    return int(value)


def parse(text: str) -> str | Thresholds:
    """``--ecn`` value: a preset name, or ``kmin,kmax,pmax`` (checked: 0 <= kmin <= kmax,
    0 <= pmax <= 1)."""
    t = str(text).strip()
    if t.lower() in PRESETS:
        return t.lower()
    parts = t.split(",")
    if len(parts) != 3:
        raise UserError(f"--ecn: {t!r} is neither a preset ({', '.join(PRESETS)}) nor kmin,kmax,pmax")
    kmin, kmax = _size(parts[0], "kmin"), _size(parts[1], "kmax")
    try:
        pmax = float(parts[2])
    except ValueError:
        raise UserError(f"--ecn: pmax {parts[2].strip()!r} is not a number between 0 and 1") from None
    return checked(kmin, kmax, pmax)


def checked(kmin: int, kmax: int, pmax: float) -> Thresholds:
    if not 0 <= kmin <= kmax:
        raise UserError(f"ECN thresholds need 0 <= kmin <= kmax, got kmin={kmin} kmax={kmax}")
    if not (math.isfinite(pmax) and 0.0 <= pmax <= 1.0):
        raise UserError(f"ECN pmax must be between 0 and 1, got {pmax}")
    return Thresholds(int(kmin), int(kmax), float(pmax))


def from_value(value: str | dict | Thresholds) -> str | Thresholds:
    """What ``experiment.run(ecn_thresholds=...)`` accepts: a preset name, ``kmin,kmax,pmax``,
    a dict with kmin, kmax, pmax, or :class:`Thresholds`."""
    if isinstance(value, Thresholds):
        return value
    if isinstance(value, dict):
        missing = [k for k in ("kmin", "kmax", "pmax") if k not in value]
        if missing:
            raise UserError(f"ECN thresholds need kmin, kmax and pmax; missing {', '.join(missing)}")
        try:
            return checked(int(value["kmin"]), int(value["kmax"]), float(value["pmax"]))
        except (TypeError, ValueError):
            raise UserError(f"ECN thresholds must be numbers, got {value}") from None
    if isinstance(value, str):
        return parse(value)
    raise UserError(f"ECN thresholds: expected a preset name or kmin,kmax,pmax, got {type(value).__name__}")


def for_ports(setting: str | Thresholds, ports: dict[str, tuple[float, int]], mtu: int = 1500
              ) -> dict[str, Thresholds]:
    """Per port (name -> (rate Mbit/s, buffer bytes)): the thresholds of ``setting``."""
    if isinstance(setting, Thresholds):
        return dict.fromkeys(ports, setting)
    return {name: preset(setting, rate, mtu, buf) for name, (rate, buf) in ports.items()}


def describe(per_port: dict[str, Thresholds], rates: dict[str, float]) -> list[str]:
    """One line per port rate: the thresholds and what was floored or capped."""
    by_rate: dict[float, Thresholds] = {}
    for name, th in per_port.items():
        by_rate.setdefault(rates[name], th)
    lines = []
    for rate in sorted(by_rate):
        th = by_rate[rate]
        extra = "".join(f"; {k} floored to whole frames" for k in th.floored)
        extra += "".join(f"; {k} capped at the port buffer" for k in th.capped)
        lines.append(f"{rate:g} Mbit/s: Kmin {th.kmin} B, Kmax {th.kmax} B, Pmax {th.pmax:g}{extra}")
    return lines
