"""job.stop: stop every rank of the job (SIGTERM to each process group, SIGKILL after a grace)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from rich.tree import Tree
from typing_extensions import override

from testbed.contracts.engine import StepEngine
from testbed.steps.base import PlanContext, Planned, PlanView, StepModel, Touches, escape
from testbed.steps.job_start import job_hosts


class JobStop(StepModel):
    """Stop every rank of the job (SIGTERM to each process group, SIGKILL after a grace)."""

    action: Literal["job.stop"]

    needs: ClassVar[frozenset[str]] = frozenset({"job"})

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        return (JobStopStep(self.name or "stop job"),)


@dataclass(frozen=True)
class JobStopStep(Planned):
    """Every rank of the job stopped."""

    @override
    def execute(self, engine: StepEngine) -> None:
        engine.require_jobs(self.label).stop(label=self.label)

    @override
    def devices(self, plan: PlanView) -> Touches:
        return Touches(writes=job_hosts(plan))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        node.add(escape(f"{self.label}: every rank (SIGTERM, SIGKILL after a grace)"))
