"""`hpnlab completion bash|zsh|fish`: the shell code that completes hpnlab's commands and flags.

Completion is argcomplete's (the parsers are the ones ``hpnlab --help`` shows): put the output
where your shell reads completions, e.g. ``hpnlab completion bash > /etc/bash_completion.d/hpnlab``
or ``eval "$(hpnlab completion bash)"`` in ~/.bashrc."""
from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish", "tcsh")


def register(sub) -> None:
    p = sub.add_parser("completion", help="print shell completion code (bash, zsh, fish, tcsh)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    import argcomplete  # optional until asked for: a start of any other command does not pay for it

    print(argcomplete.shellcode(["hpnlab"], shell=args.shell))
    return 0
