"""Dynamic-ECN policies, pure: per-port telemetry and the thresholds in force in, new thresholds out.

The interface (write a new policy in one file against it, name it on the command line)::

    class MyPolicy(EcnPolicy):
        name = "mine"
        def decide(self, now, ports, current):
            # now: seconds (monotonic); ports: {(switch, port): PortTelemetry} of the last interval;
            # current: {(switch, port): Thresholds} in force. Return the ports to change (any subset);
            # a Thresholds' ``reason`` is logged and written to the telemetry file.
            return {key: Thresholds(kmin, kmax, pmax, reason="why") for key in ...}

    python -m hpnlab.controller mini-hpn --ecn-policy my_policies.py:MyPolicy    # or a module:Class

The controller calls ``decide`` once per telemetry interval; :func:`changes` keeps only real
differences, and the actuator (``controller/actuators.py``) applies them. Policies built in:
``static`` (never changes anything: the baseline, today's fixed thresholds), ``dynamic`` and
``pfc-aware`` (``dynamic`` with pause as a signal, for a lossless fabric).

The ``dynamic`` policy (:class:`DynamicPolicy`)
-----------------------------------------------
Follows the *idea* of Alibaba's ACC (Yan et al., "ACC: Automatic ECN Tuning for High-Speed
Datacenter Networks", SIGCOMM 2021): per switch egress port, from the port's own telemetry
(output rate, queue, marking rate, drops) and with the RED/DCQCN marking shape kept, choose (Kmin,
Kmax, Pmax) so that throughput stays full where the buffer holds the traffic and marks come early
and hard where many senders converge and the buffer is in danger. It differs from ACC plainly: ACC
learns the setting with deep reinforcement learning (a DDQN agent per switch trained offline and
online on a throughput/latency reward); this policy is a small set of documented rules with bounds
and damping, because an emulated fabric of a few switches gives too few samples to train an agent
and rules can be tested one by one. Like ACC (and unlike Huawei's AI ECN, which classifies the
traffic mix of a port) it looks at no flow: the incast degree is the port's switch's fan-in (ports
receiving >= 5% of their rate, see ``fabric/routing/telemetry.py``), an upper bound.

What the rules are built on (measured on mini-hpn, ``hpnlab run --compare ecn``): DCQCN senders
cut their rate by up to half per mark and recover over tens of milliseconds, so a mark costs
throughput (and, for a short message, completion time) whenever the queue would have drained by
itself: a ring all-reduce's paced senders keep a standing queue of 3-4 frames at full utilisation,
a short-message incast makes a burst that drains in a few ms. Marks pay only where the queue would
otherwise reach the buffer and drop (a loss costs a retransmission timeout). Hence: **hold Kmin
above the queue the port sees while its buffer is safe; cut it at once when the buffer is not**.

Every interval, per port, on an exponentially weighted average (``alpha``) of utilisation ``u`` and
marked fraction ``m``, on the interval's queue estimate ``q`` (the backlog the last packet left: a
burst's peak), on its drops, and on the fan-in ``f`` (the largest of the last ``FAN_IN_MEMORY``
samples: port statistics arrive up to an interval or two after the stage's counters):

1. **pressure** (fast attack) — the port carried traffic and its queue reached the pressure mark
   ``P`` (``q >= P``; the stage's queue is the backlog its last packet left, so an idle port shows its
   last burst's peak until the next packet: that alone is no pressure), or packets were dropped:
   Kmin x ``step_down``, Pmax + ``pmax_step``, every ``hold_down_s`` (one interval) whatever the
   port did before: DCQCN senders slow down before the next burst fills the buffer.
   ``P`` = max(``pressure_frames`` frames, ``pressure_ms`` at the port rate): half of the emulated
   port buffer (``hpnlab.fabric.emulation.shaping``: max(32 frames, 50 ms)). With fan-in >=
   ``incast_fan_in`` the change is logged as an incast.
2. **no pressure, marks would only slow senders** (slow rise) — traffic (``u >= u_idle`` or marks in
   this interval), the queue below ``P``, the port not busy in this interval (utilisation below
   ``u_busy``), and either it marks (``m >= m_low``) or the queue stood above Kmin (``q > Kmin``: the
   next packets would be marked): Kmin x ``step_up``, Pmax - ``pmax_step``, at most once per
   ``hold_up_s``. A busy port keeps its thresholds: it carries all it can, so a higher Kmin would
   add only queue, the delay of every short message behind the elephants (ACC's reward weighs
   both). The rule raised Kmin on busy ports until 2026-12-02. On the ``shared`` workload of
   ``hpnlab run --compare ecn``, an incast waiting behind an all-to-all's queue, that gave
   ``default``'s busbw at ``high``'s message p99.
3. **idle** — ``u < u_idle`` and nothing marked for ``relax_s``: one step back towards the port's
   default (start-up) thresholds per ``hold_up_s``, so a setting made for past traffic does not stay.
4. otherwise keep the thresholds.

Bounds: Kmin within [max(1 frame, ``kmin_min_ms`` at the port rate), max(16 frames, ``kmin_max_ms``
at the rate)] (the ``low`` and ``high`` presets' Kmin of ``hpnlab.fabric.workload.ecn``), Kmax =
``kmax_ratio`` x Kmin (DCQCN's shape, as the start-up thresholds), Pmax within [``pmax_min``,
``pmax_max``]. Damping: a rise waits ``hold_up_s`` after any change; a rise right after a cut (a
reversal) waits ``2 x hold_up_s``, and every earlier reversal of that port doubles the wait (up to
``16 x hold_up_s``, until the port goes idle): traffic that keeps pushing both ways is followed ever
more slowly upwards and settles on the safe (low) side, while a cut never waits more than
``hold_down_s``. Steps are multiplicative and bounded, so steady input settles at a bound or in the
dead band and stays there.

The ``pfc-aware`` policy (:class:`PfcAwarePolicy`)
--------------------------------------------------
On a lossless fabric (``--pfc on``) the buffer does not drop: it pauses. A pause is the cost
China Mobile's report names for thresholds set too high ("frequently trigger PFC, affecting other
traffic"): the paused transmitter stops *every* flow of its priority, those of jobs that never
congested included (head-of-line blocking), and its own queue grows until its switch pauses the
next hop up (pause spreading). ACC's design point is the same: ECN should act early enough that
PFC rarely has to. So pause is the signal a lossless fabric gives that the buffer is in danger,
sooner and more surely than the queue estimate (the ECN stage's queue drains at the port rate
even while the port is paused, see docs/guides/lossless.md), and drops no longer come to say so.
Telemetry carries it per port and interval (``fabric/routing/telemetry.py``: ``paused_fraction``,
``pauses_received`` as a transmitter; ``pausing_fraction``, ``pauses_sent`` as an ingress; None
where the run has no PFC). The rules, before ``dynamic``'s:

P1. **paused** — the port's downstream held it paused for at least ``pause_share`` (5%) of the
    interval, and the port carried traffic or holds a queue: cut (Kmin x ``step_down``,
    Pmax + ``pmax_step``, every ``hold_down_s``). Marks here reach exactly the senders whose traffic
    fills the paused queue; the pause itself would stop innocent flows as well.
P2. **its switch pauses upstream** — some port of the same switch, as an ingress, paused its
    upstream (``pausing_fraction >= pause_share``): cut on every port of that
    switch that carries traffic and holds at least a frame of its buffer (the egress queues where
    the held bytes sit: per-ingress accounting says which ingress to pause, not which egress holds
    the bytes, so every queue holding some is marked harder). Ports without a queue keep theirs.
P3. **calm** — for ``calm_s`` after a pause on the port or its switch nothing rises (a cut for
    buffer pressure or drops, ``dynamic``'s rule 1, still applies): pause that just stopped comes
    back if the senders are let go at once.
P4. **only elephants** — the run has PFC (the figures are not None), nothing paused for
    ``calm_s``, the port is busy (utilisation >= ``u_busy``), its queue is below the pressure mark,
    nothing dropped, and it marks (``m >= m_low`` or the queue stands above Kmin): rise (Kmin x
    ``step_up``, damped as ``dynamic``'s rule 2). ``dynamic`` holds a busy port's thresholds, since
    a higher Kmin adds only queue; on a lossless fabric with nothing pausing, the marks on a busy
    port only slow elephants that the buffer holds anyway, and P1-P3 bring Kmin down as soon as the
    queue starts to pause.
P5. otherwise ``dynamic``'s rules (pressure cut, rise where not busy, back to the default when
    idle).
Without PFC figures (a lossy run, or a telemetry file recorded before them) P1, P2 and P4 never
fire and the policy decides as ``dynamic`` does. Bounds and damping are ``dynamic``'s: a rise after a
pause cut is a reversal and waits twice the hold, doubling with each one, so a port whose traffic
keeps pausing settles on the low side. What it cannot see: which ingress's bytes sit in which
egress queue (the stage counts per ingress), and pause of other priorities (one lossless class here).
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing.telemetry import PortKey, PortTelemetry
from hpnlab.fabric.scenario.rates import frame_bytes
from hpnlab.fabric.workload.ecn import STATIC_POLICY, Thresholds  # the one type; user policies import it from here

#: one step of a rule: (direction -1 cut / +1 rise / 0 relax, Kmin, Pmax, reason, hold in seconds)
Step = tuple[int, float, float, str, float]
FAN_IN_MEMORY = 3      # samples: OpenFlow's fan-in lags the stage's marks by up to an interval or two


def changes(current: Mapping[PortKey, Thresholds], decided: Mapping[PortKey, Thresholds]
            ) -> dict[PortKey, Thresholds]:
    """What a policy decided that differs from what is in force (ports it did not name keep theirs)."""
    return {k: t for k, t in decided.items() if current.get(k) != t}


class EcnPolicy:
    """A dynamic-ECN policy (see the module docstring). ``mtu``: the fabric's, for frame-based bounds."""

    name = "base"
    spec: str | None = None       # what ``load`` loaded it by (a built-in name, MODULE:CLASS or FILE.py[:CLASS])

    def __init__(self, mtu: int = 1500, **options: Any) -> None:
        self.mtu = mtu
        if options:
            raise UserError(f"ECN policy {self.name!r} takes no option(s) {', '.join(sorted(options))}")

    def decide(self, now: float, ports: Mapping[PortKey, PortTelemetry],
               current: Mapping[PortKey, Thresholds]) -> dict[PortKey, Thresholds]:
        return {}


