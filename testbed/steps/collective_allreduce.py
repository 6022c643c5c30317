"""collective.allreduce: all-reduces of a message of each given size, run by the job itself over the fabric, by a
ring that never changes or by recursive doubling with the topology reconfigured per stage (PCCL; docs/collective.md).

The step picks one of its `cases` (algorithm, the fabric's label and the configurations it runs over), usually by
a swept `case`. Per sweep point it puts the case's configuration in place before the job (the ring; for recursive
doubling the last stage's, where every all-reduce ends, so every one starts alike), starts the job
(testbed-train's collective mode, hostside/collective.py, its routes in TESTBED_COLLECTIVE), and for
recursive doubling serves the ranks' `setup` of each stage's configuration (a change starts once every rank
asked). It records each measured all-reduce's time (`<measure>.time`, the slowest rank's, with the case, its
algorithm and fabric, the size, and the part spent waiting for the fabric); the service records each change
(`fabric_service.change`: request read, first switch command, light verified, ready; docs/fabric_service.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints
from typing_extensions import override

from testbed.config.common import PARAM_REF, Name, Strict, param_name
from testbed.fabric.circuits import parse_link
from testbed.steps.base import CheckContext, PlanContext, PlanError, Planned, Problem, StepModel
from testbed.steps.collective_job import CollectiveStage, CollectiveStep, size_text
from testbed.steps.fabric_apply import apply_step

Size = Annotated[int, Field(ge=8, le=1 << 30)]
SweepRef = Annotated[str, StringConstraints(pattern=PARAM_REF.pattern)]


class CollectiveCase(Strict):
    """One way to all-reduce: an algorithm over configurations on one fabric."""

    algorithm: Literal["ring", "rd"] = Field(
        description="ring: reduce-scatter + all-gather over one duplex ring; rd: recursive doubling, a stage per "
        "configuration"
    )
    fabric: Name = Field(description="the fabric it runs on (ocs, chip): recorded with every measure, and the report's")
    configurations: list[Name] = Field(
        min_length=1,
        description="ring: the duplex ring (rank r <-> r+1); rd: stage k's, linking every rank r with r xor 2^k",
    )


@dataclass(frozen=True)
class _Light:
    """fabric.apply's light settings, for a job without a fabric service (a ring only)."""

    verify_light: bool = True
    min_power_dbm: float = -20.0
    timeout_ms: int = 5000


class CollectiveAllreduce(StepModel):
    """All-reduces of each message size, run by the job over one of `cases`: a ring, or recursive doubling whose
    ranks ask the job's fabric service for each stage's configuration.
    """

    needs: ClassVar[frozenset[str]] = frozenset({"job"})

    action: Literal["collective.allreduce"]
    case: Name | SweepRef = Field(description="which of `cases`, or `${name}`: a sweep parameter naming one")
    cases: dict[Name, CollectiveCase] = Field(min_length=1)
    sizes: Size | list[Size] | SweepRef = Field(
        description="message bytes (one, a list the job runs one after another, or `${name}`)"
    )
    repetitions: int = Field(3, ge=1, le=10_000, description="measured all-reduces per size")
    warmup: int = Field(1, ge=0, le=100, description="all-reduces per size run first and not measured")
    measure: Name = "collective"
    job_timeout_ms: int = Field(600_000, gt=0, description="for the whole job to run its all-reduces")

    @override
    def check(self, ctx: CheckContext) -> list[Problem]:
        problems = ctx.sweep_ref(self.case, ("case",)) + ctx.sweep_ref(self.sizes, ("sizes",))
        picked = _values(ctx, self.case)
        for name in [n for n in picked if n not in self.cases]:
            problems.append((("case",), f"{name!r} is none of `cases` ({', '.join(self.cases)})"))
        for size in _values(ctx, self.sizes):
            if not _sizes(size):
                problems.append((("sizes",), f"{size!r} is not a message size in bytes (8 to 2^30) or a list of them"))
        job = ctx.playbook.job
        if job is None:
            return problems
        hosts = list(job.ranks)
        if len(set(hosts)) != len(hosts):
            return [*problems, (("action",), "collective.allreduce needs one rank per host (a partner is a host)")]
        served = job.fabric_service.configurations if job.fabric_service is not None else None
        for name, case in self.cases.items():
            loc = ("cases", name, "configurations")
            known = [c for c in case.configurations if c in ctx.playbook.configurations]
            for c in case.configurations:
                if c not in ctx.playbook.configurations:
                    problems.append((loc, f"no configuration named {c!r}"))
            # While the service runs, `testbed check` wants every circuit on its ports in one of its configurations:
            # a case's circuits stay in place while the next case's service runs, so every case's are listed.
            if served is None and case.algorithm == "rd":
                problems.append((loc, "recursive doubling asks the job's fabric service: add job.fabric_service"))
            elif served is not None and [c for c in case.configurations if c not in served]:
                missing = ", ".join(c for c in case.configurations if c not in served)
                problems.append((loc, f"list {missing} under job.fabric_service.configurations"))
            if len(known) == len(case.configurations):
                problems += [(loc, p) for p in _topology_problems(case, ctx.playbook.configurations, hosts)]
        return problems

    @override
    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        name = ctx.swept(self.case)
        if name not in self.cases:
            raise PlanError(f"collective.allreduce: case {self.case} = {name!r} is none of {', '.join(self.cases)}")
        sizes = _sizes(ctx.swept(self.sizes))
        if not sizes:
            raise PlanError(f"collective.allreduce: sizes {self.sizes} = {ctx.swept(self.sizes)!r} is no message size")
        case = self.cases[name]
        job = ctx.playbook.job
        hosts = list(job.ranks)
        light = job.fabric_service or _Light()
        stages = []
        for k, config in enumerate(case.configurations):
            links = duplex(ctx.playbook.configurations[config], hosts)
            routes = {}
            for r in range(len(hosts)):
                s = partner(case.algorithm, k, r, len(hosts))
                if (r, s) not in links:
                    raise PlanError(f"collective.allreduce: {config!r} has no duplex link {hosts[r]} <-> {hosts[s]}")
                routes[r] = (s, *links[(r, s)])
            apply = apply_step(ctx, config, f"fabric service: {config}", light, measure=None)
            stages.append(CollectiveStage(apply, routes))
        last = case.configurations[-1]  # where every all-reduce ends: the ring, or rd's last stage
        label = self.name or f"all-reduce {name} ({case.algorithm} on {case.fabric}), " + ", ".join(
            map(size_text, sizes)
        )
        first = apply_step(ctx, last, f"{label}: before the job ({last})", light, measure=None)
        return (
            CollectiveStep(
                label, name, case.algorithm, case.fabric, sizes, self.repetitions, self.warmup, self.measure,
                tuple(stages), first, self.job_timeout_ms / 1000,
            ),
        )  # fmt: skip


