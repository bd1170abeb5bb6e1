"""A file through which a running controller takes a request and answers it (pure plumbing).

The harness writes ``{"policy": NAME, "seq": N}`` to the file (``controller_process.request_policy``);
the controller, on its next tick, sees the file changed, applies the request and answers in
``<file>.ack`` with ``{"seq": N, "policy": NAME_IN_FORCE, "error": null | "why"}``. Used for the ECN
policy (``ecn_loop``) and the routing weights (``app``)."""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from hpnlab.fabric.errors import UserError

LOG = logging.getLogger("hpnlab.controller")


class ControlFile:
    def __init__(self, path: str | Path, what: str):
        self.path = Path(path)
        self.what = what                  # for the log line of a refused request
        self._seen: float | None = None   # the file's mtime last answered

    def poll(self, apply: Callable[[dict], None], in_force: Callable[[], str]) -> None:
        """If the file changed since the last answer: ``apply`` its request (raising to refuse it), then
        answer with the request's seq, ``in_force()`` and the refusal, if any."""
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            return
        if mtime == self._seen:
            return
        self._seen = mtime
        error, seq = None, None
        try:
            req = json.loads(self.path.read_text())
            seq = req.get("seq") if isinstance(req, dict) else None
            apply(req)
        except (UserError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            error = str(exc)
            LOG.error("%s change refused: %s", self.what, error)
        ack = self.path.with_name(self.path.name + ".ack")
        tmp = ack.with_name(ack.name + ".tmp")
        tmp.write_text(json.dumps({"seq": seq, "policy": in_force(), "error": error}))
        os.replace(tmp, ack)
