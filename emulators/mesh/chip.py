"""The physics of an emulated MZI-mesh chip: heaters -> phases -> transfer matrix -> photodiodes.

Layout (the chip's "datasheet"; drivers/mesh/layout.py is the driver side's own copy):
- Spanke tree network of 2x2 MZI cells: input i (0-based) feeds a 1xN splitter tree, output o a Nx1
  combiner tree; splitter leaf o of tree i is wired to combiner leaf i of tree o. Every (input, output)
  pair has exactly one path (2*log2 N cells), so a permutation is routed with bar/cross states only and
  light from one input never meets itself (no multipath interference). N must be a power of two.
- Trees are heap-indexed: node k = 1..N-1, children 2k and 2k+1, leaf N+j stands for port j.
  Splitter node k: bar sends light to child 2k, cross to 2k+1. Combiner node k: its upper input comes
  from child 2k, its lower input from 2k+1, its upper output goes on (the lower output is dumped).
- Heater h (0-based channel): splitter tree i node k -> h = i*(N-1) + k-1; combiner tree o node k ->
  h = N*(N-1) + o*(N-1) + k-1. Physical neighbours (thermal crosstalk) are h-1 and h+1.

MZI convention (pinned): one heater in the upper arm between two 50:50 couplers B = [[1, i], [i, 1]]/sqrt2,
T(theta) = B diag(e^{i theta}, 1) B = 1/2 [[e^{i theta} - 1, i(e^{i theta} + 1)], [i(e^{i theta} + 1),
1 - e^{i theta}]]; |T00|^2 = sin^2(theta/2): theta = pi is BAR, theta = 0 is CROSS.

Phase of heater h: theta_h = phi0_h + alpha_h * (P_h + sum_j C_hj P_j), P = V^2/R or I^2 R (the mode last
set on that channel), C nearest-neighbour. A new drive ramps linearly over the settling time.
Light from different inputs (different lasers) adds in power; light from one input adds in field.
"""

from __future__ import annotations

import math

import numpy as np

from emulators.mesh.spec import MeshSpec

DARK_DBM = -99.99


def _levels(n: int) -> list[np.ndarray]:
    """Heap nodes per tree level, root first."""
    out, lo = [], 1
    while lo < n:
        out.append(np.arange(lo, 2 * lo))
        lo *= 2
    return out


