"""Faults beyond the job's ranks: the concurrency interlock shared by every fault step, and transport.*
faults, which the twin's fault proxy applies to the connection between a driver and its device.

Every fault is an invoke / ok (or fail) `fault.inject` followed, after its duration, by `fault.heal`, with
the fault's description in both, so `testbed check` and `testbed heal` can tell what was left active.
"""

from __future__ import annotations

import contextlib
import threading
import time

from testbed.errors import ExperimentFailed
from testbed.events import Op
from testbed.plan import FaultInjectStep

# transport kind -> the proxy's toxic type; `down` is not a toxic: the proxy refuses and cuts connections.
TOXIC = {
    "transport.latency": "latency",
    "transport.bandwidth": "bandwidth",
    "transport.slow_close": "slow_close",
    "transport.timeout": "timeout",
    "transport.reset_peer": "reset_peer",
    "transport.slicer": "slicer",
    "transport.limit_data": "limit_data",
}


def _failed(message: str) -> ExperimentFailed:
    from testbed.runner.coordinator import StepFailed  # the coordinator builds on this module

    return StepFailed(message)


class FaultBudget:
    """Interlock: at most `limit` faults active at once across the run (checked at plan time for `parallel`
    steps, and here again whatever the plan said)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._active: list[str] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, label: str):
        with self._lock:
            if len(self._active) >= self.limit:
                raise _failed(
                    f"interlock: {label!r} would be fault number {len(self._active) + 1} active at once "
                    f"(active: {', '.join(self._active)}); the playbook allows max_concurrent_faults: {self.limit}"
                )
            self._active.append(label)
        try:
            yield
        finally:
            with self._lock:
                self._active.remove(label)


class TransportFaults:
    """transport.* faults through the twin's fault proxy (emulators/proxy, driven by its control API)."""

    def __init__(self, recorder, twin_control, stopping: threading.Event | None = None) -> None:
        self.recorder = recorder
        self.twin = twin_control
        self.stopping = stopping or threading.Event()  # set on abort: a fault under way is healed at once
        self._count = 0

    def inject(self, step: FaultInjectStep) -> None:
        self._count += 1
        toxic = f"{step.kind.removeprefix('transport.')}-{self._count}"
        data = {
            "fault": f"{step.kind}@{step.device}",
            "kind": step.kind,
            "device": step.device,
            "toxic": toxic,
            "stream": step.stream,
            "attributes": dict(step.attributes),
            "duration_s": step.duration_s,
        }
        if step.when_s:
            self.stopping.wait(step.when_s)  # the playbook's schedule for the fault, not synchronisation
        self.recorder.emit("invoke", Op.FAULT_INJECT, device=step.device, step=step.label, data=data)
        t0 = time.monotonic_ns()
        try:
            if step.kind == "transport.down":
                self.twin.call(step.device, "proxy.set_enabled", enabled=False)
            else:
                self.twin.call(
                    step.device,
                    "proxy.add_toxic",
                    name=toxic,
                    type=TOXIC[step.kind],
                    stream=step.stream,
                    attributes=dict(step.attributes),
                )
        except Exception as exc:  # the twin refused (no proxy, bad attribute) or is gone: nothing was applied
            self.recorder.emit("fail", Op.FAULT_INJECT, device=step.device, step=step.label, data=data)
            raise _failed(f"{step.label}: the twin's fault proxy refused {step.kind}: {exc}") from None
        injected = (t0 + time.monotonic_ns()) // 2
        self.recorder.emit("ok", Op.FAULT_INJECT, device=step.device, step=step.label, data=data)
        self.recorder.emit("mark", Op.FAULT_INJECTED, mono_ns=injected, wall=time.time(), device=step.device,
                           step=step.label, data=data)  # fmt: skip
        try:
            self.stopping.wait(step.duration_s)  # how long the playbook keeps the fault; an abort cuts it short
        finally:
            self.heal(step, data)

    def heal(self, step: FaultInjectStep, data: dict) -> None:
        self.recorder.emit("invoke", Op.FAULT_HEAL, device=step.device, step=step.label, data=data)
        try:
            if step.kind == "transport.down":
                self.twin.call(step.device, "proxy.set_enabled", enabled=True)
            else:
                self.twin.call(step.device, "proxy.remove_toxic", name=data["toxic"])
        except Exception as exc:
            self.recorder.emit("fail", Op.FAULT_HEAL, device=step.device, step=step.label, data=data)
            raise _failed(f"{step.label}: could not heal {step.kind} on {step.device}: {exc}") from None
        self.recorder.emit("ok", Op.FAULT_HEAL, device=step.device, step=step.label, data=data)
