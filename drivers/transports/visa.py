"""Line-oriented VISA transport on pyvisa with the pure-Python backend (pyvisa-py, no NI-VISA).

Speaks to `TCPIP0::host::port::SOCKET` (raw SCPI over TCP) and `ASRL/dev/...::INSTR` (serial)
resources. pyvisa-py's failure signatures differ from what one would guess (docs/protocols.md §6): a reset
surfaces as a raw ConnectionResetError, a peer that closed (FIN) as VI_ERROR_TMO after the full
timeout, a partial line as VI_ERROR_TMO with the bytes dropped, a refused port only on the first write,
and open errors as a bare Exception. Every one of them leaves here as a drivers.errors type.

A SOCKET session the peer has already closed (a device that rebooted or dropped an idle session) is
reopened before a command is sent on it, so the command is not lost in a dead socket.
"""

from __future__ import annotations

import socket

import pyvisa
from pyvisa import constants
from pyvisa.errors import VisaIOError

from drivers.audit import AuditSink, record
from drivers.errors import DeviceConnectionError, DeviceTimeout
from drivers.transports._common import dropped_hint, no_delay, refused_hint, serial_open_hint, strip_reply, timeout_hint
from drivers.transports.base import TransportSettings

RESOURCE_HINT = (
    "VISA resource strings look like 'TCPIP0::10.0.0.5::5025::SOCKET' (raw SCPI over TCP) or "
    "'ASRL/dev/ttyUSB0::INSTR' (serial); 'TCPIP0::host::INSTR' is VXI-11 and '::hislip0::INSTR' is "
    "HiSLIP, which most switches (and every emulated device) do not speak"
)
_BAD_RESOURCE = {
    constants.StatusCode.error_invalid_resource_name,
    constants.StatusCode.error_resource_not_found,
}


