"""fault.inject: inject a fault after `when_ms`, keep it for `duration_ms`, then heal it; the trial goes on
after (the job's own reaction is what the playbook measures, e.g. a straggler's cost per iteration).

A fault on a rank hits the job's rank (drawn from the seed for rank:random); a fault on a connection
(transport.*) breaks the link between the framework and a device through the twin's fault proxy; a fault on
ports (link.down) takes a switch's ports out of service through the switch's own procedures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field
from rich.tree import Tree
from typing_extensions import override

from testbed.contracts.engine import StepEngine
from testbed.families import family_of
from testbed.faults import FAULT_KINDS, ConnectionTarget, RankTarget, recording
from testbed.faults.link import DISABLE, ENABLE, PortTarget, interlock_problems, link_ports, port_problems
from testbed.faults.model import Fault
from testbed.steps.base import (
    CheckContext,
    Key,
    PlanContext,
    PlanError,
    Planned,
    PlanView,
    Problem,
    StepModel,
    Touches,
    escape,
)
from testbed.steps.job_start import needs_job


def describe_fault(kind: str, params: dict[str, Any]) -> str:
    """The details of a fault the plan shows after its kind (the kind says which: ", Xid 79")."""
    describe = getattr(FAULT_KINDS.get(kind), "describe", None)
    return str(describe(params)) if describe is not None else ""


def check_fault(step: Any, ctx: CheckContext) -> list[Problem]:
    """A fault's references: its sweep parameters, its rank, the job it needs (`step`: a model with a `fault:`,
    fault.inject, fault.detect or failover).
    """
    problems = ctx.sweep_ref(step.fault.duty, ("fault", "duty"))
    on_ranks = [k for k in step.fault.kinds() if FAULT_KINDS.get(k).target == "rank"]
    if on_ranks and ctx.playbook.job is None:
        problems += needs_job(step, ctx)
    elif on_ranks and step.fault.target != "rank:random":
        rank, world = int(step.fault.target.split(":")[1]), len(ctx.playbook.job.ranks)
        if rank >= world:
            problems.append(
                (("fault", "target"), f"rank {rank} does not exist: the job has {world} ranks (0..{world - 1})")
            )
    if ctx.inventory is not None and any(FAULT_KINDS.get(k).target == "ports" for k in step.fault.kinds()):
        problems += _port_target_problems(step.fault, ctx.inventory)
    return problems


def _operation(dev: Any, name: str) -> str | None:
    """The procedure of the device's family for a generic operation, None if it has none."""
    return family_of(dev).operation(name)


def _port_target_problems(fault: Any, inventory: Any) -> list[Problem]:
    """link.down's link (each one of a list) has a fibre, on a switch whose family can disable its ports (`fault`: a
    validated Fault of a ports kind, with `device` and `ports`, or `link`, one or a list).
    """
    if fault.ports is not None:
        where: Key = ("fault", "ports") if fault.device in inventory.devices else ("fault", "device")
        return [(where, m) for m in port_problems(inventory, fault.device, fault.ports, _operation)]
    links = fault.link if isinstance(fault.link, list) else [fault.link]
    problems: list[Problem] = []
    for j, link in enumerate(links):
        key: Key = ("fault", "link", j) if isinstance(fault.link, list) else ("fault", "link")
        try:
            switch, ports = link_ports(inventory, link)
        except LookupError as exc:
            problems.append((key, str(exc)))
            continue
        problems += [(key, f"{link}: {m}") for m in port_problems(inventory, switch, list(ports), _operation)]
    return problems


def plan_port_target(kind: str, fault: Any, ctx: PlanContext) -> PortTarget:
    """The switch ports a link.down disables this trial (its link drawn from a list), refused by the
    inventory's interlocks as the planner refuses any write (the switch's actor checks them again).
    """
    link = ctx.draw(fault.link) if fault.link is not None else None
    try:
        switch, ports = link_ports(ctx.inventory, link) if link is not None else (fault.device, fault.ports)
    except LookupError as exc:
        raise PlanError(f"fault.inject: {kind}: {exc}") from None
    ports = tuple(sorted(set(ports)))
    problems = port_problems(ctx.inventory, switch, list(ports), _operation)
    if problems:
        raise PlanError(f"fault.inject: {kind}: {'; '.join(problems)}")
    problems = interlock_problems(ctx.inventory, switch, list(ports))
    if problems:
        raise PlanError("interlock: " + "; ".join(problems))
    dev = ctx.inventory.devices[switch]
    disable, enable = _operation(dev, DISABLE), _operation(dev, ENABLE)
    if disable is None or enable is None:  # port_problems refuses such a switch; say so rather than fail later
        raise PlanError(f"fault.inject: {kind}: {switch}'s family cannot disable and enable ports")
    return PortTarget(switch, ports, link, disable, enable)


