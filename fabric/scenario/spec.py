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
import operator
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hpnlab.fabric.errors import ScenarioError, UserError, one_line, short
from hpnlab.fabric.scenario.addressing import plan_for

#: One-way propagation delay of light in fibre.
FIBRE_DELAY_US_PER_KM = 5.0

PRESET_DIR = Path(__file__).resolve().parents[2] / "topologies"   # hpnlab/fabric/scenario -> hpnlab/topologies


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
class Lossless:
    """Lossless switching in the emulation (``emulation.lossless``; docs/guides/lossless.md): priority
    flow control and a shared switch buffer with per-ingress-port, per-priority accounting, as
    RoCEv2 fabrics run. A size left null is derived per switch from a named real switch by the rule
    of ``hpnlab.fabric.workload.lossless`` (scaled to the emulated rates)."""
    pfc: bool = False             # pause the upstream transmitter above Xoff ('hpnlab run --pfc on|off')
    alpha: float | None = 0.125   # dynamic Xoff = alpha x the free shared buffer (null: static xoff_bytes)
    xoff_bytes: int | None = None           # static Xoff per ingress port and priority (alpha null)
    buffer_bytes: int | None = None         # each switch's shared buffer (null: derived per switch)
    headroom_bytes: int | None = None       # per ingress port and priority, above Xoff (null: derived)
    reserved_bytes: int | None = None       # per ingress port and priority, before the shared buffer
    resume_offset_bytes: int | None = None  # resume when the shared use is this far below Xoff
    watchdog_ms: int = 2000       # a queue paused this long stops honouring pause (0: no watchdog)
    watchdog_restore_ms: int = 200          # ... for this long, then honours it again
    bounce_priority: str = "auto"  # bounced detours in a lossless priority of their own: auto|on|off


@dataclass(frozen=True)
class Emulation:
    """How the scenario is scaled down to run on one machine (see README, 'Emulation')."""
    host_mbps: float = 20.0       # emulated rate of a host port; other links scale with it
    max_mbps: float = 200.0       # cap for any single emulated link
    mtu: int = 1500
    delay_scale: float = 1.0      # multiply configured delays (1.0: real delays)
    buffer_frames: int = 32       # a port buffer holds at least this many frames (else queue_ms of the rate)
    tcp_congestion: str = ""      # the hosts' TCP congestion control ("": what the machine's namespaces inherit)
    ranks: int | None = None      # ranks per job of `hpnlab run` and the demo without --ranks (None: theirs)
    control_priority: bool = False  # DSCP 48 (CNPs, ACKs, NACKs) in a strict-priority class of every port
    lossless: Lossless = field(default_factory=Lossless)   # PFC and the shared switch buffer


@dataclass(frozen=True)
class Bfd:
    """BFD on the fabric's switch-to-switch ports in the emulation (Open vSwitch ``bfd:*``): a port
    whose session fails stops being live, for the controller and for fast-failover groups; what
    finds one-sided and gray failures. A session is declared down after ``mult`` intervals
    without a packet (RFC 5880)."""
    enabled: bool = False
    min_tx_ms: int = 50           # the shortest interval at which a port sends (its offer)
    min_rx_ms: int = 50           # the shortest interval at which it wants to receive
    mult: int = 3                 # detect multiplier

    @property
    def detect_ms(self) -> int:
        """How long a session waits without a packet before it is down: the slower of the two
        intervals (both ends use the same settings here) times the multiplier."""
        return max(self.min_tx_ms, self.min_rx_ms) * self.mult


@dataclass(frozen=True)
class SwitchTables:
    """Table sizes of the scenario's switch model, held against the compiled policy by
    ``hpnlab check`` (route-budget, flow-budget). None: not stated."""
    routes: int | None = None     # IPv4 routes (the routing table)
    flows: int | None = None      # flow entries, every table


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
    switch_tables: SwitchTables | None = None
    bfd: Bfd = field(default_factory=Bfd)
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


# ---- field rules: one table validates files and overrides and makes the JSON Schema ------

#: Largest count any field takes (hosts per segment, pods, links per pair...); the fabric's
#: size limits below bound the product of the counts.
MAX_COUNT = 1_000_000
#: Largest rate, buffer or distance (1 Pbit/s, 1 TB, 1,000,000 km): far above any real fabric.
MAX_QUANTITY = 1_000_000.0
#: Smallest rate any link may have (Gbit/s; 1 Mbit/s), so that derived port counts stay finite.
MIN_RATE_GBPS = 0.001
#: A datapath id holds 8 bits of plane and 8 bits of campus (see ``addressing.dpid``).
MAX_PLANES = 256
MAX_CAMPUSES = 256
MAX_RADIX = 65_536
MAX_NAME_CHARS = 128
MAX_DESCRIPTION_CHARS = 10_000


