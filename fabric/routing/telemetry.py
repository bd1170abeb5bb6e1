"""Fabric telemetry, pure: cumulative counters in, per switch egress port time series out.

No os-ken, no I/O: ``controller/app.py`` asks :meth:`Telemetry.poll` which switches to send an
OpenFlow port statistics request to (every ``interval_s``), decodes the replies into
:class:`OfPortStats` values and hands them to :meth:`Telemetry.port_stats`; where the emulated
ECN stage exists, its counters (read by the controller process itself, see
``controller/actuators.py``) go to :meth:`Telemetry.stage_counters`. Once per interval
:meth:`Telemetry.sample` combines the latest of both sources into one :class:`PortTelemetry`
per egress port and appends it to that port's ring buffer (bounded memory: ``history``
samples per port).

Rates are differences of cumulative counters between two readings of the same source,
divided by the time between them (the controller's monotonic clock at decode time). A counter
that goes down (a switch reconnected, the stage's counters were reset) gives no rate for that
interval: the reading becomes the new base. OpenFlow replies arrive after the request, so the
OpenFlow part of a sample is the interval that ended at the last reply (up to a couple of
intervals old); the ECN stage's part is read synchronously at the tick.

What each field means (per switch egress port, over the last interval):

``tx_bps``          bits/s sent (OpenFlow ``tx_bytes``; the stage's bytes when there is no OpenFlow reading)
``utilisation``     ``tx_bps`` / the port's rate (the emulated rate of its fabric link)
``rx_bps``          bits/s received on the same port (its peer's egress towards this switch)
``queue_bytes``     the stage's queue estimate at the tick (eBPF: its virtual queue; RED: backlog);
                    None where there is no stage (a real switch: queue depth needs INT or vendor telemetry)
``queue_peak_bytes`` the queue's peak over the interval (eBPF: the marker's 10 ms peaks since the previous
                    read), so a burst between two ticks is seen; None where the stage keeps no peaks (RED)
``ce_marked_pps``   packets/s the stage marked CE; ``ce_fraction``: marked / packets through the stage
``ect_pps``         ECN-capable packets/s through the stage
``drops``           packets dropped in the interval: OpenFlow ``tx_dropped`` plus the stage's (emulation: the port
                    buffer's drops, ``EcnStage.queue_drops``, read at most once a second)
``fan_in``          ports of the same switch receiving at least ``FAN_IN_SHARE`` of their rate: an
                    upper bound of the incast degree of any of its egress ports (port statistics say
                    how much enters, not where it goes)

Priority flow control (where the emulation runs PFC, ``--pfc on``: the controller reads the PFC stage's
counters at each tick, :meth:`Telemetry.pfc_counters`; None on a lossy fabric, so that a policy and a
reader tell "no PFC" from "no pause"):

``paused_fraction``   share of the interval this port's transmitter was held paused by its downstream
                      (the peer's ingress: the egress side of pause, "this port cannot send")
``pauses_received``   pause frames its downstream sent it in the interval
``pausing_fraction``  share of the interval this port, as an ingress, held its upstream peer paused (its
                      switch's buffer held too much of what came in through it: pause spreading upstream)
``pauses_sent``       pause frames it sent upstream in the interval
``headroom_drops``    lossless packets its ingress headroom dropped in the interval (0 where PFC is sized right)
"""
from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from hpnlab.fabric.scenario.rates import emulated_mbps

PortKey = tuple[str, int]          # (switch name, OpenFlow port number)
FAN_IN_SHARE = 0.05                # a port counts towards fan-in above this share of its rate
STALE_INTERVALS = 2.5             # OpenFlow rates older than this many intervals are no longer shown
#: how often the controller reads port statistics and the ECN stage unless told otherwise (0: never)
DEFAULT_INTERVAL_MS = 200
XID_BASE = 0x7E000000              # port stats requests' xids: apart from the reconciler's (which count up from 1)


def port_key_str(key: PortKey) -> str:
    """``"switch:port"``: a port key as a JSON object key or a metric label."""
    return f"{key[0]}:{key[1]}"


