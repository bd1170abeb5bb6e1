"""Priority flow control on the emulated fabric: the data path (tc BPF), the pause agent, telemetry.

A run with ``emulation.lossless.pfc`` (``--pfc on``) shapes every sending interface with the gated
tree (:mod:`.shaping`), then this stage:

1. compiles ``bpf/pfc.bpf.c`` (clang, BPF target) and ``bpf/pfc_agent.c`` (clang, linked with
   libbpf) once per source and clang version into the cache, as the ECN stage does;
2. loads the programs and pins them with their maps under ``/sys/fs/bpf/hpnlab-<run id>-pfc``
   (recorded in the run's state first: ``hpnlab clean`` removes them);
3. fills the maps from :mod:`.pfc_plan` (ids, links, each switch's buffer from
   ``hpnlab.fabric.workload.lossless``) and attaches ``sw_in``/``sw_out`` to every switch port (root
   namespace) and ``host_in``/``host_out`` to every host NIC (in its host's namespace);
4. starts the pause agent (recorded by pid; ``HPNLAB_RUN`` in its environment), waits for its
   ``ready`` line and raises it to SCHED_FIFO for the run (recorded, put back at teardown like
   ovs-vswitchd's thread);
5. watches it: if it dies, every gate is opened at once (``pfc_agent --reopen``), said in one line
   and recorded (``metadata["pfc"]["agent_lost"]``); from then on nothing is paused, and what
   overflows a headroom is dropped and counted.

The ECN stage then marks on the real occupancy of each egress queue (``EcnStage.for_emulation``
with this stage's maps), so the dynamic-ECN telemetry reads the queue that pause holds.

    stage = emu.pfc
    stage.counters()        # per port: pauses sent and received, paused time, headroom, buffer use, drops
    stage.switches()        # per switch: shared buffer in use, its peak
    stage.agent_stats()     # the agent's figures: reaction percentiles, CPU, storms
    stage.gates()           # per transmitter and priority: is its gate closed now (tc's view)
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpnlab.fabric.routing import deadlock
from hpnlab.fabric.scenario import spec
from hpnlab.fabric.workload import lossless as ll

from ..errors import UserError
from . import pfc_plan, shaping
from .ecn import BpfMap, bpf_target_args, cache_dir, cached_build, clang_and_version, digest, load_pinned
from .state import RUN_DIR, all_runs, pid_alive

HERE = Path(__file__).resolve().parent / "bpf"
BPF_SOURCE, AGENT_SOURCE = HERE / "pfc.bpf.c", HERE / "pfc_agent.c"
#: the agent's real-time priority while a run lasts (it sleeps until an event: no throttling concern)
AGENT_RT_PRIORITY = 10
#: how often the watch looks at the agent
WATCH_S = 0.05


def compile_objects(log: Callable[[str], None] = lambda m: None) -> tuple[Path, Path]:
    """(BPF object, agent binary) in the cache, compiled once per source and clang version."""
    clang, version = clang_and_version("priority flow control")
    out_dir = cache_dir() / "bpf"
    hint = " (is libbpf-dev installed? 'make install')"
    obj = cached_build(out_dir / f"pfc-{digest(BPF_SOURCE.read_bytes(), version)}.o",
                       [*bpf_target_args(clang), "-mcpu=v3", "-c", str(BPF_SOURCE), "-o"], "the PFC data path", log,
                       hint)
    agent = cached_build(out_dir / f"pfc_agent-{digest(AGENT_SOURCE.read_bytes(), version)}",
                         [clang, "-O2", str(AGENT_SOURCE), "-lbpf", "-o"], "the pause agent", log, hint)
    return obj, agent


def lossless_priorities(g: Any, log: Callable[[str], None] = lambda m: None) -> int:
    """``pfc_plan.lossless_priorities`` with the routing proof's answer kept in the cache (keyed by the
    scenario and the routing layer's sources): a proof takes seconds, a run's start-up should not."""
    routing = Path(deadlock.__file__).resolve().parent
    key = digest(json.dumps(spec.to_dict(g.graph["scenario"]), sort_keys=True, default=str).encode(),
                  *(f.read_bytes() for f in sorted(routing.glob("*.py"))))
    path = cache_dir() / "deadlock" / f"{key}.json"

    def needs_own(graph: Any) -> bool:
        try:
            return bool(json.loads(path.read_text())["needs_bounce_priority"])
        except (OSError, ValueError, KeyError):
            pass
        proof = deadlock.prove(graph)
        log(f"PFC: buffer dependencies: {deadlock.summary(proof)}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"needs_bounce_priority": not proof.ok, "summary": deadlock.summary(proof)}))
        os.replace(tmp, path)
        return not proof.ok

    return pfc_plan.lossless_priorities(g, needs_own)


class PfcStage:
    """Priority flow control of one run (module docstring)."""

    def __init__(self, plan: pfc_plan.Plan, pin_dir: Path, run_dir: Path, agent_bin: Path | None = None,
                 agent_pid: int | None = None):
        self.plan = plan
        self.pin_dir = pin_dir
        self.run_dir = run_dir
        self.agent_bin = agent_bin
        self.agent_pid = agent_pid
        self.config_file = run_dir / "pfc-agent.conf"
        self.stats_file = run_dir / "pfc-agent.json"
        self.agent_proc: subprocess.Popen | None = None
        self.agent_lost: dict[str, Any] | None = None
        self._maps: dict[str, BpfMap] = {}
        self._watch: threading.Thread | None = None
        self._stop = threading.Event()
        self._log: Callable[[str], None] = lambda m: None
        self._by_gid = plan.by_gid()
        #: host -> its network namespace (/proc/PID/ns/net)
        self.host_ns: dict[str, str] = {}

    # ---- maps ----------------------------------------------------------------------------------
    def map(self, name: str) -> BpfMap:
        if name not in self._maps:
            value = {"pfc_glob": pfc_plan.GLOBAL, "pfc_ifs": pfc_plan.U32, "pfc_macs": pfc_plan.U32,
                     "pfc_links": pfc_plan.LINK, "pfc_swcfg": pfc_plan.SWCFG, "pfc_in": pfc_plan.INGRESS,
                     "pfc_eg": pfc_plan.EGRESS, "pfc_sw": pfc_plan.SWITCH, "pfc_cnt": pfc_plan.COUNTER,
                     "pfc_peaks": pfc_plan.PEAK}[name]
            key = pfc_plan.U64 if name == "pfc_macs" else pfc_plan.U32
            self._maps[name] = BpfMap(self.pin_dir / "maps" / name, value, key)
        return self._maps[name]

    def _fill(self, ecn: bool, ifindex: dict[str, int]) -> None:
        plan = self.plan
        self.map("pfc_glob").update(0, pfc_plan.global_value(plan, ecn))
        for i, sw in enumerate(plan.switches):
            self.map("pfc_swcfg").update(i, pfc_plan.swcfg_value(plan.buffers[sw]))
        for p in plan.ports:
            self.map("pfc_links").update(p.gid, pfc_plan.link_value(p))
            if p.is_switch:
                self.map("pfc_ifs").update(ifindex[p.intf], (p.gid,))
            else:
                assert p.mac is not None
                self.map("pfc_macs").update(pfc_plan.mac_int(p.mac), (p.gid,))

    # ---- set-up by the harness -----------------------------------------------------------------
    @classmethod
    def for_emulation(cls, emu: Any, ecn: bool = True) -> PfcStage:
        state = emu.state
        g = emu.graph
        s = emu.scenario
        t0 = time.monotonic()
        priorities = lossless_priorities(g, emu.log)
        plan = pfc_plan.build(g, priorities)
        obj, agent = compile_objects(emu.log)
        pin_dir = load_pinned(obj, state, f"hpnlab-{state.run_id}-pfc", "the PFC data path", every_program=True)
        stage = cls(plan, pin_dir, state.run_dir, agent)
        stage._log = emu.log
        ifindex = {p.intf: socket.if_nametoindex(p.intf) for p in plan.switch_ports()}
        stage._fill(ecn, ifindex)
        stage._attach(emu)
        host_ns = stage.host_ns = {h: f"/proc/{emu.host(h).pid}/ns/net" for h in emu.hosts}
        stage.config_file.write_text(pfc_plan.agent_config(
            plan, str(pin_dir / "maps" / "pfc_events"), str(stage.stats_file), lambda n: host_ns.get(n, "-"),
            s.emulation.lossless.watchdog_ms, s.emulation.lossless.watchdog_restore_ms, str(stage.nicmap),
            str(pin_dir / "maps" / "pfc_in")))
        stage._start_agent(state)
        stage.write_info()
        emu.metadata["pfc"] = stage.describe() | {"setup_s": round(time.monotonic() - t0, 2)}
        return stage

    def _attach(self, emu: Any) -> None:
        prog = self.pin_dir / "progs"
        lines = []
        for p in self.plan.switch_ports():
            lines += [f"qdisc add dev {p.intf} clsact",
                      f"filter add dev {p.intf} ingress bpf da object-pinned {prog / 'sw_in'}",
                      f"filter add dev {p.intf} egress bpf da object-pinned {prog / 'sw_out'}"]
        r = subprocess.run(["tc", "-batch", "-"], input="\n".join(lines) + "\n", capture_output=True, text=True)
        if r.returncode != 0:
            raise UserError(f"attaching the PFC data path to the switch ports failed: {r.stderr.strip()[-300:]}")
        by_host: dict[str, list[str]] = {}
        for p in self.plan.host_nics():
            by_host.setdefault(p.node, []).extend([
                f"qdisc add dev {p.intf} clsact",
                f"filter add dev {p.intf} ingress bpf da object-pinned {prog / 'host_in'}",
                f"filter add dev {p.intf} egress bpf da object-pinned {prog / 'host_out'}"])
        for host, host_lines in by_host.items():
            batch = self.run_dir / f"pfc-{host}.tc"
            batch.write_text("\n".join(host_lines) + "\n")
            r = subprocess.run(["nsenter", f"--net=/proc/{emu.host(host).pid}/ns/net", "tc", "-batch", str(batch)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise UserError(f"attaching the PFC data path to {host}'s NICs failed: {r.stderr.strip()[-300:]}")

    def _start_agent(self, state: Any) -> None:
        assert self.agent_bin is not None
        err = open(self.run_dir / "pfc-agent.log", "ab")    # noqa: SIM115 - the agent's stderr for the run
        proc = subprocess.Popen([str(self.agent_bin), str(self.config_file)], stdout=subprocess.PIPE,
                                stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        err.close()
        state.add_pid(proc.pid, "pfc agent", group=True)
        self.agent_proc, self.agent_pid = proc, proc.pid
        assert proc.stdout is not None
        line = proc.stdout.readline().decode(errors="replace").strip()
        if not line.startswith("ready"):
            proc.wait(timeout=5)
            tail = (self.run_dir / "pfc-agent.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise UserError(f"the pause agent did not start: {tail[0] if tail else f'exit code {proc.returncode}'}")
        # SCHED_FIFO while the run lasts: its reaction is the pause's; it sleeps between events
        try:
            old = os.sched_getscheduler(proc.pid), os.sched_getparam(proc.pid).sched_priority
            state.add_scheduling(proc.pid, old[0], old[1], os.getpriority(os.PRIO_PROCESS, proc.pid))
            os.sched_setscheduler(proc.pid, os.SCHED_FIFO, os.sched_param(AGENT_RT_PRIORITY))
            self.agent_sched = f"SCHED_FIFO {AGENT_RT_PRIORITY}"
        except OSError as exc:
            self.agent_sched = f"not raised ({exc})"
            self._log(f"the pause agent's priority could not be raised ({exc}): its reaction may stall under load")
        self._watch = threading.Thread(target=self._watch_agent, name="hpnlab-pfc-agent-watch", daemon=True)
        self._watch.start()

    def _watch_agent(self) -> None:
        proc = self.agent_proc
        while proc is not None and not self._stop.wait(WATCH_S):
            code = proc.poll()
            if code is None:
                continue
            if self._stop.is_set():
                return
            t = time.time()
            ok = self.reopen_gates()
            self.agent_lost = {"at": t, "code": code, "gates_reopened": ok,
                               "reopened_s": round(time.time() - t, 4)}
            self._log(f"the pause agent (pid {proc.pid}) exited with code {code}: every gate "
                      f"{'reopened' if ok else 'reopen FAILED'}; from now on nothing is paused and headroom "
                      f"overflows are dropped (counted)")
            return

    def reopen_gates(self) -> bool:
        """Open every gate (and kick each queue), whatever the agent did: ``pfc_agent --reopen``."""
        if self.agent_bin is None:
            return False
        r = subprocess.run([str(self.agent_bin), "--reopen", str(self.config_file)], capture_output=True, text=True,
                           timeout=60)
        return r.returncode == 0

    @property
    def nicmap(self) -> Path:
        """The pinned array of host NICs' paused priorities (the agent writes it, transports read it)."""
        return self.pin_dir / "maps" / "pfc_nic_paused"

    def transport_option(self) -> dict[str, Any]:
        """The roce transport's ``pause`` option: where its NIC scheduler reads whether a port is paused. The
        path goes through this process's root (``/proc/PID/root``): a Mininet host has a mount namespace of
        its own, whose /sys hides the bpffs the map is pinned in."""
        return pfc_plan.nic_pause_option(self.plan, f"/proc/{os.getpid()}/root{self.nicmap}")

    def describe(self) -> dict[str, Any]:
        s = self.plan
        return {"priorities": s.priorities, "kbits": s.kbits, "ports": len(s.ports), "pin_dir": str(self.pin_dir),
                "agent_pid": self.agent_pid, "agent_sched": getattr(self, "agent_sched", None),
                "buffers": ll.describe(s.buffers, s.mtu)}

    def write_info(self) -> None:
        (self.run_dir / "pfc.json").write_text(json.dumps(
            {"plan": self.plan.as_dict(), "pin_dir": str(self.pin_dir), "agent_bin": str(self.agent_bin),
             "agent_pid": self.agent_pid, "host_ns": self.host_ns}, indent=1))

    @classmethod
    def open(cls, run_id: str | None = None) -> PfcStage:
        """The PFC stage of a live run (the only one, or ``run_id``), from another process (root)."""
        runs = [r for r in all_runs() if (run_id is None or r.run_id == run_id) and r.owner_alive()]
        path = RUN_DIR / runs[-1].run_id / "pfc.json" if runs else None
        if path is None or not path.is_file():
            raise UserError("no live hpnlab emulation with priority flow control"
                            + (f" with run id {run_id}" if run_id else ""))
        info = json.loads(path.read_text())
        plan = plan_from_dict(info["plan"])
        stage = cls(plan, Path(info["pin_dir"]), path.parent, Path(info["agent_bin"]), info.get("agent_pid"))
        stage.host_ns = dict(info.get("host_ns") or {})
        return stage

    # ---- reading --------------------------------------------------------------------------------
    def counters(self) -> dict[str, dict[str, Any]]:
        """Per port (its interface name): as an ingress (``pauses_sent``, ``resumes_sent``, ``paused_s``,
        ``headroom_drops``, lossless packets per priority, bytes held now), as an egress (``pauses_received``:
        what its downstream sent, bytes queued now per class, ``lossy_drops``) and the peaks since
        :meth:`reset_peaks` (``ingress_peak``, ``headroom_peak``, ``queue_peak`` per class). Cumulative
        counts: a measurement takes the difference of two readings."""
        now = time.monotonic_ns()
        out: dict[str, dict[str, Any]] = {}
        ing = self.map("pfc_in")
        eg = self.map("pfc_eg")
        peaks = self.map("pfc_peaks")
        for p in self.plan.ports:
            row: dict[str, Any] = {"node": p.node, "gid": p.gid, "switch_port": p.is_switch}
            if p.is_switch:
                agg = {"pauses": 0, "resumes": 0, "paused_ns": 0, "drops": 0, "packets": 0, "bytes": 0,
                       "headroom": 0, "paused": 0}
                by_prio = []
                for prio in range(self.plan.priorities):
                    v = ing.lookup(p.gid * pfc_plan.PRIOS + prio)
                    if v is None:
                        continue
                    f = pfc_plan.ingress_fields(v)
                    by_prio.append(f["packets"])
                    agg["paused_ns"] += f["paused_ns"] + (max(0, now - f["pause_since"]) if f["paused"] else 0)
                    for k in ("pauses", "resumes", "drops", "packets", "bytes", "headroom", "paused"):
                        agg[k] += f[k]
                pk = pfc_plan.peak_fields(peaks.lookup(p.gid) or (0,) * 7)
                row.update(pauses_sent=agg["pauses"], resumes_sent=agg["resumes"], paused_s=agg["paused_ns"] / 1e9,
                           headroom_drops=agg["drops"], lossless_packets_in=agg["packets"],
                           lossless_packets_by_priority=by_prio, ingress_bytes=agg["bytes"] + agg["headroom"],
                           paused_now=agg["paused"], ingress_peak=pk["ingress"], headroom_peak=pk["headroom"],
                           queue_peak=pk["egress"], longest_pause_s=pk["pause_ns"] / 1e9)
                e = eg.lookup(p.gid)
                if e is not None:
                    ef = pfc_plan.egress_fields(e)
                    row.update(queue_bytes=ef["bytes"], lossy_drops=ef["lossy_drops"],
                               headroom_drops_applied=ef["headroom_drops"], egress_packets=ef["packets"])
            out[p.intf] = row
        # pause received by a transmitter = sent by the ingress at the other end of its link
        by_gid = self._by_gid
        for p in self.plan.switch_ports():
            src = out[p.intf]
            dst = out[by_gid[p.peer].intf]
            dst["pauses_received"] = src["pauses_sent"]
            dst["paused_rx_s"] = src["paused_s"]
        return out

    def paused(self) -> list[tuple[str, int]]:
        """The switch ingress ports (switch, port) holding their upstream paused now (any priority)."""
        ing = self.map("pfc_in")
        out = []
        for p in self.plan.switch_ports():
            for prio in range(self.plan.priorities):
                v = ing.lookup(p.gid * pfc_plan.PRIOS + prio)
                if v is not None and v[1]:
                    out.append((p.node, p.port))
                    break
        return out

    def reset_peaks(self) -> None:
        """Zero every peak (ports and switches): the next readings' peaks are since now."""
        zero = (0,) * 7
        peaks = self.map("pfc_peaks")
        for p in self.plan.switch_ports():
            peaks.update(p.gid, zero)
        for i in range(len(self.plan.switches)):
            peaks.update(pfc_plan.MAX_PORTS + i, zero)

    def switches(self) -> dict[str, dict[str, int]]:
        """Per switch: its shared buffer in use now, its peak since :meth:`reset_peaks`, its sizes."""
        out = {}
        for i, sw in enumerate(self.plan.switches):
            v = self.map("pfc_sw").lookup(i) or (0,)
            pk = pfc_plan.peak_fields(self.map("pfc_peaks").lookup(pfc_plan.MAX_PORTS + i) or (0,) * 7)
            out[sw] = {"shared_used": int(v[0]), "shared_peak": int(pk["shared"]),
                       "shared_bytes": self.plan.buffers[sw].shared_bytes,
                       "total_bytes": self.plan.buffers[sw].total_bytes}
        return out

    def data_path_counters(self) -> dict[str, int]:
        out = {}
        for i, name in enumerate(pfc_plan.COUNTERS):
            v = self.map("pfc_cnt").lookup(i)
            out[name] = int(v[0]) if v else 0
        return out

    def agent_stats(self) -> dict[str, Any]:
        """The agent's last figures (``pfc_agent.c``), with reaction percentiles in µs and in frame times
        at the slowest and fastest emulated port."""
        try:
            stats = json.loads(self.stats_file.read_text())
        except (OSError, ValueError):
            return {}
        rates = sorted({p.rate_mbps for p in self.plan.ports})
        for kind in ("pause", "resume"):
            pct = pfc_plan.reaction_percentiles(stats.get(f"{kind}_us", []))
            stats[f"{kind}_reaction_us"] = {"median": pct[50], "p99": pct[99], "max": pct[100]}
            if rates and pct[50] is not None:
                frames = {f"{r:g}": {k: round(v / 1e6 / ll.frame_time_s(r, self.plan.mtu), 3)
                                     for k, v in (("median", pct[50]), ("p99", pct[99])) if v is not None}
                          for r in (rates[0], rates[-1])}
                stats[f"{kind}_reaction_frames"] = frames
        wall = stats.get("wall_s") or 0
        stats["cpu_share"] = round(stats.get("cpu_s", 0) / wall, 4) if wall else None
        return stats

    def gates(self, hosts: bool = True) -> dict[str, list[bool]]:
        """Per transmitter (interface) whether each gate is closed now, per lossless priority, as tc shows
        it: the switch ports, and with ``hosts`` every host NIC (in its host's namespace)."""
        closed: dict[str, list[bool]] = {}
        spaces: list[tuple[str | None, set[str]]] = [(None, {p.intf for p in self.plan.switch_ports()})]
        if hosts:
            nics: dict[str, set[str]] = {}
            for p in self.plan.host_nics():
                nics.setdefault(p.node, set()).add(p.intf)
            spaces += [(self.host_ns.get(h), names) for h, names in nics.items() if self.host_ns.get(h)]
        for ns, wanted in spaces:
            cmd = ["tc", "-j", "qdisc", "show"]
            r = subprocess.run(cmd if ns is None else ["nsenter", f"--net={ns}", *cmd], capture_output=True,
                               text=True)
            for q in json.loads(r.stdout or "[]"):
                if q.get("kind") != "tbf" or q.get("dev") not in wanted:
                    continue
                handle = int(str(q.get("handle", "0:")).split(":")[0], 16)
                if handle not in shaping.PFC_GATES:
                    continue
                prio = shaping.PFC_GATES.index(handle)
                rate = (q.get("options") or {}).get("rate", 0)
                row = closed.setdefault(q["dev"], [False] * len(shaping.PFC_GATES))
                row[prio] = bool(rate) and rate < 1000
        return closed

    # ---- stop ------------------------------------------------------------------------------------
    def close(self, timeout_s: float = 5.0) -> None:
        """End the agent (it opens every gate on SIGTERM); the teardown removes the pins."""
        self._stop.set()
        proc = self.agent_proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                if pid_alive(proc.pid):
                    proc.kill()
        if self._watch is not None and self._watch is not threading.current_thread():
            self._watch.join(timeout=2)
        for m in self._maps.values():
            m.close()
        self._maps = {}


def plan_from_dict(d: dict[str, Any]) -> pfc_plan.Plan:
    ports = tuple(pfc_plan.PortId(**p) for p in d["ports"])
    buffers = {n: ll.SwitchBuffer(b["shared_bytes"], b["alpha"], b["xoff_bytes"], b["resume_offset_bytes"],
                                  b["reserved_bytes"], {int(k): v for k, v in b["headroom_bytes"].items()},
                                  b["priorities"]) for n, b in d["buffers"].items()}
    return pfc_plan.Plan(ports, tuple(d["switches"]), buffers, d["kbits"], d["priorities"], d["mtu"])


def kill_agent(stage: PfcStage, sig: int = signal.SIGKILL) -> int | None:
    """End the agent as a crash would (tests): its pid, or None without one. The watch reopens every gate."""
    if stage.agent_pid is None or not pid_alive(stage.agent_pid):
        return None
    os.kill(stage.agent_pid, sig)
    return stage.agent_pid
