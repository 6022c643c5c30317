"""What a launcher is: the programs that start a launch's ranks on their hosts' actors, what their results
leave running, and the programs that stop it. One launcher per `job.launcher` kind: testbed starts each rank
itself (testbed/engine/job/direct_launcher.py) or one torchrun per host does
(testbed/engine/job/torchrun_launcher.py, docs/jobs.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from testbed.config.sections import Job
from testbed.engine.device_actor import OpResult
from testbed.engine.job.layout import Layout
from testbed.engine.job.ranks import Rank
from testbed.events import Op

# testbed-train's line once its ring is up: the step it resumed from (the job_ready milestone).
READY = r"^ready rank \d+ world \d+ step (\d+)"

Programs = dict[str, list[tuple[str, str, dict]]]  # host -> its actor's calls (label, procedure, kwargs), in order


@dataclass(frozen=True)
class Launch:
    """One launch of the job's ranks: everything a launcher needs to start them."""

    label: str
    number: int  # the launches so far, this one included: each launch names its ranks' jobs afresh
    job: Job
    layout: Layout
    run_id: str
    # the job.start this launch belongs to (a failover's relaunch keeps it): its ranks resume only from the
    # checkpoints of that start, never from another trial's or another run's on the same host
    generation: int = 1
    # host -> the environment its ranks find the job's fabric service by (each host told the address it reaches)
    service_env: Callable[[str], dict[str, str]] = field(default=lambda host: {})
    # More of a rank's environment, computed once its listen ports are known (rail.train's routes)
    rank_env: Callable[[Rank], dict[str, str]] | None = None
    watch: int | None = None  # the rank whose log is followed to its first training step
    timeout_s: float = 120.0  # for that watch

    @property
    def ranks(self) -> list[Rank]:
        return self.layout.ranks

    def workdir(self, slot: str) -> str:
        """The directory, in the host's home, of a rank or node slot: kept across the relaunches of one job.start
        (a spare takes the slot of the host it replaces), new for each start and each run (docs/jobs.md).
        """
        return f"testbed-jobs/{re.sub(r'[^A-Za-z0-9_.-]', '-', self.run_id)}/start{self.generation}/{slot}"

    def extra_env(self, r: Rank) -> dict[str, str]:
        return self.rank_env(r) if self.rank_env is not None else {}

    def watch_step(self, job_name: str) -> tuple[str, str, dict]:
        """The call that follows the watched rank's log (named job_name) to its ready line and first step."""
        args: dict[str, object] = {"job": job_name, "progress": self.job.progress, "ready": READY}
        args.update(min_step=0, max_s=self.timeout_s, mark=Op.FIRST_STEP)
        return (self.label, "gpu.wait_step", args)


@dataclass
class Started:
    """What a launch started: each rank's start result (its job_started mark), the job handles (pid, log) of the
    ranks and launchers that did start, the watched rank's result, and the start results to raise on (each once).
    """

    results: dict[int, OpResult] = field(default_factory=dict)
    handles: dict[int, dict] = field(default_factory=dict)
    launchers: dict[str, dict] = field(default_factory=dict)
    watched: OpResult | None = None
    failures: list = field(default_factory=list)


class Launcher(Protocol):
    def programs(self, launch: Launch) -> Programs:
        """Each host's calls that start its part of the launch (and follow the watched rank's log)."""

    def started(self, launch: Launch, results: dict[str, list]) -> Started:
        """What those calls' results (host -> one result per call) leave running."""

    def stop_programs(
        self, label: str, ranks: list[Rank], handles: dict[int, dict], launchers: dict[str, dict]
    ) -> Programs:
        """Each host's calls that stop what runs (the ranks' handles, the launchers' handles)."""
