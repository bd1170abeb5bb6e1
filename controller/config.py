"""The controller's configuration file: ``hpnlab controller --config FILE.yaml``.

Its keys are the controller's command-line flags, named by their argparse ``dest`` (``ofp_port``
for ``--ofp-port``; a dash instead of the underscore is accepted too), so every flag the parser
has, including ones added later, is a key with no change here. Two keys have a nicer shape:

    tls: {key: FILE, cert: FILE, ca: FILE}     # --ssl-key, --ssl-cert, --ssl-ca
    set: {emulation.host_mbps: 100}            # --set k=v; a list of "k=v" strings works too

Values take the flag's type (a whole number for ``--ofp-port``, true/false for a switch such as
``--no-fast-failover``, one of the choices where the flag has them, a list for a repeatable flag);
null stands for a flag not given, where the flag's default is nothing (``wiring_out: null``).
Flags given on the command line win over the file; a repeatable flag's command-line items come
after the file's (so ``--set`` on the command line overrides the same field set in the file).
An unknown key or a value of the wrong type is a UserError of one line per mistake.

Pure apart from reading the file: the parser in, plain values out. The values become the controller's
one configuration in controller/conf.py (``conf.from_namespace``), which is also how the app reads the
configuration the launcher wrote for it (``conf.read``).
"""
from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hpnlab.fabric.errors import UserError

#: the argparse dest of the flag naming the file itself (not a key of the file)
CONFIG_DEST = "config"
#: nested keys and the flags (dests) they stand for
NESTED = {"tls": {"key": "ssl_key", "cert": "ssl_cert", "ca": "ssl_ca"}}
GIVEN_ATTR = "_hpnlab_given"       # on the Namespace: dests the command line gave


# ---- which flags the command line gave ----------------------------------------------------------

_recording_classes: dict[type, type] = {}


def _recording(base: type) -> type:
    """A subclass of an argparse action class that notes its dest on the namespace when argparse
    calls it (a flag present on the command line; a positional only when given a value)."""
    if base not in _recording_classes:
        def __call__(self, parser, namespace, values, option_string=None):  # noqa: N807 - argparse's protocol
            if self.option_strings or values is not self.default:
                given: set[str] = getattr(namespace, GIVEN_ATTR, set())
                given.add(self.dest)
                setattr(namespace, GIVEN_ATTR, given)
            return base.__call__(self, parser, namespace, values, option_string)
        _recording_classes[base] = type(f"Recording{base.__name__}", (base,), {"__call__": __call__})
    return _recording_classes[base]


