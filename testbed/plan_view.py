"""`testbed plan`: the plan as a rich tree, every step `run` will execute with the devices it drives. Reads the
plan only; touches no device."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from testbed.plan import (
    ApplyStep,
    CalibrateStep,
    ClearStep,
    FailoverStep,
    FaultDetectStep,
    FaultInjectStep,
    HealthStep,
    JobMeasureStep,
    JobStartStep,
    JobStopStep,
    ParallelStep,
    Plan,
    PlannedStep,
    RailIterateStep,
    WaitStep,
)

SHOWN_CIRCUITS = 12  # per switch and step; the rest is counted


def print_plan(console: Console, plan: Plan, inventory_file: str) -> None:
    pb = plan.playbook
    root = Tree(
        f"[bold]{escape(pb.name)}[/] on {escape(plan.inventory.name)} ({escape(inventory_file)}), seed {plan.seed}"
    )
    devices = root.add("devices")
    addresses = plan.addresses()
    for name in plan.devices:
        dev = plan.inventory.devices[name]
        writes = "writes" if name in plan.writes else "reads"
        pin = f", node {dev.node}" if dev.node else ""
        devices.add(escape(f"{name}: {dev.kind} via {dev.driver} at {addresses[name]} ({writes}{pin})"))
    if pb.job is not None:
        _job(root, plan)
    for title, steps in (
        ("setup (once)", plan.setup),
        ("teardown (once, also after a failure or Ctrl-C)", plan.teardown),
    ):
        if steps:
            _steps(root.add(title), steps, plan)
    # Trials whose steps are the same are shown once; a trial whose steps differ (a rank or fault drawn
    # from the seed) gets its own branch, so every step of every trial is on screen.
    groups: list[tuple[dict, tuple, list[int]]] = []
    for trial in plan.trials:
        if groups and groups[-1][0] == trial.sweep_point and groups[-1][1] == trial.steps:
            groups[-1][2].append(trial.index)
        else:
            groups.append((trial.sweep_point, trial.steps, [trial.index]))
    for point, steps, indices in groups:
        label = ", ".join(f"{k}={v}" for k, v in point.items())
        which = f"trial {indices[0]}" if len(indices) == 1 else f"trials {indices[0]}..{indices[-1]} ({len(indices)})"
        _steps(root.add(escape(which + (f" with {label}" if label else ""))), steps, plan)
    console.print(root)
    console.print(f"{len(plan.trials)} trials; interlocks checked; no device was contacted.")


def _job(root: Tree, plan: Plan) -> None:
    job = plan.playbook.job
    node = root.add(escape(f"job: {' '.join(job.command)}"))
    node.add(escape("ranks: " + ", ".join(f"{r}:{h}" for r, h in enumerate(job.ranks))))
    if job.fabric is not None:
        f = job.fabric
        fabric = node.add(
            escape(f"fabric: {f.topology} on {f.port}" + (f" <-> {f.reverse_port}" if f.reverse_port else ""))
        )
        _circuits(fabric, plan.job_circuits)
        if f.verify_light:
            fabric.add(f"verify light above {f.min_power_dbm} dBm within {f.light_timeout_ms / 1000:g} s")
    if plan.spares:
        node.add(escape(f"spares a failover may use: {', '.join(plan.spares)}"))


def _circuits(node: Tree, circuits: dict) -> None:
    for sw, pairs in circuits.items():
        shown = " ".join(f"{i}>{e}" for i, e in pairs[:SHOWN_CIRCUITS]) + (
            " ..." if len(pairs) > SHOWN_CIRCUITS else ""
        )
        node.add(escape(f"{sw}: {len(pairs)} circuits: {shown}"))


def _rank(plan: Plan, rank: int) -> str:
    job = plan.playbook.job
    return f"rank {rank} ({job.ranks[rank]})" if job is not None and 0 <= rank < len(job.ranks) else f"rank {rank}"


def _steps(branch: Tree, steps: tuple[PlannedStep, ...], plan: Plan) -> None:
    for step in steps:
        describe = DESCRIBE.get(type(step))
        if describe is None:  # a step the view does not know: its label still shows, never nothing
            branch.add(escape(step.label))
        else:
            describe(branch, step, plan)


def _apply(branch: Tree, step: ApplyStep, plan: Plan) -> None:
    node = branch.add(escape(step.label) + (f" [cyan](measure {escape(step.measure)})" if step.measure else ""))
    _circuits(node, step.circuits)
    if step.verify_light:
        node.add(f"verify light above {step.min_power_dbm} dBm within {step.timeout_s:g} s")
    if step.crosstalk:
        node.add("record crosstalk per output port (emulated devices only)")


def _clear(branch: Tree, step: ClearStep, plan: Plan) -> None:
    branch.add(escape(f"{step.label}: " + ", ".join(f"{sw} ({len(p)} ports)" for sw, p in step.managed.items())))


def _calibrate(branch: Tree, step: CalibrateStep, plan: Plan) -> None:
    branch.add(escape(step.label + (f" (loading {step.reuse})" if step.reuse else " (sweep every heater)")))


def _wait(branch: Tree, step: WaitStep, plan: Plan) -> None:
    branch.add(escape(step.label))


def _parallel(branch: Tree, step: ParallelStep, plan: Plan) -> None:
    _steps(branch.add(escape(f"{step.label}, at the same time")), step.steps, plan)


def _job_start(branch: Tree, step: JobStartStep, plan: Plan) -> None:
    job = plan.playbook.job
    node = branch.add(escape(f"{step.label}: {len(job.ranks)} ranks on {', '.join(dict.fromkeys(job.ranks))}"))
    if job.fabric is not None:
        node.add("set up the job fabric first (above)")
    if step.wait_steps:
        node.add(f"wait until every rank has printed step {step.wait_steps}, within {step.timeout_s:g} s")


def _job_stop(branch: Tree, step: JobStopStep, plan: Plan) -> None:
    branch.add(escape(f"{step.label}: every rank (SIGTERM, SIGKILL after a grace)"))


def _job_measure(branch: Tree, step: JobMeasureStep, plan: Plan) -> None:
    branch.add(
        escape(f"{step.label} of {_rank(plan, step.rank)} within {step.timeout_s:g} s")
        + f" [cyan](measure {escape(step.measure)}.time)"
    )


def _detect(branch: Tree, step: FaultDetectStep, plan: Plan) -> None:
    failover = isinstance(step, FailoverStep)
    measure = f" [cyan](measure {escape(step.measure)}.*)" if step.measure else ""
    node = branch.add(escape(step.label) + measure)
    fault = f"{step.kind} on {_rank(plan, step.rank)}" + (f", Xid {step.xid}" if step.kind == "gpu.fail" else "")
    node.add(escape(f"watch every rank (heartbeat {step.heartbeat_s * 1000:g} ms, stall {step.stall_timeout_s:g} s)"))
    node.add(escape(f"inject {fault}; wait for its detection within {step.timeout_s:g} s"))
    if failover:
        node.add(escape(f"choose a spare ({', '.join(plan.spares) or 'none'}), rewire the job fabric through it"))
        node.add("relaunch every rank from the last checkpoint; wait for the spare's first step")
        node.add(escape(f"heal {step.kind}"))
    else:
        node.add(escape(f"heal {step.kind}; stop the job"))


def _inject(branch: Tree, step: FaultInjectStep, plan: Plan) -> None:
    node = branch.add(escape(step.label))
    if step.device is not None:
        attributes = ", ".join(f"{k}={v:g}" for k, v in step.attributes)
        what = (
            f"{step.kind} on {step.device}'s connection ({step.stream}"
            + (f"; {attributes}" if attributes else "")
            + ")"
        )
    else:
        what = f"{step.kind} on {_rank(plan, step.rank)}"
        if step.kind == "host.straggle":
            what += f", stopped {step.duty:g} of every {step.period_s * 1000:g} ms"
        elif step.kind == "gpu.fail":
            what += f", Xid {step.xid}"
    node.add(escape(f"after {step.when_s * 1000:g} ms: {what}, for {step.duration_s * 1000:g} ms, then heal"))


def _rail(branch: Tree, step: RailIterateStep, plan: Plan) -> None:
    node = branch.add(escape(step.label) + f" [cyan](measure {escape(step.measure)}.time)")
    node.add(f"{step.warmup} warm-up + {step.iterations} measured iterations; each change +{step.delay_s * 1000:g} ms")
    for phase in step.phases:
        sub = node.add(
            escape(
                f"phase {phase.name}: configuration {phase.apply.configuration}, compute {phase.compute_s * 1000:g} ms"
            )
        )
        _circuits(sub, phase.apply.circuits)
    if step.phases and step.phases[0].apply.verify_light:
        first = step.phases[0].apply
        node.add(f"verify light above {first.min_power_dbm} dBm within {first.timeout_s:g} s after each change")


def _health(branch: Tree, step: HealthStep, plan: Plan) -> None:
    branch.add(escape(f"{step.label}: nvidia-smi and kernel Xids on {len(step.hosts)} hosts: {', '.join(step.hosts)}"))


DESCRIBE = {
    ApplyStep: _apply,
    ClearStep: _clear,
    CalibrateStep: _calibrate,
    WaitStep: _wait,
    ParallelStep: _parallel,
    JobStartStep: _job_start,
    JobStopStep: _job_stop,
    JobMeasureStep: _job_measure,
    FaultDetectStep: _detect,
    FailoverStep: _detect,
    FaultInjectStep: _inject,
    RailIterateStep: _rail,
    HealthStep: _health,
}
