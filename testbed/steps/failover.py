"""failover: fail a rank, detect it, choose a spare, rewire the job's fabric through it, relaunch every rank from
the last checkpoint and wait for the first step on the spare. Every milestone is a mark and every segment a
`<measure>.<segment>` span (testbed/results/milestones.py):

fault_injected -> failure_detected -> spare_selected -> fabric_reconfigured -> link_verified ->
job_relaunched -> job_ready -> first_step (a step after the checkpoint, on the spare).

As soon as a watcher sees the failure, the spare is chosen for the rank the fault hit (whichever rank was seen
first: when a rank goes, its peers' ring breaks and they exit too) and the fabric is rewired through it, while the
surviving ranks are torn down: both must be done before the relaunch, and neither waits for the other. The spare
takes the place of the failed rank's host (every rank it held). A stop that fails on that host (off, unreachable)
is the fault's expected outcome; the fault is healed when the step ends, however it ends.

With `launcher: torchrun` the relaunch is every host's torchrun stopped and started again over the new hosts,
with a new rendezvous id; the rendezvous (and MASTER_ADDR) is rank 0's host, the spare when rank 0's host was
the one lost. The milestones are the same: a rank is watched through its host's torchrun and its own output,
and the spare's launch is followed from its start to its rank's ready line and first step.

With `job.recovery: in-job` nothing is relaunched (testbed/engine/job/injob.py): the moment a watcher sees the
failure, the current generation is marked aborted in the job's store (the survivors leave their process group; a
rewired circuit sends no reset), the spare is chosen among the hosts whose spare is parked and the fabric rewired;
the failed rank's process is stopped (a hung one must never come back; on a host that lost power the stop fails,
as expected); then the next generation is published, the parked spare in the failed slot. The milestones are

fault_injected -> failure_detected -> spare_selected -> fabric_reconfigured -> link_verified ->
generation_published -> job_ready (the spare's ready line: the new generation formed, the state received from a
survivor) -> first_step (the spare's first step: the step the job failed in, redone).

Each stage is bounded by the step's timeout_ms: the detection, the rewiring's light, the spare's ready line and
first step (a survivor that never joins, or a spare that never arrives, ends it with an error naming the rank and
slot). The survivors' watches end with their ranks, at job.stop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field
from rich.tree import Tree
from typing_extensions import override

from testbed.config.common import Name
from testbed.contracts.engine import StepEngine
from testbed.contracts.errors import StepFailed, raise_failures
from testbed.contracts.job import JobView
from testbed.contracts.outcome import Outcome
from testbed.events import Op
from testbed.results.milestones import segments_of
from testbed.steps.base import PlanContext, Planned, PlanView, escape
from testbed.steps.fault_detect import Detection, FaultDetectStep


class Failover(Detection):
    """Fail a rank, detect it, choose a spare, rewire the fabric, relaunch from the last checkpoint and wait
    for the first step on the spare; every milestone is recorded and `<measure>.<segment>` spans measured.
    """

    action: Literal["failover"]
    timeout_ms: int = Field(120_000, gt=0, description="for each stage: detection, relaunch, first step")
    measure: Name = "failover"

    needs: ClassVar[frozenset[str]] = frozenset({"job.fabric"})

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        return (self.planned(ctx, FailoverStep, "failover: {kind} on rank {rank}"),)


@dataclass(frozen=True)
class FailoverStep(FaultDetectStep):
    """A detection followed by the failover: spare, rewiring, relaunch, first step."""

    @override
    def execute(self, engine: StepEngine) -> None:
        with engine.fault_budget.hold(self.label):
            milestones = _failover(engine, engine.require_jobs(self.label), self)
        for seg in segments_of(milestones):
            # A milestone the playbook skipped (link_verified without light checks) merges its neighbours'
            # segments under a joined name, so no segment is passed off as one it is not.
            engine.recorder.emit(
                "measure",
                f"{self.measure}.{seg['segment']}",
                mono_ns=seg["end_ns"],
                wall=time.time(),
                step=self.label,
                data={"ms": seg["ms"], "start_ns": seg["start_ns"], "end_ns": seg["end_ns"]},
            )

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        branch = node.add(escape(self.label) + f" [cyan](measure {escape(self.measure or '')}.*)")
        self.describe_detection(branch, plan)
        job = plan.playbook.job
        if job.recovery == "in-job":
            spares = job.spares if job.spares is not None else plan.spares
            branch.add("at once: mark the job's generation aborted in its store (the survivors leave its group)")
            branch.add(
                escape(
                    f"choose a parked spare ({', '.join(spares) or 'none'}), rewire the job fabric through it; "
                    "stop the failed rank's process"
                )
            )
            branch.add(
                "publish the next generation, the spare in the failed slot; no rank is relaunched: the survivors "
                "and the spare form it, the state broadcast from a survivor; wait for the spare's first step"
            )
            branch.add(escape(f"heal {self.kind}"))
            return
        branch.add(escape(f"choose a spare ({', '.join(plan.spares) or 'none'}), rewire the job fabric through it"))
        if job.launcher == "torchrun":
            branch.add(
                "stop torchrun on every host and start it again with the spare (a new rendezvous id; the "
                "rendezvous moves with rank 0); ranks resume from the last checkpoint; wait for the spare's "
                "first step"
            )
        else:
            branch.add("relaunch every rank from the last checkpoint; wait for the spare's first step")
        branch.add(escape(f"heal {self.kind}"))


@dataclass
class _Chosen:
    """What the failover decided the moment the failure was seen: the spare, the new assignment, the rewiring."""

    seen: int  # the rank a watcher saw fail first
    spare: str
    hosts: list[str]
    selected_ns: int  # the spare_selected milestone
    fabric: Future[Mapping[str, Outcome]]


def _failover(engine: StepEngine, jobs: JobView, step: FailoverStep) -> dict[str, int]:
    """The failover of the rank the step's fault hits: the spare takes its host's place, whichever rank a watcher
    saw fail first (a peer of the failed rank exits as the ring breaks, and may be seen first; a host that lost
    power is seen last, or only through its peers). The fault is healed when this ends, however it ends.
    """
    recorder = engine.recorder
    decided: list[_Chosen] = []

    def mark(name: str, data: dict[str, Any] | None = None) -> int:
        return recorder.emit("mark", name, step=step.label, data=data or {}).mono_ns

    def mark_at(name: str, ns: int) -> int:
        recorder.emit("mark", name, mono_ns=ns, wall=time.time(), step=step.label)
        return ns

    in_job = jobs.recovery == "in-job"
    with jobs.fault(step, in_place=in_job) as fault:
        failed = fault.target

        def on_detect(seen: int) -> None:
            if in_job:  # first: the survivors leave the broken group while the spare is chosen and wired in
                generation = jobs.abort_generation(f"rank {failed.index} ({failed.host}) failed: {step.kind}")
                mark(Op.GENERATION_ABORTED, {"generation": generation, "rank": failed.index, "slot": failed.host})
            spare = jobs.choose_spare(failed.host)
            data = {"failed": failed.host, "spare": spare, "rank": failed.index}
            selected = mark(Op.SPARE_SELECTED, data)
            hosts = [spare if host == failed.host else host for host in jobs.assignment]
            decided.append(
                _Chosen(seen, spare, hosts, selected, engine.pool.submit(jobs.apply_fabric, step.label, hosts))
            )

        first = fault.detect(on_detect)
        if not decided:
            raise StepFailed(f"{step.label}: the failure was not reported by a watcher in time to fail over")
        chosen = decided[0]
        if chosen.seen != failed.index:
            # A watcher saw a peer of the failed rank first: its ring broke when the failed rank went away.
            mark(Op.FAILURE_REATTRIBUTED, {"first_seen": chosen.seen, "failed": failed.index, "evidence": "fault"})
        milestones: dict[str, int] = {
            Op.FAULT_INJECTED: fault.injected_ns,
            Op.FAILURE_DETECTED: first[1],
            Op.SPARE_SELECTED: chosen.selected_ns,
        }
        switches = chosen.fabric.result()
        jobs.assign(chosen.hosts)
        milestones[Op.FABRIC_RECONFIGURED] = mark_at(
            Op.FABRIC_RECONFIGURED, max(r.marks["acked"][0] for r in switches.values())
        )
        if all("lit" in r.marks for r in switches.values()):
            milestones[Op.LINK_VERIFIED] = mark_at(Op.LINK_VERIFIED, max(r.marks["lit"][0] for r in switches.values()))
        if in_job:
            # The parked spare is followed from its start: its ready line once the new generation formed, then its
            # first step (the one the job failed in).
            published, result = jobs.replace_rank(step.label, failed.index, failed.host, chosen.spare, step.timeout_s)
            milestones[Op.GENERATION_PUBLISHED] = published
        else:
            # The rank on the spare is watched from its launch on: its ready line, then its first step after the
            # checkpoint.
            started, relaunched = jobs.launch(step.label, watch=failed.index, timeout_s=step.timeout_s, relaunch=True)
            milestones[Op.JOB_RELAUNCHED] = mark_at(
                Op.JOB_RELAUNCHED, max(r.marks["job_started"][0] for r in started.values())
            )
            if relaunched is None:
                raise StepFailed(f"{step.label}: the relaunch did not follow rank {failed.index}'s first step")
            raise_failures([relaunched])
            result = relaunched
        # The spare's rank prints its ready line after an all-reduce with every rank: the whole job is up.
        milestones[Op.JOB_READY] = result.marks[Op.JOB_READY][0]
        milestones[Op.FIRST_STEP] = result.marks[Op.FIRST_STEP][0]
        recorder.emit(
            "mark",
            Op.FAILOVER_RESUMED,
            step=step.label,
            device=chosen.spare,
            data={"resumed_from": result.value["resumed"], "step": result.value["step"], "rank": failed.index},
        )
    return milestones