@dataclass(frozen=True)
class PortInfo:
    """A switch egress port of the fabric: the peer it sends to and its emulated rate."""
    switch: str
    port: int
    peer: str
    rate_bps: float
    kind: str = ""


def fabric_ports(g: nx.MultiGraph) -> dict[PortKey, PortInfo]:
    """Every switch egress port of the fabric graph with its peer and emulated rate (bits/s)."""
    s = g.graph["scenario"]
    out: dict[PortKey, PortInfo] = {}
    for u, v, d in g.edges(data=True):
        for a, b in ((u, v), (v, u)):
            if g.nodes[a]["tier"] == 0:
                continue
            port = d["ports"][a]
            out[(a, port)] = PortInfo(a, port, b, emulated_mbps(s, d["rate_gbps"]) * 1e6, d.get("kind", ""))
    return out


def port_renumbering(a: nx.MultiGraph, b: nx.MultiGraph) -> dict[PortKey, PortKey]:
    """Every switch port of graph ``a`` -> the same port in graph ``b``, the same fabric on other port
    numbers (``controller/deployment.apply`` keeps the edges and renumbers their ends): how the emulated
    ECN stage's ports, keyed by the scenario's numbers, and the thresholds in force follow a deployment."""
    out: dict[PortKey, PortKey] = {}
    for u, v, k, d in a.edges(keys=True, data=True):
        if not b.has_edge(u, v, k):
            continue
        there = b.edges[u, v, k]["ports"]
        for n, port in d["ports"].items():
            if a.nodes[n]["tier"] > 0 and n in there:
                out[(n, port)] = (n, there[n])
    return out


@dataclass(frozen=True)
class PortStatsRequest:
    """Ask a switch for the statistics of all its ports (OFPMP_PORT_STATS, port OFPP_ANY)."""
    switch: str
    xid: int


@dataclass(frozen=True)
class OfPortStats:
    """One port's entry of an OpenFlow port statistics reply (cumulative counters)."""
    port: int
    tx_bytes: int = 0
    tx_packets: int = 0
    tx_dropped: int = 0
    rx_bytes: int = 0
    rx_packets: int = 0
    rx_dropped: int = 0


@dataclass(frozen=True)
class StageCounters:
    """The ECN stage's counters of one port (cumulative except ``queue_bytes``, a snapshot)."""
    bytes: int = 0
    packets: int = 0
    ect: int = 0
    ce_marked: int = 0
    queue_bytes: int = 0
    drops: int = 0
    queue_peak_bytes: int | None = None


@dataclass(frozen=True)
class PfcCounters:
    """The PFC stage's counters of one switch port (cumulative): as an ingress (``pauses_sent``, ``pausing_s``:
    time it held its upstream paused, ``headroom_drops``) and as a transmitter (``pauses_received``,
    ``paused_s``: time its downstream held it paused)."""
    pauses_sent: int = 0
    pausing_s: float = 0.0
    headroom_drops: int = 0
    pauses_received: int = 0
    paused_s: float = 0.0


def pfc_counters(rows: Mapping[str, Mapping[str, Any]]) -> dict[PortKey, PfcCounters]:
    """The PFC stage's reading (``PfcStage.counters()``: per interface name, e.g. ``p0l0-eth3``) as
    :class:`PfcCounters` per switch port (scenario numbers); host NICs are left out."""
    out: dict[PortKey, PfcCounters] = {}
    for intf, row in rows.items():
        if not row.get("switch_port"):
            continue
        node, sep, port = str(intf).rpartition("-eth")
        if not sep or not port.isdigit():
            continue
        out[(str(row.get("node") or node), int(port))] = PfcCounters(
            pauses_sent=int(row.get("pauses_sent") or 0), pausing_s=float(row.get("paused_s") or 0.0),
            headroom_drops=int(row.get("headroom_drops") or 0),
            pauses_received=int(row.get("pauses_received") or 0), paused_s=float(row.get("paused_rx_s") or 0.0))
    return out


