"""fabric.apply: set every switch to a named configuration, all switches at once; measure it if asked.

The planned ApplyStep is also what fabric.cycle, rail.iterate and the job's fabric execute: each switch runs
its family's `reconfigure` procedure (the smallest change to hold the circuits, other circuits on the ports the
playbook manages removed, light verified), and the spans run from the first command sent on any switch to the
last switch done: `<measure>.ack` (sent -> acknowledged), `.light` (acknowledged -> lit), `.total`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field
from rich.tree import Tree
from typing_extensions import override

from testbed.config.common import Name
from testbed.contracts.engine import StepEngine
from testbed.contracts.outcome import Outcome
from testbed.events import Op
from testbed.steps.base import CheckContext, Pair, PlanContext, Planned, PlanView, Problem, StepModel, Touches, escape

SEGMENTS = (("ack", "sent", "acked"), ("light", "acked", "lit"), ("total", "sent", "lit"))
SHOWN_CIRCUITS = 12  # per switch in the plan view; the rest is counted


class FabricApply(StepModel):
    """Set every switch to a named configuration, all switches in parallel; measure it if asked."""

    action: Literal["fabric.apply"]
    configuration: Name
    measure: Name | None = Field(None, description="span name; spans of equal name are pooled in the summary")
    verify_light: bool = True
    min_power_dbm: float = Field(-20.0, description="light is verified when every new egress reads above this")
    timeout_ms: int = Field(5000, gt=0, description="for acknowledgement and light to appear")

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        if self.configuration not in ctx.playbook.configurations:
            known = ", ".join(ctx.playbook.configurations) or "none defined"
            return [(("configuration",), f"no configuration named {self.configuration!r} (configurations: {known})")]
        return []

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        label = self.name or f"apply {self.configuration}"
        return (apply_step(ctx, self.configuration, label, self, measure=self.measure),)


def apply_step(
    ctx: PlanContext, configuration: str, label: str, step: Any, *, measure: str | None, crosstalk: bool = False
) -> ApplyStep:
    """The ApplyStep of one configuration, with `step`'s light settings (verify_light, min_power_dbm, timeout_ms)."""
    circuits = ctx.circuits[configuration]
    return ApplyStep(
        label=label,
        configuration=configuration,
        circuits=circuits,
        managed={sw: ctx.managed[sw] for sw in circuits},
        measure=measure,
        verify_light=step.verify_light,
        min_power_dbm=step.min_power_dbm,
        timeout_s=step.timeout_ms / 1000,
        crosstalk=crosstalk,
    )


@dataclass(frozen=True)
class ApplyStep(Planned):
    """One configuration put in place on every switch at once (each family's reconfigure), measured if asked."""

    configuration: str
    circuits: dict[str, tuple[Pair, ...]]  # switch -> the circuits it must hold
    managed: dict[str, tuple[int, ...]]  # switch -> ports this playbook owns (circuits on them may be removed)
    measure: str | None
    verify_light: bool
    min_power_dbm: float
    timeout_s: float
    crosstalk: bool = False

    def calls(self, engine: StepEngine) -> dict[str, tuple[str, dict[str, Any]]]:
        """The procedure each switch runs (its family's reconfigure)."""
        return {
            sw: (
                engine.operation(sw, "reconfigure"),
                {
                    "circuits": list(pairs),
                    "managed": list(self.managed[sw]),
                    "verify_light": self.verify_light,
                    "min_power_dbm": self.min_power_dbm,
                    "timeout_s": self.timeout_s,
                },
            )
            for sw, pairs in self.circuits.items()
        }

    @override
    def execute(self, engine: StepEngine) -> None:
        results = engine.call(self.calls(engine), self.label)
        self.measured(engine, list(results.values()))

    def measured(self, engine: StepEngine, results: Sequence[Outcome | None]) -> None:
        """Record the step's spans (and a chip's crosstalk) from its switches' results."""
        if self.crosstalk:
            _crosstalk(engine, self)
        if not self.measure:
            return
        answered = [r for r in results if r is not None]
        if len(answered) < len(results):
            return  # a call not run: nothing to measure (its failure is raised by the caller)
        for segment, start_mark, end_mark in SEGMENTS:
            if not all(start_mark in r.marks and end_mark in r.marks for r in answered):
                continue
            start = min(r.marks[start_mark][0] for r in answered)
            end = max(r.marks[end_mark][0] for r in answered)
            wall = min(r.marks[start_mark][1] for r in answered)
            engine.recorder.emit(
                "measure",
                f"{self.measure}.{segment}",
                mono_ns=end,
                wall=wall,
                step=self.label,
                data={"ms": (end - start) / 1e6, "start_ns": start, "end_ns": end},
            )

    @override
    def single_device(self) -> str | None:
        # A step that reads the device's ground truth after it ran cannot join a batch: the truth must be read
        # before the next step changes the device.
        if not self.crosstalk and len(self.circuits) == 1:
            return next(iter(self.circuits))
        return None

    @override
    def devices(self, plan: PlanView) -> Touches:
        return Touches(writes=frozenset(self.circuits))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        branch = node.add(escape(self.label) + (f" [cyan](measure {escape(self.measure)})" if self.measure else ""))
        show_circuits(branch, self.circuits)
        if self.verify_light:
            branch.add(f"verify light above {self.min_power_dbm} dBm within {self.timeout_s:g} s")
        if self.crosstalk:
            branch.add("record crosstalk per output port (emulated devices only)")


def job_run_touches(applies: Iterable[ApplyStep], plan: PlanView) -> Touches:
    """What a step that runs the job to its end touches: the switches of every configuration it applies (or its
    job asks for), and the job's hosts.
    """
    switches = {sw for apply in applies for sw in apply.circuits}
    return Touches(writes=frozenset(switches), reads=frozenset(plan.playbook.job.ranks))


def show_circuits(node: Tree, circuits: dict[str, tuple[Pair, ...]]) -> None:
    """Each switch's circuits under `node` in the plan view (the first few of each, the rest counted)."""
    for sw, pairs in circuits.items():
        shown = " ".join(f"{i}>{e}" for i, e in pairs[:SHOWN_CIRCUITS]) + (
            " ..." if len(pairs) > SHOWN_CIRCUITS else ""
        )
        node.add(escape(f"{sw}: {len(pairs)} circuits: {shown}"))


def _crosstalk(engine: StepEngine, step: ApplyStep) -> None:
    """Per output port of a chip: power from every other input over power from the intended one, with all
    inputs lit alike. Photodiodes alone cannot separate the two, so this needs the device's own transfer
    matrix, which only the twin has; on a real chip nothing is recorded.
    """
    if engine.ground_truth is None:
        return
    for device, pairs in step.circuits.items():
        if not engine.has_ground_truth(device):
            continue
        t = engine.ground_truth(device)
        n = len(t)
        per_port = {}
        for ingress, egress in pairs:
            row = t[egress - n - 1]
            signal = row[ingress - 1]
            leak = sum(row) - signal
            per_port[egress] = round(10 * math.log10(max(leak, 1e-30) / max(signal, 1e-30)), 2)
        engine.recorder.emit(
            "mark",
            Op.CROSSTALK,
            device=device,
            step=step.label,
            data={"source": "twin ground truth", "per_port_db": per_port},
        )
