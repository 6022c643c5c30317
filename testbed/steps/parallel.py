"""parallel: run the nested steps at the same time; the step ends when all have ended. Faults in one parallel
step are active together (the max_concurrent_faults interlock counts them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field
from rich.tree import Tree
from typing_extensions import override

from testbed.contracts.engine import StepEngine
from testbed.steps.base import PlanContext, PlanError, Planned, PlanView, StepModel, Touches, escape

if TYPE_CHECKING:
    Step = StepModel  # at run time, the union of every step kind, set when that union is built (step_union)


class Parallel(StepModel):
    """Run the nested steps at the same time; the step ends when all have ended."""

    action: Literal["parallel"]
    steps: list["Step"] = Field(min_length=1)  # noqa: UP037 (the union of every step kind, set when it is built)

    @override
    def nested(self) -> list[StepModel]:
        return list(self.steps)

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        """One ParallelStep of the nested steps' planned steps; a kind that is a sequence of changes is refused."""
        for step in self.steps:
            if getattr(step, "sequential", False):
                raise PlanError(f"{step.action_name()} is a sequence of changes and cannot run inside `parallel`")
        inner = tuple(p for s in self.steps for p in s.plan(ctx))
        return (ParallelStep(label=self.name or f"parallel ({len(inner)} steps)", steps=inner),)


@dataclass(frozen=True)
class ParallelStep(Planned):
    """Steps run at the same time; it ends when all have ended."""

    steps: tuple[Planned, ...]

    @property
    @override
    def faults(self) -> int:  # type: ignore[override]
        """Every nested step's faults: they are active together."""
        return sum(s.faults for s in self.steps)

    @override
    def nested(self) -> tuple[Planned, ...]:
        return self.steps

    @override
    def execute(self, engine: StepEngine) -> None:
        """Every nested step at once on the engine's pool; once all have ended, the first one's error is raised."""
        futures = [engine.pool.submit(engine.execute, s) for s in self.steps]
        errors = [e for f in futures if (e := f.exception()) is not None]
        if errors:
            raise errors[0]

    @override
    def devices(self, plan: PlanView) -> Touches:
        touched = [s.devices(plan) for s in self.steps]
        return Touches(frozenset().union(*(t.reads for t in touched)), frozenset().union(*(t.writes for t in touched)))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        branch = node.add(escape(f"{self.label}, at the same time"))
        for step in self.steps:
            step.describe(branch, plan)
