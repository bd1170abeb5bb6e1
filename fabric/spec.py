"""Scenario files: one YAML file describes a fabric; this module validates it into a Scenario.

A scenario names a *kind* of fabric and its numbers:

kind: hpn
    Multi-plane two-tier HPN (Baidu) and, with ``planes: 1``, the spine-leaf rail-group
    design (China Mobile). Each host has ``rails`` NICs (one per accelerator by default);
    each NIC has one port per plane. Inside a pod, hosts are grouped in *segments*; in every
    plane a segment has ``leaves_per_plane_per_segment`` leaves, and rail ``r`` of every host
    of the segment lands on leaf ``r // (rails / leaves_per_plane_per_segment)``. Every leaf
    reaches every spine of its plane and pod. Pods (and campuses) are joined by a core tier
    per plane; campuses are joined core to core by long-haul links.
kind: fat-tree
    The classic three-tier k-ary fat-tree: k pods of k/2 edge and k/2 aggregation switches,
    (k/2)^2 cores, k^3/4 hosts with one NIC port each.

Every number is checked here; a wrong one raises ScenarioError naming the field and the
rule, which the command line prints as one line (exit code 2).
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from .errors import UserError

#: One-way propagation delay of light in fibre.
FIBRE_DELAY_US_PER_KM = 5.0

PRESET_DIR = Path(__file__).resolve().parent.parent / "topologies"
_FAT_TREE_NAME = re.compile(r"^fat-tree-(\d+)$")


class ScenarioError(UserError, ValueError):
    """A scenario that cannot be built: the message names the field and the rule."""

    def __init__(self, field_name: str, rule: str, source: str | None = None):
        self.field = field_name
        self.rule = rule
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field_name}: {rule}")


@dataclass(frozen=True)
class LongHaul:
    """Links between campuses: core i of plane p in one campus to core i of plane p in another."""
    distance_km: float = 10.0
    rate_gbps: float = 400.0
    links: int = 1
    deep_buffer: bool = True
    buffer_mb: float = 0.0  # 0 means "the switch's default"; informational for the model

    @property
    def delay_us(self) -> float:
        return self.distance_km * FIBRE_DELAY_US_PER_KM


@dataclass(frozen=True)
class Emulation:
    """How the scenario is scaled down to run on one machine (see README, 'Emulation')."""
    host_mbps: float = 20.0       # emulated rate of a host port; other links scale with it
    max_mbps: float = 200.0       # cap for any single emulated link
    mtu: int = 1500
    delay_scale: float = 1.0      # multiply configured delays (1.0: real delays)


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str = "hpn"
    description: str = ""
    # hosts
    accelerators_per_host: int = 8
    rails: int = 8
    planes: int = 2
    hosts_per_segment: int = 16
    # hpn structure
    segments_per_pod: int = 1
    leaves_per_plane_per_segment: int = 0     # 0: one leaf per rail
    spines_per_plane: int = 0                 # 0: derived from oversubscription and rates
    leaf_spine_links: int = 1
    pods: int = 1
    cores_per_plane: int = 0
    spine_core_links: int = 1
    campuses: int = 1
    # fat-tree
    k: int = 0
    # rates
    host_rate_gbps: float = 400.0
    leaf_spine_rate_gbps: float = 400.0
    spine_core_rate_gbps: float = 400.0
    # switch model
    switch_radix: int = 128
    switch_port_rate_gbps: float = 400.0
    switch_buffer_mb: float = 64.0
    oversubscription: float | None = None
    long_haul: LongHaul | None = None
    emulation: Emulation = field(default_factory=Emulation)
    source: str | None = None

    # ---- derived numbers -------------------------------------------------
    @property
    def ports_per_host(self) -> int:
        return self.rails * self.planes

    @property
    def rails_per_leaf(self) -> int:
        return self.rails // self.leaves_per_plane_per_segment

    @property
    def hosts(self) -> int:
        if self.kind == "fat-tree":
            return self.k ** 3 // 4
        return self.campuses * self.pods * self.segments_per_pod * self.hosts_per_segment

    @property
    def accelerators(self) -> int:
        return self.hosts * self.accelerators_per_host

    @property
    def leaf_down_ports(self) -> int:
        if self.kind == "fat-tree":
            return self.k // 2
        return self.hosts_per_segment * self.rails_per_leaf

    @property
    def leaf_up_ports(self) -> int:
        if self.kind == "fat-tree":
            return self.k // 2
        return self.spines_per_plane * self.leaf_spine_links

    @property
    def leaves_per_plane_per_pod(self) -> int:
        return self.segments_per_pod * self.leaves_per_plane_per_segment

    @property
    def leaf_oversubscription(self) -> float:
        down = self.leaf_down_ports * self.host_rate_gbps
        up = self.leaf_up_ports * self.leaf_spine_rate_gbps
        return down / up

    def slots(self, rate_gbps: float) -> float:
        """Switch-port slots a port of this rate uses (a 51.2T switch: 128x400G or 512x100G)."""
        return rate_gbps / self.switch_port_rate_gbps

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)


_SCALAR_FIELDS = {f.name: f for f in dataclasses.fields(Scenario)}
_INT_FIELDS = {"accelerators_per_host", "rails", "planes", "hosts_per_segment", "segments_per_pod",
               "leaves_per_plane_per_segment", "spines_per_plane", "leaf_spine_links", "pods",
               "cores_per_plane", "spine_core_links", "campuses", "k", "switch_radix"}
_ZERO_OK = {"leaves_per_plane_per_segment", "spines_per_plane", "cores_per_plane", "k"}
_RATE_FIELDS = {"host_rate_gbps", "leaf_spine_rate_gbps", "spine_core_rate_gbps",
                "switch_port_rate_gbps", "switch_buffer_mb"}
KINDS = ("hpn", "fat-tree")


def _int(value: Any, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ScenarioError(name, f"must be a whole number, got {value!r}")
    if value < minimum:
        raise ScenarioError(name, f"must be at least {minimum}, got {value}")
    return value


def _num(value: Any, name: str, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(name, f"must be a number, got {value!r}")
    if positive and not value > 0:
        raise ScenarioError(name, f"must be positive, got {value}")
    if not math.isfinite(value):
        raise ScenarioError(name, f"must be finite, got {value}")
    return float(value)


_Block = TypeVar("_Block", LongHaul, Emulation)


def _sub(cls: type[_Block], data: Any, name: str) -> _Block | None:
    """A sub-block (``long_haul``, ``emulation``) validated field by field against its defaults."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ScenarioError(name, f"must be a mapping of fields, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise ScenarioError(f"{name}.{key}", f"unknown field (known: {', '.join(sorted(known))})")
        default = known[key].default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ScenarioError(f"{name}.{key}", f"must be true or false, got {value!r}")
            kwargs[key] = value
        elif isinstance(default, int):
            kwargs[key] = _int(value, f"{name}.{key}")
        else:
            zero_ok = key in ("buffer_mb",)
            kwargs[key] = (_num(value, f"{name}.{key}", positive=not zero_ok))
            if zero_ok and kwargs[key] < 0:
                raise ScenarioError(f"{name}.{key}", f"must not be negative, got {value}")
    return cls(**kwargs)


