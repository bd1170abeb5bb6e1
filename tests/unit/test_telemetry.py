"""Telemetry (fabric/routing/telemetry.py), the ECN control loop (controller/ecn_loop.py) and the
actuators (controller/actuators.py), pure: synthetic counters in, series, files and changes out."""
from __future__ import annotations

import io
import json

import pytest

from hpnlab.controller import actuators, ecn_loop, ecn_policy
from hpnlab.controller.ecn_policy import Thresholds
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing import telemetry
from hpnlab.fabric.routing.telemetry import OfPortStats, PortInfo, StageCounters, Telemetry
from hpnlab.fabric.scenario import graph, spec

RATE = 10e6     # bits/s
PORTS = {("l0", 1): PortInfo("l0", 1, "h0", RATE), ("l0", 2): PortInfo("l0", 2, "h1", RATE),
         ("l0", 3): PortInfo("l0", 3, "s0", 2 * RATE), ("s0", 1): PortInfo("s0", 1, "l0", 2 * RATE)}


def test_fabric_ports_are_every_switch_egress_port_with_its_peer_and_emulated_rate():
    g = graph.build(spec.load("mini-hpn"))
    ports = telemetry.fabric_ports(g)
    switch_ends = sum(1 for u, v in g.edges() for n in (u, v) if g.nodes[n]["tier"] > 0)
    assert len(ports) == switch_ends
    host_port = next(p for p in ports.values() if p.peer.startswith("h"))
    assert host_port.rate_bps == g.graph["scenario"].emulation.host_mbps * 1e6


def test_polls_every_connected_switch_once_per_interval():
    tel = Telemetry(PORTS, interval_s=0.2)
    first = tel.poll(10.0, ["l0", "s0", "unknown"])
    assert sorted(r.switch for r in first) == ["l0", "s0"]
    assert tel.poll(10.1, ["l0", "s0"]) == []
    assert len(tel.poll(10.2, ["l0", "s0"])) == 2
    assert len({r.xid for r in first}) == 2


def test_a_late_tick_polls_once_not_once_per_missed_interval():
    tel = Telemetry(PORTS, interval_s=0.2)
    tel.poll(0.0, ["l0"])
    assert len(tel.poll(1.0, ["l0"])) == 1
    assert tel.poll(1.1, ["l0"]) == []


def test_throughput_and_utilisation_come_from_tx_byte_differences():
    tel = Telemetry(PORTS, interval_s=0.2)
    tel.port_stats("l0", 1.0, [OfPortStats(1, tx_bytes=1000)])
    tel.port_stats("l0", 1.2, [OfPortStats(1, tx_bytes=1000 + 125_000)])   # 1 Mbit in 0.2 s
    s = tel.sample(1.2)[("l0", 1)]
    assert s.tx_bps == pytest.approx(5e6)
    assert s.utilisation == pytest.approx(0.5)


def test_a_counter_that_goes_down_gives_no_rate_for_that_interval():
    tel = Telemetry(PORTS, interval_s=0.2)
    tel.port_stats("l0", 1.0, [OfPortStats(1, tx_bytes=10_000_000)])
    tel.port_stats("l0", 1.2, [OfPortStats(1, tx_bytes=500)])        # the switch reconnected
    assert tel.sample(1.2)[("l0", 1)].tx_bps == 0
    tel.port_stats("l0", 1.4, [OfPortStats(1, tx_bytes=500 + 25_000)])
    assert tel.sample(1.4)[("l0", 1)].tx_bps == pytest.approx(1e6)


def test_stage_counters_give_queue_marking_rate_and_fraction():
    tel = Telemetry(PORTS, interval_s=0.2)
    tel.stage_counters(1.0, {("l0", 1): StageCounters(bytes=0, packets=100, ect=100, ce_marked=10, queue_bytes=0)})
    tel.stage_counters(1.2, {("l0", 1): StageCounters(bytes=0, packets=300, ect=300, ce_marked=60,
                                                      queue_bytes=9000)})
    s = tel.sample(1.2)[("l0", 1)]
    assert s.queue_bytes == 9000
    assert s.ce_marked_pps == pytest.approx(250)
    assert s.ce_fraction == pytest.approx(0.25)
    assert s.ect_pps == pytest.approx(1000)


