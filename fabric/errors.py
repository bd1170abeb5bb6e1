"""Errors a user can cause: printed by the command line as one line, exit code 2.

``one_line`` and ``short`` keep every such message to one bounded line whatever the input
holds: control characters (a newline inside a key) are escaped, long text is cut, and a
value is shown as a short ``repr`` (never a megabyte, never a 400-digit number in full).
"""
from __future__ import annotations

import reprlib
from typing import Any

#: Longest message the command line prints (characters, after escaping).
MESSAGE_LIMIT = 400
#: Longest shown value inside a message.
VALUE_LIMIT = 60


class UserError(Exception):
    """Something the user can fix (missing root, OVS not running, bad flag, port taken).

    The message says what is wrong and what to do, in one line.
    """


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` as one printable line of at most ``limit`` characters.

    Characters that are not printable (newlines, tabs, other controls, line separators,
    lone surrogates from undecodable command-line bytes) are written as their escapes;
    what is beyond ``limit`` is replaced by ``...``.
    """
    head = text[: limit + 1]
    out = "".join(ch if ch.isprintable() else ch.encode("unicode_escape", "backslashreplace").decode("ascii")
                  for ch in head)
    if len(out) > limit or len(text) > limit:
        return out[: max(limit - 3, 0)] + "..."
    return out


_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxstring = VALUE_LIMIT
_REPR.maxother = VALUE_LIMIT
_REPR.maxlong = VALUE_LIMIT
for _attr in ("maxdict", "maxlist", "maxtuple", "maxset", "maxfrozenset", "maxdeque", "maxarray"):
    setattr(_REPR, _attr, 4)


def short(value: Any, limit: int = VALUE_LIMIT) -> str:
    """A short one-line ``repr`` of a value a user gave, safe for any value.

    Nested containers show two levels and four items, text its first characters, a huge
    integer its number of digits; a value whose ``repr`` fails is shown by its type.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<a number of about {int(value.bit_length() * 0.30103) + 1} digits>"
    try:
        text = _REPR.repr(value)
    except Exception:  # a hostile __repr__, a recursion: show the type instead
        text = f"<{type(value).__name__}>"
    return one_line(text, limit)


class ScenarioError(UserError, ValueError):
    """A scenario that cannot be built: the message names the field and the rule, on one line."""

    def __init__(self, field_name: str, rule: str, source: str | None = None):
        self.field = one_line(str(field_name), VALUE_LIMIT)
        self.rule = one_line(rule)
        self.source = one_line(source, VALUE_LIMIT * 2) if source else source
        where = f"{self.source}: " if self.source else ""
        super().__init__(one_line(f"{where}{self.field}: {self.rule}"))