def from_dict(data: Mapping[str, Any], source: str | None = None) -> Scenario:
    """Validate a scenario mapping (as read from YAML) into a Scenario."""
    try:
        return _from_dict(data, source)
    except ScenarioError as exc:
        if exc.source is None and source:
            raise ScenarioError(exc.field, exc.rule, source) from None
        raise


def _from_dict(data: Mapping[str, Any], source: str | None) -> Scenario:
    if not isinstance(data, Mapping):
        raise ScenarioError("(top level)", "a scenario must be a mapping of fields")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _SCALAR_FIELDS or key == "source":
            raise ScenarioError(str(key), "unknown field (see 'hpnlab topo fields')")
        if key == "long_haul":
            kwargs[key] = _sub(LongHaul, value, key)
        elif key == "emulation":
            kwargs[key] = _sub(Emulation, value, key) or Emulation()
        elif key in ("name", "description"):
            if not isinstance(value, str):
                raise ScenarioError(key, f"must be text, got {value!r}")
            kwargs[key] = value
        elif key == "kind":
            if value not in KINDS:
                raise ScenarioError("kind", f"must be one of {', '.join(KINDS)}, got {value!r}")
            kwargs[key] = value
        elif key in _INT_FIELDS:
            kwargs[key] = _int(value, key, minimum=0 if key in _ZERO_OK else 1)
        elif key in _RATE_FIELDS:
            kwargs[key] = _num(value, key)
        elif key == "oversubscription":
            kwargs[key] = None if value is None else _num(value, key)
    if "name" not in kwargs:
        raise ScenarioError("name", "is required")
    scenario = Scenario(source=source, **kwargs)
    return _complete(scenario)


