"""job.stop: stop every rank of the job (SIGTERM to each process group, SIGKILL after a grace)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from rich.tree import Tree

from testbed.contracts.engine import StepEngine
from testbed.steps.base import PlanContext, Planned, PlanView, StepModel, Touches, escape
from testbed.steps.job_start import job_hosts


class JobStop(StepModel):
    action: Literal["job.stop"]

    needs: ClassVar[frozenset[str]] = frozenset({"job"})

    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        return (JobStopStep(self.name or "stop job"),)


@dataclass(frozen=True)
class JobStopStep(Planned):
    def execute(self, engine: StepEngine) -> None:
        engine.require_jobs(self.label).stop(label=self.label)

    def devices(self, plan: PlanView) -> Touches:
        return Touches(writes=job_hosts(plan))

    def describe(self, node: Tree, plan: PlanView) -> None:
        node.add(escape(f"{self.label}: every rank (SIGTERM, SIGKILL after a grace)"))
