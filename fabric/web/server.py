"""The web view's server: standard library only (``http.server`` + threads).

Endpoints:

- ``GET /``, ``/app.js``: the static page (``static/``: vanilla JavaScript, the picture is the SVG
  of :func:`view.svg`, recoloured by each frame);
- ``GET /layout.json``: the layout and the mode (``live`` or ``replay``);
- ``GET /fabric.svg``: the picture; ``GET /still.svg?t=S``: a still of the moment ``t`` (replay) or
  of now (live), the same picture the page shows;
- ``GET /events``: Server-Sent Events, one frame (JSON) per ``period_s`` (default 0.5 s);
- ``GET /frames.json``: every frame of a replay (the page's scrubber);
- ``GET /stats.json``: frames made and sent, and the CPU seconds the view's threads spent on them;
- ``POST /inject`` (live only): a fault as a timeline event (``{"action": "link_down", "link":
  ["p0l0", "p0s0"], "key": 0, "side": ...}`` or ``{"action": "switch_down", "switch": "p0s1"}``; or
  ``{"action": "repair", "link"|"switch": ...}``), validated by ``timeline.parse`` and applied by
  ``timeline.apply``, the functions the harness timeline uses; recorded like a timeline record
  (``source: "web"``). Accepted only from loopback unless ``allow_remote``.

The server binds 127.0.0.1 by default. Frames come from a *source*: :class:`ReplaySource` (frames
computed once) or ``live.LiveSource`` (a running emulation).
"""
from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from hpnlab.fabric.errors import UserError

from . import view

STATIC = Path(__file__).parent / "static"
DEFAULT_ADDR = "127.0.0.1"
DEFAULT_PORT = 8765
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8"}


def parse_addr(text: str | None, default_port: int = DEFAULT_PORT, flag: str = "--web") -> tuple[str, int]:
    """``ADDR:PORT``, ``:PORT``, ``PORT`` or ``ADDR`` (``--web``'s or ``--metrics``' value) -> (address, port);
    None or '' gives 127.0.0.1 and the default port."""
    if not text:
        return DEFAULT_ADDR, default_port
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = (text, str(default_port)) if not text.isdigit() else ("", text)
    host = host.strip("[]") or DEFAULT_ADDR
    try:
        ipaddress.ip_address(host)
        p = int(port)
        if not 0 <= p <= 65535:
            raise ValueError
    except ValueError:
        raise UserError(f"{flag}: expected ADDR:PORT like 127.0.0.1:{default_port}, got {text!r}") from None
    return host, p


