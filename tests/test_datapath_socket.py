"""The userspace datapath's send socket (fabric/emulation/datapath_socket.py): its size and how it is found."""
from __future__ import annotations

from hpnlab.fabric.emulation import datapath_socket as ds
from hpnlab.fabric.emulation.shaping import Shape

PACKET_TABLE = """sk               RefCnt Type Proto  Iface R Rmem   User   Inode
00000000bc371862 2      3    0000   0     0 0      0      11530
000000000f2ca2e1 3      3    0003   1252  1 4928   0      18197623
00000000aaaaaaaa 2      3    0000   0     0 0      0      99999
"""


def test_the_send_buffer_holds_every_switch_ports_full_queue_in_truesize():
    queues = [Shape("p0l0-eth1", 33, mtu=4096).queue_bytes, Shape("p0l0-eth5", 66, mtu=4096).queue_bytes]
    assert ds.send_buffer_bytes(queues) == 2 * sum(queues)
    assert ds.send_buffer_bytes(queues) > 212_992            # the default that dropped packets unseen


def test_the_send_buffer_stays_below_what_the_kernel_accepts():
    assert ds.send_buffer_bytes([1 << 40]) == ds.MAX_BUFFER


def test_only_the_owners_unbound_packet_sockets_are_its_send_sockets():
    owner = {"11530": 73, "18197623": 218}                   # inode -> descriptor in ovs-vswitchd
    assert ds.send_sockets(PACKET_TABLE, owner) == [73]      # bound to an interface: a port's receive socket
    assert ds.send_sockets(PACKET_TABLE, {}) == []           # another process's socket is left alone
