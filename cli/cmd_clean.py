"""`hpnlab clean`: remove what hpnlab emulations left behind, and only that."""
from __future__ import annotations

import os

from hpnlab.fabric.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("clean", help="remove bridges, links, processes, BPF pins left by dead hpnlab runs (root), "
                                         "here and on the cluster servers a run used")
    p.add_argument("--force", action="store_true",
                   help="also tear down runs whose owner process is still alive")
    p.set_defaults(func=cmd_clean)


def cmd_clean(args) -> int:
    if os.geteuid() != 0:
        raise UserError("hpnlab clean needs root: run it with sudo")
    from hpnlab.fabric.emulation.cleanup import clean

    summary = clean(force=args.force, log=lambda m: print(f"hpnlab: {m}"))
    for run in summary["alive"]:
        print(f"run {run['run_id']} ({run['scenario']}) is still running as pid {run['pid']}: left alone "
              f"(stop it, or use --force)")
    removed = {k: v for k, v in summary["removed"].items() if v}
    if summary["runs"] or removed:
        # remote_* counts: what a run had made on its cluster servers (hpnlab.fabric.emulation.remote)
        what = ", ".join(f"{v} {k[len('remote_'):]} on other servers" if k.startswith("remote_") else f"{v} {k}"
                         for k, v in removed.items()) or "nothing left on the machine"
        print(f"cleaned {len(summary['runs'])} run(s): {what}")
    else:
        print("nothing to clean")
    return 0