def test_drops_are_tx_dropped_plus_the_stage_drops():
    tel = Telemetry(PORTS, interval_s=0.2)
    tel.port_stats("l0", 1.0, [OfPortStats(1, tx_dropped=5)])
    tel.stage_counters(1.0, {("l0", 1): StageCounters(drops=1)})
    tel.port_stats("l0", 1.2, [OfPortStats(1, tx_dropped=8)])
    tel.stage_counters(1.2, {("l0", 1): StageCounters(drops=3)})
    assert tel.sample(1.2)[("l0", 1)].drops == 3 + 2


def test_without_a_stage_the_queue_is_unknown_not_zero():
    tel = Telemetry(PORTS, interval_s=0.2)
    assert tel.sample(1.0)[("l0", 1)].queue_bytes is None


def test_fan_in_counts_the_ports_of_the_switch_that_receive():
    tel = Telemetry(PORTS, interval_s=0.2)
    busy = 0.2 * RATE / 8 * 0.5       # half the port rate for 0.2 s
    tel.port_stats("l0", 1.0, [OfPortStats(p) for p in (1, 2, 3)])
    tel.port_stats("l0", 1.2, [OfPortStats(1, rx_bytes=int(busy)), OfPortStats(2, rx_bytes=int(busy)),
                               OfPortStats(3, rx_bytes=10)])
    samples = tel.sample(1.2)
    assert samples[("l0", 3)].fan_in == 2
    assert samples[("s0", 1)].fan_in == 0


def test_an_openflow_reading_stands_until_it_is_stale_and_its_drops_count_once():
    tel = Telemetry(PORTS, interval_s=0.2)
    tel.port_stats("l0", 1.0, [OfPortStats(1, tx_bytes=0)])
    tel.port_stats("l0", 1.2, [OfPortStats(1, tx_bytes=25_000, tx_dropped=3)])
    first, late = tel.sample(1.2)[("l0", 1)], tel.sample(1.4)[("l0", 1)]     # the next reply is late
    assert first.tx_bps == late.tx_bps == pytest.approx(1e6)
    assert (first.drops, late.drops) == (3, 0)
    assert tel.sample(1.2 + telemetry.STALE_INTERVALS * 0.2 + 0.01)[("l0", 1)].tx_bps == 0


def test_throughput_is_what_openflow_says_was_sent_and_the_stages_only_without_it():
    tel = Telemetry(PORTS, interval_s=0.2)
    tel.stage_counters(1.0, {("l0", 1): StageCounters(bytes=0)})
    tel.stage_counters(1.2, {("l0", 1): StageCounters(bytes=100_000)})
    assert tel.sample(1.2)[("l0", 1)].tx_bps == pytest.approx(4e6)          # no OpenFlow reply yet
    tel.stage_counters(1.4, {("l0", 1): StageCounters(bytes=200_000)})       # offered 4 Mbit/s ...
    tel.port_stats("l0", 1.2, [OfPortStats(1, tx_bytes=0)])
    tel.port_stats("l0", 1.4, [OfPortStats(1, tx_bytes=50_000)])             # ... sent 2 (the buffer dropped)
    assert tel.sample(1.4)[("l0", 1)].utilisation == pytest.approx(0.2)


def test_series_are_ring_buffers_of_bounded_length():
    tel = Telemetry(PORTS, interval_s=0.2, history=5)
    for i in range(20):
        tel.sample(i * 0.2)
    assert all(len(s) == 5 for s in tel.series.values())
    assert tel.series[("l0", 1)][-1].t == pytest.approx(19 * 0.2)
    assert list(tel.intervals)[-1] == pytest.approx(0.2)


