"""A photonic chip driven by a SCPI multi-channel V/I source with photodiode readout (devices.md §2.2, §4.1).

Sets get no reply (SCPI): they are written back to back, then `*OPC?` (the heaters have settled) and one
`:SYST:ERR?` pass. SOURce<h+1> drives heater h; SCPI units are A and V (the driver's are mA and V).
`MEASure:POWer?` answers dBm.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from testbed.capabilities import Identity

from ..errors import DeviceCommandError, DeviceProtocolError
from ..transports import MessageTransport
from .base import MeshDriver, parse_number

_ERROR = re.compile(r"^([+-]?\d+)\s*(?:,\s*(.*))?$")
PROBE_A = 0.005


class ScpiMesh(MeshDriver):
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
            )
        return Identity(*fields)

    def heater_count(self) -> int:
        if self._channels is None:
            cmd = "SOUR:CHAN:COUN?"
            self._channels = int(parse_number(self.device, self.address, cmd, self.transport.query(cmd)))
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
        reply = self.transport.query(cmd)
        try:
            dbm = np.array([float(v) for v in reply.split(",")])
        except ValueError:
            raise DeviceProtocolError(
                "expected comma-separated dBm values",
                device=self.device,
                address=self.address,
                sent=cmd,
                received=reply,
            ) from None
        if len(dbm) != n:
            raise DeviceProtocolError(
                f"expected {n} values", device=self.device, address=self.address, sent=cmd, received=reply
            )
        return np.where(dbm <= -99.0, 0.0, 10 ** (dbm / 10))

    def _measure_resistance(self, heaters: Sequence[int]) -> np.ndarray:
        heaters = list(heaters)
        for h in heaters:
            self.transport.write(f"SOUR{h + 1}:CURR {PROBE_A}")
        self._settle()
        chans = ",".join(str(h + 1) for h in heaters)
        volts = [float(v) for v in self.transport.query(f"MEAS:VOLT? (@{chans})").split(",")]
        amps = [float(v) for v in self.transport.query(f"MEAS:CURR? (@{chans})").split(",")]
        for h in heaters:
            self.transport.write(f"SOUR{h + 1}:CURR 0")
        self.check_errors("measuring heater resistance")
        return np.array(volts) / np.array(amps)

    def _settle(self) -> None:
        reply = self.transport.query("*OPC?")
        if reply.strip() != "1":
            raise DeviceProtocolError(
                "expected '1'", device=self.device, address=self.address, sent="*OPC?", received=reply
            )

    def program(self, permutation) -> list[int]:
        states = super().program(permutation)
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
