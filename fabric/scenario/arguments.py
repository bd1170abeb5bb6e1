"""A scenario on a command line, declared once: ``SCENARIO`` (a preset name, ``fat-tree-K`` or a
YAML file) and ``--set FIELD=VALUE`` (repeatable). Every command that takes a scenario declares
them with :func:`add_scenario_args` (the ``hpnlab`` commands through ``hpnlab.cli.args``, the
controller's own launcher, the benchmarks), and reads them with :func:`overrides_of` and
:func:`load`."""
from __future__ import annotations

import argparse
from typing import Any

from . import spec

__all__ = ["SCENARIO_HELP", "SET_HELP", "add_scenario_args", "load", "overrides_of"]

#: what SCENARIO may be
SCENARIO_HELP = "preset name (see 'hpnlab topo presets'), fat-tree-K, or a YAML file"
#: what --set does
SET_HELP = "override a scenario field (repeatable), e.g. --set planes=4 --set long_haul.distance_km=50"


def add_scenario_args(parser: argparse.ArgumentParser, default: str | None = None, optional: bool = False,
                      help: str | None = None, set_help: str | None = None, dest: str = "overrides") -> None:
    """SCENARIO and ``--set``. ``default``: the scenario when none is named (it may then be left out);
    ``optional``: it may be left out (None); ``help``/``set_help``: this command's words for them;
    ``dest``: where the ``--set`` items go (the controller's: ``set``, its configuration file's key)."""
    text = help or SCENARIO_HELP
    if default is not None:
        text += f" (default {default})"
    more: dict[str, Any] = {"nargs": "?", "default": default} if default is not None or optional else {}
    parser.add_argument("scenario", metavar="SCENARIO", help=text, **more)
    parser.add_argument("--set", dest=dest, action="append", default=[], metavar="FIELD=VALUE",
                        help=set_help or SET_HELP)


def overrides_of(args: argparse.Namespace, dest: str = "overrides") -> dict[str, Any]:
    """The ``--set`` overrides, as a nested mapping (a bad one: ScenarioError, one line)."""
    return spec.parse_overrides(getattr(args, dest))


def load(args: argparse.Namespace, dest: str = "overrides") -> spec.Scenario:
    """The scenario the arguments name, with their overrides, validated."""
    return spec.load(args.scenario, overrides_of(args, dest))
