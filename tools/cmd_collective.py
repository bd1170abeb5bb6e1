"""`hpnlab collective`: run a collective on hosts given by address and report like nccl-tests.

The same tool measures an emulated fabric (``hpnlab run`` uses it) and a real cluster's IP
fabric: give one address per rank (``A+B`` for a rank with one port per plane), ranks on
this machine are started locally, others over ssh (``--launcher ssh``).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from hpnlab.fabric import collectives as col
from hpnlab.fabric import ranks, report
from hpnlab.fabric.errors import UserError


def parse_rate_bps(text: str) -> float:
    """'20M', '25G', '100m', '2e7' -> bit/s (K/M/G are powers of 1000 for rates)."""
    t = str(text).strip().lower().removesuffix("bit/s").removesuffix("bps")
    mult = {"k": 1e3, "m": 1e6, "g": 1e9}.get(t[-1:], 1.0)
    num = t[:-1] if mult != 1.0 else t
    try:
        value = float(num) * mult
    except ValueError:
        raise UserError(f"not a rate: {text!r} (examples: 20M, 25G)") from None
    if value <= 0:
        raise UserError(f"a rate must be positive: {text!r}")
    return value


def parse_hosts(text: str) -> list[list[str]]:
    """'10.0.0.1,10.0.0.2' or '10.0.0.1+10.128.0.1,...' -> per rank its addresses."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        out.append([a.strip() for a in item.split("+") if a.strip()])
    if not out:
        raise UserError("--hosts needs at least two addresses, e.g. --hosts 127.0.0.2,127.0.0.3")
    return out


