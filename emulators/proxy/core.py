"""FaultProxy: a seeded, Toxiproxy-style TCP fault proxy on the caller's asyncio loop.

Each accepted client connection gets its own upstream connection; bytes are pumped both ways
through the toxics of each direction (see emulators/proxy/toxics.py for what each toxic does).
Per direction one task reads the source and stamps every chunk with its release time, and one
task writes the items out in order at those times, so reading never waits on a delay.

Determinism: connections are numbered from 0 in accept order. Whether a toxic applies to a
connection (its toxicity) and the toxic's random draws (latency jitter, slicer sizes) come from
random.Random keyed by (seed, connection number, toxic name[, stream]), so the same seed and the
same sequence of connections give the same faults, however the connections interleave. A
connection drawn at u applies a toxic iff u < toxicity, so raising the toxicity only adds
connections. Toxics added while connections are open apply to them from then on (as in Toxiproxy).

"Down" (set_enabled(False)) closes the listening socket, so new connections are refused
(ECONNREFUSED), and closes every open connection on both sides with a FIN, as Toxiproxy does.
Enabling it again listens on the same address. All methods must be called on the loop's thread.
A client or upstream error never escapes into the loop: that connection is closed on both sides
(with an RST to the other side if one side was reset, so resets propagate like on a wire).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import socket
import struct
from collections import deque
from typing import Any

from emulators.proxy.toxics import (
    CLOSE,
    DATA,
    EOF,
    STREAMS,
    ConflictError,
    Item,
    NotFoundError,
    Toxic,
    ToxicState,
    apply,
    make_toxic,
)

READ_SIZE = 64 * 1024
MAX_QUEUED = 1024 * 1024  # bytes waiting for their release time per direction before reading pauses
CONNECT_TIMEOUT = 10.0
HISTORY = 256  # closed connections kept for connections()


def parse_hostport(text: Any, what: str) -> tuple[str, int]:
    """'host:port' (or '[v6]:port') -> (host, port); ValueError on anything else."""
    if not isinstance(text, str) or ":" not in text:
        raise ValueError(f"{what} must be 'host:port', got {text!r}")
    host, _, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} port must be 0-65535, got {text!r}")
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"{what} needs a host, got {text!r}")
    return host, int(port)


def check_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"listen address must be loopback (127.0.0.0/8, ::1 or localhost), got {host!r}")


def _format(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class FaultProxy:
    def __init__(
        self,
        name: str,
        upstream: tuple[str, int],
        *,
        seed: int,
        listen: tuple[str, int] = ("127.0.0.1", 0),
    ):
        if not isinstance(name, str) or not name or "/" in name or not name.isprintable():
            raise ValueError(f"proxy name must be a non-empty printable string without '/', got {name!r}")
        check_loopback(listen[0])
        self.name = name
        self.upstream = (str(upstream[0]), int(upstream[1]))
        self.seed = seed
        self.listen = (listen[0], int(listen[1]))
        self.enabled = True
        self._toxics: dict[str, Toxic] = {}  # insertion order = chain order
        self._server: asyncio.Server | None = None
        self._conns: dict[int, _Connection] = {}
        self._history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._next_id = 0
        self._started = False
        self._closed = False

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> str:
        """Listen (if enabled) and return the listen address 'host:port'."""
        if self._closed:
            raise RuntimeError(f"proxy {self.name!r} is closed")
        self._started = True
        if self.enabled and self._server is None:
            await self._listen()
        return self.address

    async def close(self) -> None:
        self._closed = True
        self._stop_listening()
        for conn in list(self._conns.values()):
            conn.close()
        await asyncio.sleep(0)  # let the connection tasks see their cancellation

    @property
    def address(self) -> str:
        return _format(*self.listen)

    async def _listen(self) -> None:
        sock = self._bind()
        self._server = await asyncio.start_server(self._handle, sock=sock, limit=READ_SIZE)

    def _bind(self) -> socket.socket:
        host, port = self.listen
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.listen = (host, sock.getsockname()[1])  # a port 0 is kept from now on
        return sock

    def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    # --- control ---------------------------------------------------------------------------------

    def set_enabled(self, enabled: bool) -> None:
        """Down (False): refuse new connections, close open ones. Up (True): listen again."""
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be true or false, got {enabled!r}")
        if enabled == self.enabled:
            return
        self.enabled = enabled
        if not enabled:
            self._stop_listening()
            for conn in list(self._conns.values()):
                conn.close()
        elif self._started and not self._closed:
            sock = self._bind()  # synchronously: the port is held again before we return
            self._serve_soon(sock)

    def _serve_soon(self, sock: socket.socket) -> None:
        """Serve an already listening socket; connections queue in its backlog meanwhile."""
        coro = asyncio.start_server(self._handle, sock=sock, limit=READ_SIZE)
        asyncio.get_running_loop().create_task(coro).add_done_callback(self._served)

    def _served(self, task: asyncio.Task[asyncio.Server]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        server = task.result()
        if self.enabled and not self._closed and self._server is None:
            self._server = server
        else:  # disabled again before the server came up
            server.close()

    def set_upstream(self, upstream: tuple[str, int]) -> None:
        """New connections go to `upstream`; open ones keep theirs."""
        self.upstream = (str(upstream[0]), int(upstream[1]))

    def set_listen(self, listen: tuple[str, int]) -> None:
        """Move the listener (open connections stay); a port 0 picks a fresh ephemeral port."""
        check_loopback(listen[0])
        old = self.listen
        self.listen = (listen[0], int(listen[1]))
        if self.enabled and self._started and not self._closed:
            try:
                sock = self._bind()
            except OSError:
                self.listen = old
                raise
            self._stop_listening()
            self._serve_soon(sock)

    def add_toxic(
        self, name: str, type: str, stream: str = "downstream", toxicity: float = 1.0, **attributes: Any
    ) -> dict[str, Any]:
        return self.add_toxic_from(name, type, stream, toxicity, attributes)

    def add_toxic_from(
        self, name: Any, type: Any, stream: Any, toxicity: Any, attributes: dict[str, Any]
    ) -> dict[str, Any]:
        """add_toxic with the attributes as a dict, for JSON callers (HTTP API, twin control): an attribute
        named like a parameter ("name", "type", ...) is then a clear "no attribute" error, not a TypeError.
        """
        toxic = make_toxic(name, type, stream, toxicity, attributes)
        if toxic.name in self._toxics:
            raise ConflictError(f"toxic {toxic.name!r} already exists on proxy {self.name!r}")
        self._toxics[toxic.name] = toxic
        for conn in self._conns.values():
            conn.activate(toxic)
        return toxic.to_json()

    def update_toxic(self, name: str, toxicity: float | None = None, **attributes: Any) -> dict[str, Any]:
        """Change a toxic's toxicity and/or some attributes (Toxiproxy's toxic update)."""
        return self.update_toxic_from(name, toxicity, attributes)

    def update_toxic_from(self, name: str, toxicity: Any, attributes: dict[str, Any]) -> dict[str, Any]:
        """update_toxic with the attributes as a dict (see add_toxic_from)."""
        old = self.toxic(name)
        merged = {**old.attributes, **attributes}
        toxic = make_toxic(old.name, old.type, old.stream, old.toxicity if toxicity is None else toxicity, merged)
        self._toxics[name] = toxic  # same key: keeps its place in the chain
        for conn in self._conns.values():
            conn.deactivate(name)
            conn.activate(toxic)
        return toxic.to_json()

    def remove_toxic(self, name: str) -> None:
        self.toxic(name)
        del self._toxics[name]
        for conn in self._conns.values():
            conn.deactivate(name)

    def toxic(self, name: str) -> Toxic:
        try:
            return self._toxics[name]
        except KeyError:
            raise NotFoundError(f"toxic {name!r} not found on proxy {self.name!r}") from None

    def toxics(self) -> list[dict[str, Any]]:
        return [t.to_json() for t in self._toxics.values()]

    def reset(self) -> None:
        """Remove every toxic and bring the proxy up (Toxiproxy's POST /reset)."""
        for name in list(self._toxics):
            self.remove_toxic(name)
        self.set_enabled(True)

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.address,
            "upstream": _format(*self.upstream),
            "enabled": self.enabled,
            "toxics": self.toxics(),
            "seed": self.seed,
            "connections": len(self._conns),
        }

    def connections(self) -> list[dict[str, Any]]:
        """Recent connections (closed ones first, then open), with the toxics applied to each and
        the latency each latency toxic drew per chunk, for tests that check repeatability.
        """
        return [*self._history, *(c.describe() for c in self._conns.values())]

    # --- per-connection plumbing -----------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.enabled or self._closed:  # accepted just before going down
            writer.transport.abort()
            return
        cid = self._next_id
        self._next_id += 1
        conn = _Connection(self, cid, reader, writer)
        self._conns[cid] = conn
        for toxic in self._toxics.values():
            conn.activate(toxic)
        await conn.run()

    def _finished(self, conn: _Connection) -> None:
        if self._conns.pop(conn.cid, None) is not None:
            self._history.append(conn.describe())

    def _draw(self, cid: int, toxic: Toxic) -> ToxicState:
        u = random.Random(f"{self.seed}/{cid}/{toxic.name}/toxicity").random()
        rng = random.Random(f"{self.seed}/{cid}/{toxic.name}/{toxic.stream}")
        return ToxicState(rng=rng, applies=u < toxic.toxicity)


