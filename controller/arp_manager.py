"""ARP at the controller: requests the leaves' responder flows leave to it (packet-ins from host ports)
answered as the responders would (proxy ARP: the gateway MAC, or in per-host mode the target host's real
MAC; ``compiler.arp_answer``), and the per-leaf fallback (controller/arp_fallback.py decides): a leaf whose
switch rejects one of the gateway design's flow-mods answers ARP per host from then on.
"""
from __future__ import annotations

import logging
from collections import OrderedDict

from hpnlab.fabric.routing import compiler

from . import arp_fallback, codec, reconcile
from .shell import Shell

LOG = logging.getLogger("hpnlab.controller")
SENT_FLOWS_KEPT = 1 << 16          # flow-mods remembered by (dpid, xid), so that an error names its flow


class ArpManager:
    def __init__(self, app: Shell, mode: str):
        self.app = app
        self.mode = mode                  # compiler.ARP_MODES: how leaves answer, unless one fell back
        #: (dpid, xid) -> the flow-mod sent under it (the last SENT_FLOWS_KEPT): an error's flow
        self._sent_flows: OrderedDict[tuple[int, int], reconcile.FlowMod] = OrderedDict()

    def mode_of(self, name: str) -> str:
        return self.app.reconciler.arp_leaves.get(name, self.mode)

    def answer(self, dp, name: str, in_port: int, data: bytes) -> str:
        """A packet-in from host port ``in_port`` of leaf ``name``: an ARP request for a planned address
        is answered (its outcome for the metrics)."""
        parsed = codec.arp_request_of(data)
        if parsed is None:
            LOG.warning("%s port %d: packet-in that is not ARP, ignored", name, in_port)
            return "ignored"
        eth, req = parsed
        if not codec.is_arp_request(req) or req.dst_ip == req.src_ip:
            return "ignored"
        mac = compiler.arp_answer(self.app.graph, name, req.dst_ip, self.mode_of(name), in_port)
        if mac is None:
            LOG.info("%s port %d: ARP for %s, no other host of this plane, not answered", name, in_port, req.dst_ip)
            return "ignored"
        dp.send_msg(codec.packet_out(dp, codec.arp_reply_frame(eth, req, mac), in_port))
        return "arp-reply"

    def sent(self, dpid: int, xid: int | None, msg: reconcile.FlowMod) -> None:
        """A flow-mod went out under ``xid``: remembered, so that an error answering it names it."""
        if xid is None:
            return
        self._sent_flows[dpid, xid] = msg
        if len(self._sent_flows) > SENT_FLOWS_KEPT:
            self._sent_flows.popitem(last=False)

    def error(self, name: str, msg) -> None:
        """An error from ``name``: if it rejects one of the gateway-MAC design's flows, that leaf answers ARP
        per host from now on (one line, counted); the reconciler then resyncs it as after any error."""
        sent = self._sent_flows.get((msg.datapath.id, msg.xid))
        flow = (sent.table, sent.priority, sent.actions) if sent is not None else None
        fb = arp_fallback.decide(name, self.app.index.sw[name].tier == 1, self.mode_of(name), flow, msg.type,
                                 msg.code)
        if fb is None:
            return
        LOG.warning("%s", fb.line())
        self.app.handle(reconcile.ArpMode(fb.leaf, fb.mode))
        if self.app.metrics:
            self.app.metrics.arp_fallbacks.labels(fb.leaf).inc()
