"""ECN marking stage on every switch egress port, with live thresholds and readable counters.

Two mechanisms, chosen by ``hpnlab.fabric.emulation.kernel.Capabilities.ecn_mechanism``:

``bpf`` (this machine)
    ``bpf/ecn_marker.bpf.c``, compiled with clang at run time into a cache directory, loaded
    once with bpftool and pinned under ``/sys/fs/bpf/hpnlab-<run id>/``, attached as a tc
    clsact *egress* filter (direct action) on every switch port. Per port (key: ifindex) it
    keeps a virtual queue drained at the port's shaped rate and marks CE on ECT packets
    between Kmin and Kmax with probability rising to Pmax (always at or above Kmax): the
    RED/DCQCN profile. Thresholds are a BPF map entry (changed live); counters are another.
``red`` (kernels with sch_red)
    the port buffer under the htb class becomes ``red ... ecn`` with the same Kmin/Kmax/Pmax;
    a live change is ``tc qdisc change``; counters come from ``tc -s -j qdisc`` (marked,
    bytes, packets, backlog). ECT/CE-seen are not counted by RED (reported as None).

Every port starts at the one default rule (``hpnlab.fabric.workload.ecn.default_thresholds``:
Kmin = max(4 frames, 2 ms at the port rate), Kmax = 4 Kmin, Pmax 0.2).

The one writer of a port's ECN and shaping state once the run is up: :meth:`EcnStage.write`
(thresholds, :class:`~hpnlab.fabric.workload.ecn.Thresholds` per port) and :func:`reshape` (a
port's rate: its htb classes, and the marker's rate and default thresholds). The controller's
``emulated`` actuator, the static settings of a run (``hpnlab run --ecn``) and the routing
comparison's asymmetric fabric all go through them.

Python API (for tests, tools and a controller-side dynamic-ECN feature)::

    stage = emu.ecn                      # or EcnStage.open() from another process (root)
    stage.ports                          # intf -> EcnPort(switch, port, ifindex, rate_mbps, ...)
    stage.thresholds("p0l0-eth1")        # {"kmin": bytes, "kmax": bytes, "pmax": 0..1, "enabled"}
    stage.write({"p0l0-eth1": Thresholds(3000, 12000, 0.5)})   # live, per port
    stage.set_thresholds(kmin=3000, kmax=12000, pmax=0.5, ports=["p0l0-eth1"])  # the same; ports=None: all
    reshape(replace(port_shape(p, 1500, delay=False), rate_mbps=5.0), stage)  # the port's htb classes to
                                         # 5 Mbit/s, its marker and defaults with it (p: a switch_ports entry)
    stage.counters("p0l0-eth1")          # {"bytes", "packets", "ect", "ce_marked", "ce_seen",
                                         #  "queue_bytes", "max_queue_bytes", "queue_peak_bytes"}
    stage.counters(since=t)              # queue_peak_bytes: the peak since time.monotonic() t (<= 640 ms)
    stage.counters()                     # every port
    stage.reset_counters()
    stage.queue_drops()                  # {intf: packets the port's buffer dropped} (cumulative)
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hpnlab.fabric.scenario.rates import frame_bytes
from hpnlab.fabric.workload.ecn import Thresholds, default_thresholds

from ..bpf import BpfMap
from ..errors import UserError
from .shaping import Shape, data_class, port_shape, rate_change_lines
from .state import RUN_DIR, all_runs

SOURCE = Path(__file__).resolve().parent / "bpf" / "ecn_marker.bpf.c"
BPFFS = Path("/sys/fs/bpf")
CFG_MAP, STATE_MAP = "hpn_ecn_cfg", "hpn_ecn_state"
_CFG = struct.Struct("<QIIIIII")      # rate_bps kmin kmax pmax limit enabled pad
PEAK_SLOTS, PEAK_SLOT_NS = 64, 10_000_000       # as in ecn_marker.bpf.c: the peak per 10 ms, the last 640 ms
# lock pad queue last_ns bytes packets ect ce_marked ce_seen max_queue slot_id[64] slot_peak[64]
_STATE = struct.Struct(f"<II8Q{PEAK_SLOTS}I{PEAK_SLOTS}I")
_STATE_ZERO = (0,) * (10 + 2 * PEAK_SLOTS)
PMAX_ONE = 0xFFFFFFFF


def window_peak(slot_ids: Iterable[int], slot_peaks: Iterable[int], since_ns: int, now_ns: int) -> int:
    """The queue's peak over ``[since_ns, now_ns]`` of the monotonic clock from the marker's ring
    of per-slot peaks (pure): the slots whose id (``ktime // PEAK_SLOT_NS``, low 32 bits) falls in
    that span, as far back as the ring reaches (``PEAK_SLOTS`` slots); 0 where none does."""
    now_slot = now_ns // PEAK_SLOT_NS
    span = min(max(0, now_slot - since_ns // PEAK_SLOT_NS), PEAK_SLOTS - 1)
    best = 0
    for sid, peak in zip(slot_ids, slot_peaks, strict=True):
        if (now_slot - sid) % (1 << 32) <= span:
            best = max(best, peak)
    return best


def cache_dir() -> Path:
    base = os.environ.get("HPNLAB_CACHE") or os.environ.get("XDG_CACHE_HOME")
    if base:
        return Path(base) / "hpnlab"
    return Path("/var/cache/hpnlab") if os.geteuid() == 0 else Path.home() / ".cache" / "hpnlab"


def red_args(kmin: int, kmax: int, pmax: float, *, mtu: int, rate_mbps: float, limit_bytes: int) -> list[str]:
    """The ``tc qdisc ... red`` arguments of a RED-with-ECN stage (pure; tested as such)."""
    frame = frame_bytes(mtu)
    # The hard limit is the port's buffer, whatever the thresholds: a live threshold change
    # must not resize the buffer (thresholds above it simply never mark, as on a switch).
    limit = limit_bytes
    # tc-red(8)'s rule of thumb (2 min + max) / (3 avpkt), but never below what tc's EWMA
    # computation accepts: burst >= 1 + min / avpkt (integer division), which the rule of
    # thumb misses by one when kmin == kmax.
    burst = max(1, int((2 * kmin + kmax) / (3 * frame)), 1 + int(kmin) // frame)
    return ["red", "limit", str(int(limit)), "min", str(int(kmin)), "max", str(int(kmax)), "avpkt", str(frame),
            "burst", str(burst), "probability", f"{pmax:g}", "bandwidth", f"{rate_mbps:g}mbit", "ecn"]


def reshape(port: Shape, stage: EcnStage | None = None) -> None:
    """Change a switch port's rate live to ``port.rate_mbps`` (``port``: its start-up shape at the new
    rate, ``shaping.port_shape``), the one writer of its shaping after start-up: every htb class of its
    tree (``shaping.rate_change_lines``) and, when ``stage`` marks on the port, the marker's rate and
    the port's default thresholds at the new rate (:meth:`EcnStage.set_rate`)."""
    lines = rate_change_lines(port)
    r = subprocess.run(["tc", "-batch", "-"], input="\n".join(lines) + "\n", capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"cannot reshape {port.dev}: {r.stderr.strip()[:200]}")
    if stage is not None and port.dev in stage.ports:
        stage.set_rate(port.dev, port.rate_mbps)