class FaultInject(StepModel):
    """Inject a fault, keep it for `duration_ms`, then heal it (a step of its own: the trial goes on after)."""

    action: Literal["fault.inject"]
    fault: Fault
    when_ms: float = Field(0, ge=0, description="wait this long after the step starts")
    duration_ms: float = Field(1000, ge=0)

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        return check_fault(self, ctx)

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        f = self.fault
        kind = ctx.draw(f.kind)
        when_s, duration_s = self.when_ms / 1000, self.duration_ms / 1000
        if FAULT_KINDS.get(kind).target == "ports":
            target = plan_port_target(kind, f, ctx)
            label = self.name or f"{kind} on {target.name}"
            return (FaultInjectStep(label, kind, -1, 0, 0.0, 0.0, when_s, duration_s, ports=target),)
        if FAULT_KINDS.get(kind).target == "connection":
            device = ctx.draw(f.device)
            if device not in ctx.inventory.devices:
                raise PlanError(f"fault.inject: {kind} on {device!r}: no such device in the inventory")
            known = getattr(FAULT_KINDS.get(kind), "attributes", ())  # a connection kind's toxic attributes
            attributes = tuple(sorted((k, v) for k, v in f.attributes.items() if k in known))
            label = self.name or f"{kind} on {device}"
            return (FaultInjectStep(label, kind, -1, 0, 0.0, 0.0, when_s, duration_s, device, attributes, f.stream),)
        rank = ctx.target_rank(f.target)
        duty = ctx.swept(f.duty)
        if not isinstance(duty, int | float) or isinstance(duty, bool) or not 0 < duty < 1:
            raise PlanError(f"fault.inject: duty {f.duty} = {duty!r} is not a fraction between 0 and 1")
        label = self.name or f"{kind} on rank {rank}" + (f", duty {duty:g}" if kind == "host.straggle" else "")
        return (FaultInjectStep(label, kind, rank, f.xid, float(duty), f.period_ms / 1000, when_s, duration_s),)


@dataclass(frozen=True)
class FaultInjectStep(Planned):
    """A fault on a rank, a device's connection or a switch's ports, held for its duration, then healed."""

    kind: str
    rank: int
    xid: int
    duty: float
    period_s: float
    when_s: float
    duration_s: float
    device: str | None = None  # a fault on a connection: the device behind the twin's fault proxy
    attributes: tuple[tuple[str, int], ...] = ()  # a fault on a connection: the toxic's attributes (integers)
    stream: str = "downstream"
    ports: PortTarget | None = None  # a fault on switch ports (link.down): which, and the family's procedures
    faults: ClassVar[int] = 1

    @override
    def execute(self, engine: StepEngine) -> None:
        with engine.fault_budget.hold(self.label):
            if self.device is not None:
                self._on_connection(engine, self.device)
            elif self.ports is not None:
                self._on_ports(engine, self.ports)
            else:
                self._on_rank(engine)

    def _on_ports(self, engine: StepEngine, target: PortTarget) -> None:
        data = {
            "fault": f"{self.kind}@{target.name}",
            "kind": self.kind,
            "device": target.device,
            "ports": list(target.ports),
            **({"link": target.link} if target.link else {}),
            "duration_s": self.duration_s,
        }
        self._hold(engine, target, target.device, data)

    def _on_connection(self, engine: StepEngine, device: str) -> None:
        toxic = f"{self.kind.removeprefix('transport.')}-{engine.next_fault_number()}"
        target = ConnectionTarget(device, toxic, self.stream, self.attributes)
        data = {
            "fault": f"{self.kind}@{device}",
            "kind": self.kind,
            "device": device,
            "toxic": toxic,
            "stream": self.stream,
            "attributes": dict(self.attributes),
            "duration_s": self.duration_s,
        }
        self._hold(engine, target, device, data)

    def _on_rank(self, engine: StepEngine) -> None:
        jobs = engine.require_jobs(self.label)
        jobs.require_running(self.label)
        r = jobs.ranks[self.rank]
        params = {"xid": self.xid, "duty": self.duty, "period_s": self.period_s}
        target = RankTarget(r.index, r.host, r.local, dict(jobs.handles[r.index]), params)
        data = {**jobs.fault_data(self.kind, r), "duration_s": self.duration_s}
        self._hold(engine, target, r.host, data)

    def _hold(self, engine: StepEngine, target: Any, device: str, data: dict[str, Any]) -> None:
        if self.when_s:
            engine.stopping.wait(self.when_s)  # the playbook's schedule for the fault, not synchronisation
        with recording.held(engine, self.kind, target, self.label, device, data):
            # How long the playbook keeps the fault (part of the experiment); an abort cuts it short.
            engine.stopping.wait(self.duration_s)

    @override
    def devices(self, plan: PlanView) -> Touches:
        if self.device is not None:
            return Touches(reads=frozenset({self.device}))
        if self.ports is not None:
            return Touches(writes=frozenset({self.ports.device}))
        return Touches(writes=frozenset({plan.playbook.job.ranks[self.rank]}))

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        branch = node.add(escape(self.label))
        if self.device is not None:
            attributes = ", ".join(f"{k}={v:g}" for k, v in self.attributes)
            what = (
                f"{self.kind} on {self.device}'s connection ({self.stream}"
                + (f"; {attributes}" if attributes else "")
                + ")"
            )
        elif self.ports is not None:
            p = self.ports
            what = (
                f"{self.kind}"
                + (f" on {p.link}" if p.link else "")
                + describe_fault(self.kind, {"device": p.device, "ports": list(p.ports)})
            )
        else:
            what = f"{self.kind} on rank {self.rank} ({plan.playbook.job.ranks[self.rank]})" + describe_fault(
                self.kind, {"xid": self.xid, "duty": self.duty, "period_s": self.period_s}
            )
        branch.add(escape(f"after {self.when_s * 1000:g} ms: {what}, for {self.duration_s * 1000:g} ms, then heal"))
