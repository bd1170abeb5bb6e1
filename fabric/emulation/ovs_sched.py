"""ovs-vswitchd's main thread at the highest CFS priority (nice -20) while a run lasts.

On the userspace datapath the `system` (AF_PACKET) ports are not polled by PMD threads but by
ovs-vswitchd's main thread (lib/dpif-netdev.c, ``dpif_netdev_run``: every non-PMD port through
the NON_PMD_CORE_ID context), the same loop that handles OpenFlow, ovsdb, netlink and port
changes. On a busy 2-core machine that thread waits for the CPU and every flow in the fabric
stops with it, so a run raises its priority.

Why nice -20 and not a real-time policy: under traffic that thread never sleeps (it polls every
port, ~96-100% of a core during the failover probe), and the kernel's real-time throttling
(``sched_rt_runtime_us``, 950 ms of every 1 s) then took the CPU away from a SCHED_RR thread for
20-45 ms at a time, stalling every flow and overflowing buffers (README: failures). CFS has no
such cap; nice -20 still wins the CPU against the generators (weight 88761 against 1024).
``rr`` (the earlier policy) and ``deadline`` (SCHED_DEADLINE: no long throttling, but capped at
90% of a core) stay selectable, to measure against (``hpnlab emulate --ovs-sched``).
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

PID_FILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")
#: the main thread's nice value during a run
NICE = -20
#: how a run treats that thread: nice -20 (default); SCHED_RR priority 5, as earlier releases did
#: (kept to measure against: real-time throttling); or left alone
MODES = ("nice", "rr", "deadline", "off")
#: SCHED_DEADLINE's reservation for ``deadline``: this much CPU time in every period (ns)
DL_RUNTIME_NS = 900_000
DL_PERIOD_NS = 1_000_000
#: the flag the kernel ORs into a policy set with reset-on-fork
RESET_ON_FORK = 0x40000000
SCHED_DEADLINE = 6
#: the policy an earlier release set (SCHED_RR, priority 5); a run killed then may have left it
OLD_RT_PRIORITY = 5


def ovs_pid() -> int:
    return int(PID_FILE.read_text().split()[0])


def saved(pid: int) -> tuple[int, int, int]:
    """What to put back after the run: the thread's (policy, real-time priority, nice). A
    real-time policy left by an earlier release's killed run counts as the default."""
    policy, priority = os.sched_getscheduler(pid) & ~RESET_ON_FORK, os.sched_getparam(pid).sched_priority
    if (policy == os.SCHED_RR and priority == OLD_RT_PRIORITY) or policy == SCHED_DEADLINE:
        policy, priority = os.SCHED_OTHER, 0
    return policy, priority, os.getpriority(os.PRIO_PROCESS, pid)


def boost(pid: int, mode: str = "nice") -> dict[str, int | str]:
    """SCHED_OTHER at nice -20, or SCHED_RR priority 5 with ``mode="rr"`` (record ``saved(pid)``
    first). Returns what it set."""
    if mode == "rr":
        os.sched_setscheduler(pid, os.SCHED_RR, os.sched_param(OLD_RT_PRIORITY))
        return {"policy": "SCHED_RR", "priority": OLD_RT_PRIORITY}
    if mode == "deadline":
        # Python has no sched_setattr; util-linux's chrt does (-R: threads it creates get SCHED_OTHER,
        # without which the kernel refuses a SCHED_DEADLINE thread's clone)
        done = subprocess.run(["chrt", "--deadline", "--sched-runtime", str(DL_RUNTIME_NS), "--sched-deadline",
                               str(DL_PERIOD_NS), "--sched-period", str(DL_PERIOD_NS), "--reset-on-fork", "-p", "0",
                               str(pid)], capture_output=True, text=True)
        if done.returncode:
            raise OSError(f"chrt --deadline: {(done.stderr or done.stdout).strip()[:200]}")
        return {"policy": "SCHED_DEADLINE", "runtime_ns": DL_RUNTIME_NS, "period_ns": DL_PERIOD_NS}
    if mode != "nice":
        raise ValueError(f"ovs-vswitchd scheduling mode {mode!r} (known: nice, rr, deadline)")
    os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, pid, NICE)
    return {"policy": "SCHED_OTHER", "nice": NICE}


def apply(mode: str = "nice", record: Callable[[int, int, int, int], None] | None = None
          ) -> tuple[tuple[int, int, int, int], dict[str, int | str]]:
    """Raise ovs-vswitchd's main thread as ``mode`` says. ``record(pid, policy, priority, nice)``
    gets what to put back before anything changes (a run's state file: crash-safe). Returns
    ((pid, policy, priority, nice) to put back with ``restore``, what was set)."""
    pid = ovs_pid()
    old = (pid, *saved(pid))
    if record is not None:
        record(*old)
    return old, boost(pid, mode)


def restore(pid: int, policy: int, priority: int, nice: int | None) -> None:
    os.sched_setscheduler(pid, policy, os.sched_param(priority))
    if nice is not None:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
