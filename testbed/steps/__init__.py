"""Step kinds, each one module (testbed.steps.base.StepModel), registered by `action`. Another package adds its
own under the `testbed.steps` entry-point group; a playbook may then use it like a built-in one.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Iterator
from typing import Annotated, Any

from pydantic import Field

from testbed.contracts.registry import Registry
from testbed.steps.base import CheckContext, Key, PlanContext, PlanError, Planned, PlanView, StepModel, Touches, walk
from testbed.steps.collective_allreduce import CollectiveAllreduce
from testbed.steps.collective_job import CollectiveStep
from testbed.steps.device_calibrate import DeviceCalibrate
from testbed.steps.fabric_apply import ApplyStep, FabricApply
from testbed.steps.fabric_clear import ClearStep, FabricClear
from testbed.steps.fabric_cycle import FabricCycle
from testbed.steps.failover import Failover, FailoverStep
from testbed.steps.fault_detect import FaultDetect, FaultDetectStep
from testbed.steps.fault_inject import FaultInject, FaultInjectStep
from testbed.steps.hosts_health import HealthStep, HostsHealth
from testbed.steps.job_measure import JobMeasure, JobMeasureStep
from testbed.steps.job_start import JobStart, JobStartStep
from testbed.steps.job_stop import JobStop, JobStopStep
from testbed.steps.parallel import Parallel, ParallelStep
from testbed.steps.rail_iterate import RailIterate, RailIterateStep
from testbed.steps.rail_train import RailTrain
from testbed.steps.rail_train_job import RailTrainStep
from testbed.steps.wait import Wait, WaitStep


def action_of(model: type[StepModel]) -> str:
    """The `action` a step kind's model declares (the one value of its Literal)."""
    return str(typing.get_args(model.model_fields["action"].annotation)[0])


STEP_KINDS: Registry[type[StepModel]] = Registry("step kind", "testbed.steps", action_of)
for _kind in (
    FabricApply,
    FabricCycle,
    FabricClear,
    DeviceCalibrate,
    JobStart,
    JobStop,
    JobMeasure,
    Failover,
    RailIterate,
    RailTrain,
    CollectiveAllreduce,
    FaultDetect,
    FaultInject,
    HostsHealth,
    Wait,
    Parallel,
):
    STEP_KINDS.register(_kind, builtin=True)


def step_union() -> Any:
    """The union of every registered step kind, discriminated by `action`; kinds that nest steps (`parallel`)
    are completed with it.
    """
    # A union of the kinds registered at run time: no static type can name it.
    union = Annotated[typing.Union[tuple(STEP_KINDS)], Field(discriminator="action")]  # type: ignore[valid-type]  # noqa: UP007
    for kind in STEP_KINDS:
        if not kind.__pydantic_complete__:
            kind.model_rebuild(_types_namespace={"Step": union})
    return union


def walk_located(steps: Iterable[StepModel], loc: Key) -> Iterator[tuple[Key, StepModel]]:
    """Every step of a playbook section with its key path, nested steps included."""
    for i, step in enumerate(steps):
        yield (*loc, i), step
        yield from walk_located(step.nested(), (*loc, i, "steps"))  # `parallel` nests under its `steps`


__all__ = [
    "STEP_KINDS",
    "ApplyStep",
    "CheckContext",
    "ClearStep",
    "CollectiveStep",
    "FailoverStep",
    "FaultDetectStep",
    "FaultInjectStep",
    "HealthStep",
    "JobMeasureStep",
    "JobStartStep",
    "JobStopStep",
    "ParallelStep",
    "PlanContext",
    "PlanError",
    "PlanView",
    "Planned",
    "RailIterateStep",
    "RailTrainStep",
    "StepModel",
    "Touches",
    "WaitStep",
    "step_union",
    "walk",
    "walk_located",
]