@dataclass(frozen=True)
class PortTelemetry:
    """One interval of one switch egress port (see the module docstring for each field)."""
    t: float
    rate_bps: float
    tx_bps: float = 0.0
    utilisation: float = 0.0
    rx_bps: float = 0.0
    queue_bytes: int | None = None
    ce_marked_pps: float = 0.0
    ce_fraction: float = 0.0
    ect_pps: float = 0.0
    drops: int = 0
    fan_in: int = 0
    queue_peak_bytes: int | None = None
    paused_fraction: float | None = None       # PFC (None: no PFC stage): see the module docstring
    pauses_received: int | None = None
    pausing_fraction: float | None = None
    pauses_sent: int | None = None
    headroom_drops: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Reading:
    t: float
    values: tuple[int, ...]


@dataclass
class _PfcReading:
    t: float
    counters: PfcCounters


def _rates(prev: _Reading | None, now: float, values: tuple[int, ...]) -> tuple[float, tuple[int, ...]] | None:
    """(dt, deltas) from the previous reading, or None (first reading, counter went down, no time passed)."""
    if prev is None:
        return None
    dt = now - prev.t
    deltas = tuple(b - a for a, b in zip(prev.values, values, strict=True))
    if dt <= 0 or any(d < 0 for d in deltas):
        return None
    return dt, deltas


