"""Harness for the fault proxy tests: an event loop in a thread, an echo server on it, socket helpers.

The proxy runs on its own loop (precise_event_loop, as in the twin) in a daemon thread; the tests
talk to it with blocking sockets from the test thread, as a driver would. Control calls go through
`loop.call(fn, ...)`, which runs fn on the loop's thread and returns its result.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from emulators.endpoints import precise_event_loop
from emulators.proxy import FaultProxy


class LoopThread:
    def __init__(self) -> None:
        self.loop = precise_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def invoke() -> Any:
            return fn(*args, **kwargs)

        return self.run(invoke())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class EchoServer:
    """Echoes every chunk back; counts connections it accepted."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.accepted = 0
        self.address: tuple[str, int] = ("127.0.0.1", 0)

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.address = ("127.0.0.1", self.server.sockets[0].getsockname()[1])
        return self.address

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


class Proxies:
    """Makes FaultProxy objects in front of the echo server and closes them after the test."""

    def __init__(self, loop: LoopThread, echo: EchoServer):
        self.loop = loop
        self.echo = echo
        self.made: list[FaultProxy] = []

    def __call__(self, seed: int = 1, name: str = "p") -> FaultProxy:
        proxy = FaultProxy(name, self.echo.address, seed=seed)
        self.loop.run(proxy.start())
        self.made.append(proxy)
        return proxy

    def close(self) -> None:
        for proxy in self.made:
            self.loop.run(proxy.close())


def connect(proxy: FaultProxy, timeout: float = 5.0) -> socket.socket:
    host, port = proxy.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, f"connection closed after {len(buf)} of {n} bytes"
        buf += chunk
    return bytes(buf)


def recv_until_eof(sock: socket.socket) -> bytes:
    buf = bytearray()
    while chunk := sock.recv(65536):
        buf += chunk
    return bytes(buf)


def round_trip(sock: socket.socket, payload: bytes) -> float:
    """Send payload, read the echo back; returns the seconds it took."""
    t0 = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - t0
