"""fabric.clear: remove every circuit on the ports this playbook's configurations use (other circuits, on
ports the playbook does not name, are left alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rich.tree import Tree

from testbed.contracts.engine import StepEngine
from testbed.steps.base import PlanContext, Planned, PlanView, StepModel, Touches, escape


class FabricClear(StepModel):
    """Remove every circuit this playbook's configurations use (other circuits are left alone)."""

    action: Literal["fabric.clear"]

    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        return (ClearStep(label=self.name or "clear fabric", managed=dict(ctx.managed)),)


@dataclass(frozen=True)
class ClearStep(Planned):
    managed: dict[str, tuple[int, ...]]

    def execute(self, engine: StepEngine) -> None:
        engine.call(self.calls(engine), self.label)

    def calls(self, engine: StepEngine) -> dict[str, tuple[str, dict[str, Any]]]:
        return {sw: (engine.operation(sw, "clear"), {"managed": list(ports)}) for sw, ports in self.managed.items()}

    def single_device(self) -> str | None:
        return next(iter(self.managed)) if len(self.managed) == 1 else None

    def devices(self, plan: PlanView) -> Touches:
        return Touches(writes=frozenset(self.managed))

    def describe(self, node: Tree, plan: PlanView) -> None:
        node.add(escape(f"{self.label}: " + ", ".join(f"{sw} ({len(p)} ports)" for sw, p in self.managed.items())))
