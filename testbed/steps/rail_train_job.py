"""rail.train's planned step and its run: the job started with its card and routes (TESTBED_RAIL), its fabric changes
served, followed to its end (JobView.run_to_completion), and what it measured recorded next to what the twin's
data plane carried.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rich.tree import Tree
from typing_extensions import override

from testbed.contracts.engine import StepEngine
from testbed.contracts.job import JobView
from testbed.steps.base import Planned, PlanView, Touches, escape
from testbed.steps.fabric_apply import ApplyStep, job_run_touches, show_circuits

Route = tuple[int, str, str]  # (partner rank, this rank's port, the partner's port)


@dataclass(frozen=True)
class TrainPhase:
    """One phase of the job's card: its compute, the bytes to each partner, its configuration, each rank's sends."""

    name: str
    compute_s: float
    nbytes: int
    apply: ApplyStep  # the configuration the phase's traffic needs (what a rank asks for)
    routes: dict[int, tuple[Route, ...]]  # rank -> its sends (in static mode, over the static configuration)


@dataclass(frozen=True)
class RailTrainStep(Planned):
    """A workload card's iterations run by the job, its fabric changes served, what it measured recorded."""

    mode: str
    delay_s: float
    iterations: int
    warmup: int
    measure: str
    phases: tuple[TrainPhase, ...]
    first: ApplyStep  # in place before the job starts (static: for good)
    job_timeout_s: float

    @override
    def execute(self, engine: StepEngine) -> None:
        run_rail_job(self, engine)

    @override
    def devices(self, plan: PlanView) -> Touches:
        return job_run_touches([self.first, *(phase.apply for phase in self.phases)], plan)

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        branch = node.add(escape(self.label) + f" [cyan](measure {escape(self.measure)}.time)")
        job = plan.playbook.job
        hosts = job.ranks
        branch.add(
            escape(
                f"start the job: {len(hosts)} ranks on {', '.join(dict.fromkeys(hosts))}: {' '.join(job.command)} "
                f"(testbed-train's phased mode in TESTBED_RAIL); {self.warmup} warm-up + {self.iterations} measured "
                "iterations, then wait for it to end and stop it"
            )
        )
        show = branch.add(escape(f"before the job: configuration {self.first.configuration}"))
        show_circuits(show, self.first.circuits)
        if self.mode == "static":
            branch.add("static: the ranks never ask; the rails stay as they are")
        else:
            asks = "setup before each phase's traffic"
            if self.mode == "provisioning":
                asks = "prepare the next phase's configuration after each phase's traffic, setup before its own"
            branch.add(
                escape(
                    f"{self.mode}: the job's fabric service serves the ranks ({asks}); a change starts once all "
                    f"{len(hosts)} ranks asked, +{self.delay_s * 1000:g} ms per change"
                )
            )
        for phase in self.phases:
            what = f"configuration {phase.apply.configuration}, {phase.nbytes} bytes to each partner, compute " + (
                f"{phase.compute_s * 1000:g} ms"
            )
            sub = branch.add(escape(f"phase {phase.name}: {what}"))
            pairs = [f"{hosts[r]}->{hosts[s]}" for r, routes in phase.routes.items() for s, _, _ in routes]
            sub.add(escape(f"traffic: {' '.join(pairs[:12])}" + (" ..." if len(pairs) > 12 else "")))
            if self.mode != "static":
                show_circuits(sub, phase.apply.circuits)
        if self.first.verify_light:
            branch.add(
                f"verify light above {self.first.min_power_dbm} dBm within {self.first.timeout_s:g} s per change"
            )


# What the job prints (hostside/phased.py) that the step reads back.
OUTPUT = r"^(step \d+ ms |sent |done rank |error: )"
STEP_LINE = re.compile(r"^step (\d+) ms ([0-9.]+) stall_ms ([0-9.]+)")
SENT_LINE = re.compile(r"^sent (\S+) (\d+) (\d+) written (\d+)$")


def run_rail_job(step: RailTrainStep, engine: StepEngine) -> None:
    """The job started with its card and routes, its fabric changes served, followed to its end; what it measured
    recorded, and per phase the bytes it sent next to what the twin's data plane carried.
    """
    jobs = engine.require_jobs(step.label)
    relays: dict[tuple[str, int, int], str] = {}  # (phase, rank, partner) -> the address the rank sends to

    def prepare() -> None:
        engine.execute(step.first)  # the rails before the job (static: for good); not measured
        if step.mode != "static":
            # job.fabric_service's configurations, as job.start serves them; the first phase's (just applied)
            # setup is answered at once
            jobs.serve_fabric(step.label, delay_s=step.delay_s, in_place=step.first.configuration)

    def where(rank: int, route: Route, phase: str) -> str:
        partner, port, partner_port = route
        address = jobs.peer_address(rank, partner, port, partner_port)
        relays[(phase, rank, partner)] = address
        return address

    before = jobs.relay_bytes() or {}
    lines = jobs.run_to_completion(
        step.label,
        prepare=prepare,
        rank_env=lambda r: rail_env(step, r.index, where),
        output=OUTPUT,
        max_s=step.job_timeout_s,
        kind="rail.train",
        work="iterations",
    )
    _record_iterations(step, engine, lines[0], STEP_LINE)
    _record_bytes(step, engine, jobs, lines, relays, before, SENT_LINE)


