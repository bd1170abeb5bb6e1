"""The sockets of the simulated switches (a thin shell): every switch of a ``Fabric`` connects to the controller
over TCP as a switch does, in one asyncio loop; a control socket (a Unix socket, one command a line) injects
failures and reads counters or dumps.

Control commands (one line each, one line back): ``link down A B``, ``link up A B``, ``switch down S``,
``switch up S`` ("ok"), ``stats`` (JSON: per switch counters and table sizes, and the process's CPU seconds
and peak RSS), ``dump DIR`` (every switch's tables written to DIR, see ``dump``; "ok N"), ``quit``.
"""
from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path

from hpnlab.fabric.errors import UserError

from . import dump, endpoint, wire

RECONNECT_S = 1.0
HIGH_WATER = 4 << 20          # bytes queued towards the controller before a switch stops reading (bounded memory)


class Connection:
    """One switch's connection to the controller: connect, say hello, answer every message in order;
    reconnect after ``RECONNECT_S`` when the controller drops it, unless the switch is down."""

    def __init__(self, server: Server, sw: endpoint.Switch):
        self.server = server
        self.sw = sw
        self.writer: asyncio.StreamWriter | None = None
        self.allowed = asyncio.Event()
        self.allowed.set()
        self.task: asyncio.Task | None = None

    def send(self, msg: bytes) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(msg)

    def drop(self) -> None:
        self.allowed.clear()
        if self.writer is not None:
            self.writer.close()

    async def run(self) -> None:
        host, port = self.server.controller
        while True:
            await self.allowed.wait()
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(RECONNECT_S)
                continue
            self.writer = writer
            try:
                writer.write(wire.hello())
                await self._serve(reader, writer)
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                self.writer = None
                writer.close()
            if self.allowed.is_set():
                await asyncio.sleep(RECONNECT_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        fabric, sw = self.server.fabric, self.sw
        while self.allowed.is_set():
            head = await reader.readexactly(wire.HEADER)
            length = int.from_bytes(head[2:4], "big")
            msg = head + (await reader.readexactly(length - wire.HEADER) if length > wire.HEADER else b"")
            try:
                replies = sw.receive(msg)
            except Exception as exc:      # a message the simulation cannot parse: answered as a bad request
                self.server.log(f"{sw.name}: cannot handle message type {head[1]}: {type(exc).__name__}: {exc}")
                replies = [wire.error(int.from_bytes(head[4:8], "big"), "bad_type", msg)]
            for r in replies:
                writer.write(r)
            if sw.frames_out:
                for name, pin in fabric.deliver(sw.name):
                    self.server.connections[name].send(pin)
            transport = writer.transport
            if transport.get_write_buffer_size() > HIGH_WATER:
                await writer.drain()


class Server:
    def __init__(self, fabric: endpoint.Fabric, controller: tuple[str, int], run_dir: Path,
                 log: Callable[[str], None] = print):
        self.fabric = fabric
        self.controller = controller
        self.run_dir = Path(run_dir)
        self.log = log
        self.connections: dict[str, Connection] = {}
        self.stopping: asyncio.Event | None = None

    @property
    def control_path(self) -> Path:
        return self.run_dir / "control.sock"

    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := (await reader.readline()).decode(errors="replace"):
                writer.write((self.answer(line) + "\n").encode())
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            writer.close()

    def answer(self, line: str) -> str:
        """One control command's answer (one line)."""
        words = line.split()
        try:
            if not words:
                return "ok"
            if words[0] == "stats":
                use = resource.getrusage(resource.RUSAGE_SELF)
                return json.dumps({"time": time.time(), "cpu_s": use.ru_utime + use.ru_stime,
                                   "peak_rss_kib": use.ru_maxrss, "switches": self.fabric.stats()})
            if words[0] == "dump" and len(words) == 2:
                n = dump.write(Path(words[1]), self.fabric.states())
                return f"ok {n}"
            if words[0] == "quit":
                assert self.stopping is not None
                self.stopping.set()
                return "ok"
            msgs, connections = self.fabric.command(line)
            for name, up in connections.items():
                conn = self.connections[name]
                if up:
                    conn.allowed.set()
                else:
                    conn.drop()
            for name, msg in msgs:
                self.connections[name].send(msg)
            return "ok"
        except UserError as exc:
            return f"error: {exc}"
        except OSError as exc:
            return f"error: {exc.strerror or exc}"

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        self.stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        control = await asyncio.start_unix_server(self._control, path=str(self.control_path))
        for name, sw in self.fabric.switches.items():
            conn = self.connections[name] = Connection(self, sw)
            conn.task = asyncio.create_task(conn.run())
        if ready is not None:
            ready()
        try:
            await self.stopping.wait()
        finally:
            control.close()
            for conn in self.connections.values():
                conn.drop()
                if conn.task is not None:
                    conn.task.cancel()
            await asyncio.gather(*(c.task for c in self.connections.values() if c.task), return_exceptions=True)
            try:
                os.unlink(self.control_path)
            except OSError:
                pass


def send(control: Path, line: str, timeout_s: float = 120.0) -> str:
    """Send one command to a running instance's control socket; its one-line answer."""
    import socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(str(control))
        except OSError as exc:
            raise UserError(f"no simulated switches answer on {control} ({exc.strerror}): is "
                            f"'hpnlab switches' running with that --run-dir?") from None
        s.sendall(line.strip().encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
    return buf.decode().strip()
