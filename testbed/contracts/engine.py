"""What a step, a fault kind and the fabric service may ask of the engine (docs/architecture.md, "The engine's
surface"), in the manner of bluesky's protocols: plug-ins are typed against this, never against the engine's
classes (testbed.engine.coordinator.Coordinator is the one implementation). Reading the engine's state and
recording events is all they do directly; anything that changes the run's state is a method here or on the job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from testbed.contracts.job import JobView
from testbed.contracts.outcome import Call, Outcome
from testbed.contracts.recording import EventSink
from testbed.contracts.twin import Twin


class Executable(Protocol):
    """A planned step as the engine runs it: it executes itself against the engine it is handed. Every planned
    step (testbed.steps.base.Planned) declares it, so a reading of the code goes from the engine's call to the step.
    """

    label: str  # the step's label (progress, events, errors); an attribute, as the frozen steps hold it

    def execute(self, engine: StepEngine) -> None:
        """Do the step; StepFailed (or another ExperimentFailed) when it did not succeed."""

    def single_device(self) -> str | None:
        """The one device the step drives when consecutive such steps may go to its actor as one program (its
        `calls` then run there and `measured` reads their results); None for every other step.
        """

    def calls(self, engine: StepEngine) -> Mapping[str, tuple[str, dict[str, Any]]]:
        """A one-device step's procedure on its device, as `execute` would call it."""

    def measured(self, engine: StepEngine, results: Sequence[Outcome | None]) -> None:
        """Record what a one-device step measures from its calls' results, when they ran as part of a program."""


class FaultBudget(Protocol):
    """The run's interlock on faults active at once (max_concurrent_faults)."""

    def hold(self, label: str) -> AbstractContextManager[None]:
        """Count one more active fault for the block; StepFailed if the playbook's limit would be passed."""


class StepEngine(Protocol):
    """The engine as a planned step, a fault kind's recording and the fabric service see it."""

    @property
    def recorder(self) -> EventSink:
        """The run's event sink: every mark and measure a step takes goes there."""

    @property
    def pool(self) -> Executor:
        """Threads for a step's concurrent work (a parallel step's branches, a rewiring beside a stop)."""

    @property
    def stopping(self) -> Any:
        """A threading.Event set when the run ends or aborts: a step's own schedule waits on it."""

    @property
    def fault_budget(self) -> FaultBudget:
        """The max_concurrent_faults interlock."""

    @property
    def twin(self) -> Twin | None:
        """The twin's control in an emulated run; None on a lab."""

    @property
    def inventory(self) -> Any:
        """The run's inventory (testbed.documents.inventory.Inventory), validated."""

    @property
    def artifacts(self) -> Path | None:
        """The run folder, where a step keeps the files it produces; None when the run keeps none."""

    @property
    def ground_truth(self) -> Callable[[str], list[list[float]]] | None:
        """device -> its power transfer matrix, known to an emulated device only; None on a lab."""

    def has_ground_truth(self, device: str) -> bool:
        """Whether the device's family can tell its ground truth in the twin."""

    def operation(self, device: str, name: str) -> str:
        """The procedure that does a generic operation (identify, reconfigure, clear...) on the device's family."""

    def call(self, calls: Mapping[str, tuple[str, dict[str, Any]]], step: str) -> Mapping[str, Outcome]:
        """One procedure on each of several devices at once, every call recorded; StepFailed if any did not succeed."""

    def dispatch(
        self, programs: Mapping[str, Sequence[Call]], *, observe: bool = True
    ) -> Mapping[str, Sequence[Outcome | None]]:
        """Each device's calls in order on its actor, all devices at once, every call recorded. None for a call
        not run after an earlier one of its program failed; the results are not raised on.
        """

    def execute(self, step: Executable) -> None:
        """Run one planned step (a nested one: a parallel branch, rail.iterate's configurations)."""

    def require_jobs(self, label: str) -> JobView:
        """The playbook's job; StepFailed naming `label` when the playbook has none."""

    def next_fault_number(self) -> int:
        """A number unique in the run for a fault's own names (a proxy toxic's)."""
