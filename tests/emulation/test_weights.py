"""Weighted mode on the emulated mini-hpn (real OVS, the controller polling port statistics):
a loaded leaf uplink gets a smaller share of a spread traffic, measured on the switches' port
counters.

One emulation, controller in weighted mode. Spread traffic: h1 (leaf p0l0) sends 16 UDP flows
to h5 (leaf p0l1) whose source ports cover each of the leaf's 8 entropy patterns twice; its
share on each uplink of p0l0 is what the spines send down to p0l1 (nothing else goes there).
Phase 1, nothing else runs: the weights stay equal and weighted mode's tables send every
source port where ecmp mode's do (tests/unit/test_weights.py proves that on the tables), so this is
the ecmp share. Phase 2: h2 and h3 send UDP elephants to h9 (leaf p0l2) on the source port of
the lowest pattern the uplink to p0s0 has: a port that loses patterns gives up its highest ones
first (``weights.reassign``), so the elephants stay on that uplink and keep it loaded. The
spread traffic's share on that uplink must fall, to what the weights in force say."""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from hpnlab.fabric.experiments.compare_routing import read_tx_bytes
from hpnlab.fabric.scenario import graph as fgraph

pytestmark = [pytest.mark.emulation, pytest.mark.controller]

LEAF, LOADED, OTHER, DOWN = "p0l0", "p0s0", "p0s1", "p0l1"
SPREAD_BASE = 40000          # a multiple of 8: flow i has pattern i % 8
SETTLE_S, MEASURE_S = 3.0, 4.0


def port_to(g, a: str, b: str) -> int:
    return next(d["ports"][a] for _u, _v, d in g.edges(a, data=True) if b in d["ports"])


def sender(emu, src: str, dst: str, *, flows: int, sport_base: int, mbps: float, seconds: float):
    pps = mbps * 1e6 / 8 / 1000
    return emu.popen(src, [sys.executable, "-m", "hpnlab.fabric.emulation.udp", "flows", emu.ip(dst), "9000",
                           "--flows", str(flows), "--pps", f"{pps:g}", "--seconds", f"{seconds:g}",
                           "--src", emu.ip(src), "--sport-base", str(sport_base), "--size", "1000"])


def spread_share(emu, g, seconds: float, settle_s: float = 0.0, log: Path | None = None) -> tuple[float, list]:
    """The loaded uplink's share of h1 -> h5 over ``seconds`` after ``settle_s`` (from the spines' ports
    down to p0l1), and p0l0's weights in force when the measurement starts and when it ends."""
    intfs = [fgraph.intf_name(s, port_to(g, s, DOWN)) for s in (LOADED, OTHER)]
    p = sender(emu, "h1", "h5", flows=16, sport_base=SPREAD_BASE, mbps=4, seconds=settle_s + seconds)
    time.sleep(settle_s)
    weights = [weights_in_force(log, LEAF) if log else None]
    before = read_tx_bytes(intfs)
    time.sleep(seconds - 0.3)
    after = read_tx_bytes(intfs)
    weights.append(weights_in_force(log, LEAF) if log else None)
    p.communicate(timeout=settle_s + seconds + 10)
    loaded, other = (a - b for a, b in zip(after, before, strict=True))
    assert loaded + other > 0
    return loaded / (loaded + other), weights


def weights_in_force(log: Path, switch: str) -> dict[int, int] | None:
    """The last weights the controller logged for ``switch`` (port -> patterns), None: never changed."""
    last = None
    for line in log.read_text(errors="replace").splitlines():
        m = re.search(rf"weights {switch} set 0x[0-9a-f]+: .* -> ((?:\d+:\d+ ?)+) \(", line)
        if m:
            last = {int(p): int(n) for p, n in (x.split(":") for x in m.group(1).split())}
    return last


@pytest.fixture(scope="module")
def weighted_hpn(emulation_ready):
    from hpnlab.fabric.emulation import Emulation
    from hpnlab.fabric.emulation.options import ControllerOptions, EmulationOptions, SupervisionOptions

    with Emulation("mini-hpn", EmulationOptions(
        controller=ControllerOptions(routing_weights="weighted"),
        supervision=SupervisionOptions(lock_wait_s=300))) as emu:
        yield emu


def test_weighted_mode_gives_a_loaded_uplink_a_smaller_share_of_spread_traffic(weighted_hpn):
    emu, g = weighted_hpn, weighted_hpn.graph
    log = Path(emu.metadata["controller_log"])
    up = port_to(g, LEAF, LOADED)
    ecmp_share, _ = spread_share(emu, g, MEASURE_S)
    assert weights_in_force(log, LEAF) is None           # equal loads: nothing re-weighted
    # the elephants' source port: pattern 0, which the uplink to p0s0 holds in ecmp mode
    # (ports sorted, pattern i -> port i % 2) and keeps while it keeps a pattern
    assert up < port_to(g, LEAF, OTHER)
    started = time.time()
    elephants = [sender(emu, h, "h9", flows=1, sport_base=48000, mbps=7, seconds=SETTLE_S + MEASURE_S + 1)
                 for h in ("h2", "h3")]
    try:
        weighted_share, (first, last) = spread_share(emu, g, MEASURE_S, SETTLE_S, log)
    finally:
        for p in elephants:
            p.communicate(timeout=SETTLE_S + MEASURE_S + 15)
    changes = [line for line in log.read_text().splitlines() if f" weights {LEAF} " in line]
    print(f"loaded uplink's share of the spread traffic: ecmp {ecmp_share:.3f}, weighted {weighted_share:.3f}; "
          f"weights in force {first}, then {last}; elephants from {time.strftime('%H:%M:%S', time.localtime(started))}"
          f".{int(started % 1 * 1000):03d}", *changes, sep="\n")
    assert first is not None and last is not None
    shares = [c[up] / sum(c.values()) for c in (first, last)]
    assert max(shares) < 0.5
    assert weighted_share < ecmp_share
    # the counters follow the weights: the share is the loaded uplink's patterns (each carries 2 of the 16 flows)
    assert min(shares) - 0.05 <= weighted_share <= max(shares) + 0.05
