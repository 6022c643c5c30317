"""What an emulated photonic chip is: plain JSON-able data (see emulators/spec.py for the pattern)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MeshSpec:
    """An N x N chip of 2x2 MZI cells in a tree (Spanke) layout; inputs 1..N, outputs N+1..2N.

    Physics parameters are seed-independent; the per-heater draws (phi0, alpha and R spread, crosstalk
    pair weights, detector noise) come from `seed`.
    """

    name: str
    size: int = 8
    settling_time_us: float = 4.0
    drive: str = "current"  # what the lab's driver uses; the chip accepts both V and I on every channel
    crosstalk: float = 0.02  # thermal coupling of a heater's power into its neighbours' (h-1, h+1)
    crosstalk_spread: float = 0.2  # relative per-pair variation of the coupling
    insertion_loss_db: float = 0.1  # per cell
    heater_resistance_ohm: float = 1000.0
    resistance_spread: float = 0.02
    p_pi_mw: float = 30.0  # nominal electrical power for a pi phase shift
    alpha_spread: float = 0.05
    phi0_spread_rad: float = 6.283185307179586  # phi0 uniform in [-spread/2, spread/2]
    noise_rel: float = 0.002  # photodiode relative noise (1 sigma)
    noise_floor_mw: float = 1e-6
    input_power_dbm: dict[int, float] = field(default_factory=dict)
    seed: int = 0
    device_id: str = "Q8iv-0A1B"
    idn: str = "Testbed,MZI-MESH,000001,1.0"
    kind: str = "photonic_mesh"

    @classmethod
    def from_dict(cls, d: dict) -> MeshSpec:
        power = {int(k): float(v) for k, v in d.get("input_power_dbm", {}).items()}
        return cls(**{**d, "input_power_dbm": power})