class MeshChip:
    control_ops = ("set_input_power", "set_phase_drift", "reset", "state", "transfer_power")

    def __init__(self, spec: MeshSpec, *, clock=None):
        n = spec.size
        if n < 2 or n & (n - 1):
            raise ValueError(f"mesh {spec.name!r}: size must be a power of two >= 2 (tree layout), got {n}")
        self.spec = spec
        self.n = n
        self.cells = n - 1  # per tree
        self.heaters = 2 * n * (n - 1)
        self.clock = clock
        self._levels = _levels(n)
        # Light arriving on an input over a trunk from another switch, read live (set by the twin,
        # emulators/dataplane/paths.py couple_trunk_light): port -> f(now) -> dBm, or None when dark.
        self.input_feeds: dict = {}
        self.reset()

    # ---- control API ------------------------------------------------------------------------------

    def reset(self) -> None:
        s, h = self.spec, self.heaters
        rng = np.random.default_rng(s.seed)
        self.phi0 = rng.uniform(-s.phi0_spread_rad / 2, s.phi0_spread_rad / 2, h)
        self.alpha = (math.pi / s.p_pi_mw) * (1 + s.alpha_spread * rng.uniform(-1, 1, h))  # rad / mW
        self.resistance = s.heater_resistance_ohm * (1 + s.resistance_spread * rng.uniform(-1, 1, h))
        # coupling between heater h and h+1 (symmetric, nearest neighbours only)
        self.pair_coupling = s.crosstalk * (1 + s.crosstalk_spread * rng.uniform(-1, 1, h - 1))
        self.drift = np.zeros(h)
        self.rng = np.random.default_rng(s.seed + 1)
        self.mode = ["I"] * h  # the quantity last set per channel
        self.level = np.zeros(h)  # volts (mode V) or milliamps (mode I)
        self.p_from = np.zeros(h)  # mW, ramp start
        self.p_to = np.zeros(h)  # mW, ramp end
        self.t_set = np.full(h, -math.inf)
        self.input_power = {int(p): float(v) for p, v in s.input_power_dbm.items()}

    def set_input_power(self, port: int, dbm: float | None) -> None:
        """Light arriving on input `port` (1..N) from the transceiver cabled to it; None = dark."""
        if not 1 <= port <= self.n:
            raise ValueError(f"port {port} is not an input port (1..{self.n})")
        if dbm is None:
            self.input_power.pop(port, None)
        else:
            self.input_power[port] = float(dbm)

    def set_phase_drift(self, heater: int, rad: float) -> None:
        """Add a phase offset to one heater (ageing, temperature), as calibration would not know."""
        self._check_heater(heater)
        self.drift[heater] = float(rad)

    def state(self, now: float | None = None) -> dict:
        now = self._now(now)
        return {
            "name": self.spec.name,
            "size": self.n,
            "heaters": self.heaters,
            "settled_at": self.settled_at(now),
            "input_power_dbm": {str(p): v for p, v in sorted(self.input_power.items())},
            "output_power_mw": [round(float(p), 6) for p in self.output_power_mw(now, noise=False)],
            "power_mw": [round(float(p), 6) for p in self.p_to],
        }

    def transfer_power(self, now: float | None = None) -> list[list[float]]:
        """|T[o][i]|^2 (output o, input i, 0-based): the ground truth tests score routing with."""
        return (np.abs(self.transfer(self._now(now))) ** 2).tolist()

    # ---- drive ---------------------------------------------------------------------------------------

    def set_drive(self, heater: int, mode: str, value: float, now: float) -> None:
        """mode 'V' (volts) or 'I' (milliamps)."""
        self._check_heater(heater)
        tau = self.spec.settling_time_us * 1e-6
        frac = 1.0 if tau <= 0 else min(1.0, max(0.0, (now - self.t_set[heater]) / tau))
        self.p_from[heater] += (self.p_to[heater] - self.p_from[heater]) * frac
        self.mode[heater] = mode
        self.level[heater] = float(value)
        r = self.resistance[heater]
        self.p_to[heater] = (value**2 / r * 1000.0) if mode == "V" else (value**2 * r / 1000.0)
        self.t_set[heater] = now

    def voltage(self, heater: int) -> float:
        """Volts across the heater (what a V/I source measures)."""
        if self.mode[heater] == "V":
            return float(self.level[heater])
        return float(self.level[heater] * self.resistance[heater] / 1000.0)

    def current_ma(self, heater: int) -> float:
        if self.mode[heater] == "I":
            return float(self.level[heater])
        return float(self.level[heater] / self.resistance[heater] * 1000.0)

    def power_mw(self, now: float) -> np.ndarray:
        tau = self.spec.settling_time_us * 1e-6
        if tau <= 0:
            return self.p_to.copy()
        frac = np.clip((now - self.t_set) / tau, 0.0, 1.0)
        return self.p_from + (self.p_to - self.p_from) * frac

    def settled_at(self, now: float) -> float:
        done = float(np.max(self.t_set, initial=-math.inf)) + self.spec.settling_time_us * 1e-6
        return max(now, done)

    # ---- optics ---------------------------------------------------------------------------------------

    def phases(self, now: float) -> np.ndarray:
        p = self.power_mw(now)
        heat = p.copy()
        heat[:-1] += self.pair_coupling * p[1:]
        heat[1:] += self.pair_coupling * p[:-1]
        return self.phi0 + self.drift + self.alpha * heat

    def transfer(self, now: float) -> np.ndarray:
        """Field transfer T[o, i] from input i to output o (0-based)."""
        n, c = self.n, self.cells
        theta = self.phases(now)
        e = np.exp(1j * theta)
        t_bar, t_cross = (e - 1) / 2, 1j * (e + 1) / 2  # T00 (upper->upper), T10 = T01
        loss = 10 ** (-self.spec.insertion_loss_db / 20)
        split = slice(0, n * c)
        comb = slice(n * c, 2 * n * c)
        s_bar, s_cross = t_bar[split].reshape(n, c) * loss, t_cross[split].reshape(n, c) * loss
        c_up, c_low = t_bar[comb].reshape(n, c) * loss, t_cross[comb].reshape(n, c) * loss
        # Splitter trees: amplitude reaching every node from the tree's input, top down.
        amp = np.zeros((n, 2 * n), dtype=complex)
        amp[:, 1] = 1.0
        gain = np.zeros((n, 2 * n), dtype=complex)
        gain[:, 1] = 1.0
        for nodes in self._levels:
            amp[:, 2 * nodes] = amp[:, nodes] * s_bar[:, nodes - 1]
            amp[:, 2 * nodes + 1] = amp[:, nodes] * s_cross[:, nodes - 1]
            # Combiner trees: gain from every node to the tree's output (the product along the path).
            gain[:, 2 * nodes] = gain[:, nodes] * c_up[:, nodes - 1]
            gain[:, 2 * nodes + 1] = gain[:, nodes] * c_low[:, nodes - 1]
        leaves_split = amp[:, n:]  # [i, o]
        leaves_comb = gain[:, n:]  # [o, i]
        return leaves_split.T * leaves_comb

    def output_power_mw(self, now: float, *, noise: bool = True) -> np.ndarray:
        pin = np.zeros(self.n)
        for port, dbm in self.arriving_dbm(now).items():
            pin[port - 1] = 10 ** (dbm / 10)
        out = (np.abs(self.transfer(now)) ** 2) @ pin
        if noise:
            s = self.spec
            out = out * (1 + s.noise_rel * self.rng.standard_normal(self.n))
            out = np.abs(out + s.noise_floor_mw * self.rng.standard_normal(self.n))
        return out

    def arriving_dbm(self, now: float) -> dict[int, float]:
        """Light on each lit input: from the transceiver cabled to it, or over a trunk (input_feeds)."""
        out = dict(self.input_power)
        for port, feed in self.input_feeds.items():
            if port not in out and (dbm := feed(now)) is not None:
                out[port] = dbm
        return out

    def port_power_dbm(self, port: int, now: float) -> float:
        """Input ports read the arriving light, output ports their photodiode."""
        if 1 <= port <= self.n:
            dbm = self.arriving_dbm(now).get(port)
            return DARK_DBM if dbm is None else dbm
        if self.n < port <= 2 * self.n:
            mw = float(self.output_power_mw(now)[port - self.n - 1])
            return max(DARK_DBM, 10 * math.log10(mw)) if mw > 0 else DARK_DBM
        raise ValueError(f"port {port} out of range 1..{2 * self.n}")

    def _check_heater(self, heater: int) -> None:
        if not isinstance(heater, int) or not 0 <= heater < self.heaters:
            raise ValueError(f"heater {heater!r} out of range 0..{self.heaters - 1}")

    def _now(self, now: float | None) -> float:
        if now is not None:
            return now
        return self.clock() if self.clock is not None else math.inf
