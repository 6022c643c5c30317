"""A fault on one of the job's ranks, injected and healed by its kind (testbed/faults, recorded by
testbed/faults/recording.py), and injected while every rank is watched (testbed/engine/job/detection.py).
"""

from __future__ import annotations

from collections.abc import Callable

from testbed.contracts.errors import StepFailed
from testbed.engine.job.detection import Detection, Watches
from testbed.engine.job.ranks import Rank
from testbed.faults import RankTarget, recording


def fault_data(kind: str, target: Rank, handles: dict[int, dict]) -> dict:
    """The fault's description in its events: what hit which rank (`testbed heal` needs the pid)."""
    return {
        "fault": f"{kind}@rank{target.index}",
        "kind": kind,
        "rank": target.index,
        "host": target.host,
        "gpu": target.local,
        "pid": (handles.get(target.index) or {}).get("pid"),
    }


def rank_target(step, r: Rank, job: dict) -> RankTarget:
    """What the fault kind hits: rank r as launched (its job handle), with the step's parameters."""
    return RankTarget(r.index, r.host, r.local, job, {"xid": step.xid})


def heal(coordinator, step, target: Rank, job: dict, data: dict) -> None:
    recording.heal(coordinator, step.kind, rank_target(step, target, job), step.label, target.host, data)


def inject_and_detect(
    coordinator,
    ranks: list[Rank],
    handles: dict[int, dict],
    progress: str,
    step,
    *,
    heal_at_once: bool,
    stop: Callable[[], None],
    on_detect: Callable[[int], None] | None = None,
) -> tuple[Rank, int, Detection, dict]:
    """Watch every rank, inject the fault once all are watching, wait for the first detection and `stop` the
    job (so every other watch ends). Heals the fault at once when `heal_at_once`; otherwise the caller heals.
    Returns (the rank hit, injection ns, the first detection (rank, ns, value), its job handle); raises
    StepFailed (the fault healed) when no watcher saw a failure.
    """
    target = ranks[step.rank]
    watches = Watches.start(coordinator, ranks, handles, progress, step)
    ready = watches.ready()
    data = fault_data(step.kind, target, handles)
    job = handles[target.index]
    injected = recording.inject(
        coordinator,
        step.kind,
        rank_target(step, target, job),
        step.label,
        target.host,
        {**data, "watching": ready},
    ).at_ns
    try:
        first = watches.first_failure(stop, on_detect)
    finally:
        if heal_at_once:
            heal(coordinator, step, target, job, data)
    if first is None:
        if not heal_at_once:
            heal(coordinator, step, target, job, data)
        raise StepFailed(
            f"{step.kind} on rank {target.index} ({target.host}) was not detected within {step.timeout_s:g} s"
        )
    return target, injected, first, job