class Telemetry:
    """Port statistics and ECN stage counters of one fabric, as bounded time series per egress port."""

    def __init__(self, ports: Mapping[PortKey, PortInfo], interval_s: float = 0.2, history: int = 600):
        if not interval_s > 0:
            raise ValueError(f"telemetry interval must be > 0 s, got {interval_s}")
        self.ports = dict(ports)
        self.interval_s = float(interval_s)
        self.history = int(history)
        self.series: dict[PortKey, deque[PortTelemetry]] = {k: deque(maxlen=self.history) for k in self.ports}
        self._of_prev: dict[PortKey, _Reading] = {}
        self._stage_prev: dict[PortKey, _Reading] = {}
        self._of_rates: dict[PortKey, dict[str, float]] = {}
        self._stage_rates: dict[PortKey, dict[str, float]] = {}
        self._queue: dict[PortKey, int] = {}
        self._peak: dict[PortKey, int] = {}        # each port's queue peak since the previous sample
        self._pfc_prev: dict[PortKey, _PfcReading] = {}
        self._pfc_rates: dict[PortKey, dict[str, float]] = {}
        self.pfc = False                            # a PFC stage was read at least once
        self._next_poll: float | None = None
        self._xid = XID_BASE
        self.outstanding: dict[int, tuple[str, float]] = {}     # xid -> (switch, sent at)
        #: achieved intervals between consecutive samples (seconds; the last ``history``)
        self.intervals: deque[float] = deque(maxlen=self.history)
        self._last_sample: float | None = None
        self.counters = {"requests": 0, "replies": 0, "samples": 0, "stage_reads": 0}

    def rebase(self, ports: Mapping[PortKey, PortInfo]) -> None:
        """The fabric's ports on other numbers (a deployment adopted at run time): every series starts
        again on the new keys; nothing measured on the old numbers is carried over."""
        self.ports = dict(ports)
        self.series = {k: deque(maxlen=self.history) for k in self.ports}
        for kept in (self._of_prev, self._stage_prev, self._of_rates, self._stage_rates, self._queue, self._peak,
                     self._pfc_prev, self._pfc_rates):
            kept.clear()

    # ---- polling -------------------------------------------------------------------------------
    def due(self, now: float) -> bool:
        return self._next_poll is None or now >= self._next_poll

    def poll(self, now: float, switches: Iterable[str]) -> list[PortStatsRequest]:
        """The port statistics requests to send now (one per connected switch of the fabric), or none
        when the interval has not elapsed since the last poll. A poll is never scheduled in the past,
        so a late tick does not cause a burst of catch-up polls."""
        if not self.due(now):
            return []
        self._next_poll = max(now, self._next_poll or now) + self.interval_s
        known = {sw for sw, _ in self.ports}
        out = []
        for sw in sorted(set(switches) & known):
            self._xid = XID_BASE if self._xid >= 0x7FFFFFFF else self._xid + 1
            out.append(PortStatsRequest(sw, self._xid))
            self.outstanding[self._xid] = (sw, now)
        # a request that was never answered is forgotten after a few intervals
        stale = [x for x, (_, t) in self.outstanding.items() if now - t > 5 * self.interval_s]
        for x in stale:
            del self.outstanding[x]
        self.counters["requests"] += len(out)
        return out

    # ---- inputs --------------------------------------------------------------------------------
    def port_stats(self, switch: str, now: float, stats: Iterable[OfPortStats], xid: int | None = None) -> None:
        """One (part of a) port statistics reply of ``switch``, decoded at ``now``."""
        if xid is not None:
            self.outstanding.pop(xid, None)
        self.counters["replies"] += 1
        for st in stats:
            key = (switch, st.port)
            if key not in self.ports:
                continue            # the local port, host-side ports, ports not in the fabric
            values = (st.tx_bytes, st.tx_packets, st.tx_dropped, st.rx_bytes)
            r = _rates(self._of_prev.get(key), now, values)
            self._of_prev[key] = _Reading(now, values)
            if r is None:
                continue
            dt, (tx_bytes, tx_packets, tx_dropped, rx_bytes) = r
            self._of_rates[key] = {"tx_bps": tx_bytes * 8 / dt, "tx_pps": tx_packets / dt,
                                   "drops": float(tx_dropped), "rx_bps": rx_bytes * 8 / dt, "t": now,
                                   "new": 1.0}

    def stage_counters(self, now: float, counters: Mapping[PortKey, StageCounters]) -> None:
        """The ECN stage's counters of (some of) the ports, read at ``now``."""
        self.counters["stage_reads"] += 1
        for key, c in counters.items():
            if key not in self.ports:
                continue
            self._queue[key] = int(c.queue_bytes)
            if c.queue_peak_bytes is not None:
                self._peak[key] = int(c.queue_peak_bytes)
            values = (c.bytes, c.packets, c.ect, c.ce_marked, c.drops)
            r = _rates(self._stage_prev.get(key), now, values)
            self._stage_prev[key] = _Reading(now, values)
            if r is None:
                continue
            dt, (nbytes, packets, ect, marked, drops) = r
            self._stage_rates[key] = {"bps": nbytes * 8 / dt, "packets": float(packets), "ect_pps": ect / dt,
                                      "ce_marked_pps": marked / dt, "ce_fraction": marked / packets if packets else 0.0,
                                      "drops": float(drops)}

    def pfc_counters(self, now: float, counters: Mapping[PortKey, PfcCounters]) -> None:
        """The PFC stage's counters of (some of) the ports, read at ``now``: the next sample carries the
        pause figures of the interval since the previous reading (a counter that went down: no figure)."""
        self.pfc = True
        for key, c in counters.items():
            if key not in self.ports:
                continue
            prev = self._pfc_prev.get(key)
            self._pfc_prev[key] = _PfcReading(now, c)
            if prev is None or now <= prev.t:
                continue
            dt = now - prev.t
            p = prev.counters
            deltas = (c.pauses_sent - p.pauses_sent, c.pausing_s - p.pausing_s, c.headroom_drops - p.headroom_drops,
                      c.pauses_received - p.pauses_received, c.paused_s - p.paused_s)
            if any(d < 0 for d in deltas):
                continue
            sent, pausing, hdrops, received, paused = deltas
            self._pfc_rates[key] = {"pauses_sent": sent, "pausing_fraction": min(1.0, pausing / dt),
                                    "headroom_drops": hdrops, "pauses_received": received,
                                    "paused_fraction": min(1.0, paused / dt)}

    # ---- output --------------------------------------------------------------------------------
    def _of(self, key: PortKey, now: float) -> dict[str, float] | None:
        """The port's latest OpenFlow rates, unless older than ``STALE_INTERVALS`` intervals."""
        r = self._of_rates.get(key)
        return r if r is not None and now - r["t"] <= STALE_INTERVALS * self.interval_s else None

    def _pfc_fields(self, key: PortKey) -> dict[str, Any]:
        """The port's pause figures of the interval: None without a PFC stage, zeros while it paused nothing
        (or before its second reading)."""
        return pfc_fields(self._pfc_rates.get(key) or {}) if self.pfc else {}

    def sample(self, now: float) -> dict[PortKey, PortTelemetry]:
        """One sample per egress port from the latest readings; appended to each port's series.

        The stage's rates are read at the tick and used once. OpenFlow replies arrive at their own
        time, so a port's latest OpenFlow rates stand until a newer reply replaces them or they are
        older than ``STALE_INTERVALS`` intervals (a switch that stopped answering shows no traffic);
        its drops count once. Throughput and utilisation come from OpenFlow (what the port sent), else
        from the stage (what reached the port: under overload more than it can send, since the buffer
        behind the stage drops the rest)."""
        fan_in: dict[str, int] = {}
        for key, info in self.ports.items():
            rx = (self._of(key, now) or {}).get("rx_bps", 0.0)
            if info.rate_bps > 0 and rx >= FAN_IN_SHARE * info.rate_bps:
                fan_in[key[0]] = fan_in.get(key[0], 0) + 1
        out: dict[PortKey, PortTelemetry] = {}
        for key, info in self.ports.items():
            of = self._of(key, now)
            st = self._stage_rates.get(key)
            tx = of["tx_bps"] if of is not None else (st["bps"] if st is not None else 0.0)
            drops = (of["drops"] if of is not None and of["new"] else 0.0) + (st["drops"] if st is not None else 0.0)
            if of is not None:
                of["new"] = 0.0
            out[key] = PortTelemetry(
                t=now, rate_bps=info.rate_bps, tx_bps=tx,
                utilisation=tx / info.rate_bps if info.rate_bps > 0 else 0.0,
                rx_bps=of["rx_bps"] if of is not None else 0.0,
                queue_bytes=self._queue.get(key),
                ce_marked_pps=st["ce_marked_pps"] if st is not None else 0.0,
                ce_fraction=st["ce_fraction"] if st is not None else 0.0,
                ect_pps=st["ect_pps"] if st is not None else 0.0,
                drops=int(drops), fan_in=fan_in.get(key[0], 0), queue_peak_bytes=self._peak.pop(key, None),
                **self._pfc_fields(key))
            self.series[key].append(out[key])
        self._stage_rates.clear()
        self._pfc_rates.clear()
        if self._last_sample is not None:
            self.intervals.append(now - self._last_sample)
        self._last_sample = now
        self.counters["samples"] += 1
        return out


