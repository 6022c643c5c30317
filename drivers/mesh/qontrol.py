"""A photonic chip whose heaters hang on Qontrol Q8iv modules: the ASCII line protocol (docs/protocols.md §2).

Unlike SCPI every set answers `OK` (or an error line `E<code>:<ch>`), so sets are queries here and a
refused set raises at once. Channels are 0-based = heater numbers. Output photodiodes: `pdpall?` (one
line, comma-separated mW; an extension of the emulated chip's firmware [I]).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from drivers.capabilities import Identity
from drivers.errors import DeviceCommandError, DeviceProtocolError
from drivers.mesh.base import MeshDriver, parse_count, parse_number, parse_numbers
from drivers.transports import MessageTransport

# Bounded digits: int() of a garbled reply with thousands of digits would raise a raw ValueError.
_ERROR = re.compile(r"^[A-Za-z]{1,3}(\d{1,6}):(\d{1,6})")
ERRORS = {
    1: "over-voltage",
    2: "over-current",
    3: "power error",
    10: "unrecognised command",
    11: "unrecognised parameter",
    12: "unrecognised channel",
    13: "operation forbidden",
}
PROBE_MA = 5.0  # current used to measure heater resistance


class QontrolMesh(MeshDriver):
    count_query = "nchan?"
    resistance_probe = f"i<h>={PROBE_MA}, v<h>?, i<h>=0 per heater"

    def __init__(self, transport: MessageTransport, device: str, *, drive: str = "current", **kw):
        super().__init__(device, transport.address, drive=drive, **kw)
        self.transport = transport
        self._channels: int | None = None

    def identify(self) -> Identity:
        reply = self._query("id?")
        m = re.match(r"^(Q\w+)-([0-9a-fA-F*]+)$", reply)
        if not m:
            raise DeviceProtocolError(
                "expected an id like 'Q8iv-0A1B'",
                device=self.device,
                address=self.address,
                sent="id?",
                received=reply,
                hint="is a Qontrol module on this port?",
            )
        firmware = self._query("firmware?")
        return Identity("Qontrol", m.group(1), m.group(2), firmware)

    def heater_count(self) -> int:
        if self._channels is None:
            cmd = self.count_query
            self._channels = parse_count(self.device, self.address, cmd, self._query(cmd))
        return self._channels

    def _set_level(self, heater: int, value: float) -> None:
        cmd = f"{'i' if self.drive == 'current' else 'v'}{heater}={value:.4f}"
        reply = self._query(cmd)
        if reply.strip() != "OK":
            raise self._unexpected(cmd, reply, "expected OK")

    def _read_level(self, heater: int) -> float:
        cmd = f"{'i' if self.drive == 'current' else 'v'}{heater}?"
        return parse_number(self.device, self.address, cmd, self._query(cmd))

    def _read_output_mw(self) -> np.ndarray:
        n = self.size()[0]
        return parse_numbers(self.device, self.address, "pdpall?", self._query("pdpall?"), n, "mW values")

    def _measure_resistance(self, heaters: Sequence[int]) -> np.ndarray:
        out = []
        for h in heaters:
            self._checked_set(f"i{h}={PROBE_MA}")
            volts = parse_number(self.device, self.address, f"v{h}?", self._query(f"v{h}?"))
            self._checked_set(f"i{h}=0")
            out.append(volts / PROBE_MA * 1000.0)
        return np.array(out)

    def _checked_set(self, cmd: str) -> None:
        reply = self._query(cmd)
        if reply.strip() != "OK":
            raise self._unexpected(cmd, reply, "expected OK")

    def _query(self, cmd: str) -> str:
        reply = self.transport.query(cmd).strip()
        m = _ERROR.match(reply)
        if m:
            code, ch = int(m.group(1)), int(m.group(2))
            raise DeviceCommandError(
                f"the module refused the command: E{code:02d} {ERRORS.get(code, 'error')} on channel {ch}",
                device=self.device,
                address=self.address,
                sent=cmd,
                received=reply,
                hint="check the channel (0..nchan-1) and the value against vmax/imax and the heater resistance",
            )
        return reply

    def _unexpected(self, cmd: str, reply: str, what: str) -> DeviceProtocolError:
        return DeviceProtocolError(
            what,
            device=self.device,
            address=self.address,
            sent=cmd,
            received=reply,
            hint="check that the serial port is the Qontrol's (115200 8N1, '\\n')",
        )
