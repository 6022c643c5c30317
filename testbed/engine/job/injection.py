"""A fault on one of the job's ranks, injected while every rank is watched (testbed/engine/job/detection.py), and
healed when the step that holds it ends, however it ends (testbed/faults/recording.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from testbed.contracts.errors import StepFailed
from testbed.contracts.job import RankView
from testbed.engine.job.detection import Detection, Watches
from testbed.engine.job.ranks import Rank
from testbed.faults import RankTarget, recording


def fault_data(kind: str, target: RankView, handles: dict[int, dict]) -> dict[str, Any]:
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


@dataclass
class RankFault:
    """A fault in place on `target` (its job handle `job`), every rank watched; `detect` waits for the failure."""

    target: Rank
    injected_ns: int
    job: dict
    data: dict
    watches: Watches
    stop: Callable[[], None]
    kind: str
    timeout_s: float
    in_place: bool = False  # in-job recovery: the survivors keep running (and their watches with them)

    def detect(self, on_detect: Callable[[int], None] | None = None) -> Detection:
        """The first failure a watcher saw (rank, ns, value), once the job is stopped; StepFailed if none was seen
        within the step's timeout. `on_detect(rank seen)` runs the moment a failure is seen.
        """
        if self.in_place:
            first = self.watches.first_failure_in_place(self.target.index, self.stop, on_detect)
        else:
            first = self.watches.first_failure(self.stop, on_detect)
        if first is None:
            raise StepFailed(
                f"{self.kind} on rank {self.target.index} ({self.target.host}) was not detected within "
                f"{self.timeout_s:g} s"
            )
        return first


@contextlib.contextmanager
def fault_on_rank(
    coordinator,
    ranks: list[Rank],
    handles: dict[int, dict],
    progress: str,
    step,
    stop: Callable[[], None],
    keep: Callable[[Watches], None] | None = None,
) -> Iterator[RankFault]:
    """Watch every rank, inject the step's fault on its rank once all are watching, and yield it; on leaving, the
    fault is healed and every watcher's outcome recorded, whatever ended the block. With `keep` (in-job recovery:
    `stop` ends the failed rank alone), the watches of the ranks still running are handed to it instead, to be
    closed once those ranks stop.
    """
    target = ranks[step.rank]
    job = handles[target.index]
    data = fault_data(step.kind, target, handles)
    watches = Watches.start(coordinator, ranks, handles, progress, step)
    try:
        ready = watches.ready()
        rank = rank_target(step, target, job)
        with recording.held(coordinator, step.kind, rank, step.label, target.host, {**data, "watching": ready}) as f:
            yield RankFault(target, f.at_ns, job, data, watches, stop, step.kind, step.timeout_s, keep is not None)
    finally:
        if keep is not None:
            keep(watches)
        else:
            watches.close()
