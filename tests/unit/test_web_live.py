"""The live view's plumbing without an emulation (hpnlab.fabric.web.live): faults observed whoever
applies them, injections applied and recorded as the timeline does, the telemetry file read as it grows."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from support.fabrics import fabric

from hpnlab.fabric.emulation import timeline
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.web import live, view


class FakeFaults:
    """Records the calls an Emulation's Faults object would get."""

    def __init__(self):
        self.calls = []

    def _call(self, name, *args):
        self.calls.append((name, *args))
        return 1234.5

    def link_down(self, u, v, key=None, side=None):
        return self._call("link_down", u, v, key, side)

    def link_up(self, u, v, key=None, side=None):
        return self._call("link_up", u, v, key, side)

    def link_drop(self, u, v, key=None, side=None):
        return self._call("link_drop", u, v, key, side)

    def link_restore(self, u, v, key=None, side=None):
        return self._call("link_restore", u, v, key, side)

    def switch_down(self, name):
        return self._call("switch_down", name)

    def switch_up(self, name):
        return self._call("switch_up", name)


class FakeEmu:
    """The parts of an Emulation the live view and the timeline use."""

    def __init__(self, telemetry_file=None):
        self.graph = fabric("mini-hpn")
        self.faults = FakeFaults()
        self.controller = SimpleNamespace(telemetry_file=telemetry_file)


def test_a_fault_applied_by_the_timeline_reaches_the_view():
    emu = FakeEmu()
    src = live.LiveSource(emu)
    for ev in timeline.parse([{"at": 0, "action": "link_drop", "link": ["p0l0", "p0s0"], "side": "p0s0"},
                              {"at": 0, "action": "switch_down", "switch": "p1s1"}], emu.graph):
        timeline.apply(emu.faults, ev)
    fr = src.make_frame()
    assert fr["links"]["p0l0-p0s0/0"]["state"] == "gray" and fr["switches_down"] == ["p1s1"]
    assert [e["text"] for e in fr["events"]] == ["link_drop p0l0-p0s0 (side p0s0)", "switch_down p1s1"]
    src.stop()
    assert "link_down" not in vars(emu.faults)        # the wrappers are gone


def test_an_injection_is_applied_by_the_timeline_and_recorded_like_its_records():
    emu = FakeEmu()
    src = live.LiveSource(emu)
    recs = src.inject({"action": "link_down_one_side", "link": ["p0l1", "p0s1"], "side": "p0s1"})
    assert emu.faults.calls == [("link_down", "p0l1", "p0s1", None, "p0s1")]
    assert set(recs[0]) == {"at", "action", "target", "key", "side", "applied_s", "late_ms", "wall", "start_wall",
                            "source"}
    assert recs[0]["source"] == "web" and src.records == recs
    assert src.make_frame()["links"]["p0l1-p0s1/0"]["state"] == "down"
    src.inject({"action": "repair", "link": ["p0l1", "p0s1"]})
    assert emu.faults.calls[-1] == ("link_up", "p0l1", "p0s1", 0, None)
    assert "p0l1-p0s1/0" not in src.make_frame()["links"]
    assert src.inject({"action": "repair", "switch": "p0s0"}) == []          # nothing failed: nothing done
    src.stop()


@pytest.mark.parametrize("request_", [{"action": "link_down", "link": ["p0l0", "h9"]},
                                      {"action": "explode", "link": ["p0l0", "p0s0"]},
                                      {"action": "switch_down", "switch": "h1"}])
def test_a_bad_injection_is_refused_in_one_line(request_):
    src = live.LiveSource(FakeEmu())
    with pytest.raises(UserError):
        src.inject(request_)
    src.stop()


def test_the_telemetry_file_is_read_as_it_grows_and_a_partial_line_waits(tmp_path):
    path = tmp_path / "telemetry.jsonl"
    line = {"kind": "sample", "t": 5.0, "ports": [{"switch": "p0l0", "port": 5, "tx_mbps": 9.0, "utilisation": 0.45}]}
    path.write_text(json.dumps({"kind": "header", "interval_ms": 200}) + "\n" + json.dumps(line) + "\n"
                    + '{"kind": "sample", "t": 5.2, "po')
    src = live.LiveSource(FakeEmu(path))
    fr = src.make_frame()
    assert fr["links"]["p0l0-p0s0/0"]["ab"]["util"] == 0.45
    assert fr["links"]["p0l0-p0s0/0"]["ab"]["colour"] == view.util_colour(0.45)
    with open(path, "a") as f:
        f.write('rts": []}\n')
    assert src.make_frame()["links"] == {}                           # the newer sample: nothing carried
    src.stop()
