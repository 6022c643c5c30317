"""A SCPI multi-channel V/I source with photodiode readout (docs/protocols.md §3) on a MeshChip.

Channels are 1-based: SOURce<h+1> drives heater h. Units are SCPI base units (V, A).
- `SOURce<ch>:VOLTage <v>` / `SOURce<ch>:CURRent <a>` (set; no reply) and their queries (programmed level).
- `MEASure:VOLTage? (@ch,...)`, `MEASure:CURRent? (@ch,...)`: measured values (comma-separated).
- `MEASure:POWer? (@p,...)`: optical power in **dBm** per chip port (inputs 1..N read the arriving light,
  outputs N+1..2N their photodiode), like the OCS's `:PMON:POW?`.
- `:MESH:SIZE?` -> `N,N`; `SOURce:CHANnel:COUNt?` -> number of heater channels.
- `*OPC?` answers once every heater has settled; `*RST` sets every channel to 0 A.
"""

from __future__ import annotations

from emulators.mesh.chip import MeshChip
from emulators.scpi.engine import Call, ScpiEngine, ScpiError, parse_channel_list, parse_float

V_LIMIT, I_LIMIT = 12.0, 0.024


class MeshScpiEngine(ScpiEngine):
    def __init__(self, chip: MeshChip, idn: str):
        super().__init__(idn, terminator="\n")
        self.chip = chip
        reg = self.register
        reg("SOURce#:VOLTage[:LEVel]", self._set_volt, args=(1, 1))
        reg("SOURce#:VOLTage[:LEVel]?", lambda c: f"{self._level(c, 'V'):.6g}")
        reg("SOURce#:CURRent[:LEVel]", self._set_curr, args=(1, 1))
        reg("SOURce#:CURRent[:LEVel]?", lambda c: f"{self._level(c, 'I'):.6g}")
        reg("SOURce:CHANnel:COUNt?", lambda c: str(chip.heaters))
        reg("MEASure:VOLTage?", lambda c: ",".join(f"{chip.voltage(h):.6g}" for h in self._channels(c)), args=(1, 1))
        reg(
            "MEASure:CURRent?",
            lambda c: ",".join(f"{chip.current_ma(h) / 1000:.6g}" for h in self._channels(c)),
            args=(1, 1),
        )
        reg("MEASure:POWer?", self._power, args=(1, 1))
        reg(":MESH:SIZE?", lambda c: f"{chip.n},{chip.n}")

    def operations_complete_at(self, now: float) -> float:
        return self.chip.settled_at(now)

    def reset_device(self, now: float) -> None:
        for h in range(self.chip.heaters):
            self.chip.set_drive(h, "I", 0.0, now)

    def _heater(self, call: Call) -> int:
        ch = call.suffixes[0]
        if not 1 <= ch <= self.chip.heaters:
            raise ScpiError(-114 if ch else -113, f"channel {ch} not in 1..{self.chip.heaters}")
        return ch - 1

    def _channels(self, call: Call) -> list[int]:
        chans = parse_channel_list(call.args[0])
        for ch in chans:
            if not 1 <= ch <= self.chip.heaters:
                raise ScpiError(-222, f"channel {ch} not in 1..{self.chip.heaters}")
        return [ch - 1 for ch in chans]

    def _level(self, call: Call, mode: str) -> float:
        h = self._heater(call)
        if self.chip.mode[h] != mode:
            return 0.0
        return float(self.chip.level[h]) / (1000.0 if mode == "I" else 1.0)

    def _set_volt(self, call: Call) -> None:
        h, v = self._heater(call), parse_float(call.args[0])
        if not 0 <= v <= V_LIMIT or v / self.chip.resistance[h] > I_LIMIT:
            raise ScpiError(-222, f"{v} V on channel {h + 1} (limit {V_LIMIT} V, {I_LIMIT * 1000} mA)")
        self.chip.set_drive(h, "V", v, call.now)

    def _set_curr(self, call: Call) -> None:
        h, a = self._heater(call), parse_float(call.args[0])
        if not 0 <= a <= I_LIMIT or a * self.chip.resistance[h] > V_LIMIT:
            raise ScpiError(-222, f"{a} A on channel {h + 1} (limit {I_LIMIT} A, {V_LIMIT} V)")
        self.chip.set_drive(h, "I", a * 1000.0, call.now)

    def _power(self, call: Call) -> str:
        ports = parse_channel_list(call.args[0])
        for p in ports:
            if not 1 <= p <= 2 * self.chip.n:
                raise ScpiError(-222, f"port {p} not in 1..{2 * self.chip.n}")
        if not ports:
            return ""
        mw = self.chip.output_power_mw(call.now)  # one noise draw per query
        out = []
        for p in ports:
            out.append(self.chip.port_power_dbm(p, call.now) if p <= self.chip.n else _dbm(mw[p - self.chip.n - 1]))
        return ",".join(f"{x:.3f}" for x in out)


def _dbm(mw: float) -> float:
    import math

    return max(-99.99, 10 * math.log10(mw)) if mw > 0 else -99.99
