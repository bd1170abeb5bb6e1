"""Priority flow control on the controller's Prometheus page (controller/pfc_metrics.py): a reading of
the emulation's PFC stage as metric families, and the collector that finds the stage."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hpnlab.controller.pfc_metrics import PfcCollector, families

COUNTERS = {
    "p0l0-eth5": {"node": "p0l0", "switch_port": True, "pauses_sent": 7, "paused_s": 1.5, "paused_now": 1,
                  "headroom_drops": 0, "lossy_drops": 2, "ingress_bytes": 3000, "headroom_peak": 1514,
                  "pauses_received": 4},
    "h1-eth0": {"node": "h1", "switch_port": False, "pauses_received": 9},
}
SWITCHES = {"p0l0": {"shared_used": 1200, "shared_bytes": 272520, "shared_peak": 0, "total_bytes": 0}}
AGENT = {"cpu_s": 0.25, "storms": 1, "pause_reaction_us": {"median": 40.0, "p99": 180.0}}


class _Stage:
    def __init__(self, fail: bool = False):
        self.fail = fail

    def counters(self):
        if self.fail:
            raise OSError("the run ended")
        return COUNTERS

    def switches(self):
        return SWITCHES

    def agent_stats(self):
        return AGENT


def _scrape(collector) -> dict:
    registry = CollectorRegistry()
    registry.register(collector)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_switch_port_and_transmitter_has_its_pause_series():
    got = _scrape(PfcCollector("run", lambda _r: _Stage()))
    port = (("port", "5"), ("switch", "p0l0"))
    assert got[("hpnlab_pfc_pauses_sent_total", port)] == 7
    assert got[("hpnlab_pfc_paused_seconds_total", port)] == 1.5
    assert got[("hpnlab_pfc_paused", port)] == 1
    assert got[("hpnlab_pfc_pauses_received_total", (("intf", "h1-eth0"), ("node", "h1")))] == 9
    assert got[("hpnlab_pfc_shared_used_bytes", (("switch", "p0l0"),))] == 1200
    assert got[("hpnlab_pfc_pause_reaction_seconds", (("quantile", "0.99"),))] == 180e-6


def test_without_a_stage_the_page_has_no_pfc_series_and_is_looked_for_again_later():
    calls = []
    now = [0.0]
    collector = PfcCollector("run", lambda r: calls.append(r), clock=lambda: now[0])
    assert _scrape(collector) == {} and _scrape(collector) == {} and calls == ["run"]
    now[0] = 10.0
    _scrape(collector)
    assert calls == ["run", "run"]


def test_a_stage_that_fails_is_dropped_and_nothing_is_shown():
    assert _scrape(PfcCollector("run", lambda _r: _Stage(fail=True))) == {}


def test_families_of_a_reading_without_agent_figures_leave_the_agent_out():
    names = {f.name for f in families(COUNTERS, SWITCHES, {})}
    assert "hpnlab_pfc_agent_cpu_seconds" not in names and "hpnlab_pfc_pauses_sent" in names


def test_every_metric_the_pfc_dashboard_queries_is_exported():
    import json
    import re
    from pathlib import Path

    import hpnlab.controller
    doc = json.loads((Path(hpnlab.controller.__file__).parent / "grafana" / "hpnlab-pfc.json").read_text())
    queried = {n for p in doc["panels"] for t in p["targets"] for n in re.findall(r"hpnlab_\w+", t["expr"])}
    queried |= {n for v in doc["templating"]["list"] for n in re.findall(r"hpnlab_\w+", v.get("definition", ""))}
    exported = {s.name for f in families(COUNTERS, SWITCHES, AGENT) for s in f.samples}
    assert queried and queried <= exported, queried - exported
