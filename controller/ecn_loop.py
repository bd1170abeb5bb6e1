"""The dynamic-ECN control loop: telemetry tick -> policy -> actuator, only differences sent.

No os-ken: ``controller/app.py`` calls :meth:`EcnLoop.tick` every telemetry interval with the
connected switches (and sends the port statistics requests it returns), and
:meth:`EcnLoop.port_stats` with each decoded reply. Each tick: read the ECN stage's counters
(when an emulated stage is there), take one telemetry sample per egress port, ask the policy,
keep what differs from the thresholds in force (:func:`ecn_policy.changes`), apply that through
the actuator, log every change with its reason and write the sample and the changes to the
telemetry file (JSON lines; ``fabric/routing/telemetry.py`` reads it back into a run's JSON).

The policy can be replaced while the controller runs (the emulation harness does it between
the runs of one experiment, ``Emulation.set_ecn_policy``): the harness writes
``{"policy": NAME, "seq": N}`` to the control file (``--ecn-control``); the next tick loads it,
puts every port back to its start-up thresholds, and answers in ``<control file>.ack`` with
``{"seq": N, "policy": NAME, "error": null or one line}``.

Priority flow control: where the run has a PFC stage (``--pfc on``; with the ``auto`` or ``emulated`` actuator
and ``open_pfc`` given, as the controller gives ``pfc_metrics.open_stage``: the entry point
``controller/pfc_metrics.py`` uses), looked for again every ``PFC_RETRY_S`` until found), each
tick also reads its counters, so that every sample carries the pause figures
(``fabric/routing/telemetry.py``: ``paused_fraction``, ``pausing_fraction``...) and a policy can use
pause as a signal (``pfc-aware``); the telemetry file records them, so a replay sees them too.

The actuator may appear late: the emulation harness starts the controller before the switches
and their ECN stage exist, so with ``auto`` or ``emulated`` the loop looks for the run's stage
(at most once a second) until it finds it; until then nothing is applied (``auto`` runs as
``none``; ``emulated`` waits).
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from hpnlab.controller import actuators, ecn_policy
from hpnlab.fabric.routing import telemetry
from hpnlab.fabric.routing.telemetry import OfPortStats, PortInfo, PortKey, PortStatsRequest, PortTelemetry, Telemetry

from .control_file import ControlFile
from .ecn_policy import EcnPolicy, Thresholds

LOG = logging.getLogger("hpnlab.controller.ecn")
STAGE_RETRY_S = 1.0
PFC_RETRY_S = 5.0        # a lossy run has no PFC stage: looked for rarely


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (the stage's ``tc`` calls)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class EcnLoop:
    def __init__(self, tel: Telemetry, policy: EcnPolicy, actuator_spec: str = "auto", mtu: int = 1500,
                 out: IO[str] | None = None, run_id: str | None = None,
                 open_stage: Callable[[str | None], Any] = actuators.open_stage, control: str | None = None,
                 stage_keys: Mapping[PortKey, PortKey] | None = None,
                 open_pfc: Callable[[str | None], Any] | None = None):
        self.telemetry = tel
        #: the emulated stage's port (scenario numbers) -> the fabric port telemetry keys it by (a deployment's)
        self.stage_keys = dict(stage_keys or {})
        self.policy = policy
        self.spec = actuators.check_spec(actuator_spec)
        self.mtu = mtu
        self.out = out
        self.run_id = run_id
        self._open_stage = open_stage
        self._stage_tried: float | None = None
        self._open_pfc = open_pfc
        self._pfc_tried: float | None = None
        self.pfc: Any = None                           # the run's PFC stage, once found
        self.actuator: Any
        if self.spec.startswith("file:"):
            self.actuator = actuators.FileActuator(self.spec[5:], tel.ports, mtu)
        else:
            self.actuator = actuators.NullActuator(tel.ports, mtu)
        self.current: dict[PortKey, Thresholds] = self.actuator.current()
        self.initial = dict(self.current)              # the start-up thresholds (a policy change restores them)
        self.control = ControlFile(control, "ECN policy") if control else None
        self.changes: list[dict[str, Any]] = []        # every change (bounded: the last 10,000)
        self.n_changes = 0                             # every change ever applied
        self.cpu_s = 0.0                               # CPU seconds spent in ticks and reply decoding
        self.last: dict[PortKey, PortTelemetry] = {}
        self._write({"kind": "header", "policy": policy.name, "spec": policy.spec or policy.name,
                     "interval_ms": round(tel.interval_s * 1000, 3),
                     "actuator": self.spec, "mtu": mtu,
                     "ports": {telemetry.port_key_str(k): {"peer": p.peer, "rate_mbps": p.rate_bps / 1e6}
                               for k, p in tel.ports.items()}})

    @property
    def emulated(self) -> bool:
        return isinstance(self.actuator, actuators.EmulatedActuator)

    def _write(self, line: dict[str, Any]) -> None:
        if self.out is not None:
            self.out.write(json.dumps(line, separators=(",", ":")) + "\n")

    def record(self, line: dict[str, Any]) -> None:
        """One more record in the telemetry file (another loop's, e.g. the routing weights' changes), flushed."""
        self._write(line)
        if self.out is not None:
            self.out.flush()

    def _find_stage(self, now: float) -> None:
        if self.emulated or self.spec not in ("auto", "emulated"):
            return
        if self._stage_tried is not None and now - self._stage_tried < STAGE_RETRY_S:
            return
        self._stage_tried = now
        stage = self._open_stage(self.run_id)
        if stage is None:
            return
        self.actuator = actuators.EmulatedActuator(stage, self.telemetry.ports, self.stage_keys)
        self.current = {**self.current, **self.actuator.current()}
        self.initial = dict(self.current)
        LOG.info("ECN stage found (%s on %d ports): telemetry reads it, policy %s applies to it",
                 stage.mechanism, len(self.actuator.intf), self.policy.name)

    def _find_pfc(self, now: float) -> None:
        if self.pfc is not None or self._open_pfc is None or self.spec not in ("auto", "emulated"):
            return        # the PFC stage is the emulation's, as the ECN stage is: looked for as that one is
        if self._pfc_tried is not None and now - self._pfc_tried < PFC_RETRY_S:
            return
        self._pfc_tried = now
        self.pfc = self._open_pfc(self.run_id)
        if self.pfc is not None:
            LOG.info("PFC stage found: telemetry carries its pause figures")

    def _read_pfc(self, now: float) -> None:
        """The PFC stage's counters to telemetry, under the fabric's port keys; a stage that fails (its run
        ended) is dropped and looked for again."""
        self._find_pfc(now)
        if self.pfc is None:
            return
        try:
            rows = self.pfc.counters()
        except Exception as exc:     # the run ended under us, its maps gone
            LOG.info("PFC stage lost (%s): looking for it again", exc)
            self.pfc = None
            return
        counters = telemetry.pfc_counters(rows)
        self.telemetry.pfc_counters(now, {self.stage_keys.get(k, k): c for k, c in counters.items()})

    def rebase(self, ports: Mapping[PortKey, PortInfo], stage_keys: Mapping[PortKey, PortKey],
               moved: Mapping[PortKey, PortKey]) -> None:
        """The fabric on other port numbers (a deployment adopted at run time): telemetry starts again on
        the new keys (``Telemetry.rebase``), the stage's counters and thresholds are read and written under
        them (``stage_keys``: scenario key -> new key), and the thresholds in force move with their ports
        (``moved``: old key -> new key)."""
        self.telemetry.rebase(ports)
        self.stage_keys = dict(stage_keys)
        self.current = {moved.get(k, k): t for k, t in self.current.items() if moved.get(k, k) in ports}
        self.initial = {moved.get(k, k): t for k, t in self.initial.items() if moved.get(k, k) in ports}
        if self.emulated:
            self.actuator.rekey(ports, self.stage_keys)
            self.current.update(self.actuator.current())     # what the stage holds, now under the new keys
        elif isinstance(self.actuator, actuators.NullActuator):
            self.actuator = actuators.NullActuator(ports, self.mtu)
            self.current = {**self.actuator.current(), **self.current}
            self.initial = {**self.actuator.current(), **self.initial}

    def tick(self, now: float, switches: Iterable[str]) -> list[PortStatsRequest]:
        """One telemetry interval: sample, decide, apply; returns the port statistics requests to send."""
        c0 = _cpu()
        try:
            self._find_stage(now)
            self._check_control(now)
            if self.emulated:
                self.telemetry.stage_counters(now, self.actuator.counters(now))
            self._read_pfc(now)
            samples = self.telemetry.sample(now)
            self.last = samples
            line = telemetry.sample_line(now, samples, self.current, self.telemetry.ports)
            line["cpu_s"] = round(self.cpu_s, 4)         # the loop's CPU so far (before this tick)
            self._write(line)
            if self.spec != "emulated" or self.emulated:
                decided = self.policy.decide(now, samples, self.current)
                self.apply(now, ecn_policy.changes(self.current, decided), samples)
            if self.out is not None:
                self.out.flush()
            return self.telemetry.poll(now, switches)
        finally:
            self.cpu_s += _cpu() - c0

    def set_policy(self, now: float, policy: EcnPolicy) -> None:
        """Replace the policy: every port goes back to its start-up thresholds first."""
        old = self.policy.name
        self.policy = policy
        back = {k: Thresholds(t.kmin, t.kmax, t.pmax, reason=f"policy {old} -> {policy.name}: start-up thresholds")
                for k, t in self.initial.items()}
        self.apply(now, ecn_policy.changes(self.current, back))
        self._write({"kind": "policy", "t": round(now, 4), "policy": policy.name, "spec": policy.spec or policy.name,
                     "previous": old})
        LOG.info("ECN policy %s -> %s", old, policy.name)

    def _check_control(self, now: float) -> None:
        if self.control is not None:
            self.control.poll(lambda req: self.set_policy(now, ecn_policy.load(str(req["policy"]), self.mtu)),
                              lambda: self.policy.name)

    def apply(self, now: float, changes: dict[PortKey, Thresholds],
              samples: dict[PortKey, PortTelemetry] | None = None) -> None:
        if not changes:
            return
        self.actuator.apply(changes)
        for key, new in changes.items():
            old = self.current.get(key)
            info = self.telemetry.ports.get(key)
            line = {"kind": "change", "t": round(now, 4), "switch": key[0], "port": key[1],
                    "peer": info.peer if info else "", "old": old.as_dict() if old else None,
                    "new": new.as_dict(), "reason": new.reason, "policy": self.policy.name,
                    "actuator": self.actuator.name}
            LOG.info("ECN %s port %d (to %s): Kmin %s -> %d B, Kmax %s -> %d B, Pmax %s -> %.2f: %s",
                     key[0], key[1], line["peer"], old.kmin if old else "?", new.kmin, old.kmax if old else "?",
                     new.kmax, f"{old.pmax:.2f}" if old else "?", new.pmax, new.reason)
            self._write(line)
            self.changes.append(line)
            self.n_changes += 1
            self.current[key] = new
        del self.changes[:-10000]

    def port_stats(self, switch: str, now: float, stats: Iterable[OfPortStats], xid: int | None = None) -> None:
        c0 = _cpu()
        self.telemetry.port_stats(switch, now, stats, xid)
        self.cpu_s += _cpu() - c0

    def close(self) -> None:
        if self.emulated:
            self.actuator.close()
        if self.out is not None:
            self.out.flush()
