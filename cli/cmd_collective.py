"""`hpnlab collective`: run a collective on hosts given by address and report like nccl-tests.

The same tool measures an emulated fabric (``hpnlab run`` uses it) and a real cluster's IP
fabric: give one address per rank (``A+B`` for a rank with one port per plane), ranks on
this machine are started locally, others over ssh (``--launcher ssh``).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpnlab.cli.argtypes import output_dir
from hpnlab.fabric.errors import UserError, short
from hpnlab.fabric.experiments import runner as experiment
from hpnlab.fabric.transport import ENTROPIES, TRANSPORTS
from hpnlab.fabric.workload import collectives as col
from hpnlab.fabric.workload import report


def parse_rate_bps(text: str) -> float:
    """'20M', '25G', '100m', '2e7' -> bit/s (K/M/G are powers of 1000 for rates)."""
    t = str(text).strip().lower().removesuffix("bit/s").removesuffix("bps")
    mult = {"k": 1e3, "m": 1e6, "g": 1e9}.get(t[-1:], 1.0)
    num = t[:-1] if mult != 1.0 else t
    try:
        value = float(num) * mult
    except ValueError:
        raise UserError(f"not a rate: {short(text)} (examples: 20M, 25G)") from None
    if not math.isfinite(value):
        raise UserError(f"not a rate: {short(text)} (examples: 20M, 25G)")
    if value <= 0:
        raise UserError(f"a rate must be positive: {short(text)}")
    return value


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (a bad one is a one-line usage error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {short(text)}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:,} to {high:,}, got {short(value)}")
        return value
    return parse


def number_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number from ``low`` to ``high``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {short(text)}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"must be a number from {low:g} to {high:g}, got {short(text)}")
        return value
    return parse


def parse_hosts(text: str) -> list[list[str]]:
    """'10.0.0.1,10.0.0.2' or '10.0.0.1+10.128.0.1,...' -> per rank its addresses."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if item:
            out.append([a.strip() for a in item.split("+") if a.strip()])
    if not out:
        raise UserError("--hosts needs at least two addresses, e.g. --hosts 127.0.0.2,127.0.0.3")
    return out


