"""The deployment file, pure: the scenario's switches on real datapath ids and port numbers.

The graph derives every switch's datapath id and numbers its ports from 1; real switches have
their own. A deployment file maps one onto the other (YAML)::

    scenario: mini-hpn               # optional; checked against the scenario when given
    switches:
      p0l0:
        dpid: "0x00000000000000a1"    # an integer, 0x-hex or colon-separated hex (00:00:...:a1)
        ports: {1: 17, 2: 18, 5: 49, 6: 50}    # scenario port -> the switch's OpenFlow port
      p0s0:
        dpid: 161                    # no ports: the scenario's numbers are the switch's

Every switch of the scenario is listed; a switch given ``ports`` maps every port the scenario
uses on it. ``load`` checks the whole file and raises one UserError with one line per mistake
(unknown switch, switch not listed, bad or duplicate dpid, a port that is no port of the switch
in the scenario, a port used twice, a port of a link missing, ...). ``apply`` returns the graph
with the file's numbers, which the compiler, the reconciler and the wiring check then use as they
are: the controller never sees the scenario's numbers again (``hpnlab controller --deployment``).

``from_discovery`` fills the map from what LLDP heard (``--deployment auto`` writes it): switches
whose datapath id is the derived one keep their name, the others are matched by the shape of the
wiring (networkx graph isomorphism over the switch-to-switch links); host ports cannot be heard
(hosts send no LLDP) and keep the scenario's numbers.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import networkx as nx
import yaml

from hpnlab.fabric.errors import UserError

MAX_DPID = (1 << 64) - 1
MAX_PORT = 0xFFFFFF00        # OFPP_MAX: the highest physical port number in OpenFlow 1.3
SWITCH_KEYS = {"dpid", "ports"}

Dpids = dict[str, int]                  # switch -> datapath id
PortMaps = dict[str, dict[int, int]]    # switch -> scenario port -> OpenFlow port


def parse_dpid(value: object) -> int | None:
    """A datapath id from an int, ``0x`` hex, plain hex digits or colon-separated hex; None if not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        out = value
    elif isinstance(value, str):
        text = value.strip().lower().replace(":", "")
        try:
            out = int(text, 16) if ":" in value or text.startswith("0x") or len(text) == 16 else int(text)
        except ValueError:
            return None
    else:
        return None
    return out if 0 < out <= MAX_DPID else None


def switch_ports(g: nx.MultiGraph, switch: str) -> set[int]:
    """The ports the scenario uses on a switch."""
    return {d["ports"][switch] for _u, _v, d in g.edges(switch, data=True)}


def validate(g: nx.MultiGraph, data: object, source: str = "deployment") -> tuple[Dpids, PortMaps, list[str]]:
    """(dpids, port maps, mistakes): every mistake as one line."""
    errors: list[str] = []
    dpids: dict[str, int] = {}
    maps: dict[str, dict[int, int]] = {}
    if not isinstance(data, Mapping) or not isinstance(data.get("switches"), Mapping):
        return dpids, maps, [f"{source}: expected a mapping with a 'switches' mapping (switch -> dpid, ports)"]
    scenario = g.graph["scenario"].name
    if data.get("scenario") not in (None, scenario):
        errors.append(f"{source}: written for scenario {data['scenario']!r}, the controller runs {scenario!r}")
    for key in sorted(set(data) - {"scenario", "switches"}):
        errors.append(f"{source}: unknown key {key!r} (known: scenario, switches)")
    switches = sorted(n for n, d in g.nodes(data=True) if d["tier"] > 0)
    listed = data["switches"]
    for name in sorted(map(str, listed)):
        if name not in g.nodes or g.nodes[name]["tier"] == 0:
            errors.append(f"{source}: switch {name} is not a switch of scenario {scenario} "
                          f"(its switches: {', '.join(switches[:4])}, ...)")
    owner: dict[int, str] = {}
    for name in switches:
        entry = listed.get(name)
        if entry is None:
            errors.append(f"{source}: switch {name} of scenario {scenario} is missing (give its dpid)")
            continue
        if not isinstance(entry, Mapping):
            errors.append(f"{source}: switch {name}: expected a mapping with dpid (and ports), got {entry!r}")
            continue
        for key in sorted(set(map(str, entry)) - SWITCH_KEYS):
            errors.append(f"{source}: switch {name}: unknown key {key!r} (known: dpid, ports)")
        dpid = parse_dpid(entry.get("dpid"))
        if dpid is None:
            errors.append(f"{source}: switch {name}: dpid {entry.get('dpid')!r} is not a datapath id "
                          f"(an integer 1..2^64-1, 0x-hex or 00:00:..:01)")
        elif dpid in owner:
            errors.append(f"{source}: switch {name}: dpid {dpid:#018x} is already {owner[dpid]}'s")
        else:
            owner[dpid] = name
            dpids[name] = dpid
        ports = entry.get("ports")
        if ports is None:
            continue
        if not isinstance(ports, Mapping):
            errors.append(f"{source}: switch {name}: ports must map scenario port -> OpenFlow port, got {ports!r}")
            continue
        used = switch_ports(g, name)
        mapped: dict[int, int] = {}
        taken: dict[int, int] = {}
        for key, value in ports.items():
            if not isinstance(key, int) or isinstance(key, bool) or key not in used:
                errors.append(f"{source}: switch {name}: port {key!r} is not a port scenario {scenario} uses on it "
                              f"(it uses {', '.join(map(str, sorted(used)))})")
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_PORT:
                errors.append(f"{source}: switch {name}: port {key} -> {value!r} is not an OpenFlow port number "
                              f"(1..{MAX_PORT:#x})")
                continue
            if value in taken:
                errors.append(f"{source}: switch {name}: OpenFlow port {value} is used twice "
                              f"(scenario ports {taken[value]} and {key})")
                continue
            taken[value] = key
            mapped[key] = value
        for port in sorted(used - set(ports)):
            peer = next(v if u == name else u for u, v, d in g.edges(name, data=True) if d["ports"][name] == port)
            errors.append(f"{source}: switch {name}: port {port} (to {peer}) is missing from its ports")
        maps[name] = mapped
    return dpids, maps, errors


