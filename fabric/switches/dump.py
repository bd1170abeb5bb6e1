"""What simulated switches hold, written to and read from a directory (one JSON file per switch, the compiler's
values), and the proofs run on it: ``hpnlab check``'s failure-tolerance walk on what a controller installed.

    {"name": "p0l0", "dpid": 72057594037927936,
     "flows": [[table, priority, match, actions], ...], "groups": [[group_id, kind, buckets], ...]}

Tuples are written as JSON lists and read back as tuples (matches, actions and buckets are tuples all the way
down in the compiler's values).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.routing import compiler, proofs


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def write(directory: Path, states: Mapping[str, compiler.SwitchState]) -> int:
    """One ``NAME.json`` per switch in ``directory`` (made if missing); how many were written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, st in states.items():
        data = {"name": name, "dpid": st.dpid,
                "flows": [[f.table, f.priority, f.match, f.actions] for f in st.flows],
                "groups": [[g.group_id, g.kind, g.buckets] for g in st.groups]}
        tmp = directory / f".{name}.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(directory / f"{name}.json")
    return len(states)


def read(directory: Path) -> dict[str, compiler.SwitchState]:
    """The switch states a ``write`` left in ``directory``."""
    directory = Path(directory)
    files = sorted(directory.glob("*.json"))
    if not files:
        raise UserError(f"no switch tables in {directory} (write them with 'dump DIR' on the control socket)")
    out = {}
    for path in files:
        try:
            d = json.loads(path.read_text())
            flows = tuple(compiler.Flow(t, p, _tuples(m), _tuples(a)) for t, p, m, a in d["flows"])
            groups = tuple(compiler.Group(gid, kind, _tuples(b)) for gid, kind, b in d["groups"])
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}: not a switch table dump ({exc})") from None
        out[d["name"]] = compiler.SwitchState(d["name"], d["dpid"], flows, groups)
    return out


def expanded(states: Mapping[str, compiler.SwitchState], skip_eth_types: frozenset = frozenset()
             ) -> dict[str, tuple[dict, dict]]:
    """Per switch ({(table, priority, match sorted by field): actions}, {group id: Group}) of concrete entries:
    what two states are compared on (the compiler's compact host-route blocks expanded). Entries matching an
    EtherType of ``skip_eth_types`` are left out (a controller's own rules, e.g. LLDP's 0x88cc)."""
    out = {}
    for n, st in states.items():
        flows = {}
        for (table, prio, match), actions in st.expanded().items():
            if not any(k == "eth_type" and v in skip_eth_types for k, v in match):
                flows[table, prio, tuple(sorted(match))] = actions
        out[n] = (flows, {g.group_id: g for g in st.groups})
    return out


def prove_installed(g: nx.MultiGraph, states: Mapping[str, compiler.SwitchState],
                    failures: compiler.Failures | None = None) -> proofs.Verdict:
    """The failure-tolerance walk (``hpnlab check``'s) on installed tables: every pair class walked through
    ``states`` with ``failures`` failed (none: the healthy fabric)."""
    sym = proofs.symmetry_of(g)
    failure = proofs.Failure("installed", failures or compiler.Failures())
    pairs = list(sym.pair_classes(sym.anchors(failure)).values())
    return proofs.prove_failure(g, failure, pairs, dict(states))
