"""Injecting and healing a fault as the engine records it, whatever its kind (testbed/faults): the same events
for every kind, so `testbed check` and `testbed heal` can tell what a run left active.

A fault is an invoke / ok (or fail) `fault.inject` followed, later, by `fault.heal`, with the fault's
description (`data`) in both. Its moment of injection is a `fault_injected` mark: taken here for a timed
trigger in the twin or a call that applied it; taken by the host's actor for a signal (recorded with that
call's result), in which case a `fault_described` mark adds the fault's description.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from testbed.contracts import engine as contract
from testbed.contracts.engine import StepEngine
from testbed.contracts.errors import OutcomeUnknown, StepFailed
from testbed.events import Op
from testbed.faults import FAULT_KINDS, FaultEnv, FaultFailed, Injected


def fault_env(engine: StepEngine, label: str) -> FaultEnv:
    """What a fault kind may use in this run: the twin (None on a lab), the device procedures, the inventory."""

    def call(device: str, procedure: str, kwargs: dict[str, Any]) -> Any:
        return engine.call({device: (procedure, kwargs)}, label)[device]

    return FaultEnv(engine.twin, call, engine.inventory)


class InjectionUnknown(StepFailed):
    """The injection failed in a way that leaves it unknown whether the fault took effect: it is healed all the
    same.
    """


def inject(engine: StepEngine, kind: str, target: Any, label: str, device: str, data: dict[str, Any]) -> Injected:
    """Inject one fault, recorded. Raises StepFailed (recorded as `fail`) when it certainly did not take effect,
    InjectionUnknown (recorded as `info`) when it may have; any other exception is recorded as `info` too.
    """
    fault = FAULT_KINDS.get(kind)
    engine.recorder.emit("invoke", Op.FAULT_INJECT, device=device, step=label, data=data)
    try:
        injected = fault.inject(fault_env(engine, label), target)
    except OutcomeUnknown as exc:
        engine.recorder.emit("info", Op.FAULT_INJECT, device=device, step=label, data={**data, "error": str(exc)})
        raise InjectionUnknown(f"{label}: {exc}") from None
    except (FaultFailed, StepFailed) as exc:
        engine.recorder.emit("fail", Op.FAULT_INJECT, device=device, step=label, data={**data, "error": str(exc)})
        raise StepFailed(f"{label}: {exc}") from None
    except BaseException as exc:  # an abort, a lost actor, lapsed leases: the fault may be in place
        error = f"outcome unknown: {type(exc).__name__}: {exc}"
        engine.recorder.emit("info", Op.FAULT_INJECT, device=device, step=label, data={**data, "error": error})
        raise
    engine.recorder.emit("ok", Op.FAULT_INJECT, device=device, step=label, data=data)
    if injected.marked_by_device:
        engine.recorder.emit(
            "mark", Op.FAULT_DESCRIBED, device=device, step=label, data={**data, "injected_ns": injected.at_ns}
        )
    else:
        engine.recorder.emit(
            "mark", Op.FAULT_INJECTED, mono_ns=injected.at_ns, wall=time.time(), device=device, step=label, data=data
        )
    if engine.twin is None and getattr(fault, "marks_failed_on_lab", False):
        engine.recorder.emit("mark", Op.GPU_MARKED_FAILED, device=device, step=label, data=data)
    return injected


def heal(engine: StepEngine, kind: str, target: Any, label: str, device: str, data: dict[str, Any]) -> None:
    """Heal one fault, recorded; raises StepFailed (recorded as `fail`) when it could not be."""
    engine.recorder.emit("invoke", Op.FAULT_HEAL, device=device, step=label, data=data)
    try:
        FAULT_KINDS.get(kind).heal(fault_env(engine, label), target)
    except (FaultFailed, StepFailed) as exc:
        engine.recorder.emit("fail", Op.FAULT_HEAL, device=device, step=label, data={**data, "error": str(exc)})
        raise StepFailed(f"{label}: could not heal {kind}: {exc}") from None
    except BaseException as exc:
        error = f"outcome unknown: {type(exc).__name__}: {exc}"
        engine.recorder.emit("info", Op.FAULT_HEAL, device=device, step=label, data={**data, "error": error})
        raise
    engine.recorder.emit("ok", Op.FAULT_HEAL, device=device, step=label, data=data)


@contextlib.contextmanager
def held(
    engine: StepEngine, kind: str, target: Any, label: str, device: str, data: dict[str, Any]
) -> Iterator[Injected]:
    """The fault injected for the block and healed when the block ends, however it ends (a failed step or trial,
    an abort): the promise of docs/faults.md. An injection that may have taken effect is healed too; one that
    certainly did not leaves nothing to heal. A heal that fails while another error ends the block is recorded
    and noted on that error, which is the one raised.
    """
    try:
        injected = inject(engine, kind, target, label, device, data)
    except StepFailed as exc:
        if isinstance(exc, InjectionUnknown):
            _heal_noting(engine, kind, target, label, device, data, exc)
        raise
    except BaseException as exc:
        _heal_noting(engine, kind, target, label, device, data, exc)
        raise
    try:
        yield injected
    except BaseException as exc:
        _heal_noting(engine, kind, target, label, device, data, exc)
        raise
    heal(engine, kind, target, label, device, data)


def _heal_noting(
    engine: StepEngine, kind: str, target: Any, label: str, device: str, data: dict[str, Any], error: BaseException
) -> None:
    try:
        heal(engine, kind, target, label, device, data)
    except BaseException as failed:  # recorded as the heal's outcome; the error that ended the block stands
        error.add_note(f"and healing {kind} failed: {failed}")


class FaultBudget(contract.FaultBudget):
    """Interlock: at most `limit` faults active at once across the run (checked at plan time for `parallel`
    steps, and here again whatever the plan said).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._active: list[str] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, label: str) -> Iterator[None]:
        """Count one more active fault for the block; StepFailed if the playbook's limit would be passed."""
        with self._lock:
            if len(self._active) >= self.limit:
                raise StepFailed(
                    f"interlock: {label!r} would be fault number {len(self._active) + 1} active at once "
                    f"(active: {', '.join(self._active)}); the playbook allows max_concurrent_faults: {self.limit}"
                )
            self._active.append(label)
        try:
            yield
        finally:
            with self._lock:
                self._active.remove(label)