# the bpf(2) system call and pinned maps: hpnlab.fabric.bpf (BpfMap is imported from there)


def digest(*parts: bytes) -> str:
    """A cached build's key: its sources and the compiler's version, hashed."""
    return hashlib.sha256(b"".join(parts)).hexdigest()[:16]


def cached_build(target: Path, cmd: list[str], what: str, log: Callable[[str], None] = lambda m: None,
                 hint: str = "") -> Path:
    """``target``, built by ``cmd`` + [output file] unless the cache has it already: written under a
    temporary name, then renamed (two runs building at once never see half a file). A failed build is
    one line naming ``what`` (with ``hint`` when the compiler's complaint names bpf)."""
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    r = subprocess.run([*cmd, str(tmp)], capture_output=True, text=True)
    if r.returncode != 0:
        why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit code {r.returncode}"
        raise UserError(f"compiling {what} failed: {why}{hint if 'bpf' in why else ''}")
    os.replace(tmp, target)
    log(f"compiled {what} into {target}")
    return target


def clang_and_version(needed_for: str) -> tuple[str, bytes]:
    """clang's path and its ``--version`` (part of every cached build's key), or a one-line UserError."""
    clang = shutil.which("clang")
    if not clang:
        raise UserError(f"clang is needed for {needed_for}: sudo apt-get install clang llvm libbpf-dev "
                        "(or run 'make install')")
    return clang, subprocess.run([clang, "--version"], capture_output=True, text=True).stdout.encode()


