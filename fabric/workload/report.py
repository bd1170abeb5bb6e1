"""Results of collective runs: nccl-tests tables, JSON files and PNG plots.

Pure except for the plot functions (matplotlib, imported when called) and the file writers.
The input is what the rank workers return (``hpnlab.fabric.transport.ranks``): per rank, per size, the
seconds each timed iteration took and the number of wrong elements found when checking;
:func:`build_result` merges one job's ranks into the result that tables, plots and
``results.json`` are made from.

How numbers are made (nccl-tests' conventions, doc/PERFORMANCE.md there)
    time   an iteration's time is the slowest rank's (a collective ends when its last rank
           does); the table shows the mean over the timed iterations, in microseconds.
    algbw  size / time, in GB/s with GB = 1e9 bytes; "size" is the table's size column.
    busbw  algbw x the collective's factor (``hpnlab.fabric.workload.collectives.busbw_factor``).
    #wrong elements that differ from the collective's definition, summed over ranks
           ("N/A" when the run did not check, as nccl-tests prints with -c 0).
    Avg bus bandwidth: mean busbw over every measured cell (out-of-place and in-place).
hpnlab adds, as comment lines after nccl-tests' footer, the line rate of one rank's
NIC ports (their emulated rate) and busbw as a fraction of it.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpnlab.fabric.workload import collectives as col

if TYPE_CHECKING:
    from hpnlab.fabric.workload.jobs import Job

GB = 1e9


def cell(times_s: list[float], size_bytes: int, factor: float, wrong: int | None) -> dict:
    t = sum(times_s) / len(times_s)
    algbw = size_bytes / t / GB if t > 0 else 0.0
    return {"time_us": t * 1e6, "algbw_gbs": algbw, "busbw_gbs": algbw * factor, "wrong": wrong,
            "iterations": len(times_s)}


def aggregate(rank_results: list[dict], collective: str) -> list[dict]:
    """Table rows from per-rank results (each: {"rank", "sizes": [{"size", "count",
    "param_count", "oop": {"times_s", "wrong"}, "ip": {...} or None}]})."""
    n = len(rank_results)
    factor = col.busbw_factor(collective, n)
    by_rank = sorted(rank_results, key=lambda r: r["rank"])
    rows = []
    for i, first in enumerate(by_rank[0]["sizes"]):
        row = {"size": first["size"], "count": first["param_count"]}
        for mode in ("oop", "ip"):
            if first.get(mode) is None:
                row[mode] = None
                continue
            per_rank = [r["sizes"][i][mode] for r in by_rank]
            iters = len(per_rank[0]["times_s"])
            slowest = [max(p["times_s"][k] for p in per_rank) for k in range(iters)]
            wrongs = [p["wrong"] for p in per_rank]
            wrong = None if any(w is None for w in wrongs) else sum(wrongs)
            row[mode] = cell(slowest, first["size"], factor, wrong)
            if any("messages" in p for p in per_rank):
                done = message_completions({r["rank"]: r["sizes"][i][mode].get("messages") for r in by_rank})
                row[mode]["message_times_s"] = done
                row[mode]["messages"] = completion_summary(done)
        rows.append(row)
    return rows


def message_completions(per_rank: Mapping[int, Any]) -> list[float]:
    """Per-message completion times (s): from the sender's send start to the receiver having
    the message's last byte, for every timed iteration and message. ``per_rank``: rank ->
    {"sent_at": [per iteration: wall time its sends started, or None],
    "recv_at": [per iteration: [[source rank, wall time received], ...]]} as the rank workers
    record them. A message whose sender has no start time for that iteration is skipped."""
    out = []
    for info in per_rank.values():
        for it, arrivals in enumerate((info or {}).get("recv_at", [])):
            for src, t_done in arrivals:
                sender = per_rank.get(int(src)) or {}
                starts = sender.get("sent_at", [])
                if it < len(starts) and starts[it] is not None:
                    out.append(t_done - starts[it])
    return out


def completion_summary(times_s: list[float]) -> dict[str, Any]:
    """Count, p50, p99, max and mean of completion times, in microseconds (numpy's linear
    percentile; None with no messages)."""
    import numpy as np

    if not times_s:
        return {"messages": 0, "p50_us": None, "p99_us": None, "max_us": None, "mean_us": None}
    a = np.asarray(times_s, dtype=float) * 1e6
    return {"messages": int(a.size), "p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "max_us": float(a.max()), "mean_us": float(a.mean())}


def avg_busbw(rows: list[dict]) -> float:
    values = [r[m]["busbw_gbs"] for r in rows for m in ("oop", "ip") if r.get(m)]
    return sum(values) / len(values) if values else 0.0


def _decimals(values: Iterable[float]) -> int:
    top = max([v for v in values if v > 0] or [1.0])
    return max(2, min(7, 3 - math.floor(math.log10(top))))


def format_table(result: dict) -> str:
    """The nccl-tests layout for one collective run (``result`` as :func:`build_result` makes it)."""
    rows = result["rows"]
    d = _decimals(r[m][k] for r in rows for m in ("oop", "ip") if r.get(m)
                  for k in ("algbw_gbs", "busbw_gbs"))
    bw = 7 + max(0, d - 2)
    sub = f"{'time':>10} {'algbw':>{bw}} {'busbw':>{bw}} {'#wrong':>6}"
    units = f"{'(us)':>10} {'(GB/s)':>{bw}} {'(GB/s)':>{bw}} {'':>6}"
    span = len(sub)
    lines = [
        f"# hpnlab collective: {result['collective']}  nranks {result['nranks']}  "
        f"transport {result.get('transport', '?')}  entropy {result.get('entropy', '-')}"
        + (f"  job {result['job']}" if result.get("job") is not None else ""),
        f"#{'':<53}  {'out-of-place':^{span}}  {'in-place':^{span}}",
        f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6} {'root':>6}  {sub}  {sub}",
        f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>6} {'':>6}  {units}  {units}",
    ]
    for r in rows:
        parts = [f" {r['size']:>11} {r['count']:>12} {result.get('type', col.TYPE_NAME):>8} "
                 f"{result.get('redop', 'sum'):>6} {result.get('root', -1):>6}"]
        for m in ("oop", "ip"):
            c = r.get(m)
            if c is None:
                parts.append(f"{'N/A':>10} {'N/A':>{bw}} {'N/A':>{bw}} {'N/A':>6}")
            else:
                wrong = "N/A" if c["wrong"] is None else str(c["wrong"])
                parts.append(f"{c['time_us']:>10.1f} {c['algbw_gbs']:>{bw}.{d}f} "
                             f"{c['busbw_gbs']:>{bw}.{d}f} {wrong:>6}")
        lines.append("  ".join(parts))
    wrong_total = sum(r[m]["wrong"] or 0 for r in rows for m in ("oop", "ip") if r.get(m))
    checked = any(r[m]["wrong"] is not None for r in rows for m in ("oop", "ip") if r.get(m))
    avg = avg_busbw(rows)
    lines.append(f"# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}"
                 + ("" if checked else " (not checked: -c 0)"))
    lines.append(f"# Avg bus bandwidth    : {avg:.{d}f} ")
    line = result.get("line_rate_bps")
    if line:
        lines.append(f"# Line rate per rank   : {line / 8 / GB:.{d}f} GB/s ({line / 1e6:g} Mbit/s); "
                     f"avg busbw / line rate : {avg * GB * 8 / line:.3f}; "
                     f"largest size : {largest_fraction(result):.3f}")
    for r in rows:
        msgs = (r.get("oop") or {}).get("messages")
        if msgs and msgs["messages"]:
            lines.append(f"# per-message completion, size {r['size']} B ({msgs['messages']} messages, send start "
                         f"to last byte at the receiver): p50 {msgs['p50_us']:.0f} us  p99 {msgs['p99_us']:.0f} us  "
                         f"max {msgs['max_us']:.0f} us")
    return "\n".join(lines)


def largest_fraction(result: dict) -> float:
    """busbw / line rate at the largest size (out-of-place), the figure the field quotes."""
    line = result.get("line_rate_bps")
    if not line or not result["rows"]:
        return float("nan")
    return result["rows"][-1]["oop"]["busbw_gbs"] * GB * 8 / line


def flow_totals(result: dict) -> dict:
    """Counters summed over every flow of the run (packets, retransmissions, CE, CNPs...)."""
    total: dict[str, float] = {}
    for f in result.get("flows", []):
        for k, v in f.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("src", "dst"):
                total[k] = max(total.get(k, 0), v) if k.startswith("max_") else total.get(k, 0) + v
    return total


def format_comparison(results: list[dict]) -> str:
    """One line per run: the busbw fraction of line rate side by side, with the transport's
    counters and the generator's CPU use (headroom = 1 - busiest rank's CPU share)."""
    head = (f"{'collective':<14} {'transport':<9} {'entropy':<8} {'n':>3} {'size(B)':>9} "
            f"{'busbw(GB/s)':>12} {'line':>6} {'pkts':>8} {'retx':>6} {'CE':>6} {'CNP':>6} "
            f"{'reord':>5} {'cpu max':>7} {'headroom':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        t = flow_totals(r)
        last = r["rows"][-1]["oop"] if r["rows"] else {"busbw_gbs": float("nan")}
        cpu = r.get("cpu", {})
        lines.append(
            f"{r['collective']:<14} {r.get('transport', '?'):<9} {r.get('entropy') or '-':<8} "
            f"{r['nranks']:>3} {r['rows'][-1]['size'] if r['rows'] else 0:>9} "
            f"{last['busbw_gbs']:>12.6f} {largest_fraction(r):>6.3f} "
            f"{int(t.get('packets', 0)):>8} {int(t.get('retransmissions', 0)):>6} "
            f"{int(t.get('ce_marks', 0)):>6} {int(t.get('cnps', 0)):>6} "
            f"{int(t.get('max_reorder', 0)):>5} {cpu.get('max_rank_share', float('nan')):>7.3f} "
            f"{cpu.get('headroom', float('nan')):>8.3f}")
    return "\n".join(lines)


def wrong_total(results: list[dict]) -> int:
    """Wrong elements over every run, size and column (0 when every check passed)."""
    return sum((row[m] or {}).get("wrong") or 0 for r in results for row in r["rows"] for m in ("oop", "ip"))


# ---- one job's result from its ranks' -------------------------------------------------------

def merge_flows(rank_results: list[dict]) -> list[dict]:
    """One record per directed flow, joining the sender's and the receiver's counters."""
    flows: dict[tuple, dict] = {}
    for rr in rank_results:
        for f in rr.get("flows", []):
            rec = flows.setdefault((f["src"], f["dst"]), {"src": f["src"], "dst": f["dst"]})
            for k, v in f.items():
                if k not in ("side", "src", "dst"):
                    rec[k] = v
    out = [f for f in flows.values() if f.get("bytes", 0) or f.get("packets_received", 0)]
    return sorted(out, key=lambda f: (f["src"], f["dst"]))


def rank_socket_drops(rank_results: list[dict]) -> int | None:
    """Packets dropped at the ranks' receiving sockets, summed (None: no rank's transport could say)."""
    known = [rr["socket_drops"] for rr in rank_results if rr.get("socket_drops") is not None]
    return sum(known) if known else None


def retransmission_causes(result: dict) -> dict[str, int | None]:
    """The retransmissions of a run split by cause (pure): ``spurious``, re-sent copies whose original
    also arrived (the receivers' duplicates: held, not lost), ``lost`` the rest; by what triggered
    them (``timeout``, ``nack``, ``failover``, ``migrate``); the retransmission timeouts that fired
    while the flow's own NIC port was paused; and the ranks' receive socket drops (None: not known)."""
    t = flow_totals(result)
    retx = int(t.get("retransmissions", 0))
    spurious = min(retx, int(t.get("duplicates", 0)))
    return {"retransmissions": retx, "spurious": spurious, "lost": retx - spurious,
            **{why: int(t.get(f"retx_{why}", 0)) for why in ("timeout", "nack", "failover", "migrate")},
            "timeouts": int(t.get("timeouts", 0)), "timeouts_paused": int(t.get("timeouts_paused", 0)),
            "socket_drops": result.get("socket_drops")}


def cpu_times() -> tuple[float, float]:
    """The machine's CPU time so far, all cores: (total, idle incl. iowait) in clock ticks (``/proc/stat``)."""
    vals = [float(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(vals), vals[3] + vals[4]


def busy_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The share of the machine's cores busy between two :func:`cpu_times` readings (0..1)."""
    total = after[0] - before[0]
    return 0.0 if total <= 0 else max(0.0, min(1.0, 1.0 - (after[1] - before[1]) / total))


def cpu_summary(rank_results: list[dict]) -> dict:
    """Generator CPU during the timed iterations: each rank's share of one core, the busiest
    rank's share, the cores all ranks used together, headroom = 1 - busiest share, and
    ``machine_busy``: the share of the machine's cores busy over the timed iterations, with
    everything else on it (``/proc/stat``; the median over the ranks' readings; None without)."""
    shares = []
    for rr in rank_results:
        c = rr["cpu"]
        shares.append(c["timed_cpu_s"] / c["timed_wall_s"] if c["timed_wall_s"] > 0 else 0.0)
    top = max(shares) if shares else 0.0
    ticks = [tuple(rr["cpu"].get("machine_ticks") or (0.0, 0.0)) for rr in rank_results]
    busy = [busy_share((0.0, 0.0), t) for t in ticks if t[0] > 0]
    return {"rank_shares": shares, "max_rank_share": top, "cores_used": sum(shares),
            "headroom": 1.0 - top, "machine_cores": os.cpu_count(),
            "machine_busy": statistics.median(busy) if busy else None}


def build_result(job: Job, rank_results: list[dict]) -> dict:
    """One job's result: the nccl-tests rows, flows, CPU, and every parameter of the job."""
    name = col.canonical(job.collective)
    rows = aggregate(rank_results, name)
    sched = col.build(name, job.nranks, job.sizes[0], root=job.root,
                      perm=tuple(job.perm) if job.perm else None)
    return {"collective": name, "nranks": job.nranks, "job": job.job, "transport": job.transport,
            "entropy": job.entropy if job.transport == "roce" else None,
            "type": col.TYPE_NAME, "redop": sched.redop, "root": sched.root,
            "line_rate_bps": job.rank_line_rate_bps(),
            "busbw_factor": col.busbw_factor(name, job.nranks),
            "rows": rows, "avg_busbw_gbs": avg_busbw(rows),
            "flows": merge_flows(rank_results), "cpu": cpu_summary(rank_results),
            "socket_drops": rank_socket_drops(rank_results),
            "transport_info": rank_results[0].get("transport_info", {}), "params": json.loads(job.to_json()),
            "ranks": [{"rank": r["rank"], "host": r.get("host"), "pid": r.get("pid"), "started_at": r.get("started_at"),
                       "cpu": r["cpu"]} for r in sorted(rank_results, key=lambda r: r["rank"])]}


# ---- files ---------------------------------------------------------------------------

def write_json(results: dict | list, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=True, default=jsonable) + "\n")
    return path


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def save(doc: dict, out_dir: str | Path, say: Callable[[str], None] = print) -> Path:
    """Print every table and the comparison, write ``results.json`` (``doc``: {"meta",
    "results"}) and the plots under ``out_dir``; return the JSON path."""
    out_dir = Path(out_dir)
    results = doc["results"]
    for r in results:
        say(format_table(r))
        say("")
    if results:
        say(format_comparison(results))
    path = write_json(doc, out_dir / "results.json")
    plots = [plot_busbw(results, out_dir / "busbw.png")]
    for r in results:
        tag = "-".join(str(x) for x in (r["collective"], r["transport"], r.get("entropy")) if x)
        plots.append(plot_flow_rates(r, out_dir / f"flows-{tag}-job{r.get('job', 0)}.png"))
    say(f"results: {path}  plots: {', '.join(str(p) for p in plots)}")
    return path


def jsonable(value: Any) -> Any:
    """What json cannot write by itself: numpy values as lists, sets and tuples as lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def _label(r: dict) -> str:
    lab = f"{r['collective']} {r.get('transport', '')}"
    if r.get("entropy"):
        lab += f" {r['entropy']}"
    if r.get("job") is not None:
        lab += f" job{r['job']}"
    return lab


def plot_busbw(results: list[dict], path: str | Path) -> Path:
    """busbw against size (log x) for each run, with each run's line rate dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rates = {r["line_rate_bps"] for r in results if r.get("line_rate_bps")}
    top = max([row["oop"]["busbw_gbs"] * 8e9 for r in results for row in r["rows"]] + list(rates) + [1.0])
    unit, scale = ("Gbit/s", 1e9) if top >= 1e9 else ("Mbit/s", 1e6)
    for r in results:
        xs = [row["size"] for row in r["rows"]]
        ys = [row["oop"]["busbw_gbs"] * 8e9 / scale for row in r["rows"]]   # bits read easier vs links
        ax.plot(xs, ys, marker="o", label=_label(r))
    ax.set_xscale("log", base=2)
    for rate in sorted(rates):
        ax.axhline(rate / scale, linestyle="--", color="grey", linewidth=1,
                   label=f"line rate per rank {rate / scale:g} {unit}")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel(f"busbw ({unit})")
    ax.set_title("bus bandwidth against size (out-of-place)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def flow_rate_series(flow: dict) -> tuple[list[float], list[float]]:
    """(times s, delivered rate bit/s) from a flow's cumulative (t, bytes acked) samples."""
    samples = flow.get("samples") or []
    ts, rates = [], []
    for (t0, b0, *_), (t1, b1, *_) in itertools.pairwise(samples):
        if t1 > t0:
            ts.append(t1)
            rates.append((b1 - b0) * 8 / (t1 - t0))
    return ts, rates


def plot_flow_rates(result: dict, path: str | Path, max_flows: int = 16) -> Path:
    """Delivered rate of each flow over time (and DCQCN's current rate where the transport has one)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    flows = [f for f in result.get("flows", []) if f.get("samples")]
    flows.sort(key=lambda f: -f.get("bytes", 0))
    top = flows[0].get("bytes", 0) if flows else 0
    flows = [f for f in flows[:max_flows] if f.get("bytes", 0) >= 0.01 * top]   # not barrier tokens
    t_zero = min((f["samples"][0][0] for f in flows), default=0.0)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for f in flows:
        ts, rates = flow_rate_series(f)
        line, = ax.plot([t - t_zero for t in ts], [x / 1e6 for x in rates], linewidth=1,
                        label=f"{f['src']}→{f['dst']}")
        dcqcn = [(s[0], s[2]) for s in f["samples"] if len(s) > 2 and s[2]]
        if dcqcn:
            ax.plot([t - t_zero for t, _ in dcqcn], [x / 1e6 for _, x in dcqcn], linestyle=":",
                    linewidth=0.8, color=line.get_color())
    ax.set_xlabel("time (s)")
    ax.set_ylabel("rate (Mbit/s)")
    ax.set_title(f"per-flow rate: {_label(result)} (dotted: DCQCN rate)")
    ax.grid(True, alpha=0.3)
    if flows:
        ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def _save(fig, path) -> Path:
    """Write a figure as PNG (creating its folder) and free it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m hpnlab.fabric.workload.report results.json [--plots DIR]``: the tables again from a results
    file (``hpnlab collective``/``hpnlab run`` write it), and optionally the plots."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m hpnlab.fabric.workload.report", description=main.__doc__)
    p.add_argument("results", help="results.json written by hpnlab collective or hpnlab run")
    p.add_argument("--plots", metavar="DIR", help="also draw busbw.png and flows-*.png here")
    args = p.parse_args(argv)
    try:
        doc = read_json(args.results)
        results = doc["results"] if isinstance(doc, dict) else doc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"hpnlab: cannot read results from {args.results}: {exc}", file=sys.stderr)
        return 2
    for r in results:
        print(format_table(r))
        print()
    print(format_comparison(results))
    if args.plots:
        plot_busbw(results, Path(args.plots) / "busbw.png")
        for r in results:
            tag = "-".join(str(x) for x in (r["collective"], r.get("transport"), r.get("entropy")) if x)
            plot_flow_rates(r, Path(args.plots) / f"flows-{tag}-job{r.get('job', 0)}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
