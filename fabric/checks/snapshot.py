"""Snapshots of a compiled fabric: ``hpnlab snapshot SCENARIO`` and ``hpnlab check --against FILE``.

A snapshot is a stable, sorted, diff-friendly summary (YAML, or JSON for a ``.json`` file) of
what the controller compiles for a scenario (policy ``aggregate``) and what the design rules
measure:

    format     "hpnlab-snapshot 1"
    scenario   name, kind, hosts, switches, links, planes, rails (and description)
    roles      per role: switches, routes / flows / groups (min, max, total), the route and
               flow budgets (``switch_tables`` or the rules file; null when none stated)
    switches   per switch (natural order, p0l2 before p0l10): role, routes, flows, groups,
               and for a leaf its prefix and host ports
    paths      per "plane P rail R": equal-cost paths to a leaf of each kind
    rules      the rules that were run (checks of a rule run in only one snapshot are not compared)
    checks     per "rule | subject": figure, limit, ok

:func:`diff` compares two snapshots in readable terms (``leaf p0l3: +2 routes``, ``spine
routes: max 512 → 640 of 1024``, ``check radix | tier leaf: 4 → 6 (limit 64)``) and says
whether a change matters: every change matters except the scenario's description (every other
section is a figure some rule holds against a limit: tables against the budgets, paths against
path diversity, the fabric's size against radix and planes, the checks themselves), so
``hpnlab check --against`` exits 1 on any of them.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from hpnlab.fabric.checks import rules as fcheck
from hpnlab.fabric.errors import UserError, short

FORMAT = "hpnlab-snapshot 1"
#: Largest snapshot read (bytes): hpn-130k's is about 2 MB.
MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
#: Deepest nesting read (a snapshot nests 4 levels).
MAX_DEPTH = 16
#: Changed switches listed one by one before the rest are counted.
MAX_SWITCH_LINES = 30
#: Keys whose change does not fail ``--against`` (informational).
INFORMATIONAL = {("scenario", "description")}


def natural_key(name: str) -> tuple:
    """p0l2 before p0l10: digits compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def _stats(values: list[int]) -> dict[str, int]:
    return {"min": min(values), "max": max(values), "total": sum(values)} if values else \
        {"min": 0, "max": 0, "total": 0}


def take(ctx: fcheck.CheckContext, results: Iterable[fcheck.RuleResult] | None = None,
         rules: fcheck.RulesConfig | None = None, ran: Iterable[str] | None = None) -> dict[str, Any]:
    """The snapshot of a fabric: compiled counts (``ctx.states()``), paths and the check
    results (run here with ``rules`` when ``results`` is None); ``ran``: the rules that were
    run (default: every rule the rules file leaves on)."""
    rules = rules or fcheck.RulesConfig()
    ran = list(fcheck.selected(rules) if ran is None else ran)
    if results is None:
        results = fcheck.run_checks(ctx, rules, only=ran)
    g, s = ctx.graph, ctx.spec
    states = ctx.states()
    node = g._node
    switches: dict[str, dict[str, Any]] = {}
    by_role: dict[str, dict[str, list[int]]] = {}
    for name in sorted(states, key=natural_key):
        st = states[name]
        attrs = node[name]
        row: dict[str, Any] = {"role": attrs["role"], "routes": st.route_count, "flows": st.flow_count,
                               "groups": len(st.groups)}
        if attrs["tier"] == 1 and attrs.get("prefix") is not None:
            row["prefix"] = str(attrs["prefix"])
            row["host_ports"] = sum(len(keys) for n, keys in g._adj[name].items() if node[n]["tier"] == 0)
        switches[name] = row
        acc = by_role.setdefault(attrs["role"], {"routes": [], "flows": [], "groups": []})
        for key in acc:
            acc[key].append(row[key])
    roles: dict[str, Any] = {}
    for role in sorted(by_role, key=fcheck.role_rank):
        acc = by_role[role]
        roles[role] = {"switches": len(acc["routes"]), "routes": _stats(acc["routes"]),
                       "flows": _stats(acc["flows"]), "groups": _stats(acc["groups"]),
                       "route_budget": fcheck.role_limit(rules.limits.get("route-budget", {}), role,
                                                          fcheck.tables_stated(ctx, "routes")),
                       "flow_budget": fcheck.role_limit(rules.limits.get("flow-budget", {}), role,
                                                         fcheck.tables_stated(ctx, "flows"))}
    checks = {f"{r.rule} | {r.subject}": {"figure": fcheck.plain(r.figure), "limit": fcheck.plain(r.limit),
                                          "ok": r.ok} for r in results}
    n_links = g.number_of_edges()
    return {
        "format": FORMAT,
        "scenario": {"name": s.name, "kind": s.kind, "description": s.description.strip(),
                     "hosts": s.hosts, "switches": len(node) - s.hosts, "links": n_links,
                     "planes": s.planes, "rails": s.rails},
        "policy": "aggregate",
        "roles": roles,
        "switches": switches,
        "paths": fcheck.path_counts(ctx),
        "rules": ran,
        "checks": checks,
    }


