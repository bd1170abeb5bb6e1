"""Weighted multipath ("weighted" mode): the pure decision (fabric/routing/weights.py) on synthetic
telemetry, the widened and weighted entropy tables (fabric/routing/compiler.py), proven with the table
interpreter, and the reconciler sending only the entries whose pattern moved."""
from __future__ import annotations

import json
import random

import pytest
from support.fabrics import answer, fabric

from hpnlab.controller import reconcile
from hpnlab.fabric.routing import compiler, weights
from hpnlab.fabric.routing.compiler import EntropySet
from hpnlab.fabric.routing.oftable import FabricTables
from hpnlab.fabric.routing.telemetry import PortTelemetry
from hpnlab.fabric.scenario import graph

A, B = 5, 6                                        # the two uplinks of the synthetic set
SET = EntropySet(0x10, 0x7, (A, B), ((("output", A),), (("output", B),)), (A, B) * 4)
INTERVAL = 0.2


def sample(util: float, queue: int | None = None, ce: float = 0.0) -> PortTelemetry:
    return PortTelemetry(t=0.0, rate_bps=1e7, tx_bps=util * 1e7, utilisation=util, queue_bytes=queue,
                         ce_fraction=ce)


def run(w: weights.Weights, loads, ticks: int, start: float = 0.0, dead=None, sets=None) -> list:
    """``ticks`` intervals of ``loads`` ((util A, util B), or a function of the tick giving them)."""
    changes = []
    for i in range(ticks):
        ua, ub = loads(i) if callable(loads) else loads
        now = start + i * INTERVAL
        changes += w.decide(now, {("s", A): sample(ua), ("s", B): sample(ub)}, sets or {"s": {SET.meta: SET}},
                            dead)
    return changes


def counts(w: weights.Weights) -> dict[int, int]:
    return w.sets["s", SET.meta].counts


# ---- the decision ------------------------------------------------------------------------------

def test_equal_loads_keep_equal_weights():
    w = weights.Weights()
    assert run(w, (0.6, 0.6), 50) == []
    assert counts(w) == {A: 4, B: 4}


def test_a_loaded_uplink_loses_patterns_to_the_idle_one():
    w = weights.Weights()
    changes = run(w, (0.9, 0.2), 30)
    assert changes and changes[0].reason == "load"
    assert counts(w)[A] < 4 < counts(w)[B]
    assert changes[-1].assignment.count(A) == counts(w)[A]


def test_a_reweightings_telemetry_record_carries_the_patterns_before_and_after():
    w = weights.Weights()
    first = run(w, (0.9, 0.2), 30)[0]
    rec = json.loads(json.dumps(first.as_dict(12.5)))
    assert (rec["kind"], rec["t"], rec["switch"], rec["set"]) == ("weights", 12.5, "s", SET.meta)
    assert rec["previous"] == {str(A): 4, str(B): 4}
    assert int(rec["counts"][str(A)]) < 4 and rec["reason"] == "load"


def test_weights_return_to_the_exact_ecmp_assignment_when_the_load_clears():
    w = weights.Weights()
    run(w, (0.9, 0.2), 30)
    assert counts(w)[A] < 4
    run(w, (0.4, 0.4), 60, start=100.0)
    assert counts(w) == {A: 4, B: 4}
    assert w.sets["s", SET.meta].assignment == SET.assignment


def test_noisy_equal_loads_never_change_the_weights():
    rng = random.Random(1)
    w = weights.Weights()
    assert run(w, lambda _i: (0.5 + rng.uniform(-0.1, 0.1), 0.5 + rng.uniform(-0.1, 0.1)), 300) == []


