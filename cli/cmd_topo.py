"""`hpnlab topo`: inspect, export and list fabrics (pure: no root needed)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hpnlab.cli.args import add_scenario_args, load_fabric
from hpnlab.cli.argtypes import output_file
from hpnlab.fabric.errors import UserError, short
from hpnlab.fabric.scenario import analysis, export, graph, spec


def register(sub: argparse._SubParsersAction) -> None:
    topo = sub.add_parser("topo", help="inspect, export and list fabrics")
    actions = topo.add_subparsers(dest="topo_command", metavar="ACTION")
    actions.required = True

    p = actions.add_parser("inspect", help="sizes, radix use, oversubscription, bisection, paths, routes")
    add_scenario_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a report")
    p.add_argument("--rules", action="store_true",
                   help="also compile the controller's rules and report counts per policy")
    p.set_defaults(func=cmd_inspect)

    p = actions.add_parser("export", help="write the fabric graph (json, graphml or dot)")
    add_scenario_args(p)
    p.add_argument("--format", choices=export.FORMATS, default="json")
    p.add_argument("-o", "--output", type=output_file, help="file to write (default: standard output)")
    p.set_defaults(func=cmd_export)

    p = actions.add_parser("plan", help="print the addressing plan (prefixes per plane, pod and leaf)")
    add_scenario_args(p)
    p.add_argument("--hosts", type=int, default=4, help="host addresses to list (default 4)")
    p.set_defaults(func=cmd_plan)

    p = actions.add_parser("presets", help="list the scenario presets")
    p.set_defaults(func=cmd_presets)

    p = actions.add_parser("fields", help="list the scenario fields: type, range, meaning")
    p.set_defaults(func=cmd_fields)

    p = actions.add_parser("schema", help="print the JSON Schema of scenario files (for editors)")
    p.set_defaults(func=cmd_schema)


def _fmt_num(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if not value.is_integer() else f"{int(value):,}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render(report: dict) -> str:
    r = report
    lines = [f"{r['scenario']} ({r['kind']})",
             f"  accelerators      {r['accelerators']:>12,}",
             f"  hosts             {r['hosts']:>12,}",
             f"  NIC ports         {r['nic_ports']:>12,}   ({r['planes']} planes x {r['rails']} rails per host)",
             "  switches          " + ", ".join(f"{k} {v:,}" for k, v in r["switches"].items()),
             "  links             " + ", ".join(f"{k} {v:,}" for k, v in r["links"].items()),
             f"  radix             {r['radix']} x {r['switch_port_rate_gbps']:g}G; most used "
             f"{_fmt_num(r['max_ports_used'])} "
             + "(" + ", ".join(f"{k} {_fmt_num(v)}" for k, v in r["ports_used_by_role"].items()) + ")",
             "  oversubscription  " + ", ".join(f"{k} {v:.3f}:1" for k, v in r["oversubscription"].items()),
             f"  bisection         {r['bisection_gbps'] / 1000:,.1f} Tbit/s (worst balanced cut: "
             + ", ".join(f"{k} {v / 1000:,.1f}T" for k, v in r["cuts_gbps"].items()) + ")",
             "  paths between host ports (plane 0):"]
    for kind, p in r["paths"].items():
        if p["hops"] is None:
            lines.append(f"    {kind:<13} none: {p['note']}")
        else:
            lines.append(f"    {kind:<13} {p['hops']} links, {p['switches']} switches, "
                         f"{p['paths']:,} equal-cost paths   e.g. {p['example'][0]} -> {p['example'][1]}")
    routes = r["routes"]
    lines.append("  routes per switch: host routes max "
                 f"{routes['host_routes_max']:,}, aggregated max {routes['aggregated_max']:,} "
                 f"({routes['host_routes_max'] / max(routes['aggregated_max'], 1):,.0f}x fewer)")
    for role, v in routes["by_role"].items():
        lines.append(f"    {role:<6} host routes {v['host_routes_max']:>9,}   aggregated {v['aggregated_max']:>7,}")
    pods = routes["per_pod_total"]["aggregated"]
    if pods:
        first = next(iter(pods))
        lines.append(f"  routes per pod (all planes, leaves + spines), {first}: aggregated "
                     f"{pods[first]:,} vs host routes {routes['per_pod_total']['host_routes'][first]:,}"
                     + (f" ({len(pods)} pods)" if len(pods) > 1 else ""))
    if "rules" in r:
        lines.extend(render_rules(r["rules"]))
    return "\n".join(lines)


def render_rules(rules: dict) -> list[str]:
    """The controller compiler's output per policy: what a switch and a pod really install."""
    lines = ["  compiled controller state (OpenFlow rules the controller installs):",
             f"    {'policy':<12} {'max flows/sw':>12} {'max routes/sw':>13} "
             f"{'routes/pod':>11} {'minimum/pod':>11}"]
    per_pod = {}
    for policy, summary in rules.items():
        pods = summary["pods"]
        first = next(iter(pods.values())) if pods else summary["totals"]
        per_pod[policy] = first["routes"]
        lines.append(f"    {policy:<12} {summary['max_flows_per_switch']:>12,} {summary['max_routes_per_switch']:>13,} "
                     f"{first['routes']:>11,} {first['minimum_routes']:>11,}")
    if per_pod.get("aggregate"):
        lines.append(f"    host-routes / aggregate: {per_pod['host-routes'] / per_pod['aggregate']:,.0f}x routes "
                     "per pod (Baidu reports about 4,000 routes per POD after aggregation)")
    return lines


