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

from testbed.contracts.outcome import Outcome
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
    job: dict[str, Any]
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
    call: Callable[[str, str, dict[str, Any]], Outcome]
    inventory: Any = None  # testbed.documents.inventory.Inventory (a layer above this one), or None


class TwinCalls(Protocol):
    """The twin's control as `testbed heal` reaches a twin that outlived its run (emulators.control.TwinControl):
    operations only, no timed triggers.
    """

    def call(self, device: str | None, op: str, **args: Any) -> Any:
        """Run `op` on `device` (None: the twin itself) and return its answer."""


class HealLab(Protocol):
    """What `testbed heal` offers a kind: the dead run's devices and, if the twin outlived it, its control
    (testbed.ops.heal.HealDevices).
    """

    @property
    def control(self) -> TwinCalls | None:
        """The twin's control, or None on a lab (or when the twin went with the run)."""

    @property
    def inventory(self) -> Any:
        """The dead run's inventory (testbed.documents.inventory.Inventory, a layer above this one), or None."""

    def call(self, device: str, procedure: str, kwargs: dict[str, Any], step: str) -> Any:
        """One procedure on a device, recorded in the dead run's history; its value (JSON-like data, as the
        procedure returns it); raises if it did not succeed.
        """


class DeadFault(Protocol):
    """A fault the dead run's history leaves active (testbed.ops.remains.ActiveFault)."""

    @property
    def name(self) -> str:
        """The fault's name in the run's events (`kind@target`)."""

    @property
    def kind(self) -> str:
        """The fault kind's name."""

    @property
    def device(self) -> str | None:
        """The device of its fault.inject event (the host, the switch, the proxied device)."""

    @property
    def data(self) -> dict[str, Any]:
        """The fault's description, as fault.inject recorded it."""

    @property
    def job(self) -> dict[str, Any] | None:
        """The rank's job handle when the history tells it."""

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The device calls that succeeded inside its injection, with their results ({"op", "device", "value"}:
        e.g. the pid of the straggler agent gpu.straggle_start started).
        """


class FaultKind(Protocol):
    """One kind of fault: how it is injected and healed during a run, and healed after a crash.

    Optional members, read with getattr: `describe(params) -> str`, the details `testbed plan` adds after the
    kind (", Xid 79"); `lab_refusal(inventory, names) -> str | None`, why a lab run cannot inject it there;
    `marks_failed_on_lab = True` for a kind whose GPU is only marked failed on a lab; `slows_only = True` for a
    rank kind that leaves the rank running (slower): no watcher sees it fail, so fault.detect and failover refuse
    it (see `fails_a_rank`).
    """

    @property
    def name(self) -> str:
        """The kind's name in playbooks and events (`process.hang`)."""

    @property
    def target(self) -> str:
        """What it hits: "rank", "ports" (link.down: a fibre's ends) or "connection"."""

    @property
    def lab_support(self) -> str | None:
        """None when it can be injected on a real lab, else why not."""

    # `target` below is the kind's own target (RankTarget, PortTarget, ConnectionTarget, or a plug-in's own).

    def inject(self, env: FaultEnv, target: Any) -> Injected:
        """Inject the fault; when it took effect. FaultFailed when it certainly did not."""

    def heal(self, env: FaultEnv, target: Any) -> None:
        """Undo the fault; FaultFailed when it could not be."""

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        """Undo a fault a dead run left active, from what its history recorded; what was done, in words."""


def fire_in_twin(twin: Twin, kind: str, device: str, op: str, args: dict[str, Any]) -> Injected:
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


def twin_control(lab: HealLab, fault: DeadFault) -> TwinCalls:
    """The twin's control that outlived the dead run; FaultFailed when there is none (a lab, or a twin gone)."""
    if lab.control is None:
        raise FaultFailed(f"{fault.name}: only the twin can heal a {fault.kind} so far, and it is not reachable")
    return lab.control


def dead_device(fault: DeadFault, recorded: Any) -> str:
    """The device a dead run's fault hit: the one its data or job handle names (`recorded`), else its fault.inject
    event's; FaultFailed when the history names neither.
    """
    device = recorded or fault.device
    if not device:
        raise FaultFailed(f"{fault.name}: the history does not say which device the fault hit")
    return str(device)


def fails_a_rank(kind: FaultKind) -> bool:
    """Whether the kind makes the rank it hits fail, so that a watcher sees it and a failover can replace its host
    (a connection's or a switch port's fault hits no rank; a straggler only slows one).
    """
    return kind.target == "rank" and not getattr(kind, "slows_only", False)
