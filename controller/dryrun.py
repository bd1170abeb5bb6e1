"""Dry run, pure: what the controller would change on each switch, from what the switches hold.

``hpnlab controller SCENARIO --dry-run`` connects, reads every switch's flows and groups back
(the reconciler's read-back on connect, see controller/reconcile.py), sends nothing else, and
prints :func:`report` as a table (:func:`format_table`) or JSON. Per switch: the entries to
add (desired, not held), to modify (held under the same table/priority/match, or group id,
with other actions or buckets) and to delete (held, not desired), each described in one line
in ``ovs-ofctl``'s words.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from hpnlab.fabric.scenario.addressing import ip_str

from .reconcile import GroupKey, SwitchTable


def _field(name: str, value) -> str:
    if name in ("ipv4_dst", "ipv4_src", "arp_tpa", "arp_spa"):
        if isinstance(value, tuple):
            return f"{name}={ip_str(value[0])}/{ip_str(value[1])}"
        return f"{name}={ip_str(value) if isinstance(value, int) else value}"
    if isinstance(value, tuple):
        return f"{name}={value[0]:#x}/{value[1]:#x}"
    return f"{name}={value:#x}" if name in ("eth_type", "metadata") and isinstance(value, int) else f"{name}={value}"


def _actions(actions: Iterable[tuple]) -> str:
    out = []
    for act in actions:
        if act[0] == "set_field":
            value = ip_str(act[2]) if act[1] in ("arp_spa", "arp_tpa") and isinstance(act[2], int) else act[2]
            out.append(f"set_field:{value}->{act[1]}")
        elif act[0] == "move":
            out.append(f"move:{act[1]}->{act[2]}")
        elif act[0] == "metadata":
            out.append(f"write_metadata:{act[1]:#x}")
        elif act[0] == "goto":
            out.append(f"goto_table:{act[1]}")
        elif act[0] == "controller":
            out.append("CONTROLLER")
        else:
            out.append(":".join(map(str, act)))
    return ",".join(out) or "drop"


def _watch(w) -> str:
    if isinstance(w, tuple):
        return f"watch_group:{w[1]},"
    return "" if w is None else f"watch_port:{w},"


def describe(key: tuple, value) -> str:
    """One flow entry or group in one line (``ovs-ofctl dump-flows``-like)."""
    if isinstance(key, GroupKey):
        if value is None:
            return f"group_id={key.group_id}"
        buckets = ",".join(f"bucket={_watch(w)}actions={_actions(a)}" for w, a in value.buckets)
        return f"group_id={key.group_id},type={value.kind},{buckets}"
    table, priority, match = key
    head = ",".join([f"table={table}", f"priority={priority}"] + [_field(n, v) for n, v in match])
    return head if value is None else f"{head} actions={_actions(value)}"


def changes(held: SwitchTable, desired: SwitchTable) -> dict[str, list[str]]:
    """{"add", "modify", "delete"}: the entries (described) that differ between what a switch holds
    and what it should hold; nothing when they are equal."""
    out: dict[str, list[str]] = {"add": [], "modify": [], "delete": []}
    for key in sorted(desired, key=_order):
        value = desired[key]
        have = held.get(key)
        if have is None:
            out["add"].append(describe(key, value))
        elif have != value:
            out["modify"].append(describe(key, value) + f"  (holds {describe(key, have).split(' ', 1)[-1]})"
                                 if not isinstance(key, GroupKey) else describe(key, value))
    out["delete"] = [describe(key, held[key]) for key in sorted(held, key=_order) if key not in desired]
    return out


def _order(key: tuple) -> tuple:
    """Groups first (by id), then flows by table, priority (highest first) and match."""
    if isinstance(key, GroupKey):
        return (0, key.group_id, 0, ())
    return (1, key[0], -key[1], tuple(repr(kv) for kv in key[2]))


def _flow_count(table: SwitchTable) -> int:
    return sum(not isinstance(k, GroupKey) for k in table)


def report(scenario: str, expected: Iterable[str], held: Mapping[str, SwitchTable],
           desired: Mapping[str, SwitchTable]) -> dict:
    """The dry run's result as plain values (its JSON): per switch that answered, what it holds,
    what it should hold and the changes; the switches that did not answer."""
    expected = sorted(expected)
    switches = {}
    for sw in expected:
        if sw not in held:
            continue
        have, want = held[sw], desired.get(sw, {})
        switches[sw] = {"held_flows": _flow_count(have), "held_groups": len(have) - _flow_count(have),
                        "desired_flows": _flow_count(want), "desired_groups": len(want) - _flow_count(want),
                        **changes(have, want)}
    return {"scenario": scenario, "expected": len(expected), "switches": switches,
            "missing": [sw for sw in expected if sw not in held]}


def format_table(rep: dict) -> str:
    """The report for people: one row per switch (counts), then every change, switch by switch."""
    rows = [("switch", "holds", "desired", "add", "modify", "delete")]
    for sw, r in rep["switches"].items():
        rows.append((sw, f"{r['held_flows']}+{r['held_groups']}g", f"{r['desired_flows']}+{r['desired_groups']}g",
                     str(len(r["add"])), str(len(r["modify"])), str(len(r["delete"]))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"dry run of {rep['scenario']}: {len(rep['switches'])} of {rep['expected']} switches answered; "
             f"nothing was changed"]
    for row in rows:
        cells = zip(row, widths, strict=True)
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(cells)))
    total = sum(len(r[c]) for r in rep["switches"].values() for c in ("add", "modify", "delete"))
    for sw, r in rep["switches"].items():
        for what in ("add", "modify", "delete"):
            lines += [f"{sw} {what:<6} {entry}" for entry in r[what]]
    if not total and rep["switches"]:
        lines.append("every switch that answered holds exactly what the controller would install")
    if rep["missing"]:
        lines.append(f"no answer from {len(rep['missing'])} switch(es): {', '.join(rep['missing'])}")
    return "\n".join(lines)
