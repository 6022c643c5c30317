"""`testbed plan`: the plan as a rich tree, every step `run` will execute with the devices it drives. Reads the
plan only; touches no device."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from testbed.plan import Plan
from testbed.steps.fabric_apply import show_circuits


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
        show_circuits(fabric, plan.job_circuits)
        if f.verify_light:
            fabric.add(f"verify light above {f.min_power_dbm} dBm within {f.light_timeout_ms / 1000:g} s")
    if plan.spares:
        node.add(escape(f"spares a failover may use: {', '.join(plan.spares)}"))


def _steps(branch: Tree, steps, plan: Plan) -> None:
    for step in steps:
        step.describe(branch, plan)  # each step kind says what it will do (testbed/steps)
