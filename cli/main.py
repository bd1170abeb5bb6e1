"""The `hpnlab` command: one subcommand per module `cli/cmd_<name>.py`.

Each command module defines ``register(subparsers)``, which adds its parser and sets
``func`` (called with the parsed args, returns an exit code). A user's mistake (bad
scenario, missing privilege, missing kernel feature) is raised as ``UserError`` or
``ScenarioError`` and printed as one line, exit code 2; never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import NoReturn

from hpnlab.fabric.errors import UserError, one_line

# Order is the order `hpnlab --help` lists them in.
COMMANDS = ["topo", "check", "model", "fidelity", "doctor", "emulate", "clean", "controller", "run", "collective",
            "demo", "web", "completion", "switches"]


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad flag reported in one line (no usage block), exit code 2.

    ``add_subparsers`` makes every subcommand's parser of the same class, so this covers
    every command's flags.
    """

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("hpnlab").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"hpnlab: {one_line(f'{where}{message} (see {self.prog} --help)')}\n")


class VersionAction(argparse.Action):
    """``--version``: the release and the commit (``cli/version.py``), read only when asked (git costs ~5 ms)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from hpnlab.cli import version
        print(version.text())
        parser.exit(0)


def completing() -> bool:
    """True while a shell asks argcomplete for completions (it sets _ARGCOMPLETE)."""
    return "_ARGCOMPLETE" in os.environ


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``only`` (a command's own run needs no other module:
    importing all of them costs about a second at every start)."""
    parser = OneLineParser(
        prog="hpnlab",
        description="hpnlab: emulate and model the networks of AI training clusters.")
    parser.add_argument("--version", action=VersionAction, help="print the release and the commit, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in [only] if only in COMMANDS else COMMANDS:
        modname = f"hpnlab.cli.cmd_{name}"
        if importlib.util.find_spec(modname) is None:
            continue
        importlib.import_module(modname).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if completing():
        import argcomplete
        argcomplete.autocomplete(build_parser())     # every command's flags; exits after answering
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:  # includes ScenarioError
        print(f"hpnlab: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hpnlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
