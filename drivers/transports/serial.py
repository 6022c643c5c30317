"""Line-oriented serial transport on pyserial: device paths (/dev/ttyUSB0, /dev/pts/N) and URLs.

`serial.serial_for_url` is used rather than `serial.Serial` so that `socket://host:port` (terminal
servers, raw SCPI over TCP) and `rfc2217://` work with the same code (`socket://` gets pyserial's own
class with a close() that does not sleep, see _SocketPort). pyserial signals a timeout by
returning b'' or a partial line with no exception (docs/protocols.md §6); that is turned into DeviceTimeout
here, carrying whatever bytes did arrive.

Over `socket://` the connection is checked before each command: one the peer has closed (a device
that rebooted, a terminal server that dropped idle sessions) is reopened before sending, so the
command is not lost in a dead socket; and one that may still carry the late reply to a query that
timed out is replaced too, so that reply cannot be read as the answer to the next query.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import serial
from serial.urlhandler import protocol_socket

from drivers.audit import AuditSink, record
from drivers.errors import DeviceConnectionError, DeviceTimeout
from drivers.transports._common import dropped_hint, no_delay, serial_open_hint, strip_reply, timeout_hint
from drivers.transports.base import TransportSettings

try:  # a vanished USB adapter fails tcflush() with termios.error, which is not an OSError
    import termios

    _PORT_ERRORS: tuple[type[BaseException], ...] = (serial.SerialException, OSError, termios.error)
except ImportError:  # Windows
    _PORT_ERRORS = (serial.SerialException, OSError)
_OPEN_ERRORS: tuple[type[BaseException], ...] = (*_PORT_ERRORS, ValueError)  # opening also refuses a malformed address


class _SocketPort(protocol_socket.Serial):
    """pyserial's `socket://` port without the `time.sleep(0.3)` at the end of its close().

    pyserial sleeps there "in case of quick reconnects", which would add 0.3 s to every reconnect. Worse,
    io.IOBase.__del__ calls close() too: a port that is dropped without close() (a transport discarded
    in an error path, or held by an exception traceback until the cyclic collector frees it) then stalls
    whichever thread the garbage collector happens to run in, for 0.3 s per port: a thread serving or
    polling another device misses that device's timeout, and a healthy device looks dead.
    """

    _socket: socket.socket | None  # pyserial's: set by open()

    def close(self) -> None:
        # Not guarded by is_open: open() assigns the socket before it sets is_open.
        sock, self._socket = getattr(self, "_socket", None), None
        self.is_open = False
        if sock is not None:
            sock.close()

    def take_input(self) -> tuple[bytes, bool]:
        """Whatever has arrived, without waiting, and whether the peer has closed (or reset) the connection."""
        data = bytearray()
        sock = self._socket
        assert sock is not None  # asked of an open port only (SerialTransport._ready)
        try:
            while chunk := sock.recv(65536, socket.MSG_DONTWAIT):
                data += chunk
        except BlockingIOError:
            return bytes(data), False
        except OSError:
            return bytes(data), True
        return bytes(data), True  # end of stream


# What serial_for_url returns for a device (its stubs say serial.Serial), or our socket:// port.
Port = serial.Serial | _SocketPort


class SerialTransport:
    """One instrument on a serial line. Opens on first use; after a lost connection the next call reopens."""

    def __init__(self, settings: TransportSettings, device: str, audit: AuditSink | None = None) -> None:
        self.settings = settings
        self.device = device
        self.address = settings.address
        self._audit = audit
        self._port: Port | None = None
        self._unanswered = 0  # queries on this connection that timed out: their replies may still come

    # -- MessageTransport -------------------------------------------------------------------------

    def write(self, message: str) -> None:
        with self._mapped(message):
            port = self._ready(message, discard=False)
            self._send(port, message)

    def query(self, message: str) -> str:
        with self._mapped(message):
            # A reply that arrived after an earlier query timed out would otherwise be read as this
            # query's answer.
            port = self._ready(message, discard=True)
            self._send(port, message)
            raw = self._read_line(port)
        term = self.settings.read_termination.encode()
        if not raw.endswith(term):
            self._unanswered += 1
            raise DeviceTimeout(
                f"no complete reply within {self.settings.timeout_s * 1000:.0f} ms"
                + (" (a partial line arrived)" if raw else ""),
                device=self.device,
                address=self.address,
                sent=message,
                received=raw,
                hint=timeout_hint(self.settings),
            )
        return strip_reply(raw, self.settings.read_termination)

    def close(self) -> None:
        port, self._port = self._port, None
        self._unanswered = 0
        if port is None:
            return
        try:  # a socket:// port is a _SocketPort: closing it does not sleep
            port.close()
        except _PORT_ERRORS:
            pass  # the port is being discarded anyway

    # -- internals --------------------------------------------------------------------------------

    def _open(self, message: str) -> Port:
        if self._port is not None:
            return self._port
        options: dict[str, Any] = {
            "baudrate": self.settings.baudrate,
            "timeout": self.settings.timeout_s,
            # Without a write timeout a stuck line (flow control, full buffer) would block forever.
            "write_timeout": self.settings.timeout_s,
        }
        try:
            if self.address.lower().startswith("socket://"):
                self._port = _SocketPort(self.address, **options)  # what serial_for_url builds, minus the sleep
            else:
                self._port = serial.serial_for_url(self.address, **options)
            no_delay(getattr(self._port, "_socket", None))  # socket:// and rfc2217:// only
        except _OPEN_ERRORS as exc:
            self.close()
            raise DeviceConnectionError(
                f"cannot open the serial port, nothing was sent: {exc}",
                device=self.device,
                address=self.address,
                sent=message,
                hint=serial_open_hint(self.address),
            ) from exc
        return self._port

    def _ready(self, message: str, *, discard: bool) -> Port:
        """The port to send `message` on, with input nobody asked for discarded (if `discard`).

        A socket:// connection is replaced first if the peer has closed it, or if a query on it timed
        out and its reply has not turned up since (it may still be on its way: it would be taken as the
        answer to this query). A real serial line cannot be replaced: its input buffer is flushed.
        """
        port = self._open(message)
        if not isinstance(port, _SocketPort) or not hasattr(socket, "MSG_DONTWAIT"):
            if discard:
                port.reset_input_buffer()
            return port
        stale, closed = port.take_input()
        if stale:
            record(self._audit, self.device, self.address, "rx", stale)
            term = self.settings.read_termination.encode()
            self._unanswered = max(0, self._unanswered - stale.count(term))
        if closed or self._unanswered:
            self.close()
            port = self._open(message)
        return port

    def _send(self, port: serial.SerialBase, message: str) -> None:
        data = (message + self.settings.write_termination).encode()
        record(self._audit, self.device, self.address, "tx", data)
        port.write(data)

    def _read_line(self, port: Port) -> bytes:
        """Read up to and including the terminator, or whatever came before the timeout.

        The deadline bounds the wait while nothing arrives; a line that trickles in byte by byte can
        take up to one more timeout, since pyserial's per-read timeout cannot be shortened cheaply on a
        real UART (every change is a tcsetattr).
        """
        term = self.settings.read_termination.encode()
        buf = bytearray()
        deadline = time.monotonic() + self.settings.timeout_s
        try:
            while term not in buf and time.monotonic() < deadline:
                chunk = port.read(port.in_waiting or 1)
                if not chunk:
                    break  # pyserial's timeout: no exception, just nothing
                buf += chunk
        finally:
            if buf:
                record(self._audit, self.device, self.address, "rx", bytes(buf))
        if term in buf:
            # Bytes after the terminator answer no query of ours; the next query discards them anyway.
            del buf[buf.index(term) + len(term) :]
        return bytes(buf)

    @contextmanager
    def _mapped(self, message: str) -> Iterator[None]:
        """Turn pyserial/OS failures into typed errors; a lost connection is reopened on the next call."""
        try:
            yield
        except serial.SerialTimeoutException as exc:  # only writes raise it
            raise DeviceTimeout(
                "write timed out (the line is not draining)",
                device=self.device,
                address=self.address,
                sent=message,
                hint="check the cable and flow control (RTS/CTS, XON/XOFF); " + timeout_hint(self.settings),
            ) from exc
        except _PORT_ERRORS as exc:
            self.close()
            raise DeviceConnectionError(
                f"connection lost: {exc}",
                device=self.device,
                address=self.address,
                sent=message,
                hint=dropped_hint(),
            ) from exc
