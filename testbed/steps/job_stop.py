"""job.stop: stop every rank of the job (SIGTERM to each process group, SIGKILL after a grace)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from testbed.steps.base import CheckContext, PlanContext, Planned, Problem, StepModel, Touches, escape
from testbed.steps.job_start import job_hosts, needs_job


class JobStop(StepModel):
    action: Literal["job.stop"]

    def check(self, ctx: CheckContext) -> list[Problem]:
        return needs_job(self, ctx)

    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        return (JobStopStep(self.name or "stop job"),)


@dataclass(frozen=True)
class JobStopStep(Planned):
    def execute(self, engine) -> None:
        engine.require_jobs(self.label).stop(label=self.label)

    def devices(self, plan) -> Touches:
        return Touches(writes=job_hosts(plan))

    def describe(self, node, plan) -> None:
        node.add(escape(f"{self.label}: every rank (SIGTERM, SIGKILL after a grace)"))