# ---- the telemetry file (JSON lines) and the run's "telemetry" key -----------------------------

def sample_line(now: float, samples: Mapping[PortKey, PortTelemetry], thresholds: Mapping[PortKey, Any],
                ports: Mapping[PortKey, PortInfo], idle_too: bool = False) -> dict[str, Any]:
    """One JSON line of the telemetry file: every port that carried anything (or all with ``idle_too``).
    ``thresholds``: port -> a value with kmin, kmax, pmax (the thresholds in force during the interval)."""
    rows = []
    for key, s in samples.items():
        if not idle_too and s.tx_bps == 0 and not s.queue_bytes and s.drops == 0 and s.rx_bps == 0 \
                and not s.paused_fraction and not s.pausing_fraction and not s.headroom_drops:
            continue
        th = thresholds.get(key)
        # unrounded: what the policy decided on, so that a replay (controller/ecn_replay.py) decides the same
        rows.append({"switch": key[0], "port": key[1], "peer": ports[key].peer if key in ports else "",
                     "tx_mbps": s.tx_bps / 1e6, "utilisation": s.utilisation,
                     "rx_mbps": s.rx_bps / 1e6, "queue_bytes": s.queue_bytes,
                     "queue_peak_bytes": s.queue_peak_bytes,
                     "ce_marked_pps": s.ce_marked_pps, "ce_fraction": s.ce_fraction,
                     "ect_pps": s.ect_pps, "drops": s.drops, "fan_in": s.fan_in,
                     **({f: getattr(s, f) for f in PFC_FIELDS} if s.paused_fraction is not None else {}),
                     **({"kmin": th.kmin, "kmax": th.kmax, "pmax": th.pmax} if th is not None else {})})
    return {"kind": "sample", "t": now, "ports": rows}


