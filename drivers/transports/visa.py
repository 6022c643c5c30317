"""Line-oriented VISA transport on pyvisa, with the VISA library the inventory names (`visa_library`): pyvisa-py
by default, the vendor's VISA (`@ivi`: NI-VISA, Keysight) or pyvisa-sim (`FILE.yaml@sim`), docs/protocols.md §6.1.

Speaks to `TCPIP0::host::port::SOCKET` (raw SCPI over TCP) and `ASRL/dev/...::INSTR` (serial)
resources, and through the vendor's VISA to whatever it opens (GPIB, USB-TMC). pyvisa-py's failure signatures
differ from what one would guess (docs/protocols.md §6): a reset
surfaces as a raw ConnectionResetError, a peer that closed (FIN) as VI_ERROR_TMO after the full
timeout, a partial line as VI_ERROR_TMO with the bytes dropped, a refused port only on the first write,
and open errors as a bare Exception. Every one of them leaves here as a drivers.errors type.

A SOCKET session the peer has already closed (a device that rebooted or dropped an idle session) is
reopened before a command is sent on it, so the command is not lost in a dead socket.

Input nobody asked for is discarded before each query with viFlush. A library or resource without it (pyvisa-sim;
pyvisa-py's VXI-11, USB and GPIB sessions: NotImplementedError; a VISA answering VI_ERROR_NSUP_OPER or
VI_ERROR_INV_MASK) gets a drain instead: reads with a 1 ms timeout until one times out, the bytes recorded as
received, and one audit record ("note") saying so.
"""

from __future__ import annotations

import re
import socket
import threading

import pyvisa
from pyvisa import constants
from pyvisa.errors import VisaIOError

from drivers.audit import AuditSink, record
from drivers.errors import DeviceConnectionError, DeviceTimeout
from drivers.transports._common import dropped_hint, no_delay, refused_hint, serial_open_hint, strip_reply, timeout_hint
from drivers.transports.base import TransportSettings
from drivers.transports.visa_library import VisaLibrary, canonical_resource, parse_visa_library, sim_resources

RESOURCE_HINT = (
    "VISA resource strings look like 'TCPIP0::10.0.0.5::5025::SOCKET' (raw SCPI over TCP) or "
    "'ASRL/dev/ttyUSB0::INSTR' (serial); 'TCPIP0::host::INSTR' is VXI-11 and '::hislip0::INSTR' is "
    "HiSLIP, which most switches (and every emulated device) do not speak"
)
_BAD_RESOURCE = {
    constants.StatusCode.error_invalid_resource_name,
    constants.StatusCode.error_resource_not_found,
}
# What a library answers viFlush with when it cannot flush this resource (or not with this mask).
_FLUSH_ABSENT = {
    constants.StatusCode.error_nonsupported_operation,
    constants.StatusCode.error_invalid_mask,
}
DRAIN_TIMEOUT_MS = 1  # per read of a drain: what is already there arrives at once; nothing more is awaited
DRAIN_MAX_READS = 64  # a device that never stops talking must not hold the query forever

_INSTALL = {
    "py": "install the pure-Python backend: pip install pyvisa-py",
    "sim": "install pyvisa-sim (pip install pyvisa-sim), or set visa_library to '@py' for the real device",
    "ivi": (
        "install the vendor's VISA (NI-VISA, Keysight IO Libraries) or give the path of its library as "
        "visa_library: '/path/to/libvisa.so@ivi'; a LAN or serial instrument works without it: visa_library: '@py'"
    ),
}

# pyvisa keeps one ResourceManager per library per process, and closing one closes every session opened through
# it: one per visa_library, made on first use and never closed here.
_MANAGERS: dict[str, pyvisa.ResourceManager] = {}
_MANAGERS_LOCK = threading.Lock()


def resource_manager(library: VisaLibrary) -> pyvisa.ResourceManager:
    """The process's ResourceManager for `library` (made on first use); pyvisa's own errors pass through."""
    with _MANAGERS_LOCK:
        rm = _MANAGERS.get(library.spec)
        if rm is None or rm.visalib.resource_manager is not rm:  # closed by someone else: open it again
            rm = _MANAGERS[library.spec] = pyvisa.ResourceManager(library.spec)
        return rm


def _last_line(exc: BaseException) -> str:
    """The last line of an error's text: pyvisa-sim puts the repr of a whole traceback into its message (escaped
    once more when that is a KeyError's), and the user needs its last line, not the traceback.
    """
    lines = [re.sub(r"\\+(['\"])", r"\1", line) for line in re.split(r"\\+n|\n", str(exc))]
    lines = [line.strip().strip("\\").strip() for line in lines]
    lines = [line.strip("'\"") if line.count("'") % 2 or line.count('"') % 2 else line for line in lines]
    lines = [line for line in lines if line.strip("'\"")]  # what is left of the repr's closing quotes goes
    return lines[-1] if lines else type(exc).__name__


