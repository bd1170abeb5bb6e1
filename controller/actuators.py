"""Where the controller's ECN thresholds go: one interface, three implementations.

    class Actuator:
        def current(self) -> dict[PortKey, Thresholds]     # what is in force now (read once at start)
        def apply(self, changes: dict[PortKey, Thresholds]) -> None   # only what changed

``emulated`` (:class:`EmulatedActuator`)
    writes the emulated switches' ECN stage live (``hpnlab.fabric.emulation.ecn.EcnStage``,
    opened from the controller process, which runs as root on the same machine):
    ``write``, the stage's one writer of port ECN state, for both mechanisms the stage has (``bpf``:
    a BPF map entry; ``red``: ``tc qdisc change``). It also reads the stage's counters for the telemetry
    (:meth:`EmulatedActuator.counters`).
``file:PATH`` (:class:`FileActuator`)
    for real switches: a JSON file of every port's settings, rewritten atomically (write a
    temporary file, fsync, rename) on every change. It is *not* a switch driver: an agent on
    each switch (or a config-management job) reads the file and applies it, e.g. as a SONiC
    ``WRED_PROFILE`` (``ecn_ecn``, ``green_min_threshold`` = kmin, ``green_max_threshold`` = kmax,
    ``green_drop_probability`` = pmax x 100) bound to the port's queue. The file::

        {"version": 7, "updated_unix": 1764538123.4, "unit": "bytes",
         "ports": {"p0l0": {"5": {"peer": "p0s0", "kmin": 6056, "kmax": 24224, "pmax": 0.2}, ...}, ...}}

``none`` (:class:`NullActuator`)
    decisions are logged and written to the telemetry file, nothing is applied (a dry run).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing.telemetry import PortInfo, PortKey, StageCounters
from hpnlab.fabric.workload.ecn import Thresholds, default_thresholds

LOG = logging.getLogger("hpnlab.controller.ecn")
ACTUATORS = ("auto", "emulated", "file:PATH", "none")
DROPS_EVERY_S = 1.0       # one `tc -s -j qdisc show` of every port


class Actuator(Protocol):
    name: str

    def current(self) -> dict[PortKey, Thresholds]: ...

    def apply(self, changes: Mapping[PortKey, Thresholds]) -> None: ...


class NullActuator:
    """Applies nothing; the thresholds in force are the start-up defaults of every port."""

    name = "none"

    def __init__(self, ports: Mapping[PortKey, PortInfo], mtu: int = 1500):
        self.ports = dict(ports)
        self.mtu = mtu

    def current(self) -> dict[PortKey, Thresholds]:
        return {k: default_thresholds(p.rate_bps, self.mtu) for k, p in self.ports.items()}

    def apply(self, changes: Mapping[PortKey, Thresholds]) -> None:
        return None


class FileActuator(NullActuator):
    """Every port's settings as one JSON file, replaced atomically on each change (see the module docstring)."""

    def __init__(self, path: str | Path, ports: Mapping[PortKey, PortInfo], mtu: int = 1500):
        super().__init__(ports, mtu)
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise UserError(f"--ecn-actuator file:{self.path}: directory {self.path.parent} does not exist")
        self.name = f"file:{self.path}"
        self.settings = super().current()
        self.version = 0
        self._write()

    def current(self) -> dict[PortKey, Thresholds]:
        return dict(self.settings)

    def apply(self, changes: Mapping[PortKey, Thresholds]) -> None:
        if not changes:
            return
        self.settings.update(changes)
        self._write()

    def document(self) -> dict[str, Any]:
        ports: dict[str, dict[str, Any]] = {}
        for (sw, port), th in sorted(self.settings.items()):
            peer = self.ports[(sw, port)].peer if (sw, port) in self.ports else ""
            ports.setdefault(sw, {})[str(port)] = {"peer": peer, **th.as_dict()}
        return {"version": self.version, "updated_unix": round(time.time(), 3), "unit": "bytes", "ports": ports}

    def _write(self) -> None:
        self.version += 1
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.document(), f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class EmulatedActuator:
    """The emulated switches' ECN stage (``EcnStage``), written live and read for counters."""

    name = "emulated"

    def __init__(self, stage: Any, ports: Mapping[PortKey, PortInfo],
                 stage_keys: Mapping[PortKey, PortKey] | None = None):
        self.stage = stage
        self._drops: dict[str, int] = {}
        self._drops_at: float | None = None
        self._read_at: float | None = None       # the last read (monotonic s): the queue peaks start there
        self.intf: dict[PortKey, str] = {}
        self.rekey(ports, stage_keys)

    def rekey(self, ports: Mapping[PortKey, PortInfo], stage_keys: Mapping[PortKey, PortKey] | None = None) -> None:
        """Which fabric port each of the stage's interfaces is: the stage knows its ports by the scenario's
        numbers; ``stage_keys`` (scenario key -> key in ``ports``) follows a deployment's numbers."""
        keys = stage_keys or {}
        self.intf = {}
        for intf, p in self.stage.ports.items():
            key = keys.get((p.switch, p.port), (p.switch, p.port))
            if key in ports:
                self.intf[key] = intf

    def current(self) -> dict[PortKey, Thresholds]:
        out = {}
        for key, intf in self.intf.items():
            th = self.stage.thresholds(intf)
            out[key] = Thresholds(int(th["kmin"]), int(th["kmax"]), round(float(th["pmax"]), 4))
        return out

    def apply(self, changes: Mapping[PortKey, Thresholds]) -> None:
        """The changes through the stage's one writer of port ECN state (``EcnStage.write``)."""
        per_intf: dict[str, Thresholds] = {}
        for key, th in changes.items():
            intf = self.intf.get(key)
            if intf is None:
                LOG.warning("no ECN stage on %s port %d: change not applied", *key)
                continue
            per_intf[intf] = th
        if per_intf:
            self.stage.write(per_intf)

    def counters(self, now: float | None = None) -> dict[PortKey, StageCounters]:
        """The stage's counters per fabric port, with the port buffers' drops (read at most every
        ``DROPS_EVERY_S``: one netlink dump of every qdisc costs more than the marker's map reads)
        and each queue's peak since the previous read (``now``: ``time.monotonic()``)."""
        raw = self.stage.counters(since=self._read_at)
        self._read_at = now
        if now is None or self._drops_at is None or now - self._drops_at >= DROPS_EVERY_S:
            try:
                self._drops = self.stage.queue_drops()
            except (OSError, ValueError, AttributeError):
                self._drops = {}
            self._drops_at = now
        out = {}
        for key, intf in self.intf.items():
            c = raw.get(intf) or {}
            out[key] = StageCounters(bytes=int(c.get("bytes") or 0), packets=int(c.get("packets") or 0),
                                     ect=int(c.get("ect") or 0), ce_marked=int(c.get("ce_marked") or 0),
                                     queue_bytes=int(c.get("queue_bytes") or 0),
                                     queue_peak_bytes=None if c.get("queue_peak_bytes") is None
                                     else int(c["queue_peak_bytes"]),
                                     drops=int(self._drops.get(intf, c.get("drops") or 0)))
        return out

    def close(self) -> None:
        self.stage.close()


#: the entry-point group through which ECN stages are found: the controller writes thresholds to
#: whatever stage is installed under the name ``emulated`` (hpnlab's own, the emulation's
#: ``hpnlab.fabric.emulation.ecn:EcnStage``, declared in setup.cfg) without importing the emulation
STAGE_GROUP = "hpnlab.ecn_stages"


def stage_class(name: str = "emulated") -> Any | None:
    """The ECN stage class installed under ``name`` in :data:`STAGE_GROUP` (None: none is)."""
    found = [ep for ep in entry_points(group=STAGE_GROUP) if ep.name == name]
    return found[0].load() if found else None


def open_stage(run_id: str | None) -> Any | None:
    """The live emulation's ECN stage (this run's when ``run_id`` is given), or None when there is none yet."""
    try:
        cls = stage_class()
        return None if cls is None else cls.open(run_id)
    except (UserError, OSError, FileNotFoundError, ValueError, KeyError):
        return None


def check_spec(spec: str) -> str:
    """The actuator spec, checked (one line for a bad one)."""
    if spec in ("auto", "emulated", "none") or (spec.startswith("file:") and len(spec) > 5):
        return spec
    raise UserError(f"--ecn-actuator {spec!r}: one of auto, emulated, file:PATH, none")
