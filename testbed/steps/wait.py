"""wait: a pause the experiment asks for (a sweep parameter may give its length)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Literal

from rich.tree import Tree
from typing_extensions import override

from testbed.config.common import sweepable
from testbed.contracts.engine import StepEngine
from testbed.events import Op
from testbed.steps.base import CheckContext, PlanContext, PlanError, Planned, PlanView, Problem, StepModel, escape


class Wait(StepModel):
    """Pause the experiment for `ms` milliseconds (a sweep parameter may give the length)."""

    action: Literal["wait"]
    ms: Annotated[float | str, sweepable(0, 3_600_000)]

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        return ctx.sweep_ref(self.ms, ("ms",))

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        ms = ctx.swept(self.ms)
        if not isinstance(ms, int | float) or isinstance(ms, bool) or ms < 0:
            raise PlanError(f"wait: {self.ms} = {ms!r} is not a duration in ms")
        return (WaitStep(label=self.name or f"wait {ms:g} ms", seconds=float(ms) / 1000),)


@dataclass(frozen=True)
class WaitStep(Planned):
    """A pause the experiment asks for."""

    seconds: float

    @override
    def execute(self, engine: StepEngine) -> None:
        engine.recorder.emit("mark", Op.WAIT, step=self.label, data={"seconds": self.seconds})
        time.sleep(self.seconds)  # the experiment asks for this pause; it is not synchronisation

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        node.add(escape(self.label))
