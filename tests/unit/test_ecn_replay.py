"""The ECN replay (controller/ecn_replay.py), pure: telemetry files recorded by the real control loop
(controller/ecn_loop.py, fed synthetic counters) replayed through policies offline."""
from __future__ import annotations

import io
import json
import random

import pytest

from hpnlab.controller import ecn_loop, ecn_policy, ecn_replay
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing.telemetry import OfPortStats, PortInfo, StageCounters, Telemetry

RATE = 20e6
PORTS = {("l0", 1): PortInfo("l0", 1, "h0", RATE), ("l0", 2): PortInfo("l0", 2, "h1", RATE),
         ("l0", 3): PortInfo("l0", 3, "s0", 2 * RATE), ("s0", 1): PortInfo("s0", 1, "l0", 2 * RATE)}
MTU = 4096


def record(policy="dynamic", ticks=60, seed=1, switch_to=None, interval=0.2):
    """A telemetry file as the live loop writes it: per tick, cumulative OpenFlow and stage counters
    of synthetic traffic (an incast into l0:1 with deep queues and drops in bursts, steady traffic on
    l0:2, l0:3 busy, s0:1 idle), the loop's own ticks and decisions. ``switch_to``: (tick, policy) at
    which the policy is replaced through the control file, as the emulation harness does."""
    rng = random.Random(seed)
    out = io.StringIO()
    loop = ecn_loop.EcnLoop(Telemetry(PORTS, interval), ecn_policy.load(policy, MTU), "none", mtu=MTU, out=out)
    tx = dict.fromkeys(PORTS, 0)
    stage = {k: StageCounters() for k in PORTS}
    now = 100.0
    for i in range(ticks):
        if switch_to and i == switch_to[0]:
            loop.set_policy(now, ecn_policy.load(switch_to[1], MTU))
        dt = interval * (1 + rng.uniform(0, 0.03))           # late ticks, as a real timer's
        now += dt
        for key, info in PORTS.items():
            share = {("l0", 1): rng.choice((0.3, 0.7, 1.0)), ("l0", 2): rng.uniform(0.2, 0.6),
                     ("l0", 3): 0.95, ("s0", 1): 0.0}[key]
            sent = int(info.rate_bps / 8 * dt * share)
            tx[key] += sent
            pkts = sent // MTU
            burst = key == ("l0", 1) and i % 7 in (3, 4)
            c = stage[key]
            queue = (rng.randint(120_000, 200_000) if burst else rng.randint(0, 30_000)) if pkts else 0
            stage[key] = StageCounters(bytes=c.bytes + sent, packets=c.packets + pkts, ect=c.ect + pkts,
                                       ce_marked=c.ce_marked + (pkts // 20 if key == ("l0", 2) else 0),
                                       queue_bytes=queue, drops=c.drops + (rng.randint(1, 5) if burst else 0),
                                       queue_peak_bytes=queue)
        loop.telemetry.port_stats("l0", now, [OfPortStats(p, tx_bytes=tx[("l0", p)]) for p in (1, 2, 3)])
        loop.telemetry.port_stats("s0", now, [OfPortStats(1, tx_bytes=tx[("s0", 1)])])
        loop.telemetry.stage_counters(now, dict(stage))
        loop.tick(now, ["l0", "s0"])
    return [json.loads(x) for x in out.getvalue().splitlines()], loop


def test_replaying_a_file_with_its_own_policy_makes_every_recorded_decision_and_no_other():
    lines, loop = record("dynamic", ticks=80)
    assert loop.n_changes >= 5                         # the recorded run did decide things
    r = ecn_replay.replay(lines)
    assert r["compared"] and r["agree"], (r["only_replayed"], r["only_recorded"])
    assert len(r["changes"]) == loop.n_changes
    assert r["in_force_differ"] == 0
    assert r["final"] == {f"{k[0]}:{k[1]}": t.as_dict() for k, t in loop.current.items() if t != loop.initial[k]}


@pytest.mark.parametrize("seed", range(5))
def test_the_replay_agrees_whatever_the_traffic(seed):
    lines, _ = record("dynamic", ticks=50, seed=seed)
    r = ecn_replay.replay(lines)
    assert r["agree"] and r["in_force_differ"] == 0


def test_a_policy_replaced_mid_file_starts_a_segment_from_the_start_up_thresholds():
    lines, _ = record("dynamic", ticks=60, switch_to=(30, "static"))
    r = ecn_replay.replay(lines)
    assert [s["recorded_policy"] for s in r["segments"]] == ["dynamic", "static"]
    assert r["segments"][1]["changes"] == []           # static decides nothing; the loop's reset is not a decision
    assert r["agree"] and r["in_force_differ"] == 0
    assert r["final"] == {}


def test_another_policy_replays_open_loop_and_is_not_compared():
    lines, _ = record("dynamic", ticks=60)
    r = ecn_replay.replay(lines, policy="static")
    assert r["changes"] == [] and not r["compared"] and r["agree"] is None
    text = ecn_replay.format_replay(r)
    assert "open loop" in text and "replayed with static" in text


def test_a_policy_file_replays_with_options(tmp_path):
    lines, _ = record("static", ticks=40)
    r = ecn_replay.replay(lines, policy="dynamic", options={"pressure_ms": 1000.0, "pressure_frames": 1000})
    # the bursts never reach a 1000-frame pressure mark: no cut for the incast port; its drops still count
    cuts = [c for c in r["changes"] if c["switch"] == "l0" and c["port"] == 1 and "drops 0" in c["reason"]
            and c["new"]["kmin"] < c["old"]["kmin"]]
    assert cuts == []
    recorded_dynamic, _ = record("dynamic", ticks=20)
    assert ecn_replay.replay(recorded_dynamic, policy="dynamic")["compared"]
    assert not ecn_replay.replay(recorded_dynamic, policy="dynamic", options={"pressure_ms": 40.0})["compared"]
    f = tmp_path / "mine.py"
    f.write_text("from hpnlab.controller.ecn_policy import EcnPolicy, Thresholds\n"
                 "class Mine(EcnPolicy):\n    name = 'mine'\n"
                 "    def decide(self, now, ports, current):\n"
                 "        return {k: Thresholds(4110, 8220, 0.5, reason='flat') for k in current}\n")
    r = ecn_replay.replay(lines, policy=f"{f}:Mine")
    assert len(r["changes"]) == len(PORTS)             # once, then nothing differs
    assert {c["reason"] for c in r["changes"]} == {"flat"}


def test_a_tampered_decision_shows_as_a_difference():
    lines, _ = record("dynamic", ticks=80)
    change = next(x for x in lines if x["kind"] == "change")
    change["new"] = dict(change["new"], kmin=change["new"]["kmin"] + 1)
    r = ecn_replay.replay(lines)
    assert r["agree"] is False and len(r["only_recorded"]) == 1 and len(r["only_replayed"]) == 1
    assert "DIFFER" in ecn_replay.format_replay(r)


def test_thresholds_in_force_that_differ_from_the_replay_are_counted():
    lines, _ = record("dynamic", ticks=80)
    sample = [x for x in lines if x["kind"] == "sample"][-1]
    sample["ports"][0]["kmin"] += 1
    assert ecn_replay.replay(lines)["in_force_differ"] == 1


def test_ports_the_file_leaves_out_replay_as_idle_with_their_switchs_fan_in():
    line = {"kind": "sample", "t": 5.0, "ports": [{"switch": "l0", "port": 2, "tx_mbps": 10.0, "utilisation": 0.5,
                                                  "fan_in": 3, "drops": 0}]}
    rates = {k: p.rate_bps for k, p in PORTS.items()}
    s = ecn_replay.samples_of(line, rates)
    assert set(s) == set(PORTS)
    assert s[("l0", 2)].tx_bps == pytest.approx(10e6) and s[("l0", 2)].utilisation == 0.5
    assert s[("l0", 1)].tx_bps == 0 and s[("l0", 1)].fan_in == 3
    assert s[("s0", 1)].fan_in == 0


def test_the_command_prints_the_agreement_and_writes_json(tmp_path, capsys):
    lines, _ = record("dynamic", ticks=60)
    f = tmp_path / "telemetry.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n{\"kind\": \"sam")     # the line being written
    assert ecn_replay.main([str(f), "--json", str(tmp_path / "r.json"), "--changes", "3"]) == 0
    out = capsys.readouterr().out
    assert "agree: the replay made every recorded decision" in out
    assert "changes (first 3 of" in out
    assert json.loads((tmp_path / "r.json").read_text())["agree"] is True


