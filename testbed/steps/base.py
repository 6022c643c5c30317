"""What a step kind is. A kind is one module (docs/architecture.md, "Adding a step kind"):

- its model: a pydantic class with `action: Literal["..."]`, validated at the boundary like every playbook key;
- `check(ctx)`: what the playbook (and the inventory) must hold for it, as located problems;
- `plan(ctx)`: the steps the engine will execute (plain frozen dataclasses, `Planned` below);
- each planned step's `execute(engine)` and `describe(node, plan)` (the line `testbed plan` prints), and what
  it touches (`devices()`), which the planner sums into the run's device list and its writes.

A planned step sees the engine only as `testbed.contracts.engine.StepEngine` and the plan only as `PlanView`
below: what it may read, and the engine's methods for what it may change (docs/architecture.md, "The engine's
surface"). The type checker holds every step to them.

Nested steps (`parallel`) are walked by one walker, `walk`, through `nested()`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pydantic import Field
from rich.tree import Tree

from testbed.config.common import Strict, param_name
from testbed.contracts.engine import Executable, StepEngine
from testbed.contracts.errors import UserError
from testbed.contracts.outcome import Outcome

Key = tuple[str | int, ...]  # a key path in the playbook: ("steps", 2, "fault")
Problem = tuple[Key, str]  # (key path, message)
Pair = tuple[int, int]


class PlanError(UserError):
    """The playbook cannot run on this inventory (an interlock, a missing fibre)."""


@dataclass
class CheckContext:
    """What a step's static check may look at: the playbook, and the inventory when one is given."""

    playbook: Any
    inventory: Any | None

    def sweep_ref(self, value: object, key: Key) -> list[Problem]:
        """A `${name}` that names no parameter under `sweep` is a problem at `key`."""
        if isinstance(value, str) and value.startswith("${") and param_name(value) not in self.playbook.sweep:
            return [(key, f"{value} names no parameter under `sweep`")]
        return []


@dataclass
class PlanContext:
    """What a step's planning may use: the trial's sweep point and seeded generator, and what the planner
    resolved once for the whole playbook (every configuration's circuits, the ports the run manages).
    """

    playbook: Any
    inventory: Any
    point: dict[str, Any]
    rng: random.Random
    circuits: dict[str, dict[str, tuple[Pair, ...]]]  # configuration -> switch -> circuits
    managed: dict[str, tuple[int, ...]]  # switch -> ports the playbook's configurations use
    schedules: dict[str, list[str]]  # schedule -> the names of its generated configurations

    @property
    def world(self) -> int:
        """The job's number of ranks (0 when the playbook has no job)."""
        job = self.playbook.job
        return len(job.ranks) if job is not None else 0

    def swept(self, value: Any) -> Any:
        """A value, or the sweep point's value of a `${name}` parameter."""
        return self.point[param_name(value)] if isinstance(value, str) and value.startswith("${") else value

    def draw(self, choice: Any) -> Any:
        """A value, or one drawn from a list with the trial's seeded generator (a chaos run repeats exactly)."""
        return self.rng.choice(choice) if isinstance(choice, list) else choice

    def target_rank(self, target: str) -> int:
        """rank:N, or rank:random drawn from the trial's seeded generator."""
        which = target.split(":")[1]
        return self.rng.randrange(self.world) if which == "random" else int(which)


class PlanView(Protocol):
    """The plan as a planned step describes itself against it (testbed.plan.Plan is the one implementation)."""

    @property
    def playbook(self) -> Any:
        """The validated playbook (testbed.documents.playbook.Playbook)."""

    @property
    def spares(self) -> Sequence[str]:
        """The hosts a failover may move a rank to."""

    @property
    def job_managed(self) -> Mapping[str, tuple[int, ...]]:
        """switch -> every port the job's fabric may use, whichever hosts (spares included) hold the ranks."""


@dataclass(frozen=True)
class Touches:
    """The devices a planned step reads and writes (the plan's device list and its confirmation prompt)."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()


# What a step kind may need of the playbook (`StepModel.needs`), and the problem when the playbook lacks it.
NEEDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "job": (lambda pb: pb.job is not None, "{action} needs a `job:` section in the playbook"),
    "job.fabric": (
        lambda pb: pb.job is not None and pb.job.fabric is not None,
        "{action} needs a `job:` with a `fabric:` to rewire",
    ),
}


class StepModel(Strict):
    """Base of every step kind's model."""

    # What the kind needs of the playbook (keys of NEEDS), checked for every step before its own check, which
    # runs only when they are met: a kind declares them instead of testing for them.
    needs: ClassVar[frozenset[str]] = frozenset()

    name: str | None = Field(None, description="label shown in progress and events; default derived")

    def action_name(self) -> str:
        """The step's `action` (every kind declares it as a Literal)."""
        return str(getattr(self, "action", type(self).__name__))

    def unmet_needs(self, ctx: CheckContext) -> list[Problem]:
        """A problem at `action` for each of the kind's needs that the playbook does not meet."""
        return [
            (("action",), NEEDS[need][1].format(action=self.action_name()))
            for need in sorted(self.needs)
            if not NEEDS[need][0](ctx.playbook)
        ]

    def check(self, ctx: CheckContext) -> list[Problem]:
        """Located problems of the step in this playbook (and inventory, when given); its needs are met."""
        return []

    def plan(self, ctx: PlanContext) -> tuple[Planned, ...]:
        """The steps the engine executes for this one, for the trial's sweep point; PlanError when it cannot run."""
        raise NotImplementedError(f"{type(self).__name__} has no plan()")

    def nested(self) -> list[StepModel]:
        """The steps written inside this one (a parallel step's `steps`)."""
        return []


@dataclass(frozen=True)
class Planned(Executable):
    """Base of every planned step: what the engine executes and `testbed plan` shows."""

    label: str
    faults: ClassVar[int] = 0  # faults the step keeps active at once (the max_concurrent_faults interlock)

    def execute(self, engine: StepEngine) -> None:
        """Do the step against the engine; StepFailed (or another ExperimentFailed) when it did not succeed."""
        raise NotImplementedError(f"{type(self).__name__} has no execute()")

    def describe(self, node: Tree, plan: PlanView) -> None:
        """Add what the step will do to `testbed plan`'s tree: every call it will make, in words."""
        node.add(escape(self.label))

    def nested(self) -> tuple[Planned, ...]:
        """The steps it runs inside itself (a parallel step's branches)."""
        return ()

    def devices(self, plan: PlanView) -> Touches:
        """The devices it reads and writes (the plan's device list, its confirmation prompt, the leases)."""
        return Touches()

    def single_device(self) -> str | None:
        """The one device this step drives, when consecutive such steps may go to its actor as one program."""
        return None

    def calls(self, engine: StepEngine) -> Mapping[str, tuple[str, dict[str, Any]]]:
        """A one-device step's procedure on its device (only steps whose single_device is not None have one)."""
        raise NotImplementedError(f"{type(self).__name__} drives no one device")

    def measured(self, engine: StepEngine, results: Sequence[Outcome | None]) -> None:
        """What a one-device step records from its calls' results once they ran in a program: nothing by default."""


def walk(steps: Iterable[Any]) -> Iterator[Any]:
    """Every step, and the steps nested in it (models and planned steps alike)."""
    for step in steps:
        yield step
        yield from walk(step.nested())


def escape(text: str) -> str:
    """User text in the plan view is never rich markup ([rows, cols] is not a style)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)
