"""`hpnlab web`: the fabric view in the browser, for a finished run (the live view is
`hpnlab emulate ... --web` and `hpnlab run ... --web`).

``hpnlab web replay RESULTS.json`` serves a replay with a time scrubber: an `hpnlab run`
results.json, an `hpnlab emulate --json` file, or a model run written by ``hpnlab web model``.
``hpnlab web model SCENARIO --out FILE`` runs the flow-level model and writes, beside its
result, the per-link loads of each modelled step (aggregated by plane, pod and tier on large
fabrics); ``--still FILE.svg --at S`` writes a still instead of serving.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpnlab.cli.args import add_scenario_args, load_scenario
from hpnlab.cli.argtypes import output_file
from hpnlab.fabric.errors import UserError
from hpnlab.fabric.scenario import graph, spec


def register(sub) -> None:
    p = sub.add_parser("web", help="the fabric view in a browser: replay a finished run, export model loads",
                       description=__doc__)
    wsub = p.add_subparsers(dest="web_command", metavar="ACTION")
    wsub.required = True
    r = wsub.add_parser("replay", help="serve a replay of a results file (time scrubber)")
    r.add_argument("results", metavar="RESULTS.json")
    r.add_argument("--scenario", help="the scenario (default: the one the results file names)")
    r.add_argument("--web", default="", metavar="ADDR:PORT", help="where to serve (default 127.0.0.1:8765)")
    r.add_argument("--step", type=float, default=0.5, metavar="S", help="seconds between replayed frames (0.5)")
    r.add_argument("--still", metavar="FILE.svg", type=output_file, help="write a still of --at as SVG and exit")
    r.add_argument("--at", type=float, default=None, metavar="S", help="the moment of --still (default: the end)")
    r.set_defaults(func=cmd_replay)
    m = wsub.add_parser("model", help="run the flow-level model and write its per-link loads for replay")
    add_scenario_args(m)
    m.add_argument("--collective", default="all_to_all")
    m.add_argument("--size", default="64M", help="bytes (K/M/G suffixes), default 64M")
    m.add_argument("--routing", default="flow",
                   help="the transport's entropy policy: flow (= ecmp), flowlet, spray or adaptive (default flow)")
    m.add_argument("--hosts", type=int, default=None, help="hosts in the job (default all)")
    m.add_argument("--placement", default="packed", help="packed or random (default packed)")
    m.add_argument("--qps", type=int, default=4, help="connections per rank pair (default 4)")
    m.add_argument("--max-steps", type=int, default=16, help="distinct steps modelled where a collective repeats one")
    m.add_argument("--fail-links", type=int, default=0, metavar="N", help="random leaf-spine links failed")
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--out", required=True, type=output_file, metavar="FILE.json")
    m.set_defaults(func=cmd_model)


def _size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    try:
        return int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(t)
    except ValueError:
        raise UserError(f"--size: expected bytes like 64M, got {text!r}") from None


def load_results(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    except ValueError:
        raise UserError(f"{path}: not a JSON results file") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: not a results file (expected a JSON object)")
    return doc


def scenario_of(doc: dict[str, Any], given: str | None, path: str) -> spec.Scenario:
    """The results file's scenario: given, or as the file records it (run: meta.scenario; emulate:
    metadata.scenario; model: scenario)."""
    if given:
        return spec.load(given)
    meta = doc.get("meta") or {}
    recorded = meta.get("scenario") or (doc.get("metadata") or {}).get("scenario") or doc.get("scenario")
    if isinstance(recorded, dict):
        return spec.from_dict(recorded)
    if isinstance(recorded, str):
        return spec.load(recorded)
    raise UserError(f"{path}: the file does not name its scenario; pass --scenario")


def cmd_replay(args) -> int:
    from hpnlab.fabric.web import server, view
    doc = load_results(args.results)
    g = graph.build(scenario_of(doc, args.scenario, args.results))
    lay = view.layout(g)
    if doc.get("loads", {}).get("aggregated") is not None and bool(doc["loads"]["aggregated"]) != lay["aggregated"]:
        raise UserError(f"{args.results}: its loads are {'aggregated' if doc['loads']['aggregated'] else 'per link'}, "
                        f"the view of {g.graph.get('name')} is not")
    if args.step <= 0:
        raise UserError("--step must be > 0")
    if not (doc.get("telemetry") or "loads" in doc or view.timeline_records(doc)):
        raise UserError(f"{args.results}: nothing to replay (no telemetry, failure records or model loads in it)")
    frames = view.replay_frames(lay, doc, args.step)
    if args.still:
        fr = view.frame_at(frames, args.at if args.at is not None else frames[-1]["t"])
        Path(args.still).write_text(view.svg(lay, fr))
        print(f"wrote {args.still} (t = {fr['t']:g} s)")
        return 0
    addr, port = server.parse_addr(args.web)
    server.serve_replay(lay, frames, addr, port)
    return 0


def cmd_model(args) -> int:
    import sys
    import time

    from hpnlab.fabric.model import flow as model
    from hpnlab.fabric.web import loads, view
    scenario = load_scenario(args)
    routing = model.routing_name(args.routing)
    t0 = time.perf_counter()
    if args.fail_links:
        g = graph.build(scenario)
        failed = model.random_fabric_links(g, args.fail_links, args.seed)
        net = model.Network(g, failed)
        how = "built"
    else:              # the healthy fabric: the model network is cached between runs (as `hpnlab model`)
        failed = None
        net, cached = model.cached_network(scenario)
        g = net.g if net.g is not None else graph.build(scenario)
        how = "model network from the cache, graph built" if cached else "built and cached"
    t1 = time.perf_counter()
    lay = view.layout(g)
    t2 = time.perf_counter()
    doc = loads.model_loads(g, args.collective, _size(args.size), routing=routing, hosts=args.hosts,
                            placement=args.placement, qps=args.qps, max_steps=args.max_steps, seed=args.seed,
                            lay=lay, network=net)
    t3 = time.perf_counter()
    doc["failed_links"] = [list(f) for f in sorted(failed or ())]
    Path(args.out).write_text(json.dumps(doc, separators=(",", ":"), default=str))
    m = doc["model"]
    busbw = f"{m['busbw_gbs']:.2f} GB/s" if m["stalled_connections"] == 0 else \
        f"0 ({m['stalled_connections']} connections stalled)"
    drawn = "aggregated" if lay["aggregated"] else "per link"
    print(f"# {scenario.name}: fabric {how} in {t1 - t0:.1f} s, layout ({drawn}, {len(lay['links'])} links) "
          f"in {t2 - t1:.1f} s, model and loads in {t3 - t2:.1f} s", file=sys.stderr)
    print(f"{doc['scenario']}: {m['collective']} {m['size_bytes']} B on {m['ranks']} ranks, {routing}: busbw {busbw}; "
          f"{len(doc['loads']['steps'])} steps of loads -> {args.out}")
    return 0


# ---- `--web` of `hpnlab emulate` and `hpnlab run` -------------------------------------------------

def add_web_args(p) -> None:
    """``--web [ADDR:PORT]`` and ``--web-allow-remote`` (shared by `hpnlab emulate` and `hpnlab run`)."""
    p.add_argument("--web", nargs="?", const="", default=None, metavar="ADDR:PORT",
                   help="serve the live fabric view in a browser (default 127.0.0.1:8765): load, ECN marks, "
                        "failures, the collective and the controller; click to inject failures")
    p.add_argument("--web-allow-remote", action="store_true",
                   help="accept failure injections from other machines too (default: this machine only)")
    p.add_argument("--metrics", nargs="?", const="", default=None, metavar="ADDR:PORT",
                   help=f"serve the controller's Prometheus metrics there while the emulation runs (default "
                        f"127.0.0.1:{METRICS_DEFAULT_PORT}; the Grafana dashboards in controller/grafana/ read them)")


#: where ``--metrics`` serves the controller's Prometheus endpoint when given without ADDR:PORT
METRICS_DEFAULT_PORT = 9310


def web_controller_args(args) -> tuple[list[str], int | None]:
    """The controller flags that serve its Prometheus metrics, and their port: at ``--metrics [ADDR:PORT]``
    (default 127.0.0.1:9310, where a Prometheus set up from docs/guides/web.md scrapes), else with
    ``--web`` on a free loopback port for the view; none otherwise. One line (UserError) for a bad address
    or ``--metrics`` with a controller that is not hpnlab's."""
    metrics = getattr(args, "metrics", None)
    hpnlab = getattr(args, "controller", "hpnlab") == "hpnlab"
    if metrics is not None:
        if not hpnlab:
            raise UserError(f"--metrics serves the hpnlab controller's Prometheus metrics; the "
                            f"{args.controller} controller has none")
        from hpnlab.fabric.web import server
        addr, port = server.parse_addr(metrics, METRICS_DEFAULT_PORT, flag="--metrics")
        if port == 0:
            raise UserError("--metrics: give a port (1-65535), not 0")
        return ["--metrics-port", str(port), "--metrics-listen", addr], port
    if args.web is None or not hpnlab:
        return [], None
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return ["--metrics-port", str(port)], port


def metrics_line(controller_args: list[str], metrics_port: int | None) -> str | None:
    """Where ``--metrics`` serves the controller's Prometheus endpoint (None without ``--metrics``)."""
    if "--metrics-listen" not in controller_args or metrics_port is None:
        return None
    addr = controller_args[controller_args.index("--metrics-listen") + 1]
    return (f"controller metrics: http://{addr}:{metrics_port}/metrics (Prometheus; dashboards in "
            f"controller/grafana/)")


def open_web(emu, args, metrics_port: int | None, say):
    """The live view around a running emulation (a context manager; a no-op without ``--web``)."""
    import contextlib
    if args.web is None:
        return contextlib.nullcontext(None)
    from hpnlab.fabric.web import live, server
    addr, port = server.parse_addr(args.web)
    return live.LiveWeb(emu, addr, port, allow_remote=args.web_allow_remote, metrics_port=metrics_port, say=say)
