"""The job on the GPU hosts, as the engine runs it (`JobController`, testbed/engine/job/controller.py).

Its parts, each one idea: `ranks` (which host runs each rank), `ports` and `layout` (where a launch's ranks
listen and how each reaches the others), `launcher` with `direct_launcher` and `torchrun_launcher` (starting
and stopping the ranks: each rank by testbed itself, or one torchrun per host, docs/jobs.md), `fabric` (the
switches holding the job's topology), `detection` (the watchers that see a rank fail) and `injection` (a fault
on a rank, injected while every rank is watched). The steps that use a job (job.*, fault.*, failover) are in
testbed/steps.
"""

from testbed.engine.job.controller import JobController
from testbed.engine.job.detection import failed_rank, watcher
from testbed.engine.job.ranks import Rank

__all__ = ["JobController", "Rank", "failed_rank", "watcher"]
