"""A file another process appends to, read in whole lines from where the last read ended (the
controller's telemetry file, JSON lines: the routing comparison's weight changes, the live view's
samples)."""
from __future__ import annotations

from pathlib import Path


class LineTail:
    """The whole lines ``path`` got since the last :meth:`lines` (none while it does not exist)."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self.offset = 0

    def lines(self) -> list[str]:
        """Lines written since the last call; a line still being written is read next time."""
        if self.path is None:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].decode(errors="replace").splitlines()