@dataclass(frozen=True)
class Rule:
    """What one scenario field accepts: its type, range and meaning (also the JSON Schema's)."""
    type: str                     # "int", "number", "text", "bool", "kind", "block"
    description: str
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False        # a number that must be > 0 (minimum is then the smallest allowed)
    nullable: bool = False        # null allowed (oversubscription, long_haul)
    max_chars: int | None = None
    why_max: str = ""             # said when the maximum is passed
    pattern: str | None = None    # text: what the whole value must match (a regular expression)
    why_pattern: str = ""         # text: said when it does not


def _rate(description: str) -> Rule:
    return Rule("number", description, MIN_RATE_GBPS, MAX_QUANTITY, positive=True)


def _count(description: str, minimum: int = 1, maximum: int = MAX_COUNT, why_max: str = "") -> Rule:
    return Rule("int", description, minimum, maximum, why_max=why_max)


SCENARIO_FIELDS: dict[str, Rule] = {
    "name": Rule("text", "name of the scenario (printed in reports)", max_chars=MAX_NAME_CHARS),
    "kind": Rule("kind", "hpn (multi-plane two-tier; planes: 1 is the spine-leaf rail-group design) or fat-tree"),
    "description": Rule("text", "free text", max_chars=MAX_DESCRIPTION_CHARS),
    "accelerators_per_host": _count("accelerators per host"),
    "rails": _count("NICs per host; each NIC has one port per plane"),
    "planes": _count("planes: disjoint two-tier networks, one port of every NIC in each", maximum=MAX_PLANES,
                     why_max="a datapath id holds 8 bits of plane"),
    "hosts_per_segment": _count("hosts per segment (a segment is the set of hosts sharing leaves)"),
    "segments_per_pod": _count("segments per pod"),
    "leaves_per_plane_per_segment": _count("leaves per plane and segment; must divide rails (0: one leaf per rail)",
                                           minimum=0),
    "spines_per_plane": _count("spines per plane and pod (0: derived from oversubscription)", minimum=0),
    "leaf_spine_links": _count("parallel links per leaf-spine pair"),
    "pods": _count("pods (joined by the core tier)"),
    "cores_per_plane": _count("core switches per plane and campus (needed when pods > 1 or campuses > 1)",
                              minimum=0),
    "spine_core_links": _count("parallel links per spine-core pair"),
    "campuses": _count("campuses (joined core to core by long-haul links)", maximum=MAX_CAMPUSES,
                       why_max="a datapath id holds 8 bits of campus"),
    "k": _count("fat-tree arity (even)", minimum=0, maximum=MAX_RADIX),
    "host_rate_gbps": _rate("rate of a host NIC port (Gbit/s)"),
    "leaf_spine_rate_gbps": _rate("rate of a leaf-spine link (Gbit/s)"),
    "spine_core_rate_gbps": _rate("rate of a spine-core link (Gbit/s)"),
    "switch_radix": _count("switch ports at switch_port_rate_gbps", maximum=MAX_RADIX),
    "switch_port_rate_gbps": _rate("rate of one switch port slot (a faster port uses several slots)"),
    "switch_buffer_mb": Rule("number", "switch buffer in MB (for the model)", 0.0, MAX_QUANTITY, positive=True),
    "oversubscription": Rule("number", "expected leaf down:up ratio, checked against the numbers (null: none)",
                             0.01, 1000.0, positive=True, nullable=True),
    "long_haul": Rule("block", "links between campuses (required when campuses > 1)", nullable=True),
    "emulation": Rule("block", "how the scenario is scaled down to run on one machine", nullable=True),
    "switch_tables": Rule("block", "table sizes of the switch model (checked by 'hpnlab check')", nullable=True),
    "bfd": Rule("block", "BFD on the emulated fabric's switch-to-switch ports (finds one-sided and gray failures)",
                nullable=True),
}
LONG_HAUL_FIELDS: dict[str, Rule] = {
    "distance_km": Rule("number", "one-way fibre length (5 us/km)", 0.0, MAX_QUANTITY, positive=True),
    "rate_gbps": _rate("rate of a long-haul link (Gbit/s)"),
    "links": _count("parallel links per core pair"),
    "deep_buffer": Rule("bool", "cores have deep buffers"),
    "buffer_mb": Rule("number", "core buffer in MB (0: the switch's default; for the model)", 0.0, MAX_QUANTITY),
}
EMULATION_FIELDS: dict[str, Rule] = {
    "host_mbps": Rule("number", "emulated rate of a host port (Mbit/s); other links scale with it",
                      0.0, MAX_QUANTITY, positive=True),
    "max_mbps": Rule("number", "cap for any single emulated link (Mbit/s)", 0.0, MAX_QUANTITY, positive=True),
    "mtu": _count("MTU of emulated links (bytes)", minimum=68, maximum=65_535),
    "delay_scale": Rule("number", "multiply configured delays (1.0: real delays)", 0.0, MAX_QUANTITY, positive=True),
    "buffer_frames": _count("least frames an emulated port buffer holds (else 50 ms of the port's rate)",
                            minimum=4, maximum=100_000),
    "tcp_congestion": Rule("text", "TCP congestion control of the emulated hosts, e.g. cubic, bbr, dctcp "
                           "(empty: what the machine's network namespaces inherit)", max_chars=16,
                           pattern="[a-z0-9_]*", why_pattern="a congestion control's name (a-z, 0-9, _)"),
    "ranks": Rule("int", "ranks per job of 'hpnlab run' and the demo when --ranks is not given (null: 8, or "
                  "every host of a smaller fabric; never more hosts than a job gets)", 2, MAX_COUNT, nullable=True),
    "control_priority": Rule("bool", "send packets marked DSCP 48 (the roce transport's CNPs, ACKs, NACKs and "
                             "notices) ahead of data on every emulated port, as RoCE fabrics queue CNPs"),
    "lossless": Rule("block", "lossless switching: priority flow control and a shared switch buffer "
                     "(docs/guides/lossless.md)", nullable=True),
}
#: the largest buffer, threshold or headroom (bytes) a lossless setting takes: 4 GiB, far above any switch
MAX_BUFFER_BYTES = 1 << 32
LOSSLESS_FIELDS: dict[str, Rule] = {
    "pfc": Rule("bool", "pause the upstream transmitter of a priority above Xoff, hop by hop (false: lossy "
                "switch ports, as without this block)"),
    "alpha": Rule("number", "dynamic Xoff: alpha x the free shared buffer (null: a static Xoff, xoff_bytes)",
                  0.0, 64.0, positive=True, nullable=True),
    "xoff_bytes": Rule("int", "static Xoff per ingress port and priority, used when alpha is null (null: "
                       "alpha 1/8 of the shared buffer)", 1, MAX_BUFFER_BYTES, nullable=True),
    "buffer_bytes": Rule("int", "each switch's shared buffer (null: derived per switch from the reference "
                         "switch, docs/guides/lossless.md)", 1, MAX_BUFFER_BYTES, nullable=True),
    "headroom_bytes": Rule("int", "headroom per ingress port and priority, above Xoff: what arrives while the "
                           "pause takes effect (null: derived from the port's rate)", 0, MAX_BUFFER_BYTES,
                           nullable=True),
    "reserved_bytes": Rule("int", "bytes per ingress port and priority held before the shared buffer is used "
                           "(null: 4 frames)", 0, MAX_BUFFER_BYTES, nullable=True),
    "resume_offset_bytes": Rule("int", "resume when the shared use is this many bytes below Xoff (null: 3 "
                                "frames)", 0, MAX_BUFFER_BYTES, nullable=True),
    "watchdog_ms": _count("PFC watchdog: a queue paused this long stops honouring pause, counted and logged "
                          "(0: no watchdog)", minimum=0, maximum=60_000),
    "watchdog_restore_ms": _count("how long the watchdog ignores pause before honouring it again (ms)",
                                  minimum=1, maximum=60_000),
    "bounce_priority": Rule("text", "bounced fast-failover detours in a lossless priority of their own: auto (when "
                            "the routing proof finds a cyclic buffer dependency), on or off", max_chars=16,
                            pattern="auto|on|off", why_pattern="one of auto, on, off"),
}
SWITCH_TABLES_FIELDS: dict[str, Rule] = {
    "routes": Rule("int", "IPv4 routes a switch holds (null: not stated)", 1, MAX_COUNT * 1000, nullable=True),
    "flows": Rule("int", "flow entries a switch holds, every table (null: not stated)", 1, MAX_COUNT * 1000,
                  nullable=True),
}
#: Open vSwitch's limits on BFD intervals (vswitch.xml: bfd:min_rx and bfd:min_tx, at least 1 ms) and the
#: RFC 5880 multiplier (8 bits); the longest interval is a practical bound (a minute)
BFD_MAX_MS = 60_000
BFD_FIELDS: dict[str, Rule] = {
    "enabled": Rule("bool", "run BFD on every switch-to-switch port of the emulation"),
    "min_tx_ms": _count("shortest interval at which a port sends BFD packets (ms)", maximum=BFD_MAX_MS),
    "min_rx_ms": _count("shortest interval at which a port wants BFD packets (ms)", maximum=BFD_MAX_MS),
    "mult": _count("intervals without a packet before the session is down (detect multiplier)", maximum=255,
                   why_max="an 8-bit field of the BFD packet"),
}
_BLOCKS: dict[str, tuple[type, dict[str, Rule]]] = {"long_haul": (LongHaul, LONG_HAUL_FIELDS),
                                                    "emulation": (Emulation, EMULATION_FIELDS),
                                                    "switch_tables": (SwitchTables, SWITCH_TABLES_FIELDS),
                                                    "bfd": (Bfd, BFD_FIELDS)}
