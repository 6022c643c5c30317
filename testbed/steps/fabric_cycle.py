"""fabric.cycle: apply every configuration of a schedule in turn (PipSwitch's all-to-all matchings), each one
measured like a fabric.apply.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from typing_extensions import override

from testbed.config.common import Name
from testbed.steps.base import CheckContext, PlanContext, Planned, Problem, StepModel
from testbed.steps.fabric_apply import apply_step


class FabricCycle(StepModel):
    """Apply every configuration of a schedule in turn, each measured like a fabric.apply."""

    action: Literal["fabric.cycle"]
    schedule: Name
    measure: Name | None = None
    verify_light: bool = True
    min_power_dbm: float = -20.0
    timeout_ms: int = Field(5000, gt=0)
    crosstalk: bool = Field(
        False,
        description="record crosstalk per output port where the device can tell (the emulated chip's ground truth)",
    )
    sequential: ClassVar[bool] = True  # a sequence of changes: not inside `parallel` (the planner refuses it)

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        if self.schedule not in ctx.playbook.schedules:
            known = ", ".join(ctx.playbook.schedules) or "none defined"
            return [(("schedule",), f"no schedule named {self.schedule!r} (schedules: {known})")]
        return []

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        return tuple(
            apply_step(ctx, name, f"apply {name}", self, measure=self.measure, crosstalk=self.crosstalk)
            for name in ctx.schedules[self.schedule]
        )
