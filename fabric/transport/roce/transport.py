"""The roce transport of one rank: its options checked, its parts wired, the step loop, and
each arriving packet handed to the part it concerns (what is modelled: the package's docstring)."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict

from hpnlab.fabric.routing.entropy import EntropyMap

from ..accounting import crc_chain
from ..base import PeerLost, Transport, TransportError
from ..entropy import ENTROPY_POLICIES, FlowEntropy
from ..paths import PathParams, PathTable
from .dcqcn import DcqcnParams, RateControl
from .endpoint import Endpoint
from .failover import Failover
from .flows import RxFlow, TxFlow
from .receiver import NO_COUNT, Receiver
from .recovery import RECOVERIES, SELECTIVE, Recovery, rto_bounds
from .sender import OVERHEAD, NicScheduler, PortPause
from .wire import ABORT, ACK, CNP, DATA, HDR, IP_UDP, MAX_PATHS, NACK, PATH_LOSS, PLANE, PROBE

#: the minimum retransmission timeout on a lossless fabric (priority flow control: the ``pause`` option).
#: There a packet is held, not dropped (no headroom drop in any run measured), behind pauses downstream
#: of its NIC for as long as they last: with the lossy fabric's 40 ms, 46-75 timeouts of mini-hpn's
#: all-to-all re-sent packets that also arrived; with 200 ms, 0-2 (bench_pfc_retx, 2026-12-07). Real
#: RoCE NICs' timers are likewise far above any pause (ConnectX's default is tens of milliseconds at
#: microsecond pauses); the rare loss costs this long once.
LOSSLESS_MIN_RTO_S = 0.2


class RoceTransport(Transport):
    """A rank of the roce transport. The parts, each acting on the flows' state
    (:mod:`.flows`): ``endpoint`` (the sockets), ``sender`` (the NIC scheduler), ``receiver``,
    ``recovery`` (retransmission and its timer), ``rate`` (DCQCN) and ``failover`` (path
    choice and liveness)."""
    name = "roce"

    def __init__(self, rank: int, addrs: list[list[str]], *, base_port: int = 4791,
                 line_rate_bps: float = 20e6, entropy: str = FlowEntropy.name, mtu: int = 1500,
                 recovery: str = SELECTIVE, dcqcn: bool | DcqcnParams = True,
                 ports_per_nic: int = 8, window_pkts: int = 64, reorder_threshold: int | None = None,
                 reorder_time_s: float | None = None,
                 ecn: bool = True, timeout_s: float = 10.0, min_rto_s: float = 0.04,
                 sample_s: float = 0.025, burst_s: float = 0.004, pace: float = 1.0,
                 ack_every: int = 8, ack_delay_s: float = 0.004, lookahead_s: float = 0.003,
                 bdp_factor: float = 6.0, max_rto_s: float = 0.1, paths: PathParams | dict | None = None,
                 gap_threshold_s: float = 0.002, ack_fresh_s: float = 0.02, watch_links: bool = True,
                 link_poll_s: float = 0.005, link_state: Callable[[str], bool | None] | None = None,
                 nic_names: list[str | None] | None = None, entropy_map: EntropyMap | dict | None = None,
                 flowlet_gap_us: float | None = None, adaptive: dict | None = None,
                 pause: dict | None = None, pause_holds_timer: bool = True,
                 lossless_min_rto_s: float | None = LOSSLESS_MIN_RTO_S, lossless_holes: bool = True):
        if recovery not in RECOVERIES:
            raise TransportError(f"recovery must be selective or gobackn, got {recovery!r}")
        if entropy not in ENTROPY_POLICIES:
            raise TransportError(f"unknown entropy {entropy!r} (known: {', '.join(ENTROPY_POLICIES)})")
        self.rank, self.nranks, self.addrs = rank, len(addrs), addrs
        self.planes = len(addrs[rank])
        self.base_port = base_port
        if not 0.1 <= pace <= 1.0:
            raise TransportError(f"pace must be between 0.1 and 1 (a fraction of line rate), got {pace}")
        self.pace = pace
        self.line_rate_bps = float(line_rate_bps)    # per NIC port (plane)
        self.payload = mtu - IP_UDP - HDR.size
        if self.payload < 64:
            raise TransportError(f"mtu {mtu} is too small for the roce transport (at least {IP_UDP + HDR.size + 64})")
        self.mtu = mtu
        self.recovery_mode = recovery
        self.entropy_map = EntropyMap.from_dict(entropy_map)
        self.ports_per_nic = max(1, ports_per_nic)
        if self.entropy_map is not None:      # as many source ports per plane as distinct paths, at most
            self.ports_per_nic = min(self.ports_per_nic, self.entropy_map.path_count())
        if self.planes * self.ports_per_nic > MAX_PATHS - 1:
            raise TransportError(f"{self.planes} planes x {self.ports_per_nic} ports per NIC is more than "
                                 f"{MAX_PATHS - 1} paths; use fewer ports_per_nic")
        if flowlet_gap_us is None:            # 4 packet times at line rate, at least 500 us
            flowlet_gap_us = max(500.0, 4 * mtu * 8 / float(line_rate_bps) * 1e6)
        self.flowlet_gap_us = flowlet_gap_us
        self.policy = ENTROPY_POLICIES[entropy](self.planes, self.ports_per_nic, flowlet_gap_s=flowlet_gap_us / 1e6,
                                                adaptive=adaptive)
        per_flow = self.policy.per_flow
        self.entropy = entropy
        self.window = window_pkts
        # on a multi-path connection a hole's count says only how far its paths differ in delay
        # (PATH_LOSS finds the losses): a hole is a loss only by its age there (NO_COUNT)
        self.reorder_threshold = reorder_threshold if reorder_threshold is not None else (
            3 if per_flow else NO_COUNT)
        self.reorder_time_s = reorder_time_s if reorder_time_s is not None else (
            0.0 if per_flow else 0.008)
        self.ecn = ecn
        self.timeout_s = timeout_s
        min_rto_s, max_rto_s = rto_bounds(min_rto_s, max_rto_s, bool(pause), lossless_min_rto_s)
        self.min_rto_s = min_rto_s
        if max_rto_s < min_rto_s:
            raise TransportError(f"max_rto_s ({max_rto_s}) must be at least min_rto_s ({min_rto_s})")
        self.max_rto_s = max_rto_s
        try:
            self.path_params = paths if isinstance(paths, PathParams) else PathParams(**(paths or {}))
        except TypeError as exc:
            raise TransportError(f"bad path rules: {exc}") from None
        self.gap_threshold_s = gap_threshold_s
        self.wall_offset = time.time() - time.monotonic()     # monotonic -> wall clock
        self.bdp_factor = bdp_factor
        # A flow's top rate is what its paths can carry: one port with flow entropy, every
        # plane's port when it sprays (the NIC pacers still hold each port to line rate).
        self.flow_max_bps = self.line_rate_bps * (1 if per_flow else self.planes)
        if dcqcn is True:
            dcqcn = DcqcnParams.scaled(self.flow_max_bps, self.payload)
        self.dcqcn_params = dcqcn or None
        self.tx: dict[int, TxFlow] = {}
        self.rx: dict[int, RxFlow] = {}
        self.cpu_busy = 0.0
        self.heard: dict[int, float] = {}
        #: priority flow control: the emulation's map of host NICs' paused priorities and each NIC's
        #: index in it by address (:class:`.sender.PortPause`); None: nothing pauses this rank's NIC
        self.pause = pause
        # the parts
        self.endpoint = Endpoint(rank, addrs, base_port, self.ports_per_nic, ecn, self.entropy_map)
        self.rate = RateControl(self.dcqcn_params, burst_s, nack_cuts=per_flow and recovery == SELECTIVE)
        self.failover = Failover(self.policy, self.endpoint, self.tx, self.rx, self.path_params,
                                 watch_links=watch_links, link_poll_s=link_poll_s, link_state=link_state,
                                 nics=nic_names, wall_offset=self.wall_offset)
        self.recovery = Recovery(recovery, self.policy, self.failover, self.rate, self.path_params,
                                 min_rto_s=min_rto_s, max_rto_s=max_rto_s, window_pkts=window_pkts,
                                 bdp_factor=bdp_factor, flow_max_bps=self.flow_max_bps,
                                 packet_bytes=self.payload + OVERHEAD, ack_every=max(1, ack_every), sample_s=sample_s)
        self.sender = NicScheduler(rank, self.endpoint, self.failover, self.rate, payload=self.payload,
                                   line_rate_bps=self.line_rate_bps, pace=pace, burst_s=burst_s,
                                   lookahead_s=lookahead_s)
        self.recovery.hold_in_pause = pause_holds_timer
        self.receiver = Receiver(self.rx, self.tx, self.endpoint.control, mode=recovery,
                                 reorder_threshold=self.reorder_threshold, ack_every=max(1, ack_every),
                                 ack_delay_s=ack_delay_s, ack_fresh_s=ack_fresh_s,
                                 cnp_interval_s=self.rate.cnp_interval_s,
                                 suspect_s=self.path_params.probe_interval_s,
                                 lossless=bool(pause) and lossless_holes)

    @property
    def tx_socks(self) -> list:
        """The sending sockets (one per path without an entropy map: index plane x ports + k)."""
        return self.endpoint.tx_socks

    # ---- setup ---------------------------------------------------------------------------
    def info(self) -> dict:
        return {"transport": "roce", "entropy": self.entropy, "recovery": self.recovery_mode,
                "mtu": self.mtu, "payload_bytes": self.payload, "line_rate_bps": self.line_rate_bps,
                "flow_max_bps": self.flow_max_bps, "planes": self.planes, "ports_per_nic": self.ports_per_nic,
                "window_pkts": self.window, "bdp_factor": self.bdp_factor, "pace": self.pace,
                "reorder_threshold": self.reorder_threshold, "reorder_time_s": self.reorder_time_s,
                "ecn": self.ecn, "min_rto_s": self.min_rto_s, "max_rto_s": self.max_rto_s,
                "path_rules": asdict(self.path_params), "gap_threshold_s": self.gap_threshold_s,
                "watched_ports": self.failover.nics, "link_events": self.failover.link_events,
                "dcqcn": asdict(self.dcqcn_params) if self.dcqcn_params else None,
                "udp_port": self.endpoint.port, "pfc_pause": bool(self.pause),
                "pause_holds_timer": self.recovery.hold_in_pause, "lossless_holes": self.receiver.lossless,
                "source_ports": self.endpoint.source_ports(),
                "entropy_map": self.entropy_map.as_dict() if self.entropy_map else None,
                "entropy_values": self.endpoint.tx_entropy,
                "connection_values": {r: f.values for r, f in self.tx.items()},
                "flowlet_gap_us": self.flowlet_gap_us if self.entropy == "flowlet" else None}

    def start(self) -> None:
        self.endpoint.open()
        self.failover.start(self.addrs[self.rank])
        self.sender.start()
        if self.pause:
            self.sender.paused = PortPause(self.rank, self.pause, self.addrs[self.rank])
            self.recovery.paused = self.sender.paused
            self.recovery.ports_per_nic = self.ports_per_nic
        now = time.monotonic()
        for r in range(self.nranks):
            if r != self.rank:
                f = self.tx[r] = TxFlow(self.rank, r, now, self.rate.start(now),
                                        PathTable(self.planes, self.ports_per_nic, self.path_params))
                f.window = self.window
                self.endpoint.bind_connection(f)
                self.rx[r] = RxFlow(r, self.planes, self.gap_threshold_s)
                self.rx[r].reorder_time = self.reorder_time_s

    # ---- the step ----------------------------------------------------------------------
    def exchange(self, sends, recvs, wait_sends: bool = True):
        """Post ``sends`` and ``recvs``; return the received payloads once every receive has
        arrived and (``wait_sends``) every send is acknowledged. With ``wait_sends=False`` the
        sends are copied and complete in the background of later calls (as a NIC's send
        queue does), so a rank moves to its next step as soon as its data is in;
        :meth:`flush` waits for them."""
        now = time.monotonic()
        waiting = []                                  # (flow, msg id) not yet acknowledged
        for peer, data in sends:
            f = self.tx[peer]
            mid = f.msg_next
            f.msg_next += 1
            mv = memoryview(data).cast("B")
            if len(mv) == 0:
                continue
            if not wait_sends:
                mv = memoryview(bytes(mv))
            else:
                waiting.append((f, mid))
            f.app_bytes += len(mv)
            f.app_crc = crc_chain(f.app_crc, mv)
            f.msg_posted[mid] = (now, len(mv))
            f.queue.append((mid, mv))
            f.last_progress = now

        def sends_done() -> bool:
            if all(m in f.done_msgs for f, m in waiting):
                for f, m in waiting:
                    f.done_msgs.discard(m)
                return True
            return False
        return self._run(recvs, sends_done)

    def flush(self) -> None:
        """Wait until everything sent so far is acknowledged."""
        def idle() -> bool:
            if any(f.queue or f.cur or f.unacked for f in self.tx.values()):
                return False
            for f in self.tx.values():
                f.done_msgs.clear()
            return True
        self._run([], idle)

    def _run(self, recvs, sends_done):
        now = time.monotonic()
        results: list = [None] * len(recvs)
        done_at = [0.0] * len(recvs)              # when each receive completed (monotonic s)
        want = deque(range(len(recvs)))
        started = now
        for f in self.tx.values():
            if f.queue or f.unacked:
                f.last_progress = now
        busy_t0 = time.process_time()
        ready = None                                   # None: try every socket
        try:
            while True:
                if ready is None or ready:
                    self.endpoint.receive(self._on_packet, ready)
                now = time.monotonic()
                # deliver what has arrived, in posting order per peer
                for i in list(want):
                    peer, nbytes = recvs[i]
                    rxf = self.rx[peer]
                    if rxf.ready and _first_for_peer(want, recvs, i, peer):
                        data = rxf.ready.popleft()
                        if len(data) != nbytes:
                            raise TransportError(f"rank {self.rank}: rank {peer} sent a {len(data)} B "
                                                 f"message where {nbytes} B were expected (out of step)")
                        results[i] = data
                        done_at[i] = now
                        rxf.app_bytes += len(data)
                        rxf.app_crc = crc_chain(rxf.app_crc, data)
                        want.remove(i)
                ack_at = self.receiver.flush_acks(now)
                if not want and sends_done():
                    if recvs:
                        self.recv_done = done_at
                    return results
                wake = self._send_and_timers(now)
                if ack_at:
                    wake = min(wake, ack_at)
                wait = min(max(0.0, wake - time.monotonic()), 0.005)
                ready = self.endpoint.wait(wait)
                self._check_peers(now, want, recvs, started)
        finally:
            self.cpu_busy += time.process_time() - busy_t0

    def _check_peers(self, now, want, recvs, started):
        for f in self.tx.values():
            if (f.unacked or f.queue or f.cur) and now - f.last_progress > self.timeout_s:
                raise PeerLost(f.dst, self.endpoint.peer_addr[f.dst, 0][0],
                               f"stopped acknowledging for {self.timeout_s:g} s (unreachable or gone)")
        if want:
            peer = recvs[want[0]][0]
            if now - max(self.heard.get(peer, 0.0), started) > self.timeout_s:
                raise PeerLost(peer, self.endpoint.peer_addr[peer, 0][0],
                               f"sent nothing for {self.timeout_s:g} s (unreachable or gone)")

    def _send_and_timers(self, now: float) -> float:
        """The timers of every flow with data -- DCQCN's, the dead-path rule and its probes, the
        retransmission timer: whether or not the NIC may serve the flow -- then the NIC
        scheduler; when to wake next."""
        self.failover.poll(now)
        flows = [f for f in self.tx.values() if f.retx or f.queue or f.cur or f.unacked]
        self.rate.tick(flows, now)
        self.failover.on_timers(flows, now)
        self.recovery.on_timers(flows, now)
        wake = self.sender.serve(flows, now, now + 0.005)
        return self.failover.next_due(flows, self.recovery.next_due(flows, wake))

    def _on_packet(self, data: bytes, tos: int, plane: int = 0) -> None:
        """One packet that arrived on ``plane`` (``tos``: its TOS byte), to the part it concerns."""
        if len(data) < HDR.size:
            return
        typ, path, src, dst, psn, mid, off, mlen, ts, pseq = HDR.unpack_from(data)
        if dst != self.rank or src == self.rank or src >= self.nranks:
            return
        now = time.monotonic()
        self.heard[src] = now
        if typ == DATA:
            self.receiver.on_data(self.rx[src], data, tos, path, psn, mid, off, mlen, ts, now, plane, pseq)
        elif typ == ACK:
            f = self.tx[src]
            if ts:
                self.failover.delivered(f, path, ts, 32, now)
            self.failover.reports(f, (mid, off, mlen), now)
            self.recovery.on_ack(f, psn, ts, path, now)
        elif typ == NACK:
            self.failover.reports(self.tx[src], (off, mlen), now)
            self.recovery.on_nack(self.tx[src], psn, mid, path, now)
        elif typ == PATH_LOSS:
            self.failover.reports(self.tx[src], (off, mlen), now)
            self.recovery.on_path_loss(self.tx[src], path, psn, mid, now)
        elif typ == PROBE:
            self.receiver.on_probe(self.rx[src], plane, path, ts, now)
        elif typ == CNP:
            f = self.tx[src]
            self.policy.on_feedback(f, path, "ce", now)
            self.rate.on_cnp(f, now)
        elif typ == PLANE:
            if path < self.planes:
                self.failover.on_plane_notice(self.tx[src], path, bool(psn), now)
        elif typ == ABORT:
            raise PeerLost(src, self.endpoint.peer_addr[src, 0][0], "aborted the run")

    # ---- results ------------------------------------------------------------------------
    def flow_stats(self) -> list[dict]:
        """This rank's view of its flows: "tx" entries (rank -> peer: sender counters, DCQCN,
        rate samples) and "rx" entries (peer -> rank: CE marks, CNPs sent, reordering)."""
        out = []
        for peer in sorted(self.tx):
            f, r = self.tx[peer], self.rx[peer]
            out.append({"side": "tx", "src": self.rank, "dst": peer, **f.stats,
                        "rate_cuts": f.dcqcn.cuts if f.dcqcn else 0,
                        "final_rate_bps": f.dcqcn.rc if f.dcqcn else self.flow_max_bps,
                        "srtt_us": (f.srtt or 0) * 1e6, "min_rtt_us": (f.min_rtt or 0) * 1e6,
                        "window_pkts": f.window, "samples": f.samples,
                        "app_bytes_sent": f.app_bytes, "app_crc_sent": f"{f.app_crc:08x}",
                        "retx_bursts": f.bursts.export(self.wall_offset),
                        "slowest_msgs": [[a + self.wall_offset, b + self.wall_offset, nb]
                                         for a, b, nb in f.slowest.items()],
                        "paths": f.paths.summary(self.wall_offset),
                        "entropy_policy": self.policy.summary(f)})
            out.append({"side": "rx", "src": peer, "dst": self.rank, **r.stats,
                        "reorder_time_ms": r.reorder_time * 1e3,
                        "app_bytes_delivered": r.app_bytes, "app_crc_delivered": f"{r.app_crc:08x}",
                        "gaps": r.gaps.export(self.wall_offset),
                        "hol_gaps": r.hol.export(self.wall_offset)})
        return out

    def socket_drops(self) -> int | None:
        return self.endpoint.socket_drops() if self.endpoint.is_open else None

    def abort(self) -> None:
        """Tell every peer to stop (best effort, a few copies)."""
        if not self.endpoint.is_open:
            return                      # never started: nobody to tell
        for _ in range(3):
            for r in range(self.nranks):
                if r != self.rank:
                    for p in range(self.planes):
                        self.endpoint.control(ABORT, r, p, 0, 0, 0)

    def close(self, linger_s: float = 3.0, quiet_s: float = 0.5) -> None:
        """Keep answering for a while (like TCP's TIME_WAIT): a peer whose last ACK was lost
        retransmits, and only a rank still listening can acknowledge it. Ends after
        ``quiet_s`` without packets, at most ``linger_s``."""
        if self.endpoint.rx_socks and linger_s > 0:
            now = time.monotonic()
            deadline, last = now + linger_s, now
            try:
                while now < deadline and now - last < quiet_s:
                    self.endpoint.wait(0.05)
                    if self.endpoint.receive(self._on_packet):
                        last = time.monotonic()
                    self.receiver.flush_acks(force=True)
                    now = time.monotonic()
            except (OSError, TransportError):
                pass
        self.endpoint.close()
        self.failover.close()
        if isinstance(self.sender.paused, PortPause):
            self.sender.paused.close()
            self.sender.paused = self.recovery.paused = None


def _first_for_peer(want, recvs, i, peer) -> bool:
    for j in want:
        if recvs[j][0] == peer:
            return j == i
    return False
