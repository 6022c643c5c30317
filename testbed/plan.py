"""The planner: a pure function from playbook + inventory to a plan. No I/O, no clock, no randomness
beyond the playbook's seed. `testbed plan` prints exactly what `testbed run` will execute.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from testbed.config.inventory import Inventory, MeshDevice, OcsDevice, transport_address
from testbed.config.playbook import (
    Configuration,
    DeviceCalibrate,
    FabricApply,
    FabricClear,
    FabricCycle,
    Failover,
    FaultDetect,
    FaultInject,
    HostsHealth,
    JobMeasure,
    JobStart,
    JobStop,
    Parallel,
    Playbook,
    RailIterate,
    Wait,
)
from testbed.config.playbook import param_name as _param_name
from testbed.errors import UserError
from testbed.fabric.circuits import PathError, links_to_circuits, parse_link
from testbed.fabric.jobfabric import fabric_links, fabric_ports
from testbed.fabric.topology import all_to_all_schedule

Pair = tuple[int, int]


class PlanError(UserError):
    """The playbook cannot run on this inventory (an interlock, a missing fibre)."""


# --- resolved steps: what the coordinator executes ---------------------------------------------


@dataclass(frozen=True)
class ApplyStep:
    label: str
    configuration: str
    circuits: dict[str, tuple[Pair, ...]]  # switch -> the circuits it must hold
    managed: dict[str, tuple[int, ...]]  # switch -> ports this playbook owns (circuits on them may be removed)
    measure: str | None
    verify_light: bool
    min_power_dbm: float
    timeout_s: float
    crosstalk: bool = False


@dataclass(frozen=True)
class CalibrateStep:
    label: str
    device: str
    reuse: str | None = None


@dataclass(frozen=True)
class JobStartStep:
    label: str
    wait_steps: int
    timeout_s: float


@dataclass(frozen=True)
class JobMeasureStep:
    label: str
    steps: int
    rank: int
    measure: str
    timeout_s: float


@dataclass(frozen=True)
class JobStopStep:
    label: str


@dataclass(frozen=True)
class FaultDetectStep:
    label: str
    kind: str
    rank: int
    xid: int
    heartbeat_s: float
    stall_timeout_s: float
    timeout_s: float
    measure: str | None


@dataclass(frozen=True)
class FaultInjectStep:
    label: str
    kind: str
    rank: int
    xid: int
    duty: float
    period_s: float
    when_s: float
    duration_s: float
    device: str | None = None  # transport.*: the device whose connection the twin's fault proxy breaks
    attributes: tuple[tuple[str, float], ...] = ()  # transport.*: the toxic's attributes
    stream: str = "downstream"


@dataclass(frozen=True)
class FailoverStep(FaultDetectStep):
    """A detection followed by the failover: spare, rewiring, relaunch, first step."""


@dataclass(frozen=True)
class RailPhase:
    name: str
    compute_s: float
    apply: ApplyStep  # the rails this phase's traffic needs


@dataclass(frozen=True)
class RailIterateStep:
    label: str
    mode: str  # static, on-demand, provisioning
    delay_s: float
    iterations: int
    measure: str
    phases: tuple[RailPhase, ...]
    warmup: int = 1


@dataclass(frozen=True)
class HealthStep:
    label: str
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class ClearStep:
    label: str
    managed: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class WaitStep:
    label: str
    seconds: float


@dataclass(frozen=True)
class ParallelStep:
    label: str
    steps: tuple[PlannedStep, ...]


PlannedStep = (
    ApplyStep
    | CalibrateStep
    | ClearStep
    | WaitStep
    | ParallelStep
    | JobStartStep
    | JobStopStep
    | JobMeasureStep
    | FaultDetectStep
    | FaultInjectStep
    | FailoverStep
    | RailIterateStep
    | HealthStep
)


@dataclass(frozen=True)
class TrialPlan:
    index: int  # 0-based over the whole run
    sweep_point: dict[str, object]
    steps: tuple[PlannedStep, ...]


@dataclass(frozen=True)
class Plan:
    playbook: Playbook
    inventory: Inventory
    seed: int
    devices: tuple[str, ...]  # the devices the plan touches, in inventory order
    writes: tuple[str, ...]  # the devices the plan writes to
    setup: tuple[PlannedStep, ...]
    trials: tuple[TrialPlan, ...]
    teardown: tuple[PlannedStep, ...]
    # switch -> every port the job's fabric may use, whichever hosts (spares included) hold the ranks
    job_managed: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # switch -> the circuits of the job's fabric over the playbook's ranks (what job.start sets up)
    job_circuits: dict[str, tuple[Pair, ...]] = field(default_factory=dict)
    spares: tuple[str, ...] = ()  # hosts a failover may move a rank to

    def addresses(self) -> dict[str, str]:
        return {d: transport_address(self.inventory.devices[d].transport) for d in self.devices}

    @property
    def transport_faults(self) -> bool:
        """Whether any step breaks a connection (transport.*): the twin then needs its fault proxy."""
        steps = [*self.setup, *self.teardown, *(s for t in self.trials for s in t.steps)]
        return any(isinstance(s, FaultInjectStep) and s.device is not None for s in _flatten(steps))


def make_plan(playbook: Playbook, inventory: Inventory, *, trials: int | None = None, seed: int | None = None) -> Plan:
    n_trials = trials if trials is not None else playbook.trials
    if n_trials < 1:
        raise PlanError(f"--trials must be at least 1 (got {n_trials})")
    circuits = {name: _resolve(name, conf, inventory) for name, conf in playbook.configurations.items()}
    schedules = {}
    for name, schedule in playbook.schedules.items():
        schedules[name] = [f"{name}[{k}]" for k in range(1, len(schedule.hosts))]
        for conf_name, links in zip(schedules[name], all_to_all_schedule(schedule.hosts, schedule.port), strict=True):
            try:
                circuits[conf_name] = links_to_circuits(links, inventory)
            except PathError as exc:
                raise PlanError(f"schedule {name!r}: {exc}") from None
    managed = _managed_ports(circuits)
    _check_interlocks(circuits, managed, inventory)

    world = len(playbook.job.ranks) if playbook.job else 0
    gpu_hosts = tuple(n for n, d in inventory.devices.items() if d.kind == "gpu_host")

    def resolve_steps(steps, point, trial: int = -1) -> tuple[PlannedStep, ...]:
        # rank:random is drawn per trial from the seed, so a run repeats exactly.
        rng = random.Random(f"{seed if seed is not None else playbook.seed}:{trial}")
        ctx = _StepContext(
            point, circuits, managed, schedules, world, rng, gpu_hosts, playbook.workloads, tuple(inventory.devices)
        )
        return tuple(p for s in steps for p in _resolve_step(s, ctx))

    points = _sweep_points(playbook.sweep)
    trial_plans = []
    for point in points:
        for _ in range(n_trials):
            index = len(trial_plans)
            trial_plans.append(TrialPlan(index, point, resolve_steps(playbook.steps, point, index)))
            _check_concurrent_faults(trial_plans[-1].steps, playbook.max_concurrent_faults, f"trial {index}")
    calibrated = {
        s.device
        for section in (playbook.setup, playbook.steps, playbook.teardown)
        for s in _flatten(section)
        if isinstance(s, DeviceCalibrate)
    }
    for device in calibrated:
        if inventory.devices[device].read_only:
            raise PlanError(f"interlock: {device} is read-only in the inventory, but the playbook calibrates it")
    job_hosts = set(playbook.job.ranks) if playbook.job else set()
    job_managed, job_circuits, spares = {}, {}, ()
    if playbook.job is not None and playbook.job.fabric is not None:
        if any(isinstance(s, Failover) for sec in (playbook.setup, playbook.steps) for s in _flatten(sec)):
            spares = tuple(playbook.job.spares if playbook.job.spares is not None else inventory.spares)
            job_hosts |= set(spares)  # a failover may move a rank to any spare
        job_managed = _job_managed(playbook, inventory, job_hosts)
        _check_interlocks({"job": {}}, job_managed, inventory)
        if len(set(playbook.job.ranks)) == len(playbook.job.ranks):  # else job.start refuses, saying why
            try:
                job_circuits = links_to_circuits(fabric_links(playbook.job.fabric, list(playbook.job.ranks)), inventory)
            except PathError as exc:
                raise PlanError(f"job fabric: {exc}") from None
    checked = {
        h
        for section in (playbook.setup, playbook.steps, playbook.teardown)
        for step in _flatten(section)
        if isinstance(step, HostsHealth)
        for h in (step.hosts or gpu_hosts)
    }
    order = list(inventory.devices).index
    writes = {sw for conf in circuits.values() for sw in conf} | calibrated | job_hosts | set(job_managed)
    faulted = {  # a connection the twin's fault proxy breaks: its device must be in the twin
        s.device
        for t in trial_plans
        for s in _flatten(t.steps)
        if isinstance(s, FaultInjectStep) and s.device is not None
    }
    touched = sorted(writes | checked | faulted, key=order)
    return Plan(
        playbook=playbook,
        inventory=inventory,
        seed=playbook.seed if seed is None else seed,
        devices=tuple(touched),
        writes=tuple(sorted(writes, key=order)),
        setup=resolve_steps(playbook.setup, points[0]),
        trials=tuple(trial_plans),
        teardown=resolve_steps(playbook.teardown, points[-1]),
        job_managed=job_managed,
        job_circuits=job_circuits,
        spares=spares,
    )


FAULT_STEPS = (FaultInjectStep, FaultDetectStep)  # FailoverStep is a FaultDetectStep


def _check_concurrent_faults(steps, limit: int, where: str) -> None:
    """Interlock: faults in one `parallel` step are active together; sequential ones are healed in between."""
    for s in steps:
        if isinstance(s, ParallelStep):
            faults = [f for f in _flatten(s.steps) if isinstance(f, FAULT_STEPS)]
            if len(faults) > limit:
                raise PlanError(
                    f"interlock: {where}, step {s.label!r} would have {len(faults)} faults active at once "
                    f"({', '.join(f.label for f in faults)}); the playbook allows max_concurrent_faults: {limit}. "
                    "Raise it if that is intended."
                )


def _job_managed(playbook: Playbook, inv: Inventory, hosts: set[str]) -> dict[str, tuple[int, ...]]:
    ports = fabric_ports(playbook.job.fabric)
    managed: dict[str, set[int]] = {}
    for host in hosts:
        for port in ports:
            fibre = inv.fibre_of(host, port)
            if fibre is None:
                raise PlanError(f"job fabric: {host}:{port} has no fibre in the inventory's fibre map")
            managed.setdefault(fibre.switch, set()).update((fibre.ingress, fibre.egress))
    return {sw: tuple(sorted(p)) for sw, p in managed.items()}


def _flatten(steps):
    """Every step, and the steps nested in `parallel` ones (of a playbook or of a plan)."""
    for step in steps:
        yield step
        if isinstance(step, Parallel | ParallelStep):
            yield from _flatten(step.steps)


def _sweep_points(sweep: dict[str, list]) -> list[dict[str, object]]:
    if not sweep:
        return [{}]
    keys = list(sweep)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(sweep[k] for k in keys))]


def _resolve(name: str, conf: Configuration, inv: Inventory) -> dict[str, tuple[Pair, ...]]:
    """Links and raw circuits -> circuits per switch, through the fibre map."""
    links = [link for text in conf.links for link in parse_link(text)]
    try:
        out = {sw: set(pairs) for sw, pairs in links_to_circuits(links, inv).items()}
    except PathError as exc:
        raise PlanError(f"configuration {name!r}: {exc}") from None
    for sw, pairs in conf.circuits.items():
        out.setdefault(sw, set()).update(tuple(p) for p in pairs)
    for sw, pairs in out.items():
        for index, what in ((0, "ingress"), (1, "egress")):
            ports = [p[index] for p in pairs]
            dup = sorted({p for p in ports if ports.count(p) > 1})
            if dup:
                raise PlanError(
                    f"configuration {name!r} uses {what} port(s) {dup} of {sw} twice; a port carries one circuit"
                )
    return {sw: tuple(sorted(pairs)) for sw, pairs in out.items()}


def _managed_ports(circuits: dict[str, dict[str, tuple[Pair, ...]]]) -> dict[str, tuple[int, ...]]:
    ports: dict[str, set[int]] = {}
    for conf in circuits.values():
        for sw, pairs in conf.items():
            ports.setdefault(sw, set()).update(p for pair in pairs for p in pair)
    return {sw: tuple(sorted(p)) for sw, p in ports.items()}


def _check_interlocks(circuits, managed, inv: Inventory) -> None:
    problems = []
    for sw, ports in managed.items():
        dev = inv.devices[sw]
        if not isinstance(dev, OcsDevice | MeshDevice):
            problems.append(f"{sw} is a {dev.kind}, not a switch")
            continue
        if dev.read_only:
            problems.append(f"{sw} is read-only in the inventory, but the playbook sets circuits on it")
        if isinstance(dev, OcsDevice):
            bad = [p for p in ports if not dev.port_allowed(p)]
            if bad:
                problems.append(
                    f"the playbook would touch port(s) {bad} of {sw}, which the inventory reserves or "
                    "does not allow (allowed_ports / reserved_ports)"
                )
    if problems:
        raise PlanError("interlock: " + "; ".join(problems))


@dataclass
class _StepContext:
    point: dict
    circuits: dict
    managed: dict
    schedules: dict
    world: int
    rng: random.Random
    gpu_hosts: tuple[str, ...]
    workloads: dict
    devices: tuple[str, ...] = ()


def _draw(choice, ctx: _StepContext):
    """A value, or one drawn from a list with the trial's seeded generator."""
    return ctx.rng.choice(choice) if isinstance(choice, list) else choice


