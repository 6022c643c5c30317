"""The planner: a pure function from playbook + inventory to a plan. No I/O, no clock, no randomness beyond the
playbook's seed. `testbed plan` prints exactly what `testbed run` will execute.

The planner resolves what spans the playbook (every configuration's circuits, the ports the run manages, the
interlocks, the sweep points, the job's fabric); each step kind plans its own steps (testbed/steps).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace

from testbed.config.device import SwitchConfig
from testbed.config.sections import Configuration, JobFabric
from testbed.documents.inventory import Inventory
from testbed.documents.playbook import Playbook
from testbed.fabric.circuits import PathError, links_to_circuits, parse_link
from testbed.fabric.jobfabric import fabric_links, fabric_ports
from testbed.fabric.topology import all_to_all_schedule
from testbed.steps import ApplyStep, FaultInjectStep, PlanContext, PlanError, Planned, walk
from testbed.steps.fabric_apply import apply_step

Pair = tuple[int, int]

__all__ = ["Plan", "PlanError", "TrialPlan", "make_plan"]


@dataclass(frozen=True)
class TrialPlan:
    index: int  # 0-based over the whole run
    sweep_point: dict[str, object]
    steps: tuple[Planned, ...]


@dataclass(frozen=True)
class Plan:
    playbook: Playbook
    inventory: Inventory
    seed: int
    devices: tuple[str, ...]  # the devices the plan touches, in inventory order
    writes: tuple[str, ...]  # the devices the plan writes to
    setup: tuple[Planned, ...]
    trials: tuple[TrialPlan, ...]
    teardown: tuple[Planned, ...]
    # switch -> every port the job's fabric may use, whichever hosts (spares included) hold the ranks
    job_managed: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # switch -> the circuits of the job's fabric over the playbook's ranks (what job.start sets up)
    job_circuits: dict[str, tuple[Pair, ...]] = field(default_factory=dict)
    spares: tuple[str, ...] = ()  # hosts a failover may move a rank to
    # configuration -> how the job's fabric service applies it when a rank asks (job.fabric_service)
    fabric_service: dict[str, ApplyStep] = field(default_factory=dict)

    def addresses(self) -> dict[str, str]:
        return {d: self.inventory.devices[d].transport.address() for d in self.devices}

    def all_steps(self) -> list[Planned]:
        """Every planned step of the run, nested ones included."""
        return list(walk([*self.setup, *self.teardown, *(s for t in self.trials for s in t.steps)]))

    @property
    def transport_faults(self) -> bool:
        """Whether any step breaks a connection (transport.*): the twin then needs its fault proxy."""
        return any(isinstance(s, FaultInjectStep) and s.device is not None for s in self.all_steps())

    def managed(self) -> dict[str, set[int]]:
        """Every port the run may change on each switch: its configurations' and its job fabric's."""
        ports: dict[str, set[int]] = {sw: set(p) for sw, p in self.job_managed.items()}
        for step in [*self.all_steps(), *self.fabric_service.values()]:
            for apply in _applies(step):
                for sw, p in apply.managed.items():
                    ports.setdefault(sw, set()).update(p)
        return ports


def _applies(step):
    """The fabric changes a step makes (its own, or its phases')."""
    if hasattr(step, "managed") and isinstance(step.managed, dict):
        yield step
    for phase in getattr(step, "phases", ()):
        yield phase.apply


def make_plan(playbook: Playbook, inventory: Inventory, *, trials: int | None = None, seed: int | None = None) -> Plan:
    n_trials = trials if trials is not None else playbook.trials
    if n_trials < 1:
        raise PlanError(f"--trials must be at least 1 (got {n_trials})")
    seed = playbook.seed if seed is None else seed
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
    _check_interlocks(managed, inventory)

    def resolve_steps(steps, point, trial: int = -1) -> tuple[Planned, ...]:
        # rank:random is drawn per trial from the seed, so a run repeats exactly.
        ctx = PlanContext(playbook, inventory, point, random.Random(f"{seed}:{trial}"), circuits, managed, schedules)
        return tuple(p for s in steps for p in s.plan(ctx))

    points = _sweep_points(playbook.sweep)
    trial_plans: list[TrialPlan] = []
    for point in points:
        for _ in range(n_trials):
            index = len(trial_plans)
            trial_plans.append(TrialPlan(index, point, resolve_steps(playbook.steps, point, index)))
            _check_concurrent_faults(trial_plans[-1].steps, playbook.max_concurrent_faults, f"trial {index}")

    job_hosts = set(playbook.job.ranks) if playbook.job else set()
    job_managed, job_circuits = {}, {}
    spares: tuple[str, ...] = ()
    if playbook.job is not None and playbook.job.fabric is not None:
        if any(s.action == "failover" for sec in (playbook.setup, playbook.steps) for s in walk(sec)):
            spares = tuple(playbook.job.spares if playbook.job.spares is not None else inventory.spares)
            job_hosts |= set(spares)  # a failover may move a rank to any spare
        job_managed = _job_managed(playbook.job.fabric, inventory, job_hosts)
        _check_interlocks(job_managed, inventory)
        if len(set(playbook.job.ranks)) == len(playbook.job.ranks):  # else job.start refuses, saying why
            try:
                job_circuits = links_to_circuits(fabric_links(playbook.job.fabric, list(playbook.job.ranks)), inventory)
            except PathError as exc:
                raise PlanError(f"job fabric: {exc}") from None
    fabric_service = {}
    if playbook.job is not None and playbook.job.fabric_service is not None:
        served = playbook.job.fabric_service
        ctx = PlanContext(playbook, inventory, points[0], random.Random(seed), circuits, managed, schedules)
        for name in dict.fromkeys(served.configurations):
            if name not in circuits:
                raise PlanError(f"job.fabric_service: no configuration named {name!r}")
            fabric_service[name] = apply_step(ctx, name, f"fabric service: {name}", served, measure=None)
    plan = Plan(
        playbook=playbook,
        inventory=inventory,
        seed=seed,
        devices=(),
        writes=(),
        setup=resolve_steps(playbook.setup, points[0]),
        trials=tuple(trial_plans),
        teardown=resolve_steps(playbook.teardown, points[-1]),
        job_managed=job_managed,
        job_circuits=job_circuits,
        spares=spares,
        fabric_service=fabric_service,
    )
    # What the run touches: what each step says it reads and writes, and the job's hosts and fabric.
    writes = job_hosts | set(job_managed) | {sw for conf in circuits.values() for sw in conf}
    reads: set[str] = set()
    for step in plan.all_steps():
        touched = step.devices(plan)
        writes |= touched.writes
        reads |= touched.reads
    order = list(inventory.devices).index
    return replace(plan, devices=tuple(sorted(writes | reads, key=order)), writes=tuple(sorted(writes, key=order)))


def _check_concurrent_faults(steps, limit: int, where: str) -> None:
    """Interlock: faults in one `parallel` step are active together; sequential ones are healed in between."""
    for s in steps:
        if s.faults > limit:
            faulty = [f.label for f in walk(s.nested()) if f.faults]
            raise PlanError(
                f"interlock: {where}, step {s.label!r} would have {s.faults} faults active at once "
                f"({', '.join(faulty)}); the playbook allows max_concurrent_faults: {limit}. "
                "Raise it if that is intended."
            )


def _job_managed(fabric: JobFabric, inv: Inventory, hosts: set[str]) -> dict[str, tuple[int, ...]]:
    ports = fabric_ports(fabric)
    managed: dict[str, set[int]] = {}
    for host in hosts:
        for port in ports:
            fibre = inv.fibre_of(host, port)
            if fibre is None:
                raise PlanError(f"job fabric: {host}:{port} has no fibre in the inventory's fibre map")
            managed.setdefault(fibre.switch, set()).update((fibre.ingress, fibre.egress))
    return {sw: tuple(sorted(p)) for sw, p in managed.items()}


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
    for sw, raw in conf.circuits.items():
        out.setdefault(sw, set()).update((ingress, egress) for ingress, egress in raw)
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


def _check_interlocks(managed: dict[str, tuple[int, ...]], inv: Inventory) -> None:
    problems = []
    for sw, ports in managed.items():
        dev = inv.devices[sw]
        if not isinstance(dev, SwitchConfig):
            problems.append(f"{sw} is a {dev.kind}, not a switch")
            continue
        problems += dev.write_problems(sw, ports, "the playbook sets circuits on it", "the playbook", "touch")
    if problems:
        raise PlanError("interlock: " + "; ".join(problems))
