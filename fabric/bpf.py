"""The bpf(2) system call, just what pinned maps need (standard library: ctypes), for the emulation's
data path (the ECN stage, priority flow control) and for the transports, which read the pause state
priority flow control keeps for the hosts' NICs (an mmapped array, :class:`MappedArray`)."""
from __future__ import annotations

import ctypes
import mmap
import os
import platform
import struct
from pathlib import Path

__all__ = ["BpfMap", "MappedArray", "obj_get"]

_NR_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "ppc64le": 361, "s390x": 351, "riscv64": 280}
_BPF_MAP_LOOKUP_ELEM, _BPF_MAP_UPDATE_ELEM, _BPF_OBJ_GET = 1, 2, 7
_libc = ctypes.CDLL(None, use_errno=True)


def _bpf(cmd: int, attr: bytes) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(f"bpf syscall number unknown on {platform.machine()}")
    buf = ctypes.create_string_buffer(attr.ljust(128, b"\0"), 128)
    ret = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(128))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def obj_get(path: str | Path) -> int:
    """A file descriptor of the BPF object pinned at ``path`` (bpffs)."""
    cpath = ctypes.create_string_buffer(str(path).encode())
    return _bpf(_BPF_OBJ_GET, struct.pack("<QII", ctypes.addressof(cpath), 0, 0))


_U32_KEY = struct.Struct("<I")


class BpfMap:
    """A pinned BPF map (hash or array), opened by path; keys u32 unless ``key`` says otherwise."""

    def __init__(self, path: Path, value: struct.Struct, key: struct.Struct = _U32_KEY):
        self.path = Path(path)
        self.value = value
        self.key = key
        self.fd = obj_get(self.path)

    def _elem(self, cmd: int, key: int, value_buf, flags: int = 0) -> int:
        k = ctypes.create_string_buffer(self.key.pack(key), self.key.size)
        attr = struct.pack("<IIQQQ", self.fd, 0, ctypes.addressof(k), ctypes.addressof(value_buf), flags)
        return _bpf(cmd, attr)

    def lookup(self, key: int) -> tuple | None:
        buf = ctypes.create_string_buffer(self.value.size)
        try:
            self._elem(_BPF_MAP_LOOKUP_ELEM, key, buf)
        except OSError as exc:
            if exc.errno == 2:  # ENOENT
                return None
            raise
        return self.value.unpack(buf.raw)

    def update(self, key: int, values: tuple) -> None:
        buf = ctypes.create_string_buffer(self.value.pack(*values), self.value.size)
        self._elem(_BPF_MAP_UPDATE_ELEM, key, buf)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class MappedArray:
    """A pinned BPF array map created ``BPF_F_MMAPABLE``, mapped read-only: an element is a memory read
    (no system call), as a NIC reads its pause state. Elements of ``value_size`` bytes, each at a
    multiple of 8 (the kernel's layout)."""

    def __init__(self, path: str | Path, entries: int, value_size: int = 4):
        self.stride = (value_size + 7) // 8 * 8
        fd = obj_get(path)
        try:
            size = (entries * self.stride + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
            self.mem = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)

    def u32(self, index: int) -> int:
        return int.from_bytes(self.mem[index * self.stride:index * self.stride + 4], "little")

    def close(self) -> None:
        self.mem.close()