def test_summarise_downsamples_long_series_and_keeps_changes():
    lines = [{"kind": "header", "policy": "dynamic", "interval_ms": 200}]
    for i in range(1000):
        lines.append({"kind": "sample", "t": 100 + i * 0.2,
                      "ports": [{"switch": "l0", "port": 1, "peer": "h0", "tx_mbps": 1.0, "queue_bytes": i,
                                 "drops": 1, "kmin": 6056}]})
    lines.append({"kind": "change", "t": 150.0, "switch": "l0", "port": 1, "new": {"kmin": 4239}, "reason": "x"})
    doc = telemetry.summarise(lines, max_points=100)
    port = doc["ports"]["l0:1"]
    assert len(port["t"]) == 100
    assert port["queue_bytes"][-1] == 999                  # the peak of the last bucket
    assert sum(port["drops"]) == 1000                       # drops are summed, never lost
    assert port["tx_mbps"][0] == 1.0
    assert doc["policy"] == "dynamic" and doc["samples"] == 1000
    assert doc["changes"][0]["t_rel"] == pytest.approx(50.0)


# ---- the control loop -------------------------------------------------------------------------------------

class RecordingActuator:
    name = "recording"

    def __init__(self):
        self.applied: list[dict] = []

    def current(self):
        return {}

    def apply(self, changes):
        self.applied.append(dict(changes))