def test_equal_loads_with_bursty_queues_barely_move_the_weights():
    """Both uplinks busy alike, a burst's queue on either one interval in four (what the emulated
    fabric's telemetry shows): the old policy re-weighted 31-40 times a minute on these samples."""
    rng = random.Random(7)

    def queue() -> int:
        return rng.choice([0, 0, 0, rng.randint(0, 150_000)])
    w = weights.Weights()
    changes = []
    for i in range(300):                                   # a minute of 200 ms intervals
        changes += w.decide(i * INTERVAL, {("s", A): sample(0.9, queue()), ("s", B): sample(0.9, queue())},
                            {"s": {SET.meta: SET}})
    assert len(changes) <= 4


def test_noisy_unequal_loads_settle_and_do_not_oscillate():
    rng = random.Random(2)
    w = weights.Weights()
    noisy = lambda _i: (0.8 + rng.uniform(-0.05, 0.05), 0.3 + rng.uniform(-0.05, 0.05))  # noqa: E731
    settling = run(w, noisy, 25)
    assert settling
    assert run(w, noisy, 300, start=25 * INTERVAL) == []


def test_a_load_that_follows_the_weights_converges_instead_of_swinging():
    """Each uplink's load is what the set sends it (a saturating set): undamped headroom shares
    would swap the two uplinks every interval."""
    w = weights.Weights()
    history = []

    def loads(_i):
        c = counts(w) if ("s", SET.meta) in w.sets else {A: 4, B: 4}
        history.append(c[A])
        return (0.3 + 0.9 * c[A] / 8, 0.9 * c[B] / 8)
    run(w, loads, 200)
    tail = history[-100:]
    assert max(tail) - min(tail) <= 1 and len({*tail}) <= 2


def test_the_hold_time_spaces_changes_of_one_set():
    w = weights.Weights(weights.WeightParams(hold_s=2.0))
    changes = run(w, lambda i: (0.95, 0.05) if i % 2 == 0 else (0.05, 0.95), 40)
    times = [i for i, _c in enumerate(changes)]
    assert len(changes) <= 40 * INTERVAL / 2.0 + 1, times


def test_every_live_uplink_keeps_a_pattern_however_loaded():
    w = weights.Weights()
    run(w, (5.0, 0.0), 50)
    assert counts(w)[A] == 1 and counts(w)[B] == 7


def test_a_dead_uplink_gets_no_pattern_even_when_idle():
    w = weights.Weights()
    changes = run(w, (0.0, 0.9), 5, dead={"s": {A}})
    assert changes and "dead" in changes[0].reason
    assert counts(w) == {A: 0, B: 8}
    assert A not in w.sets["s", SET.meta].assignment
    run(w, (0.0, 0.9), 50, start=10.0, dead={"s": {A}})
    assert counts(w)[A] == 0


def test_an_uplink_that_comes_back_gets_its_share_at_once():
    w = weights.Weights()
    run(w, (0.0, 0.5), 5, dead={"s": {A}})
    [back] = run(w, (0.0, 0.5), 1, start=10.0)
    assert back.reason == "every port live again" and back.counts[A] >= 4


def test_queue_and_ce_count_as_load_where_utilisation_does_not_show_it():
    """A port shaped below its rate: its utilisation looks like its sibling's, its queue and CE do not."""
    w = weights.Weights()
    for i in range(30):
        w.decide(i * INTERVAL, {("s", A): sample(0.5, queue=80_000, ce=0.05), ("s", B): sample(0.5, queue=0)},
                 {"s": {SET.meta: SET}})
    assert counts(w)[A] < 4


def test_apportion_keeps_the_minimum_and_the_total():
    assert weights.apportion({1: 0.98, 2: 0.01, 3: 0.01}, 8) == {1: 6, 2: 1, 3: 1}
    assert weights.apportion({1: 0.5, 2: 0.0}, 8) == {1: 8, 2: 0}
    assert sum(weights.apportion({1: 0.3, 2: 0.3, 3: 0.4}, 16).values()) == 16


def test_reassign_moves_only_the_patterns_it_must():
    base = (A, B) * 4
    new = weights.reassign(base, {A: 2, B: 6}, base)
    assert sum(x != y for x, y in zip(base, new, strict=True)) == 2 and new.count(A) == 2
    assert weights.reassign(new, {A: 4, B: 4}, base) == base


