"""collective.allreduce's planned step and its run: the job started with its algorithm and routes
(TESTBED_COLLECTIVE), its fabric changes served (recursive doubling: the fabric service records each change),
followed to its end (JobView.run_to_completion), and each all-reduce it measured recorded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from rich.tree import Tree
from typing_extensions import override

from testbed.contracts.engine import StepEngine
from testbed.contracts.errors import StepFailed
from testbed.steps.base import Planned, PlanView, Touches, escape
from testbed.steps.fabric_apply import ApplyStep, job_run_touches, show_circuits
from testbed.steps.rail_train_job import Route


@dataclass(frozen=True)
class CollectiveStage:
    """One stage of the collective: the configuration its traffic needs, and where each rank sends."""

    apply: ApplyStep  # the configuration the stage's traffic needs (what a rank asks the fabric service for)
    routes: dict[int, Route]  # rank -> where it sends in this stage


@dataclass(frozen=True)
class CollectiveStep(Planned):
    """The job's all-reduces of each size over one case, its fabric changes served, each measured one recorded."""

    case: str
    algorithm: str
    fabric: str
    sizes: tuple[int, ...]
    repetitions: int
    warmup: int
    measure: str
    stages: tuple[CollectiveStage, ...]
    first: ApplyStep  # in place before the job starts
    job_timeout_s: float

    @override
    def execute(self, engine: StepEngine) -> None:
        run_collective_job(self, engine)

    @override
    def devices(self, plan: PlanView) -> Touches:
        return job_run_touches([self.first, *(stage.apply for stage in self.stages)], plan)

    @override
    def describe(self, node: Tree, plan: PlanView) -> None:
        branch = node.add(escape(self.label) + f" [cyan](measure {escape(self.measure)}.time)")
        hosts = plan.playbook.job.ranks
        w = len(hosts)
        branch.add(
            escape(
                f"start the job: {w} ranks on {', '.join(hosts)}: {' '.join(plan.playbook.job.command)} "
                "(testbed-train's collective mode in TESTBED_COLLECTIVE); per size "
                f"({', '.join(map(size_text, self.sizes))}) {self.warmup} warm-up + {self.repetitions} measured "
                "all-reduces, each checked on every rank; then wait for it to end and stop it"
            )
        )
        show_circuits(
            branch.add(escape(f"before the job: configuration {self.first.configuration}")), self.first.circuits
        )
        if self.algorithm == "ring":
            what = (
                f"ring: reduce-scatter + all-gather, {2 * (w - 1)} steps each sending 1/{w} of the message to the next "
                f"rank over configuration {self.first.configuration}, which never changes; the ranks never ask"
            )
        else:
            what = (
                f"recursive doubling: {len(self.stages)} stages, each exchanging the whole partial sum; before each "
                "the ranks ask the job's fabric service to set up its configuration (a change starts once all "
                f"{w} ranks asked), and wait"
            )
        sub = branch.add(escape(what))
        for k, stage in enumerate(self.stages):
            pairs = [f"{hosts[r]}->{hosts[s]}" for r, (s, _, _) in stage.routes.items()]
            traffic = f"traffic: {' '.join(pairs[:12])}" + (" ..." if len(pairs) > 12 else "")
            if self.algorithm == "ring":
                sub.add(escape(traffic))
                continue
            stage_node = sub.add(escape(f"stage {k}: configuration {stage.apply.configuration}; {traffic}"))
            show_circuits(stage_node, stage.apply.circuits)
        if self.first.verify_light:
            branch.add(
                f"verify light above {self.first.min_power_dbm} dBm within {self.first.timeout_s:g} s on every change "
                "(the one before the job too)"
            )
        branch.add(escape(f"record {self.measure}.time per measured all-reduce (the slowest rank's)"))


# What the job prints (hostside/collective.py) that the step reads back.
OUTPUT = r"^(allreduce |warmup |done rank |error: )"
ALLREDUCE = re.compile(r"^allreduce (\S+) (\d+) ms ([0-9.]+) reconfig_ms ([0-9.]+)$")
DONE = re.compile(r"^done rank (\d+) allreduces (\d+) checksum (-?\d+)$")


