"""Addressing plan designed for aggregation, and deterministic switch ids and MACs.

A host port's IPv4 address is built from fields, most significant first, inside 10.0.0.0/8
(when the fields below the plane fit in 16 bits, the plane takes the second octet, so
``10.1.x.y`` is plane 1, and the campus field absorbs the spare bits):

    10 . [plane][campus][pod][segment][leaf in segment][host port on leaf + 1]

Each field gets just enough bits for its count, so every prefix in the hierarchy is one
CIDR block:

* every leaf's host ports share one **leaf prefix** (what a spine routes on);
* every pod of a plane has a **pod prefix** (what a core routes on);
* every campus of a plane has a **campus prefix** (what a far campus routes on);
* every plane has a **plane prefix**: hosts put it on the interface of that plane, so the
  host's kernel picks the interface by destination and the planes never mix.

Host-port numbers on a leaf start at 1 so that no host address is a prefix's all-zeros.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Protocol

from hpnlab.fabric.errors import ScenarioError

BASE_NET = ipaddress.IPv4Network("10.0.0.0/8")

# Role codes in the top byte of a datapath id.
ROLE_CODE = {"leaf": 0x1, "edge": 0x1, "spine": 0x2, "agg": 0x2, "core": 0x3}


def _bits(count: int) -> int:
    """Bits needed to number `count` things (0 for one thing)."""
    return max(0, (count - 1).bit_length())


def ip_str(value: int) -> str:
    """Dotted-quad text of a 32-bit IPv4 address: ``ip_str(0x0A000005) == "10.0.0.5"``."""
    return socket.inet_ntoa(struct.pack("!I", value))


def ip_int(address: str) -> int:
    """The 32-bit value of a dotted-quad IPv4 address: ``ip_int("10.0.0.5") == 0x0A000005``.

    As strict as ``ipaddress.IPv4Address`` (four decimal parts, no leading zeros; anything
    else raises ValueError) and several times faster, for the compiler's per-port loops:
    ``inet_aton`` parses, and the address must read back the same.
    """
    try:
        value = int.from_bytes(socket.inet_aton(address), "big")
    except (OSError, TypeError):
        raise ValueError(f"not an IPv4 address: {address!r}") from None
    if ip_str(value) != address:
        raise ValueError(f"not an IPv4 address in dotted-quad form: {address!r}")
    return value


def prefix_int(cidr: str) -> tuple[int, int]:
    """(network as a 32-bit int, prefix length) of an IPv4 prefix: ``"10.1.0.0/16"`` -> ``(0x0A010000, 16)``.

    A bare address is a /32; host bits set below the length raise ValueError.
    """
    network = ipaddress.IPv4Network(cidr)
    return int(network.network_address), network.prefixlen


@dataclass(frozen=True)
class AddressPlan:
    planes: int
    campuses: int
    pods: int
    segments: int
    leaves_per_segment: int
    ports_per_leaf: int

    # bit widths, most significant first
    @property
    def widths(self) -> tuple[int, int, int, int, int, int]:
        rest = (_bits(self.campuses), _bits(self.pods), _bits(self.segments),
                _bits(self.leaves_per_segment), _bits(self.ports_per_leaf + 1))
        # Readable plans: when everything below the plane fits in 16 bits, the plane gets the
        # whole second octet (plane 1 is 10.1.0.0/16) and the rest is right-aligned below it.
        if sum(rest) <= 16 and self.planes <= 256:
            return (8, 16 - sum(rest) + rest[0], *rest[1:])
        return (_bits(self.planes), *rest)

    @property
    def total_bits(self) -> int:
        return sum(self.widths)

    def check(self) -> None:
        """Refuse (ScenarioError, a ValueError) a plan whose fields need more than the 24 bits of 10/8."""
        if self.total_bits > 32 - BASE_NET.prefixlen:
            names = ("plane", "campus", "pod", "segment", "leaf", "host port")
            split = " + ".join(f"{name} {width}" for name, width in zip(names, self.widths, strict=True) if width)
            raise ScenarioError("(addresses)", f"the address plan needs {self.total_bits} host bits ({split}), "
                                               f"{BASE_NET} has 24: fewer planes, pods, segments or hosts per leaf")

    def _pack(self, fields: tuple[int, ...]) -> int:
        """The first len(fields) fields packed most significant first (no bits below them)."""
        value = 0
        for width, field_value in zip(self.widths[: len(fields)], fields, strict=True):
            value = (value << width) | field_value
        return value

    def _prefix(self, fields: tuple[int, ...]) -> tuple[int, int]:
        """(network int, prefix length) for the first len(fields) fields."""
        used = sum(self.widths[: len(fields)])
        rest = self.total_bits - used
        net = int(BASE_NET.network_address) | (self._pack(fields) << rest)
        return net, 32 - rest

    def host_ip_int(self, plane: int, campus: int, pod: int, segment: int, leaf: int, port: int) -> int:
        return int(BASE_NET.network_address) | self._pack((plane, campus, pod, segment, leaf, port + 1))

    def host_ip(self, plane: int, campus: int, pod: int, segment: int, leaf: int, port: int) -> str:
        return ip_str(self.host_ip_int(plane, campus, pod, segment, leaf, port))

    def _cidr(self, fields: tuple[int, ...]) -> str:
        net, length = self._prefix(fields)
        return f"{ip_str(net)}/{length}"

    def leaf_prefix(self, plane: int, campus: int, pod: int, segment: int, leaf: int) -> str:
        return self._cidr((plane, campus, pod, segment, leaf))

    def pod_prefix(self, plane: int, campus: int, pod: int) -> str:
        return self._cidr((plane, campus, pod))

    def campus_prefix(self, plane: int, campus: int) -> str:
        return self._cidr((plane, campus))

    def plane_prefix(self, plane: int) -> str:
        net, length = self._prefix((plane,))
        # The plane prefix can never be shorter than /8 (one plane: the whole 10/8).
        return f"{ip_str(net)}/{max(length, BASE_NET.prefixlen)}"

    def describe(self) -> list[str]:
        names = ("plane", "campus", "pod", "segment", "leaf", "host port")
        counts = (self.planes, self.campuses, self.pods, self.segments, self.leaves_per_segment,
                  self.ports_per_leaf)
        lines = [f"addressing: {BASE_NET} split as "
                 + " | ".join(f"{name} {width}b" for name, width in zip(names, self.widths, strict=True))]
        for name, count, width in zip(names, counts, self.widths, strict=True):
            # host ports are numbered from 1 (no host address is a prefix's all-zeros)
            spare = width - _bits(count + 1 if name == "host port" else count)
            note = f"  ({spare} spare, kept zero)" if spare else ""
            lines.append(f"  {name:<10} {count:>7} x  {width:>2} bits{note}")
        return lines


class PlanFields(Protocol):
    """What a plan is made from: the fields of a validated scenario (``spec.Scenario``)."""
    @property
    def planes(self) -> int: ...
    @property
    def campuses(self) -> int: ...
    @property
    def pods(self) -> int: ...
    @property
    def segments_per_pod(self) -> int: ...
    @property
    def leaves_per_plane_per_segment(self) -> int: ...
    @property
    def leaf_down_ports(self) -> int: ...


def plan_for(scenario: PlanFields) -> AddressPlan:
    plan = AddressPlan(planes=scenario.planes, campuses=scenario.campuses, pods=scenario.pods,
                       segments=scenario.segments_per_pod,
                       leaves_per_segment=scenario.leaves_per_plane_per_segment,
                       ports_per_leaf=scenario.leaf_down_ports)
    plan.check()
    return plan


def dpid(role: str, plane: int, campus: int, index: int) -> int:
    """64-bit datapath id: role code (8 bits) | campus (8) | plane (8) | index (40), unique per switch.

    A field out of its range raises ValueError (never wraps into another switch's id);
    ``spec.check_limits`` refuses such scenarios before anything is built.
    """
    if not (0 <= campus <= 0xFF and 0 <= plane <= 0xFF and 0 <= index <= 0xFFFFFFFFFF):
        raise ValueError(f"datapath id fields out of range: campus {campus}, plane {plane}, index {index}")
    return (ROLE_CODE[role] << 56) | (campus << 48) | (plane << 40) | index


def dpid_str(value: int) -> str:
    return f"{value:016x}"


def host_mac(host_index: int, port_index: int) -> str:
    """Locally administered unicast MAC: 02:<port high byte>:<host index, 3 bytes>:<port low byte>.

    Up to 256 NIC ports per host the second byte is 00 (``02:00:00:00:05:01`` is port 1 of
    host 5); up to 65,536 ports and 2^24 hosts every MAC is distinct. Beyond raises ValueError
    (``spec.check_limits`` refuses such scenarios first).
    """
    if not (0 <= host_index <= 0xFFFFFF and 0 <= port_index <= 0xFFFF):
        raise ValueError(f"MAC fields out of range: host {host_index}, port {port_index}")
    return (f"02:{port_index >> 8:02x}:{host_index >> 16:02x}:{(host_index >> 8) & 0xFF:02x}:"
            f"{host_index & 0xFF:02x}:{port_index & 0xFF:02x}")
