"""Loopback port blocks for tests that bind fixed ports (the transports' tests): a block is held for
the life of the test process by an flock, so two test processes on one machine (two xdist workers,
another checkout's suite run beside this one) never bind the same ports. A block chosen from the
process id alone collided once in about forty pairs of processes ("Address already in use")."""
from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

_held: list[int] = []          # the lock files' descriptors: closed (released) when the process ends


def port_block(first: int, size: int, blocks: int, folder: Path | None = None) -> int:
    """The first port of a block of ``size`` ports (``first + k * size``, k below ``blocks``) that no
    other live process of this machine holds; tried from the one the process id names. ``folder``:
    where the lock files are (one machine-wide folder unless a test of this module gives its own)."""
    folder = folder or Path(tempfile.gettempdir()) / "hpnlab-test-ports"
    folder.mkdir(mode=0o1777, exist_ok=True)
    start = os.getpid() % blocks
    for i in range(blocks):
        base = first + ((start + i) % blocks) * size
        fd = os.open(folder / str(base), os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _held.append(fd)
        return base
    raise RuntimeError(f"every one of the {blocks} port blocks from {first} is held by another test process")