#: a sample line's PFC figures (present only where a PFC stage was read)
PFC_FIELDS = ("paused_fraction", "pauses_received", "pausing_fraction", "pauses_sent", "headroom_drops")


def pfc_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A port's pause figures as :class:`PortTelemetry` takes them, from a mapping that has some of them
    (an interval's rates, a telemetry file's row): fractions as floats, counts as ints, a missing one 0."""
    return {f: (float if f.endswith("fraction") else int)(row.get(f) or 0) for f in PFC_FIELDS}


_SERIES_FIELDS = ("tx_mbps", "utilisation", "rx_mbps", "queue_bytes", "queue_peak_bytes", "ce_marked_pps",
                  "ce_fraction", "drops", "kmin", "kmax", "pmax", *PFC_FIELDS)


def _bucket(values: list, field: str) -> Any:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    if field in ("queue_bytes", "queue_peak_bytes"):
        return max(vals)            # a queue's peak matters more than its mean
    if field in ("drops", "pauses_received", "pauses_sent", "headroom_drops"):
        return sum(vals)
    if field in ("kmin", "kmax", "pmax"):
        return vals[-1]             # what was in force at the bucket's end
    return round(sum(vals) / len(vals), 4)


def read_lines(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a telemetry file (``--telemetry-out``, JSON lines); a line that does not parse
    (the one the controller is writing now) is left out."""
    out = []
    with open(path) as f:
        for raw in f:
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
    return out


def summarise(lines: Iterable[Mapping[str, Any]], max_points: int = 300) -> dict[str, Any]:
    """The run's ``telemetry`` key from the lines of a telemetry file: per port (``"switch:port"``) its
    time series (``t`` in seconds from the first sample), downsampled to at most ``max_points``
    buckets (mean of rates, peak of the queue, sum of drops, thresholds at the bucket's end); every
    threshold change as it was written; every policy replacement (``policies``); the file's header
    fields (interval, actuator, ports), ``policy`` being the last one in force."""
    header: dict[str, Any] = {}
    changes: list[dict[str, Any]] = []
    policies: list[dict[str, Any]] = []
    per_port: dict[str, dict[str, Any]] = {}
    t0: float | None = None
    samples = 0
    for line in lines:
        kind = line.get("kind")
        if kind == "header":
            header = {k: v for k, v in line.items() if k != "kind"}
        elif kind == "change":
            changes.append({k: v for k, v in line.items() if k != "kind"})
        elif kind == "policy":
            policies.append({k: v for k, v in line.items() if k != "kind"})
        elif kind == "sample":
            samples += 1
            t = float(line["t"])
            t0 = t if t0 is None else t0
            for row in line.get("ports", ()):
                key = f"{row['switch']}:{row['port']}"
                port = per_port.setdefault(key, {"peer": row.get("peer", ""), "t": [],
                                                 **{f: [] for f in _SERIES_FIELDS}})
                port["t"].append(round(t - t0, 4))
                for f in _SERIES_FIELDS:
                    v = row.get(f)
                    port[f].append(round(v, 4) if isinstance(v, float) else v)
    if t0 is not None:
        for ch in changes:
            ch["t_rel"] = round(float(ch.get("t", t0)) - t0, 4)
    for port in per_port.values():
        n = len(port["t"])
        if n > max_points:
            step = math.ceil(n / max_points)
            for f in ("t", *_SERIES_FIELDS):
                vals = port[f]
                port[f] = [vals[i] if f == "t" else _bucket(vals[i:i + step], f) for i in range(0, n, step)]
    if policies:
        header["policy"] = policies[-1]["policy"]
    return {**header, "samples": samples, "ports": per_port, "changes": changes, "policies": policies}