class VisaTransport:
    """One instrument over VISA. Connects on first use; after a lost connection the next call reconnects."""

    def __init__(self, settings: TransportSettings, device: str, audit: AuditSink | None = None) -> None:
        self.settings = settings
        self.device = device
        self.address = settings.address
        self._audit = audit
        self._res: pyvisa.resources.MessageBasedResource | None = None
        self._no_flush = False  # learnt on the first query: the library cannot flush this resource

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
        rm, library = self._manager(message)
        try:
            # Attributes are set after opening: passed to open_resource, a malformed resource string
            # fails on the attribute ("not a valid attribute for type Resource") instead of its name.
            res = rm.open_resource(self.address, open_timeout=ms)
        except VisaIOError as exc:
            if library.backend == "sim" and exc.error_code in _BAD_RESOURCE:
                raise self._open_error(exc, message, self._sim_resource_hint(library)) from exc
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

    def _manager(self, message: str) -> tuple[pyvisa.ResourceManager, VisaLibrary]:
        try:
            library = parse_visa_library(self.settings.visa_library)
        except ValueError as exc:  # the inventory checks it; settings made by hand may still carry anything
            raise self._open_error(f"visa_library {exc}", message, "set visa_library in the inventory") from None
        if library.backend == "sim":
            try:
                # A missing or broken file said plainly, before pyvisa-sim reads it; and a resource the file does not
                # define refused here: pyvisa-sim 0.7 "opens" it anyway (on session 0, whose reads return nothing).
                defined = sim_resources(library.argument)
            except ValueError as exc:
                raise self._open_error(exc, message, "fix the file, or set visa_library in the inventory") from None
            if canonical_resource(self.address) not in defined:
                raise self._open_error(
                    f"{self.address} is not defined in {library.argument}", message, self._sim_resource_hint(library)
                )
        try:
            return resource_manager(library), library
        except Exception as exc:  # pyvisa raises ValueError/OSError/ImportError variously here
            said = _last_line(exc)
            if said.endswith(":"):  # pyvisa's "Could not open VISA library:" followed by no path it tried
                said += " pyvisa found none on this machine"
            cause = f"VISA library {library}: {said}"
            hint = _INSTALL[library.backend]
            if library.backend == "sim" and "No package named" not in cause:
                hint = (
                    f"pyvisa-sim cannot load {library.argument}: check it against its format (docs/protocols.md §6.2)"
                )
            raise self._open_error(cause, message, hint) from None

    def _sim_resource_hint(self, library: VisaLibrary) -> str:
        try:
            defined = ", ".join(sim_resources(library.argument))
        except ValueError as exc:
            return str(exc)
        return (
            f"the pyvisa-sim file {library.argument} defines {defined}, not "
            f"{canonical_resource(self.address) or self.address}; set resource to one of them"
        )

    def _discard_stale(self, res: pyvisa.resources.MessageBasedResource) -> bool:
        """Drop input nobody asked for; returns whether the peer has closed (or reset) the session.

        Input nobody asked for (an unsolicited line, a second line, a reply that came after its query
        timed out on a serial line) would be read as this query's answer.
        """
        if isinstance(res, pyvisa.resources.SerialInstrument):
            self._flush(res, constants.BufferOperation.discard_read_buffer)
            return False
        # SOCKET: pyvisa-py's own buffer, then the socket without waiting (its viClear drains for
        # 100 ms, and loops forever on a closed peer).
        self._flush(res, constants.BufferOperation.discard_read_buffer_no_io)
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

    def _flush(self, res: pyvisa.resources.MessageBasedResource, mask: constants.BufferOperation) -> None:
        """viFlush, or a drain where the library has none for this resource (module docstring)."""
        if not self._no_flush:
            try:
                res.flush(mask)
                return
            except NotImplementedError:
                pass
            except VisaIOError as exc:
                if exc.error_code not in _FLUSH_ABSENT:
                    raise
            self._no_flush = True
            record(
                self._audit,
                self.device,
                self.address,
                "note",
                f"the VISA library {self.settings.visa_library} cannot flush {self.address}; input nobody asked for "
                f"is drained before each query instead (reads with a {DRAIN_TIMEOUT_MS} ms timeout)",
            )
        self._drain(res)

    def _drain(self, res: pyvisa.resources.MessageBasedResource) -> None:
        """Read whatever is waiting, each read given DRAIN_TIMEOUT_MS; the bytes are recorded as received."""
        stale = b""
        saved = res.timeout
        res.timeout = DRAIN_TIMEOUT_MS
        try:
            for _ in range(DRAIN_MAX_READS):
                try:
                    stale += bytes(res.read_raw())
                except VisaIOError as exc:
                    if exc.error_code == constants.StatusCode.error_timeout:
                        return
                    raise
        finally:
            res.timeout = saved
            if stale:
                record(self._audit, self.device, self.address, "rx", stale)

    @staticmethod
    def _socket(res: pyvisa.resources.MessageBasedResource) -> socket.socket | None:
        """The TCP socket under a pyvisa-py SOCKET session, or None (internals, hence the guard)."""
        if not hasattr(socket, "MSG_DONTWAIT"):  # Windows: no non-blocking peek, do without
            return None
        try:
            sock = res.visalib.sessions[res.session].interface  # type: ignore[attr-defined]  # pyvisa-py's, guarded
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
