"""`testbed plan`: the plan as a rich tree, every step `run` will execute with the devices it drives. Reads the
plan only; touches no device.

On a large lab the lists of names stay short: a list of more than MAX_LISTED names is written with each run of
consecutive names as the range an inventory would write (`h[001:256]`, testbed.config.ranges), and devices
alike but for their name share one line. Every name is still there: expanding the ranges gives the list back.
Circuits are shown per switch by fabric_apply.show_circuits: their count and the first few.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from testbed.config.ranges import compress, compress_counted
from testbed.plan import Plan
from testbed.steps.fabric_apply import show_circuits

MAX_LISTED = 16  # a list of at most this many names is shown as it is; a longer one with ranges

# a list of two or more names, as the steps' descriptions write one ("h001, h002, h003")
_NAME_LIST = re.compile(r"(?<![A-Za-z0-9_.\-\[])[A-Za-z][A-Za-z0-9_.-]*(?:, [A-Za-z][A-Za-z0-9_.-]*)+")


def names(items: Sequence[str]) -> str:
    """A list of names for the plan, in its order: as it is when short, else with every run of MIN_RUN or more
    consecutive names written as a range (h[001:120], h[122:256], rail[0:7]).
    """
    if len(items) <= MAX_LISTED:
        return ", ".join(items)
    return ", ".join(compress(items, keep_order=True))


def print_plan(console: Console, plan: Plan, inventory_file: str) -> None:
    pb = plan.playbook
    root = Tree(
        f"[bold]{escape(pb.name)}[/] on {escape(plan.inventory.name)} ({escape(inventory_file)}), seed {plan.seed}"
    )
    _devices(root.add("devices"), plan)
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
    if not plan.inventory.emulated_only:
        console.print(
            f"On the lab (without --emulate) the run first takes a lease on these {len(plan.devices)} devices, "
            "refused if another user or run holds one (--wait to wait; docs/leases.md); with --emulate, none."
        )


def _devices(node: Tree, plan: Plan) -> None:
    """Each device the plan touches, with its kind, driver, address and whether it is written to. Past
    MAX_LISTED devices, those alike but for their name and address share a line (h[001:256]), the address a
    template over {name} (lab@{name}.lab.example:22) when it holds the name; a small group whose addresses
    have no such template is listed a device a line, a large one shows its first and last address.
    """
    addresses = plan.addresses()

    def line(name: str, address: str) -> str:
        dev = plan.inventory.devices[name]
        writes = "writes" if name in plan.writes else "reads"
        pin = f", node {dev.node}" if dev.node else ""
        return f"{dev.kind} via {dev.driver} at {address} ({writes}{pin})"

    if len(plan.devices) <= MAX_LISTED:
        for name in plan.devices:
            node.add(escape(f"{name}: {line(name, addresses[name])}"))
        return
    alike: dict[str, list[str]] = {}  # in the order of each group's first device
    for name in plan.devices:
        alike.setdefault(line(name, ""), []).append(name)
    for group in alike.values():
        address = _address(group, addresses)
        if address is None and len(group) <= MAX_LISTED:
            for name in group:
                node.add(escape(f"{name}: {line(name, addresses[name])}"))
        else:
            first, last = addresses[group[0]], addresses[group[-1]]
            address = address or f"{len(group)} addresses, {first} ... {last}"
            node.add(escape(f"{', '.join(compress(group, keep_order=True))}: {line(group[0], address)}"))


def _address(group: list[str], addresses: dict[str, str]) -> str | None:
    """The address of every device of `group` in one: theirs if they share it, else a template over {name} that
    gives each its own (lab@{name}.lab.example:22); None if there is none.
    """
    first = addresses[group[0]]
    if all(addresses[n] == first for n in group):
        return first
    template = first.replace(group[0], "{name}")
    if "{name}" in template and all(template.replace("{name}", n) == addresses[n] for n in group):
        return template
    return None


def _ranks(ranks: Sequence[str]) -> str:
    """Which host holds each rank: `0:gpu01, 1:gpu02` when short; else the ranks on each run of consecutive
    hosts, `0..247 on h[001:248] (one each, in order)`, `0..2047 on h[001:256] (8 each, in order)`.
    """
    if len(ranks) <= MAX_LISTED:
        return ", ".join(f"{r}:{h}" for r, h in enumerate(ranks))
    blocks: list[list] = []  # [host, ranks on it], consecutive ranks on one host as one block
    for host in ranks:
        if blocks and blocks[-1][0] == host:
            blocks[-1][1] += 1
        else:
            blocks.append([host, 1])
    parts, rank, j = [], 0, 0
    while j < len(blocks):
        each = blocks[j][1]
        k = j
        while k < len(blocks) and blocks[k][1] == each:
            k += 1
        for text, hosts in compress_counted([host for host, _ in blocks[j:k]], keep_order=True):
            last = rank + hosts * each - 1
            span = f"{rank}" if last == rank else f"{rank}..{last}"
            order = "" if hosts == 1 else f" ({'one' if each == 1 else each} each, in order)"
            parts.append(f"{span} on {text}{order}")
            rank = last + 1
        j = k
    return "; ".join(parts)


def _compress_lists(node: Tree, known: set[str]) -> None:
    """The steps describe themselves (testbed/steps); in what they wrote, every list of more than MAX_LISTED
    device names is written with ranges instead. Only names of the inventory's devices are taken for names.
    """

    def shorter(match: re.Match) -> str:
        out: list[str] = []
        run: list[str] = []
        for token in [*match.group(0).split(", "), None]:
            if token is not None and token in known:
                run.append(token)
                continue
            if run:
                out.append(escape(names(run)))
                run = []
            if token is not None:
                out.append(token)
        return ", ".join(out)

    if isinstance(node.label, str):
        node.label = _NAME_LIST.sub(shorter, node.label)
    for child in node.children:
        _compress_lists(child, known)


def _job(root: Tree, plan: Plan) -> None:
    job = plan.playbook.job
    assert job is not None  # shown only for a playbook with a job
    node = root.add(escape(f"job: {' '.join(job.command)}"))
    node.add(escape("ranks: " + _ranks(job.ranks)))
    if job.fabric is not None:
        f = job.fabric
        fabric = node.add(
            escape(f"fabric: {f.topology} on {f.port}" + (f" <-> {f.reverse_port}" if f.reverse_port else ""))
        )
        show_circuits(fabric, plan.job_circuits)
        if f.verify_light:
            fabric.add(f"verify light above {f.min_power_dbm} dBm within {f.light_timeout_ms / 1000:g} s")
    if plan.fabric_service:
        served = node.add(
            escape(f"fabric service: the ranks may ask for {', '.join(plan.fabric_service)} (TESTBED_FABRIC_SERVICE)")
        )
        for name, apply in plan.fabric_service.items():
            show_circuits(served.add(escape(name)), apply.circuits)
    if plan.spares:
        node.add(escape(f"spares a failover may use: {names(plan.spares)}"))


def _steps(branch: Tree, steps, plan: Plan) -> None:
    for step in steps:
        step.describe(branch, plan)  # each step kind says what it will do (testbed/steps)
    known = set(plan.inventory.devices)
    for node in branch.children:
        _compress_lists(node, known)