class StaticPolicy(EcnPolicy):
    """The baseline: the thresholds set at start-up never change."""

    name = STATIC_POLICY


@dataclass
class _PortState:
    u: float = 0.0
    m: float = 0.0
    samples: int = 0
    last_change: float = float("-inf")
    last_direction: int = 0           # -1 lowered, +1 raised, 0 none yet
    reversals: int = 0                # rises right after a cut since the port was last idle
    fan_ins: list[int] = field(default_factory=list)     # the last FAN_IN_MEMORY samples' fan-in
    quiet_since: float | None = None
    default: Thresholds | None = None
    last_pause: float = float("-inf")    # pfc-aware: when this port or its switch last paused


class DynamicPolicy(EcnPolicy):
    """Rule-based per-port ECN tuning after ACC (see the module docstring for the rules and bounds)."""

    name = "dynamic"
    PARAMS: ClassVar[dict[str, float]] = {
        "alpha": 0.5, "incast_fan_in": 2, "m_low": 0.005, "u_busy": 0.8, "u_idle": 0.05,
        "pressure_frames": 16, "pressure_ms": 25.0,
        "step_down": 0.5, "step_up": 2.0, "pmax_step": 0.1, "pmax_min": 0.05, "pmax_max": 0.5,
        "kmin_min_ms": 0.5, "kmin_max_ms": 8.0, "kmax_ratio": 4.0, "hold_down_s": 0.2, "hold_up_s": 0.4,
        "relax_s": 2.0,
    }

    def __init__(self, mtu: int = 1500, **options: Any) -> None:
        unknown = set(options) - set(self.PARAMS)
        if unknown:
            raise UserError(f"ECN policy {self.name!r} has no option(s) {', '.join(sorted(unknown))} "
                            f"(it has {', '.join(self.PARAMS)})")
        super().__init__(mtu)
        self.p = {**self.PARAMS, **{k: float(v) for k, v in options.items()}}
        self.state: dict[PortKey, _PortState] = {}

    # ---- bounds --------------------------------------------------------------------------
    def kmin_bounds(self, rate_bps: float) -> tuple[int, int]:
        frame = frame_bytes(self.mtu)
        per_ms = rate_bps / 8 / 1000
        return (int(max(frame, self.p["kmin_min_ms"] * per_ms)),
                int(max(16 * frame, self.p["kmin_max_ms"] * per_ms)))

    def pressure_bytes(self, rate_bps: float) -> int:
        """The queue at which marks must come early: half the emulated port buffer."""
        frame = frame_bytes(self.mtu)
        return int(max(self.p["pressure_frames"] * frame, self.p["pressure_ms"] * rate_bps / 8 / 1000))

    def bounded(self, rate_bps: float, kmin: float, pmax: float, reason: str) -> Thresholds:
        lo, hi = self.kmin_bounds(rate_bps)
        k = int(min(max(kmin, lo), hi))
        return Thresholds(k, int(k * self.p["kmax_ratio"]),
                          round(min(max(pmax, self.p["pmax_min"]), self.p["pmax_max"]), 4), reason=reason)

    # ---- the rules ------------------------------------------------------------------------
    def decide(self, now: float, ports: Mapping[PortKey, PortTelemetry],
               current: Mapping[PortKey, Thresholds]) -> dict[PortKey, Thresholds]:
        p = self.p
        out: dict[PortKey, Thresholds] = {}
        for key, s in ports.items():
            cur = current.get(key)
            if cur is None:
                continue
            st = self.state.setdefault(key, _PortState(default=cur))
            a = 1.0 if st.samples == 0 else p["alpha"]
            st.u += a * (s.utilisation - st.u)
            st.m += a * (s.ce_fraction - st.m)
            st.samples += 1
            st.fan_ins = [*st.fan_ins[-(FAN_IN_MEMORY - 1):], s.fan_in]
            marking = s.ce_fraction > 0 or s.ce_marked_pps > 0
            traffic = marking or s.utilisation >= p["u_idle"]
            if not traffic:
                st.quiet_since = now if st.quiet_since is None else st.quiet_since
            else:
                st.quiet_since = None
            step = self.rule(now, key, s, cur, st, traffic, ports)
            if step is None:
                continue
            direction, kmin, pmax, why, hold = step
            if now - st.last_change < hold - 1e-9:
                continue
            new = self.bounded(s.rate_bps, kmin, pmax, why)
            if direction == 0 and st.default is not None:      # relaxing: never past the default
                new = Thresholds(new.kmin, new.kmax if new.kmin != st.default.kmin else st.default.kmax,
                                 new.pmax, reason=why)
            if new == cur:
                continue          # at a bound already
            out[key] = new
            st.last_change = now
            if direction == +1 and st.last_direction == -1:
                st.reversals += 1
            if direction:
                st.last_direction = direction
            else:
                st.reversals = 0          # relaxing after idleness: the port starts afresh
        return out

    @staticmethod
    def queue(s: PortTelemetry) -> int:
        """The queue's peak over the interval where the stage keeps one (a burst between two ticks is
        pressure too), else its depth at the tick."""
        return int(s.queue_peak_bytes if s.queue_peak_bytes is not None else s.queue_bytes or 0)

    def rise(self, st: _PortState, cur: Thresholds, why: str) -> Step:
        """One step up (rule 2), damped: a rise right after a cut waits 2x the hold time, each earlier
        reversal doubles it (to 16x)."""
        p = self.p
        reverses = st.last_direction == -1
        hold = p["hold_up_s"] * (2 ** min(st.reversals + 1, 4) if reverses else 1)
        return +1, cur.kmin * p["step_up"], cur.pmax - p["pmax_step"], why, hold

    def cut(self, cur: Thresholds, why: str) -> Step:
        """One step down (rule 1), at most every ``hold_down_s``."""
        p = self.p
        return -1, cur.kmin * p["step_down"], cur.pmax + p["pmax_step"], why, p["hold_down_s"]

    def rule(self, now: float, key: PortKey, s: PortTelemetry, cur: Thresholds, st: _PortState, traffic: bool,
             ports: Mapping[PortKey, PortTelemetry]) -> Step | None:
        """The step the rules take on one port this interval (direction, Kmin, Pmax, reason, hold), or None."""
        p = self.p
        q = self.queue(s)
        fan_in = max(st.fan_ins)
        pressure = self.pressure_bytes(s.rate_bps)
        if (traffic and q >= pressure) or s.drops > 0:
            what = f"incast (fan-in {fan_in})" if fan_in >= p["incast_fan_in"] else "buffer pressure"
            return self.cut(cur, f"{what}: queue {q} B (pressure at {pressure} B), drops {s.drops}")
        if traffic and s.utilisation >= p["u_busy"]:
            return None           # busy already: a higher Kmin would only add queue (rule 2)
        if traffic and (st.m >= p["m_low"] or q > cur.kmin):
            return self.rise(st, cur, f"no buffer pressure: queue {q} B < {pressure} B, utilisation {st.u:.0%}, "
                                      f"marked {st.m:.1%}: marks would only slow the senders")
        return self.relax(now, st, cur)

    def relax(self, now: float, st: _PortState, cur: Thresholds) -> Step | None:
        """Rule 3: idle for ``relax_s``: one step back towards the port's default thresholds."""
        p = self.p
        if st.quiet_since is None or now - st.quiet_since < p["relax_s"] or st.default is None:
            return None
        d = st.default
        if cur == d:
            return None
        kmin = cur.kmin * p["step_up"] if cur.kmin < d.kmin else cur.kmin * p["step_down"]
        kmin = min(kmin, d.kmin) if cur.kmin < d.kmin else max(kmin, d.kmin)
        pmax = min(cur.pmax + p["pmax_step"], d.pmax) if cur.pmax < d.pmax else max(cur.pmax - p["pmax_step"], d.pmax)
        return 0, kmin, pmax, f"idle for {now - st.quiet_since:.1f} s: back towards the default", p["hold_up_s"]