def _complete(s: Scenario) -> Scenario:
    """Fill derived defaults and check every structural rule."""
    if s.kind == "fat-tree":
        return _check_fat_tree(s)
    if s.accelerators_per_host < 1:
        raise ScenarioError("accelerators_per_host", "must be at least 1")
    leaves_per_segment = s.leaves_per_plane_per_segment or s.rails
    if s.rails % leaves_per_segment:
        raise ScenarioError("leaves_per_plane_per_segment",
                            f"must divide rails ({s.rails}), got {leaves_per_segment}")
    s = s.replace(leaves_per_plane_per_segment=leaves_per_segment)
    if s.spines_per_plane == 0:
        target = s.oversubscription or 1.0
        down = s.leaf_down_ports * s.host_rate_gbps
        uplinks = math.ceil(down / target / s.leaf_spine_rate_gbps - 1e-9)
        spines = math.ceil(uplinks / s.leaf_spine_links)
        s = s.replace(spines_per_plane=spines)
    if s.oversubscription is not None:
        actual = s.leaf_oversubscription
        if abs(actual - s.oversubscription) > 0.01 * s.oversubscription + 1e-9:
            raise ScenarioError(
                "oversubscription",
                f"leaves have {s.leaf_down_ports}x{s.host_rate_gbps:g}G down and "
                f"{s.leaf_up_ports}x{s.leaf_spine_rate_gbps:g}G up = {actual:.3f}:1, "
                f"not {s.oversubscription:g}:1")
    needs_core = s.pods > 1 or s.campuses > 1
    if needs_core and s.cores_per_plane == 0:
        raise ScenarioError("cores_per_plane",
                            "must be at least 1 when pods > 1 or campuses > 1 (the core tier joins them)")
    if s.campuses > 1 and s.long_haul is None:
        raise ScenarioError("long_haul", "is required when campuses > 1")
    if s.campuses == 1 and s.long_haul is not None:
        raise ScenarioError("long_haul", "needs campuses > 1")
    _check_radix(s)
    return s


def _check_radix(s: Scenario) -> None:
    def check(tier: str, field_name: str, used: float) -> None:
        if used > s.switch_radix + 1e-9:
            raise ScenarioError(field_name,
                                f"a {tier} would use {used:g} ports of {s.switch_port_rate_gbps:g}G, "
                                f"above switch_radix {s.switch_radix}")

    leaf = (s.leaf_down_ports * s.slots(s.host_rate_gbps)
            + s.leaf_up_ports * s.slots(s.leaf_spine_rate_gbps))
    check("leaf", "hosts_per_segment" if s.spines_per_plane else "spines_per_plane", leaf)
    leaf_up = s.leaf_up_ports * s.slots(s.leaf_spine_rate_gbps)
    check("leaf", "spines_per_plane", leaf_up)
    spine = s.leaves_per_plane_per_pod * s.leaf_spine_links * s.slots(s.leaf_spine_rate_gbps)
    if s.cores_per_plane:
        spine += s.cores_per_plane * s.spine_core_links * s.slots(s.spine_core_rate_gbps)
    check("spine", "segments_per_pod", spine)
    if s.cores_per_plane:
        core = s.pods * s.spines_per_plane * s.spine_core_links * s.slots(s.spine_core_rate_gbps)
        if s.long_haul:
            core += (s.campuses - 1) * s.long_haul.links * s.slots(s.long_haul.rate_gbps)
        check("core", "cores_per_plane", core)


