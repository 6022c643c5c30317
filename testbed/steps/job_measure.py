"""job.measure: time the job's next `steps` iterations from its own progress lines (on `rank`'s host); the
span is their mean (one value per window, as Opus reports iteration time: a straggler stalls every few steps,
which a median of the intervals would hide), with the intervals kept beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field
from rich.tree import Tree
from typing_extensions import override

from testbed.config.common import Name
from testbed.contracts.engine import StepEngine
from testbed.steps.base import CheckContext, PlanContext, Planned, PlanView, Problem, StepModel, Touches, escape


class JobMeasure(StepModel):
    """Time the job's next `steps` iterations from its own progress lines (on `rank`'s host); the
    span is their mean (one value per window, as Opus reports iteration time).
    """

    needs: ClassVar[frozenset[str]] = frozenset({"job"})

    action: Literal["job.measure"]
    steps: int = Field(10, ge=2, le=100_000)
    rank: int = Field(0, ge=0)
    measure: Name = "iteration"
    timeout_ms: int = Field(120_000, gt=0)

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        job = ctx.playbook.job
        if self.rank >= len(job.ranks):
            return [(("rank",), f"rank {self.rank} does not exist: the job has {len(job.ranks)}")]
        return []

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        label = self.name or f"time {self.steps} steps"
        return (JobMeasureStep(label, self.steps, self.rank, self.measure, self.timeout_ms / 1000),)


@dataclass(frozen=True)
class JobMeasureStep(Planned):
    """The job's next `steps` iterations timed on one rank's host; their mean is the `<measure>.time` span."""

    steps: int
    rank: int
    measure: str
    timeout_s: float

    @override
    def execute(self, engine: StepEngine) -> None:
        jobs = engine.require_jobs(self.label)
        jobs.require_running(self.label)
        r = jobs.ranks[self.rank]
        kwargs = {
            "job": jobs.handles[r.index],
            "progress": jobs.progress,
            "count": self.steps,
            "max_s": self.timeout_s,
        }
        result = engine.call({r.host: ("gpu.step_times", kwargs)}, self.label)[r.host]
        ns = result.value["ns"]
        intervals = [round((b - a) / 1e6, 3) for a, b in zip(ns, ns[1:], strict=False)]
        engine.recorder.emit(
            "measure",
            f"{self.measure}.time",
            mono_ns=ns[-1],
            step=self.label,
            data={
                "ms": (ns[-1] - ns[0]) / 1e6 / len(intervals),
                "start_ns": ns[0],
                "end_ns": ns[-1],
                "rank": r.index,
                "intervals_ms": intervals,
            },
        )

    @override
    def devices(self, plan: PlanView) -> Touches:
        return Touches(reads=frozenset({plan.playbook.job.ranks[self.rank]}))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        host = plan.playbook.job.ranks[self.rank]
        node.add(
            escape(f"{self.label} of rank {self.rank} ({host}) within {self.timeout_s:g} s")
            + f" [cyan](measure {escape(self.measure)}.time)"
        )
