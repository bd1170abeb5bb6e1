"""Replay a recorded telemetry file through an ECN policy, offline: what would this policy have set?

``python -m hpnlab.controller.ecn_replay telemetry.jsonl [--policy my_policies.py:Mine] [--option k=v]
[--json OUT] [--changes N]`` reads a telemetry file (the controller's ``--telemetry-out``; ``hpnlab
run --out DIR`` keeps an emulation's as ``DIR/telemetry.jsonl``) and feeds each recorded tick's
per-port samples to a policy exactly as the controller's loop does (``controller/ecn_loop.py``):
``decide(now, ports, current)``, only differences kept (:func:`ecn_policy.changes`), applied to the
thresholds the replay holds. No root, no switch, no emulation: a policy is tried on yesterday's
traffic before it is deployed.

Segments: the file's header names the policy it started with, and every ``policy`` line (the
harness replacing the policy between runs) starts a new segment. As the live loop does, each
segment starts from the start-up thresholds with a fresh policy instance. Without ``--policy``
each segment is replayed with the policy it was recorded under, and the replay is checked
against the recorded decisions: the same ports changed at the same ticks to the same thresholds
(``agree``), and the thresholds in force at every tick equal the recorded ones (``in_force``).
That is the check that the controller's decisions are the pure policy's on its telemetry, and
nothing else. With ``--policy`` every segment is replayed with that policy instead.

What a replay cannot tell: it is open loop. The traffic is what was recorded under the thresholds
then in force; under other thresholds the senders would have seen other marks (DCQCN) and the
queues would have been other queues. A replay shows a policy's decisions on that traffic, not
the traffic those decisions would have made (that is what ``hpnlab run --compare ecn
--ecn-policy FILE.py`` measures).

Ports the file's sample lines leave out (they carried nothing in the interval) are replayed as
idle ports, with their switch's fan-in from the ports of the same switch that the line has.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing import telemetry
from hpnlab.fabric.routing.telemetry import PortKey, PortTelemetry, port_key_str
from hpnlab.fabric.workload.ecn import STATIC_POLICY, default_thresholds

from . import ecn_policy
from .ecn_policy import EcnPolicy, Thresholds

#: a recorded change that is not a policy's decision: the live loop putting every port back to its
#: start-up thresholds when the policy is replaced (``EcnLoop.set_policy``)
RESET_REASON = "start-up thresholds"
_ROW_FLOATS = (("tx_mbps", "tx_bps", 1e6), ("rx_mbps", "rx_bps", 1e6), ("utilisation", "utilisation", 1.0),
               ("ce_marked_pps", "ce_marked_pps", 1.0), ("ce_fraction", "ce_fraction", 1.0),
               ("ect_pps", "ect_pps", 1.0))


@dataclass
class Segment:
    """A stretch of the file under one recorded policy."""
    recorded_policy: str
    replayed_policy: str
    t0: float | None = None
    t1: float | None = None
    ticks: int = 0
    changes: list[dict[str, Any]] = field(default_factory=list)      # the replay's
    recorded: list[dict[str, Any]] = field(default_factory=list)     # the file's decisions in this segment
    in_force_differ: int = 0      # (port, tick) pairs whose recorded thresholds differ from the replay's
    skipped: str | None = None    # why the segment was not replayed (its recorded policy does not load here)

    def as_dict(self) -> dict[str, Any]:
        return {"recorded_policy": self.recorded_policy, "replayed_policy": self.replayed_policy,
                "t0": self.t0, "t1": self.t1, "ticks": self.ticks, "changes": self.changes,
                "recorded": self.recorded, "in_force_differ": self.in_force_differ, "skipped": self.skipped}


def _key_of(change: Mapping[str, Any]) -> tuple[float, str, int, int, int, float]:
    new = change["new"]
    return (round(float(change["t"]), 4), str(change["switch"]), int(change["port"]), int(new["kmin"]),
            int(new["kmax"]), round(float(new["pmax"]), 4))


def _header(lines: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    for line in lines:
        if line.get("kind") == "header":
            return line
    raise UserError("not a telemetry file: no header line (the controller's --telemetry-out writes one first)")


def _ports(header: Mapping[str, Any]) -> dict[PortKey, float]:
    """Port key -> rate (bit/s) from the header's ``ports`` ({"switch:port": {"peer", "rate_mbps"}})."""
    out: dict[PortKey, float] = {}
    for name, info in (header.get("ports") or {}).items():
        switch, _, port = str(name).rpartition(":")
        try:
            out[(switch, int(port))] = float(info["rate_mbps"]) * 1e6
        except (KeyError, TypeError, ValueError):
            raise UserError(f"telemetry header: port {name!r} has no switch:port name or no rate_mbps") from None
    if not out:
        raise UserError("telemetry header lists no ports")
    return out