def load(g: nx.MultiGraph, path: str | Path) -> dict:
    """Read and check a deployment file; UserError with one line per mistake. Returns its content."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise UserError(f"deployment file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"deployment file {path} is not YAML: {str(exc).splitlines()[0]}") from None
    _dpids, _maps, errors = validate(g, data, str(path))
    if errors:
        raise UserError("\n".join(errors))
    return data


def apply(g: nx.MultiGraph, data: Mapping) -> nx.MultiGraph:
    """The graph with the deployment's datapath ids and port numbers (``data`` as ``load`` returns it)."""
    dpids, maps, errors = validate(g, data)
    if errors:
        raise UserError(errors[0])
    out = g.copy()
    out.graph.pop("_controller_index", None)
    for name, dpid in dpids.items():
        out.nodes[name]["dpid"] = dpid
    for u, v, k, d in list(out.edges(keys=True, data=True)):
        out.edges[u, v, k]["ports"] = {n: maps.get(n, {}).get(p, p) for n, p in d["ports"].items()}
    return out


def dump(g: nx.MultiGraph, dpids: Mapping[str, int], maps: Mapping[str, Mapping[int, int]]) -> str:
    """A deployment file's text."""
    switches = {}
    for name in sorted(n for n, d in g.nodes(data=True) if d["tier"] > 0):
        entry: dict = {"dpid": f"{dpids.get(name, g.nodes[name]['dpid']):#018x}"}
        if maps.get(name):
            entry["ports"] = {int(k): int(v) for k, v in sorted(maps[name].items())}
        switches[name] = entry
    return yaml.safe_dump({"scenario": g.graph["scenario"].name, "switches": switches}, sort_keys=False)


def from_discovery(g: nx.MultiGraph, links: Mapping[tuple[int, int], tuple[int, int]]) -> tuple[Dpids, PortMaps]:
    """(dpids, port maps) from what LLDP heard: ``links`` maps a receiving (dpid, port) to the sending
    (dpid, port). Raises UserError when the heard wiring does not have the scenario's shape."""
    heard = nx.MultiGraph()
    pairs = {tuple(sorted((rx, tx))) for rx, tx in links.items()}
    for a, b in pairs:
        heard.add_edge(a[0], b[0], ports={a[0]: a[1], b[0]: b[1]})
    planned = nx.MultiGraph()
    for u, v, d in g.edges(data=True):
        if g.nodes[u]["tier"] > 0 and g.nodes[v]["tier"] > 0:
            planned.add_edge(u, v, ports=d["ports"])
    derived = {d["dpid"]: n for n, d in g.nodes(data=True) if d["tier"] > 0}
    for n in planned:
        planned.nodes[n]["pin"] = n
    for dpid in heard:
        heard.nodes[dpid]["pin"] = derived.get(dpid)
    matcher = nx.algorithms.isomorphism.MultiGraphMatcher(
        planned, heard, node_match=lambda a, b: b["pin"] is None or a["pin"] == b["pin"])
    mapping = next(matcher.isomorphisms_iter(), None)
    if mapping is None:
        raise UserError(f"the wiring LLDP heard ({heard.number_of_nodes()} switches, {heard.number_of_edges()} links) "
                        f"does not have the shape of scenario {g.graph['scenario'].name} "
                        f"({planned.number_of_nodes()} switches, {planned.number_of_edges()} links): "
                        f"fix the cabling or write the deployment file by hand")
    dpids = dict(mapping)
    maps: dict[str, dict[int, int]] = {}
    for u, v in {tuple(sorted(e)) for e in planned.edges()}:
        want = sorted((d["ports"][u], d["ports"][v]) for d in planned[u][v].values())
        have = sorted((d["ports"][dpids[u]], d["ports"][dpids[v]]) for d in heard[dpids[u]][dpids[v]].values())
        for (pu, pv), (hu, hv) in zip(want, have, strict=True):
            maps.setdefault(u, {})[pu] = hu
            maps.setdefault(v, {})[pv] = hv
    for name in maps:      # host ports keep the scenario's numbers
        for port in switch_ports(g, name) - set(maps[name]):
            maps[name][port] = port
    return dpids, maps
