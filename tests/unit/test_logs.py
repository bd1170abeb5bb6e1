"""The controller's log lines (controller/logs.py): journald's format under systemd, pure."""
from __future__ import annotations

import logging

from hpnlab.controller import logs


def record(level: int, msg: str, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            import sys
            exc_info = sys.exc_info()
    return logging.LogRecord("hpnlab.controller", level, __file__, 1, msg, (), exc_info)


def test_auto_is_journal_only_when_systemd_connected_the_output_to_the_journal():
    assert logs.choose("auto", {"JOURNAL_STREAM": "8:1234"}) == "journal"
    assert logs.choose("auto", {}) == "text"
    assert logs.choose("text", {"JOURNAL_STREAM": "8:1234"}) == "text"


def test_a_journal_line_starts_with_the_syslog_priority_of_its_level():
    f = logs.JournalFormatter()
    assert f.format(record(logging.INFO, "p0l0 connected")) == "<6>hpnlab.controller: p0l0 connected"
    assert f.format(record(logging.WARNING, "x")).startswith("<4>")
    assert f.format(record(logging.ERROR, "x")).startswith("<3>")
    assert f.format(record(logging.DEBUG, "x")).startswith("<7>")


def test_a_level_between_the_named_ones_takes_the_lower_ones_priority():
    assert logs.priority(logging.WARNING + 5) == 4


def test_a_traceback_is_folded_onto_the_events_one_line():
    line = logs.JournalFormatter().format(record(logging.ERROR, "hub: uncaught\nexception", exc=True))
    assert "\n" not in line and line.startswith("<3>hpnlab.controller: hub: uncaught | exception | Traceback")
    assert line.endswith("ValueError: bad | value")
