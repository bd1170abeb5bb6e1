#!/usr/bin/env python3
"""The same commands on two revisions of hpnlab, interleaved in one run, their outputs compared.

    tools/scripts/side_by_side.py BASE [--repeat N] [--only NAME ...] [--out FILE]

BASE (a git revision of this checkout, e.g. the commit before a refactoring) is checked out in a
worktree of its own with a venv of its own (under $HPNLAB_SIDE_BY_SIDE, default
/var/tmp/hpnlab-side-by-side; kept for the next run), then every case below runs on BASE and on
this checkout, one after the other, ``--repeat`` times. A case's figures are the numbers in its
output: timings differ from run to run, so each case names the lines whose figures must be equal
(``exact``) and the rest is shown side by side with the ratio of the medians. Exit code 1 when an
exact line differs. Benchmarks are found where each revision keeps them (``tools/bench/`` now,
``tools/`` before the layers change).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
EXTRAS = "emulation,controller,report,test"
NUMBER = re.compile(r"-?\d[\d,]*\.?\d*(?:e[-+]?\d+)?")


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]            # {python} {hpnlab} {bench:NAME} are replaced per checkout
    exact: str = ""                  # regex: lines whose numbers must be equal on both
    timing: str = ""                 # regex: lines whose numbers are timings (compared as ratios)
    timeout_s: float = 900


CASES = (
    Case("topo inspect mini-hpn", ("{hpnlab}", "topo", "inspect", "mini-hpn"), exact=r"."),
    Case("topo inspect hpn-130k", ("{hpnlab}", "topo", "inspect", "hpn-130k"), exact=r"."),
    Case("topo plan alibaba-hpn", ("{hpnlab}", "topo", "plan", "alibaba-hpn"), exact=r"."),
    Case("check mini-cross-campus", ("{hpnlab}", "check", "mini-cross-campus"), exact=r"^(?!.*\d+\.\d+ s)"),
    Case("controller show p0l0", ("{hpnlab}", "controller", "mini-hpn", "--show", "p0l0"), exact=r"."),
    Case("model alibaba-hpn all-reduce", ("{hpnlab}", "model", "alibaba-hpn", "-c", "all_reduce", "-b", "64M",
                                          "--hosts", "64"), exact=r"busbw|GB/s|\bus\b"),
    Case("bench_topo", ("{python}", "{bench:bench_topo}"), timing=r"\bs\b"),
    Case("bench_compiler", ("{python}", "{bench:bench_compiler}"), exact=r"flows|groups", timing=r"\bs\b"),
    Case("bench_proofs small", ("{python}", "{bench:bench_proofs}", "mini-hpn", "mini-rail", "small-hpn",
                                "fat-tree"), exact=r"delivered|tolerated|classes"),
)


def run(cmd: list[str], cwd: Path, timeout_s: float) -> tuple[str, float, int]:
    t = time.monotonic()
    env = dict(os.environ, PYTHONPATH=f"{cwd / 'tools' / 'bench'}:{cwd / 'tools' / 'probes'}:{cwd / 'tools'}")
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, env=env)
        return r.stdout + r.stderr, time.monotonic() - t, r.returncode
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:.0f} s", time.monotonic() - t, -1


def checkout(rev: str, say) -> Path:
    """A worktree of ``rev`` with its own venv (made once, then reused)."""
    base = Path(os.environ.get("HPNLAB_SIDE_BY_SIDE", "/var/tmp/hpnlab-side-by-side"))
    sha = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short=12", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    tree = base / sha
    if not (tree / ".venv" / ".ready").exists():
        base.mkdir(parents=True, exist_ok=True)
        if not tree.exists():
            subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", "-f", str(tree), sha], check=True,
                           capture_output=True)
        say(f"making the venv of {sha} in {tree} (once)")
        subprocess.run([sys.executable, "-m", "venv", str(tree / ".venv")], check=True)
        pip = [str(tree / ".venv" / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run(pip + ["--upgrade", "pip", "setuptools", "wheel"], check=True)
        subprocess.run(pip + ["-e", f"{tree}[{EXTRAS}]"], check=True)
        (tree / ".venv" / ".ready").write_text(sha)
    return tree


def argv_for(case: Case, tree: Path) -> list[str]:
    out = []
    for a in case.argv:
        if a == "{python}":
            out.append(str(tree / ".venv" / "bin" / "python"))
        elif a == "{hpnlab}":
            out.append(str(tree / ".venv" / "bin" / "hpnlab"))
        elif a.startswith("{bench:"):
            name = a[7:-1]
            found = [p for p in (tree / "tools" / "bench" / f"{name}.py", tree / "tools" / f"{name}.py") if p.exists()]
            out.append(str(found[0]) if found else f"(no {name} in {tree})")
        else:
            out.append(a)
    return out


def numbers(text: str, pattern: str) -> list[str]:
    """The lines matching ``pattern`` that hold numbers, without their examples (a proof's "e.g."
    names an arbitrary failing pair, which differs from run to run on either revision)."""
    if not pattern:
        return []
    rx = re.compile(pattern)
    lines = [line.split("e.g.")[0].strip() for line in text.splitlines()]
    return [line for line in lines if rx.search(line) and NUMBER.search(line)]


def figures(lines: list[str]) -> list[list[str]]:
    """Only the numbers of each line: a path or a module's name in the text may move."""
    return [NUMBER.findall(line) for line in lines]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", help="the git revision to compare with (e.g. the commit before a refactoring)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", action="append", default=[], help="run only the cases whose name starts so")
    ap.add_argument("--out", metavar="FILE", help="write every output and figure as JSON")
    args = ap.parse_args(argv)
    say = lambda m: print(m, flush=True)  # noqa: E731
    base = checkout(args.base, say)
    head = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    say(f"side by side: {base.name} (base) and {head} (this checkout, {HERE}); load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores, {args.repeat} repetition(s)")
    cases = [c for c in CASES if not args.only or any(c.name.startswith(o) for o in args.only)]
    record, bad = [], 0
    for case in cases:
        runs: dict[str, list[tuple[str, float, int]]] = {"base": [], "head": []}
        for _ in range(args.repeat):
            for side, tree in (("base", base), ("head", HERE)):
                runs[side].append(run(argv_for(case, tree), tree, case.timeout_s))
        b_out, h_out = runs["base"][0][0], runs["head"][0][0]
        b_exact, h_exact = numbers(b_out, case.exact), numbers(h_out, case.exact)
        same = figures(b_exact) == figures(h_exact)
        bad += not same
        walls = {s: statistics.median(r[1] for r in rs) for s, rs in runs.items()}
        rcs = {s: [r[2] for r in rs] for s, rs in runs.items()}
        say(f"== {case.name}: exit {rcs['base']} / {rcs['head']}; wall {walls['base']:.1f} s / {walls['head']:.1f} s "
            f"(head/base {walls['head'] / max(walls['base'], 1e-9):.2f}); "
            + (f"{len(h_exact)} exact lines {'the same' if same else 'DIFFER'}" if case.exact else "no exact lines"))
        if not same:
            for b, h in zip(b_exact, h_exact, strict=False):
                if figures([b]) != figures([h]):
                    say(f"   base: {b}\n   head: {h}")
            if len(b_exact) != len(h_exact):
                say(f"   {len(b_exact)} lines on base, {len(h_exact)} on head")
        for b, h in zip(numbers(b_out, case.timing), numbers(h_out, case.timing), strict=False):
            say(f"   base: {b}\n   head: {h}")
        record.append({"case": case.name, "argv": list(case.argv), "exact_same": same, "wall_s": walls,
                       "exit": rcs, "base_output": b_out, "head_output": h_out})
    say(f"{len(cases) - bad} of {len(cases)} cases with the same exact figures")
    if args.out:
        Path(args.out).write_text(json.dumps({"base": base.name, "head": head, "load": os.getloadavg(),
                                              "cases": record}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
