"""rail.train: a workload card's iterations run by the job itself, which asks the fabric service for its rails.

Where rail.iterate times a card of pauses itself, here the playbook's job (testbed-train, whose phased mode is
hostside/phased.py) runs the iterations: each phase moves real bytes to the rank's partners over the
phase's own circuits, and the rank asks the job's fabric service for them (docs/rail_train.md):
- static: the card's `static` configuration (every phase's traffic on a rail of its own) is put in place before
  the job and never changed; the ranks never ask;
- on-demand: a rank asks to `setup` each phase's configuration before its traffic and waits;
- provisioning: a rank asks to `prepare` the next phase's configuration as soon as a phase's traffic is done, so
  the switches move behind the compute, and its `setup` waits only for the rest.
A change takes the switches' own time plus `delay_ms` (the OCS delay, a sleep per change, as Opus's testbed).

Per sweep point the step starts the job (the ranks' routes and the card in TESTBED_RAIL), waits for it to end and
records each measured iteration's time as the job measured it (`iteration.time`), the time it spent waiting
for the fabric (`iteration.stall`), and per phase the bytes the job sent next to the bytes the twin's data plane
carried (`rail.bytes`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field
from typing_extensions import override

from testbed.config.common import Name, choice, sweepable
from testbed.fabric.circuits import parse_link
from testbed.steps.base import CheckContext, PlanContext, PlanError, Planned, Problem, StepModel
from testbed.steps.fabric_apply import apply_step
from testbed.steps.rail_train_job import RailTrainStep, Route, TrainPhase

MODES = ("static", "on-demand", "provisioning")


class RailTrain(StepModel):
    """Run a workload card's iterations as the job itself (testbed-train's phased mode): real bytes per phase
    over the phase's circuits, which the ranks ask the fabric service for (static, on-demand, provisioning).
    """

    needs: ClassVar[frozenset[str]] = frozenset({"job"})

    action: Literal["rail.train"]
    workload: Name
    mode: Annotated[str, choice(*MODES)]
    delay_ms: Annotated[float | str, sweepable(0, 600_000)] = 0
    iterations: int = Field(6, ge=1, le=100_000)
    warmup: int = Field(1, ge=0, le=1000, description="iterations run first and not measured")
    measure: Name = "iteration"
    message_bytes: Annotated[float | str, sweepable(8, 1 << 30)] | None = Field(
        None,
        description="a collective's message size: each phase then sends message_bytes x its `share` to each partner "
        "instead of its `bytes` (an iteration is one all-reduce)",
    )
    job_timeout_ms: int = Field(600_000, gt=0, description="for the whole job to run its iterations")

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        problems: list[Problem] = []
        workload = ctx.playbook.workloads.get(self.workload)
        if workload is None:
            known = ", ".join(ctx.playbook.workloads) or "none defined"
            problems.append((("workload",), f"no workload named {self.workload!r} (workloads: {known})"))
        elif self.mode == "static" and workload.static is None:
            problems.append((("mode",), f"mode static needs `static:` in workload {self.workload!r}"))
        job = ctx.playbook.job
        if job is not None and len(set(job.ranks)) != len(job.ranks):
            problems.append((("action",), "rail.train needs one rank per host (a phase's partner is a host)"))
        if job is not None and workload is not None:
            served = job.fabric_service.configurations if job.fabric_service is not None else []
            missing = [p.configuration for p in workload.phases if p.configuration not in served]
            if missing:
                problems.append(
                    (
                        ("workload",),
                        f"the ranks ask the job's fabric service for {', '.join(dict.fromkeys(missing))}: list them "
                        "under job.fabric_service.configurations",
                    )
                )
        for key in ("mode", "delay_ms", "message_bytes"):
            problems += ctx.sweep_ref(getattr(self, key), (key,))
        return problems

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        mode, delay = ctx.swept(self.mode), ctx.swept(self.delay_ms)
        if mode not in MODES:
            raise PlanError(f"rail.train: mode {self.mode} = {mode!r} is not static, on-demand or provisioning")
        if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
            raise PlanError(f"rail.train: delay_ms {self.delay_ms} = {delay!r} is not a duration in ms")
        message = ctx.swept(self.message_bytes)
        if message is not None:
            if not isinstance(message, int | float) or isinstance(message, bool) or message < 8:
                raise PlanError(f"rail.train: message_bytes {self.message_bytes} = {message!r} is not a size in bytes")
            message = int(message)
        card = ctx.playbook.workloads[self.workload]
        served = ctx.playbook.job.fabric_service  # its light settings for every change (check: it exists)
        hosts = list(ctx.playbook.job.ranks)
        if mode == "static" and card.static is None:
            raise PlanError(f"rail.train: mode static needs `static:` in workload {self.workload!r}")
        static = partners(ctx.playbook.configurations[card.static], hosts) if mode == "static" else None
        phases = []
        for p in card.phases:
            routes = partners(ctx.playbook.configurations[p.configuration], hosts)
            if not any(routes.values()):
                raise PlanError(
                    f"rail.train: configuration {p.configuration!r} (phase {p.name}) links none of the job's hosts "
                    f"to another: a phase's partners come from its configuration's `links`"
                )
            if static is not None:
                routes = {
                    r: tuple(_static_route(static, r, s, p.name, card.static, hosts) for s, _, _ in rs)
                    for r, rs in routes.items()
                }
            apply = apply_step(ctx, p.configuration, f"fabric service: {p.configuration}", served, measure=None)
            nbytes = p.bytes if message is None else max(8, round(message * p.share / 8) * 8)
            phases.append(TrainPhase(p.name, p.compute_ms / 1000, nbytes, apply, routes))
        first_config = card.static if mode == "static" else card.phases[0].configuration
        first = apply_step(ctx, first_config, f"{self.workload}: before the job ({first_config})", served, measure=None)
        label = self.name or f"{self.workload} {mode} (real job), +{delay:g} ms per change" + (
            f", {message} B message" if message is not None else ""
        )
        step = RailTrainStep(
            label,
            mode,
            float(delay) / 1000,
            self.iterations,
            self.warmup,
            self.measure,
            tuple(phases),
            first,
            self.job_timeout_ms / 1000,
        )
        return (step,)


def partners(configuration: Any, hosts: list[str]) -> dict[int, tuple[Route, ...]]:
    """rank -> where it sends in this configuration: every link from its host to another rank's host."""
    index = {h: i for i, h in enumerate(hosts)}
    out: dict[int, list[Route]] = {i: [] for i in range(len(hosts))}
    for text in configuration.links:
        for (a, p), (b, q) in parse_link(text):
            if a in index and b in index and a != b:
                out[index[a]].append((index[b], p, q))
    return {r: tuple(routes) for r, routes in out.items()}


def _static_route(
    static: dict[int, tuple[Route, ...]], rank: int, partner: int, phase: str, name: str, hosts: list[str]
) -> Route:
    for route in static[rank]:
        if route[0] == partner:
            return route
    raise PlanError(
        f"rail.train: the static configuration {name!r} has no link from {hosts[rank]} to {hosts[partner]}, "
        f"which phase {phase} sends over"
    )