# ---- the tables ----------------------------------------------------------------------------------

def test_weighted_mode_gives_mini_hpn_leaves_eight_patterns_per_two_uplinks():
    g = fabric("mini-hpn")
    tables = weights.WeightedTables(g)
    tables(g)
    sets = tables.sets()
    leaves = [s for s in graph.switches(g) if g.nodes[s]["tier"] == 1]
    assert set(sets) == set(leaves)
    for sw in leaves:
        [es] = sets[sw].values()
        assert es.patterns == 8 and es.counts() == dict.fromkeys(es.ports, 4)


def test_widened_masks_use_only_bits_the_entropy_map_leaves_free():
    for name in ("mini-hpn", "mini-cross-campus", "small-hpn"):
        m = compiler.entropy_map(fabric(name))
        masks = compiler.weighted_masks(m)
        free = ~((1 << m.width) - 1)
        extra = [wide & ~narrow for narrow, wide in masks.items()]
        assert all(e & free == e for e in extra)
        assert all(a & b == 0 for i, a in enumerate(extra) for b in extra[i + 1:])
        for f in m.fields:
            wide = masks.get(f.mask, f.mask)
            assert 1 << bin(wide).count("1") >= compiler.WEIGHT_PATTERNS_PER_PORT * f.radix


@pytest.mark.parametrize("name", ["mini-hpn", "mini-cross-campus"])
def test_widened_tables_send_every_source_port_where_ecmp_tables_do(name):
    g = fabric(name)
    plain = FabricTables(g, compiler.compile_fabric(g))
    wide = FabricTables(g, weights.WeightedTables(g)(g))
    ports = wide.entropy_ports()
    for src, dst, plane, sr, dr in plain.all_pairs()[::7]:
        for sport in ports:
            a = plain.send(src, dst, plane, src_rail=sr, dst_rail=dr, sport=sport)
            b = wide.send(src, dst, plane, src_rail=sr, dst_rail=dr, sport=sport)
            assert a.result == b.result == "delivered" and a.hops == b.hops


def skewed(tables: weights.WeightedTables, rng: random.Random) -> list[weights.Change]:
    """A random, lopsided assignment for every set (each port keeps one pattern at least)."""
    out = []
    for sw, sets in tables.sets().items():
        for meta, es in sets.items():
            a = list(es.ports) + [rng.choice(es.ports[:1]) for _ in range(es.patterns - len(es.ports))]
            rng.shuffle(a)
            out.append(weights.Change(sw, meta, tuple(a), {}, {}))
    return out


def delivered_everywhere(g, states, failures: compiler.Failures | None = None) -> None:
    failures = failures or compiler.Failures()
    net = FabricTables(g, states, failures)
    for src, dst, plane, sr, dr in net.all_pairs():
        if not (net.live(src, plane, sr) and net.live(dst, plane, dr)):
            continue
        for sport, _fixed, walk in net.send_branches(src, dst, plane, src_rail=sr, dst_rail=dr):
            assert walk.result == "delivered", (src, dst, plane, hex(sport), walk.where, walk.hops)


@pytest.mark.parametrize("name", ["mini-hpn", "mini-cross-campus"])
def test_every_pair_is_delivered_on_every_branch_with_skewed_weights(name):
    g = fabric(name)
    tables = weights.WeightedTables(g)
    states = tables(g)
    states.update(tables.restate(skewed(tables, random.Random(3))))
    assert any(es.counts() != s.counts() for sw, sets in tables.sets().items()
               for m, es in compiler.entropy_sets(states[sw]).items() for s in [sets[m]])
    delivered_everywhere(g, states)


