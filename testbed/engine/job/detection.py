"""Seeing a rank fail: a watcher per rank, on a second actor per host (its own SSH connection, two threads) so
that watching never blocks the host's actor. Every rank is watched from before a fault is injected until the
failure is seen; the first failure names the rank that failed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from testbed.engine.job.ranks import Rank
from testbed.events import Op

if TYPE_CHECKING:
    from testbed.engine.device_actor import OpResult

WATCH_READY_TIMEOUT_S = 20.0
# What gpu.watch_job reports when the host itself shows the fault, not just the process's exit.
HARDWARE_FAILURES = {"gpu_lost", "xid", "host_lost"}  # evidence that the rank's own hardware failed

Detection = tuple[int, int, dict]  # (rank, failure_detected ns, the watch_job value)


def watcher(host: str) -> str:
    """The name of a host's watcher actor (its second connection, which follows the rank's log)."""
    return f"{host} (watcher)"


def failed_rank(detections: list[Detection]) -> Detection | None:
    """Which rank failed, from every watcher's (rank, failure_detected ns, watch_job value): the earliest
    with hardware evidence (a GPU lost, a new Xid), else the earliest. When a rank dies its peers exit too,
    as their ring breaks, and a peer's watcher can see its own rank's exit first: its liveness check runs
    right after the peer's last words, the failed rank's only at its next heartbeat.
    """
    evidence = [d for d in detections if d[2].get("detected") in HARDWARE_FAILURES]
    return min(evidence or detections, key=lambda d: d[1], default=None)


class Watches:
    """Every rank's watcher over one fault step (step: heartbeat_s, stall_timeout_s, timeout_s, label), started
    together, each following its rank's job for `progress`.
    """

    def __init__(self, coordinator, ranks: list[Rank], step, pending: dict, tokens: dict[int, str]) -> None:
        self.c = coordinator
        self.ranks = ranks
        self.step = step
        self.pending = pending  # rank -> its watcher's call
        self.tokens = tokens  # rank -> the token its watch runs under: a wait for its milestones ends with it
        self.recorded: set[int] = set()  # ranks whose watcher's outcome is in the history

    @classmethod
    def start(cls, coordinator, ranks: list[Rank], handles: dict[int, dict], progress: str, step) -> Watches:
        """Start every rank's watcher, each recorded (`gpu.watch_job` invoked) as it is started."""
        pending, tokens = {}, {}
        for r in ranks:
            kwargs = {
                "job": handles[r.index],
                "heartbeat_s": step.heartbeat_s,
                "stall_timeout_s": step.stall_timeout_s,
                "progress": progress,
                "max_s": step.timeout_s,
            }
            coordinator.recorder.emit("invoke", "gpu.watch_job", device=r.host, step=step.label, data={"rank": r.index})
            tokens[r.index] = token = uuid.uuid4().hex
            pending[r.index] = coordinator.dispatcher.call(
                watcher(r.host), "run_program", [("gpu.watch_job", kwargs)], token
            )
        return cls(coordinator, ranks, step, pending, tokens)

    def ready(self) -> bool:
        """Wait until every watcher is watching (or WATCH_READY_TIMEOUT_S); whether all of them are."""
        dispatcher = self.c.dispatcher
        watching = [
            dispatcher.call(watcher(r.host), "wait_mark", "watching", WATCH_READY_TIMEOUT_S, self.tokens[r.index])
            for r in self.ranks
        ]
        return all([w.result() for w in watching])

    def first_failure(
        self, stop: Callable[[], None], on_detect: Callable[[int], None] | None = None
    ) -> Detection | None:
        """Wait for the first watcher to see a failure, `stop` the job (so every other watch ends), then record
        every watcher's outcome. Returns (rank, detection time, its value) or None. `on_detect(rank)` runs as
        soon as a failure is seen, before the job is torn down (a failover starts rewiring then).
        """
        dispatcher = self.c.dispatcher
        limit = self.step.timeout_s + WATCH_READY_TIMEOUT_S
        if on_detect is not None:
            # (Once the job is stopped every watcher marks an exit, so none of these waits lingers.)
            self._first_seen(limit, on_detect)
        dispatcher.wait(list(self.pending.values()), timeout=limit)
        stop()
        results, errors = self.close()
        if errors:
            raise errors[0]  # a watcher's actor died, or a watch did not end: recorded as info, the trial fails
        return self._detection(results)

    def first_failure_in_place(
        self, failed: int, end: Callable[[], None], on_detect: Callable[[int], None] | None = None
    ) -> Detection | None:
        """In-job recovery: the ranks that survive go on training, and their watches with them. Wait for the first
        watcher to see a failure (`on_detect(rank)` at once), `end` the failed rank (the one the fault hit: it may
        hang rather than exit), and record the outcomes of the watches that ended: the failed rank's, and any
        survivor's that saw a stall. The others stay pending, closed when the job stops (`close`).
        """
        dispatcher = self.c.dispatcher
        limit = self.step.timeout_s + WATCH_READY_TIMEOUT_S
        seen = self._first_seen(limit, on_detect)
        if seen is None:
            return None  # nothing seen: the step fails, and the run stops the job (every watch ends then)
        end()
        # the failed rank's watch ends as its process does, and the first to see the failure (perhaps a survivor's
        # that saw a stall: a host that lost power is seen only so) returns once it has taken its evidence
        for rank in dict.fromkeys([failed, seen]):
            dispatcher.wait([self.pending[rank]], timeout=limit)
        # each asked alone: a Ray wait returns one of the calls done, not all of them
        ended = {rank for rank, call in self.pending.items() if dispatcher.wait([call], timeout=0)[0]}
        results, errors = self.close(only=ended)
        if errors:
            raise errors[0]
        return self._detection(results)

    def _first_seen(self, limit: float, on_detect: Callable[[int], None] | None) -> int | None:
        """The rank whose watcher marks failure_detected first (None: none within `limit`), `on_detect` run at once.
        It reacts to the milestone itself, not to the procedure's return: after marking failure_detected a watcher
        still takes a health probe for the evidence, which the failover need not wait for.
        """
        dispatcher = self.c.dispatcher
        seen = {
            dispatcher.call(
                watcher(self.ranks[rank].host), "wait_mark", Op.FAILURE_DETECTED, limit, self.tokens[rank]
            ): rank
            for rank in self.pending
        }
        waiting = list(seen)
        while waiting:
            done, waiting = dispatcher.wait(waiting, timeout=limit)
            if not done:
                return None
            if done[0].result():
                if on_detect is not None:
                    on_detect(seen[done[0]])
                return seen[done[0]]
        return None

    def _detection(self, results: dict[int, OpResult]) -> Detection | None:
        detections = []
        for rank, result in results.items():
            mark = result.marks.get(Op.FAILURE_DETECTED) if result.status == "ok" else None
            watched = cast(dict, result.value or {})  # gpu.watch_job's value is a dict (the gpu_host family)
            if mark and watched.get("detected"):
                detections.append((rank, mark[0], watched))
        return failed_rank(detections)

    def close(self, only: set[int] | None = None) -> tuple[dict[int, OpResult], list[Exception]]:
        """Every watcher's outcome recorded, once: each watch ends when its rank's job does (the job is stopped
        by now, or its host is gone) or at its own time limit. A watcher that does not answer within that limit,
        or whose actor died, is recorded as `info` (its outcome unknown). Returns the outcomes that came back, and
        why the others did not.
        """
        deadline = time.monotonic() + self.step.timeout_s + WATCH_READY_TIMEOUT_S
        results: dict[int, OpResult] = {}
        errors: list[Exception] = []
        for rank, call in self.pending.items():
            if rank in self.recorded or (only is not None and rank not in only):
                continue
            self.recorded.add(rank)
            host = self.ranks[rank].host
            try:
                (result,) = call.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:  # no answer in time, or the watcher's actor died
                error = f"outcome unknown: the watch gave no answer ({type(exc).__name__}: {exc})"
                self.c.recorder.emit("info", "gpu.watch_job", device=host, step=self.step.label, data={"error": error})
                errors.append(exc)
                continue
            self.c.record(host, self.step.label, "gpu.watch_job", result)
            results[rank] = result
        return results, errors