def _set_rst(transport: asyncio.BaseTransport | None) -> None:
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _Connection:
    def __init__(self, proxy: FaultProxy, cid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.proxy = proxy
        self.cid = cid
        self.loop = asyncio.get_running_loop()
        self.client_reader = reader
        self.client_writer = writer
        self.server_reader: asyncio.StreamReader | None = None
        self.server_writer: asyncio.StreamWriter | None = None
        self.states: dict[str, ToxicState] = {}
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.queues: dict[str, deque[Item]] = {s: deque() for s in STREAMS}
        self.queued: dict[str, int] = dict.fromkeys(STREAMS, 0)
        self.wake: dict[str, asyncio.Event] = {s: asyncio.Event() for s in STREAMS}
        self.space: dict[str, asyncio.Event] = {s: asyncio.Event() for s in STREAMS}
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False
        self.how = "open"

    # toxics

    def activate(self, toxic: Toxic) -> None:
        state = self.proxy._draw(self.cid, toxic)
        self.states[toxic.name] = state
        if state.applies and toxic.type == "timeout" and toxic.attributes["timeout"] > 0:
            self.timers[toxic.name] = self.loop.call_later(toxic.attributes["timeout"] / 1000, self.close)

    def deactivate(self, name: str) -> None:
        self.states.pop(name, None)
        timer = self.timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def describe(self) -> dict[str, Any]:
        applied = [name for name, s in self.states.items() if s.applies]
        delays = {n: list(s.record) for n, s in self.states.items() if s.record}
        return {"id": self.cid, "toxics": applied, "latency_ms": delays, "state": self.how}

    # pumping

    async def run(self) -> None:
        try:
            host, port = self.proxy.upstream
            try:
                server_reader, server_writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, limit=READ_SIZE), CONNECT_TIMEOUT
                )
                self.server_reader, self.server_writer = server_reader, server_writer
            except (TimeoutError, OSError):
                self.close()  # upstream unreachable: the client sees its connection closed
                return
            if self.closed:  # went down while we were connecting
                server_writer.close()
                return
            self.tasks = [
                self.loop.create_task(self._read("upstream", self.client_reader)),
                self.loop.create_task(self._read("downstream", server_reader)),
            ]
            writers = [
                self.loop.create_task(self._write("upstream", server_writer)),
                self.loop.create_task(self._write("downstream", self.client_writer)),
            ]
            self.tasks += writers
            await asyncio.wait(writers)  # both directions delivered their end, or close() cancelled them
            if self.how == "open":
                self.how = "finished"
        except asyncio.CancelledError:
            pass
        finally:
            self.close()
            self.proxy._finished(self)

    def _chain(self, stream: str) -> list[tuple[Toxic, ToxicState]]:
        out = []
        for toxic in self.proxy._toxics.values():
            state = self.states.get(toxic.name)
            if toxic.stream == stream and state is not None and state.applies:
                out.append((toxic, state))
        return out

    async def _read(self, stream: str, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                data = await reader.read(READ_SIZE)
                now = self.loop.time()
                items = [Item(DATA, now, data) if data else Item(EOF, now)]
                for toxic, state in self._chain(stream):
                    items, reset_at = apply(toxic, state, items, now)
                    if reset_at is not None:
                        self.timers[toxic.name] = self.loop.call_at(reset_at, self.close, True)
                for item in items:
                    self.queues[stream].append(item)
                    self.queued[stream] += len(item.data)
                self.wake[stream].set()
                if not data:
                    return
                while self.queued[stream] > MAX_QUEUED:
                    self.space[stream].clear()
                    await self.space[stream].wait()
        except asyncio.CancelledError:
            raise
        except ConnectionResetError:
            self.close(rst=True)  # pass the reset on to the other side
        except Exception:
            self.close()

    async def _write(self, stream: str, writer: asyncio.StreamWriter) -> None:
        queue = self.queues[stream]
        try:
            while True:
                while not queue:
                    self.wake[stream].clear()
                    await self.wake[stream].wait()
                item = queue[0]
                delay = item.at - self.loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                queue.popleft()
                self.queued[stream] -= len(item.data)
                if item.kind == DATA:
                    writer.write(item.data)
                    await writer.drain()
                    self.space[stream].set()
                elif item.kind == EOF:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                elif item.kind == CLOSE:
                    self.how = "closed by toxic"
                    self.close()
                    return
        except asyncio.CancelledError:
            raise
        except ConnectionResetError:
            self.close(rst=True)
        except Exception:
            self.close()

    def close(self, rst: bool = False) -> None:
        """Close both sides: FIN after flushing what was already written, or RST at once."""
        if self.closed:
            return
        self.closed = True
        if self.how == "open":
            self.how = "reset" if rst else "closed"
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        for writer in (self.client_writer, self.server_writer):
            if writer is None:
                continue
            if rst:
                _set_rst(writer.transport)
                writer.transport.abort()
            else:
                writer.transport.close()
