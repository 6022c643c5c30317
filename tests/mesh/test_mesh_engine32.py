"""N=32 on the engine directly (the driver path works too but sweeps 1984 heaters over a pty)."""

from __future__ import annotations

import math

import numpy as np

from drivers.mesh import layout
from drivers.mesh.calibration import CalibrationSettings, calibrate
from emulators.mesh.chip import MeshChip
from emulators.mesh.spec import MeshSpec


class DirectBench:
    """The Bench protocol on a MeshChip in virtual time (1 ms per step, far beyond the 4 us settling)."""

    def __init__(self, chip: MeshChip):
        self.chip, self.now = chip, 0.0

    def set_heater_powers(self, powers):
        for h, p in powers.items():
            self.chip.set_drive(h, "I", math.sqrt(p / self.chip.resistance[h] * 1000), self.now)
        self.now += 1e-3

    def read_output_mw(self):
        return self.chip.output_power_mw(self.now)


def test_calibrated_32_port_chip_routes_random_permutations():
    n = 32
    chip = MeshChip(MeshSpec(name="c32", size=n, seed=4, input_power_dbm={p: 0.0 for p in range(1, n + 1)}))
    bench = DirectBench(chip)
    cal = calibrate(bench, n, CalibrationSettings(points=16))
    assert len(cal.meta["uncalibrated"]) < 0.02 * chip.heaters  # a few dark-path cells may stay unknown
    rng = np.random.default_rng(1)
    for _ in range(3):
        perm = [int(x) for x in rng.permutation(n)]
        p = cal.powers_for_states(layout.route(perm))
        bench.set_heater_powers(dict(enumerate(p)))
        t = np.abs(chip.transfer(bench.now)) ** 2
        frac = t[perm, range(n)] / t.sum(axis=0)
        assert frac.min() >= 0.99
