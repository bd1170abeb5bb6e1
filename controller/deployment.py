"""The deployment file, pure: the scenario's switches on real datapath ids and port numbers.

The graph derives every switch's datapath id and numbers its ports from 1; real switches have
their own. A deployment file maps one onto the other (YAML)::

    scenario: mini-hpn               # optional; checked against the scenario when given
    switches:
      p0l0:
        dpid: "0x00000000000000a1"    # an integer, 0x-hex or colon-separated hex (00:00:...:a1)
        ports: {1: 17, 2: 18, 5: 49, 6: 50}    # scenario port -> the switch's OpenFlow port
      p0l1:
        dpid: "0x00000000000000a2"
        ports: {1: swp1, 2: swp2, p0l1-eth5: Ethernet48, 6: 50}   # ... or the switch's port NAME
      p0s0:
        dpid: 161                    # no ports: the scenario's numbers are the switch's

Every switch of the scenario is listed; a switch given ``ports`` maps every port the scenario
uses on it. A scenario port is its number or the graph's name for it (``<switch>-eth<port>``, the
emulation's interface name); a switch port is its OpenFlow number or its name as the switch
reports it (``Ethernet12``, ``swp3``, ``eth1/1/3``). Names are resolved when the switch connects,
against its port descriptions (``resolve``: OFPPortDescStatsReply gives name and number); a name
the switch does not have is one line then, and the controller holds that switch's plane back.
Until a switch's names are resolved its named ports stand on placeholders (``placeholder``:
negative numbers, which no switch has), so nothing can be installed onto a guessed port.

``load`` checks the whole file and raises one UserError with one line per mistake (unknown
switch, switch not listed, bad or duplicate dpid, a port that is no port of the switch in the
scenario, a port or a name used twice, a port of a link missing, ...). ``apply`` returns the graph
with the file's numbers, which the compiler, the reconciler and the wiring check then use as they
are: the controller never sees the scenario's numbers again (``hpnlab controller --deployment``).

``from_discovery`` fills the map from what LLDP heard (``--deployment auto`` adopts it once
discovery settles, ``adoption``, installs through the wiring check and writes it): switches
whose datapath id is the derived one keep their name, the others are matched by the shape of the
wiring (networkx graph isomorphism over the switch-to-switch links); host ports cannot be heard
(hosts send no LLDP) and keep the scenario's numbers. Symmetric switches (the leaves of identical
planes, on datapath ids of their own) are told apart by the hosts seen behind them: the scenario
knows each host port's MAC, so the source MAC of a frame a host sent (an ARP request reaching the
controller) pins the switch it arrived at to that host's leaf (``hosts`` of ``from_discovery``).
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import networkx as nx
import yaml

from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph as fgraph

MAX_DPID = (1 << 64) - 1
MAX_PORT = 0xFFFFFF00        # OFPP_MAX: the highest physical port number in OpenFlow 1.3
SWITCH_KEYS = {"dpid", "ports"}

Dpids = dict[str, int]                  # switch -> datapath id
HostsSeen = Mapping[tuple[int, int], str]   # (dpid, port) a host's frame arrived at -> its source MAC
PortMaps = dict[str, dict[int, int]]    # switch -> scenario port -> OpenFlow port
PortRef = int | str                     # a switch port: its OpenFlow number or its name
NamedMaps = dict[str, dict[int, PortRef]]   # switch -> scenario port -> OpenFlow port or port name


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


def scenario_port(g: nx.MultiGraph, switch: str, key: object) -> int | None:
    """A scenario port given as its number or as the graph's name for it (``p0l0-eth5``); None if neither."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    prefix = fgraph.intf_name(switch, 0)[:-1]
    if isinstance(key, str) and key.startswith(prefix) and key[len(prefix):].isdigit():
        return int(key[len(prefix):])
    return None


def placeholder(switch_ports_sorted: list[int], port: int) -> int:
    """The number a named port stands on until its switch resolves the name: negative, unique per switch."""
    return -1 - switch_ports_sorted.index(port)


