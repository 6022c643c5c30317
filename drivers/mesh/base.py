"""What both mesh drivers share: routing, calibration, heater power <-> drive units, verification.

A subclass speaks the wire protocol: `_set_level(heater, value)` (mA or V, per `drive`), `_read_level`,
`_read_output_mw()` (N photodiodes), `_measure_resistance(heater)`, `_settle()`, identity and channel count.
Heaters are 0-based everywhere in this API (Qontrol channel numbers; SCPI channels are heater + 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from testbed.capabilities import Identity
from testbed.photonics import layout
from testbed.photonics.calibration import Calibration, CalibrationSettings, calibrate

from ..errors import DeviceCommandError, DeviceError, DeviceProtocolError


class NotCalibrated(DeviceCommandError):
    """program() needs the chip's calibration (P_pi and offsets per heater)."""


class MeshDriver:
    """Shared logic of the PhotonicMesh drivers; ports are inputs 1..N and outputs N+1..2N."""

    drive_units = {"current": "mA", "voltage": "V"}

    def __init__(self, device: str, address: str, *, drive: str = "current", calibration: Calibration | None = None):
        if drive not in self.drive_units:
            raise ValueError(f"{device}: drive must be 'current' or 'voltage', got {drive!r}")
        self.device = device
        self.address = address
        self.drive = drive
        self.calibration = calibration
        self._n: int | None = None
        self._applied: np.ndarray | None = None  # heater powers (mW) this driver last set
        self._resistance: np.ndarray | None = None

    # -- subclass hooks ----------------------------------------------------------------------------

    def identify(self) -> Identity:
        raise NotImplementedError

    def heater_count(self) -> int:
        raise NotImplementedError

    def _set_level(self, heater: int, value: float) -> None:
        raise NotImplementedError

    def _read_level(self, heater: int) -> float:
        raise NotImplementedError

    def _read_output_mw(self) -> np.ndarray:
        raise NotImplementedError

    def _measure_resistance(self, heaters: Sequence[int]) -> np.ndarray:
        raise NotImplementedError

    def _settle(self) -> None:
        """Return once the heaters have settled (SCPI *OPC?); Qontrol has no such query."""

    # -- capability ---------------------------------------------------------------------------------

    def size(self) -> tuple[int, int]:
        if self._n is None:
            try:
                self._n = layout.size_from_heaters(self.heater_count())
            except ValueError as exc:
                raise DeviceProtocolError(
                    str(exc),
                    device=self.device,
                    address=self.address,
                    hint="is this a tree-layout chip? check the driver and the address",
                ) from None
        return self._n, self._n

    def set_drive(self, heater: int, value: float) -> None:
        """Drive one heater in native units (mA for current drive, V for voltage drive)."""
        self._check_heater(heater)
        self._set_level(heater, value)
        if self._applied is not None:
            self._applied[heater] = math.nan  # no longer known in mW

    def read_drive(self, heater: int) -> float:
        self._check_heater(heater)
        return self._read_level(heater)

    def output_power(self, ports: Sequence[int] | None = None) -> dict[int, float]:
        """dBm per output port (N+1..2N); default all outputs."""
        n = self.size()[0]
        mw = self._read_output_mw()
        ports = list(range(n + 1, 2 * n + 1)) if ports is None else list(ports)
        out = {}
        for p in ports:
            if not n < p <= 2 * n:
                raise ValueError(f"{self.device}: port {p} is not an output port ({n + 1}..{2 * n})")
            v = mw[p - n - 1]
            out[p] = 10 * math.log10(v) if v > 0 else -99.99
        return out

    # port_power: the CircuitSwitch spelling, so procedures can poll light the same way
    def port_power(self, ports) -> dict[int, float]:
        return self.output_power(list(ports))

    def program(self, permutation: Sequence[int] | Mapping[int, int]) -> list[int]:
        """Route a permutation; returns the cell states (layout.BAR / layout.CROSS per heater).

        `permutation`: a sequence perm[i] = output (0-based, -1 = don't care), or circuits
        {input 1..N: output N+1..2N} (inputs left out go anywhere).
        """
        cal = self._require_calibration()
        n = self.size()[0]
        perm = layout.circuits_to_perm(n, dict(permutation)) if isinstance(permutation, Mapping) else list(permutation)
        if len(perm) != n:
            raise ValueError(f"{self.device}: a permutation of {n} ports is needed, got {len(perm)}")
        states = layout.route(layout.complete(perm))
        self.apply_powers(cal.powers_for_states(states))
        self._settle()
        return states

    def circuits(self) -> dict[int, int]:
        """{input: output} the heaters hold now (read back and decoded through the calibration)."""
        cal = self._require_calibration()
        n = self.size()[0]
        power = self.read_powers()
        perm = layout.decode(cal.states_of(power), n)
        return {i + 1: n + 1 + o for i, o in enumerate(perm) if o >= 0}

    # -- powers (the calibration's unit) ----------------------------------------------------------------

    def resistances(self) -> np.ndarray:
        if self._resistance is None:
            if self.calibration is not None and self.calibration.heaters:
                self._resistance = np.array([h.r_ohm for h in self.calibration.heaters])
            else:
                self._resistance = self._measure_resistance(range(self.heater_count()))
        return self._resistance

    def level_for(self, heater: int, p_mw: float) -> float:
        r = self.resistances()[heater]
        if self.drive == "current":
            return math.sqrt(max(p_mw, 0.0) / r * 1000.0)  # mA: P = I^2 R
        return math.sqrt(max(p_mw, 0.0) * r / 1000.0)  # V: P = V^2 / R

    def power_of(self, heater: int, level: float) -> float:
        r = self.resistances()[heater]
        return level * level * r / 1000.0 if self.drive == "current" else level * level / r * 1000.0

    def apply_powers(self, powers: np.ndarray | Mapping[int, float], *, only_changed: bool = True) -> int:
        """Set heater powers (mW); returns how many channels were written."""
        count = self.heater_count()
        if self._applied is None:
            self._applied = np.full(count, math.nan)
        items = powers.items() if isinstance(powers, Mapping) else enumerate(powers)
        sent = 0
        for h, p in items:
            if only_changed and abs(self._applied[h] - p) < 1e-6:
                continue
            self._set_level(int(h), self.level_for(int(h), float(p)))
            self._applied[h] = p
            sent += 1
        return sent

    def read_powers(self) -> np.ndarray:
        return np.array([self.power_of(h, self._read_level(h)) for h in range(self.heater_count())])

    # Bench protocol for testbed.photonics.calibration
    def set_heater_powers(self, powers: dict[int, float]) -> None:
        self.apply_powers(powers)

    def read_output_mw(self) -> np.ndarray:
        return self._read_output_mw()

    # -- calibration ------------------------------------------------------------------------------------

    def calibrate(self, settings: CalibrationSettings | None = None, progress=None) -> Calibration:
        n = self.size()[0]
        count = self.heater_count()
        self._resistance = None
        self.calibration = None
        r = self.resistances()
        self._applied = None
        self.apply_powers(np.zeros(count), only_changed=False)
        cal = calibrate(self, n, settings, progress)
        for h, hc in enumerate(cal.heaters):
            hc.r_ohm = float(r[h])
        cal.meta["drive"] = self.drive
        self.calibration = cal
        return cal

    def load_calibration(self, path: str | Path) -> Calibration:
        cal = Calibration.load(path)
        n = self.size()[0]
        if cal.size != n or len(cal.heaters) != self.heater_count():
            raise DeviceCommandError(
                f"calibration {path} is for a {cal.size}-port chip with {len(cal.heaters)} heaters, this one has "
                f"{n} ports and {self.heater_count()} heaters",
                device=self.device,
                address=self.address,
                hint="calibrate this chip (procedure mesh.calibrate) or point at its own calibration file",
            )
        self.calibration = cal
        self._resistance = None
        return cal

    # -- helpers ------------------------------------------------------------------------------------------

    def _require_calibration(self) -> Calibration:
        if self.calibration is None:
            raise NotCalibrated(
                "the chip has no calibration loaded, so heater drives for bar/cross are unknown",
                device=self.device,
                address=self.address,
                hint="run the mesh.calibrate procedure first (it stores P_pi and offsets per heater in a JSON "
                "file) or load one with load_calibration(path)",
            )
        return self.calibration

    def _check_heater(self, heater: int) -> None:
        count = self.heater_count()
        if not 0 <= heater < count:
            raise ValueError(f"{self.device}: heater {heater} out of range 0..{count - 1}")


def parse_number(device: str, address: str, sent: str, reply: str) -> float:
    try:
        return float(reply.strip().split()[0])
    except (ValueError, IndexError):
        raise DeviceProtocolError(
            "expected a number", device=device, address=address, sent=sent, received=reply
        ) from None


__all__ = ["DeviceError", "MeshDriver", "NotCalibrated", "parse_number"]
