"""A paced UDP sender and a TOS-counting receiver, run inside emulated hosts.

    python -m hpnlab.fabric.emulation.udp send DST_IP PORT --rate-mbps 8 --seconds 3 --tos 2 [--size 1400]
                                              [--flows N --sport-base P --src SRC_IP]
    python -m hpnlab.fabric.emulation.udp recv BIND_IP PORT --seconds 4
    python -m hpnlab.fabric.emulation.udp probe PLAN.json
    python -m hpnlab.fabric.emulation.udp flows DST_IP PORT --flows 16 --pps 6000 --seconds 4 --src SRC_IP
    python -m hpnlab.fabric.emulation.udp flowrecv BIND_IP PORT --seconds 5 --out ARRIVALS.npz

``flows`` sends N paced flows that differ only in their source port (``--sport-base`` + i),
so the fabric spreads them over its paths; packets go round robin, each carrying (flow,
sequence number, send time). ``flowrecv`` records every packet's flow, sequence number,
send time and kernel arrival time (``SO_TIMESTAMPNS``, CLOCK_REALTIME like ``time.time()``)
into an ``.npz`` that ``hpnlab.fabric.emulation.losswindow`` analyses.

``probe`` runs one host's part of a reachability walk over every entropy branch (see
``hpnlab.fabric.emulation.reachability``): it listens on the plan's addresses, prints
``listening``, waits for ``go`` on stdin, sends each probe (source address and port as
planned) ``repeat`` times, keeps listening ``settle_s`` and prints one JSON line with the
(source ip, source port, destination ip) of every probe it received.

The receiver prints one JSON line: packets, bytes, and how many arrived with each ECN
codepoint (``not_ect``, ``ect1``, ``ect0``, ``ce``), read from the IP header through
``IP_RECVTOS``: the way to see on the wire that a switch marked CE (and that the
packet's checksum stayed valid, or the kernel would have dropped it).
"""
from __future__ import annotations

import argparse
import json
import selectors
import socket
import struct
import sys
import time
from array import array
from pathlib import Path
from typing import cast

IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)


def send(dst: str, port: int, rate_mbps: float, seconds: float, tos: int, size: int, src: str | None,
         n_flows: int = 1, sport_base: int = 0) -> dict:
    """Paced UDP to ``dst``; with ``n_flows`` > 1 round robin over that many sockets whose source ports
    follow ``sport_base`` (so the fabric spreads them over its paths). Blocking sockets: a full socket
    buffer (a paused NIC under priority flow control) holds the sender, it is not a loss."""
    socks = []
    for i in range(max(1, n_flows)):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        if src or sport_base:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((src or "0.0.0.0", sport_base + i if sport_base else 0))
        socks.append(s)
    payload = b"\0" * size
    interval = size * 8 / (rate_mbps * 1e6)
    start = time.monotonic()
    sent = 0
    next_t = start
    while True:
        now = time.monotonic()
        if now - start >= seconds:
            break
        if now < next_t:
            time.sleep(min(next_t - now, 0.002))
            continue
        try:
            socks[sent % len(socks)].sendto(sent.to_bytes(8, "big") + payload[8:], (dst, port))
            sent += 1
        except OSError:
            pass
        # paced, never bursting to catch up: a slot missed while descheduled is skipped
        next_t = max(next_t + interval, time.monotonic() - interval)
    return {"sent": sent, "bytes": sent * size, "seconds": time.monotonic() - start}


