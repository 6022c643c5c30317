"""A programmable photonic chip (an MZI mesh used as a circuit switch) in the inventory, and how the twin
emulates its physics.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from testbed.config.common import Strict
from testbed.config.device import SwitchConfig


class MeshEmulation(Strict):
    """How the twin emulates the chip's physics: settling, crosstalk, loss, and its heaters' spread and noise."""

    settling_time_us: float = Field(default=4.0, ge=0)
    drive: Literal["voltage", "current"] = "current"
    crosstalk: float = Field(default=0.02, ge=0, le=1)
    insertion_loss_db: float = Field(default=0.1, ge=0, le=10)
    heater_resistance_ohm: float = Field(default=1000.0, gt=0, le=1e6)
    p_pi_mw: float = Field(default=30.0, gt=0, le=1000, description="nominal heater power for a pi phase shift")
    alpha_spread: float = Field(default=0.05, ge=0, le=0.5, description="relative per-heater spread of the efficiency")
    phi0_spread_rad: float = Field(default=6.283185307179586, ge=0, le=6.283185307179586)
    noise_rel: float = Field(default=0.002, ge=0, le=0.5, description="photodiode relative noise (1 sigma)")


class MeshDevice(SwitchConfig):
    """A programmable photonic chip used as a circuit switch (kind photonic_mesh): inputs 1..N, outputs N+1..2N."""

    kind: Literal["photonic_mesh"]
    size: int = Field(default=8, ge=2, le=256, description="optical ports per side")
    emulation: MeshEmulation = MeshEmulation()

    def pass_loss_db(self) -> float:
        """Loss of light crossing the chip once, as the planner budgets it: every path goes through a
        splitter tree and a combiner tree of log2(size) cells each, `emulation.insertion_loss_db` per cell
        (what the twin's chip emulates).
        """
        return self.emulation.insertion_loss_db * 2 * math.ceil(math.log2(self.size))