class VisaTransport:
    """One instrument over VISA. Connects on first use; after a lost connection the next call reconnects."""

    def __init__(self, settings: TransportSettings, device: str, audit: AuditSink | None = None) -> None:
        self.settings = settings
        self.device = device
        self.address = settings.address
        self._audit = audit
        self._res: pyvisa.resources.MessageBasedResource | None = None

    # -- MessageTransport -------------------------------------------------------------------------

    def write(self, message: str) -> None:
        self._exchange(message, want_reply=False)

    def query(self, message: str) -> str:
        reply = self._exchange(message, want_reply=True)
        assert reply is not None
        return reply

    def close(self) -> None:
        # Only the resource: pyvisa shares one ResourceManager per process, closing it would close
        # every other device's session too.
        self._drop()

    # -- internals --------------------------------------------------------------------------------

    def _exchange(self, message: str, want_reply: bool) -> str | None:
        res = self._open(message)
        data = (message + self.settings.write_termination).encode()
        try:
            if self._discard_stale(res) if want_reply else self._peer_closed(res):
                self._drop()
                res = self._open(message)
            record(self._audit, self.device, self.address, "tx", data)
            res.write_raw(data)
            if not want_reply:
                return None
            raw = bytes(res.read_raw())
            record(self._audit, self.device, self.address, "rx", raw)
            return strip_reply(raw, self.settings.read_termination)
        except VisaIOError as exc:
            peer_closed = exc.error_code == constants.StatusCode.error_timeout and self._peer_closed(res)
            # Dropping the session after a timeout as well means a late reply to this query dies with
            # the old connection instead of being taken as the answer to the next one.
            self._drop()
            if peer_closed:
                raise self._error(
                    DeviceConnectionError, "the device closed the connection", message, dropped_hint()
                ) from exc
            if exc.error_code == constants.StatusCode.error_timeout:
                raise self._error(
                    DeviceTimeout,
                    f"no complete reply within {self.settings.timeout_s * 1000:.0f} ms "
                    "(pyvisa-py drops a partial line on timeout)",
                    message,
                    timeout_hint(self.settings),
                ) from exc
            raise self._error(DeviceConnectionError, f"VISA I/O failed: {exc}", message, dropped_hint()) from exc
        except ConnectionRefusedError as exc:
            # pyvisa-py's non-blocking connect "succeeds" on a closed port; the refusal shows up here.
            self._drop()
            raise self._error(DeviceConnectionError, "connection refused", message, refused_hint(self.address)) from exc
        except OSError as exc:  # ConnectionResetError, BrokenPipeError, SerialException (ASRL) ...
            self._drop()
            raise self._error(DeviceConnectionError, f"connection lost: {exc}", message, dropped_hint()) from exc

    def _open(self, message: str) -> pyvisa.resources.MessageBasedResource:
        if self._res is not None:
            return self._res
        ms = max(1, round(self.settings.timeout_s * 1000))
        try:
            rm = pyvisa.ResourceManager("@py")
        except Exception as exc:  # pyvisa raises ValueError/OSError/ImportError variously here
            raise self._open_error(exc, message, "install the pure-Python backend: pip install pyvisa-py") from exc
        try:
            # Attributes are set after opening: passed to open_resource, a malformed resource string
            # fails on the attribute ("not a valid attribute for type Resource") instead of its name.
            res = rm.open_resource(self.address, open_timeout=ms)
        except VisaIOError as exc:
            hint = RESOURCE_HINT if exc.error_code in _BAD_RESOURCE else refused_hint(self.address)
            raise self._open_error(exc, message, hint) from exc
        except Exception as exc:  # pyvisa-py raises a bare Exception("could not connect: ...")
            if self.address.upper().startswith("ASRL"):
                hint = serial_open_hint(self.address)
            else:
                hint = refused_hint(self.address) + "; " + RESOURCE_HINT
            raise self._open_error(exc, message, hint) from exc
        if not isinstance(res, pyvisa.resources.MessageBasedResource):
            res.close()
            raise self._open_error(f"{self.address} is not a message-based resource", message, RESOURCE_HINT)
        try:
            res.timeout = ms
            # Explicit on purpose: pyvisa's SOCKET default read_termination is None, which makes every
            # query wait for the whole timeout, and its default write_termination is "\r\n".
            res.read_termination = self.settings.read_termination
            res.write_termination = self.settings.write_termination
            if isinstance(res, pyvisa.resources.SerialInstrument):
                res.baud_rate = self.settings.baudrate
            # Through the socket: pyvisa-py 0.8 rejects VI_ATTR_TCPIP_NODELAY ("Unknown attribute").
            no_delay(self._socket(res))
        except (ValueError, pyvisa.errors.Error, OSError) as exc:
            res.close()
            hint = "check read_termination / write_termination / baudrate for this device in the inventory"
            raise self._open_error(exc, message, hint) from exc
        self._res = res
        return res

    def _discard_stale(self, res: pyvisa.resources.MessageBasedResource) -> bool:
        """Drop input nobody asked for; returns whether the peer has closed (or reset) the session.

        Input nobody asked for (an unsolicited line, a second line, a reply that came after its query
        timed out on a serial line) would be read as this query's answer.
        """
        if isinstance(res, pyvisa.resources.SerialInstrument):
            res.flush(constants.BufferOperation.discard_read_buffer)
            return False
        # SOCKET: pyvisa-py's own buffer, then the socket without waiting (its viClear drains for
        # 100 ms, and loops forever on a closed peer).
        res.flush(constants.BufferOperation.discard_read_buffer_no_io)
        sock = self._socket(res)
        if sock is None:
            return False
        stale = b""
        try:
            while chunk := sock.recv(4096, socket.MSG_DONTWAIT):
                stale += chunk
            return True  # end of stream: the peer closed
        except BlockingIOError:
            return False  # drained, still open
        except OSError:
            return True  # reset
        finally:
            if stale:
                record(self._audit, self.device, self.address, "rx", stale)

    @staticmethod
    def _socket(res: pyvisa.resources.MessageBasedResource) -> socket.socket | None:
        """The TCP socket under a pyvisa-py SOCKET session, or None (internals, hence the guard)."""
        if not hasattr(socket, "MSG_DONTWAIT"):  # Windows: no non-blocking peek, do without
            return None
        try:
            sock = res.visalib.sessions[res.session].interface
        except (AttributeError, KeyError, pyvisa.errors.Error):
            return None
        return sock if isinstance(sock, socket.socket) else None

    def _peer_closed(self, res: pyvisa.resources.MessageBasedResource) -> bool:
        """Whether a SOCKET session's peer hung up: pyvisa-py reports that as a timeout."""
        sock = self._socket(res)
        if sock is None:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False  # open and silent: a real timeout
        except OSError:
            return True  # reset

    def _open_error(self, cause: object, message: str, hint: str) -> DeviceConnectionError:
        return self._error(
            DeviceConnectionError, f"cannot open the VISA resource, nothing was sent: {cause}", message, hint
        )

    def _drop(self) -> None:
        res, self._res = self._res, None
        if res is not None:
            try:
                res.close()
            except Exception:  # the connection is being discarded anyway
                pass

    def _error(self, cls: type, what: str, sent: str, hint: str):
        return cls(what, device=self.device, address=self.address, sent=sent, hint=hint)
