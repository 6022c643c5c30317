"""The Qontrol Q8iv ASCII line protocol (docs/protocols.md §2) on a MeshChip, one channel per heater.

The chip's heaters are driven by a daisy chain of Q8iv modules (8 channels each, channels 0-based across
the chain). Every set answers `OK`; a refused command answers only an error line `E<code>:<ch>` (two-digit
code and channel), as the firmware's asynchronous errors do. Units: volts and milliamps.

Beyond the documented commands, the chip's output photodiodes are read with `pdp<j>?` (output j, 0-based,
one line in mW) and `pdpall?` (one line, N comma-separated values in mW) [I]: mW, not dBm, because
the qontrol library's number regex drops a minus sign.

Line faults (fault injection on the serial line, set through the twin's control API, see
emulators/mesh/device.py): the command is still executed, only its reply is changed on the way back.
    latency    the reply leaves `delay_ms` late (slow firmware)
    slicer     the reply trickles out in 3-byte pieces, `delay_ms` apart
    stall      no reply at all (a dead TX line: the acknowledgement of a set is lost)
    truncate   the first half of the reply's first line, without its terminator
    garbage    a line of bytes that are not the protocol
"""

from __future__ import annotations

import math
import re

from emulators.mesh.chip import MeshChip
from emulators.scpi.engine import Reply

V_FULL, I_FULL = 12.0, 24.0
CHANNELS_PER_MODULE = 8
FIRMWARE = "v2.4.1"

_LINE = re.compile(r"^\s*([A-Za-z]+?)(\d*)\s*([=?])\s*(.*?)\s*$")
MAX_CHANNEL_DIGITS = 6  # int() of thousands of digits raises; no chain has a million channels

LINE_FAULTS = ("latency", "slicer", "stall", "truncate", "garbage")
GARBAGE = b"\x8f\xfe#?\x00~E\xff"  # not ASCII, not a number, not an error line
SLICE = 3  # bytes per piece of a sliced reply

# Error codes (docs/protocols.md §2.3)
E_UNKNOWN_CMD, E_BAD_PARAM, E_BAD_CHANNEL, E_OVER_V, E_OVER_I = 10, 11, 12, 1, 2


class QontrolEngine:
    """Shared state: the chip plus per-channel limits. Each conversation is a QontrolSession."""

    def __init__(self, chip: MeshChip, *, device_id: str = "Q8iv-0A1B"):
        self.chip = chip
        self.device_id = device_id
        self.vmax = [V_FULL] * chip.heaters
        self.imax = [I_FULL] * chip.heaters
        self.line_fault: tuple[str, float] | None = None  # (kind, delay in s)
        self._in_flight: list[Reply] = []  # replies due later (latency, slicer), in the order they were made

    def reset(self) -> None:
        """Power-on state; the output buffer is lost with the rest (late replies are never sent)."""
        self.vmax = [V_FULL] * self.chip.heaters
        self.imax = [I_FULL] * self.chip.heaters
        self.line_fault = None
        for reply in self._in_flight:
            reply.cancelled = True
        self._in_flight = []

    def replies_pending(self, now: float) -> int:
        """Replies made but not yet due: a healed line still delivers them first, in order."""
        self._in_flight = [r for r in self._in_flight if r.at > now and not r.cancelled]
        return len(self._in_flight)

    def set_line_fault(self, kind: str | None, delay_ms: float = 0.0) -> None:
        """Change every reply from now on (see the module docstring); None heals the line."""
        if kind is not None and kind not in LINE_FAULTS:
            raise ValueError(f"unknown line fault {kind!r} (faults: {', '.join(LINE_FAULTS)})")
        if not (isinstance(delay_ms, int | float) and math.isfinite(delay_ms) and delay_ms >= 0):
            raise ValueError(f"delay_ms must be a number >= 0, got {delay_ms!r}")
        self.line_fault = None if kind is None else (kind, delay_ms / 1000)

    def replies(self, data: bytes, now: float) -> list[Reply]:
        """The reply `data` as it leaves the module through the current line fault."""
        out = self._faulty(data, now)
        self.replies_pending(now)
        self._in_flight += [r for r in out if r.at > now]
        return out

    def _faulty(self, data: bytes, now: float) -> list[Reply]:
        if self.line_fault is None:
            return [Reply(data, now)]
        kind, delay = self.line_fault
        if kind == "latency":
            return [Reply(data, now + delay)]
        if kind == "slicer":
            return [Reply(data[i : i + SLICE], now + k * delay) for k, i in enumerate(range(0, len(data), SLICE))]
        if kind == "stall":
            return []
        if kind == "truncate":
            first = data.split(b"\n", 1)[0]
            return [Reply(first[: max(1, len(first) // 2)], now)]
        return [Reply(GARBAGE + b"\n", now)]  # garbage

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
        if not lines:
            return []
        return self.engine.replies("".join(x + "\n" for x in lines).encode("ascii", "replace"), now)

    def _handle(self, line: str, now: float) -> list[str]:
        eng, chip = self.engine, self.engine.chip
        if line.lower() == "help":
            return ["Commands: v i vmax imax vall iall vipall vvec ivec id nup nupall nchan vfull ifull firmware"]
        m = _LINE.match(line)
        if not m:
            return [_err(E_UNKNOWN_CMD, 0)]
        cmd, ch_text, op, value = m.group(1).lower(), m.group(2), m.group(3), m.group(4)
        if len(ch_text) > MAX_CHANNEL_DIGITS:
            return [_err(E_BAD_CHANNEL, 0)]
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
            if not all(math.isfinite(v) for v in values):  # refused whole, like an unparsable vector
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
            if not math.isfinite(v):  # 'nan' parses, and passes every limit check below
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
        if not math.isfinite(v) or v < 0:  # a NaN drive would pass every limit below and poison the chip
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
