"""`hpnlab check` (design rules, exit 1 when one fails) and `hpnlab snapshot` (pure: no root).

    hpnlab check SCENARIO [--rules FILE] [--json FILE|-] [--junit FILE] [--against SNAPSHOT]
                          [--pairs] [--plane] [--local-protection] [--only RULE] [--skip RULE]
    hpnlab snapshot SCENARIO [-o FILE] [--rules FILE] [--skip RULE]

Exit codes of `check`: 0 every rule passed (and, with --against, nothing changed that a rule
cares about); 1 a rule failed or the snapshot differs; 2 bad input (one line).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hpnlab.cli.args import add_scenario_args, load_fabric
from hpnlab.cli.argtypes import output_file
from hpnlab.fabric.checks import rules as fcheck
from hpnlab.fabric.checks import snapshot as fsnap


def _json_target(text: str) -> str:
    return text if text == "-" else output_file(text)


def _add_rule_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rules", metavar="FILE", help="rules file (YAML): limits, rules on/off (README, 'Design checks')")
    p.add_argument("--only", action="append", metavar="RULE", help="run only this rule (repeatable)")
    p.add_argument("--skip", action="append", default=[], metavar="RULE",
                   help="skip this rule (repeatable), e.g. --skip failure-tolerance")
    p.add_argument("--pairs", action="store_true", help="failure tolerance: also every pair of links")
    p.add_argument("--plane", action="store_true", help="failure tolerance: also a whole plane")
    p.add_argument("--local-protection", action="store_true",
                   help="also prove local protection: every event on the healthy tables, every branch (opt-in: it "
                        "walks every branch; docs/guides/failover.md)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="run the design rules on a scenario; exit 1 when one fails",
                       description="Radix, port speeds, oversubscription, planes, route/flow budgets, "
                                   "path diversity, blast radius, long haul, failure tolerance.")
    add_scenario_args(p)
    _add_rule_args(p)
    p.add_argument("--json", metavar="FILE|-", type=_json_target, help="write the results as JSON ('-': stdout)")
    p.add_argument("--junit", metavar="FILE", type=output_file, help="write JUnit XML for CI systems")
    p.add_argument("--timings", action="store_true", help="also print each rule's time (on standard error)")
    p.add_argument("--against", metavar="SNAPSHOT",
                   help="compare with a snapshot ('hpnlab snapshot'); exit 1 when something changed")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("snapshot", help="write a diff-friendly summary of the compiled fabric (YAML or JSON)")
    add_scenario_args(p)
    _add_rule_args(p)
    p.add_argument("-o", "--output", type=output_file, metavar="FILE",
                   help="file to write (.json: JSON, else YAML; default: standard output as YAML)")
    p.set_defaults(func=cmd_snapshot)


def _prepare(args: argparse.Namespace) -> tuple[fcheck.CheckContext, fcheck.RulesConfig, list[str]]:
    """The context, the rules file and the rules to run (checked before the fabric is built)."""
    rules = fcheck.load_rules(args.rules)
    flags = {f for f in ("pairs", "plane") if getattr(args, f)} | (
        {"local-protection"} if getattr(args, "local_protection", False) else set())
    ran = fcheck.selected(rules, args.only, args.skip, opt_in=flags)
    scenario, g = load_fabric(args)
    return fcheck.CheckContext(scenario.name, scenario, g, {}, frozenset(flags)), rules, ran


def cmd_check(args: argparse.Namespace) -> int:
    old = fsnap.load(args.against) if args.against else None     # a bad snapshot fails before the work
    start = time.perf_counter()
    ctx, rules, ran = _prepare(args)
    timings: dict[str, float] = {}
    built = time.perf_counter() - start
    results = fcheck.run_checks(ctx, rules, only=ran, timings=timings)
    seconds = time.perf_counter() - start
    if args.timings:
        print(f"timings: build {built:.1f} s, " + ", ".join(f"{name} {t:.1f} s" for name, t in timings.items()),
              file=sys.stderr)
    counts = fcheck.summary(results)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(fcheck.render_table(results), file=out)
    print(f"{ctx.name}: {counts['passed']} passed, {counts['failed']} FAILED, {counts['not_available']} not "
          f"available ({counts['rules']} rules, {seconds:.1f} s)", file=out)
    changes: list[fsnap.Change] = []
    if old is not None:
        changes = fsnap.diff(old, fsnap.take(ctx, results, rules, ran))
        print(f"against {args.against}: " + ("no change" if not changes else f"{len(changes)} change(s)"), file=out)
        for change in changes:
            print(f"  {change.text}" + ("" if change.matters else " (informational)"), file=out)
    if args.json:
        text = json.dumps(fcheck.to_json(ctx.name, results) | {"seconds": round(seconds, 3),
                                                                "changes": [c.text for c in changes]},
                          indent=1) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            Path(args.json).write_text(text, encoding="utf-8")
    if args.junit:
        Path(args.junit).write_text(fcheck.to_junit(ctx.name, results, seconds), encoding="utf-8")
    return 1 if fcheck.failed(results) or any(c.matters for c in changes) else 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    ctx, rules, ran = _prepare(args)
    results = fcheck.run_checks(ctx, rules, only=ran)
    text = fsnap.dumps(fsnap.take(ctx, results, rules, ran), fsnap.format_for(args.output))
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output} ({len(text.splitlines()):,} lines)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