class _Dumper(yaml.SafeDumper):
    """Never anchors and aliases (a shared value is written out again)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _flow_rows(data: dict[str, Any]) -> str:
    """YAML with one line per switch, path row and check: diff-friendly."""
    head = {k: v for k, v in data.items() if k not in ("switches", "paths", "checks")}
    text = yaml.dump(head, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=120)
    for section in ("switches", "paths", "checks"):
        rows = data[section]
        if not rows:
            text += f"{section}: {{}}\n"
            continue
        text += f"{section}:\n"
        for key, value in rows.items():
            line = yaml.dump({key: value}, Dumper=_Dumper, sort_keys=False, default_flow_style=None,
                             allow_unicode=True, width=100_000)
            text += "  " + line
    return text


def dumps(data: dict[str, Any], fmt: str = "yaml") -> str:
    if fmt == "json":
        return json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    return _flow_rows(data)


def format_for(path: str | None) -> str:
    return "json" if path and path.lower().endswith(".json") else "yaml"


def load(path: str | Path) -> dict[str, Any]:
    """Read a snapshot file (YAML or JSON); a file that is not one is a one-line UserError."""
    p = Path(path)
    source = short(str(path), 200)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_SNAPSHOT_BYTES + 1)
    except OSError as exc:
        raise UserError(f"cannot read snapshot {source}: {exc.strerror or exc}") from None
    if len(raw) > MAX_SNAPSHOT_BYTES:
        raise UserError(f"snapshot {source} is larger than {MAX_SNAPSHOT_BYTES >> 20} MiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"snapshot {source} is not UTF-8 text") from None
    data = _parse(text, source)
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise UserError(f"{source} is not an hpnlab snapshot (no 'format: {FORMAT}'); "
                        "write one with 'hpnlab snapshot SCENARIO -o FILE'")
    for section in ("scenario", "roles", "switches", "paths", "checks"):
        if not isinstance(data.get(section), Mapping):
            raise UserError(f"snapshot {source}: section {section!r} is missing or not a mapping")
    return dict(data)


def _parse(text: str, source: str) -> Any:
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except RecursionError:
            raise UserError(f"snapshot {source}: nested too deep") from None
        except ValueError as exc:
            raise UserError(f"snapshot {source} is not valid JSON: {short(str(exc), 120)}") from None
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        # aliases and deep nesting are refused before anything is built (a snapshot has
        # neither: it nests 4 levels deep)
        depth = 0
        for event in yaml.parse(text, Loader=loader_cls):
            if isinstance(event, yaml.AliasEvent):
                raise UserError(f"snapshot {source}: YAML aliases are not allowed in a snapshot")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise UserError(f"snapshot {source}: nested more than {MAX_DEPTH} levels deep")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return yaml.load(text, Loader=loader_cls)   # CSafeLoader or SafeLoader: safe
    except yaml.YAMLError as exc:
        raise UserError(f"snapshot {source} is not valid YAML: {short(str(exc), 160)}") from None


# ---- comparing two snapshots -------------------------------------------------------------

class Change(NamedTuple):
    text: str
    matters: bool = True


def _signed(n: float) -> str:
    return f"+{n:,}" if n > 0 else f"{n:,}"


def _arrow(a: Any, b: Any) -> str:
    return f"{_show(a)} → {_show(b)}"


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "pass" if value else "FAIL"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """What changed from ``old`` to ``new``, in readable terms, most general first."""
    out: list[Change] = []
    o_s, n_s = old.get("scenario", {}), new.get("scenario", {})
    for key in sorted(set(o_s) | set(n_s)):
        if o_s.get(key) != n_s.get(key):
            out.append(Change(f"scenario {key}: {_arrow(o_s.get(key), n_s.get(key))}"
                              if key != "description" else "scenario description changed",
                              ("scenario", key) not in INFORMATIONAL))
    out += _roles(old.get("roles", {}), new.get("roles", {}))
    out += _switches(old.get("switches", {}), new.get("switches", {}))
    out += _rows("paths", old.get("paths", {}), new.get("paths", {}))
    both = set(old.get("rules") or ()) & set(new.get("rules") or ())
    out += _checks({k: v for k, v in old.get("checks", {}).items() if k.split(" | ")[0] in both},
                   {k: v for k, v in new.get("checks", {}).items() if k.split(" | ")[0] in both})
    return out


def _roles(old: Mapping, new: Mapping) -> list[Change]:
    out = []
    for role in sorted(set(old) | set(new), key=fcheck.role_rank):
        a, b = old.get(role), new.get(role)
        if a is None or b is None:
            out.append(Change(f"{role}: {'new role' if a is None else 'role gone'}"))
            continue
        if a.get("switches") != b.get("switches"):
            out.append(Change(f"{role}: {_arrow(a.get('switches'), b.get('switches'))} switches"))
        for what, budget in (("routes", "route_budget"), ("flows", "flow_budget"), ("groups", None)):
            ma, mb = (a.get(what) or {}).get("max"), (b.get(what) or {}).get("max")
            limit = b.get(budget) if budget else None
            if ma != mb:
                of = f" of {_show(limit)}" if limit is not None else ""
                out.append(Change(f"{role} {what} budget: max {_arrow(ma, mb)}{of}" if budget
                                  else f"{role} {what}: max {_arrow(ma, mb)}"))
            if budget and a.get(budget) != b.get(budget):
                out.append(Change(f"{role} {what} budget limit: {_arrow(a.get(budget), b.get(budget))}"))
    return out


def _switches(old: Mapping, new: Mapping) -> list[Change]:
    out: list[Change] = []
    added = sorted(set(new) - set(old), key=natural_key)
    gone = sorted(set(old) - set(new), key=natural_key)
    if added:
        out.append(Change(f"+{len(added):,} switch(es): {_some(added)}"))
    if gone:
        out.append(Change(f"-{len(gone):,} switch(es): {_some(gone)}"))
    changed = []
    for name in sorted(set(old) & set(new), key=natural_key):
        a, b = old[name], new[name]
        if a == b:
            continue
        parts = []
        for key in ("routes", "flows", "groups", "host_ports"):
            if a.get(key) != b.get(key):
                if isinstance(a.get(key), int) and isinstance(b.get(key), int):
                    parts.append(f"{_signed(b[key] - a[key])} {key}")
                else:
                    parts.append(f"{key} {_arrow(a.get(key), b.get(key))}")
        for key in sorted((set(a) | set(b)) - {"routes", "flows", "groups", "host_ports"}):
            if a.get(key) != b.get(key):
                parts.append(f"{key} {_arrow(a.get(key), b.get(key))}")
        changed.append(f"{b.get('role', '?')} {name}: {', '.join(parts)}")
    for line in changed[:MAX_SWITCH_LINES]:
        out.append(Change(line))
    if len(changed) > MAX_SWITCH_LINES:
        out.append(Change(f"... and {len(changed) - MAX_SWITCH_LINES:,} more switches changed"))
    return out


def _some(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f" ... ({len(names) - n:,} more)" if len(names) > n else "")


def _rows(section: str, old: Mapping, new: Mapping) -> list[Change]:
    out = []
    for key in sorted(set(old) | set(new), key=natural_key):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            parts = [f"{k} {_arrow(a.get(k), b.get(k))}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            out.append(Change(f"{section} {key}: {', '.join(parts)}"))
        else:
            out.append(Change(f"{section} {key}: {'new' if a is None else 'gone' if b is None else _arrow(a, b)}"))
    return out


def _checks(old: Mapping, new: Mapping) -> list[Change]:
    out = []
    for key in list(old) + [k for k in new if k not in old]:
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if a is None or b is None:
            out.append(Change(f"check {key}: {'new' if a is None else 'gone'}"
                              + (f" ({_show(b.get('figure'))}, {_show(b.get('ok'))})" if b else "")))
            continue
        text = _arrow(a.get("figure"), b.get("figure")) if a.get("figure") != b.get("figure") else "same figure"
        if a.get("limit") != b.get("limit"):
            text += f", limit {_arrow(a.get('limit'), b.get('limit'))}"
        elif b.get("limit") is not None:
            text += f" (limit {_show(b.get('limit'))})"
        if a.get("ok") != b.get("ok"):
            text += f", {_arrow(a.get('ok'), b.get('ok'))}"
        out.append(Change(f"check {key}: {text}"))
    return out
