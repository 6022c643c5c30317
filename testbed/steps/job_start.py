"""job.start: set up the job's fabric (if it has one), start every rank at once, wait for steady progress on
all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field
from rich.tree import Tree
from typing_extensions import override

from testbed.contracts.engine import StepEngine
from testbed.steps.base import CheckContext, PlanContext, Planned, PlanView, Problem, StepModel, Touches, escape


def needs_job(step: StepModel, ctx: CheckContext) -> list[Problem]:
    """A problem at `action` when the playbook has no job (for a kind that needs one only in some uses)."""
    if ctx.playbook.job is None:
        return [(("action",), f"{getattr(step, 'action', type(step).__name__)} needs a `job:` section in the playbook")]
    return []


def job_hosts(plan: PlanView) -> frozenset[str]:
    """The job's hosts, and the spares a failover may move a rank to."""
    job = plan.playbook.job
    return frozenset(job.ranks) | frozenset(plan.spares) if job is not None else frozenset()


class JobStart(StepModel):
    """Start every rank of the playbook's job at once, then wait for steady progress on all of them."""

    action: Literal["job.start"]
    wait_steps: int = Field(1, ge=0, description="wait until every rank has printed at least this step")
    timeout_ms: int = Field(120_000, gt=0)

    needs: ClassVar[frozenset[str]] = frozenset({"job"})

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        return (JobStartStep(self.name or "start job", self.wait_steps, self.timeout_ms / 1000),)


@dataclass(frozen=True)
class JobStartStep(Planned):
    """Every rank of the job started at once, then waited for until each has printed step `wait_steps`."""

    wait_steps: int
    timeout_s: float

    @override
    def execute(self, engine: StepEngine) -> None:
        engine.require_jobs(self.label).start(self)

    @override
    def devices(self, plan: PlanView) -> Touches:
        return Touches(writes=job_hosts(plan) | frozenset(plan.job_managed))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        job = plan.playbook.job
        branch = node.add(escape(f"{self.label}: {len(job.ranks)} ranks on {', '.join(dict.fromkeys(job.ranks))}"))
        if job.fabric is not None:
            branch.add("set up the job fabric first (above)")
        if job.launcher == "torchrun":
            hosts = list(dict.fromkeys(job.ranks))
            branch.add(
                escape(
                    f"one torchrun per host ({len(hosts)} nodes x {len(job.ranks) // len(hosts)} ranks), rendezvous "
                    f"at {hosts[0]} (node 0, rank 0's host)"
                )
            )
        if job.recovery == "in-job":
            spares = [h for h in (job.spares if job.spares is not None else plan.spares) if h not in job.ranks]
            branch.add(
                escape(
                    "recovery in-job: serve the job's store (generation 0: each rank's host its slot) before the "
                    f"ranks start; park a spare on {', '.join(spares) or 'no host (refused at start)'} and wait "
                    f"until each is parked, within {self.timeout_s:g} s"
                )
            )
        if job.torchft is not None:
            branch.add("torchft: serve TorchFT's lighthouse on the controller (its port in the job's store)")
        if self.wait_steps:
            branch.add(f"wait until every rank has printed step {self.wait_steps}, within {self.timeout_s:g} s")