def recv(bind: str, port: int, seconds: float, idle_s: float = 0.0) -> dict:
    """Count what arrives for ``seconds``; with ``idle_s``, stop sooner once nothing has arrived for that
    long after the first packet (what queues held has drained)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((bind, port))
    s.settimeout(0.2)
    counts = {"packets": 0, "bytes": 0, "not_ect": 0, "ect1": 0, "ect0": 0, "ce": 0}
    by_source: dict[str, int] = {}
    names = ("not_ect", "ect1", "ect0", "ce")
    print("listening", flush=True)
    end = time.monotonic() + seconds
    last = None
    while time.monotonic() < end:
        try:
            data, anc, _, addr = s.recvmsg(65536, socket.CMSG_SPACE(4))
        except TimeoutError:
            if idle_s and last is not None and time.monotonic() - last > idle_s:
                break
            continue
        last = time.monotonic()
        counts["packets"] += 1
        counts["bytes"] += len(data)
        by_source[addr[0]] = by_source.get(addr[0], 0) + 1
        tos = None
        for level, typ, cdata in anc:
            if level == socket.IPPROTO_IP and typ in (socket.IP_TOS, IP_RECVTOS) and cdata:
                tos = cdata[0]
        if tos is not None:
            counts[names[tos & 3]] += 1
    return {**counts, "by_source": by_source}


#: flows payload header: flow id, sequence number, send time (ns, CLOCK_REALTIME)
FLOW_HEADER = struct.Struct("!IQQ")
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


def flows(dst: str, port: int, n_flows: int, pps: float, seconds: float, src: str, sport_base: int,
          size: int) -> dict:
    socks = []
    for i in range(n_flows):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((src, sport_base + i))
        socks.append(s)
    pad = b"\0" * max(0, size - FLOW_HEADER.size)
    seq = [0] * n_flows
    interval = 1.0 / pps
    start = time.monotonic()
    next_t = start
    k = errors = 0
    while True:
        now = time.monotonic()
        if now - start >= seconds:
            break
        if now < next_t:
            if next_t - now > 0.0002:
                time.sleep(min(next_t - now, 0.001))
            continue
        f = k % n_flows
        try:
            socks[f].sendto(FLOW_HEADER.pack(f, seq[f], time.time_ns()) + pad, (dst, port))
        except OSError:
            errors += 1
        seq[f] += 1
        k += 1
        # catch up at most one slot: a sender stall shows as a gap in send times, not a burst
        next_t = max(next_t + interval, time.monotonic() - interval)
    return {"sent": k, "send_errors": errors, "flows": n_flows, "per_flow": seq, "sport_base": sport_base,
            "seconds": time.monotonic() - start, "end_wall": time.time()}


def flowrecv(bind: str, port: int, seconds: float, out: Path) -> dict:
    import numpy as np
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind((bind, port))
    s.settimeout(0.2)
    flow, seq, sent_ns, arr_ns = array("I"), array("Q"), array("Q"), array("Q")
    print("listening", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            data, anc, _, _ = s.recvmsg(2048, socket.CMSG_SPACE(16))
        except TimeoutError:
            continue
        if len(data) < FLOW_HEADER.size:
            continue
        t = 0
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(cdata) >= 16:
                sec, nsec = struct.unpack("qq", cdata[:16])
                t = sec * 1_000_000_000 + nsec
        f, q, ts = FLOW_HEADER.unpack_from(data)
        flow.append(f)
        seq.append(q)
        sent_ns.append(ts)
        arr_ns.append(t or time.time_ns())
    np.savez(out, flow=np.frombuffer(flow, dtype=np.uint32), seq=np.frombuffer(seq, dtype=np.uint64),
             sent_ns=np.frombuffer(sent_ns, dtype=np.uint64), arrival_ns=np.frombuffer(arr_ns, dtype=np.uint64))
    return {"packets": len(flow), "out": str(out)}


def probe(plan: dict) -> dict:
    sel = selectors.DefaultSelector()
    listeners = []
    for ip in plan["listen"]:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.bind((ip, plan["port"]))
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, ip)
        listeners.append(s)
    senders: dict[tuple[str, int], socket.socket] = {}
    for sip, _, sport in plan["send"]:
        if (sip, sport) not in senders:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((sip, sport))
            senders[(sip, sport)] = s
    print("listening", flush=True)
    sys.stdin.readline()            # 'go': every host listens before anyone sends
    received: set[tuple[str, int, str]] = set()

    def drain(timeout: float) -> None:
        for key, _ in sel.select(timeout):
            while True:
                try:
                    _, (peer, peer_port) = cast(socket.socket, key.fileobj).recvfrom(2048)
                except BlockingIOError:
                    break
                received.add((peer, peer_port, key.data))

    sent = errors = 0
    for _ in range(plan["repeat"]):
        t = time.monotonic()
        for sip, dip, sport in plan["send"]:
            try:
                senders[(sip, sport)].sendto(b"hpnlab-probe", (dip, plan["port"]))
                sent += 1
            except OSError:
                errors += 1
        while (left := plan["gap_s"] - (time.monotonic() - t)) > 0:
            drain(left)
    end = time.monotonic() + plan["settle_s"]
    while (left := end - time.monotonic()) > 0:
        drain(left)
    return {"sent": sent, "send_errors": errors, "received": sorted(received)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpnlab.fabric.emulation.udp")
    sub = p.add_subparsers(dest="cmd", required=True)
    ps = sub.add_parser("send")
    ps.add_argument("dst")
    ps.add_argument("port", type=int)
    ps.add_argument("--rate-mbps", type=float, default=1.0)
    ps.add_argument("--seconds", type=float, default=1.0)
    ps.add_argument("--tos", type=lambda v: int(v, 0), default=2)
    ps.add_argument("--size", type=int, default=1400)
    ps.add_argument("--src")
    ps.add_argument("--flows", type=int, default=1)
    ps.add_argument("--sport-base", type=int, default=0)
    pr = sub.add_parser("recv")
    pr.add_argument("bind")
    pr.add_argument("port", type=int)
    pr.add_argument("--seconds", type=float, default=2.0)
    pr.add_argument("--idle", type=float, default=0.0, help="stop once nothing arrived for this long (0: never)")
    pp = sub.add_parser("probe")
    pp.add_argument("plan", type=Path)
    pf = sub.add_parser("flows")
    pf.add_argument("dst")
    pf.add_argument("port", type=int)
    pf.add_argument("--flows", type=int, default=16)
    pf.add_argument("--pps", type=float, default=6000.0)
    pf.add_argument("--seconds", type=float, default=4.0)
    pf.add_argument("--src", required=True)
    pf.add_argument("--sport-base", type=int, default=40000)
    pf.add_argument("--size", type=int, default=64)
    pv = sub.add_parser("flowrecv")
    pv.add_argument("bind")
    pv.add_argument("port", type=int)
    pv.add_argument("--seconds", type=float, default=5.0)
    pv.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.cmd == "flows":
        out = flows(a.dst, a.port, a.flows, a.pps, a.seconds, a.src, a.sport_base, a.size)
    elif a.cmd == "flowrecv":
        out = flowrecv(a.bind, a.port, a.seconds, a.out)
    elif a.cmd == "probe":
        out = probe(json.loads(a.plan.read_text()))
    elif a.cmd == "send":
        out = send(a.dst, a.port, a.rate_mbps, a.seconds, a.tos, a.size, a.src, a.flows, a.sport_base)
    else:
        out = recv(a.bind, a.port, a.seconds, a.idle)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