def test_skewed_weights_stay_safe_under_every_single_leaf_uplink_failure():
    """Routes that avoid a port read the avoid entries, which weighted mode completes: no pattern
    of a route avoiding port j falls through to a weighted entry sending to j."""
    g = fabric("mini-hpn")
    for u, v, k in g.edges(keys=True):
        if {g.nodes[u]["tier"], g.nodes[v]["tier"]} != {1, 2} or g.nodes[u]["plane"] != 0:
            continue
        tables = weights.WeightedTables(g)
        tables(g)
        tables.restate(skewed(tables, random.Random(4)))
        failures = compiler.Failures.of([(u, v, k)])
        delivered_everywhere(g, tables(g, failures), failures)


# ---- the reconciler ----------------------------------------------------------------------------

def test_a_reweighting_sends_three_flow_mods_per_moved_pattern_and_nothing_else():
    g = fabric("mini-hpn")
    tables = weights.WeightedTables(g)
    rec = reconcile.Reconciler(g, compile_fn=tables)
    msgs = []
    for sw in graph.switches(g):
        msgs += rec.handle(reconcile.SwitchUp(sw))
    answer(rec, msgs)
    assert rec.settled
    sw = "p0l0"
    [es] = tables.sets()[sw].values()
    a = weights.reassign(es.assignment, {es.ports[0]: 2, es.ports[1]: 6}, es.assignment)
    sent = answer(rec, rec.handle(reconcile.Restate(tables.restate([weights.Change(sw, es.meta, a, {}, {})]))))
    mods = [m for m in sent if isinstance(m, (reconcile.FlowMod, reconcile.GroupMod))]
    assert rec.settled
    assert len(mods) == 3 * 2
    assert all(isinstance(m, reconcile.FlowMod) and m.switch == sw and m.command == "modify"
               and m.table == compiler.TABLE_ENTROPY for m in mods)


# ---- the metrics endpoint ------------------------------------------------------------------------

def test_weights_and_loads_are_exported_per_switch_and_port():
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    from hpnlab.controller.metrics import Metrics
    w = weights.Weights()
    run(w, (0.9, 0.2), 30)
    m = Metrics()
    m.update_weights(w, {"s": {SET.meta: SET}})
    text = generate_latest(m.registry).decode()
    assert f'hpnlab_multipath_weight_patterns{{port="{A}",set="0x10",switch="s"}} {float(counts(w)[A])}' in text
    assert f'hpnlab_multipath_load_score{{port="{B}",switch="s"}} {w.scores["s", B]}' in text
    assert f"hpnlab_multipath_weight_changes_total {float(w.n_changes)}" in text


def test_disabled_weights_restore_the_ecmp_assignment_and_keep_it():
    w = weights.Weights()
    run(w, (0.9, 0.2), 30)
    w.enabled = False
    [back] = run(w, (0.9, 0.2), 1, start=50.0)
    assert back.reason == "ecmp mode" and back.assignment == SET.assignment
    assert run(w, (0.9, 0.2), 20, start=60.0) == []


def test_weighted_mode_without_telemetry_is_one_line_and_exit_code_2():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "hpnlab.controller", "mini-hpn", "--routing-weights", "weighted",
                        "--telemetry-interval-ms", "0"], capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "needs telemetry" in lines[0]


def test_every_pair_stays_delivered_at_every_step_of_a_reweighting():
    """The reconciler's messages for a re-weighting of a leaf of each plane, replayed one by one through the
    table interpreter: no pair is lost or loops at any intermediate state (tests/support/replay.py)."""
    from support.replay import Replay

    g = fabric("mini-hpn")
    tables = weights.WeightedTables(g)
    replay = Replay(g, "aggregate", compile_fn=tables)
    replay.start()
    replay.sports = replay.net.entropy_ports()
    assert len(replay.sports) == 8
    replay.begin("monotone")
    changes = [c for c in skewed(tables, random.Random(5)) if c.switch in ("p0l0", "p1l3")]
    replay.feed(reconcile.Restate(tables.restate(changes)))
    replay.drain()
    replay.end()
    assert replay.counts.states > 1 and not replay.counts.problems, replay.counts.problems[:3]