def _check_fat_tree(s: Scenario) -> Scenario:
    if s.k < 2 or s.k % 2:
        raise ScenarioError("k", f"must be an even number of at least 2 for a fat-tree, got {s.k}")
    if s.k > s.switch_radix:
        raise ScenarioError("k", f"a fat-tree switch uses k={s.k} ports, above switch_radix {s.switch_radix}")
    if s.pods not in (1, s.k) or s.campuses != 1:
        raise ScenarioError("pods", "a fat-tree has k pods and one campus; set k instead")
    return s.replace(rails=1, planes=1, pods=s.k, segments_per_pod=s.k // 2, hosts_per_segment=s.k // 2,
                     leaves_per_plane_per_segment=1, spines_per_plane=s.k // 2,
                     cores_per_plane=(s.k // 2) ** 2, leaf_spine_links=1, spine_core_links=1,
                     accelerators_per_host=s.accelerators_per_host if s.accelerators_per_host else 1)


# ---- loading ------------------------------------------------------------------

def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def nest_dotted(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Flat ``(dotted key, value)`` pairs as nested mappings: ``("a.b.c", 1)`` -> ``{"a": {"b": {"c": 1}}}``.

    A later pair wins over an earlier one with the same key. A key that is both a value and a
    group of fields (``long_haul=1`` and ``long_haul.links=2``) raises ScenarioError.
    """
    result: dict[str, Any] = {}
    for key, value in pairs:
        parts = key.strip().split(".")
        target = result
        for depth, part in enumerate(parts[:-1]):
            inner = target.setdefault(part, {})
            if not isinstance(inner, dict):
                group = ".".join(parts[: depth + 1])
                raise ScenarioError(key, f"{group} is given both as a value and as a group of fields")
            target = inner
        if isinstance(target.get(parts[-1]), dict):
            raise ScenarioError(key, f"{key} is given both as a value and as a group of fields")
        target[parts[-1]] = value
    return result


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """`key=value` strings (values parsed as YAML scalars; `a.b=1` for sub-fields)."""
    pairs = []
    for item in items or []:
        if "=" not in item:
            raise ScenarioError(item, "an override must look like field=value")
        key, _, raw = item.partition("=")
        pairs.append((key, yaml.safe_load(raw) if raw else None))
    return nest_dotted(pairs)


def deep_merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated with ``extra``, mapping into mapping (``extra`` wins on a plain value)."""
    out = dict(base)
    for key, value in extra.items():
        current = out.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            out[key] = deep_merge(current, value)
        else:
            out[key] = value
    return out



def load(name_or_path: str, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Load a scenario by preset name (``mini-hpn``, ``fat-tree-8``) or path to a YAML file."""
    path = Path(name_or_path)
    match = _FAT_TREE_NAME.match(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise ScenarioError("scenario", f"no such file: {name_or_path}")
        source = str(path)
    elif (PRESET_DIR / f"{name_or_path}.yaml").is_file():
        path = PRESET_DIR / f"{name_or_path}.yaml"
        source = name_or_path
    elif match:
        data = {"name": name_or_path, "kind": "fat-tree", "k": int(match.group(1)),
                "description": f"three-tier k-ary fat-tree, k={match.group(1)}",
                "host_rate_gbps": 400, "leaf_spine_rate_gbps": 400, "spine_core_rate_gbps": 400,
                "switch_radix": max(128, int(match.group(1))), "accelerators_per_host": 1}
        return from_dict(deep_merge(data, overrides or {}), source=name_or_path)
    else:
        raise ScenarioError("scenario", f"unknown preset or file {name_or_path!r} "
                                        f"(presets: {', '.join(preset_names())}, fat-tree-K)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ScenarioError("(yaml)", f"not valid YAML{where}", source) from None
    if data is None:
        raise ScenarioError("(top level)", "the file is empty", source)
    if not isinstance(data, Mapping):
        raise ScenarioError("(top level)", "a scenario must be a mapping of fields", source)
    return from_dict(deep_merge(data, overrides or {}), source=source)


def to_dict(s: Scenario) -> dict[str, Any]:
    """The scenario as plain data (for results files and JSON reports)."""
    out = dataclasses.asdict(s)
    out.pop("source", None)
    return out
