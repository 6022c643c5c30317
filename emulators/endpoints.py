"""Serve a line-oriented protocol engine on real endpoints: a TCP port and a raw pseudo-terminal.

Each connection gets its own engine session (parser state, reply order) over the shared device state.
Replies carry the earliest time they may leave (see emulators/scpi/engine.py); a per-connection queue sends
them in order with loop.call_at, so a reply is never early and, on an idle machine, late by a fraction of a
millisecond (see precise_event_loop).
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import selectors
import termios
import tty
from collections import deque
from collections.abc import Callable
from typing import Protocol

from emulators.scpi.engine import Reply

MAX_LINE = 64 * 1024  # a client streaming bytes without a terminator must not eat the twin's memory
MAX_PENDING_OUTPUT = 1024 * 1024  # a PTY nobody reads: drop output beyond this, like a full UART FIFO
_TERMINATOR = re.compile(rb"\r\n|\r|\n")


class LineSession(Protocol):
    def handle(self, line: str, now: float) -> list[Reply]: ...


class LineEngine(Protocol):
    def new_session(self) -> LineSession: ...

    def input_overrun(self) -> None: ...


def precise_event_loop() -> asyncio.AbstractEventLoop:
    """An event loop whose timers fire closer to their time than the default loop's.

    The default epoll selector rounds every timeout up to a whole millisecond, so loop.call_at fires up to
    a millisecond late; select() takes a microsecond timeout (docs/tuning.md, "The twin's timing", has
    both measured). Its limit of 1024 file descriptors is far above what one twin process opens.
    """
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


class LineChannel:
    """Framing and reply scheduling for one conversation, independent of the byte transport.

    Accepts lines ended by \\n, \\r\\n or \\r (blank lines are skipped, so a \\r\\n split across two
    reads is harmless). Replies are queued in the order the engine produced them; their send times
    are non-decreasing, so one timer for the head of the queue is enough.
    """

    def __init__(self, engine: LineEngine, write: Callable[[bytes], None], loop: asyncio.AbstractEventLoop):
        self.engine = engine
        self.session = engine.new_session()
        self._write = write
        self._loop = loop
        self._buf = bytearray()
        self._discarding = False  # after an overrun, drop bytes up to the next terminator
        self._queue: deque[Reply] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data
        while m := _TERMINATOR.search(self._buf):
            line = bytes(self._buf[: m.start()])
            del self._buf[: m.end()]
            if self._discarding:
                self._discarding = False
            elif line.strip():
                self._dispatch(line)
        if len(self._buf) > MAX_LINE:
            self._buf.clear()
            self._discarding = True
            self.engine.input_overrun()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()

    def _dispatch(self, line: bytes) -> None:
        # latin-1 maps every byte to a character, so binary garbage reaches the engine's error path.
        replies = self.session.handle(line.decode("latin-1"), self._loop.time())
        self._queue.extend(replies)
        if self._timer is not None:  # the head may have been cancelled (-410); re-evaluate
            self._timer.cancel()
        self._pump()

    def _pump(self) -> None:
        self._timer = None
        now = self._loop.time()
        out = bytearray()
        while self._queue and (self._queue[0].cancelled or self._queue[0].at <= now):
            reply = self._queue.popleft()
            if not reply.cancelled:
                out += reply.data
        if out:
            self._write(bytes(out))
        if self._queue:
            self._timer = self._loop.call_at(self._queue[0].at, self._pump)


class _TcpProtocol(asyncio.Protocol):
    def __init__(self, engine: LineEngine):
        self.engine = engine
        self.channel: LineChannel | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        loop = asyncio.get_running_loop()

        def write(data: bytes) -> None:
            if not transport.is_closing():
                transport.write(data)

        self.channel = LineChannel(self.engine, write, loop)

    def data_received(self, data: bytes) -> None:
        assert self.channel is not None
        self.channel.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.channel is not None:
            self.channel.close()


class TcpEndpoint:
    """A TCP server on 127.0.0.1 (ephemeral port by default); asyncio sets TCP_NODELAY on accept."""

    def __init__(self, engine: LineEngine, host: str = "127.0.0.1", port: int = 0):
        self.engine = engine
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _TcpProtocol(self.engine), self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.address

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None


class PtyEndpoint:
    """A raw pseudo-terminal: clients open `path` (/dev/pts/N) as if it were a serial port.

    The emulator keeps the slave end open too, so the pty survives a client closing and reopening
    it (otherwise the master would read EIO and the device would vanish). Consequence: output a
    client never read stays in the pty and a later client sees it first (like a real UART buffer);
    clients should flush their input on open. There is one conversation per pty, like a serial line.
    """

    def __init__(self, engine: LineEngine):
        self.engine = engine
        self.path = ""
        self._master = self._slave = -1
        self._out = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.channel: LineChannel | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> str:
        self._master, self._slave = os.openpty()
        # Without raw mode the line discipline echoes input and maps CR/LF, corrupting the protocol.
        tty.setraw(self._slave)
        attrs = termios.tcgetattr(self._slave)
        attrs[3] &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN)
        termios.tcsetattr(self._slave, termios.TCSANOW, attrs)
        os.set_blocking(self._master, False)
        self.path = os.ttyname(self._slave)
        self._loop = loop
        self.channel = LineChannel(self.engine, self._write, loop)
        loop.add_reader(self._master, self._on_readable)
        return self.path

    def close(self) -> None:
        if self._loop is not None and self._master >= 0:
            self._loop.remove_reader(self._master)
            self._loop.remove_writer(self._master)
        if self.channel is not None:
            self.channel.close()
        for fd in (self._master, self._slave):
            if fd >= 0:
                os.close(fd)
        self._master = self._slave = -1

    def _on_readable(self) -> None:
        try:
            data = os.read(self._master, 65536)
        except BlockingIOError:
            return
        except OSError as exc:  # EIO would mean no slave is open; we hold one, so it is transient
            if exc.errno != errno.EIO:
                raise
            return
        assert self.channel is not None
        self.channel.feed(data)

    def _write(self, data: bytes) -> None:
        if len(self._out) + len(data) > MAX_PENDING_OUTPUT:
            return
        self._out += data
        self._flush()

    def _flush(self) -> None:
        assert self._loop is not None
        try:
            n = os.write(self._master, self._out)
            del self._out[:n]
        except BlockingIOError:
            pass
        if self._out:
            self._loop.add_writer(self._master, self._flush)
        else:
            self._loop.remove_writer(self._master)
