"""What both mesh drivers share: routing, calibration, heater power <-> drive units, verification.

A subclass speaks the wire protocol: `_set_level(heater, value)` (mA or V, per `drive`), `_read_level`,
`_read_output_mw()` (N photodiodes), `_measure_resistance(heater)`, `_settle()`, identity and channel count.
Heaters are 0-based everywhere in this API (Qontrol channel numbers; SCPI channels are heater + 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from drivers.capabilities import Identity, PhotonicMesh
from drivers.errors import DeviceCommandError, DeviceError, DeviceProtocolError
from drivers.mesh import layout
from drivers.mesh.calibration import Calibration, CalibrationSettings, calibrate


class NotCalibrated(DeviceCommandError):
    """program() needs the chip's calibration (P_pi and offsets per heater)."""


class MeshDriver(PhotonicMesh):
    """Shared logic of the PhotonicMesh drivers; ports are inputs 1..N and outputs N+1..2N."""

    drive_units = {"current": "mA", "voltage": "V"}
    count_query = ""  # the command that answers the heater channel count (for error messages)
    resistance_probe = ""  # the commands a heater's resistance is measured with (for error messages)

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
            count = self.heater_count()
            try:
                self._n = layout.size_from_heaters(count)
            except ValueError as exc:
                raise DeviceProtocolError(
                    str(exc),
                    device=self.device,
                    address=self.address,
                    sent=self.count_query,
                    received=str(count),
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

    def output_power(self, ports: Iterable[int] | None = None) -> dict[int, float]:
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
        with self._unknown_on_failure():
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
                measured = self._measure_resistance(range(self.heater_count()))
                self._check_resistances(measured)
                self._resistance = measured
        return self._resistance

    def _check_resistances(self, ohms: np.ndarray) -> None:
        # Every drive level is computed from R (P = I^2 R, V^2 / R): a zero, negative or non-finite value
        # would turn into a division by zero or a NaN drive sent to the chip.
        bad = [h for h, r in enumerate(ohms) if not (math.isfinite(r) and r > 0)]
        if bad:
            raise DeviceProtocolError(
                f"heater(s) {bad[:8]} measured {[float(ohms[h]) for h in bad[:8]]} ohm: not a resistance",
                device=self.device,
                address=self.address,
                sent=self.resistance_probe,
                received=", ".join(f"{float(r):g}" for r in ohms),
                hint="a heater that reads no voltage or no current is shorted or disconnected: check the chip's "
                "wiring to the driver channels",
            )

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
        with self._unknown_on_failure():
            for h, p in items:
                if only_changed and abs(self._applied[h] - p) < 1e-6:
                    continue
                self._set_level(int(h), self.level_for(int(h), float(p)))
                self._applied[h] = p
                sent += 1
        return sent

    @contextmanager
    def _unknown_on_failure(self) -> Iterator[None]:
        """Forget which powers the heaters hold when a write's outcome is unknown.

        A set that "succeeded" may not have landed (SCPI sets get no reply: the bytes can die with the
        connection), and one that failed may have (a lost acknowledgement). Had the driver kept its record,
        the next program() would skip the heaters it believes set, and the chip would never converge.
        """
        try:
            yield
        except DeviceError:
            self._applied = None  # the next apply_powers writes every heater
            raise

    def read_powers(self) -> np.ndarray:
        return np.array([self.power_of(h, self._read_level(h)) for h in range(self.heater_count())])

    # Bench protocol for drivers.mesh.calibration
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


MAX_CHANNELS = 65536  # a channel count above this is a garbled reply, not a chip (2N(N-1) for N = 128 is 32512)
REPLY_HINT = (
    "the device answered outside its protocol: check that the address leads to this chip's driver board (and "
    "that no other program talks to it), and the line settings (baud rate, termination characters)"
)


def parse_number(device: str, address: str, sent: str, reply: str) -> float:
    """The first word of `reply` as a finite number (a unit may follow: '12.0 V')."""
    try:
        value = float(reply.strip().split()[0])
    except (ValueError, IndexError):
        value = math.nan
    if not math.isfinite(value):  # 'nan' and 'inf' parse, but no drive or reading is either
        raise DeviceProtocolError(
            "expected a number", device=device, address=address, sent=sent, received=reply, hint=REPLY_HINT
        )
    return value


def parse_count(device: str, address: str, sent: str, reply: str) -> int:
    """A channel count: a whole number from 1 to MAX_CHANNELS."""
    value = parse_number(device, address, sent, reply)
    if not (value.is_integer() and 1 <= value <= MAX_CHANNELS):
        raise DeviceProtocolError(
            f"expected a channel count (a whole number from 1 to {MAX_CHANNELS})",
            device=device,
            address=address,
            sent=sent,
            received=reply,
            hint=REPLY_HINT,
        )
    return int(value)


def parse_numbers(device: str, address: str, sent: str, reply: str, count: int, what: str) -> np.ndarray:
    """Exactly `count` comma-separated finite numbers (`what` names them in the error: "mW values")."""
    try:
        values = np.array([float(v) for v in reply.split(",")])
    except ValueError:
        values = None
    if values is None or not np.all(np.isfinite(values)):
        raise DeviceProtocolError(
            f"expected comma-separated {what}",
            device=device,
            address=address,
            sent=sent,
            received=reply,
            hint=REPLY_HINT,
        )
    if len(values) != count:
        raise DeviceProtocolError(
            f"expected {count} {what}, got {len(values)}",
            device=device,
            address=address,
            sent=sent,
            received=reply,
            hint=REPLY_HINT,
        )
    return values


__all__ = ["DeviceError", "MeshDriver", "NotCalibrated", "parse_count", "parse_number", "parse_numbers"]
