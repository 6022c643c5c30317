"""`testbed plan`: the plan as a rich tree. Reads the plan only; touches no device."""

from __future__ import annotations

from rich.console import Console
from rich.tree import Tree

from testbed.plan import ApplyStep, CalibrateStep, ClearStep, ParallelStep, Plan, PlannedStep, WaitStep


def print_plan(console: Console, plan: Plan, inventory_file: str) -> None:
    pb = plan.playbook
    root = Tree(f"[bold]{pb.name}[/] on {plan.inventory.name} ({inventory_file}), seed {plan.seed}")
    devices = root.add("devices")
    addresses = plan.addresses()
    for name in plan.devices:
        dev = plan.inventory.devices[name]
        writes = "writes" if name in plan.writes else "reads"
        pin = f", node {dev.node}" if dev.node else ""
        devices.add(f"{name}: {dev.kind} via {dev.driver} at {addresses[name]} ({writes}{pin})")
    for title, steps in (("setup", plan.setup), ("teardown", plan.teardown)):
        if steps:
            _steps(root.add(title), steps)
    points = []
    for trial in plan.trials:
        if not points or points[-1][0] != trial.sweep_point:
            points.append((trial.sweep_point, []))
        points[-1][1].append(trial)
    for point, trials in points:
        label = ", ".join(f"{k}={v}" for k, v in point.items())
        branch = root.add(
            f"trials {trials[0].index}..{trials[-1].index} ({len(trials)})" + (f" with {label}" if label else "")
        )
        _steps(branch, trials[0].steps)
    console.print(root)
    console.print(f"{len(plan.trials)} trials; interlocks checked; no device was contacted.")


def _steps(branch: Tree, steps: tuple[PlannedStep, ...]) -> None:
    for step in steps:
        if isinstance(step, ApplyStep):
            node = branch.add(f"{step.label}" + (f" [cyan](measure {step.measure})" if step.measure else ""))
            for sw, pairs in step.circuits.items():
                shown = " ".join(f"{i}>{e}" for i, e in pairs[:12]) + (" ..." if len(pairs) > 12 else "")
                node.add(f"{sw}: {len(pairs)} circuits: {shown}")
            if step.verify_light:
                node.add(f"verify light above {step.min_power_dbm} dBm within {step.timeout_s:g} s")
            if step.crosstalk:
                node.add("record crosstalk per output port (emulated devices only)")
        elif isinstance(step, ClearStep):
            branch.add(f"{step.label}: " + ", ".join(f"{sw} ({len(p)} ports)" for sw, p in step.managed.items()))
        elif isinstance(step, CalibrateStep):
            branch.add(step.label + (f" (loading {step.reuse})" if step.reuse else " (sweep every heater)"))
        elif isinstance(step, WaitStep):
            branch.add(step.label)
        elif isinstance(step, ParallelStep):
            _steps(branch.add(f"{step.label}, at the same time"), step.steps)
