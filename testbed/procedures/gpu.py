"""GPU host procedures over the GpuHost capability. Jobs cross the actor boundary as plain dicts."""

from __future__ import annotations

import dataclasses

from testbed.capabilities import GpuHost, JobHandle
from testbed.procedures.context import ProcedureContext


def _job(job: dict | JobHandle) -> JobHandle:
    return job if isinstance(job, JobHandle) else JobHandle(**job)


def identify(host: GpuHost, ctx: ProcedureContext) -> dict:
    ident = host.identify()
    gpus = host.gpus()
    return {**dataclasses.asdict(ident), "gpus": [dataclasses.asdict(g) for g in gpus]}


def start_job(
    host: GpuHost,
    ctx: ProcedureContext,
    *,
    command: list[str],
    name: str,
    gpus: list[int] | None = None,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
) -> dict:
    """Start a job in the background. Mark: job_started (the host returned its pid)."""
    handle = host.run_job(command, name=name, gpus=gpus, env=env, workdir=workdir)
    ctx.mark("job_started")
    ctx.cache.setdefault("jobs", {})[name] = handle
    return dataclasses.asdict(handle)


def job_status(
    host: GpuHost, ctx: ProcedureContext, *, job: dict, progress: str | None = r"step (\d+)", tail_lines: int = 50
) -> dict:
    """The job's state and progress. Mark: progress_seen when the pattern has matched."""
    status = host.job_status(_job(job), progress=progress, tail_lines=tail_lines)
    if status.progress is not None:
        ctx.mark("progress_seen")
    return dataclasses.asdict(status)


def stop_job(host: GpuHost, ctx: ProcedureContext, *, job: dict, grace_s: float = 5.0) -> dict:
    result = host.stop_job(_job(job), grace_s=grace_s)
    ctx.mark("job_stopped")
    return {"pid": _job(job).pid, "result": result}