def record_given(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` note, on the namespace it fills, which dests the command line gave (``given``).
    Call it once the parser has all its arguments."""
    for action in parser._actions:
        if (action.dest != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
                and type(action) not in _recording_classes.values()):
            action.__class__ = _recording(type(action))
    return parser


def given(args: argparse.Namespace) -> set[str]:
    """The dests the command line gave (``record_given``)."""
    return set(getattr(args, GIVEN_ATTR, set()))


# ---- the file's keys -> the parser's dests ------------------------------------------------------

def keys_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every dest a file may set, with its action."""
    return {a.dest: a for a in parser._actions
            if a.dest not in (argparse.SUPPRESS, CONFIG_DEST) and not isinstance(a, argparse._HelpAction)}


def _flag(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest.upper()


def _type_name(kind: Any) -> str:
    return {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}.get(
        kind, getattr(kind, "__name__", "a value"))


def _scalar(key: str, action: argparse.Action, value: Any) -> Any:
    """One value for ``action``, converted as the command line would; UserError when it cannot be."""
    kind = action.type
    if isinstance(value, (dict, list)) or value is None:
        raise UserError(f"{key}: expected {_type_name(kind or str)}, got {_shown(value)}")
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and isinstance(value, float)):
            raise UserError(f"{key}: expected {_type_name(kind)} (as {_flag(action)}), got {_shown(value)}")
        converted: Any = kind(value)
    elif kind is None or kind is str:
        if not isinstance(value, str):
            raise UserError(f"{key}: expected a string (as {_flag(action)}), got {_shown(value)}")
        converted = value
    else:                                   # the flag's own converter takes the text the command line would give
        try:
            converted = kind(value if isinstance(value, str) else str(value))   # type: ignore[operator]
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise UserError(f"{key}: {exc or 'not a valid value'} (as {_flag(action)})") from None
    if action.choices is not None and converted not in action.choices:
        raise UserError(f"{key}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return converted


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return f"{value!r} ({type(value).__name__})"


def set_items(value: Any) -> list[str]:
    """``set:`` as ``--set`` items: a list of "field=value" strings, or a mapping of fields (dotted
    or nested) to values."""
    if isinstance(value, Mapping):
        out: list[str] = []

        def walk(prefix: str, node: Mapping) -> None:
            for k, v in node.items():
                name = f"{prefix}{k}"
                if isinstance(v, Mapping) and v:
                    walk(f"{name}.", v)
                else:
                    out.append(f"{name}={json.dumps(v)}")
        walk("", value)
        return out
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise UserError(f"set: expected a mapping of scenario fields to values, or a list of 'field=value' strings, "
                    f"got {_shown(value)}")


def convert(key: str, action: argparse.Action, value: Any) -> Any:
    """The file's value for one flag, as argparse would have stored it from the command line (null for a
    flag whose default is nothing: the flag not given)."""
    if value is None and action.default is None:
        return None
    if action.dest == "set":
        return set_items(value)
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)):
        if not isinstance(value, bool):
            raise UserError(f"{key}: expected true or false (as {_flag(action)}), got {_shown(value)}")
        return value              # the key is the dest: `no_verify: true` is what --no-verify stores
    if isinstance(action, argparse._StoreConstAction):
        if not isinstance(value, bool):
            raise UserError(f"{key}: expected true or false (as {_flag(action)}), got {_shown(value)}")
        return action.const if value else action.default
    if isinstance(action, argparse._CountAction):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"{key}: expected a count (0, 1, 2...), got {_shown(value)}")
        return value
    many = isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+") or isinstance(action.nargs, int)
    if many:
        items = value if isinstance(value, list) else [value]
        return [_scalar(f"{key}[{i}]", action, item) for i, item in enumerate(items)]
    return _scalar(key, action, value)


def flatten(doc: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(key as written, dest it names, value), the nested keys (``tls``) opened up."""
    out = []
    for raw, value in doc.items():
        key = str(raw)
        nested = NESTED.get(key.replace("-", "_"))
        if nested is not None:
            if not isinstance(value, Mapping):
                raise UserError(f"{key}: expected a mapping ({', '.join(nested)}), got {_shown(value)}")
            for sub, inner in value.items():
                if str(sub) not in nested:
                    raise UserError(f"{key}.{sub}: unknown key (known: {', '.join(nested)})")
                out.append((f"{key}.{sub}", nested[str(sub)], inner))
        else:
            out.append((key, key.replace("-", "_"), value))
    return out


def values(doc: Any, parser: argparse.ArgumentParser, source: str = "config") -> dict[str, Any]:
    """The document's values by dest, converted and checked against ``parser`` (pure). Every
    mistake is one line; all of them are reported together, separated by ``; ``."""
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise UserError(f"{source}: expected a mapping of settings (key: value), got {_shown(doc)}")
    actions = keys_of(parser)
    known = sorted(set(actions) | set(NESTED))
    out: dict[str, Any] = {}
    problems: list[str] = []
    try:
        entries = flatten(doc)
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    for key, dest, value in entries:
        action = actions.get(dest)
        if action is None:
            near = difflib.get_close_matches(dest, known, n=1)
            problems.append(f"unknown key {key!r}" + (f" (did you mean {near[0]!r}?)" if near else
                                                      f" (keys are the flags' names: {', '.join(known)})"))
            continue
        if dest in out:
            problems.append(f"{key}: given twice")
            continue
        try:
            out[dest] = convert(key, action, value)
        except UserError as exc:
            problems.append(str(exc))
    if problems:
        raise UserError(f"{source}: " + "; ".join(problems))
    return out


def load(path: str | Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Read a config file (YAML) and return its values by dest (``values``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise UserError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--config {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"--config {path}:{where} not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    return values(doc, parser, str(path))


def apply(parser: argparse.ArgumentParser, args: argparse.Namespace, file_values: Mapping[str, Any]) -> None:
    """Put the file's values into ``args`` where the command line gave nothing; a repeatable
    flag gets the file's items first, then the command line's."""
    cli = given(args)
    actions = keys_of(parser)
    for dest, value in file_values.items():
        if dest not in cli:
            setattr(args, dest, value)
        elif isinstance(actions[dest], argparse._AppendAction):
            setattr(args, dest, list(value) + list(getattr(args, dest) or []))


def resolve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with its ``--config`` file (if any) applied; the parser must be ``record_given``'s."""
    path = getattr(args, CONFIG_DEST, None)
    if path:
        apply(parser, args, load(path, parser))
    return args


# ---- the other way: a namespace back into a command line ---------------------------------------

def to_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The command line that gives ``parser`` these values (every value that differs from its default);
    ``--config`` is left out (its values are in ``args`` already)."""
    positional: list[str] = []
    flags: list[str] = []
    for dest, action in keys_of(parser).items():
        if not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        if not action.option_strings:
            if value is not None:
                positional += [str(v) for v in value] if isinstance(value, list) else [str(value)]
            continue
        if value == action.default:
            continue
        opt = action.option_strings[-1]
        if isinstance(action, argparse.BooleanOptionalAction):
            flags.append(opt if value else f"--no-{opt[2:]}")
        elif isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)):
            flags.append(opt)          # differs from the default: the flag was (or stands for) given
        elif isinstance(action, argparse._CountAction):
            flags += [opt] * int(value or 0)
        elif isinstance(action, argparse._AppendAction):
            for item in value or []:
                flags += [opt, str(item)]
        elif isinstance(value, list):
            flags += [opt, *map(str, value)]
        elif value is not None:
            flags += [opt, str(value)]
    return positional + flags
