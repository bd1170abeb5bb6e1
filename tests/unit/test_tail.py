"""A file another process appends to, read in whole lines (fabric/tail.py ``LineTail``; the live
view's ``TelemetryTail`` and the routing comparison's weight changes read through it)."""
from __future__ import annotations

import json

from hpnlab.fabric.tail import LineTail
from hpnlab.fabric.web.live import TelemetryTail


def test_each_read_gives_the_whole_lines_written_since_the_last(tmp_path):
    path = tmp_path / "telemetry.jsonl"
    tail = LineTail(path)
    assert tail.lines() == []                                # not written yet
    path.write_text("a\nb\n")
    assert tail.lines() == ["a", "b"]
    assert tail.lines() == []
    with open(path, "a") as fh:
        fh.write("c\n")
    assert tail.lines() == ["c"]


def test_a_line_still_being_written_is_read_once_it_ends(tmp_path):
    path = tmp_path / "telemetry.jsonl"
    path.write_text('{"kind": "sam')
    tail = LineTail(path)
    assert tail.lines() == []
    with open(path, "a") as fh:
        fh.write('ple"}\n')
    assert tail.lines() == ['{"kind": "sample"}']


def test_no_file_named_reads_nothing():
    assert LineTail(None).lines() == []


def test_the_telemetry_tail_keeps_the_newest_sample_and_the_header(tmp_path):
    path = tmp_path / "telemetry.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ({"kind": "header", "v": 1}, {"kind": "sample", "t": 1},
                                                      {"kind": "weights"}, {"kind": "sample", "t": 2})) + "\n{")
    tail = TelemetryTail(path)
    assert tail.read() == {"kind": "sample", "t": 2} and tail.header == {"kind": "header", "v": 1}
