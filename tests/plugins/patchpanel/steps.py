"""A step kind from another package: `panel.settle` reads back every switch of the run (a settle point before
a measurement), planned, described and executed like a built-in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rich.tree import Tree

from testbed.contracts.engine import StepEngine
from testbed.steps import PlanContext, Planned, PlanView, StepModel, Touches


class Settle(StepModel):
    """Read back every switch of the inventory before going on."""

    action: Literal["panel.settle"]

    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        return (SettleStep(self.name or "settle", tuple(ctx.inventory.switches())),)


@dataclass(frozen=True)
class SettleStep(Planned):
    switches: tuple[str, ...]

    def execute(self, engine: StepEngine) -> None:
        engine.call({sw: (engine.operation(sw, "read_fabric"), {}) for sw in self.switches}, self.label)

    def describe(self, node: Tree, plan: PlanView) -> None:
        node.add(f"{self.label}: read back {', '.join(self.switches)}")

    def devices(self, plan: PlanView) -> Touches:
        return Touches(reads=frozenset(self.switches))