def cmd_inspect(args: argparse.Namespace) -> int:
    _, g = load_fabric(args)
    report = analysis.inspect(g)
    if args.rules:
        try:
            from hpnlab.fabric.routing.compiler import route_summary
        except ImportError as exc:
            raise UserError(f"--rules needs the controller compiler ({exc})") from None
        report["rules"] = {policy: route_summary(g, policy) for policy in ("aggregate", "host-routes")}
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        print()
    else:
        print(render(report))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    scenario, g = load_fabric(args)
    if args.output:
        path = Path(args.output)
        try:
            with path.open("w") as fh:
                export.write(g, args.format, fh)
        except OSError as exc:
            raise UserError(f"--output: cannot write {short(str(path))}: {exc.strerror or exc}") from None
        print(f"wrote {args.format} of {scenario.name} ({g.number_of_nodes():,} nodes, "
              f"{g.number_of_edges():,} links) to {path}", file=sys.stderr)
    else:
        export.write(g, args.format, sys.stdout)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    scenario, g = load_fabric(args)
    plan = g.graph["plan"]
    print("\n".join(plan.describe()))
    for plane in range(scenario.planes):
        print(f"plane {plane}: {plan.plane_prefix(plane)}")
        for campus in range(scenario.campuses):
            if scenario.campuses > 1:
                print(f"  campus {campus}: {plan.campus_prefix(plane, campus)}")
            for pod in range(scenario.pods):
                print(f"    pod {pod}: {plan.pod_prefix(plane, campus, pod)}")
    leaves = [switch for switch in graph.switches(g) if g.nodes[switch]["tier"] == 1][:8]
    print("leaf prefixes (first 8): " + ", ".join(f"{leaf} {g.nodes[leaf]['prefix']}" for leaf in leaves))
    for host in graph.hosts(g)[: args.hosts]:
        ports = graph.host_ports(g, host)
        print(f"{host}: " + ", ".join(
            f"{graph.intf_name(host, port['intf'])} {port['ip']} (plane {port['plane']}, rail {port['rail']}, "
            f"{port['leaf']} port {port['leaf_port']}, {port['mac']})" for port in ports))
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    for name in spec.preset_names():
        s = spec.load(name)
        print(f"{name:<20} {s.kind:<9} {s.accelerators:>8,} accelerators  "
              f"{s.hosts:>6,} hosts  {s.planes} planes x {s.rails} rails  "
              + (f"{s.campuses} campuses" if s.campuses > 1 else ""))
    print("fat-tree-K           fat-tree  any even K the size limits allow (up to 138 by default), "
          "e.g. fat-tree-4, fat-tree-48")
    return 0


def cmd_fields(args: argparse.Namespace) -> int:
    print("\n".join(spec.describe_fields()))
    limits = spec.limits()
    print(f"size limits: {limits['links']:,} links, {limits['nodes']:,} nodes "
          f"(raise with {spec.LIMIT_ENV['links']}, {spec.LIMIT_ENV['nodes']}); "
          f"files up to {spec.MAX_FILE_BYTES // 1024} KiB, UTF-8, no aliases, no key twice")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    json.dump(spec.json_schema(), sys.stdout, indent=2)
    print()
    return 0