class PfcAwarePolicy(DynamicPolicy):
    """``dynamic`` with pause as a signal, for a lossless fabric (see the module docstring's last part)."""

    name = "pfc-aware"
    # pause_share 0.05, not 0.01 with any pause frame counting (2026-12-07): in the victim comparison
    # (docs/results/2026-12-07-ecn-pfc-victim.md) half of the policy's 346 cuts answered pauses of at most
    # 5% of an interval, and the victim ran at half the busbw of the best static setting
    PARAMS: ClassVar[dict[str, float]] = {**DynamicPolicy.PARAMS, "pause_share": 0.05, "calm_s": 1.0}

    def __init__(self, mtu: int = 1500, **options: Any) -> None:
        super().__init__(mtu, **options)
        self._switch_pausing: dict[str, tuple[float, int]] = {}

    def decide(self, now: float, ports: Mapping[PortKey, PortTelemetry],
               current: Mapping[PortKey, Thresholds]) -> dict[PortKey, Thresholds]:
        # per switch: the largest share of the interval any of its ports held its upstream paused, and the
        # pauses they sent (pause spreading up from this switch: its buffer holds too much)
        pausing: dict[str, tuple[float, int]] = {}
        for (sw, _), s in ports.items():
            share, sent = pausing.get(sw, (0.0, 0))
            pausing[sw] = (max(share, s.pausing_fraction or 0.0), sent + (s.pauses_sent or 0))
        self._switch_pausing = pausing
        return super().decide(now, ports, current)

    def paused(self, s: PortTelemetry) -> bool:
        """Its downstream paused this port's transmitter in the interval."""
        return (s.paused_fraction or 0.0) >= self.p["pause_share"]

    def rule(self, now: float, key: PortKey, s: PortTelemetry, cur: Thresholds, st: _PortState, traffic: bool,
             ports: Mapping[PortKey, PortTelemetry]) -> Step | None:
        p = self.p
        q = self.queue(s)
        share, sent = self._switch_pausing.get(key[0], (0.0, 0))
        spreading = share >= p["pause_share"]
        if self.paused(s) and (traffic or q > 0):
            st.last_pause = now
            return self.cut(cur, f"paused by its downstream {s.paused_fraction or 0.0:.0%} of the interval "
                                 f"({s.pauses_received or 0} pauses): mark before pause spreads")
        if spreading and traffic and q >= frame_bytes(self.mtu):
            st.last_pause = now
            return self.cut(cur, f"its switch pauses its upstream ({share:.0%} of the interval, {sent} pauses) "
                                 f"and this port holds {q} B of its buffer: mark earlier")
        if spreading:
            st.last_pause = now        # a switch that pauses: no rise on any of its ports
        calm = now - st.last_pause >= p["calm_s"] - 1e-9
        if not calm:
            if (traffic and q >= self.pressure_bytes(s.rate_bps)) or s.drops > 0:
                return super().rule(now, key, s, cur, st, traffic, ports)       # a cut all the same
            return None               # pause was here a moment ago: no rise yet
        if (s.paused_fraction is not None and traffic and s.utilisation >= p["u_busy"]
                and q < self.pressure_bytes(s.rate_bps) and s.drops == 0 and (st.m >= p["m_low"] or q > cur.kmin)):
            return self.rise(st, cur, f"elephants, no pause for {p['calm_s']:g} s: "
                                      f"utilisation {st.u:.0%}, marked {st.m:.1%}, queue {q} B: marks only slow them")
        return super().rule(now, key, s, cur, st, traffic, ports)


