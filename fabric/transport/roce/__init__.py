"""A userspace UDP transport modelled on RoCEv2 (reliable connection over UDP port 4791).

The parts, one module each, every one acting on the flows' state (:mod:`.flows`: ``TxFlow`` at
the sender, ``RxFlow`` at the receiver); :class:`.transport.RoceTransport` only wires them:

    ``wire``       the packet format: header, packet types, sizes, TOS bytes (pure)
    ``sender``     the NIC scheduler: serves the flows round robin, paces each at DCQCN's rate
                   and each port at line rate, chooses each packet's path, builds and sends it
    ``receiver``   data placed and delivered in order, reordering, and the answers: ACK, NACK,
                   PATH_LOSS, CNP
    ``recovery``   the sender's reliability: ACKs, selective or go-back-N retransmission, the
                   retransmission timer (RTO), path migration after repeated timeouts
    ``dcqcn``      DCQCN at the reaction point: rate cuts on CNPs (and losses), its timers, the
                   flow pacer (pure)
    ``failover``   path choice and liveness: the dead-path rule, probes, NIC port links, PLANE
    ``endpoint``   the sockets: one receiving socket per plane, the paths' sending sockets
                   (their source ports are the entropy values)

What is modelled
    * Packets carry a per-flow packet sequence number (PSN), the message id, its offset and
      length; a flow is one direction of a rank pair (a QP).
    * Receiver: places every packet at its offset (a reordering / reassembly buffer, as NICs
      that accept sprayed packets do), delivers messages in order, sends a cumulative ACK
      (coalesced: one per received batch), and a NACK naming the first missing PSN: on a
      one-path connection once ``reorder_threshold`` (3) packets beyond the hole have
      arrived; on a multi-path one only once the hole outlives the reordering allowance
      (``reorder_time_s`` at first, widened to 1.25x the age of any hole that a late first
      copy filled, and doubled after a NACK that turned out spurious; at most 0.2 s; once a
      re-send has filled a hole, the next one is timed from the first packet past it that
      arrived, so a run of losses is NACKed hole after hole, not one hole per timeout). Every
      data packet also carries its number on its path (a 16-bit path sequence); packets on
      one path arrive in the order they were sent (one route, FIFO queues), so a jump in it
      is a loss on that path, reported at once (PATH_LOSS: the path and the numbers missing)
      and re-sent by the sender, where a sprayed flow's PSN hole says nothing until it
      outlives the reordering allowance that paths of different delay need. Such a loss cuts
      the DCQCN rate at most once per smoothed RTT (an overflowing queue drops a run of
      packets).
      ``recovery="gobackn"`` models a classic RoCE NIC instead: it drops every
      out-of-order packet and NACKs the expected PSN (the sender resends from there).
    * Sender: a window of unacknowledged packets, selective retransmission of NACKed PSNs
      (go-back-N from the NACKed PSN in gobackn mode), a retransmission timeout
      (RTO = srtt + 4 rttvar, at least ``min_rto_s``; on a multi-path connection a packet's
      timer is at least its own path's srtt + 4 rttvar, ``PathParams.path_rto``, so that a
      slow path's packets are not overdue at the flow's mixed estimate) for tail losses, which re-sends the
      oldest unacknowledged packet and, on a one-path (``flow``) connection, the newest one
      sent as a tail-loss probe (the receiver then NACKs a lost tail's hole instead of the
      sender timing out once per packet), and message completion
      when every packet of the message is acknowledged (RDMA send completion).
    * Control packets (ACK, NACK, CNP, PLANE) leave with DSCP 48 (``CONTROL_TOS``), which RoCE
      fabrics give a strict-priority queue (here ``emulation.control_priority``, and always with
      priority flow control); data with DSCP 26 (``DATA_DSCP``), the lossless priority.
    * ECN: data packets leave with ECT(0) (IP_TOS); the receiver reads the TOS byte of
      every packet (IP_RECVTOS) and answers a CE mark with a CNP to the sender, at most one
      per ``cnp_interval_s`` per flow (RoCEv2's ECN-Echo).
    * DCQCN (Zhu et al., SIGCOMM 2015) at the sender, the reaction point: see
      :class:`.dcqcn.DcqcnParams`. A loss is congestion the ECN marks did not prevent (switch
      ports are lossy unless the emulation runs priority flow control, ``--pfc on``), so a NACK
      (a loss the receiver detected) also cuts the rate, as a CNP does. Packets are paced per flow at
      DCQCN's current rate and per NIC port at the port's line rate (the NIC's port scheduler).
    * Entropy: each packet's (plane, UDP source port) comes from the entropy policy
      (:mod:`..entropy`): ``flow`` fixes both per flow (hash of the rank pair: the ECMP
      baseline), ``ecmp`` one hashed connection per plane (NCCL's QPs), ``flowlet`` the same
      connections, each moving to its plane's next entropy value after an idle gap longer
      than ``flowlet_gap_us`` (default: 4 packet times at line rate, at least 500 us), ``spray``
      rotates per packet over every plane of the rank and ``ports_per_nic`` source ports
      per plane (several sockets bound to different source ports on each interface),
      ``adaptive`` sprays weighted by each path's own evidence (its RTT against the flow's
      best path's, its CNPs, path losses and timeouts; :class:`..adaptive.WeightedPaths`) and
      ``reps`` recycles the paths whose packets are acknowledged cleanly (REPS,
      :class:`..adaptive.AdaptivePaths`), both fed per path. With ``entropy_map`` (the
      controller's, :class:`hpnlab.fabric.routing.entropy.EntropyMap`) the source ports are bound to the map's
      entropy values (at most as many per plane as the map has distinct paths), so N paths
      are N known, distinct ways through the fabric; each connection (rank pair and plane)
      takes its own N values, :func:`hpnlab.fabric.routing.entropy.connection_values` (the flow model takes the
      same), so different connections use different uplinks, as real NICs' queue pairs do. Without a map the
      kernel assigns the ports (a real fabric whose hashing is unknown), one set per rank.

    * Host-side failover (:mod:`..paths` states the rules): the receiver reports, in every
      ACK and NACK, which of the sender's paths delivered (the echoed data packet's path and
      send time, plus up to three (path, send time) reports), so the sender knows per path
      the newest packet delivered. A path whose oldest packet in flight outlives
      ``max(K x srtt, floor)`` while another path delivered a later one is dead: nothing new
      goes there, what was in flight there is re-sent at once on live paths, and one probe per
      ``probe_interval_s`` tests it until it delivers again. A NIC port the kernel refuses to
      send on (``ENETUNREACH``, ``ENETDOWN``...), or whose carrier is lost (polled every
      ``link_poll_s`` through rtnetlink, :mod:`..nic`), takes its plane out at once; the rank
      also tells every peer, on a live plane (PLANE), so that their flows to it leave that
      plane at once too (and probe it at once when the port is back). The last live path is
      never given up.
    * Path migration (NCCL/UEC-style): a one-path (``flow``) connection whose retransmission
      timer fires ``migrate_after_rtos`` times in a row (default 2) moves to a new entropy
      value: another source port, on another plane if the rank has several (with a single
      path, its socket is re-bound to a new source port). The timer backs off at most to
      ``max_rto_s`` (default 100 ms, not 1 s), so a dead path costs about three RTOs before
      the move: ~30 ms at ``min_rto_s=0.01`` (measured by tools/bench/bench_transport.py), ~120 ms
      at the default 40 ms minimum (chosen for a loaded 2-core machine, where a shorter one
      fires spuriously); not seconds.
    * Answers (ACK, NACK, CNP) go on a plane that delivered data from the peer within
      ``ack_fresh_s``, that this rank's own sending to the peer does not find dead, and whose
      answers do not seem lost (the peer re-sent data already acknowledged there): not
      merely the plane of the last data packet.

Every flow counts packets, bytes, retransmissions, timeouts, NACKs, CE marks (receiver),
CNPs (sender), duplicates, the deepest reordering seen (PSN distance beyond the next
expected one) and samples (time, bytes acknowledged, DCQCN rate) every ``sample_s``; and,
in bounded memory, what a failure's loss window is made of (:mod:`..accounting`): arrival
and in-order gaps, retransmission bursts with their cause (nack, timeout, failover,
migrate), the slowest message completions, the path events, and the bytes and CRC-32 of
every message posted (sender) and handed to the application (receiver), which must match.
"""
from __future__ import annotations

from .dcqcn import Dcqcn, DcqcnParams, RateControl
from .flows import RxFlow, TxFlow
from .receiver import NO_COUNT, REORDER_TIME_MAX_S, path_gap
from .sender import serve_order
from .transport import RoceTransport
from .wire import (
    ABORT,
    ACK,
    CE,
    CNP,
    CONTROL_TOS,
    DATA,
    DATA_DSCP,
    ECT0,
    ETH,
    HDR,
    IP_UDP,
    MAX_PATHS,
    NACK,
    NO_REPORT,
    PATH_LOSS,
    PLANE,
    PROBE,
    PSEQ_MASK,
    packets_for,
    wire_bits,
)

__all__ = ["ABORT", "ACK", "CE", "CNP", "CONTROL_TOS", "DATA", "DATA_DSCP", "ECT0", "ETH", "HDR", "IP_UDP", "MAX_PATHS",
           "NACK", "NO_COUNT", "NO_REPORT", "PATH_LOSS", "PLANE", "PROBE", "PSEQ_MASK", "REORDER_TIME_MAX_S", "Dcqcn",
           "DcqcnParams", "RateControl", "RoceTransport", "RxFlow", "TxFlow", "packets_for", "path_gap",
           "serve_order", "wire_bits"]
