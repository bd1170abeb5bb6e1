"""ARP requests as the table interpreter takes them (fabric/routing/oftable.py), for the tests of the leaves'
responder flows (tests/unit/test_arp_responder.py, test_arp_fallback.py)."""
from __future__ import annotations

from hpnlab.fabric.routing import compiler
from hpnlab.fabric.scenario import graph


def arp_request(asker: dict, target_ip: str, sender_ip: str | None = None) -> dict:
    return {"eth_type": compiler.ETH_ARP, "eth_src": asker["mac"], "eth_dst": "ff:ff:ff:ff:ff:ff",
            "arp_op": compiler.ARP_REQUEST, "arp_sha": asker["mac"], "arp_spa": sender_ip or asker["ip"],
            "arp_tha": "00:00:00:00:00:00", "arp_tpa": target_ip}


def plane_ports(g, plane: int) -> list[tuple[str, dict]]:
    return [(h, p) for h in graph.hosts(g) for p in graph.host_ports(g, h) if p["plane"] == plane]
