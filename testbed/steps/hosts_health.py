"""hosts.health: identify and health-check hosts in parallel (every GPU host of the inventory unless `hosts`);
each answer is a `health` event and a row of the summary's table, and the whole check's wall time, as the
coordinator sees it (Ray included), is the `health.wall` span.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from pydantic import Field
from rich.tree import Tree
from typing_extensions import override

from testbed.config.common import Name
from testbed.contracts.engine import StepEngine
from testbed.contracts.errors import raise_failures
from testbed.events import Op
from testbed.steps.base import CheckContext, PlanContext, Planned, PlanView, Problem, StepModel, Touches, escape


class HostsHealth(StepModel):
    """Identify and health-check hosts in parallel (every GPU host of the inventory unless `hosts`)."""

    action: Literal["hosts.health"]
    hosts: list[Name] | None = None
    details: bool = Field(
        False,
        description="also read each GPU's `nvidia-smi -q -x` report and name the conditions a lab acts on (pending "
        "retired pages, remapped rows, uncorrected ECC errors, a hardware slowdown or power brake); slower",
    )

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        if ctx.inventory is None:
            return []
        hosts = ctx.inventory.hosts()
        known = ", ".join(hosts) or "none"
        return [
            (("hosts", i), f"no GPU host named {host!r} in the inventory (known: {known})")
            for i, host in enumerate(self.hosts or [])
            if host not in hosts
        ]

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        hosts = self.hosts or list(ctx.inventory.hosts())
        return (HealthStep(self.name or "health check", tuple(hosts), self.details),)


@dataclass(frozen=True)
class HealthStep(Planned):
    """The hosts' health checks, in parallel: a `health` mark per answer, and the `health.wall` span."""

    hosts: tuple[str, ...]
    details: bool = False  # each GPU's nvidia-smi -q -x report too

    @override
    def execute(self, engine: StepEngine) -> None:
        start = time.monotonic_ns()
        args = {"details": True} if self.details else {}
        results = engine.dispatch({h: [(self.label, "gpu.health", dict(args))] for h in self.hosts})
        end = time.monotonic_ns()
        engine.recorder.emit(
            "measure",
            "health.wall",
            mono_ns=end,
            wall=time.time(),
            step=self.label,
            data={"ms": (end - start) / 1e6, "start_ns": start, "end_ns": end, "hosts": len(self.hosts)},
        )
        for host, (result,) in results.items():
            if result is not None and result.status == "ok":
                engine.recorder.emit("mark", Op.HEALTH, device=host, step=self.label, data=result.value)
        raise_failures([r for (r,) in results.values()])

    @override
    def devices(self, plan: PlanView) -> Touches:
        return Touches(reads=frozenset(self.hosts))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        node.add(
            escape(
                f"{self.label}: nvidia-smi{' (and its -q -x report of each GPU)' if self.details else ''} and kernel "
                f"Xids on {len(self.hosts)} hosts: {', '.join(self.hosts)}"
            )
        )
