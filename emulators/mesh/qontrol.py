"""The Qontrol Q8iv ASCII line protocol (reference/devices.md §2.1) on a MeshChip, one channel per heater.

The chip's heaters are driven by a daisy chain of Q8iv modules (8 channels each, channels 0-based across
the chain). Every set answers `OK`; a refused command answers only an error line `E<code>:<ch>` (two-digit
code and channel), as the firmware's asynchronous errors do. Units: volts and milliamps.

Beyond the documented commands, the chip's output photodiodes are read with `pdp<j>?` (output j, 0-based,
one line in mW) and `pdpall?` (one line, N comma-separated values in mW) [I]: mW, not dBm, because
the qontrol library's number regex drops a minus sign.
"""

from __future__ import annotations

import re

from emulators.mesh.chip import MeshChip
from emulators.scpi import Reply

V_FULL, I_FULL = 12.0, 24.0
CHANNELS_PER_MODULE = 8
FIRMWARE = "v2.4.1"

_LINE = re.compile(r"^\s*([A-Za-z]+?)(\d*)\s*([=?])\s*(.*?)\s*$")

# Error codes (devices.md §2.1)
E_UNKNOWN_CMD, E_BAD_PARAM, E_BAD_CHANNEL, E_OVER_V, E_OVER_I = 10, 11, 12, 1, 2


class QontrolEngine:
    """Shared state: the chip plus per-channel limits. Each conversation is a QontrolSession."""

    def __init__(self, chip: MeshChip, *, device_id: str = "Q8iv-0A1B"):
        self.chip = chip
        self.device_id = device_id
        self.vmax = [V_FULL] * chip.heaters
        self.imax = [I_FULL] * chip.heaters

    def reset(self) -> None:
        self.vmax = [V_FULL] * self.chip.heaters
        self.imax = [I_FULL] * self.chip.heaters

    def new_session(self) -> QontrolSession:
        return QontrolSession(self)

    def input_overrun(self) -> None:
        pass  # the line is dropped; real firmware reports E14, which the pty has no channel for here

    @property
    def modules(self) -> int:
        return -(-self.chip.heaters // CHANNELS_PER_MODULE)

    def module_ids(self) -> list[str]:
        kind, _, serial = self.device_id.partition("-")
        base = int(serial, 16) if re.fullmatch(r"[0-9a-fA-F]+", serial) else 0
        return [f"{kind}-{base + m:04X}" for m in range(self.modules)]


class QontrolSession:
    def __init__(self, engine: QontrolEngine):
        self.engine = engine

    def handle(self, line: str, now: float) -> list[Reply]:
        lines = self._handle(line.strip(), now)
        return [Reply(("".join(x + "\n" for x in lines)).encode("ascii", "replace"), now)] if lines else []

    def _handle(self, line: str, now: float) -> list[str]:
        eng, chip = self.engine, self.engine.chip
        if line.lower() == "help":
            return ["Commands: v i vmax imax vall iall vipall vvec ivec id nup nupall nchan vfull ifull firmware"]
        m = _LINE.match(line)
        if not m:
            return [_err(E_UNKNOWN_CMD, 0)]
        cmd, ch_text, op, value = m.group(1).lower(), m.group(2), m.group(3), m.group(4)
        ch = int(ch_text) if ch_text else None
        n_ch = chip.heaters

        def channel() -> int | str:
            if ch is None or not 0 <= ch < n_ch:
                return _err(E_BAD_CHANNEL, ch or 0)
            return ch

        if op == "?":
            if cmd == "id":
                return [eng.device_id]
            if cmd == "nchan":
                return [str(n_ch)]
            if cmd == "vfull":
                return [f"{V_FULL:.1f} V"]
            if cmd == "ifull":
                return [f"{I_FULL:.1f} mA"]
            if cmd == "firmware":
                return [FIRMWARE]
            if cmd == "lifetime":
                return ["1234"]
            if cmd in ("nupall", "nup"):
                return [f"{mid} : {k}" for k, mid in enumerate(eng.module_ids())]
            if cmd == "vall":
                return [f"{chip.voltage(h):.4f}" for h in range(n_ch)]
            if cmd == "iall":
                return [f"{chip.current_ma(h):.4f}" for h in range(n_ch)]
            if cmd == "vipall":
                p = chip.power_mw(now)
                return [f"{chip.voltage(h):.4f} {chip.current_ma(h):.4f} {p[h]:.4f}" for h in range(n_ch)]
            if cmd == "pdpall":  # one line: every output of one instant
                return [",".join(f"{x:.6f}" for x in chip.output_power_mw(now))]
            if cmd == "pdp":
                if ch is None or not 0 <= ch < chip.n:
                    return [_err(E_BAD_CHANNEL, ch or 0)]
                return [f"{chip.output_power_mw(now)[ch]:.6f}"]
            if cmd in ("v", "i", "vmax", "imax"):
                c = channel()
                if isinstance(c, str):
                    return [c]
                val = {"v": chip.voltage, "i": chip.current_ma}.get(cmd)
                out = val(c) if val else (eng.vmax[c] if cmd == "vmax" else eng.imax[c])
                return [f"{out:.4f}"]
            return [_err(E_UNKNOWN_CMD, ch or 0)]

        # set commands
        if cmd == "nup":
            return ["OK"]
        if cmd in ("vvec", "ivec"):
            start = ch or 0
            try:
                values = [float(v) for v in value.split(",")]
            except ValueError:
                return [_err(E_BAD_PARAM, start)]
            if start + len(values) > n_ch:
                return [_err(E_BAD_CHANNEL, start + len(values) - 1)]
            for k, v in enumerate(values):
                problem = self._set(cmd[0], start + k, v, now)
                if problem:
                    return [problem]
            return ["OK"]
        if cmd in ("v", "i", "vmax", "imax"):
            c = channel()
            if isinstance(c, str):
                return [c]
            try:
                v = float(value)
            except ValueError:
                return [_err(E_BAD_PARAM, c)]
            if cmd == "vmax":
                if not 0 <= v <= V_FULL:
                    return [_err(E_BAD_PARAM, c)]
                eng.vmax[c] = v
                return ["OK"]
            if cmd == "imax":
                if not 0 <= v <= I_FULL:
                    return [_err(E_BAD_PARAM, c)]
                eng.imax[c] = v
                return ["OK"]
            problem = self._set(cmd, c, v, now)
            return [problem or "OK"]
        return [_err(E_UNKNOWN_CMD, ch or 0)]

    def _set(self, what: str, c: int, v: float, now: float) -> str | None:
        eng, chip = self.engine, self.engine.chip
        if v < 0:
            return _err(E_BAD_PARAM, c)
        r = chip.resistance[c]
        if what == "v":
            if v > eng.vmax[c] or v / r * 1000 > eng.imax[c]:
                return _err(E_OVER_V if v > eng.vmax[c] else E_OVER_I, c)
            chip.set_drive(c, "V", v, now)
        else:
            if v > eng.imax[c] or v * r / 1000 > eng.vmax[c]:
                return _err(E_OVER_I if v > eng.imax[c] else E_OVER_V, c)
            chip.set_drive(c, "I", v, now)
        return None


def _err(code: int, ch: int) -> str:
    return f"E{code:02d}:{ch:02d}"
