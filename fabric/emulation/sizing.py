"""What an emulation of a fabric costs on this machine, and whether it fits (pure: no root, no Mininet).

``hpnlab doctor`` and the emulation's preflight both ask this; neither needs the harness for it.

The budget is measured, not assumed: ``tools/bench/bench_ports.py --save`` (or ``hpnlab doctor
--measure``) measures the packets/s a leaf-spine-leaf chain of userspace bridges delivers
per port type and frame size, with the CPU left for the generators, and writes it to
``budget.json`` in the cache directory (``cache_dir``); every emulation that comes up with
every pair verified adds its bring-up time there (``record_bringup``). The size check, the
node cap and the default emulated rates (``default_rates``) derive from that file; where
nothing was measured they fall back to the constants below, and every figure says which.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph as fgraph
from hpnlab.fabric.scenario.rates import ETH_HEADER as ETH

#: fallback without a measurement: userspace OVS on 2 cores forwards about this many packets/s
#: through the whole fabric (environment note: iperf3 UDP through two switches); scaled with the CPU count.
PPS_PER_CORE = 21_500
#: fallback without a measurement: Mininet nodes (hosts + switches) per core the emulation accepts.
NODES_PER_CORE = 64
#: the share of the measured ceiling (its median repetition) the default emulated rates use; the rest is
#: for the generators (8 Python ranks here), bursts and noise. Measured on mini-hpn's default matrix at
#: MTU 4096 (tools/bench/bench_defaults.py, the quiet machine): at 0.6 (48 Mbit/s) the sprayed all-reduce fell
#: from 0.85 of line rate to 0.62-0.69 with 18-24% of the CPU idle; at 0.3 (24 Mbit/s) it held (0.82-0.89)
HEADROOM = 0.3
#: a budget from the short probe (``budget --probe``: the switches only, one repetition, in seconds) leaves the
#: generators' ceiling unmeasured; the rates then take this share of the switches' rate. Measured here
#: (2026-12-02, docs/results/2026-12-02-generators-ceiling.md): the generators kept 0.966 of line at a quarter of the
#: switches' 54 Mbit/s and fell below 95% of that at 0.38 of it; one repetition may read up to twice the median
PROBE_SHARE = 0.25
#: an emulation must come up (built, connected, every pair verified) within this many seconds
UP_TARGET_S = 60.0
#: where the measured budget lives: ``$HPNLAB_CACHE_DIR``, else /var/cache/hpnlab as root, else ~/.cache/hpnlab
CACHE_ENV = "HPNLAB_CACHE_DIR"
BUDGET_FILE = "budget.json"
#: the node cap reaches at most this many times the largest emulation that came up within UP_TARGET_S
#: (measured: 56 nodes came up in 21 s here, 104 did not within 150 s: verifying every pair grows faster)
NODES_EXTRAPOLATE = 1.5
#: bring-up samples kept (newest last): at most BRINGUP_PER_SIZE of each node count (the newest),
#: BRINGUP_KEEP in all. Per size, so that a test run's many small bring-ups do not push out the
#: few large ones that set the node cap
BRINGUP_KEEP = 48
BRINGUP_PER_SIZE = 3


# ---- the measured budget: a plain document, read and written here ----------------------------

def cache_dir(env: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """Where the measured budget is kept (pure given ``env`` and ``uid``)."""
    e: Mapping[str, str] = os.environ if env is None else env
    if e.get(CACHE_ENV):
        return Path(e[CACHE_ENV])
    if (os.geteuid() if uid is None else uid) == 0:
        return Path("/var/cache/hpnlab")
    return Path(e.get("XDG_CACHE_HOME") or Path(e.get("HOME", "~")).expanduser() / ".cache") / "hpnlab"


def budget_path() -> Path:
    return cache_dir() / BUDGET_FILE


def load_budget(path: Path | None = None) -> dict[str, Any] | None:
    """The measured budget, or None when nothing was measured (or the file is unreadable)."""
    try:
        doc = json.loads((path or budget_path()).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def save_budget(doc: dict[str, Any], path: Path | None = None) -> Path:
    """Write the budget, keeping the bring-up samples already recorded."""
    path = path or budget_path()
    old = load_budget(path) or {}
    doc = {**doc, "bringup": doc.get("bringup") or old.get("bringup", [])}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)
    return path


def busy_warning(load: list[float], load_after: list[float], cpus: int) -> str | None:
    """A line when the machine was busy while its budget was measured (the 1-minute load average
    before or after above the core count): other work took CPU from the generators and the
    switches, so the ceiling read is likely low (pure)."""
    worst = max([*load[:1], *load_after[:1]], default=0.0)
    if worst <= cpus:
        return None
    return (f"the load average reached {worst:.1f} on {cpus} core(s) while measuring: other work took CPU from the "
            f"generators and the switches, so this budget is likely low; measure again on a quiet machine")


def budget_document(ports: dict[str, Any], *, hops: int, cpus: int, load: list[float],
                    tc_egress: dict[str, bool] | None = None, **extra: Any) -> dict[str, Any]:
    """The budget document from a measurement (pure): per port type, per frame size, the
    packets/s delivered through a chain of ``hops`` switches at each repetition."""
    return {"version": 1, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "hops": hops,
            "cpus": cpus, "load": [round(v, 2) for v in load], "ports": ports, "tc_egress": tc_egress, **extra}


def pps_at(budget: dict[str, Any] | None, port_type: str, frame: int) -> float | None:
    """Packets/s the chain carried without loss for this port type at this frame size (pure): the
    median repetition, what the machine sustains (the best one overshoots: on a quiet machine here
    the repetitions at 4110 B spread over 26.8k-60.0k, and defaults from 60.0k left the generators
    too little CPU and lowered every busbw fraction), linear between the measured frame sizes, the
    nearest measured one outside them; None when unmeasured (or when no rate got through without loss)."""
    frames = ((budget or {}).get("ports", {}).get(port_type) or {}).get("frames", {})
    points = sorted((int(f), statistics.median(row["pps"])) for f, row in frames.items() if row.get("pps"))
    points = [(f, p) for f, p in points if p > 0]      # nothing delivered without loss: not a measurement
    if not points:
        return None
    if frame <= points[0][0]:
        return points[0][1]
    for (f0, p0), (f1, p1) in itertools.pairwise(points):
        if f0 <= frame <= f1:
            return p0 + (p1 - p0) * (frame - f0) / (f1 - f0)
    return points[-1][1]


#: the generators keep up at a rate where the calibration cell's busbw fraction is at least this share of
#: its fraction at the lowest rung (where the CPU is not the limit); measured on mini-hpn (8 ranks, MTU
#: 4096, 2026-12-02): the sprayed all-reduce gave 0.957 at 18 Mbit/s, 0.866 at 27, 0.74 at 36, 0.55 at 54
GENERATOR_KEEP = 0.95
#: the calibration's rates, as shares of the rate the switches' budget gives (``default_rates``)
GENERATOR_RUNGS = (0.25, 0.375, 0.5, 0.75, 1.0)


def generator_rungs(host_mbps: float) -> list[float]:
    """The host-port rates (Mbit/s) the generators' calibration runs (pure): ``GENERATOR_RUNGS`` of the
    rate the switches carry, rounded down like ``default_rates``, distinct, at least 1 Mbit/s."""
    out = []
    for share in GENERATOR_RUNGS:
        r = host_mbps * share
        r = math.floor(r) if r >= 10 else math.floor(r * 10) / 10
        if r >= 1 and r not in out:
            out.append(float(r))
    return out


def generator_ceiling(gen: dict[str, Any] | None, keep: float = GENERATOR_KEEP) -> tuple[float, str] | None:
    """The packets/s all sending host ports together may carry with the generators still keeping
    up (pure), and a line saying how it was found; None without a calibration. ``gen``: the budget's
    ``generators`` (``tools/bench/bench_generators.py``): per rung its host-port rate and the busbw
    fractions its repetitions reached. The median fraction against rate, linear between rungs,
    is followed up from the lowest rung until it first falls below ``keep`` times the lowest
    rung's; that rate (the highest rung when it never falls) over the frame size is the ceiling,
    scaled to the calibration's sending ports: a run with fewer sending ports gets more per port
    (the generators' cost is taken to be per packet)."""
    rungs = sorted(((float(r["host_mbps"]), statistics.median(r["fractions"]))
                    for r in (gen or {}).get("rungs", []) if r.get("fractions")), key=lambda x: x[0])
    if not rungs or not gen:
        return None
    floor = keep * rungs[0][1]
    rate = rungs[-1][0]
    for (r0, f0), (r1, f1) in itertools.pairwise(rungs):
        if f1 < floor:
            rate = r0 + (r1 - r0) * (f0 - floor) / (f0 - f1) if f0 > floor else r0
            break
    frame_bits = 8 * (int(gen["mtu"]) + ETH)
    pps = rate * 1e6 / frame_bits * int(gen["sending_ports"])
    return pps, (f"the generators keep up to {rate:.1f} Mbit/s per host port with {gen['sending_ports']} sending, "
                 f"MTU {gen['mtu']}: the {gen.get('cell', 'calibration')} cell keeps {keep:.0%} of the busbw "
                 f"fraction it reaches at {rungs[0][0]:g} Mbit/s ({rungs[0][1]:.3f}), measured "
                 f"{gen.get('measured_at', '?')}")


def max_frame(budget: dict[str, Any] | None, port_type: str) -> int | None:
    """The largest frame size this port type carried in the measurement (None: unmeasured)."""
    frames = ((budget or {}).get("ports", {}).get(port_type) or {}).get("frames", {})
    ok = [int(f) for f, row in frames.items() if row.get("pps") and statistics.median(row["pps"]) > 0]
    return max(ok) if ok else None


def pps_budget(budget: dict[str, Any] | None, cpus: int, frame: int, port_type: str = "system") -> tuple[float, str]:
    """(packets/s the fabric carries here at this frame size, where that figure comes from) (pure)."""
    measured = pps_at(budget, port_type, frame)
    if measured:
        when = budget.get("measured_at", "?") if budget else "?"
        return measured, f"measured {when} ({port_type}, {frame} B frames)"
    return float(PPS_PER_CORE * cpus), f"constant {PPS_PER_CORE}/core (nothing measured: hpnlab doctor --measure)"


def trim_bringups(samples: list[dict[str, Any]], keep: int = BRINGUP_KEEP,
                  per_size: int = BRINGUP_PER_SIZE) -> list[dict[str, Any]]:
    """The bring-up samples to keep (pure; newest last): the newest ``per_size`` of each node
    count, at most ``keep`` in all."""
    seen: dict[Any, int] = {}
    out = []
    for sample in reversed(samples):
        n = sample.get("nodes")
        if seen.get(n, 0) < per_size:
            seen[n] = seen.get(n, 0) + 1
            out.append(sample)
    return out[::-1][-keep:]


def record_bringup(nodes: int, up_s: float, path: Path | None = None, keep: int = BRINGUP_KEEP) -> None:
    """Add one bring-up sample (an emulation built, connected and verified in ``up_s``)."""
    path = path or budget_path()
    doc = load_budget(path) or {"version": 1, "ports": {}}
    sample = {"nodes": int(nodes), "up_s": round(float(up_s), 2),
              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    doc["bringup"] = trim_bringups([*doc.get("bringup", []), sample], keep)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def nodes_max(budget: dict[str, Any] | None, cpus: int, target_s: float = UP_TARGET_S) -> tuple[int, str]:
    """(nodes an emulation may have here, where that comes from) (pure). From the recorded
    bring-ups of at least 16 nodes: a straight line through seconds against nodes (with one
    size recorded: seconds per node), read at ``target_s``, but never beyond ``NODES_EXTRAPOLATE``
    times the largest run that came up within it (verifying every pair grows faster than the
    nodes), nor below half the fallback constant."""
    samples = [s for s in (budget or {}).get("bringup", []) if s.get("nodes", 0) >= 16 and s.get("up_s", 0) > 0]
    fallback = NODES_PER_CORE * cpus
    if not samples:
        return fallback, f"constant {NODES_PER_CORE}/core (no bring-up recorded yet)"
    xs = [float(s["nodes"]) for s in samples]
    ys = [float(s["up_s"]) for s in samples]
    slope = 0.0
    if len(set(xs)) > 1:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    if slope > 0:
        fixed = my - slope * mx
        n_fit = (target_s - fixed) / slope
        how = f"{fixed:.1f} s + {slope:.3f} s per node"
    else:
        per_node = max(y / x for x, y in zip(xs, ys, strict=True))
        n_fit = target_s / per_node
        how = f"{per_node:.2f} s per node"
    came_up = [x for x, y in zip(xs, ys, strict=True) if y <= target_s]
    cap = int(NODES_EXTRAPOLATE * max(came_up)) if came_up else fallback // 2
    n = max(fallback // 2, min(int(n_fit), cap))
    return n, (f"up within {target_s:g} s at {how} from {len(samples)} recorded bring-ups, at most "
               f"{NODES_EXTRAPOLATE:g}x the largest that came up ({int(max(came_up)) if came_up else 0} nodes)")


def default_rates(g: nx.MultiGraph, pps: float, sending_ports: int | None = None,
                  headroom: float = HEADROOM, mtu: int | None = None) -> dict[str, float]:
    """The emulated rates that use the budget (pure). ``pps`` is what a leaf-spine-leaf chain
    carries (every packet crossing every tier, as the budget was measured); ``sending_ports``
    host ports (default: all) sending at once at ``host_mbps`` use ``headroom`` of it. The
    other links keep their ratio to the host rate (``max_mbps`` raised with it). ``mtu``: the
    emulated MTU (default the scenario's)."""
    s = g.graph["scenario"]
    ports = sending_ports or host_ports(g)
    frame_bits = 8 * ((mtu or s.emulation.mtu) + ETH)
    host_mbps = round_rate(headroom * pps * frame_bits / max(1, ports) / 1e6)
    top = max(d["rate_gbps"] for _, _, d in g.edges(data=True))
    return {"host_mbps": host_mbps, "max_mbps": round(host_mbps * top / s.host_rate_gbps, 3)}


def round_rate(mbps: float) -> float:
    """A rate rounded down (two significant figures below 10 Mbit/s, whole ones above): never over a share."""
    step = 10.0 ** (math.floor(math.log10(mbps)) - 1) if 0 < mbps < 10 else 1.0
    return round(math.floor(mbps / step + 1e-9) * step, 6)


def host_ports(g: nx.MultiGraph) -> int:
    return sum(1 for _, _, d in g.edges(data=True) if d["kind"] == "host")


def estimate(g: nx.MultiGraph, cpus: int, budget: dict[str, Any] | None = None,
             port_type: str = "system") -> dict[str, Any]:
    """What an emulation of this graph costs here, and whether it fits. ``budget``: the
    measured budget (``load_budget()``; None: the fallback constants)."""
    scenario = g.graph["scenario"]
    hosts = len(fgraph.hosts(g))
    switches = len(fgraph.switches(g))
    links = g.number_of_edges()
    host_links = sum(1 for _, _, d in g.edges(data=True) if d["kind"] == "host")
    frame_bits = 8 * (scenario.emulation.mtu + ETH)
    # every host port sending at its emulated rate; each packet crosses at least one switch
    pps_one_hop = host_links * scenario.emulation.host_mbps * 1e6 / frame_bits
    pps, pps_source = pps_budget(budget, cpus, scenario.emulation.mtu + ETH, port_type)
    if budget is not None and pps_source.startswith("measured"):
        # measured through a chain of `hops` switches: that many switch hops per delivered packet
        # were forwarded, and a packet entering the fabric costs at least one
        pps *= int(budget.get("hops", 1))
    nmax, nodes_source = nodes_max(budget, cpus)
    return {"hosts": hosts, "switches": switches, "links": links, "host_ports": host_links,
            "interfaces": 2 * links, "nodes": hosts + switches, "nodes_max": nmax, "nodes_max_source": nodes_source,
            "pps_full_load_per_hop": round(pps_one_hop), "pps_budget": round(pps), "pps_budget_source": pps_source,
            "fits": hosts + switches <= nmax and pps_one_hop <= pps}


def check_fits(g: nx.MultiGraph, cpus: int, budget: dict[str, Any] | None = None) -> dict[str, Any]:
    """The estimate, or a one-line UserError saying which limit the scenario passes and by how much."""
    est = estimate(g, cpus, budget)
    name = g.graph["scenario"].name
    if est["nodes"] > est["nodes_max"]:
        raise UserError(
            f"scenario {name!r} is too large for this machine: {est['hosts']} hosts + "
            f"{est['switches']} switches = {est['nodes']} nodes, {est['links']} links; this {cpus}-core "
            f"machine takes at most {est['nodes_max']} nodes ({est['nodes_max_source']}; "
            f"pick a mini-/small- preset or fewer hosts)")
    if est["pps_full_load_per_hop"] > est["pps_budget"]:
        raise UserError(
            f"scenario {name!r} is too fast for this machine: {est['host_ports']} host "
            f"ports at {g.graph['scenario'].emulation.host_mbps:g} Mbit/s need "
            f"{est['pps_full_load_per_hop']} packets/s per switch hop, above the ~{est['pps_budget']} packets/s "
            f"userspace OVS forwards on {cpus} cores ({est['pps_budget_source']}; "
            f"lower emulation.host_mbps or raise emulation.mtu)")
    return est


def has_loops(g: nx.MultiGraph) -> bool:
    """Whether the switches form a cycle (parallel links count): standalone OVS would flood forever."""
    sw = g.subgraph(fgraph.switches(g))
    simple = nx.Graph(sw)
    parallel = any(len(d) > 1 for _, nbrs in sw.adj.items() for d in nbrs.values())
    return parallel or simple.number_of_edges() >= simple.number_of_nodes() - nx.number_connected_components(simple) + 1


#: RoCE's usual payload MTU: the emulated MTU a run takes when the budget carries more bytes with it
ROCE_MTU = 4096


def rates_for_ranks(g: nx.MultiGraph, overrides: dict[str, Any], ranks: int) -> tuple[dict[str, Any], str]:
    """``run_rates`` for a run of ``ranks`` ranks in all (a rank: one host's ports), from this
    machine's measured budget (``load_budget``) and CPU count: what `hpnlab run` and the demo use."""
    sending = ranks * host_ports(g) // max(1, len(fgraph.hosts(g)))
    return run_rates(g, overrides, load_budget(), os.cpu_count() or 1, sending)


def rates_as_set(host_mbps: float, mtu: int, mtu_given: bool, budget: dict[str, Any] | None,
                 gen: tuple[float, str] | None, ports: int) -> tuple[dict[str, Any], str]:
    """A rate the user set (pure): kept, at ``ROCE_MTU`` where the budget measured frames that large
    and the user set no MTU (the MTU the budget's own rates take: the same rate in fewer packets;
    at 1500 B, 8 Mbit/s per host port is as many packets as 22 at 4096, past this machine's
    generators on 2026-12-03, where a routing comparison measured the ranks' CPU), and a line that
    says so, and warns when the rate's packets/s per sending port are more than the generators'
    ceiling (``generator_ceiling``) allows."""
    out: dict[str, Any] = {}
    if not mtu_given and mtu < ROCE_MTU and (max_frame(budget, "system") or 0) >= ROCE_MTU + ETH:
        mtu = ROCE_MTU
        out = {"emulation": {"mtu": mtu}}
    line = f"rates as set: host ports {host_mbps:g} Mbit/s at MTU {mtu}"
    if gen is not None:
        frame_bits = 8 * (mtu + ETH)
        ceiling = gen[0] / max(1, ports) * frame_bits / 1e6
        if host_mbps > ceiling:
            line += (f"; WARNING: above the {ceiling:.1f} Mbit/s per host port at MTU {mtu} that this machine's "
                     f"generators keep up with for {ports} sending ports, so the ranks' CPU, not the fabric, "
                     f"may set the busbw ({gen[1]})")
    return out, line


def run_rates(g: nx.MultiGraph, overrides: dict[str, Any], budget: dict[str, Any] | None,
              cpus: int, sending_ports: int | None = None) -> tuple[dict[str, Any], str]:
    """The emulation overrides that give a run the rates the measured budget carries for its
    ``sending_ports`` host ports (``default_rates``), and a line saying where they come from
    (pure). The MTU is the scenario's, or ``ROCE_MTU`` where the measured budget carries a higher
    rate with it. A rate the user set (``emulation.host_mbps``/``max_mbps``) is kept
    (``rates_as_set``: its MTU may still rise to ``ROCE_MTU``), and so are the preset's rates when
    nothing was measured; an MTU the user set is kept."""
    emu = g.graph["scenario"].emulation
    given = overrides.get("emulation", {})
    ports = sending_ports or host_ports(g)
    gen = generator_ceiling((budget or {}).get("generators"))
    if "host_mbps" in given or "max_mbps" in given:
        return rates_as_set(emu.host_mbps, emu.mtu, "mtu" in given, budget, gen, ports)
    options = []
    for mtu in [emu.mtu] + ([ROCE_MTU] if "mtu" not in given and emu.mtu < ROCE_MTU else []):
        pps, source = pps_budget(budget, cpus, mtu + ETH)
        if not source.startswith("measured") or (mtu != emu.mtu and (max_frame(budget, "system") or 0) < mtu + ETH):
            continue                  # the RoCE MTU only where frames that large were measured
        usable = HEADROOM * pps
        bound = (f"{ports} host ports sending at once use {HEADROOM:.0%} of the {pps:,.0f} packets/s a "
                 f"leaf-spine-leaf path carries at {mtu + ETH} B frames, {source}")
        if gen is not None and gen[0] < usable:
            usable, bound = gen[0], (f"{gen[1]}; below the switches' share: {HEADROOM:.0%} of the {pps:,.0f} "
                                     f"packets/s they carry at {mtu + ETH} B frames, {source}")
        if gen is None and (budget or {}).get("probe"):
            usable *= PROBE_SHARE
            bound = (f"{PROBE_SHARE:.0%} of the switches' share, as the generators' ceiling is unmeasured: {bound}, "
                     f"by the short probe; hpnlab doctor --measure measures both")
        options.append((default_rates(g, usable, ports, headroom=1.0, mtu=mtu), mtu, bound))
    if not options:
        return {}, (f"rates of the preset: host ports {emu.host_mbps:g} Mbit/s "
                    f"(nothing measured: hpnlab doctor --measure)")
    rates, mtu, bound = max(options, key=lambda o: (o[0]["host_mbps"], -o[1]))
    out: dict[str, Any] = dict(rates)
    if mtu != emu.mtu:
        out["mtu"] = mtu
    if gen is None and not (budget or {}).get("probe"):
        bound += "; the generators' ceiling was not measured (hpnlab doctor --measure)"
    return ({"emulation": out}, f"rates from the measured budget: host ports {rates['host_mbps']:g} Mbit/s at MTU "
            f"{mtu} ({bound})")
