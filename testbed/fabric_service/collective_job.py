"""collective.allreduce's run (testbed/steps/collective_allreduce.py): the job started with its algorithm and routes,
its fabric changes served (recursive doubling: ServedFabric records each change), followed to its end, and each
all-reduce it measured recorded.
"""

from __future__ import annotations

import json
import re

from testbed.contracts.errors import StepFailed, raise_failures

# What the job prints (hostside/collective.py) that the step reads back.
OUTPUT = r"^(allreduce |warmup |done rank |error: )"
ALLREDUCE = re.compile(r"^allreduce (\S+) (\d+) ms ([0-9.]+) reconfig_ms ([0-9.]+)$")
DONE = re.compile(r"^done rank (\d+) allreduces (\d+) checksum (-?\d+)$")


def run_collective_job(step, engine) -> None:
    jobs = engine.require_jobs(step.label)
    if jobs.handles:
        raise StepFailed(f"{step.label}: collective.allreduce starts the job itself; stop the running one (job.stop)")
    jobs.assign(list(jobs.job.ranks))  # every trial starts from the playbook's assignment
    engine.execute(step.first)  # the ring, or rd's last stage (where every all-reduce ends); not measured
    jobs.close_service()
    if step.algorithm == "rd":  # a ring never asks; recursive doubling asks before every stage
        jobs.serve_fabric(step.label, in_place=step.first.configuration)

    def where(rank: int, route) -> str:
        partner, port, partner_port = route
        r, s = jobs.ranks[rank], jobs.ranks[partner]
        if jobs.link is None:  # a lab: the partner's host address (the lab's routing puts it on the circuit)
            return f"{jobs.address_of(s.host)}:{jobs.ports[s.index]}"
        return jobs.link(r.host, port, s.host, partner_port, jobs.ports[s.index])  # the twin: lit circuits only

    jobs.rank_env = lambda r: collective_env(step, r.index, where)
    try:
        jobs.launch(step.label)
        args = {"pattern": OUTPUT, "max_s": step.job_timeout_s}
        programs = {
            r.host: [(step.label, "gpu.job_output", {"job": jobs.handles[r.index], **args})] for r in jobs.ranks
        }
        outputs = engine.dispatch(programs)
    finally:
        jobs.rank_env = None
        jobs.stop(step.label)  # whatever still runs, then the fabric service
    results = {r.index: outputs[r.host][0] for r in jobs.ranks}
    raise_failures(list(results.values()))
    lines = {i: [(ln, ns) for ln, ns in res.value["lines"]] for i, res in results.items()}
    done = {i: m for i, ls in lines.items() for ln, _ in ls if (m := DONE.match(ln))}
    if len(done) < len(lines):
        i = min(set(lines) - set(done))
        errors = [ln for ln, _ in lines[i] if ln.startswith("error: ")]
        why = errors[0] if errors else " | ".join(results[i].value["tail"][-3:]) or "no output"
        raise StepFailed(f"{step.label}: rank {i} ({jobs.ranks[i].host}) did not finish its all-reduces: {why}")
    if len({m.group(3) for m in done.values()}) != 1:  # each rank checked its own; all must hold the same sums
        sums = ", ".join(f"rank {i}: {m.group(3)}" for i, m in sorted(done.items()))
        raise StepFailed(f"{step.label}: the ranks' all-reduce results differ (checksums {sums})")
    _record_allreduces(step, engine, lines)  # each change's times: the service's own marks and measures


def collective_env(step, rank: int, where) -> dict[str, str]:
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


def _record_allreduces(step, engine, lines) -> None:
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