def bpf_target_args(clang: str) -> list[str]:
    """clang's arguments for a BPF object of this machine's headers."""
    return [clang, "-O2", "-g", "-target", "bpf", f"-I/usr/include/{platform.machine()}-linux-gnu"]


def compile_marker(log: Callable[[str], None] = lambda m: None) -> Path:
    """Compile the marker (once per source and clang version) into the cache; return the object."""
    clang, version = clang_and_version("the ECN marking stage")
    return cached_build(cache_dir() / "bpf" / f"ecn_marker-{digest(SOURCE.read_bytes(), version)}.o",
                        [*bpf_target_args(clang), "-c", str(SOURCE), "-o"], "the ECN marker", log)


def ensure_bpffs() -> bool:
    """Mount bpffs at /sys/fs/bpf if it is not mounted. Returns True when this call mounted it."""
    mounts = Path("/proc/mounts").read_text().split("\n")
    if any(len(m.split()) > 2 and m.split()[1] == str(BPFFS) and m.split()[2] == "bpf" for m in mounts):
        return False
    r = subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"cannot mount bpffs at {BPFFS}: {r.stderr.strip()}")
    return True


def load_pinned(obj: Path, state: Any, name: str, what: str, every_program: bool = False) -> Path:
    """Load the BPF object ``obj`` as tc classifier(s) with bpftool, its program (``prog``; every one of
    them under ``progs/`` with ``every_program``) and its maps (``maps/``) pinned under bpffs
    ``/sys/fs/bpf/<name>`` (mounted first if it is not; the pins recorded in the run's ``state`` for the
    clean-up). Returns the pin directory; a failed load is one line naming ``what``."""
    if ensure_bpffs():
        state.notes["mounted_bpffs"] = True
    pin_dir = BPFFS / name
    state.add_bpf_pin(str(pin_dir))
    pin_dir.mkdir(parents=True, exist_ok=True)
    verb, progs = ("loadall", "progs") if every_program else ("load", "prog")
    r = subprocess.run(["bpftool", "prog", verb, str(obj), str(pin_dir / progs), "type", "classifier",
                        "pinmaps", str(pin_dir / "maps")], capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"loading {what} failed: {r.stderr.strip()[-300:]}")
    return pin_dir


@dataclass
class EcnPort:
    intf: str
    switch: str
    port: int
    ifindex: int
    rate_mbps: float
    limit_bytes: int
    #: the htb class whose leaf is the port buffer (``shaping.data_class``): 1:11 beside a control class
    data_class: str = "1:1"