def samples_of(line: Mapping[str, Any], rates: Mapping[PortKey, float]) -> dict[PortKey, PortTelemetry]:
    """One sample line as the loop's ``samples``: every port of the header, the ones the line leaves out
    idle (with their switch's fan-in from the line's other ports of that switch)."""
    t = float(line["t"])
    # a line recorded with a PFC stage carries pause figures on every row it has (the loop writes them all)
    pfc = any(row.get("paused_fraction") is not None for row in line.get("ports") or ())
    fan_in: dict[str, int] = {}
    out: dict[PortKey, PortTelemetry] = {}
    for row in line.get("ports") or ():
        key = (str(row["switch"]), int(row["port"]))
        if key not in rates:
            continue
        kw: dict[str, Any] = {attr: float(row.get(name) or 0.0) * scale for name, attr, scale in _ROW_FLOATS}
        out[key] = PortTelemetry(t=t, rate_bps=rates[key], queue_bytes=row.get("queue_bytes"),
                                 queue_peak_bytes=row.get("queue_peak_bytes"), drops=int(row.get("drops") or 0),
                                 fan_in=int(row.get("fan_in") or 0), **kw,
                                 **(telemetry.pfc_fields(row) if pfc else {}))
        fan_in[key[0]] = max(fan_in.get(key[0], 0), out[key].fan_in)
    for key, rate in rates.items():
        if key not in out:
            # a port the line leaves out paused nothing: zeros on a line with PFC, None without
            out[key] = PortTelemetry(t=t, rate_bps=rate, fan_in=fan_in.get(key[0], 0),
                                     **(telemetry.pfc_fields({}) if pfc else {}))
    return out


def _recorded_in_force(line: Mapping[str, Any]) -> dict[PortKey, Thresholds]:
    return {(str(r["switch"]), int(r["port"])): Thresholds(int(r["kmin"]), int(r["kmax"]), float(r["pmax"]))
            for r in line.get("ports") or () if r.get("kmin") is not None}


def _same(a: Thresholds, b: Thresholds) -> bool:
    return (a.kmin, a.kmax, round(a.pmax, 4)) == (b.kmin, b.kmax, round(b.pmax, 4))


def replay(lines: Iterable[Mapping[str, Any]], policy: str | None = None, options: Mapping[str, Any] | None = None,
           mtu: int | None = None) -> dict[str, Any]:
    """Replay a telemetry file's lines (see the module docstring). ``policy``: the policy every segment
    is replayed with (a built-in name, MODULE:CLASS or FILE.py[:CLASS]); None: each segment's own.
    Returns {"segments": [...], "changes", "recorded", "agree", "only_replayed", "only_recorded",
    "in_force_differ", "final": {"switch:port": thresholds}, "ticks", "policy"}."""
    lines = [dict(line) for line in lines]
    header = _header(lines)
    rates = _ports(header)
    mtu = int(mtu or header.get("mtu") or 1500)
    opts = dict(options or {})
    initial = {k: default_thresholds(rate, mtu) for k, rate in rates.items()}
    first = next((line for line in lines if line.get("kind") == "sample"), None)
    if first is not None:              # the start-up thresholds as the loop held them (the file says)
        initial.update({k: t for k, t in _recorded_in_force(first).items() if k in initial})

    if policy is not None:
        ecn_policy.load(policy, mtu, **opts)        # a policy of one's own that does not load: one line, now

    def start(recorded: Mapping[str, Any]) -> tuple[Segment, EcnPolicy | None, dict[PortKey, Thresholds]]:
        spec = str(recorded.get("spec") or recorded.get("policy") or STATIC_POLICY)
        seg = Segment(spec, policy or spec)
        try:
            return seg, ecn_policy.load(policy or spec, mtu, **opts), dict(initial)
        except UserError as exc:      # a file policy recorded elsewhere: not replayed, not compared
            seg.skipped = str(exc)
            return seg, None, dict(initial)

    seg, pol, current = start(header)
    segments = [seg]
    for line in lines:
        kind = line.get("kind")
        if kind == "policy":
            seg, pol, current = start(line)
            segments.append(seg)
        elif kind == "change":
            reason = str(line.get("reason", ""))
            if not (reason.startswith("policy ") and RESET_REASON in reason):   # not the loop's own reset
                seg.recorded.append({k: line[k] for k in ("t", "switch", "port", "old", "new", "reason", "policy")
                                     if k in line})
        elif kind == "sample":
            if pol is None:
                seg.ticks += 1
                continue
            now = float(line["t"])
            samples = samples_of(line, rates)
            seg.t0 = now if seg.t0 is None else seg.t0
            seg.t1 = now
            seg.ticks += 1
            seg.in_force_differ += sum(1 for k, t in _recorded_in_force(line).items()
                                       if k in current and not _same(current[k], t))
            decided = pol.decide(now, samples, current)
            for key, new in sorted(ecn_policy.changes(current, decided).items()):
                old = current.get(key)
                seg.changes.append({"t": round(now, 4), "switch": key[0], "port": key[1],
                                    "old": old.as_dict() if old else None, "new": new.as_dict(), "reason": new.reason})
                current[key] = new
    replayed = [c for s in segments for c in s.changes]
    recorded = [c for s in segments if s.skipped is None for c in s.recorded]
    # compared with the file only when every segment ran the policy it was recorded under, unchanged
    own = not opts and (policy is None or all(s.replayed_policy == s.recorded_policy for s in segments))
    mine = {_key_of(c) for c in replayed}
    theirs = {_key_of(c) for c in recorded}
    return {"policy": policy, "segments": [s.as_dict() for s in segments], "ticks": sum(s.ticks for s in segments),
            "changes": replayed, "recorded": recorded, "compared": own,
            "agree": (mine == theirs and len(replayed) == len(recorded)) if own else None,
            "only_replayed": sorted(mine - theirs) if own else [],
            "only_recorded": sorted(theirs - mine) if own else [],
            "in_force_differ": sum(s.in_force_differ for s in segments) if own else None,
            "final": {port_key_str(k): t.as_dict() for k, t in current.items() if t != initial.get(k)}}


