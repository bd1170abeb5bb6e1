"""The userspace datapath's send socket (fabric/emulation/datapath_socket.py): its size and how it is found."""
from __future__ import annotations

import os

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


def test_a_ports_receive_buffer_holds_the_stall_allowance_at_its_rate_in_truesize():
    frame = 4096 + 14
    at_20 = ds.receive_buffer_bytes(20, 4096)
    assert at_20 == 2 * frame * -(-20e6 / 8 * ds.RX_STALL_S // frame)
    assert at_20 > 212_992                                   # the default that dropped packets unseen
    assert ds.receive_buffer_bytes(0.1, 4096) == 2 * 64 * frame      # a slow port: still 64 frames
    assert ds.receive_buffer_bytes(100_000, 4096) == ds.RX_MAX        # a fast one: bounded


def test_a_ports_receive_socket_is_the_owners_packet_socket_bound_to_that_interface():
    owner = {"11530": 73, "18197623": 218}
    assert ds.receive_sockets(PACKET_TABLE, owner, {1252: "p0l0-eth1"}) == {218: ("18197623", "p0l0-eth1")}
    assert ds.receive_sockets(PACKET_TABLE, owner, {1253: "p0l0-eth2"}) == {}       # another interface
    assert ds.receive_sockets(PACKET_TABLE, {"11530": 73}, {1252: "p0l0-eth1"}) == {}  # another process's


class FakeSocket:
    """A socket as ``raise_sockets`` reaches it: its size, and what happened to it in order."""

    def __init__(self, size: int, events: list):
        self.size, self.events = size, events

    def getsockopt(self, level, option):
        return self.size

    def setsockopt(self, level, option, value):
        self.events.append(("set", value) if option == ds.SO_SNDBUFFORCE else ("set", option, value))
        self.size = 2 * value                                # the kernel doubles what it is given


def test_a_receive_buffer_is_raised_with_the_receive_option():
    events: list = []
    out = ds.raise_sockets(42, {7: "111"}, 1_000_000, with_socket=lambda pid, fd, use: use(FakeSocket(212_992, events)),
                           direction="receive")
    assert events == [("set", ds.SO_RCVBUFFORCE, 500_000)] and out == [(42, 7, 212_992, 1_000_000)]


def test_each_socket_is_recorded_before_its_buffer_is_raised():
    events: list = []
    socks = {7: FakeSocket(212_992, events), 9: FakeSocket(212_992, events)}
    record = lambda pid, fd, inode, size: events.append(("record", fd, inode, size))  # noqa: E731
    out = ds.raise_sockets(42, {7: "111", 9: "222"}, 4_000_000, record,
                           with_socket=lambda pid, fd, use: use(socks[fd]))
    assert events == [("record", 7, "111", 212_992), ("set", 2_000_000), ("record", 9, "222", 212_992),
                      ("set", 2_000_000)]
    assert out == [(42, 7, 212_992, 4_000_000), (42, 9, 212_992, 4_000_000)]


def test_a_socket_already_large_enough_is_neither_recorded_nor_changed():
    events: list = []
    out = ds.raise_sockets(42, {7: "111"}, 100_000, lambda *a: events.append(a),
                           with_socket=lambda pid, fd, use: use(FakeSocket(212_992, events)))
    assert events == [] and out == [(42, 7, 212_992, 212_992)]


RECORDED = {"pid": 42, "start": 1000, "fd": 7, "inode": "111", "size": 212_992}


def test_a_recorded_socket_is_the_same_only_in_the_same_process_on_the_same_inode():
    assert ds.same_socket(RECORDED, 1000, "socket:[111]")
    assert not ds.same_socket(RECORDED, 2000, "socket:[111]")        # ovs-vswitchd restarted on the pid
    assert not ds.same_socket(RECORDED, 1000, "socket:[333]")        # the descriptor now another socket
    assert not ds.same_socket(RECORDED, None, None)                   # the process is gone


def test_clean_restores_only_the_sockets_their_process_still_holds():
    from hpnlab.fabric.emulation.cleanup import restore_send_buffers
    other = {**RECORDED, "fd": 8, "inode": "222"}
    links = {(42, 7): "socket:[111]", (42, 8): "socket:[999]"}
    restored: list[tuple[int, int, int]] = []
    said: list[str] = []
    n = restore_send_buffers([RECORDED, other], said.append, start_of=lambda pid: 1000,
                             link_of=lambda pid, fd: links.get((pid, fd)),
                             restore=lambda pid, fd, size: restored.append((pid, fd, size)))
    assert n == 1 and restored == [(42, 7, 212_992)]
    assert len(said) == 1 and "fd 8" in said[0]


def test_the_state_file_keeps_a_raised_send_buffer_and_old_files_still_load(tmp_path, monkeypatch):
    import json

    from hpnlab.fabric.emulation import state
    monkeypatch.setattr(state, "RUN_DIR", tmp_path)
    run = state.RunState.new("mini-hpn")
    run.add_send_buffer(os.getpid(), 7, "111", 212_992)
    (entry,) = state.RunState.load(run.path).send_buffers
    assert entry == {"pid": os.getpid(), "start": state.pid_start(os.getpid()), "fd": 7, "inode": "111",
                     "size": 212_992}
    old = json.loads(run.path.read_text())
    del old["send_buffers"]                                  # written before the field existed
    run.path.write_text(json.dumps(old))
    assert state.RunState.load(run.path).send_buffers == []
