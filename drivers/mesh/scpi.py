"""A photonic chip driven by a SCPI multi-channel V/I source with photodiode readout (docs/protocols.md §3).

Sets get no reply (SCPI): they are written back to back, then `*OPC?` (the heaters have settled) and one
`:SYST:ERR?` pass. SOURce<h+1> drives heater h; SCPI units are A and V (the driver's are mA and V).
`MEASure:POWer?` answers dBm.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from drivers.capabilities import Identity
from drivers.errors import DeviceCommandError, DeviceProtocolError
from drivers.mesh.base import REPLY_HINT, MeshDriver, parse_count, parse_number, parse_numbers
from drivers.transports import MessageTransport

# Bounded digits: int() of a garbled reply with thousands of digits would raise a raw ValueError.
_ERROR = re.compile(r"^([+-]?\d{1,9})\s*(?:,\s*(.*))?$")
PROBE_A = 0.005


class ScpiMesh(MeshDriver):
    count_query = "SOUR:CHAN:COUN?"
    resistance_probe = f"SOUR<h+1>:CURR {PROBE_A}, *OPC?, MEAS:VOLT? (@...), MEAS:CURR? (@...)"

    def __init__(self, transport: MessageTransport, device: str, *, drive: str = "current", **kw):
        super().__init__(device, transport.address, drive=drive, **kw)
        self.transport = transport
        self._channels: int | None = None

    def identify(self) -> Identity:
        reply = self.transport.query("*IDN?")
        fields = [f.strip() for f in reply.split(",")]
        if len(fields) != 4:
            raise DeviceProtocolError(
                "expected vendor,model,serial,firmware",
                device=self.device,
                address=self.address,
                sent="*IDN?",
                received=reply,
                hint=REPLY_HINT,
            )
        return Identity(*fields)

    def heater_count(self) -> int:
        if self._channels is None:
            cmd = self.count_query
            self._channels = parse_count(self.device, self.address, cmd, self.transport.query(cmd))
        return self._channels

    def _set_level(self, heater: int, value: float) -> None:
        if self.drive == "current":
            self.transport.write(f"SOUR{heater + 1}:CURR {value / 1000.0:.7g}")
        else:
            self.transport.write(f"SOUR{heater + 1}:VOLT {value:.6g}")

    def _read_level(self, heater: int) -> float:
        cmd = f"SOUR{heater + 1}:{'CURR' if self.drive == 'current' else 'VOLT'}?"
        value = parse_number(self.device, self.address, cmd, self.transport.query(cmd))
        return value * 1000.0 if self.drive == "current" else value

    def _read_output_mw(self) -> np.ndarray:
        n = self.size()[0]
        cmd = f"MEAS:POW? (@{n + 1}:{2 * n})"
        dbm = parse_numbers(self.device, self.address, cmd, self.transport.query(cmd), n, "dBm values")
        return np.where(dbm <= -99.0, 0.0, 10 ** (dbm / 10))

    def _measure_resistance(self, heaters: Sequence[int]) -> np.ndarray:
        heaters = list(heaters)
        for h in heaters:
            self.transport.write(f"SOUR{h + 1}:CURR {PROBE_A}")
        self._settle()
        chans = ",".join(str(h + 1) for h in heaters)
        volts = self._measure(f"MEAS:VOLT? (@{chans})", len(heaters), "voltages")
        amps = self._measure(f"MEAS:CURR? (@{chans})", len(heaters), "currents")
        for h in heaters:
            self.transport.write(f"SOUR{h + 1}:CURR 0")
        self.check_errors("measuring heater resistance")
        with np.errstate(divide="ignore", invalid="ignore"):  # 0 A: resistances() rejects the inf / nan
            return volts / amps

    def _measure(self, cmd: str, count: int, what: str) -> np.ndarray:
        return parse_numbers(self.device, self.address, cmd, self.transport.query(cmd), count, what)

    def _settle(self) -> None:
        reply = self.transport.query("*OPC?")
        if reply.strip() != "1":
            raise DeviceProtocolError(
                "expected '1'", device=self.device, address=self.address, sent="*OPC?", received=reply, hint=REPLY_HINT
            )

    def program(self, permutation) -> list[int]:
        states = super().program(permutation)
        with self._unknown_on_failure():  # a refused set, or an unreadable error queue
            self.check_errors("programming the heaters")
        return states

    def check_errors(self, after: str = "the previous commands") -> None:
        errors = []
        for _ in range(32):
            reply = self.transport.query(":SYST:ERR?")
            m = _ERROR.match(reply.strip())
            if not m:
                raise DeviceProtocolError(
                    "expected '<code>,\"<text>\"'",
                    device=self.device,
                    address=self.address,
                    sent=":SYST:ERR?",
                    received=reply,
                    hint=REPLY_HINT,
                )
            if int(m.group(1)) == 0:
                break
            errors.append(reply.strip())
        if errors:
            raise DeviceCommandError(
                f"the source refused {after}: {'; '.join(errors)}",
                device=self.device,
                address=self.address,
                sent=":SYST:ERR?",
                hint="check channel numbers (1..SOUR:CHAN:COUN?) and drive limits (12 V, 24 mA)",
            )
