"""What a fault kind is: one definition of how it is injected and healed, on a lab and in the twin, live and
after a crash (`testbed heal`). The runner, the planner, heal and the CLI all ask the kind, never a table of
their own (docs/architecture.md, "Adding a fault kind").

A kind targets a rank of the job (gpu.fail, process.*, host.*), ports (link.down: a host's port or a switch's, the
fibre between them), or a device's connection (transport.*). Every kind answers:
- `lab_support`: None when it can be injected on a real lab, else why not (the CLI refuses the run up front);
- `inject(env, target) -> Injected` and `heal(env, target)` during a run (env: the twin's control, or None on a
  lab, and the device procedures);
- `heal_after_crash(lab, fault) -> str` for `testbed heal`, from what the dead run recorded;
- optionally `describe(params) -> str`: what the plan shows of its parameters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from testbed.contracts.twin import Twin

# A twin fault is scheduled this far ahead: more than a control request takes to reach the twin on a loaded
# machine (docs/tuning.md, "The twin's timing"). A trigger that still arrives late is sent again, further ahead.
TRIGGER_LEAD_NS = 20_000_000
TRIGGER_ATTEMPTS = 3


class FaultFailed(Exception):
    """The fault could not be injected or healed (the engine turns it into a failed step)."""


@dataclass(frozen=True)
class RankTarget:
    """The rank a fault hits: its index, host, GPU on that host, its job handle (pid, log), and the playbook's
    parameters of the fault (xid, duty, period_s).
    """

    index: int
    host: str
    gpu: int
    job: dict
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Injected:
    """When the fault took effect (monotonic ns), and whether the host's actor marked that moment itself
    (a signal's midpoint, recorded with its result) rather than the twin's timed trigger.
    """

    at_ns: int
    marked_by_device: bool = False


@dataclass
class FaultEnv:
    """What a fault kind may use during a run: the twin (None on a lab), the device procedures
    (`call(device, procedure, kwargs)` returns the procedure's result, marks included; raises on failure) and
    the run's inventory (what a kind needs of a device besides its driver, e.g. a host's BMC).
    """

    twin: Twin | None
    call: Callable[[str, str, dict], Any]
    inventory: Any = None


class HealLab(Protocol):
    """What `testbed heal` offers a kind: the dead run's devices and, if the twin outlived it, its control."""

    control: Any  # the twin's control (call(device, op, **args)), or None on a lab
    inventory: Any  # the dead run's inventory (testbed.documents.inventory.Inventory), or None

    def call(self, device: str, procedure: str, kwargs: dict, step: str) -> Any: ...


class DeadFault(Protocol):
    """A fault the dead run's history leaves active (testbed.ops.remains.ActiveFault)."""

    name: str
    kind: str
    device: str | None
    data: dict
    job: dict | None
    calls: list  # the device calls that succeeded inside its injection, with their results (e.g. an agent's pid)


class FaultKind(Protocol):
    name: str
    target: str  # "rank", "ports" (link.down: a fibre's ends) or "connection"
    lab_support: str | None

    # Optional: `describe(params) -> str`, the details `testbed plan` adds after the kind (", Xid 79").
    # Optional: `slows_only = True` for a rank kind that leaves the rank running (slower): no watcher sees it
    # fail, so fault.detect and failover refuse it (see `fails_a_rank`).

    def inject(self, env: FaultEnv, target: Any) -> Injected: ...

    def heal(self, env: FaultEnv, target: Any) -> None: ...

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str: ...


def fire_in_twin(twin: Twin, kind: str, device: str, op: str, args: dict) -> Injected:
    """A timed trigger: the twin applies the fault at a moment chosen here, on the clock both share, and that
    moment is the injection time. (The midpoint of a call that delivers a fault is off by up to half the
    call, and on a loaded machine a call's two halves differ by milliseconds.) The twin's ground truth
    records when it really took effect, so its lateness is measured, not assumed away.
    """
    lead = TRIGGER_LEAD_NS
    for _ in range(TRIGGER_ATTEMPTS):
        at = time.monotonic_ns() + lead
        if twin.fire_at(at, device, op, **args):
            return Injected(at)
        lead *= 4
    raise FaultFailed(
        f"{kind} on {device}: the twin received the timed fault after its moment {TRIGGER_ATTEMPTS} times "
        f"(last time {lead // 4_000_000} ms ahead); nothing was applied. This machine is overloaded: stop "
        "other work on it and run again"
    )


def twin_control(lab: HealLab, fault: DeadFault) -> Any:
    if lab.control is None:
        raise FaultFailed(f"{fault.name}: only the twin can heal a {fault.kind} so far, and it is not reachable")
    return lab.control


def fails_a_rank(kind: FaultKind) -> bool:
    """Whether the kind makes the rank it hits fail, so that a watcher sees it and a failover can replace its host
    (a connection's or a switch port's fault hits no rank; a straggler only slows one).
    """
    return kind.target == "rank" and not getattr(kind, "slows_only", False)
