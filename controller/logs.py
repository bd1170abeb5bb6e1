"""The controller's log lines: plain text on a terminal, or journald's format under systemd.

Under systemd (``JOURNAL_STREAM`` set: stdout/stderr go to the journal) every event is one line
on stdout starting with its syslog priority, ``<6>hpnlab.controller: p0l0 connected``, which
journald stores as that priority (``SyslogLevelPrefix=``, on by default), so
``journalctl -u hpnlab-controller -p warning`` shows warnings and worse. A message or traceback
of several lines is folded onto one (`` | `` between its lines): one event, one journal entry.
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

FORMATS = ("auto", "text", "journal")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Python logging level -> syslog priority (sd-daemon(3)'s <N> prefixes)
PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def choose(fmt: str, environ: Mapping[str, str]) -> str:
    """``text`` or ``journal``: ``auto`` is journal when systemd connected the output to the journal."""
    if fmt == "auto":
        return "journal" if environ.get("JOURNAL_STREAM") else "text"
    return fmt


def priority(levelno: int) -> int:
    """The syslog priority of a logging level (levels between the named ones take the next lower name's)."""
    named = [lvl for lvl in sorted(PRIORITY) if lvl <= levelno]
    return PRIORITY[named[-1]] if named else 7


class JournalFormatter(logging.Formatter):
    """``<priority>logger: message`` on one line (see the module's docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        one = " | ".join(line.rstrip() for line in text.splitlines() if line.strip())
        return f"<{priority(record.levelno)}>{record.name}: {one}"


def configure(fmt: str, verbose: bool, environ: Mapping[str, str] | None = None) -> str:
    """Set up the root logger; returns the format used. Journal lines go to stdout, text to stderr."""
    chosen = choose(fmt, os.environ if environ is None else environ)
    handler = logging.StreamHandler(sys.stdout if chosen == "journal" else sys.stderr)
    handler.setFormatter(JournalFormatter() if chosen == "journal" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    return chosen