@pytest.mark.parametrize(("text", "needle"), [
    ("", "no header line"),
    ('{"kind": "header", "ports": {}}\n', "lists no ports"),
    ('{"kind": "header", "ports": {"l0": {"rate_mbps": 1}}}\n', "no switch:port name"),
    ('not json\n{"kind": "header"}\n', ":1: not a JSON line"),
    ('[1, 2]\n{"kind": "header"}\n', ":1: not a JSON object"),
])
def test_a_file_that_is_not_a_telemetry_file_is_one_line(tmp_path, capsys, text, needle):
    f = tmp_path / "t.jsonl"
    f.write_text(text)
    assert ecn_replay.main([str(f)]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_a_missing_file_and_an_unknown_policy_are_one_line(tmp_path, capsys):
    assert ecn_replay.main([str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read telemetry file" in capsys.readouterr().err
    lines, _ = record("static", ticks=3)
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines))
    assert ecn_replay.main([str(f), "--policy", "no-such-policy"]) == 2
    assert "unknown ECN policy" in capsys.readouterr().err
    with pytest.raises(UserError):
        ecn_replay.replay(lines, policy="dynamic", options={"no_such_knob": 1.0})


HALVING = ("from hpnlab.controller.ecn_policy import EcnPolicy, Thresholds\n"
           "class Halving(EcnPolicy):\n    name = 'halving'\n"
           "    def decide(self, now, ports, current):\n"
           "        return {k: Thresholds(max(1, t.kmin // 2), max(1, t.kmax // 2), t.pmax, reason='halve')\n"
           "                for k, t in current.items() if ports[k].drops}\n")


def test_a_policy_from_a_file_is_recorded_by_its_spec_and_replayed_from_it(tmp_path):
    f = tmp_path / "halving.py"
    f.write_text(HALVING)
    lines, loop = record(f"{f}:Halving", ticks=40)
    assert lines[0]["spec"] == f"{f}:Halving" and lines[0]["policy"] == "halving"
    assert loop.n_changes > 0
    r = ecn_replay.replay(lines)
    assert r["agree"] and r["in_force_differ"] == 0


def test_a_segment_whose_policy_no_longer_loads_is_skipped_and_the_others_compared(tmp_path):
    f = tmp_path / "halving.py"
    f.write_text(HALVING)
    lines, _ = record("dynamic", ticks=60, switch_to=(30, f"{f}:Halving"))
    f.unlink()
    r = ecn_replay.replay(lines)
    first, second = r["segments"]
    assert first["skipped"] is None and first["changes"]
    assert "does not exist" in second["skipped"] and second["ticks"] == 30
    assert r["agree"] and r["in_force_differ"] == 0
    assert "not replayed" in ecn_replay.format_replay(r)


def test_hpnlab_run_keeps_the_controllers_telemetry_file_beside_its_results(tmp_path):
    from types import SimpleNamespace

    from hpnlab.cli.cmd_run import keep_telemetry

    lines, _ = record("dynamic", ticks=10)
    src = tmp_path / "run" / "telemetry.jsonl"
    src.parent.mkdir()
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    said: list[str] = []
    kept = keep_telemetry(SimpleNamespace(controller=SimpleNamespace(telemetry_file=src)), tmp_path / "out",
                          said.append)
    assert kept == tmp_path / "out" / "telemetry.jsonl"
    assert kept is not None and kept.read_text() == src.read_text()
    assert "ecn_replay" in said[0]
    assert keep_telemetry(SimpleNamespace(controller=SimpleNamespace(telemetry_file=None)), tmp_path / "none",
                          said.append) is None
    assert not (tmp_path / "none").exists()
