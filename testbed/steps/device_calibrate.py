"""device.calibrate: calibrate a device (a photonic chip's heaters); the calibration file is kept in the run
folder, or loaded from `reuse`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field
from rich.tree import Tree
from typing_extensions import override

from testbed.config.common import Name
from testbed.contracts.engine import StepEngine
from testbed.steps.base import (
    CheckContext,
    PlanContext,
    PlanError,
    Planned,
    PlanView,
    Problem,
    StepModel,
    Touches,
    escape,
)


class DeviceCalibrate(StepModel):
    """Calibrate a device (a photonic chip's heaters); the calibration file is kept in the run folder."""

    action: Literal["device.calibrate"]
    device: Name
    reuse: str | None = Field(None, description="a calibration file to load instead of sweeping")

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        if ctx.inventory is not None and self.device not in ctx.inventory.devices:
            return [(("device",), f"no device named {self.device!r} in the inventory")]
        return []

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        if ctx.inventory.devices[self.device].read_only:
            raise PlanError(f"interlock: {self.device} is read-only in the inventory, but the playbook calibrates it")
        return (CalibrateStep(label=self.name or f"calibrate {self.device}", device=self.device, reuse=self.reuse),)


@dataclass(frozen=True)
class CalibrateStep(Planned):
    """A device's calibration, kept in the run folder or loaded from `reuse`."""

    device: str
    reuse: str | None = None

    @override
    def execute(self, engine: StepEngine) -> None:
        path = str(engine.artifacts / f"calibration-{self.device}.json") if engine.artifacts else None
        procedure = engine.operation(self.device, "calibrate")
        engine.call(
            {self.device: (procedure, {"path": self.reuse or path, "reuse": self.reuse is not None})}, self.label
        )

    @override
    def devices(self, plan: PlanView) -> Touches:
        return Touches(writes=frozenset({self.device}))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        node.add(escape(self.label + (f" (loading {self.reuse})" if self.reuse else " (sweep every heater)")))
