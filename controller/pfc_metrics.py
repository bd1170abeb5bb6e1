"""Priority flow control on the controller's Prometheus page, read from the emulation's PFC stage at
each scrape (a prometheus_client collector).

The controller never imports the emulation: the stage class is found by name through the entry-point
group ``hpnlab.pfc_stages`` (setup.cfg: ``emulated = hpnlab.fabric.emulation.pfc:PfcStage``), as the
ECN stage is (``actuators.STAGE_GROUP``), and opened for the run the controller belongs to
(``HPNLAB_RUN``). A run without PFC has no stage: the page then has no ``hpnlab_pfc_*`` series.

Series (``switch`` and ``port``: the switch port as the ingress that pauses; ``node`` and ``intf``: the
transmitter that is paused, a switch port or a host NIC):

    hpnlab_pfc_pauses_sent_total{switch,port}        pauses an ingress asked for
    hpnlab_pfc_paused_seconds_total{switch,port}     time it held its upstream paused
    hpnlab_pfc_paused{switch,port}                   1 while it does now
    hpnlab_pfc_pauses_received_total{node,intf}      pauses a transmitter obeyed
    hpnlab_pfc_headroom_drops_total{switch,port}     packets its full headroom dropped
    hpnlab_pfc_lossy_drops_total{switch,port}        lossy packets its egress buffer dropped
    hpnlab_pfc_ingress_bytes{switch,port}            lossless bytes held for it now (headroom included)
    hpnlab_pfc_headroom_peak_bytes{switch,port}      its headroom's peak since the last measurement
    hpnlab_pfc_shared_used_bytes{switch}, hpnlab_pfc_shared_bytes{switch}   the shared buffer, used and size
    hpnlab_pfc_agent_cpu_seconds_total, hpnlab_pfc_pause_reaction_seconds{quantile}, hpnlab_pfc_watchdog_storms_total
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

STAGE_GROUP = "hpnlab.pfc_stages"
#: how often a run without a stage (yet) is looked for again
RETRY_S = 5.0


def open_stage(run_id: str | None) -> Any | None:
    """The live run's PFC stage through the entry point, or None (no stage, no emulation, no PFC)."""
    found = [ep for ep in entry_points(group=STAGE_GROUP) if ep.name == "emulated"]
    if not found:
        return None
    try:
        return found[0].load().open(run_id)
    except Exception:       # no live run, no PFC in it, no permission: nothing to show
        return None


#: per switch port: counter key -> (metric type, name after ``hpnlab_pfc_``, help)
PORT_FAMILIES: dict[str, tuple[type[CounterMetricFamily] | type[GaugeMetricFamily], str, str]] = {
    "pauses_sent": (CounterMetricFamily, "pauses_sent", "PFC: pauses this ingress port asked its upstream for"),
    "paused_s": (CounterMetricFamily, "paused_seconds", "PFC: time this ingress port held its upstream paused"),
    "paused_now": (GaugeMetricFamily, "paused", "PFC: 1 while this ingress port holds its upstream paused"),
    "headroom_drops": (CounterMetricFamily, "headroom_drops", "PFC: lossless packets dropped for a full headroom"),
    "lossy_drops": (CounterMetricFamily, "lossy_drops", "Lossy packets this egress port's buffer dropped"),
    "ingress_bytes": (GaugeMetricFamily, "ingress_bytes", "Lossless bytes held for this ingress port now "
                      "(headroom included)"),
    "headroom_peak": (GaugeMetricFamily, "headroom_peak_bytes", "Peak of this ingress port's headroom since the "
                      "last measurement"),
}


def families(counters: Mapping[str, Mapping[str, Any]], switches: Mapping[str, Mapping[str, int]],
             agent: Mapping[str, Any]) -> list[Any]:
    """The metric families of one reading of the stage (pure: plain values in, families out)."""
    lab = ["switch", "port"]
    fams = {key: kind(f"hpnlab_pfc_{name}", text, labels=lab) for key, (kind, name, text) in PORT_FAMILIES.items()}
    received = CounterMetricFamily("hpnlab_pfc_pauses_received", "PFC: pauses this transmitter obeyed",
                                   labels=["node", "intf"])
    for intf, c in sorted(counters.items()):
        if c.get("switch_port"):
            port = intf.rsplit("-eth", 1)[-1]
            for key, fam in fams.items():
                value = c.get(key)
                if value is not None:
                    fam.add_metric([c["node"], port], float(value))
        if c.get("pauses_received") is not None:
            received.add_metric([c["node"], intf], float(c["pauses_received"]))
    used = GaugeMetricFamily("hpnlab_pfc_shared_used_bytes", "The switch's shared buffer in use", labels=["switch"])
    size = GaugeMetricFamily("hpnlab_pfc_shared_bytes", "The switch's shared buffer", labels=["switch"])
    for sw, s in sorted(switches.items()):
        used.add_metric([sw], float(s["shared_used"]))
        size.add_metric([sw], float(s["shared_bytes"]))
    out = [*fams.values(), received, used, size]
    if agent:
        cpu = CounterMetricFamily("hpnlab_pfc_agent_cpu_seconds", "CPU the pause agent used")
        cpu.add_metric([], float(agent.get("cpu_s") or 0.0))
        storms = CounterMetricFamily("hpnlab_pfc_watchdog_storms", "Queues the PFC watchdog stopped pausing")
        storms.add_metric([], float(agent.get("storms") or 0))
        reaction = GaugeMetricFamily("hpnlab_pfc_pause_reaction_seconds", "From Xoff crossed to the upstream "
                                     "gate closed, by quantile (the agent's histogram)", labels=["quantile"])
        for q, key in (("0.5", "median"), ("0.99", "p99")):
            value = (agent.get("pause_reaction_us") or {}).get(key)
            if value is not None:
                reaction.add_metric([q], value / 1e6)
        out += [cpu, storms, reaction]
    return out


class PfcCollector:
    """Reads the stage at each scrape; looks for it again at most every ``RETRY_S`` while there is none."""

    def __init__(self, run_id: str | None, opener: Callable[[str | None], Any] = open_stage,
                 clock: Callable[[], float] = time.monotonic):
        self.run_id = run_id
        self._open = opener
        self._clock = clock
        self._stage: Any = None
        self._next_try = 0.0

    def collect(self) -> Iterable[Any]:
        if self._stage is None and self._clock() >= self._next_try:
            self._stage = self._open(self.run_id)
            self._next_try = self._clock() + RETRY_S
        if self._stage is None:
            return []
        try:
            return families(self._stage.counters(), self._stage.switches(), self._stage.agent_stats())
        except Exception:       # the run ended under us: look for a stage again later
            self._stage = None
            return []
