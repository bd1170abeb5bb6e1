"""The per-leaf ARP fallback, pure: which leaf falls back to per-host ARP responders, and when.

Gateway-MAC ARP (``--arp gateway``, compiler.arp_responders) needs two things of a leaf: the move
action of its responders (Open vSwitch's NXM move, an experimenter action many OpenFlow 1.3
switches lack) and set-field on the ARP and Ethernet fields. A real switch that lacks one rejects the
flow-mod with an OpenFlow error: type ``OFPET_BAD_ACTION``, code ``OFPBAC_BAD_TYPE`` (an action it
does not know), ``OFPBAC_BAD_EXPERIMENTER`` / ``OFPBAC_BAD_EXP_TYPE`` (an experimenter action it does
not know: the move) or ``OFPBAC_BAD_SET_TYPE`` / ``_LEN`` / ``_ARGUMENT`` (a set-field it cannot do).
When such an error answers one of the gateway design's own flows -- a responder (table 0, the move or
the gateway MAC) or a last-hop route (a leaf's /32 to its host, which writes the gateway MAC as the
source) -- that leaf alone falls back to per-host responders (set-field only, each peer's own MAC);
every other leaf keeps the gateway design (the last hops are the same in both modes, so the two mix).

A switch that cannot set Ethernet addresses at all still rejects the last hop after the fallback (it
is the same flow in both modes); ``decide`` then answers None (the leaf is per-host already) and the
error is the reconciler's usual resynchronisation, counted as an OpenFlow error.

``decide`` takes plain values: the switch, whether it is a leaf, the mode it answers ARP in now, the
flow-mod the error answers (table, priority, actions; None when the app cannot tell which), and the
error's type and code. ``controller/app.py`` only plumbs: it remembers which flow-mod went out under
which xid, asks ``decide`` on every error and hands the answer to the reconciler (``reconcile.ArpMode``).
"""
from __future__ import annotations

from dataclasses import dataclass

from hpnlab.fabric.routing import compiler

OFPET_BAD_ACTION = 2
OFPBAC_BAD_TYPE = 0
OFPBAC_BAD_EXPERIMENTER = 3
OFPBAC_BAD_EXP_TYPE = 4
OFPBAC_BAD_SET_TYPE = 13
OFPBAC_BAD_SET_LEN = 14
OFPBAC_BAD_SET_ARGUMENT = 15
#: (type, code) of the errors that say "this switch cannot do that action"
REJECTED = frozenset((OFPET_BAD_ACTION, code) for code in (
    OFPBAC_BAD_TYPE, OFPBAC_BAD_EXPERIMENTER, OFPBAC_BAD_EXP_TYPE, OFPBAC_BAD_SET_TYPE, OFPBAC_BAD_SET_LEN,
    OFPBAC_BAD_SET_ARGUMENT))
CODE_NAMES = {OFPBAC_BAD_TYPE: "BAD_TYPE", OFPBAC_BAD_EXPERIMENTER: "BAD_EXPERIMENTER",
              OFPBAC_BAD_EXP_TYPE: "BAD_EXP_TYPE", OFPBAC_BAD_SET_TYPE: "BAD_SET_TYPE",
              OFPBAC_BAD_SET_LEN: "BAD_SET_LEN", OFPBAC_BAD_SET_ARGUMENT: "BAD_SET_ARGUMENT"}
FALLBACK_MODE = "per-host"


@dataclass(frozen=True)
class Fallback:
    """``leaf`` answers ARP in ``mode`` from now on, because the switch rejected a ``kind`` flow
    ("responder" or "last-hop") with error ``code`` of type OFPET_BAD_ACTION."""
    leaf: str
    mode: str
    kind: str
    code: int

    def line(self) -> str:
        return (f"{self.leaf} rejected a gateway-MAC ARP {self.kind} flow (OFPET_BAD_ACTION/"
                f"OFPBAC_{CODE_NAMES.get(self.code, self.code)}): this leaf falls back to {self.mode} ARP "
                f"responders; the other leaves keep the gateway design")


def gateway_flow(table: int, priority: int, actions: tuple) -> str | None:
    """"responder" for a gateway-mode ARP responder, "last-hop" for a leaf's route that writes the
    gateway MAC as the source on the way to its host, None for any other flow."""
    if table == compiler.TABLE_CLASSIFY and priority == compiler.PRIO_ARP_RESPONDER and (
            any(a[0] == "move" for a in actions) or ("set_field", "arp_sha", compiler.GATEWAY_MAC) in actions):
        return "responder"
    if table == compiler.TABLE_ROUTE and ("set_field", "eth_src", compiler.GATEWAY_MAC) in actions:
        return "last-hop"
    return None


def decide(switch: str, is_leaf: bool, mode: str, flow: tuple[int, int, tuple] | None, err_type: int,
           err_code: int) -> Fallback | None:
    """What an OpenFlow error from ``switch`` changes about how it answers ARP: a Fallback when a leaf in
    gateway mode rejected one of the gateway design's flows (``flow`` = (table, priority, actions) of the
    flow-mod the error answers) with an error of ``REJECTED``; None otherwise (the error is only resynced)."""
    if not is_leaf or mode != "gateway" or flow is None or (err_type, err_code) not in REJECTED:
        return None
    kind = gateway_flow(*flow)
    if kind is None:
        return None
    return Fallback(switch, FALLBACK_MODE, kind, err_code)