class EcnStage:
    """The ECN stage of one emulation run (see the module docstring)."""

    def __init__(self, mechanism: str, ports: dict[str, EcnPort], pin_dir: Path | None, mtu: int = 1500):
        self.mechanism = mechanism
        self.ports = ports
        self.pin_dir = pin_dir
        self.mtu = mtu
        self._cfg: BpfMap | None = None
        self._state: BpfMap | None = None
        self._red: dict[str, dict[str, Any]] = {}
        if mechanism == "bpf" and pin_dir is not None:
            self._cfg = BpfMap(pin_dir / "maps" / CFG_MAP, _CFG)
            self._state = BpfMap(pin_dir / "maps" / STATE_MAP, _STATE)

    # -- set-up by the harness -------------------------------------------------------
    @classmethod
    def for_emulation(cls, emu, mechanism: str, pfc_pins: Path | None = None) -> EcnStage:
        """The stage of a run. ``pfc_pins``: priority flow control's pins (``pfc.PfcStage.pin_dir``), whose
        data path marks on the real occupancy of every egress queue through these same maps: nothing
        is loaded or attached here then, the default thresholds are written into its maps."""
        mtu = emu.scenario.emulation.mtu
        ports = {}
        for p in emu.switch_ports():
            if not p["local"]:
                continue
            shape = port_shape(p, mtu, delay=False)
            ports[p["intf"]] = EcnPort(p["intf"], p["switch"], p["port"], socket.if_nametoindex(p["intf"]),
                                       p["rate_mbps"], shape.max_queued_bytes, data_class(shape))
        state = emu.state
        if pfc_pins is not None:
            mechanism = "bpf"
            stage = cls("bpf", ports, pfc_pins, mtu)
            stage._start_at_defaults()
        elif mechanism == "bpf":
            pin_dir = load_pinned(compile_marker(emu.log), state, f"hpnlab-{state.run_id}", "the ECN marker")
            stage = cls("bpf", ports, pin_dir, mtu)
            stage._start_at_defaults()
            lines = []
            for intf in ports:
                lines.append(f"qdisc add dev {intf} clsact")
                lines.append(f"filter add dev {intf} egress bpf da object-pinned {pin_dir / 'prog'}")
            r = subprocess.run(["tc", "-batch", "-"], input="\n".join(lines) + "\n", capture_output=True, text=True)
            if r.returncode != 0:
                raise UserError(f"attaching the ECN marker failed: {r.stderr.strip()[-300:]}")
        elif mechanism == "red":
            stage = cls("red", ports, None, mtu)
            for port in ports.values():
                stage._apply_red(port, default_thresholds(port.rate_mbps * 1e6, mtu), True, "replace")
        else:
            raise UserError(f"unknown ECN mechanism {mechanism!r}")
        (state.run_dir / "ecn.json").write_text(json.dumps(
            {"mechanism": mechanism, "pin_dir": str(stage.pin_dir) if stage.pin_dir else None, "mtu": mtu,
             "ports": {k: asdict(v) for k, v in ports.items()}}, indent=1))
        return stage

    @classmethod
    def open(cls, run_id: str | None = None) -> EcnStage:
        """The ECN stage of a live run (the only one, or ``run_id``), from another process."""
        runs = [r for r in all_runs() if (run_id is None or r.run_id == run_id) and r.owner_alive()]
        if not runs:
            raise UserError("no live hpnlab emulation" + (f" with run id {run_id}" if run_id else ""))
        info = json.loads((RUN_DIR / runs[-1].run_id / "ecn.json").read_text())
        ports = {k: EcnPort(**v) for k, v in info["ports"].items()}
        return cls(info["mechanism"], ports, Path(info["pin_dir"]) if info["pin_dir"] else None, info["mtu"])

    def defaults_description(self) -> str:
        rates = sorted({p.rate_mbps for p in self.ports.values()})
        parts = []
        for r in rates:
            th = default_thresholds(r * 1e6, self.mtu)
            parts.append(f"{r:g} Mbit/s: Kmin {th.kmin} B, Kmax {th.kmax} B, Pmax {th.pmax:g}")
        return f"{self.mechanism} on {len(self.ports)} switch egress ports; " + "; ".join(parts)

    # -- thresholds --------------------------------------------------------------------------
    def _maps(self) -> tuple[BpfMap, BpfMap]:
        """The pinned (config, state) maps of the eBPF marker (only that mechanism has them)."""
        if self._cfg is None or self._state is None:
            raise UserError(f"the {self.mechanism} ECN stage has no eBPF maps")
        return self._cfg, self._state

    def _start_at_defaults(self) -> None:
        """Every port's marker at the default rule, its virtual queue empty (the stage's BPF maps)."""
        for port in self.ports.values():
            self._write_cfg(port, default_thresholds(port.rate_mbps * 1e6, self.mtu), True)
            self._maps()[1].update(port.ifindex, _STATE_ZERO)

    def _select(self, ports: Iterable[str] | str | None) -> list[EcnPort]:
        if ports is None:
            return list(self.ports.values())
        if isinstance(ports, str):
            ports = [ports]
        out = []
        for name in ports:
            if name not in self.ports:
                raise UserError(f"no switch egress port {name!r} in this emulation")
            out.append(self.ports[name])
        return out

    def _write_cfg(self, port: EcnPort, th: Thresholds, enabled: bool) -> None:
        rate_bps = int(port.rate_mbps * 1e6 / 8)
        self._maps()[0].update(port.ifindex, (rate_bps, int(th.kmin), int(th.kmax), round(th.pmax * PMAX_ONE),
                                        int(port.limit_bytes), 1 if enabled else 0, 0))

    def _apply_red(self, port: EcnPort, th: Thresholds, enabled: bool, verb: str) -> None:
        """RED with ecn as the port's leaf qdisc (handle 20: under the htb class of the port buffer,
        ``EcnPort.data_class``: 1:1, or 1:11 beside a control class).

        The shaping put a bfifo (or netem) there as 10:; a qdisc of another kind cannot
        replace it under the same handle, so RED takes 20: and a netem delay that was there
        moves under RED (30:). Live changes are ``tc qdisc change`` on 20:. (Found and fixed
        in the full-kernel lane, which has sch_red; this machine has not.)
        """
        red = red_args(th.kmin, th.kmax, th.pmax if enabled else 0.0, mtu=self.mtu, rate_mbps=port.rate_mbps,
                       limit_bytes=port.limit_bytes)
        if verb == "replace":
            shown = subprocess.run(["tc", "qdisc", "show", "dev", port.intf], capture_output=True, text=True).stdout
            netem = re.search(r"netem 10: .*?limit (\d+) delay (\S+)", shown)
            cmds = [["tc", "qdisc", "replace", "dev", port.intf, "parent", port.data_class, "handle", "20:", *red]]
            if netem:
                cmds.append(["tc", "qdisc", "add", "dev", port.intf, "parent", "20:", "handle", "30:", "netem",
                             "delay", netem.group(2), "limit", netem.group(1)])
        else:
            cmds = [["tc", "qdisc", "change", "dev", port.intf, "parent", port.data_class, "handle", "20:", *red]]
        for cmd in cmds:
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise UserError(f"RED on {port.intf} failed: {r.stderr.strip()} ({' '.join(cmd[3:8])} ...)")
        self._red[port.intf] = {"kmin": int(th.kmin), "kmax": int(th.kmax), "pmax": th.pmax if enabled else 0.0,
                                "enabled": enabled}

    def thresholds(self, port: str) -> dict[str, Any]:
        p = self._select(port)[0]
        if self.mechanism == "red":
            return dict(self._red[p.intf])
        values = self._maps()[0].lookup(p.ifindex)
        if values is None:
            raise UserError(f"no ECN configuration for {p.intf} in the marker's map")
        rate, kmin, kmax, pmax, limit, enabled, _ = values
        return {"kmin": kmin, "kmax": kmax, "pmax": pmax / PMAX_ONE, "enabled": bool(enabled),
                "rate_bytes_per_s": rate, "limit_bytes": limit}

    def write(self, per_port: Mapping[str, Thresholds], enabled: bool | None = None) -> None:
        """The one writer of the ports' ECN state: each named port's thresholds, live (``enabled``:
        marking on or off; None keeps each port's). Every value is checked before any port is written."""
        ports = self._select(list(per_port))
        for th in per_port.values():
            if not (0 <= th.kmin <= th.kmax) or not (0.0 <= th.pmax <= 1.0):
                raise UserError(f"ECN thresholds need 0 <= kmin <= kmax and 0 <= pmax <= 1, got "
                                f"kmin={th.kmin} kmax={th.kmax} pmax={th.pmax}")
        for p in ports:
            th = per_port[p.intf]
            on = self.thresholds(p.intf)["enabled"] if enabled is None else bool(enabled)
            if self.mechanism == "red":
                self._apply_red(p, th, on, "change")
            else:
                self._write_cfg(p, th, on)

    def set_thresholds(self, kmin: int | None = None, kmax: int | None = None, pmax: float | None = None,
                       enabled: bool | None = None, ports: Iterable[str] | str | None = None) -> None:
        """Change Kmin/Kmax (bytes), Pmax (0..1) and on/off, live, on some or all ports (a value not
        given keeps each port's; through :meth:`write`)."""
        per: dict[str, Thresholds] = {}
        for p in self._select(ports):
            cur = self.thresholds(p.intf)
            per[p.intf] = Thresholds(cur["kmin"] if kmin is None else int(kmin),
                                     cur["kmax"] if kmax is None else int(kmax),
                                     cur["pmax"] if pmax is None else float(pmax))
        self.write(per, enabled)

    def set_rate(self, intf: str, rate_mbps: float) -> None:
        """The port now sends at ``rate_mbps`` (its htb class was changed: :func:`reshape`): the marker
        drains its virtual queue at that rate, and the port's thresholds are the default rule's for it."""
        port = self._select(intf)[0]
        self.ports[intf] = replace(port, rate_mbps=rate_mbps)
        self.write({intf: default_thresholds(rate_mbps * 1e6, self.mtu)})

    # -- counters --------------------------------------------------------------------------------
    def counters(self, ports: Iterable[str] | str | None = None,
                 since: float | None = None) -> dict[str, dict[str, Any]] | dict[str, Any]:
        """Counters of one port (a dict) when ``ports`` is one name, else {intf: counters}.
        ``queue_peak_bytes``: the queue's peak since ``since`` (``time.monotonic()`` seconds; None:
        as far back as the marker's ring reaches, 640 ms), None with RED."""
        out = {}
        now_ns = time.monotonic_ns()
        since_ns = now_ns - PEAK_SLOTS * PEAK_SLOT_NS if since is None else int(since * 1e9)
        for p in self._select(ports):
            if self.mechanism == "red":
                out[p.intf] = self._red_counters(p)
            else:
                vals = self._maps()[1].lookup(p.ifindex) or _STATE_ZERO
                _, _, queue, _, nbytes, packets, ect, marked, seen, maxq = vals[:10]
                peak = window_peak(vals[10:10 + PEAK_SLOTS], vals[10 + PEAK_SLOTS:], since_ns, now_ns)
                out[p.intf] = {"bytes": nbytes, "packets": packets, "ect": ect, "ce_marked": marked,
                               "ce_seen": seen, "queue_bytes": queue, "max_queue_bytes": maxq,
                               "queue_peak_bytes": peak}
        return out[ports] if isinstance(ports, str) else out

    def _red_counters(self, p: EcnPort) -> dict[str, Any]:
        r = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", p.intf], capture_output=True, text=True)
        for q in json.loads(r.stdout or "[]"):
            if q.get("kind") == "red":
                return {"bytes": q.get("bytes"), "packets": q.get("packets"), "ect": None,
                        "ce_marked": q.get("marked"), "ce_seen": None, "queue_bytes": q.get("backlog"),
                        "max_queue_bytes": None, "queue_peak_bytes": None}
        return {}

    def queue_drops(self) -> dict[str, int]:
        """Packets each switch port's queue dropped (its root qdisc's count: htb counts its children's),
        from one ``tc -s -j qdisc show`` (cheaper than a pyroute2 dump of every qdisc). Cumulative.
        The marker never drops; the port's buffer behind it does."""
        r = subprocess.run(["tc", "-s", "-j", "qdisc", "show"], capture_output=True, text=True)
        out: dict[str, int] = {}
        for q in json.loads(r.stdout or "[]"):
            if q.get("root") and q.get("dev") in self.ports:
                out[q["dev"]] = int(q.get("drops") or 0)
        return out

    def reset_counters(self, ports: Iterable[str] | str | None = None) -> None:
        if self.mechanism != "bpf":
            raise UserError("counters of RED cannot be reset (they are the qdisc's own)")
        for p in self._select(ports):
            self._maps()[1].update(p.ifindex, _STATE_ZERO)

    def close(self) -> None:
        for m in (self._cfg, self._state):
            if m is not None:
                m.close()