class HalvingPolicy(ecn_policy.EcnPolicy):
    name = "halving"

    def decide(self, now, ports, current):
        return {k: Thresholds(t.kmin // 2, t.kmax // 2, t.pmax, reason="test") if k == ("l0", 1) else t
                for k, t in current.items()}


def test_the_loop_sends_only_differences_and_writes_each_change_with_its_reason():
    out = io.StringIO()
    loop = ecn_loop.EcnLoop(Telemetry(PORTS, 0.2), HalvingPolicy(), "none", out=out)
    rec = RecordingActuator()
    loop.actuator = rec
    before = loop.current[("l0", 1)]
    loop.tick(1.0, ["l0"])
    assert list(rec.applied[0]) == [("l0", 1)]
    assert loop.current[("l0", 1)].kmin == before.kmin // 2
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    kinds = [x["kind"] for x in lines]
    assert kinds == ["header", "sample", "change"]
    assert lines[2]["reason"] == "test" and lines[2]["old"]["kmin"] == before.kmin


def test_the_static_policy_never_reaches_the_actuator():
    loop = ecn_loop.EcnLoop(Telemetry(PORTS, 0.2), ecn_policy.StaticPolicy(), "none")
    rec = RecordingActuator()
    loop.actuator = rec
    for i in range(10):
        loop.tick(i * 0.2, ["l0", "s0"])
    assert rec.applied == []


def test_emulated_waits_for_the_stage_and_decides_nothing_before():
    calls = []
    loop = ecn_loop.EcnLoop(Telemetry(PORTS, 0.2), HalvingPolicy(), "emulated",
                            open_stage=lambda run: calls.append(run))
    rec = RecordingActuator()
    loop.actuator = rec
    loop.tick(1.0, ["l0"])
    loop.tick(1.2, ["l0"])          # within the retry time: not looked for again
    assert calls == [None] and rec.applied == []


def test_a_policy_change_through_the_control_file_restores_start_up_thresholds_and_acknowledges(tmp_path):
    control = tmp_path / "ecn-policy.json"
    loop = ecn_loop.EcnLoop(Telemetry(PORTS, 0.2), HalvingPolicy(), "none", control=str(control))
    loop.tick(1.0, ["l0"])
    assert loop.current[("l0", 1)] != loop.initial[("l0", 1)]
    control.write_text(json.dumps({"policy": "static", "seq": 7}))
    loop.tick(1.2, ["l0"])
    assert loop.policy.name == "static"
    assert loop.current == loop.initial
    assert json.loads((tmp_path / "ecn-policy.json.ack").read_text()) == {"seq": 7, "policy": "static", "error": None}


def test_a_bad_policy_in_the_control_file_is_refused_in_the_acknowledgement(tmp_path):
    control = tmp_path / "ecn-policy.json"
    loop = ecn_loop.EcnLoop(Telemetry(PORTS, 0.2), ecn_policy.StaticPolicy(), "none", control=str(control))
    control.write_text(json.dumps({"policy": "no-such-policy", "seq": 1}))
    loop.tick(1.0, ["l0"])
    ack = json.loads((tmp_path / "ecn-policy.json.ack").read_text())
    assert ack["error"] and "no-such-policy" in ack["error"] and loop.policy.name == "static"


# ---- actuators ----------------------------------------------------------------------------------------------

def test_file_actuator_writes_every_port_atomically_and_counts_versions(tmp_path):
    path = tmp_path / "ecn.json"
    act = actuators.FileActuator(path, PORTS)
    first = json.loads(path.read_text())
    assert first["version"] == 1 and first["ports"]["l0"]["1"]["peer"] == "h0"
    act.apply({("l0", 1): Thresholds(3000, 12000, 0.3)})
    doc = json.loads(path.read_text())
    assert doc["version"] == 2
    assert doc["ports"]["l0"]["1"] == {"peer": "h0", "kmin": 3000, "kmax": 12000, "pmax": 0.3}
    assert doc["ports"]["l0"]["2"] == first["ports"]["l0"]["2"]
    assert [p.name for p in tmp_path.iterdir()] == ["ecn.json"]       # no temporary file left


class FakeStage:
    mechanism = "bpf"

    def __init__(self):
        from types import SimpleNamespace
        self.ports = {"l0-eth1": SimpleNamespace(switch="l0", port=1), "l0-eth9": SimpleNamespace(switch="l0", port=9)}
        self.set: list = []

    def thresholds(self, intf):
        return {"kmin": 6056, "kmax": 24224, "pmax": 0.2000000001, "enabled": True}

    def write(self, per_port, enabled=None):
        self.set.append(dict(per_port))

    def queue_drops(self):
        return {"l0-eth1": 7}

    def counters(self, since=None):
        self.since = since
        return {"l0-eth1": {"bytes": 10, "packets": 2, "ect": 2, "ce_marked": 1, "queue_bytes": 1500,
                            "ce_seen": 0, "max_queue_bytes": 3000, "queue_peak_bytes": 2500}}


def test_emulated_actuator_writes_the_stage_per_interface_of_the_fabric_ports():
    stage = FakeStage()
    act = actuators.EmulatedActuator(stage, PORTS)
    assert act.current() == {("l0", 1): Thresholds(6056, 24224, 0.2)}
    act.apply({("l0", 1): Thresholds(3000, 12000, 0.3)})
    assert stage.set == [{"l0-eth1": Thresholds(3000, 12000, 0.3)}]
    assert act.counters()[("l0", 1)] == StageCounters(bytes=10, packets=2, ect=2, ce_marked=1, queue_bytes=1500,
                                                      drops=7, queue_peak_bytes=2500)   # the port buffer's drops


def test_emulated_actuator_reads_each_queue_peak_since_its_previous_read():
    stage = FakeStage()
    act = actuators.EmulatedActuator(stage, PORTS)
    act.counters(10.0)
    assert stage.since is None                  # the first read: as far back as the stage keeps peaks
    act.counters(10.2)
    assert stage.since == 10.0


def test_a_sample_carries_the_queue_peak_of_its_interval_once():
    t = Telemetry(PORTS, 0.2)
    t.stage_counters(1.0, {("l0", 1): StageCounters(bytes=0, packets=0, queue_bytes=100, queue_peak_bytes=9000)})
    assert t.sample(1.0)[("l0", 1)].queue_peak_bytes == 9000
    assert t.sample(1.2)[("l0", 1)].queue_peak_bytes is None       # no read in that interval: no peak


def test_a_bad_actuator_is_one_line():
    with pytest.raises(UserError, match="file:PATH"):
        actuators.check_spec("sonic")


# ---- Prometheus and the Grafana dashboard ------------------------------------------------------------------

def _exported_loop():
    from hpnlab.controller.metrics import Metrics
    loop = ecn_loop.EcnLoop(Telemetry(PORTS, 0.2), HalvingPolicy(), "none")
    loop.telemetry.port_stats("l0", 0.8, [OfPortStats(1, tx_bytes=0, tx_dropped=0)])
    loop.telemetry.port_stats("l0", 1.0, [OfPortStats(1, tx_bytes=125_000, tx_dropped=2)])
    loop.telemetry.stage_counters(1.0, {("l0", 1): StageCounters(queue_bytes=4000, queue_peak_bytes=6000)})
    loop.tick(1.0, ["l0"])
    m = Metrics()
    m.update_ports(loop)
    from prometheus_client import generate_latest
    return loop, generate_latest(m.registry).decode()


def test_prometheus_exports_per_port_gauges_labelled_switch_port_peer():
    loop, text = _exported_loop()
    assert 'hpnlab_port_utilisation{peer="h0",port="1",switch="l0"} 0.5' in text
    assert 'hpnlab_port_drops_total{peer="h0",port="1",switch="l0"} 2.0' in text
    assert 'hpnlab_port_queue_peak_bytes{peer="h0",port="1",switch="l0"} 6000.0' in text
    assert f'hpnlab_port_ecn_kmin_bytes{{peer="h0",port="1",switch="l0"}} {float(loop.current[("l0", 1)].kmin)}' in text
    assert f"hpnlab_ecn_threshold_changes_total {float(loop.n_changes)}" in text


def test_every_metric_the_grafana_dashboard_queries_is_exported():
    import re
    from pathlib import Path

    import hpnlab.controller
    dashboard = Path(hpnlab.controller.__file__).parent / "grafana" / "hpnlab-ecn.json"
    doc = json.loads(dashboard.read_text())
    queried = {name for p in doc["panels"] for t in p["targets"] for name in re.findall(r"hpnlab_\w+", t["expr"])}
    _, text = _exported_loop()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("hpnlab_")}
    assert queried and queried <= exported, queried - exported