def duplex(configuration: Any, hosts: list[str]) -> dict[tuple[int, int], tuple[str, str]]:
    """(rank, partner) -> (its port, the partner's port) for every link of the configuration between two ranks'
    hosts that is lit both ways (the twin's data plane carries a TCP connection only over a duplex link).
    """
    index = {h: i for i, h in enumerate(hosts)}
    directed = {link for text in configuration.links for link in parse_link(text)}
    out: dict[tuple[int, int], tuple[str, str]] = {}
    for (a, p), (b, q) in sorted(directed):
        if a in index and b in index and a != b and ((b, q), (a, p)) in directed:
            out.setdefault((index[a], index[b]), (p, q))
    return out


def partner(algorithm: str, stage: int, rank: int, world: int) -> int:
    """Whom `rank` sends to: the ring's next rank, or recursive doubling's rank xor 2^stage."""
    return (rank + 1) % world if algorithm == "ring" else rank ^ (1 << stage)


def _topology_problems(case: CollectiveCase, configurations: dict[str, Any], hosts: list[str]) -> list[str]:
    w = len(hosts)
    if case.algorithm == "ring":
        if len(case.configurations) != 1:
            return [f"a ring runs over one configuration, not {len(case.configurations)}"]
        if w < 2:
            return []
        links = duplex(configurations[case.configurations[0]], hosts)
        gaps = [
            f"{hosts[r]} <-> {hosts[partner('ring', 0, r, w)]}"
            for r in range(w)
            if (r, partner("ring", 0, r, w)) not in links
        ]
        return (
            [f"{case.configurations[0]!r} has no duplex link {', '.join(gaps)}: no ring of the ranks"] if gaps else []
        )
    if w < 2 or w & (w - 1):
        return [f"recursive doubling needs a power of two ranks, the job has {w}"]
    if len(case.configurations) != w.bit_length() - 1:
        return [f"recursive doubling over {w} ranks has {w.bit_length() - 1} stages, not {len(case.configurations)}"]
    problems = []
    for k, config in enumerate(case.configurations):
        links = duplex(configurations[config], hosts)
        gaps = [
            f"{hosts[r]} <-> {hosts[partner('rd', k, r, w)]}"
            for r in range(w)
            if (r, partner("rd", k, r, w)) not in links
        ]
        if gaps:
            problems.append(f"stage {k}'s {config!r} must link rank r with r xor {1 << k}; no duplex link {gaps[0]}")
    return problems


def _values(ctx: CheckContext, value: Any) -> list[Any]:
    """A value, or every value its sweep parameter takes."""
    if isinstance(value, str) and value.startswith("${"):
        return list(ctx.playbook.sweep.get(param_name(value), []))
    return [value]


def _sizes(value: Any) -> tuple[int, ...]:
    """A size or a list of sizes as a tuple of sizes; () if it is not one."""
    values = value if isinstance(value, list) else [value]
    ok = values and all(isinstance(v, int) and not isinstance(v, bool) and 8 <= v <= 1 << 30 for v in values)
    return tuple(values) if ok else ()
