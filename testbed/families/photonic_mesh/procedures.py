"""Photonic-chip procedures over a mesh driver (drivers/mesh), shaped like the OCS ones so the coordinator
can treat a chip as a switch: circuits are (input 1..N, output N+1..2N) pairs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, cast

from drivers.capabilities import PhotonicMesh
from testbed.contracts.jsontypes import JsonValue
from testbed.families import switching
from testbed.families.context import ProcedureContext, forgets_on_error
from testbed.families.switching import Change, Removed, Wording
from testbed.families.verify import VerificationError

if TYPE_CHECKING:
    from drivers.mesh.calibration import Calibration, CalibrationSettings


class CalibratedMesh(PhotonicMesh, Protocol):
    """A PhotonicMesh that calibrates itself (drivers.mesh.MeshDriver is one): what mesh.calibrate drives."""

    def calibrate(self, settings: CalibrationSettings | None = None) -> Calibration:
        """Sweep every heater and fit its phase response; the calibration is the driver's from then on."""

    def load_calibration(self, path: str) -> Calibration:
        """Load a calibration saved earlier (for this chip) and use it."""


class ChipIdentity(TypedDict):
    """What mesh.identify returns: the chip's identity, its port and heater counts, whether it is calibrated."""

    vendor: str
    model: str
    serial: str
    firmware: str
    size: list[int]  # [inputs, outputs]
    heaters: int
    calibrated: bool


class ChipCalibration(TypedDict):
    """What mesh.calibrate returns: a summary of the calibration and where it is saved."""

    heaters: int
    crosstalk: float
    p_pi_mw: list[float]  # [lowest, highest] over the heaters
    uncalibrated: JsonValue  # the heaters the fit could not calibrate, as the calibration's metadata lists them
    path: str | None


def identify(mesh: PhotonicMesh, ctx: ProcedureContext, *, expected_size: int | None = None) -> ChipIdentity:
    """The chip's identity and heater count; VerificationError if its size is not the inventory's."""
    ident = mesh.identify()
    n_in, n_out = mesh.size()
    if expected_size is not None and n_in != expected_size:
        raise VerificationError(
            f"the chip has {n_in}x{n_out} ports ({mesh.heater_count()} heaters) but the inventory says "
            f"{expected_size}x{expected_size}",
            device=ctx.device,
            address=ctx.address,
            hint="correct `size` in the inventory, or check that the address points at the right chip",
        )
    return {
        "vendor": ident.vendor,
        "model": ident.model,
        "serial": ident.serial,
        "firmware": ident.firmware,
        "size": [n_in, n_out],
        "heaters": mesh.heater_count(),
        "calibrated": getattr(mesh, "calibration", None) is not None,
    }


def calibrate(
    mesh: CalibratedMesh,
    ctx: ProcedureContext,
    *,
    path: str | None = None,
    reuse: bool = False,
    points: int = 24,
    sweep_max_mw: float = 80.0,
) -> ChipCalibration:
    """Sweep every heater and store P_pi and offsets (JSON at `path`); `reuse` loads `path` if it exists."""
    if reuse and path and Path(path).exists():
        cal = mesh.load_calibration(path)
        ctx.mark("loaded")
    else:
        # Imported here: the chip's drivers bring numpy, which a hub serving no chip need not load (its start is
        # on every run's path to its first command).
        from drivers.mesh.calibration import CalibrationSettings

        ctx.mark("sweep_started")
        cal = mesh.calibrate(CalibrationSettings(points=points, sweep_max_mw=sweep_max_mw))
        ctx.mark("swept")
        if path:
            cal.save(path)
    ctx.cache.pop("circuits", None)
    p_pi = [h.p_pi_mw for h in cal.heaters]
    return {
        "heaters": len(cal.heaters),
        "crosstalk": cal.crosstalk,
        "p_pi_mw": [min(p_pi), max(p_pi)],
        "uncalibrated": cal.meta.get("uncalibrated", []),
        "path": path,
    }


class _ChipCircuits:
    """A photonic chip as the commit-confirm change drives it (testbed.families.switching): it cannot disconnect
    an input, so a change programs the whole routing (the circuits kept plus the target) at once.
    """

    cache_key = "circuits"
    wording = Wording(
        holds_what="after programming the chip",
        holds_hint="another client may be driving the heaters; recalibrate if the chip drifted",
        light_what="output(s) of the chip",
        light_hint="check that the hosts cabled to these inputs transmit, recalibrate the chip (mesh.calibrate) if "
        "it drifted, or lower min_power_dbm",
    )

    def __init__(self, mesh: PhotonicMesh) -> None:
        self.mesh = mesh

    def read(self) -> dict[int, int]:
        """The circuits the chip's heaters route."""
        return self.mesh.circuits()

    def change(self, current: Mapping[int, int], target: Mapping[int, int], managed: Sequence[int]) -> Change:
        """The whole routing to program: the target, and the circuits kept on ports outside `managed`."""
        owned = set(managed)
        keep = {
            i: e
            for i, e in current.items()
            if i not in owned and e not in owned and i not in target and e not in target.values()
        }
        want = {**keep, **target}
        removed = [(i, e) for i, e in current.items() if want.get(i) != e and (i in owned or e in owned)]
        added = [(i, e) for i, e in target.items() if current.get(i) != e]
        return Change(holds=want, removed=removed, added=added)

    def apply(self, change: Change) -> None:
        """Program the routing the change holds."""
        self.mesh.program(dict(change.holds))

    def restore(self, before: Mapping[int, int], managed: Sequence[int]) -> None:
        """Program the routing the chip held before."""
        self.mesh.program(dict(before))

    def power(self, ports: Sequence[int]) -> dict[int, float]:
        """The outputs' power (dBm)."""
        return self.mesh.output_power(ports)


reconfigure = switching.reconfigure_procedure(
    _ChipCircuits,
    """Make the chip hold `circuits`, keeping circuits on ports outside `managed`; other inputs go anywhere.

Marks: sent (first heater written), acked (every set answered / settled), lit (every target output reads light
above `min_power_dbm`); reverted, as a switch's (testbed.families.switching.reconfigure: the same change).""",
)


@forgets_on_error("circuits")
def clear(mesh: PhotonicMesh, ctx: ProcedureContext, *, managed: list[int]) -> Removed:
    """Return the chip to its idle routing (input i to output N+i). A chip cannot disconnect: light always
    leaves by some output, so "clear" means the playbook's circuits are gone, not that the chip is dark.
    """
    n = mesh.size()[0]
    current = cast(dict[int, int] | None, ctx.cache.get("circuits")) or mesh.circuits()
    idle = {i: n + i for i in range(1, n + 1)}
    removed = [(i, e) for i, e in current.items() if idle.get(i) != e and (i in managed or e in managed)]
    ctx.mark("sent")
    mesh.program(idle)
    ctx.mark("acked")
    ctx.cache["circuits"] = idle
    return {"removed": len(removed)}