# ---- the harness's side: live policy requests, the run's telemetry key ----------------------------------------

def test_a_policy_request_returns_once_the_controller_acknowledges_it(tmp_path):
    import threading

    from hpnlab.fabric.emulation.controller_process import request_policy
    control = tmp_path / "ecn-policy.json"
    loop = ecn_loop.EcnLoop(Telemetry(PORTS, 0.2), ecn_policy.StaticPolicy(), "none", control=str(control))
    stop = threading.Event()

    def controller():
        t = 0.0
        while not stop.is_set():
            t += 0.2
            loop.tick(t, [])
            stop.wait(0.02)
    th = threading.Thread(target=controller)
    th.start()
    try:
        request_policy(control, "dynamic", timeout_s=5)
    finally:
        stop.set()
        th.join()
    assert loop.policy.name == "dynamic"


def test_a_policy_request_nobody_answers_is_one_clear_error(tmp_path):
    from hpnlab.fabric.emulation.controller_process import ControllerError, request_policy
    with pytest.raises(ControllerError, match="did not take ECN policy 'dynamic'"):
        request_policy(tmp_path / "ecn-policy.json", "dynamic", timeout_s=0.2)


def test_the_runs_telemetry_is_the_part_of_the_file_within_the_run(tmp_path):
    from types import SimpleNamespace

    from hpnlab.fabric.experiments import runner as experiment
    f = tmp_path / "telemetry.jsonl"
    rows = [{"switch": "l0", "port": 1, "peer": "h0", "tx_mbps": 1.0}]
    f.write_text("\n".join(json.dumps(x) for x in [
        {"kind": "header", "policy": "static", "interval_ms": 200},
        {"kind": "sample", "t": 5.0, "ports": rows},
        {"kind": "policy", "t": 9.0, "policy": "dynamic", "previous": "static"},
        {"kind": "sample", "t": 10.0, "ports": rows},
        {"kind": "change", "t": 10.1, "switch": "l0", "port": 1, "reason": "r"},
        {"kind": "sample", "t": 10.2, "ports": rows},
        {"kind": "sample", "t": 20.0, "ports": rows}]) + "\n{\"kind\": \"sam")      # a line being written
    tel = experiment.telemetry_of(SimpleNamespace(controller=SimpleNamespace(telemetry_file=f)), 9.5, 11.0)
    assert tel is not None
    assert tel["samples"] == 2 and tel["ports"]["l0:1"]["t"] == [0.0, 0.2]
    assert tel["policy"] == "dynamic" and [c["reason"] for c in tel["changes"]] == ["r"]
    assert experiment.telemetry_of(SimpleNamespace(controller=SimpleNamespace(telemetry_file=tmp_path / "none")),
                                   0, 1) is None