def validate(g: nx.MultiGraph, data: object, source: str = "deployment") -> tuple[Dpids, NamedMaps, list[str]]:
    """(dpids, port maps, mistakes): every mistake as one line. A port map's values are OpenFlow port
    numbers or port names (``resolve`` turns names into numbers once the switch has told its own)."""
    errors: list[str] = []
    dpids: dict[str, int] = {}
    maps: NamedMaps = {}
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
            errors.append(f"{source}: switch {name}: ports must map scenario port -> OpenFlow port or port name, "
                          f"got {ports!r}")
            continue
        used = switch_ports(g, name)
        mapped: dict[int, PortRef] = {}
        taken: dict[PortRef, int] = {}
        for key, value in ports.items():
            port = scenario_port(g, name, key)
            if port is None or port not in used:
                errors.append(f"{source}: switch {name}: port {key!r} is not a port scenario {scenario} uses on it "
                              f"(it uses {', '.join(map(str, sorted(used)))}, or {fgraph.intf_name(name, min(used))}"
                              f", ...)")
                continue
            if port in mapped:
                errors.append(f"{source}: switch {name}: scenario port {port} is given twice (as {key!r})")
                continue
            if isinstance(value, str) and value.strip() and not value.strip().isdigit():
                value = value.strip()
            elif isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, (int, str)) or \
                    (isinstance(value, int) and not 0 < value <= MAX_PORT) or (isinstance(value, str) and not value):
                errors.append(f"{source}: switch {name}: port {key} -> {value!r} is neither an OpenFlow port number "
                              f"(1..{MAX_PORT:#x}) nor a port name")
                continue
            if value in taken:
                what = "OpenFlow port" if isinstance(value, int) else "port name"
                errors.append(f"{source}: switch {name}: {what} {value!r} is used twice "
                              f"(scenario ports {taken[value]} and {port})")
                continue
            taken[value] = port
            mapped[port] = value
        for port in sorted(used - set(mapped) - {scenario_port(g, name, k) for k in ports}):
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


def named(g: nx.MultiGraph, data: Mapping) -> dict[str, dict[int, str]]:
    """The ports a deployment gives by name: switch -> scenario port -> the switch's port name."""
    _dpids, maps, _errors = validate(g, data)
    return {sw: {p: v for p, v in m.items() if isinstance(v, str)} for sw, m in maps.items()
            if any(isinstance(v, str) for v in m.values())}


def resolve(g: nx.MultiGraph, data: Mapping, switch: str, names: Mapping[str, int],
            source: str = "deployment") -> tuple[dict[int, int], list[str]]:
    """A switch's named ports on its OpenFlow numbers, from what the switch says it has (``names``:
    port name -> port number, from its port descriptions): (scenario port -> OpenFlow port for every
    port the file gives by name, mistakes one line each: a name the switch does not have, two scenario
    ports onto one switch port)."""
    dpids, maps, _errors = validate(g, data)
    wanted = maps.get(switch, {})
    dpid = dpids.get(switch, g.nodes[switch]["dpid"])
    out: dict[int, int] = {}
    errors: list[str] = []
    numbers = {v: p for p, v in wanted.items() if isinstance(v, int)}
    for port, value in sorted(wanted.items()):
        if not isinstance(value, str):
            continue
        number = names.get(value)
        if number is None:
            have = sorted(names)
            listed = ", ".join(have[:8]) + (", ..." if len(have) > 8 else "") if have else "no port"
            errors.append(f"{source}: switch {switch} (dpid {dpid:#018x}) has no port named {value!r} "
                          f"(scenario port {port}; it has {listed})")
            continue
        if number in numbers:
            errors.append(f"{source}: switch {switch}: port {value!r} is OpenFlow port {number}, which scenario "
                          f"port {numbers[number]} is given already (scenario ports {numbers[number]} and {port})")
            continue
        numbers[number] = port
        out[port] = number
    return out, errors


def apply(g: nx.MultiGraph, data: Mapping, resolved: Mapping[str, Mapping[int, int]] | None = None) -> nx.MultiGraph:
    """The graph with the deployment's datapath ids and port numbers (``data`` as ``load`` returns it).
    Named ports take their number from ``resolved`` (switch -> scenario port -> OpenFlow port, from
    ``resolve``); a named port not resolved yet stands on a ``placeholder`` (negative: no switch's)."""
    dpids, maps, errors = validate(g, data)
    if errors:
        raise UserError(errors[0])
    resolved = resolved or {}
    numbers: PortMaps = {}
    for name, m in maps.items():
        ports = sorted(switch_ports(g, name))
        numbers[name] = {p: v if isinstance(v, int) else resolved.get(name, {}).get(p, placeholder(ports, p))
                         for p, v in m.items()}
    out = g.copy()
    out.graph.pop("_controller_index", None)
    for name, dpid in dpids.items():
        out.nodes[name]["dpid"] = dpid
    for u, v, k, d in list(out.edges(keys=True, data=True)):
        out.edges[u, v, k]["ports"] = {n: numbers.get(n, {}).get(p, p) for n, p in d["ports"].items()}
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