#: blocks inside blocks: (outer, inner) -> the inner block's class and rules
_NESTED: dict[tuple[str, str], tuple[type, dict[str, Rule]]] = {("emulation", "lossless"): (Lossless, LOSSLESS_FIELDS)}
_Block = TypeVar("_Block", LongHaul, Emulation, SwitchTables, Bfd, Lossless)
KINDS = ("hpn", "fat-tree")


def _whole(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ScenarioError(name, f"must be a whole number, got {short(value)}")
    try:
        return operator.index(value)
    except TypeError:
        pass
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ScenarioError(name, f"must be a whole number, got {short(value)}")


def _figure(value: float | int) -> str:
    """A number as a reader wants it: 1,000,000 (not 1e+06), 0.001; a huge one by its digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if value.bit_length() <= 128 else short(value)
    return f"{int(value):,}" if float(value).is_integer() and abs(value) < 1e18 else f"{value:g}"


def _too_big(name: str, rule: Rule, value: Any) -> ScenarioError:
    why = f" ({rule.why_max})" if rule.why_max else ""
    assert rule.maximum is not None
    return ScenarioError(name, f"must be at most {_figure(rule.maximum)}{why}, got {short(value)}")


def _check_int(value: Any, name: str, rule: Rule) -> int:
    number = _whole(value, name)
    if rule.minimum is not None and number < rule.minimum:
        raise ScenarioError(name, f"must be at least {_figure(rule.minimum)}, got {short(number)}")
    if rule.maximum is not None and number > rule.maximum:
        raise _too_big(name, rule, value)
    return number


def _check_number(value: Any, name: str, rule: Rule) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(name, f"must be a number, got {short(value)}")
    if rule.maximum is not None and isinstance(value, int) and value > rule.maximum:
        raise _too_big(name, rule, value)   # before float(): a huge int does not convert
    # a huge negative int does not convert either: it fails the rules below as a float would
    number = float(value) if not isinstance(value, int) or value > -MAX_QUANTITY else -math.inf
    if rule.positive and not number > 0:
        raise ScenarioError(name, f"must be positive, got {short(value)}")
    if rule.minimum is not None and number < rule.minimum:
        what = "must not be negative" if rule.minimum == 0 else f"must be at least {rule.minimum:g}"
        raise ScenarioError(name, f"{what}, got {short(value)}")
    if not math.isfinite(number):
        raise ScenarioError(name, f"must be finite, got {short(value)}")
    if rule.maximum is not None and number > rule.maximum:
        raise _too_big(name, rule, value)
    return number


def _check_text(value: Any, name: str, rule: Rule) -> str:
    if not isinstance(value, str):
        raise ScenarioError(name, f"must be text, got {short(value)}")
    if rule.max_chars is not None and len(value) > rule.max_chars:
        raise ScenarioError(name, f"must be at most {rule.max_chars:,} characters, got {len(value):,}")
    if rule.pattern is not None and not re.fullmatch(rule.pattern, value):
        raise ScenarioError(name, f"must be {rule.why_pattern or 'text matching ' + rule.pattern}, got {short(value)}")
    if name == "name" and not value.isprintable():
        raise ScenarioError(name, f"must be printable text on one line, got {short(value)}")
    return value


def _check_value(value: Any, name: str, rule: Rule) -> Any:
    if value is None and rule.nullable:
        return None
    if rule.type == "int":
        return _check_int(value, name, rule)
    if rule.type == "number":
        return _check_number(value, name, rule)
    if rule.type == "text":
        return _check_text(value, name, rule)
    if rule.type == "bool":
        if not isinstance(value, bool):
            raise ScenarioError(name, f"must be true or false, got {short(value)}")
        return value
    if rule.type == "kind":
        if value not in KINDS:
            raise ScenarioError(name, f"must be one of {', '.join(KINDS)}, got {short(value)}")
        return value
    raise AssertionError(rule.type)


def _field_name(key: Any) -> str:
    return key if isinstance(key, str) else short(key)


def _sub(cls: type[_Block], data: Any, name: str, rules: dict[str, Rule] | None = None) -> _Block | None:
    """A sub-block (``long_haul``, ``emulation``, ``emulation.lossless``) validated field by field against
    its rules (a block's own blocks in turn)."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ScenarioError(name, f"must be a mapping of fields, got {type(data).__name__}")
    rules = _BLOCKS[name][1] if rules is None else rules
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in rules:
            raise ScenarioError(f"{name}.{_field_name(key)}", f"unknown field (known: {', '.join(sorted(rules))})")
        nested = _NESTED.get((name, key))
        if nested is not None:
            inner = _sub(nested[0], value, f"{name}.{key}", nested[1])
            kwargs[key] = inner if inner is not None else nested[0]()
        else:
            kwargs[key] = _check_value(value, f"{name}.{key}", rules[key])
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
        if key not in SCENARIO_FIELDS:
            raise ScenarioError(_field_name(key), "unknown field (see 'hpnlab topo fields')")
        if key == "long_haul":
            kwargs[key] = _sub(LongHaul, value, key)
        elif key == "emulation":
            kwargs[key] = _sub(Emulation, value, key) or Emulation()
        elif key == "switch_tables":
            kwargs[key] = _sub(SwitchTables, value, key)
        elif key == "bfd":
            kwargs[key] = _sub(Bfd, value, key) or Bfd()
        else:
            kwargs[key] = _check_value(value, key, SCENARIO_FIELDS[key])
    if "name" not in kwargs:
        raise ScenarioError("name", "is required")
    scenario = Scenario(source=source, **kwargs)
    return _complete(scenario)


def _complete(s: Scenario) -> Scenario:
    """Fill derived defaults and check every structural rule, the size limits and the address plan."""
    s = _check_fat_tree(s) if s.kind == "fat-tree" else _complete_hpn(s)
    check_limits(s)
    _check_address_plan(s)
    return s


def _complete_hpn(s: Scenario) -> Scenario:
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
        spines = max(1, math.ceil(uplinks / s.leaf_spine_links))
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


# ---- size: what the fabric would hold, computed from the numbers before anything is built ----

#: Default limits on the fabric's size. hpn-130k, the largest preset, has 19,456 nodes and
#: 1,048,576 links and builds in about 7 s and 0.9 GB here; the defaults allow about twice
#: that (fat-tree-128, 544,768 nodes and 1,572,864 links: about 30 s and 1.6 GB). A user
#: with the memory for more sets the environment variable named in LIMIT_ENV.
DEFAULT_LIMITS = {"links": 2_000_000, "nodes": 1_000_000}
LIMIT_ENV = {"links": "HPNLAB_MAX_LINKS", "nodes": "HPNLAB_MAX_NODES"}
#: Identifier ranges: a host MAC holds 3 bytes of host index and 2 of NIC port
#: (``addressing.host_mac``); a datapath id 40 bits of switch index.
MAX_MAC_HOSTS = 1 << 24
MAX_MAC_PORTS = 1 << 16
MAX_DPID_INDEX = 1 << 40


def limits() -> dict[str, int]:
    """The size limits in force: the defaults, or what HPNLAB_MAX_LINKS / HPNLAB_MAX_NODES say."""
    out = dict(DEFAULT_LIMITS)
    for what, env in LIMIT_ENV.items():
        raw = os.environ.get(env)
        if raw:
            try:
                out[what] = int(raw.replace(",", "").replace("_", ""))
            except ValueError:
                raise UserError(f"{env} must be a whole number, got {short(raw)}") from None
    return out


def size(s: Scenario) -> dict[str, int]:
    """Hosts, switches, links and NIC ports the fabric of a (completed) scenario has, by arithmetic.

    Exact (a test compares it with built graphs), and computed on Python integers, so a
    scenario of 10^30 hosts costs no more to size than one of ten.
    """
    if s.kind == "fat-tree":
        k = s.k
        hosts = k ** 3 // 4
        switches = 5 * k * k // 4
        links = 3 * k ** 3 // 4
        return {"hosts": hosts, "switches": switches, "nodes": hosts + switches, "links": links,
                "host_ports": hosts, "switch_index": k * k // 2}
    pods = s.campuses * s.pods
    leaves_per_plane = pods * s.segments_per_pod * s.leaves_per_plane_per_segment
    spines_per_plane = pods * s.spines_per_plane
    cores_per_plane = s.campuses * s.cores_per_plane
    hosts = s.hosts
    host_links = hosts * s.ports_per_host
    fabric_links = leaves_per_plane * s.spines_per_plane * s.leaf_spine_links * s.planes
    core_links = spines_per_plane * s.cores_per_plane * s.spine_core_links * s.planes
    long_haul = 0
    if s.long_haul:
        pairs = s.campuses * (s.campuses - 1) // 2
        long_haul = pairs * s.cores_per_plane * s.long_haul.links * s.planes
    switches = (leaves_per_plane + spines_per_plane + cores_per_plane) * s.planes
    return {"hosts": hosts, "switches": switches, "nodes": hosts + switches,
            "links": host_links + fabric_links + core_links + long_haul, "host_ports": host_links,
            "switch_index": max(leaves_per_plane, spines_per_plane, cores_per_plane)}


def check_limits(s: Scenario) -> dict[str, int]:
    """Refuse, in one line, a fabric beyond the size limits or whose identifiers would collide.

    Called on every completed scenario and again by ``graph.build`` (a Scenario made in
    Python skips ``from_dict``). Returns the fabric's size.
    """
    n = size(s)
    if s.kind != "fat-tree":
        if s.planes > MAX_PLANES:
            raise _too_big("planes", SCENARIO_FIELDS["planes"], s.planes)
        if s.campuses > MAX_CAMPUSES:
            raise _too_big("campuses", SCENARIO_FIELDS["campuses"], s.campuses)
    for what, limit in limits().items():
        if n[what] > limit:
            raise ScenarioError(
                "(size)", f"the fabric would have {_figure(n[what])} {what}, above the limit of {limit:,} "
                          f"({_figure(n['hosts'])} hosts, {_figure(n['switches'])} switches); "
                          f"set {LIMIT_ENV[what]} to raise it if this machine has the memory (about 1 GB per "
                          "million links)")
    if n["hosts"] > MAX_MAC_HOSTS:
        raise ScenarioError("(size)", f"{n['hosts']:,} hosts: a host MAC numbers at most {MAX_MAC_HOSTS:,}")
    if s.ports_per_host > MAX_MAC_PORTS:
        raise ScenarioError("rails", f"rails x planes = {s.ports_per_host:,} NIC ports per host; "
                                     f"a host MAC numbers at most {MAX_MAC_PORTS:,}")
    if n["switch_index"] >= MAX_DPID_INDEX:
        raise ScenarioError("(size)", f"{n['switch_index']:,} switches in a tier: a datapath id numbers "
                                      f"at most {MAX_DPID_INDEX:,}")
    return n


def _check_address_plan(s: Scenario) -> None:
    plan_for(s)


# ---- loading ------------------------------------------------------------------

#: Largest scenario file read (bytes): presets are under 1 KiB.
MAX_FILE_BYTES = 64 * 1024
#: Deepest nesting of mappings and lists in a file or an override (a scenario needs 2).
MAX_DEPTH = 8
#: Most YAML tokens (keys, values, brackets...) in a file or an override: a preset has ~100.
MAX_TOKENS = 2_000
#: Longest ``--set`` item (characters).
MAX_OVERRIDE_CHARS = 4096
_PRESET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_FAT_TREE_NAME = re.compile(r"^fat-tree-(\d{1,9})$")
_OVERRIDE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}$")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with what a scenario file needs and no more.

    Aliases (``*name``) are refused when met, before anything is expanded, so a "billion
    laughs" file costs nothing; nesting deeper than MAX_DEPTH is refused before the
    (recursive) composer goes deeper; a key given twice is refused naming both lines.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def fetch_more_tokens(self) -> None:
        # Pure-Python YAML costs ~10-50 us a token: a cap on tokens bounds the parse whatever
        # the file holds (long text and comments are one token or none).
        super().fetch_more_tokens()
        if self.tokens_taken + len(self.tokens) > MAX_TOKENS:
            mark = self.get_mark()
            raise ScenarioError("(yaml)", f"line {mark.line + 1}: more than {MAX_TOKENS:,} YAML tokens; "
                                          "a scenario is a few dozen fields")

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # Refused in the scanner: it looks ahead over every open '[' and '{' (quadratic in
        # their number), long before the composer would see the depth.
        if self.flow_level >= MAX_DEPTH:
            mark = self.get_mark()
            raise ScenarioError("(yaml)", f"line {mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ScenarioError("(yaml)", f"line {event.start_mark.line + 1}: aliases (*{short(event.anchor, 20)}) "
                                          "are not allowed in a scenario; write the value out")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ScenarioError("(yaml)", f"line {mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:
                    raise ScenarioError("(yaml)", f"line {line}: a key must be a plain value, "
                                                  f"got {short(key)}") from None
                if first is not None:
                    raise ScenarioError(_field_name(key), f"given twice, at lines {first} and {line}")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _yaml_load(text: str, source: str | None) -> Any:
    """Parse YAML text with _Loader; every failure a one-line ScenarioError."""
    loader = None
    try:
        loader = _Loader(text)   # the reader refuses characters YAML does not allow here
        return loader.get_single_data()
    except ScenarioError as exc:
        raise ScenarioError(exc.field, exc.rule, source) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}" if mark else ""
        problem = one_line(str(exc.problem or exc.context), 160)
        raise ScenarioError("(yaml)", f"not valid YAML{where}: {problem}", source) from None
    except yaml.reader.ReaderError as exc:
        character = exc.character if isinstance(exc.character, int) else ord(exc.character or "\0")
        raise ScenarioError("(yaml)", f"not valid YAML: character #x{character:04x} at position {exc.position} "
                                      "is not allowed (a NUL, a control character, undecodable bytes)",
                            source) from None
    except yaml.YAMLError as exc:
        raise ScenarioError("(yaml)", f"not valid YAML: {short(str(exc), 120)}", source) from None
    except (ValueError, TypeError, OverflowError) as exc:   # e.g. a timestamp 2024-13-45, a 5,000-digit int
        raise ScenarioError("(yaml)", f"a value YAML cannot read: {short(str(exc), 120)}", source) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_text(path: Path, source: str) -> str:
    """A scenario file's text: at most MAX_FILE_BYTES, UTF-8 (a BOM is allowed)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ScenarioError("scenario", f"cannot read {short(source)}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ScenarioError("(file)", f"larger than {MAX_FILE_BYTES // 1024} KiB: a scenario file is a few "
                                      "dozen lines", source)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ScenarioError("(file)", f"not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}); "
                                      "save it as UTF-8", source) from None


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def nest_dotted(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Flat ``(dotted key, value)`` pairs as nested mappings: ``("a.b", 1)`` -> ``{"a": {"b": 1}}``.

    A key is a field name, ``block.field`` or ``block.block.field``. A later pair wins over an earlier one with
    the same key. A key that is both a value and a group of fields (``long_haul=1`` and
    ``long_haul.links=2``) raises ScenarioError.
    """
    result: dict[str, Any] = {}
    for key, value in pairs:
        key = key.strip() if isinstance(key, str) else key
        if not isinstance(key, str) or not _OVERRIDE_KEY.match(key):
            raise ScenarioError(_field_name(key), "an override's field must be a name, block.name or "
                                                  "block.block.name (letters, digits, _), e.g. planes or "
                                                  "long_haul.links")
        parts = key.split(".")
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
        if not isinstance(item, str) or "=" not in item:
            raise ScenarioError(_field_name(item), "an override must look like field=value")
        if len(item) > MAX_OVERRIDE_CHARS:
            raise ScenarioError(item.partition("=")[0], f"an override is at most {MAX_OVERRIDE_CHARS:,} characters, "
                                                        f"got {len(item):,}")
        key, _, raw = item.partition("=")
        try:
            value = _yaml_load(raw, None) if raw else None
        except ScenarioError as exc:
            raise ScenarioError(f"--set {key.strip()}", exc.rule) from None
        pairs.append((key, value))
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


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):   # a name too long for the file system, a NUL byte
        return False


def load(name_or_path: str, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Load a scenario by preset name (``mini-hpn``, ``fat-tree-8``) or path to a YAML file."""
    if not isinstance(name_or_path, (str, Path)):
        raise ScenarioError("scenario", f"must be a preset name or a file, got {short(name_or_path)}")
    name_or_path = str(name_or_path)
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ScenarioError("overrides", f"must be a mapping of fields, got {short(overrides)}")
    path = Path(name_or_path)
    match = _FAT_TREE_NAME.match(name_or_path)
    preset = PRESET_DIR / f"{name_or_path}.yaml" if _PRESET_NAME.match(name_or_path) else None
    if path.suffix in (".yaml", ".yml") or _is_file(path):
        if not _is_file(path):
            raise ScenarioError("scenario", f"no such file: {short(name_or_path, 200)}")
        source = str(path)
    elif preset is not None and _is_file(preset):
        path = preset
        source = name_or_path
    elif match:
        k = int(match.group(1))
        data = {"name": name_or_path, "kind": "fat-tree", "k": k,
                "description": f"three-tier k-ary fat-tree, k={k}",
                "host_rate_gbps": 400, "leaf_spine_rate_gbps": 400, "spine_core_rate_gbps": 400,
                "switch_radix": max(128, min(k, MAX_RADIX)), "accelerators_per_host": 1}
        return from_dict(deep_merge(data, overrides or {}), source=name_or_path)
    else:
        raise ScenarioError("scenario", f"unknown preset or file {short(name_or_path, 40)} "
                                        f"(presets: {', '.join(preset_names())}, fat-tree-K)")
    data = _yaml_load(read_text(path, source), source)
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


def merged(s: Scenario, overrides: Mapping[str, Any] | None) -> Scenario:
    """``s`` with ``overrides`` merged into it (``deep_merge``) and validated again: a loaded scenario
    changed without reading its file again (the same Scenario as loading it with both sets of overrides)."""
    if not overrides:
        return s
    if not isinstance(overrides, Mapping):
        raise ScenarioError("overrides", f"must be a mapping of fields, got {short(overrides)}")
    return from_dict(deep_merge(to_dict(s), overrides), s.source)


# ---- JSON Schema: the same rules, for editors ------------------------------------

SCHEMA_FILE = "scenario.schema.json"   # in PRESET_DIR; the presets name it on their first line


def _schema_of(rule: Rule, fields: Mapping[str, Rule] | None = None, name: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"description": rule.description}
    if rule.type == "int":
        out.update(type="integer", minimum=int(rule.minimum or 0))
        if rule.maximum is not None:
            out["maximum"] = int(rule.maximum)
    elif rule.type == "number":
        out["type"] = "number"
        if rule.positive and not rule.minimum:
            out["exclusiveMinimum"] = 0
        elif rule.minimum is not None:
            out["minimum"] = rule.minimum
        if rule.maximum is not None:
            out["maximum"] = rule.maximum
    elif rule.type == "text":
        out["type"] = "string"
        if rule.max_chars is not None:
            out["maxLength"] = rule.max_chars
        if rule.pattern is not None:
            out["pattern"] = f"^{rule.pattern}$"
    elif rule.type == "bool":
        out["type"] = "boolean"
    elif rule.type == "kind":
        out.update(type="string", enum=list(KINDS))
    elif rule.type == "block":
        out.update(type="object", additionalProperties=False,
                   properties={key: _schema_of(r, _NESTED.get((name, key), (None, None))[1], key)
                               for key, r in (fields or {}).items()})
    if rule.nullable:
        out["type"] = [out["type"], "null"]
    return out


def json_schema() -> dict[str, Any]:
    """A JSON Schema (2020-12) of scenario files, made from the rules that validate them.

    It checks types, ranges and names; the structural rules (divisibility, radix, size
    limits, address plan) need the loader: ``hpnlab topo inspect FILE``.
    """
    blocks = {name: fields for name, (_, fields) in _BLOCKS.items()}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "hpnlab scenario",
        "description": "A fabric for hpnlab (hpnlab topo fields; README, 'Scenario files'). Generated by "
                       "'hpnlab topo schema' from hpnlab.fabric.scenario.spec.",
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {name: _schema_of(rule, blocks.get(name), name) for name, rule in SCENARIO_FIELDS.items()},
    }


def describe_fields() -> list[str]:
    """One line per field: name, type and range, meaning (``hpnlab topo fields``)."""
    lines = []
    blocks = {name: fields for name, (_, fields) in _BLOCKS.items()}
    for name, rule in SCENARIO_FIELDS.items():
        lines.append(_describe(name, rule))
        for sub, sub_rule in blocks.get(name, {}).items():
            lines.append(_describe(f"{name}.{sub}", sub_rule))
            for inner, inner_rule in _NESTED.get((name, sub), (None, {}))[1].items():
                lines.append(_describe(f"{name}.{sub}.{inner}", inner_rule))
    return lines


def _describe(name: str, rule: Rule) -> str:
    if rule.type in ("int", "number"):
        low = "> 0" if rule.positive and not rule.minimum else f">= {_figure(rule.minimum or 0)}"
        what = f"{'whole' if rule.type == 'int' else 'number'} {low}, <= {_figure(rule.maximum or 0)}"
    elif rule.type == "text":
        what = f"text, <= {_figure(rule.max_chars or 0)} chars"
    elif rule.type == "kind":
        what = " | ".join(KINDS)
    else:
        what = {"bool": "true | false", "block": "mapping"}[rule.type]
    if rule.nullable:
        what += " | null"
    return f"{name:<30} {what:<34} {rule.description}"