def add_generator_args(p, *, hosts: bool = True) -> None:
    """The flags `hpnlab collective` and `hpnlab run` share (nccl-tests' where they exist)."""
    p.add_argument("-b", "--minbytes", default="64K", help="smallest size (default 64K)")
    p.add_argument("-e", "--maxbytes", default="1M", help="largest size (default 1M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="multiply size by this (default 2)")
    p.add_argument("-i", "--stepbytes", default="0", help="add this to the size instead of -f")
    p.add_argument("-n", "--iters", type=int, default=5, help="timed iterations per size (default 5)")
    p.add_argument("-w", "--warmup_iters", type=int, default=1, help="warm-up iterations (default 1)")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                   help="check every element of every result (default 1)")
    p.add_argument("--no-inplace", action="store_true", help="skip the in-place columns (halves the run)")
    p.add_argument("-r", "--root", type=int, default=0, help="root of broadcast/incast (default 0)")
    p.add_argument("--perm", default="shift", help="permutation: shift (r -> r+n/2, default) or random")
    p.add_argument("--seed", type=int, default=0, help="data pattern and random permutation seed")
    p.add_argument("--transport", default="roce", choices=("roce", "tcp"),
                   help="roce (userspace RoCEv2-like UDP, default) or tcp (kernel TCP)")
    p.add_argument("--entropy", default="flow", choices=("flow", "spray", "adaptive"),
                   help="roce: flow (one path per flow, ECMP baseline) or spray (per packet)")
    p.add_argument("--recovery", default="selective", choices=("selective", "gobackn"),
                   help="roce loss recovery (default selective)")
    p.add_argument("--no-dcqcn", action="store_true", help="roce: no DCQCN rate control (ignore CNPs)")
    p.add_argument("--ports-per-nic", type=int, default=8, help="roce spray: UDP source ports per NIC port")
    p.add_argument("--pace", type=float, default=1.0,
                   help="roce: each NIC port sends at this fraction of line rate (default 1.0)")
    p.add_argument("--window", type=int, default=64, help="roce: packets in flight per flow (default 64)")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds of silence before a rank is declared lost")
    p.add_argument("--port", type=int, default=0, help="base port (rank r uses base+r; roce 4791, tcp 29500)")
    p.add_argument("--out", metavar="DIR", help="results directory (JSON and PNG plots; default results/...)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    if hosts:
        p.add_argument("--hosts", action="append", required=True, metavar="A,B,...",
                       help="rank addresses in rank order; A+B gives a rank one address per plane; "
                            "repeat --hosts to run concurrent jobs on disjoint hosts")
        p.add_argument("--line-rate", default="20M",
                       help="rate of one NIC port: roce paces to it and busbw is compared with it "
                            "(default 20M)")
        p.add_argument("--mtu", type=int, default=1500, help="path MTU (default 1500)")
        p.add_argument("--launcher", default="auto", choices=("auto", "local", "ssh"),
                       help="start ranks here (local) or over ssh; auto: local if every address is here")
        p.add_argument("--remote-python", default="python3", help="python with hpnlab on ssh hosts")


def jobs_from_args(args, addrs_per_job: list[list[list[str]]], line_rate_bps: float, mtu: int,
                   labels: list[list[str]] | None = None) -> list[ranks.Job]:
    name = col.canonical(args.collective)
    if args.transport == "roce" and args.entropy == "adaptive":
        raise UserError("entropy 'adaptive' is a hook for the adaptive-routing work and has no policy "
                        "yet; use --entropy flow or spray")
    lo, hi = col.parse_size(args.minbytes), col.parse_size(args.maxbytes)
    sizes = col.sweep(lo, hi, args.stepfactor, col.parse_size(args.stepbytes))
    opts = {}
    if args.transport == "roce":
        opts = {"recovery": args.recovery, "dcqcn": not args.no_dcqcn,
                "ports_per_nic": args.ports_per_nic, "window_pkts": args.window, "pace": args.pace}
    jobs = []
    for j, addrs in enumerate(addrs_per_job):
        n = len(addrs)
        perm = None
        if name == "permutation":
            if args.perm == "random":
                perm = list(col.random_perm(n, args.seed))
            elif args.perm != "shift":
                raise UserError(f"--perm must be shift or random, got {args.perm!r}")
        for size in sizes:
            if col.fit_count(name, n, size) < max(1, n if name != "permutation" else 1):
                raise UserError(f"size {size} B is too small for {name} over {n} ranks "
                                f"(at least {n * col.ELEM_BYTES} B; raise -b)")
        jobs.append(ranks.Job(
            collective=name, addrs=addrs, sizes=sizes, iters=args.iters, warmup=args.warmup_iters,
            check=bool(args.check), inplace=not args.no_inplace, transport=args.transport,
            entropy=args.entropy, line_rate_bps=line_rate_bps, mtu=mtu,
            base_port=(args.port + 100 * j) if args.port else 0, root=args.root, perm=perm,
            seed=args.seed, timeout_s=args.timeout, options=opts, job=j,
            labels=labels[j] if labels else None))
    if not args.port and len(jobs) > 1:
        base = 4791 if args.transport == "roce" else 29500
        for j, job in enumerate(jobs):
            job.base_port = base + 100 * j
    flat = [a for job in jobs for addrs in job.addrs for a in addrs]
    if len(jobs) > 1 and len(set(flat)) != len(flat):
        raise UserError("concurrent jobs must use disjoint addresses")
    return jobs


def present(results: list[dict], out_dir: Path, meta: dict, say=print) -> Path:
    """Print the tables, write results.json and the plots; return the JSON path."""
    for r in results:
        say(report.format_table(r))
        say("")
    if len(results) > 1 or results:
        say(report.format_comparison(results))
    doc = {"meta": meta, "results": results}
    path = report.write_json(doc, out_dir / "results.json")
    plots = [report.plot_busbw(results, out_dir / "busbw.png")]
    for r in results:
        tag = "-".join(str(x) for x in (r["collective"], r["transport"], r.get("entropy")) if x)
        plots.append(report.plot_flow_rates(r, out_dir / f"flows-{tag}-job{r.get('job', 0)}.png"))
    say(f"results: {path}  plots: {', '.join(str(p) for p in plots)}")
    return path


def default_out(kind: str) -> Path:
    return Path("results") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


def kernel_caps() -> dict:
    try:
        from hpnlab.fabric import kernel
        return kernel.probe(deep=False).as_dict()
    except Exception as exc:   # the probe is informational here; say why it is missing
        return {"error": f"{type(exc).__name__}: {exc}"}


def register(sub) -> None:
    p = sub.add_parser("collective", help="run a collective on hosts given by address (nccl-tests-like report)",
                       description=__doc__)
    p.add_argument("collective", metavar="COLLECTIVE",
                   help=f"one of {', '.join(col.COLLECTIVES)}")
    add_generator_args(p)
    p.set_defaults(func=cmd_collective)


def cmd_collective(args) -> int:
    name = col.canonical(args.collective)
    args.collective = name
    addrs_per_job = [parse_hosts(h) for h in args.hosts]
    line = parse_rate_bps(args.line_rate)
    jobs = jobs_from_args(args, addrs_per_job, line, args.mtu)
    here = ranks.local_addresses()
    every_local = all(ranks.is_local(a, here) for job in jobs for ad in job.addrs for a in ad)
    launcher = args.launcher
    if launcher == "auto":
        launcher = "local" if every_local else "ssh"
        if launcher == "ssh":
            raise UserError("some addresses are not on this machine; pass --launcher ssh to start "
                            "those ranks over ssh (hpnlab must be installed there)")
    spawner = ranks.LocalSpawner() if launcher == "local" else ranks.SshSpawner(args.remote_python)
    results = ranks.run_jobs(jobs, spawner, progress=not args.quiet)
    meta = {"command": " ".join(sys.argv), "launcher": launcher, "kernel": kernel_caps(),
            "scenario": None, "hosts": [job.addrs for job in jobs], "time": time.time(),
            "uname": " ".join(os.uname())}
    present(results, Path(args.out) if args.out else default_out("collective"), meta)
    bad = sum((row[m] or {}).get("wrong") or 0 for r in results for row in r["rows"] for m in ("oop", "ip"))
    return 1 if bad else 0