def _by_port_numbers(g: nx.MultiGraph, heard: nx.MultiGraph, derived: Mapping[int, str]) -> dict[str, int] | None:
    """Switch -> dpid when the heard cables land on the scenario's port numbers: one connected part of the
    heard wiring at a time, from one switch, each cable leads to the switch the scenario puts at the far end
    of that port, on the port it plans there. None unless every part has exactly one such matching (the
    port numbers of the cabling plan tell the switches apart; on foreign numbers they cannot)."""
    plan: dict[str, dict[int, tuple[str, int]]] = {}
    for u, v, d in g.edges(data=True):
        if g.nodes[u]["tier"] > 0 and g.nodes[v]["tier"] > 0:
            plan.setdefault(u, {})[d["ports"][u]] = (v, d["ports"][v])
            plan.setdefault(v, {})[d["ports"][v]] = (u, d["ports"][u])
    seen: dict[int, dict[int, tuple[int, int]]] = {}
    for a, b, d in heard.edges(data=True):
        seen.setdefault(a, {})[d["ports"][a]] = (b, d["ports"][b])
        seen.setdefault(b, {})[d["ports"][b]] = (a, d["ports"][a])

    def walk(seed: int, name: str) -> dict[int, str] | None:
        got, owner, todo = {seed: name}, {name: seed}, [seed]
        while todo:
            dpid = todo.pop()
            here = plan.get(got[dpid], {})
            if set(seen[dpid]) != set(here):
                return None
            for port, (far, far_port) in seen[dpid].items():
                want, want_port = here[port]
                if far_port != want_port or got.get(far, want) != want or owner.get(want, far) != far \
                        or derived.get(far, want) != want:
                    return None
                if far not in got:
                    got[far], owner[want] = want, far
                    todo.append(far)
        return got

    out: dict[str, int] = {}
    for part in nx.connected_components(heard):
        seed = min(part)
        names = [derived[seed]] if seed in derived else [n for n in plan if set(plan[n]) == set(seen[seed])]
        found = [m for m in (walk(seed, n) for n in names) if m is not None and len(m) == len(part)]
        if len(found) != 1:
            return None
        out.update({name: dpid for dpid, name in found[0].items()})
    return out if len(out) == len(plan) and len(set(out.values())) == len(out) else None


def host_leaves(g: nx.MultiGraph) -> dict[str, str]:
    """Source MAC (lower case) of every host port of the scenario -> the leaf that port is cabled to."""
    return {d["mac"].lower(): (v if g.nodes[u]["tier"] == 0 else u)
            for u, v, d in g.edges(data=True) if d.get("kind") == "host"}


def note_host(hosts: dict[tuple[int, int], str], leaves: Mapping[str, str], dpid: int, port: int, mac: str,
              limit: int) -> str:
    """--deployment auto: a frame with source ``mac`` arrived on (``dpid``, ``port``) of a stranger;
    ``hosts`` (``HostsSeen``, updated in place) keeps, per port, the latest MAC of a host port the
    scenario knows (``leaves``: :func:`host_leaves`). Returns what it did: "host-seen" (a known MAC
    kept, replacing another one held there: the host seen last is the one cabled there now),
    "unknown-mac" (not a host port's of the scenario: not kept, so that a stray frame cannot hold the
    port against its host's own) or "ignored" (the same MAC again, or ``limit`` ports held)."""
    mac = mac.lower()
    if mac not in leaves:
        return "unknown-mac"
    key = (dpid, port)
    if hosts.get(key) == mac or (key not in hosts and len(hosts) >= limit):
        return "ignored"
    hosts[key] = mac
    return "host-seen"


def host_pins(g: nx.MultiGraph, hosts: HostsSeen) -> dict[int, str]:
    """Datapath id -> the leaf it is, from the hosts seen behind it (``HostsSeen``): a source MAC that
    is a host port's of the scenario puts that port's leaf there. MACs the scenario does not know are
    left out; a datapath that hosts of two leaves put in two places, or two datapaths that claim one
    leaf, is one UserError line (a host cabled to the wrong leaf: nothing is adopted)."""
    leaf_of = host_leaves(g)
    pins: dict[int, str] = {}
    for (dpid, _port), mac in sorted(hosts.items()):
        leaf = leaf_of.get(str(mac).lower())
        if leaf is None:
            continue
        if pins.setdefault(dpid, leaf) != leaf:
            raise UserError(f"datapath {dpid:#018x} has hosts of two leaves behind it ({pins[dpid]} and {leaf}): "
                            f"check the host cabling, or write the deployment file by hand")
    claimed: dict[str, int] = {}
    for dpid, leaf in sorted(pins.items()):
        if claimed.setdefault(leaf, dpid) != dpid:
            raise UserError(f"hosts of {leaf} were seen behind two datapaths ({claimed[leaf]:#018x} and {dpid:#018x}): "
                            f"check the host cabling, or write the deployment file by hand")
    return pins