def is_loopback(addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


class Source:
    """What the server shows: a layout, the latest frame, and (live) injections."""
    mode = "replay"

    def __init__(self, lay: Mapping[str, Any]):
        self.layout = dict(lay)
        self.ix = view.Index.of(lay) if not lay.get("aggregated") else None
        self._cond = threading.Condition()
        self._frame: dict[str, Any] | None = None
        self._seq = 0

    def publish(self, fr: dict[str, Any]) -> None:
        with self._cond:
            self._seq += 1
            self._frame = fr
            self._cond.notify_all()

    def wait(self, seq: int, timeout: float) -> tuple[int, dict[str, Any] | None]:
        """The frame after ``seq`` (or the current one after ``timeout``)."""
        with self._cond:
            self._cond.wait_for(lambda: self._seq > seq, timeout)
            return self._seq, self._frame

    def frames(self) -> list[dict[str, Any]]:
        return [self._frame] if self._frame else []

    def still(self, t: float | None) -> dict[str, Any] | None:
        return self._frame

    def inject(self, request: Mapping[str, Any]) -> list[dict[str, Any]]:
        raise UserError("this view replays a finished run: nothing to inject")


class ReplaySource(Source):
    """Frames of a finished run (``view.replay_frames``), served all at once to the scrubber."""

    def __init__(self, lay: Mapping[str, Any], frames: Sequence[dict[str, Any]]):
        super().__init__(lay)
        if not frames:
            raise UserError("nothing to replay: the results file has no telemetry, failures or model loads")
        self._frames = list(frames)
        self.publish(self._frames[-1])

    def frames(self) -> list[dict[str, Any]]:
        return self._frames

    def still(self, t: float | None) -> dict[str, Any] | None:
        return dict(view.frame_at(self._frames, t)) if t is not None else self._frames[-1]


class _Handler(BaseHTTPRequestHandler):
    server: WebServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, body: bytes, ctype: str, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: Any, status: int = 200) -> None:
        self._send(json.dumps(value, separators=(",", ":")).encode(), "application/json", status)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        src = self.server.source
        path = url.path
        if path in ("/", "/index.html"):
            path = "/index.html"
        if path in ("/index.html", "/app.js", "/style.css"):
            f = STATIC / path[1:]
            self._send(f.read_bytes(), CONTENT_TYPES[f.suffix])
        elif path == "/layout.json":
            self._json({"mode": src.mode, "inject": src.mode == "live" and self._may_inject(), "idle": view.IDLE,
                        "period_s": self.server.period_s, "layout": src.layout})
        elif path == "/fabric.svg":
            self._send(self.server.fabric_svg(), "image/svg+xml")
        elif path == "/still.svg":
            q = parse_qs(url.query)
            t = float(q["t"][0]) if "t" in q else None
            self._send(view.svg(src.layout, src.still(t)).encode(), "image/svg+xml")
        elif path == "/frames.json":
            self._json(src.frames())
        elif path == "/events":
            self._events()
        elif path == "/stats.json":
            self._json(self.server.stats())
        else:
            self._send(b"not found", "text/plain", HTTPStatus.NOT_FOUND)

    def _events(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        src = self.server.source
        seq = -1
        try:
            while not self.server.stopping.is_set():
                seq, fr = src.wait(seq, timeout=max(1.0, 2 * self.server.period_s))
                cpu = time.thread_time()
                if fr is None:
                    self.wfile.write(b": waiting\n\n")
                else:
                    self.wfile.write(b"data: " + json.dumps(fr, separators=(",", ":")).encode() + b"\n\n")
                self.wfile.flush()
                self.server.count_sent(time.thread_time() - cpu)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return

    def _may_inject(self) -> bool:
        return self.server.allow_remote or is_loopback(self.client_address[0])

    def do_POST(self) -> None:
        if urlparse(self.path).path != "/inject":
            self._send(b"not found", "text/plain", HTTPStatus.NOT_FOUND)
            return
        if not self._may_inject():
            self._json({"error": "injection is accepted from this machine only (start with --web-allow-remote)"},
                       HTTPStatus.FORBIDDEN)
            return
        try:
            n = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(n) or b"{}")
            if not isinstance(request, dict):
                raise UserError("expected a JSON object like {\"action\": \"link_down\", \"link\": [\"a\", \"b\"]}")
            records = self.server.source.inject(request)
        except (ValueError, UserError) as exc:
            self._json({"error": str(exc)}, HTTPStatus.BAD_REQUEST)
            return
        self._json({"applied": records})


class WebServer(ThreadingHTTPServer):
    """The view's HTTP server over one source; ``start()`` serves in a thread, ``stop()`` ends it."""
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, source: Source, addr: str = DEFAULT_ADDR, port: int = DEFAULT_PORT, *,
                 allow_remote: bool = False, period_s: float = 0.5):
        try:
            super().__init__((addr, port), _Handler)
        except OSError as exc:
            raise UserError(f"--web: cannot listen on {addr}:{port} ({exc.strerror}); "
                            "choose another ADDR:PORT") from None
        self.source = source
        self.allow_remote = allow_remote
        self.period_s = period_s
        self.stopping = threading.Event()
        self._svg: bytes | None = None
        self._thread: threading.Thread | None = None
        self._stats_lock = threading.Lock()
        self.sent = 0
        self.send_cpu_s = 0.0

    def count_sent(self, cpu_s: float) -> None:
        with self._stats_lock:
            self.sent += 1
            self.send_cpu_s += cpu_s

    def stats(self) -> dict[str, Any]:
        """Frames made and sent and the CPU seconds they took (the frame loop's and the streams' threads)."""
        src = self.source
        return {"frames_made": getattr(src, "frames_made", 0), "frame_cpu_s": round(getattr(src, "cpu_s", 0.0), 4),
                "frames_sent": self.sent, "send_cpu_s": round(self.send_cpu_s, 4), "monotonic": time.monotonic(),
                "error": getattr(src, "error", None)}

    def fabric_svg(self) -> bytes:
        if self._svg is None:
            self._svg = view.svg(self.source.layout).encode()
        return self._svg

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"

    def start(self) -> WebServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
                                        name="hpnlab-web")
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def serve_replay(lay: Mapping[str, Any], frames: Sequence[dict[str, Any]], addr: str, port: int,
                 say: Callable[[str], None] = print, block: bool = True) -> WebServer:
    """Serve a replay; with ``block``, until Ctrl-C."""
    srv = WebServer(ReplaySource(lay, frames), addr, port).start()
    say(f"web view: {srv.url} (replay of {len(frames)} frames, {frames[-1]['t']:g} s; Ctrl-C stops)")
    if block:
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            srv.stop()
    return srv