def add_generator_args(p: argparse.ArgumentParser, *, hosts: bool = True) -> None:
    """The flags `hpnlab collective` and `hpnlab run` share (nccl-tests' where they exist)."""
    p.add_argument("-b", "--minbytes", default="64K", help="smallest size (default 64K)")
    p.add_argument("-e", "--maxbytes", default="1M", help="largest size (default 1M)")
    p.add_argument("-f", "--stepfactor", type=number_in(1.0, 1e6), default=2.0,
                   help="multiply size by this (default 2)")
    p.add_argument("-i", "--stepbytes", default="0", help="add this to the size instead of -f")
    p.add_argument("-n", "--iters", type=int_in(1, 1_000_000), default=5, help="timed iterations per size (default 5)")
    p.add_argument("-w", "--warmup_iters", type=int_in(0, 1_000_000), default=1, help="warm-up iterations (default 1)")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                   help="check every element of every result (default 1)")
    p.add_argument("--no-inplace", action="store_true", help="skip the in-place columns (halves the run)")
    p.add_argument("-r", "--root", type=int_in(0, 1_000_000), default=0, help="root of broadcast/incast (default 0)")
    p.add_argument("--perm", default="shift", help="permutation: shift (r -> r+n/2, default) or random")
    p.add_argument("--seed", type=int, default=0, help="data pattern and random permutation seed")
    p.add_argument("--transport", default="roce", choices=TRANSPORTS,
                   help="roce (userspace RoCEv2-like UDP, default) or tcp (kernel TCP)")
    p.add_argument("--entropy", default="flow", choices=ENTROPIES,
                   help="roce: flow (one path per flow, ECMP baseline), flowlet (a new path after an idle "
                        "gap), spray (per packet, oblivious) or adaptive (per packet, REPS-like feedback)")
    p.add_argument("--flowlet-gap-us", type=number_in(1.0, 10_000_000.0), default=None,
                   help="roce flowlet: idle gap (us) after which a flow takes a new path "
                        "(default: 4 packet times at line rate, at least 500)")
    p.add_argument("--recovery", default="selective", choices=experiment.RECOVERIES,
                   help="roce loss recovery (default selective)")
    p.add_argument("--no-dcqcn", action="store_true", help="roce: no DCQCN rate control (ignore CNPs)")
    p.add_argument("--ports-per-nic", type=int_in(1, 4096), default=8,
                   help="roce spray: UDP source ports per NIC port")
    p.add_argument("--pace", type=number_in(0.0, 1.0), default=1.0,
                   help="roce: each NIC port sends at this fraction of line rate (default 1.0)")
    p.add_argument("--window", type=int_in(1, 1_000_000), default=64,
                   help="roce: packets in flight per flow (default 64)")
    p.add_argument("--timeout", type=number_in(0.001, 86_400.0), default=15.0,
                   help="seconds of silence before a rank is declared lost")
    p.add_argument("--port", type=int_in(0, 65_535), default=0,
                   help="base port (rank r uses base+r; roce 4791, tcp 29500)")
    p.add_argument("--out", metavar="DIR", type=output_dir,
                   help="results directory (JSON and PNG plots; default results/...)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    if hosts:
        p.add_argument("--hosts", action="append", required=True, metavar="A,B,...",
                       help="rank addresses in rank order; A+B gives a rank one address per plane; "
                            "repeat --hosts to run concurrent jobs on disjoint hosts")
        p.add_argument("--line-rate", default="20M",
                       help="rate of one NIC port: roce paces to it and busbw is compared with it "
                            "(default 20M)")
        p.add_argument("--mtu", type=int_in(68, 65_535), default=1500, help="path MTU (default 1500)")
        p.add_argument("--launcher", default="auto", choices=("auto", "local", "ssh"),
                       help="start ranks here (local) or over ssh; auto: local if every address is here")
        p.add_argument("--remote-python", default="python3", help="python with hpnlab on ssh hosts")


def plan_from_args(args: argparse.Namespace, **placement) -> experiment.Plan:
    """The experiment the generator flags describe (``placement``: placement/ranks/jobs)."""
    return experiment.Plan(
        collectives=args.collective, transports=args.transport, entropies=args.entropy,
        sizes=experiment.sweep(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes),
        iterations=args.iters, warmup=args.warmup_iters, check=bool(args.check), inplace=not args.no_inplace,
        root=args.root, perm=args.perm, seed=args.seed, recovery=args.recovery, dcqcn=not args.no_dcqcn,
        ports_per_nic=args.ports_per_nic, window_pkts=args.window, pace=args.pace, timeout_s=args.timeout,
        base_port=args.port, flowlet_gap_us=args.flowlet_gap_us, **placement)


def default_out(kind: str) -> Path:
    return Path("results") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


def kernel_caps() -> dict:
    try:
        from hpnlab.fabric.emulation import kernel
        return kernel.probe(deep=False).as_dict()
    except Exception as exc:   # the probe is informational here; say why it is missing
        return {"error": f"{type(exc).__name__}: {exc}"}


def register(sub) -> None:
    p = sub.add_parser("collective", help="run a collective on hosts given by address (nccl-tests-like report)",
                       description=__doc__)
    p.add_argument("collective", metavar="COLLECTIVE", help=f"one of {', '.join(col.COLLECTIVES)}")
    add_generator_args(p)
    p.set_defaults(func=cmd_collective)


def cmd_collective(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    hosts = experiment.Hosts(tuple(parse_hosts(h) for h in args.hosts), parse_rate_bps(args.line_rate),
                             args.mtu, args.launcher, args.remote_python)
    doc = experiment.run(plan, hosts, progress=not args.quiet)
    doc["meta"].update(command=" ".join(sys.argv), kernel=kernel_caps(), scenario=None, uname=" ".join(os.uname()))
    report.save(doc, Path(args.out) if args.out else default_out("collective"))
    return 1 if report.wrong_total(doc["results"]) else 0