def _record_iterations(
    step: RailTrainStep, engine: StepEngine, lines: list[tuple[str, int]], rx: re.Pattern[str]
) -> None:
    """Each measured iteration's time and stall, as the job measured them (its `step N ms T stall_ms S` lines)."""
    for line, ns in lines:
        m = rx.match(line)
        if m is None:
            continue
        number, ms, stall = int(m.group(1)), float(m.group(2)), float(m.group(3))
        if number <= step.warmup:
            continue
        common = {"iteration": number - step.warmup - 1, "mode": step.mode, "delay_ms": step.delay_s * 1000}
        start = ns - int(ms * 1e6)
        engine.recorder.emit(
            "measure",
            f"{step.measure}.time",
            mono_ns=ns,
            step=step.label,
            data={"ms": ms, "start_ns": start, "end_ns": ns, **common},
        )
        engine.recorder.emit(
            "measure",
            f"{step.measure}.stall",
            mono_ns=ns,
            step=step.label,
            data={"ms": stall, "start_ns": start, "end_ns": start + int(stall * 1e6), **common},
        )


def _record_bytes(
    step: RailTrainStep,
    engine: StepEngine,
    jobs: JobView,
    lines: dict[int, list[tuple[str, int]]],
    relays: dict[tuple[str, int, int], str],
    before: Mapping[str, int],
    rx: re.Pattern[str],
) -> None:
    """Per phase (phases over the same relays together): the bytes the ranks delivered, and (on the twin) the
    bytes its relays carried for them.
    """
    sent: dict[str, int] = {}
    by_relay: dict[str, int] = {}
    for rank, rank_lines in lines.items():
        for line, _ in rank_lines:
            m = rx.match(line)
            if m is None:
                continue
            phase, partner, n = m.group(1), int(m.group(2)), int(m.group(3))
            sent[phase] = sent.get(phase, 0) + n
            address = relays.get((phase, rank, partner))
            if address is not None:
                by_relay[address] = by_relay.get(address, 0) + n
    counted = jobs.relay_bytes()
    after = counted or {}
    # Phases whose traffic crossed the same relays (a ring's steps over one ring) are counted together.
    group = {phase.name: phase.name for phase in step.phases}

    def root(name: str) -> str:
        while group[name] != name:
            name = group[name]
        return name

    users: dict[str, str] = {}
    for (phase, _, _), address in relays.items():
        if address in users:
            group[root(phase)] = root(users[address])
        users[address] = phase
    groups: dict[str, list[TrainPhase]] = {}
    for phase in step.phases:
        groups.setdefault(root(phase.name), []).append(phase)
    for members in groups.values():
        names = [p.name for p in members]
        data = {
            "phase": names[0] if len(names) == 1 else f"{names[0]}..{names[-1]} ({len(names)} phases)",
            "config": ",".join(dict.fromkeys(p.apply.configuration for p in members)),
            "job_bytes": sum(sent.get(n, 0) for n in names),
        }
        mine = {a for (p, _, _), a in relays.items() if p in names}
        # The relays' count; with --netns no relay carries the phase (the kernel does, its frames counted per port
        # for the whole run, not per phase: twin_dataplane.kernel_bytes in run.json)
        if counted is not None and mine and mine <= after.keys():
            data["plane_bytes"] = sum(after.get(a, 0) - before.get(a, 0) for a in mine)
        engine.recorder.emit("mark", "rail.bytes", step=step.label, data=data)


def rail_env(step: RailTrainStep, rank: int, where: Callable[[int, Route, str], str]) -> dict[str, str]:
    """TESTBED_RAIL for one rank: the card, its sends (`where(rank, route, phase)` -> host:port) and whom it
    hears from.
    """
    phases = []
    for phase in step.phases:
        phases.append(
            {
                "name": phase.name,
                "config": phase.apply.configuration,
                "compute_ms": phase.compute_s * 1000,
                "bytes": phase.nbytes,
                "to": [[route[0], where(rank, route, phase.name)] for route in phase.routes[rank]],
                "from": sorted(r for r, routes in phase.routes.items() if any(s == rank for s, _, _ in routes)),
            }
        )
    spec = {"mode": step.mode, "iterations": step.warmup + step.iterations, "phases": phases}
    return {"TESTBED_RAIL": json.dumps(spec, separators=(",", ":"))}
