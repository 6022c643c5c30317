"""The photonic chip family (kind `photonic_mesh`): a chip used as a circuit switch, driven through the
PhotonicMesh capability (Qontrol or a SCPI source). Its heaters are not lab state the framework restores:
a run does not record their setting before it starts.
"""

from __future__ import annotations

from drivers.capabilities import PhotonicMesh
from testbed.contracts.jsontypes import JsonObject
from testbed.families.base import DeviceFamily, FamilyInventory, ProcedureSpec, TwinSupport
from testbed.families.photonic_mesh import procedures
from testbed.families.photonic_mesh.model import MeshDevice, MeshEmulation

CHANGE_MARKS = ("sent", "acked", "lit", "reverted")


def _twin_spec(name: str, dev: MeshDevice, inventory: FamilyInventory, seed: int) -> JsonObject:
    e = dev.emulation
    return {
        "kind": "photonic_mesh",
        "name": name,
        "size": dev.size,
        "settling_time_us": e.settling_time_us,
        "drive": e.drive,
        "crosstalk": e.crosstalk,
        "insertion_loss_db": e.insertion_loss_db,
        "heater_resistance_ohm": e.heater_resistance_ohm,
        "p_pi_mw": e.p_pi_mw,
        "alpha_spread": e.alpha_spread,
        "phi0_spread_rad": e.phi0_spread_rad,
        "noise_rel": e.noise_rel,
        "input_power_dbm": {f.actual()[0]: f.launch_power_dbm for f in inventory.fibres if f.switch == name},
        "seed": seed * 1000 + list(inventory.devices).index(name),
    }


FAMILY = DeviceFamily(
    kind="photonic_mesh",
    model=MeshDevice,
    capability=PhotonicMesh,
    role="switch",
    own_process=True,
    procedures={
        "mesh.identify": ProcedureSpec(procedures.identify),
        "mesh.calibrate": ProcedureSpec(procedures.calibrate, ("loaded", "sweep_started", "swept")),
        "mesh.reconfigure": ProcedureSpec(procedures.reconfigure, CHANGE_MARKS),
        "mesh.clear": ProcedureSpec(procedures.clear, ("sent", "acked")),
    },
    operations={
        "identify": "mesh.identify",
        "reconfigure": "mesh.reconfigure",
        "clear": "mesh.clear",
        "calibrate": "mesh.calibrate",
    },
    twin=TwinSupport(_twin_spec),
    ground_truth="transfer_power",  # the emulated chip's |T|^2: crosstalk per output port
    description="a programmable photonic chip used as a circuit switch: inputs 1..N, outputs N+1..2N",
)

__all__ = ["FAMILY", "MeshDevice", "MeshEmulation"]
