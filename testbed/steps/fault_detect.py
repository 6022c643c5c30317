"""fault.detect: watch every rank, inject a fault on one, and measure fault_injected -> failure_detected (the
first watcher to see it); then heal the fault and stop the job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field
from rich.tree import Tree
from typing_extensions import override

from testbed.config.common import Name
from testbed.contracts.engine import StepEngine
from testbed.faults import FAULT_KINDS
from testbed.faults.base import fails_a_rank
from testbed.faults.model import Fault
from testbed.steps.base import (
    CheckContext,
    PlanContext,
    PlanError,
    Planned,
    PlanView,
    Problem,
    StepModel,
    Touches,
    escape,
)
from testbed.steps.fault_inject import check_fault, describe_fault
from testbed.steps.job_start import job_hosts


class Detection(StepModel):
    """What a step that watches every rank for a fault it injects has (fault.detect, failover)."""

    fault: Fault
    heartbeat_ms: float = Field(50, gt=0, le=60_000)
    stall_timeout_ms: float = Field(5000, gt=0)

    if TYPE_CHECKING:  # declared by each kind (fault.detect, failover) with its own default
        timeout_ms: int
        measure: str | None

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        """A fault kind that does not make a rank fail is refused: no watcher would see it."""
        refused = [k for k in self.fault.kinds() if not fails_a_rank(FAULT_KINDS.get(k))]
        if refused:
            return [
                (
                    ("fault", "kind"),
                    f"{self.action_name()} needs a fault that makes a rank fail, so that a watcher sees it: "
                    f"{', '.join(refused)} does not (it slows a rank, or hits a connection or a switch's ports); "
                    "use it in a fault.inject step",
                )
            ]
        return check_fault(self, ctx)

    def planned(self, ctx: PlanContext, step_class: type[FaultDetectStep], label: str) -> FaultDetectStep:
        """The planned step (FaultDetectStep or FailoverStep), its kind and rank drawn for this trial."""
        kind, rank = rank_fault(self, ctx)
        timing = (self.heartbeat_ms / 1000, self.stall_timeout_ms / 1000, self.timeout_ms / 1000)
        return step_class(
            self.name or label.format(kind=kind, rank=rank), kind, rank, self.fault.xid, *timing, self.measure
        )


class FaultDetect(Detection):
    """Watch every rank, inject the fault, and measure fault_injected -> failure_detected; then heal the
    fault and stop the job.
    """

    action: Literal["fault.detect"]
    timeout_ms: int = Field(60_000, gt=0, description="give up waiting for a detection after this long")
    measure: Name | None = "detect"

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        return (self.planned(ctx, FaultDetectStep, "{kind} on rank {rank}, detect"),)


def rank_fault(step: Detection, ctx: PlanContext) -> tuple[str, int]:
    """The kind (drawn from a list) and the rank (drawn for rank:random) of a fault that hits a rank."""
    kind = ctx.draw(step.fault.kind)
    if FAULT_KINDS.get(kind).target != "rank":
        raise PlanError(f"{step.action_name()}: {kind} breaks a connection, not a rank; use it in a fault.inject step")
    return kind, ctx.target_rank(step.fault.target)


@dataclass(frozen=True)
class FaultDetectStep(Planned):
    """Every rank watched, a fault injected on one until a watcher sees it (timed if asked), then the fault healed."""

    kind: str
    rank: int
    xid: int
    heartbeat_s: float
    stall_timeout_s: float
    timeout_s: float
    measure: str | None
    faults: ClassVar[int] = 1

    @override
    def execute(self, engine: StepEngine) -> None:
        with engine.fault_budget.hold(self.label):
            jobs = engine.require_jobs(self.label)
            with jobs.fault(self) as fault:  # healed once detected
                first = fault.detect()
            injected = fault.injected_ns
        rank, detected_ns, value = first
        if self.measure:
            engine.recorder.emit(
                "measure",
                f"{self.measure}.latency",
                mono_ns=detected_ns,
                wall=time.time(),
                step=self.label,
                data={
                    "ms": (detected_ns - injected) / 1e6,
                    "start_ns": injected,
                    "end_ns": detected_ns,
                    "detected_on_rank": rank,
                    "kind": value.get("detected"),
                    "evidence": value.get("evidence"),
                },
            )

    @override
    def devices(self, plan: PlanView) -> Touches:
        return Touches(writes=job_hosts(plan))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        branch = node.add(escape(self.label) + (f" [cyan](measure {escape(self.measure)}.*)" if self.measure else ""))
        self.describe_detection(branch, plan)
        branch.add(escape(f"heal {self.kind}; stop the job"))

    def describe_detection(self, branch: Tree, plan: PlanView) -> None:
        """The watch and the injection, as `testbed plan` shows them."""
        host = plan.playbook.job.ranks[self.rank]
        fault = f"{self.kind} on rank {self.rank} ({host})" + describe_fault(self.kind, {"xid": self.xid})
        branch.add(f"watch every rank (heartbeat {self.heartbeat_s * 1000:g} ms, stall {self.stall_timeout_s:g} s)")
        branch.add(escape(f"inject {fault}; wait for its detection within {self.timeout_s:g} s"))