def format_replay(result: Mapping[str, Any], show: int = 20) -> str:
    """The replay as lines: per segment its policies, ticks and changes; the agreement with the
    recorded decisions when it was replayed with its own policies; the first ``show`` changes."""
    lines = []
    for k, s in enumerate(result["segments"]):
        span = "" if s["t0"] is None else f", {s['t1'] - s['t0']:.1f} s"
        if s.get("skipped"):
            lines.append(f"segment {k + 1}: recorded under {s['recorded_policy']}: {s['ticks']} ticks{span}, not "
                         f"replayed ({s['skipped']}; --policy replays it with another)")
            continue
        lines.append(f"segment {k + 1}: recorded under {s['recorded_policy']}, replayed with {s['replayed_policy']}: "
                     f"{s['ticks']} ticks{span}, {len(s['changes'])} changes replayed, {len(s['recorded'])} recorded")
    if result["compared"]:
        if result["agree"] and not result["in_force_differ"]:
            lines.append(f"agree: the replay made every recorded decision and no other ({len(result['changes'])} "
                         f"changes), and the thresholds in force matched the recorded ones at every tick")
        else:
            lines.append(f"DIFFER: {len(result['only_replayed'])} changes only in the replay, "
                         f"{len(result['only_recorded'])} only in the file; thresholds in force differed at "
                         f"{result['in_force_differ']} port-ticks")
            for what, keys in (("only replayed", result["only_replayed"]), ("only recorded", result["only_recorded"])):
                for t, sw, port, kmin, kmax, pmax in list(keys)[:5]:
                    lines.append(f"  {what}: t {t:.4f} {sw}:{port} -> Kmin {kmin} B, Kmax {kmax} B, Pmax {pmax:.2f}")
    else:
        lines.append("open loop: the traffic is what was recorded under the thresholds then in force")
    changes = result["changes"]
    if changes:
        t0 = next((s["t0"] for s in result["segments"] if s["t0"] is not None), 0.0)
        lines.append(f"changes (first {min(show, len(changes))} of {len(changes)}; t from the first sample):")
        for c in changes[:show]:
            old = c["old"] or {}
            lines.append(f"  {c['t'] - t0:8.3f} s {c['switch']}:{c['port']}  Kmin {old.get('kmin', '?')} -> "
                         f"{c['new']['kmin']} B, Pmax {old.get('pmax', '?')} -> {c['new']['pmax']}: {c['reason']}")
    moved = result["final"]
    lines.append(f"ports away from their start-up thresholds at the end: {len(moved)}")
    return "\n".join(lines)


def read(path: str | Path) -> list[dict[str, Any]]:
    """A telemetry file's lines; one line of error for a missing or unreadable file, or a line that is
    not JSON (the last one, being written, is left out as the controller's reader does)."""
    p = Path(path)
    try:
        raw = p.read_text().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read telemetry file {p}: {exc.strerror or exc}") from None
    out = []
    for n, text in enumerate(raw, 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError:
            if n == len(raw):
                continue
            raise UserError(f"{p}:{n}: not a JSON line") from None
        if not isinstance(line, dict):
            raise UserError(f"{p}:{n}: not a JSON object")
        out.append(line)
    return out


def _option(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    try:
        return name, float(value)
    except ValueError:
        return name, value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpnlab.controller.ecn_replay",
                                description="Replay a recorded telemetry file through an ECN policy, offline.")
    p.add_argument("file", help="a telemetry file: the controller's --telemetry-out, or hpnlab run --out DIR's "
                                "DIR/telemetry.jsonl")
    p.add_argument("--policy", help="replay every segment with this policy (static, dynamic, pfc-aware, "
                                    "MODULE:CLASS or FILE.py[:CLASS]); default: each segment's own, checked against "
                                    "the file")
    p.add_argument("--option", action="append", type=_option, default=[], metavar="NAME=VALUE",
                   help="a policy option (e.g. pressure_ms=40 for dynamic); repeatable")
    p.add_argument("--changes", type=int, default=20, metavar="N", help="changes to print (default 20)")
    p.add_argument("--json", metavar="OUT", help="write the whole replay as JSON")
    args = p.parse_args(argv)
    try:
        result = replay(read(args.file), args.policy, dict(args.option))
    except UserError as exc:
        print(f"hpnlab: {exc}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError) as exc:
        print(f"hpnlab: {args.file}: a line is not a telemetry record ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    print(format_replay(result, max(0, args.changes)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result["agree"] in (True, None) and not result["in_force_differ"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