# ---- a deployment's port numbers (--deployment FILE or auto) ------------------------------------------------

ADOPTED = {("l0", 101): PortInfo("l0", 101, "h0", RATE), ("l0", 102): PortInfo("l0", 102, "h1", RATE),
           ("l0", 103): PortInfo("l0", 103, "s0", 2 * RATE), ("s0", 101): PortInfo("s0", 101, "l0", 2 * RATE)}
TO_ADOPTED = {k: (k[0], k[1] + 100) for k in PORTS}


def _stage_loop(ports, stage_keys=None):
    stage = FakeStage()
    loop = ecn_loop.EcnLoop(Telemetry(ports, 0.2), ecn_policy.StaticPolicy(), "emulated",
                            open_stage=lambda run: stage, stage_keys=stage_keys)
    return loop, stage


def test_port_renumbering_follows_a_deployment_onto_foreign_numbers(tmp_path):
    import yaml

    from hpnlab.controller import deployment
    from hpnlab.fabric.emulation.rewire import Rewire
    from hpnlab.fabric.emulation.rewire import deployment as rewire_deployment
    g = graph.build(spec.load("mini-hpn"))
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(rewire_deployment(g, Rewire(port_offset=100))))
    moved = telemetry.port_renumbering(g, deployment.apply(g, deployment.load(g, path)))
    assert moved == {k: (k[0], k[1] + 100) for k in telemetry.fabric_ports(g)}


def test_after_adoption_samples_come_from_the_stage_under_the_adopted_numbers():
    loop, stage = _stage_loop(PORTS)
    loop.tick(1.0, ["l0"])
    assert loop.last[("l0", 1)].queue_bytes == 1500            # the stage, on the scenario's numbers
    loop.rebase(ADOPTED, TO_ADOPTED, TO_ADOPTED)
    loop.tick(1.2, ["l0"])
    assert loop.last[("l0", 101)].queue_bytes == 1500          # the same interface, read under its new number
    assert ("l0", 1) not in loop.last
    loop.apply(1.4, {("l0", 101): Thresholds(3000, 12000, 0.3)})
    assert list(stage.set[-1]) == ["l0-eth1"]
    assert loop.current[("l0", 101)] == Thresholds(3000, 12000, 0.3)


def test_a_stage_found_on_a_fabric_already_on_deployment_numbers_is_read_under_them():
    loop, _stage = _stage_loop(ADOPTED, TO_ADOPTED)
    loop.tick(1.0, ["l0"])
    assert loop.last[("l0", 101)].queue_bytes == 1500
    assert loop.current[("l0", 101)] == Thresholds(6056, 24224, 0.2)


def test_without_the_renumbering_the_stage_is_not_read_on_foreign_numbers():
    """What the renumbering fixes: the stage knows its ports by the scenario's numbers."""
    loop, _stage = _stage_loop(ADOPTED)
    loop.tick(1.0, ["l0"])
    assert loop.last[("l0", 101)].queue_bytes is None