def _discover(g: nx.MultiGraph, links: Mapping[tuple[int, int], tuple[int, int]],
              hosts: HostsSeen | None = None) -> tuple[Dpids, PortMaps, bool]:
    """``from_discovery``'s (dpids, port maps) and whether every switch with hosts was told apart (by its
    derived dpid, by the plan's port numbers or by the hosts seen behind it) rather than guessed from the
    shape of the wiring alone."""
    pins = host_pins(g, hosts or {})
    heard = nx.MultiGraph()
    pairs = {tuple(sorted((rx, tx))) for rx, tx in links.items()}
    for a, b in pairs:
        heard.add_edge(a[0], b[0], ports={a[0]: a[1], b[0]: b[1]})
    planned = nx.MultiGraph()
    for u, v, d in g.edges(data=True):
        if g.nodes[u]["tier"] > 0 and g.nodes[v]["tier"] > 0:
            planned.add_edge(u, v, ports=d["ports"])
    derived = {d["dpid"]: n for n, d in g.nodes(data=True) if d["tier"] > 0}
    by_ports = _by_port_numbers(g, heard, derived)
    if by_ports is not None and all(by_ports.get(leaf) == dpid for dpid, leaf in pins.items()):
        mapping = by_ports
    else:
        by_ports = None
        for n in planned:
            planned.nodes[n]["pin"] = n
        for dpid in heard:
            heard.nodes[dpid]["pin"] = derived.get(dpid) or pins.get(dpid)
        matcher = nx.algorithms.isomorphism.MultiGraphMatcher(
            planned, heard, node_match=lambda a, b: b["pin"] is None or a["pin"] == b["pin"])
        found = next(matcher.isomorphisms_iter(), None)
        if found is None:
            raise UserError(f"the wiring LLDP heard ({heard.number_of_nodes()} switches, {heard.number_of_edges()} "
                            f"links) does not have the shape of scenario {g.graph['scenario'].name} "
                            f"({planned.number_of_nodes()} switches, {planned.number_of_edges()} links): "
                            f"fix the cabling or write the deployment file by hand")
        mapping = dict(found)
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
    with_hosts = {n for u, v in g.edges() for n, m in ((u, v), (v, u)) if g.nodes[n]["tier"] > 0 and
                  g.nodes[m]["tier"] == 0}
    told_apart = by_ports is not None or all(dpids[n] in derived or pins.get(dpids[n]) == n for n in with_hosts)
    return dpids, maps, told_apart


def from_discovery(g: nx.MultiGraph, links: Mapping[tuple[int, int], tuple[int, int]],
                   hosts: HostsSeen | None = None) -> tuple[Dpids, PortMaps]:
    """(dpids, port maps) from what LLDP heard: ``links`` maps a receiving (dpid, port) to the sending
    (dpid, port). Switches are told apart by their derived dpids, else by the cabling plan's port numbers
    (every cable on the ports the scenario plans); failing both, by the shape of the wiring alone, where
    symmetric switches are interchangeable (which leaf has which hosts is then a guess: ``adoption``
    refuses it) unless ``hosts`` (``HostsSeen``) pin them. Raises UserError when the heard wiring does not
    have the scenario's shape."""
    dpids, maps, _told_apart = _discover(g, links, hosts)
    return dpids, maps


def adoption(g: nx.MultiGraph, links: Mapping[tuple[int, int], tuple[int, int]],
             hosts: HostsSeen | None = None) -> tuple[dict, str]:
    """What ``--deployment auto`` adopts once discovery settles: (the deployment, as a file would give it,
    that ``apply`` puts the scenario on; one line saying what it maps). ``g`` is the scenario's graph,
    ``links`` what LLDP heard (as ``from_discovery``). Raises UserError when the heard wiring does not have
    the scenario's shape, or when it cannot tell which switch with hosts is which (dpids and port numbers
    of their own, and port numbers that do not single each one out, as in a fabric of identical planes,
    until ``hosts`` has seen a host behind each such leaf); nothing is adopted then."""
    dpids, maps, told_apart = _discover(g, links, hosts)
    if not told_apart:
        seen = len(host_pins(g, hosts or {}))
        raise UserError(f"the wiring has the scenario's shape, but which leaf is which cannot be told yet (datapath "
                        f"ids of their own, port numbers that do not single each one out, and {seen} leaf(s) with a "
                        f"host seen behind it): waiting for a frame from a host behind every leaf (an ARP request "
                        f"does), or start with --deployment FILE")
    data = yaml.safe_load(dump(g, dpids, maps))
    switches = [n for n, d in g.nodes(data=True) if d["tier"] > 0]
    foreign = sum(dpids.get(n, g.nodes[n]["dpid"]) != g.nodes[n]["dpid"] for n in switches)
    renumbered = sum(q != p for m in maps.values() for p, q in m.items())
    line = (f"{len(switches)} switches, {foreign} on datapath ids of their own, {renumbered} port(s) on numbers "
            f"other than the scenario's" if foreign or renumbered else
            f"{len(switches)} switches, all on the scenario's datapath ids and port numbers")
    return data, line
