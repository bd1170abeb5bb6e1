"""Running the reachability walks on the emulated hosts: the shell around ``reachability``
(which builds the scripts and parses what they print, purely). Each source host runs its
part in parallel, from a script file (``nodes.script``)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import nodes, reachability

PairT = tuple[str, str, str, str]


class WalkError(RuntimeError):
    """A walk's program did not start on a host."""


def communicate(proc: subprocess.Popen, timeout_s: float) -> str:
    """A process's stdout once it ended (killed after ``timeout_s``)."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return (out or b"").decode(errors="replace")


def ping(host_popen: Callable[..., subprocess.Popen], run_dir: Path, pairs: list[PairT], timeout_s: float = 2.0,
         count: int = 1, batch: int = reachability.PING_BATCH) -> dict[str, Any]:
    """Ping each pair from its source address; ``{"pairs": n, "failed": [pair, ...]}``."""
    by_src: dict[str, list[PairT]] = defaultdict(list)
    for pair in pairs:
        by_src[pair[0]].append(pair)
    wait = max(1, round(timeout_s))
    procs = [host_popen(src, nodes.script(run_dir / f"ping-{src}.sh",
                                          reachability.ping_lines(plist, count, wait, batch)))
             for src, plist in by_src.items()]
    ok: set[tuple[str, str]] = set()
    for proc in procs:
        ok |= reachability.parse_ping(communicate(proc, wait * count + 60))
    return {"pairs": len(pairs), "failed": reachability.failed_pairs(pairs, ok)}


def entropy_source_ports(switches: Iterable[str]) -> list[int]:
    """One UDP source port per entropy branch, from the patterns these switches match now
    (every table, read with ovs-ofctl: whichever tables split on the source port); one port when
    nothing spreads."""
    patterns: set[tuple[int, int]] = set()
    for sw in switches:
        r = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", sw],
                           capture_output=True, text=True)
        patterns |= reachability.entropy_patterns(r.stdout)
    return reachability.source_ports(patterns)


def branches(popen: Callable[..., subprocess.Popen], run_dir: Path, pairs: list[PairT], sports: list[int],
             listen: dict[str, list[str]], repeat: int = 3) -> dict[str, Any]:
    """UDP probes on every (pair, source port); ``reachability.branch_report`` of what arrived."""
    plans = reachability.probe_plan(pairs, sports, listen, repeat=repeat)
    procs = {}
    for host, plan in plans.items():
        path = run_dir / f"probe-{host}.json"
        path.write_text(json.dumps(plan))
        procs[host] = popen(host, [sys.executable, "-m", "hpnlab.fabric.emulation.udp", "probe", str(path)],
                            stdin=subprocess.PIPE)
    try:
        for host, proc in procs.items():
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != b"listening":
                raise WalkError(f"the probe on {host} did not start: {line.decode(errors='replace')[:200]}"
                                f"{communicate(proc, 5)[-300:]}")
        for proc in procs.values():   # every host listens before anyone sends
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        received: set[tuple[str, int, str]] = set()
        for host, proc in procs.items():
            received |= reachability.parse_probe(communicate(proc, reachability.probe_seconds(plans[host]) + 30))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return reachability.branch_report(pairs, sports, received)
