"""rail.iterate: iterations of a workload card (Opus), with the rails reconfigured per phase.

A phase's traffic needs its configuration on the rails, then it computes (the workload's compute, modelled as a
pause). A change of rails takes the switches' own time plus the emulated OCS delay (`delay_ms`, a sleep per
change, as Opus's testbed does, so a real fast switch can stand in for slower ones). Modes:
- static: the rails never change (the first phase's configuration stays);
- on-demand: each phase boundary changes the rails and the job waits for it;
- provisioning: the next phase's change is requested as soon as a phase's traffic ends and runs behind its
  compute, so only what it overruns stalls the job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field
from rich.tree import Tree
from typing_extensions import override

from testbed.config.common import Name, choice, sweepable
from testbed.contracts.engine import StepEngine
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
from testbed.steps.fabric_apply import ApplyStep, apply_step, show_circuits

MODES = ("static", "on-demand", "provisioning")


class RailIterate(StepModel):
    """Run iterations of a workload card with the rails reconfigured per phase (Opus). Modes: static (the
    rails never change), on-demand (each phase waits for its reconfiguration), provisioning (the next
    configuration is requested as soon as a phase's traffic ends, hidden behind its compute). Each change
    takes the switch's own time plus `delay_ms` (the OCS delay emulated as a sleep per change, as Opus's
    testbed does, so a real fast switch can stand in for slower ones).
    """

    action: Literal["rail.iterate"]
    workload: Name
    mode: Annotated[str, choice(*MODES)]
    delay_ms: Annotated[float | str, sweepable(0, 600_000)] = 0
    iterations: int = Field(10, ge=1, le=100_000)
    warmup: int = Field(
        1,
        ge=0,
        le=1000,
        description="iterations run first and not measured (Opus measures the "
        "later steps only): the first one starts with its rails already in place",
    )
    measure: Name = "iteration"
    verify_light: bool = Field(
        False, description="check light on every new circuit of each change (part of the iteration time)"
    )
    min_power_dbm: float = Field(-20.0, description="with verify_light: every new egress must read above this")
    timeout_ms: int = Field(5000, gt=0, description="for each change's acknowledgement (and light)")

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        problems: list[Problem] = []
        if self.workload not in ctx.playbook.workloads:
            known = ", ".join(ctx.playbook.workloads) or "none defined"
            problems.append((("workload",), f"no workload named {self.workload!r} (workloads: {known})"))
        for key in ("mode", "delay_ms"):
            problems += ctx.sweep_ref(getattr(self, key), (key,))
        return problems

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        mode, delay = ctx.swept(self.mode), ctx.swept(self.delay_ms)
        if mode not in MODES:
            raise PlanError(f"rail.iterate: mode {self.mode} = {mode!r} is not static, on-demand or provisioning")
        if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
            raise PlanError(f"rail.iterate: delay_ms {self.delay_ms} = {delay!r} is not a duration in ms")
        phases = tuple(
            RailPhase(
                p.name,
                p.compute_ms / 1000,
                apply_step(ctx, p.configuration, f"{self.workload}: {p.name}", self, measure=None),
            )
            for p in ctx.playbook.workloads[self.workload].phases
        )
        label = self.name or f"{self.workload} {mode}, +{delay:g} ms per change"
        return (RailIterateStep(label, mode, float(delay) / 1000, self.iterations, self.measure, phases, self.warmup),)


@dataclass(frozen=True)
class RailPhase:
    """One phase of a workload card: its compute, and the rails its traffic needs."""

    name: str
    compute_s: float
    apply: ApplyStep  # the rails this phase's traffic needs


@dataclass(frozen=True)
class RailIterateStep(Planned):
    """A workload card's iterations, the rails changed per phase as the mode says, each iteration's time measured."""

    mode: str
    delay_s: float
    iterations: int
    measure: str
    phases: tuple[RailPhase, ...]
    warmup: int = 1

    @override
    def execute(self, engine: StepEngine) -> None:
        phases = self.phases

        def change(apply: ApplyStep) -> None:
            engine.execute(apply)
            time.sleep(self.delay_s)  # the emulated switching delay: part of what is measured

        change(phases[0].apply)  # the rails the first phase needs, before the first iteration (not measured)
        pending = None
        for iteration in range(-self.warmup, self.iterations):
            start = time.monotonic_ns()
            for k, phase in enumerate(phases):
                first = iteration == -self.warmup and k == 0
                if self.mode == "on-demand" and not first:
                    change(phase.apply)
                elif self.mode == "provisioning" and pending is not None:
                    pending.result()  # whatever of the change its window did not hide is a stall
                # (the phase's collective runs here, on the rails now in place)
                if self.mode == "provisioning":
                    pending = engine.pool.submit(change, phases[(k + 1) % len(phases)].apply)
                time.sleep(phase.compute_s)  # the phase's compute: part of the workload being measured
            end = time.monotonic_ns()
            if iteration < 0:
                continue  # warm-up
            engine.recorder.emit(
                "measure",
                f"{self.measure}.time",
                mono_ns=end,
                step=self.label,
                data={
                    "ms": (end - start) / 1e6,
                    "start_ns": start,
                    "end_ns": end,
                    "iteration": iteration,
                    "mode": self.mode,
                    "delay_ms": self.delay_s * 1000,
                },
            )
        if pending is not None:
            pending.result()

    @override
    def devices(self, plan: PlanView) -> Touches:
        return Touches(writes=frozenset(sw for p in self.phases for sw in p.apply.circuits))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        branch = node.add(escape(self.label) + f" [cyan](measure {escape(self.measure)}.time)")
        branch.add(
            f"{self.warmup} warm-up + {self.iterations} measured iterations; each change +{self.delay_s * 1000:g} ms"
        )
        for phase in self.phases:
            what = f"configuration {phase.apply.configuration}, compute {phase.compute_s * 1000:g} ms"
            sub = branch.add(escape(f"phase {phase.name}: {what}"))
            show_circuits(sub, phase.apply.circuits)
        first = self.phases[0].apply
        if first.verify_light:
            branch.add(f"verify light above {first.min_power_dbm} dBm within {first.timeout_s:g} s after each change")