def _transport_fault(step: FaultInject, kind: str, ctx: _StepContext) -> FaultInjectStep:
    from emulators.proxy.toxics import SCHEMA

    device = _draw(step.fault.device, ctx)
    if device not in ctx.devices:
        raise PlanError(f"fault.inject: {kind} on {device!r}: no such device in the inventory")
    known = SCHEMA.get(kind.removeprefix("transport."), {})
    attributes = tuple(sorted((k, v) for k, v in step.fault.attributes.items() if k in known))
    return FaultInjectStep(
        step.name or f"{kind} on {device}",
        kind,
        -1,
        0,
        0.0,
        0.0,
        step.when_ms / 1000,
        step.duration_ms / 1000,
        device=device,
        attributes=attributes,
        stream=step.fault.stream,
    )


def _target_rank(target: str, ctx: _StepContext) -> int:
    """rank:N, or rank:random drawn from the trial's seeded generator."""
    which = target.split(":")[1]
    return ctx.rng.randrange(ctx.world) if which == "random" else int(which)


def _resolve_step(step, ctx: _StepContext) -> tuple[PlannedStep, ...]:
    """A playbook step as the steps the coordinator executes (a cycle becomes one apply per configuration)."""
    point, circuits, managed, schedules = ctx.point, ctx.circuits, ctx.managed, ctx.schedules
    if isinstance(step, JobStart):
        return (JobStartStep(step.name or "start job", step.wait_steps, step.timeout_ms / 1000),)
    if isinstance(step, JobMeasure):
        return (
            JobMeasureStep(
                step.name or f"time {step.steps} steps", step.steps, step.rank, step.measure, step.timeout_ms / 1000
            ),
        )
    if isinstance(step, JobStop):
        return (JobStopStep(step.name or "stop job"),)
    if isinstance(step, FaultDetect | Failover):
        kind = _draw(step.fault.kind, ctx)
        if kind.startswith("transport."):
            raise PlanError(f"{step.action}: {kind} breaks a connection, not a rank; use it in a fault.inject step")
        step = step.model_copy(update={"fault": step.fault.model_copy(update={"kind": kind})})
        rank = _target_rank(step.fault.target, ctx)
        failover = isinstance(step, Failover)
        label = (
            f"failover: {step.fault.kind} on rank {rank}" if failover else f"{step.fault.kind} on rank {rank}, detect"
        )
        return (
            (FailoverStep if failover else FaultDetectStep)(
                step.name or label,
                step.fault.kind,
                rank,
                step.fault.xid,
                step.heartbeat_ms / 1000,
                step.stall_timeout_ms / 1000,
                step.timeout_ms / 1000,
                step.measure,
            ),
        )
    if isinstance(step, FaultInject):
        f = step.fault
        kind = _draw(f.kind, ctx)
        if kind.startswith("transport."):
            return (_transport_fault(step, kind, ctx),)
        f = f.model_copy(update={"kind": kind})
        rank = _target_rank(f.target, ctx)
        duty = ctx.point[_param_name(f.duty)] if isinstance(f.duty, str) else f.duty
        if not isinstance(duty, int | float) or isinstance(duty, bool) or not 0 < duty < 1:
            raise PlanError(f"fault.inject: duty {f.duty} = {duty!r} is not a fraction between 0 and 1")
        return (
            FaultInjectStep(
                step.name or f"{f.kind} on rank {rank}" + (f", duty {duty:g}" if f.kind == "host.straggle" else ""),
                f.kind,
                rank,
                f.xid,
                float(duty),
                f.period_ms / 1000,
                step.when_ms / 1000,
                step.duration_ms / 1000,
            ),
        )
    if isinstance(step, RailIterate):
        mode = ctx.point[_param_name(step.mode)] if step.mode.startswith("${") else step.mode
        delay = ctx.point[_param_name(step.delay_ms)] if isinstance(step.delay_ms, str) else step.delay_ms
        if mode not in ("static", "on-demand", "provisioning"):
            raise PlanError(f"rail.iterate: mode {step.mode} = {mode!r} is not static, on-demand or provisioning")
        if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
            raise PlanError(f"rail.iterate: delay_ms {step.delay_ms} = {delay!r} is not a duration in ms")
        phases = tuple(
            RailPhase(
                p.name,
                p.compute_ms / 1000,
                ApplyStep(
                    label=f"{step.workload}: {p.name}",
                    configuration=p.configuration,
                    circuits=circuits[p.configuration],
                    managed={sw: managed[sw] for sw in circuits[p.configuration]},
                    measure=None,
                    verify_light=step.verify_light,
                    min_power_dbm=step.min_power_dbm,
                    timeout_s=step.timeout_ms / 1000,
                ),
            )
            for p in ctx.workloads[step.workload].phases
        )
        label = step.name or f"{step.workload} {mode}, +{delay:g} ms per change"
        return (RailIterateStep(label, mode, float(delay) / 1000, step.iterations, step.measure, phases, step.warmup),)
    if isinstance(step, HostsHealth):
        return (HealthStep(step.name or "health check", tuple(step.hosts or ctx.gpu_hosts)),)
    if isinstance(step, FabricApply | FabricCycle):
        names = [step.configuration] if isinstance(step, FabricApply) else schedules[step.schedule]
        return tuple(
            ApplyStep(
                label=step.name if step.name and isinstance(step, FabricApply) else f"apply {name}",
                configuration=name,
                circuits=circuits[name],
                managed={sw: managed[sw] for sw in circuits[name]},
                measure=step.measure,
                verify_light=step.verify_light,
                min_power_dbm=step.min_power_dbm,
                timeout_s=step.timeout_ms / 1000,
                crosstalk=getattr(step, "crosstalk", False),
            )
            for name in names
        )
    if isinstance(step, DeviceCalibrate):
        return (CalibrateStep(label=step.name or f"calibrate {step.device}", device=step.device, reuse=step.reuse),)
    if isinstance(step, FabricClear):
        return (ClearStep(label=step.name or "clear fabric", managed=dict(managed)),)
    if isinstance(step, Wait):
        ms = point[_param_name(step.ms)] if isinstance(step.ms, str) else step.ms
        if not isinstance(ms, int | float) or isinstance(ms, bool) or ms < 0:
            raise PlanError(f"wait: {step.ms} = {ms!r} is not a duration in ms")
        return (WaitStep(label=step.name or f"wait {ms:g} ms", seconds=float(ms) / 1000),)
    if isinstance(step, Parallel):
        if any(isinstance(s, FabricCycle) for s in step.steps):
            raise PlanError("fabric.cycle is a sequence of changes and cannot run inside `parallel`")
        inner = tuple(p for s in step.steps for p in _resolve_step(s, ctx))
        return (ParallelStep(label=step.name or f"parallel ({len(inner)} steps)", steps=inner),)
    raise TypeError(f"unplannable step {step!r}")  # a new step type without a planner case