BUILT_IN: dict[str, type[EcnPolicy]] = {STATIC_POLICY: StaticPolicy, "dynamic": DynamicPolicy,
                                        "pfc-aware": PfcAwarePolicy}


def _from_module(module: Any, attr: str | None, where: str) -> type[EcnPolicy]:
    if attr:
        cls = getattr(module, attr, None)
        if cls is None:
            raise UserError(f"{where} has no {attr!r}")
    else:
        found = [c for _, c in inspect.getmembers(module, inspect.isclass)
                 if issubclass(c, EcnPolicy) and c.__module__ == module.__name__]
        if len(found) != 1:
            raise UserError(f"{where} defines {len(found)} EcnPolicy classes: name one as FILE:CLASS")
        cls = found[0]
    if not (inspect.isclass(cls) and issubclass(cls, EcnPolicy)):
        raise UserError(f"{where}:{attr} is not an EcnPolicy subclass (hpnlab.controller.ecn_policy.EcnPolicy)")
    return cls


def policy_class(spec: str) -> type[EcnPolicy]:
    """``static``, ``dynamic``, ``package.module:Class``, ``path/to/file.py`` or ``path/to/file.py:Class``."""
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    target, _, attr = spec.partition(":") if not spec.endswith(".py") else (spec, "", "")
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise UserError(f"ECN policy file {path} does not exist (built-in policies: {', '.join(BUILT_IN)})")
        mod_spec = importlib.util.spec_from_file_location(f"hpnlab_ecn_policy_{path.stem}", path)
        if mod_spec is None or mod_spec.loader is None:
            raise UserError(f"cannot load ECN policy file {path}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module       # as an import does: dataclasses look their module up there
        try:
            mod_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(mod_spec.name, None)
            raise UserError(f"ECN policy file {path} failed to load: {type(exc).__name__}: {exc}") from None
        return _from_module(module, attr or None, str(path))
    if not attr:
        raise UserError(f"unknown ECN policy {spec!r}: one of {', '.join(BUILT_IN)}, MODULE:CLASS or a .py file")
    try:
        module = importlib.import_module(target)
    except ImportError as exc:
        raise UserError(f"cannot import ECN policy module {target!r}: {exc}") from None
    return _from_module(module, attr, target)


def load(spec: str, mtu: int = 1500, **options: Any) -> EcnPolicy:
    """An instance of the policy ``spec`` names (see :func:`policy_class`); its ``spec`` attribute
    keeps the name it was loaded by (the telemetry file records it, so that a replay loads it again)."""
    policy = policy_class(spec)(mtu=mtu, **options)
    policy.spec = spec
    return policy
