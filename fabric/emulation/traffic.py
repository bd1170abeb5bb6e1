"""Traffic checks on emulated hosts with iperf3 (never Mininet's own iperf helper, which kills by name),
an ECT UDP overload of one switch port and a lossless UDP incast (``hpnlab.fabric.emulation.udp``)."""
from __future__ import annotations

import json
import sys
import time
from typing import Any

from .errors import EmulationError


def iperf3(emu, src: str, dst: str, *, plane: int = 0, seconds: float = 3.0, udp_mbps: float | None = None,
           port: int = 5201, omit: int = 1) -> dict[str, Any]:
    """Run one iperf3 test from src to dst on a plane; returns received Mbit/s and the raw JSON.

    The server runs once (``-1``) bound to dst's address on that plane; both processes are
    recorded in the run's state, so a killed run leaves neither behind.
    """
    dip, sip = emu.ip(dst, plane), emu.ip(src, plane)
    server = emu.popen(dst, ["iperf3", "-s", "-1", "-B", dip, "-p", str(port)])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            out = emu.host(dst).cmd(f"ss -ltnH 'sport = :{port}'")
            if dip in out:
                break
            time.sleep(0.05)
        cmd = ["iperf3", "-c", dip, "-B", sip, "-p", str(port), "-t", f"{seconds:g}", "-J"]
        if udp_mbps:
            # no omitted interval for UDP: iperf3 3.12 mixes omitted packets into the loss count
            cmd += ["-u", "-b", f"{udp_mbps:g}M", "-l", "1400"]
        else:
            cmd += ["-O", str(omit)]
        client = emu.popen(src, cmd)
        out, _ = client.communicate(timeout=seconds + omit + 20)
        data = json.loads(out.decode() or "{}")
        if "error" in data:
            raise RuntimeError(f"iperf3 {src}->{dst}: {data['error']}")
        end = data["end"]
        if udp_mbps:
            # bytes the server received over the time the client sent (its tail is queue drain)
            recv_bps = end["sum_received"]["bytes"] * 8 / end["sum_sent"]["seconds"]
            sent_bps = end["sum_sent"]["bits_per_second"]
        else:
            recv_bps = end["sum_received"]["bits_per_second"]
            sent_bps = end["sum_sent"]["bits_per_second"]
        return {"src": src, "dst": dst, "plane": plane, "received_mbps": recv_bps / 1e6,
                "sent_mbps": sent_bps / 1e6, "retransmits": end.get("sum_sent", {}).get("retransmits"),
                "raw": data}
    finally:
        if server.poll() is None:
            server.terminate()
        try:
            server.wait(timeout=3)
        except Exception:
            server.kill()


def udp_overload(emu, dst: str, senders: tuple[str, ...], intf: str, *, seconds: float, port: int,
                 rate_mbps: float = 8, tos: int = 2) -> tuple[dict[str, int], float, float]:
    """Every sender sends UDP (``tos`` 2: ECT(0)) at ``rate_mbps`` to ``dst`` for ``seconds``:
    the ECN stage's counters of switch port ``intf`` over the phase (packets, ect, ce_marked),
    and the phase's monotonic start and end."""
    before = emu.ecn.counters(intf)
    py = sys.executable
    t0 = time.monotonic()
    recv = emu.popen(dst, [py, "-m", "hpnlab.fabric.emulation.udp", "recv", emu.ip(dst), str(port),
                           "--seconds", str(seconds + 1.5)])
    if recv.stdout.readline().strip() != b"listening":
        recv.communicate(timeout=seconds + 10)
        raise EmulationError(f"the UDP receiver on {dst} did not start")
    procs = [emu.popen(h, [py, "-m", "hpnlab.fabric.emulation.udp", "send", emu.ip(dst), str(port),
                           "--rate-mbps", str(rate_mbps), "--seconds", str(seconds), "--tos", str(tos)])
             for h in senders]
    for s in procs:
        s.communicate(timeout=seconds + 10)
    t1 = time.monotonic()
    recv.communicate(timeout=seconds + 10)
    after = emu.ecn.counters(intf)
    return {k: after[k] - before[k] for k in ("packets", "ect", "ce_marked")}, t0, t1


#: the TOS byte of lossless UDP: DSCP 26 (RoCEv2 data's priority) with ECT(0)
LOSSLESS_TOS = 26 << 2 | 2


def udp_incast(emu, dst: str, senders: dict[str, float], *, seconds: float, port: int, flows: int = 16,
               plane: int = 0, tos: int = LOSSLESS_TOS, size: int = 1400, drain_s: float = 60.0,
               idle_s: float = 3.0) -> dict[str, Any]:
    """Every sender (host -> Mbit/s) sends paced UDP to ``dst`` on ``plane`` for ``seconds`` over ``flows``
    source ports (so the fabric spreads it over its paths); ``dst`` listens until nothing has arrived for
    ``idle_s`` (what pauses held in the senders' and switches' queues has drained), at most ``drain_s``
    after the senders' time. Returns {"sent": {host: packets}, "received": {host: packets}, totals}."""
    py = sys.executable
    dip = emu.ip(dst, plane)
    recv = emu.popen(dst, [py, "-m", "hpnlab.fabric.emulation.udp", "recv", dip, str(port),
                           "--seconds", str(seconds + drain_s), "--idle", str(idle_s)])
    if recv.stdout.readline().strip() != b"listening":
        recv.communicate(timeout=seconds + drain_s + 10)
        raise EmulationError(f"the UDP receiver on {dst} did not start")
    procs = {h: emu.popen(h, [py, "-m", "hpnlab.fabric.emulation.udp", "send", dip, str(port), "--rate-mbps",
                              f"{rate:g}", "--seconds", str(seconds), "--tos", str(tos), "--size", str(size),
                              "--src", emu.ip(h, plane), "--flows", str(flows),
                              "--sport-base", str(40000 + 100 * i)])
             for i, (h, rate) in enumerate(senders.items())}
    sent = {h: json.loads(p.communicate(timeout=seconds + 60)[0].decode().strip().splitlines()[-1])["sent"]
            for h, p in procs.items()}
    got = json.loads(recv.communicate(timeout=seconds + drain_s + 30)[0].decode().strip().splitlines()[-1])
    ip_of = {emu.ip(h, plane): h for h in senders}
    received = {ip_of.get(ip, ip): n for ip, n in got["by_source"].items()}
    return {"sent": sent, "received": received, "sent_total": sum(sent.values()), "received_total": got["packets"],
            "ce": got["ce"]}
