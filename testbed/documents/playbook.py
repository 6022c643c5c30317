"""Playbooks: an experiment as data. Steps run once per trial; setup and teardown run once per run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from testbed.config.common import Name, Strict
from testbed.config.sections import Configuration, Job, Schedule, Workload
from testbed.steps import step_union

if TYPE_CHECKING:
    from testbed.steps.base import StepModel as Step  # every step kind is one; the union is built at run time
else:
    # Every registered step kind (testbed/steps; another package's too), discriminated by `action`.
    Step = step_union()

__all__ = ["Playbook", "Step"]


class Playbook(Strict):
    name: Name
    description: str = ""
    inventory: str | None = Field(
        None,
        description="the inventory this playbook is written for, relative to the playbook's file: the commands "
        "use it when no --inventory is given (default: playbooks/inventory/emulated-rack.yaml)",
    )
    trials: int = Field(10, ge=1, le=1_000_000)
    seed: int = 0
    on_failure: Literal["abort", "continue"] = Field(
        "abort", description="after a failed trial: stop the run (teardown still runs) or go on with the next"
    )
    max_concurrent_faults: int = Field(
        1,
        ge=1,
        le=64,
        description="interlock: at most this many faults active at once (faults in `parallel` steps add up)",
    )
    on_actor_death: Literal["restart", "stop"] = Field(
        "restart",
        description="when a device actor's process dies mid-run, Ray restarts it (its driver reconnects) and "
        "the call it was running is recorded as info (outcome unknown); that trial fails, then restart: go on "
        "with the next trial; stop: end the run there (teardown and the final read-back still run)",
    )
    configurations: dict[Name, Configuration] = Field(default_factory=dict)
    schedules: dict[Name, Schedule] = Field(default_factory=dict)
    workloads: dict[Name, Workload] = Field(default_factory=dict)
    job: Job | None = None
    sweep: dict[Name, list[Any]] = Field(
        default_factory=dict,
        description="parameters to sweep; the trials run once per combination (cartesian product)",
    )
    setup: list[Step] = Field(default_factory=list)
    steps: list[Step] = Field(min_length=1)
    teardown: list[Step] = Field(default_factory=list)