def run_collective_job(step: CollectiveStep, engine: StepEngine) -> None:
    """The job started with its algorithm and routes, its fabric changes served (recursive doubling), followed to
    its end; every rank's sums checked against the others', each measured all-reduce recorded.
    """
    jobs = engine.require_jobs(step.label)

    def prepare() -> None:
        engine.execute(step.first)  # the ring, or rd's last stage (where every all-reduce ends); not measured
        jobs.close_service()
        if step.algorithm == "rd":  # a ring never asks; recursive doubling asks before every stage
            jobs.serve_fabric(step.label, in_place=step.first.configuration)

    def where(rank: int, route: Route) -> str:
        partner, port, partner_port = route
        return jobs.peer_address(rank, partner, port, partner_port)

    lines = jobs.run_to_completion(
        step.label,
        prepare=prepare,
        rank_env=lambda r: collective_env(step, r.index, where),
        output=OUTPUT,
        max_s=step.job_timeout_s,
        kind="collective.allreduce",
        work="all-reduces",
    )
    done = {i: m for i, ls in lines.items() for ln, _ in ls if (m := DONE.match(ln))}
    if len({m.group(3) for m in done.values()}) != 1:  # each rank checked its own; all must hold the same sums
        sums = ", ".join(f"rank {i}: {m.group(3)}" for i, m in sorted(done.items()))
        raise StepFailed(f"{step.label}: the ranks' all-reduce results differ (checksums {sums})")
    _record_allreduces(step, engine, lines)  # each change's times: the service's own marks and measures


def collective_env(step: CollectiveStep, rank: int, where: Callable[[int, Route], str]) -> dict[str, str]:
    """TESTBED_COLLECTIVE for one rank: its algorithm, sizes and, per stage, where it sends and whom it hears from."""
    stages = []
    for stage in step.stages:
        route = stage.routes[rank]
        source = next(r for r, (partner, _, _) in stage.routes.items() if partner == rank)
        stages.append({"config": stage.apply.configuration, "to": [[route[0], where(rank, route)]], "from": [source]})
    spec = {
        "algorithm": step.algorithm,
        "sizes": list(step.sizes),
        "repetitions": step.repetitions,
        "warmup": step.warmup,
        "stages": stages,
    }
    return {"TESTBED_COLLECTIVE": json.dumps(spec, separators=(",", ":"))}


def _record_allreduces(step: CollectiveStep, engine: StepEngine, lines: dict[int, list[tuple[str, int]]]) -> None:
    """Per measured all-reduce, the slowest rank's time: a collective is done when its last rank holds the result."""
    per_rank = {i: [(m, ns) for ln, ns in ls if (m := ALLREDUCE.match(ln))] for i, ls in lines.items()}
    counts = {len(v) for v in per_rank.values()}
    if counts != {len(step.sizes) * step.repetitions}:
        raise StepFailed(f"{step.label}: the ranks printed {sorted(counts)} all-reduces, not {len(step.sizes)} x "
                         f"{step.repetitions}")  # fmt: skip
    for j in range(len(step.sizes) * step.repetitions):
        rank = max(per_rank, key=lambda i: float(per_rank[i][j][0].group(3)))
        m, ns = per_rank[rank][j]
        ms = float(m.group(3))
        engine.recorder.emit(
            "measure",
            f"{step.measure}.time",
            mono_ns=ns,
            step=step.label,
            data={
                "ms": ms,
                "start_ns": ns - int(ms * 1e6),
                "end_ns": ns,
                "case": step.case,
                "algorithm": step.algorithm,
                "fabric": step.fabric,
                "size_bytes": int(m.group(2)),
                "repetition": j % step.repetitions,
                "reconfig_ms": float(m.group(4)),
                "rank": rank,
            },
        )


def size_text(n: int) -> str:
    """A message size as people write it: 64 KiB, 1 MiB, 100 B."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"
