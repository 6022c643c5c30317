"""fabric.clear: remove every circuit on the ports this playbook's configurations use (other circuits, on
ports the playbook does not name, are left alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rich.tree import Tree
from typing_extensions import override

from testbed.contracts.engine import StepEngine
from testbed.steps.base import PlanContext, Planned, PlanView, StepModel, Touches, escape


class FabricClear(StepModel):
    """Remove every circuit this playbook's configurations use (other circuits are left alone)."""

    action: Literal["fabric.clear"]

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        return (ClearStep(label=self.name or "clear fabric", managed=dict(ctx.managed)),)


@dataclass(frozen=True)
class ClearStep(Planned):
    """Every circuit on the ports the playbook manages removed, on all switches at once."""

    managed: dict[str, tuple[int, ...]]

    @override
    def execute(self, engine: StepEngine) -> None:
        engine.call(self.calls(engine), self.label)

    def calls(self, engine: StepEngine) -> dict[str, tuple[str, dict[str, Any]]]:
        """The procedure each switch runs (its family's clear), with the ports to clear."""
        return {sw: (engine.operation(sw, "clear"), {"managed": list(ports)}) for sw, ports in self.managed.items()}

    @override
    def single_device(self) -> str | None:
        return next(iter(self.managed)) if len(self.managed) == 1 else None

    @override
    def devices(self, plan: PlanView) -> Touches:
        return Touches(writes=frozenset(self.managed))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        node.add(escape(f"{self.label}: " + ", ".join(f"{sw} ({len(p)} ports)" for sw, p in self.managed.items())))
