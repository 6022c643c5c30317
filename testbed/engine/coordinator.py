"""The engine: executes a plan's steps against the device actors and turns their results into events.

The coordinator only sequences: devices are driven inside their actors, and every time it records for device
I/O comes from there. Each planned step executes itself (testbed/steps) through what the coordinator offers:
`call` one procedure on several devices at once, `dispatch` programs of calls, the recorder, the job, the
fault budget. Consecutive steps that drive one and the same device go to its actor as one program, so a trial
pays one round trip per device rather than one per step. The actors are reached through a Dispatcher (Ray in
a run, in-process objects in a unit test: testbed/engine/dispatch.py).

Every operation is recorded as `invoke` before it is submitted, and closed by `ok`, `fail` or `info` when its
result arrives (an operation skipped because an earlier one in its program failed is `fail`: it certainly did
not happen).

A device actor that dies while it runs a program (its worker process exits) is restarted by Ray; every call
of that program is closed by `info` (which of them ran, and what they sent, died with the worker), a switch
among them is read back at once (a `fabric.observed` mark, from which `testbed check` replays its history
again), and ActorDied is raised: the playbook's `on_actor_death` decides what the run does next.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from testbed.contracts.engine import Executable, StepEngine
from testbed.contracts.errors import ActorDied, ExperimentFailed, StepFailed, interruption, raise_failures
from testbed.engine.device_actor import OpResult
from testbed.engine.dispatch import ActorLost, CallTimeout, Dispatcher
from testbed.events import Event, InvokeLedger, Op, orphan_outcome
from testbed.families import family_of
from testbed.faults.recording import FaultBudget
from testbed.results.recorder import Recorder, count_lines

RESTART_TIMEOUT_S = 60.0  # how long to wait for Ray to bring a dead actor back (a new worker, a reconnect)

if TYPE_CHECKING:
    from testbed.engine.job import JobController

Call = tuple[str, str, dict]  # (step label, procedure, kwargs)

__all__ = ["ActorDied", "Coordinator", "StepFailed"]


class OpenInvokes:
    """Observer of events: the invokes not closed yet, so those an actor's death orphaned can be closed
    with `info` (an operation that wraps device calls, such as fault.inject, stays open when one dies).
    """

    def __init__(self) -> None:
        self._ledger = InvokeLedger()
        self._lock = threading.Lock()

    def on_event(self, event: Event) -> None:
        with self._lock:
            self._ledger.add(event.device, event.op, event.type, event)

    def close_all(self, recorder: Recorder, reason: str) -> int:
        with self._lock:
            orphans: list[Event] = self._ledger.still_open()
        for e in sorted(orphans, key=lambda e: e.seq):
            data = orphan_outcome(e.op, e.data, reason)
            recorder.emit("info", e.op, device=e.device, step=e.step, trial=e.trial, data=data)
        return len(orphans)


class Coordinator(StepEngine):
    """One run's engine: it executes the planned steps in order against the devices' actors (through a
    Dispatcher), records every call and its outcome, and holds what the steps share (the job, the fault
    interlock, the twin). Steps, fault kinds and the fabric service see it as a StepEngine, which it declares,
    so the type checker holds it to that contract (docs/architecture.md).
    """

    def __init__(
        self,
        plan,
        dispatcher: Dispatcher,
        recorder: Recorder,
        *,
        artifacts: Path | None = None,
        twin=None,
        ground_truth: Callable[[str], list[list[float]]] | None = None,
        leases=None,
    ) -> None:
        self.plan = plan
        self.leases = leases  # testbed.leases.HeldLeases on a lab: checked before every command
        self.dispatcher = dispatcher
        self._recorder = recorder
        self._artifacts = artifacts  # where files a step produces are kept (the run folder)
        self._twin = twin  # the twin's control (testbed.twin.bridge.TwinHandle) in an emulated run, None on a lab
        self.jobs: JobController | None = None  # when the playbook has a job
        self._fault_budget = FaultBudget(plan.playbook.max_concurrent_faults)
        # Set when the run ends or aborts: faults still under way in `parallel` steps heal at once.
        self._stopping = threading.Event()
        # device -> power transfer matrix |T[out][in]|^2, known only to an emulated device (the twin)
        self._ground_truth = ground_truth
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="step")
        self.open_invokes = OpenInvokes()
        recorder.add_observer(self.open_invokes)
        self._pids: dict[str, int] = {}  # actor name -> its worker pid, as last seen
        self._fault_numbers = itertools.count(1)
        self._lapse_recorded = False

    # StepEngine's read-only members (properties there, so they are properties here: a declared Protocol's
    # property would refuse a plain attribute of the same name).

    @property
    def recorder(self) -> Recorder:
        """The run's recorder."""
        return self._recorder

    @property
    def pool(self) -> ThreadPoolExecutor:
        """Threads for a step's concurrent work."""
        return self._pool

    @property
    def stopping(self) -> threading.Event:
        """Set when the run ends or aborts."""
        return self._stopping

    @property
    def fault_budget(self) -> FaultBudget:
        """The max_concurrent_faults interlock."""
        return self._fault_budget

    @property
    def twin(self):
        """The twin's control in an emulated run; None on a lab."""
        return self._twin

    @property
    def artifacts(self) -> Path | None:
        """The run folder; None when the run keeps none."""
        return self._artifacts

    @property
    def ground_truth(self) -> Callable[[str], list[list[float]]] | None:
        """device -> its power transfer matrix, in the twin; None on a lab."""
        return self._ground_truth

    @property
    def devices(self) -> list[str]:
        return [d for d in self.plan.devices if d in self.dispatcher.names()]

    # --- what steps use ---------------------------------------------------------------------------

    def operation(self, device: str, name: str) -> str:
        """The procedure that does a generic operation (identify, reconfigure, clear ...) on a device, by its
        family: a chip is driven like a switch.
        """
        dev = self.plan.inventory.devices[device]
        procedure = family_of(dev).operation(name)
        if procedure is None:
            raise StepFailed(f"{device}: a {dev.kind} cannot {name}")
        return procedure

    @property
    def inventory(self):
        """The run's inventory."""
        return self.plan.inventory

    def require_jobs(self, label: str) -> JobController:
        """The playbook's job; StepFailed naming `label` when it has none."""
        if self.jobs is None:
            raise StepFailed(f"{label}: the playbook has no job")
        return self.jobs

    def has_ground_truth(self, device: str) -> bool:
        return family_of(self.plan.inventory.devices[device]).ground_truth is not None

    def next_fault_number(self) -> int:
        return next(self._fault_numbers)

    raise_failures = staticmethod(raise_failures)

    # --- devices ------------------------------------------------------------------------------------

    def dispatch(
        self, programs: Mapping[str, Sequence[Call]], *, observe: bool = True
    ) -> dict[str, list[OpResult | None]]:
        """Run each device's calls in order on its actor, all devices at once. A None result is a call
        that was not run because an earlier call of its program failed. Raises ActorDied once every
        result is recorded if an actor died (after reading back its switch, when `observe`).
        """
        self.check_leases()
        invoked: dict[str, int] = {}  # per device, how many of its calls have their invoke on disk
        closed: dict[str, int] = {}  # ... and their outcome
        done, died = {}, {}
        out: dict[str, list[OpResult | None]] = {}
        try:
            # Every invoke is on disk before the first call goes out (a crash leaves them open for `heal`), then
            # the calls go back to back: recording between submissions would spread the start of a parallel step
            # (docs/tuning.md, "Device hubs and the GIL").
            for device, program in programs.items():
                for label, procedure, kwargs in program:
                    self.recorder.invoke(device, procedure, kwargs, label)
                    invoked[device] = invoked.get(device, 0) + 1
            pending = {
                device: self.dispatcher.call(device, "run_program", [(p, k) for _, p, k in program])
                for device, program in programs.items()
            }
            for device, call in pending.items():
                try:
                    done[device] = call.result()
                except ActorLost as exc:
                    died[device] = str(exc)
            for device, program in programs.items():
                out[device] = self._record_answers(device, program, done.get(device), died.get(device), closed)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM at any point of the dispatch: close what it opened
            reason = f"outcome unknown: {interruption(exc)} before the device answered"
            self._close_unanswered(programs, invoked, closed, done, reason)
            raise
        if died:
            # Calls made while Ray restarts an actor fail at once ("the actor is restarting"): wait for it.
            self.wait_until_alive(list(died))
            if observe:
                self._observe_after_death(list(died))
            raise ActorDied(list(died), next(iter(died.values())))
        return out

    def _record_answers(
        self, device: str, program: Sequence[Call], answers: list | None, death: str | None, closed: dict[str, int]
    ) -> list[OpResult | None]:
        """Record the outcome of each call of one device's program (counted in `closed` as it goes): its answer,
        None for a call not run after an earlier one failed, or `info` for every call when its actor died.
        """
        if death is not None:
            for label, procedure, _ in program:
                data = {"error": f"outcome unknown: {death}", "error_type": "ActorDied", "audit_lost": True}
                self.recorder.emit("info", procedure, device=device, step=label, data=data)
                closed[device] = closed.get(device, 0) + 1
            return []
        assert answers is not None  # the caller passes them whenever the actor answered (death is None)
        results: list[OpResult | None] = list(answers) + [None] * (len(program) - len(answers))
        for (label, procedure, _), result in zip(program, results, strict=True):
            self.record(device, label, procedure, result)
            closed[device] = closed.get(device, 0) + 1
        return results

    def _close_unanswered(
        self,
        programs: Mapping[str, Sequence[Call]],
        invoked: dict[str, int],
        closed: dict[str, int],
        done: dict,
        reason: str,
    ) -> None:
        """Close the invokes a dispatch opened and has not closed when it was interrupted: with the device's answer
        where it came, else as `info` (their audit records are not collected: the calls may still be running on
        the actors).
        """
        for device, program in programs.items():
            answered = list(done.get(device, ()))
            for i in range(closed.get(device, 0), invoked.get(device, 0)):
                label, procedure, _ = program[i]
                if device in done:
                    self.record(device, label, procedure, answered[i] if i < len(answered) else None)
                else:
                    data = {"error": reason, "error_type": "Interrupted", "audit_lost": True}
                    self.recorder.emit("info", procedure, device=device, step=label, data=data)

    def check_leases(self) -> None:
        """Before any command: the run's leases still certainly held (a lab), else LeaseLapsed, recorded once."""
        if self.leases is None:
            return
        try:
            self.leases.check()
        except Exception as exc:
            if not self._lapse_recorded:
                self._lapse_recorded = True
                self.recorder.emit("mark", Op.LEASE_LAPSED, data={"error": str(exc)})
            raise

    def call(self, calls: Mapping[str, tuple[str, dict[str, Any]]], step: str) -> dict[str, OpResult]:
        """One procedure on each of several devices at once; raises StepFailed if any did not succeed."""
        results = self.dispatch({d: [(step, p, k)] for d, (p, k) in calls.items()})
        first = {d: r[0] for d, r in results.items()}
        raise_failures(first.values())
        return cast(dict[str, OpResult], first)  # raise_failures let no None through

    def actor_pids(self) -> dict[str, int]:
        """Each actor's worker process now; kept, to tell a restarted actor from the one before."""
        calls = {name: self.dispatcher.call(name, "where") for name in self.dispatcher.names()}  # all at once
        self._pids = {name: call.result()["pid"] for name, call in calls.items()}
        return dict(self._pids)

    def wait_until_alive(self, names: list[str] | None = None, timeout_s: float = RESTART_TIMEOUT_S) -> None:
        """Block until every actor answers again, each restart recorded (`actor.restarted`, its new worker
        pid); gives up on an actor Ray declares dead for good, or after timeout_s (its calls then fail).
        """
        deadline = time.monotonic() + timeout_s
        for name in names if names is not None else self.dispatcher.names():
            while True:
                try:
                    where = self.dispatcher.call(name, "where").result(timeout=max(0.1, deadline - time.monotonic()))
                except ActorLost as exc:
                    if exc.for_good:
                        break  # dead for good (restarts used up)
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.2)  # polling Ray until the restarted worker answers
                    continue
                except CallTimeout:
                    break
                if where["pid"] != self._pids.get(name):
                    data = {"actor": name, "pid": where["pid"], "was": self._pids.get(name)}
                    self.recorder.emit("mark", Op.ACTOR_RESTARTED, device=name.split(" ")[0], data=data)
                    self._pids[name] = where["pid"]
                break

    def _observe_after_death(self, devices: list[str]) -> None:
        """Read back every switch among `devices` through its restarted actor: what its lost call sent is
        not in the audit log, so `testbed check` replays the switch's history from this reading on.
        """
        for device in devices:
            read = family_of(self.plan.inventory.devices[device]).operation("read_fabric")
            if read is None or self.artifacts is None:
                continue
            audit_line = count_lines(self.artifacts / "audit.jsonl")
            try:
                label = "read back after the actor restarted"
                (result,) = self.dispatch({device: [(label, read, {})]}, observe=False)[device]
            except ExperimentFailed:
                continue  # not read: check will say that the history cannot explain the switch
            if result is None or result.status != "ok":
                continue
            self.recorder.emit(
                "mark",
                Op.FABRIC_OBSERVED,
                device=device,
                data={"circuits": result.value, "audit_line": audit_line, "why": "device actor restarted"},
            )

    def identify(self) -> dict[str, dict]:
        """Ask every device what it is (and check it against the inventory); returns what they said."""
        calls = {}
        for name in self.devices:
            dev = self.plan.inventory.devices[name]
            kwargs = {"expected_size": dev.size} if hasattr(dev, "size") else {}
            calls[name] = (self.operation(name, "identify"), kwargs)
        results = self.call(calls, "identify devices")
        # identify's value is a dict (the family's identify procedure)
        return {name: {"node": r.node, **cast(dict, r.value or {})} for name, r in results.items()}

    def fabric_devices(self) -> list[str]:
        """The run's devices whose circuits are lab state (their family holds a fabric)."""
        return [d for d in self.devices if family_of(self.plan.inventory.devices[d]).holds_fabric]

    def read_fabric(self) -> dict[str, dict[int, int]]:
        """The circuits every switch of the run holds now."""
        devices = self.fabric_devices()
        results = self.call({d: (self.operation(d, "read_fabric"), {}) for d in devices}, "final read-back")
        return {d: cast(dict[int, int], r.value) for d, r in results.items()}  # read_fabric's value

    def record(self, device: str, label: str, procedure: str, result: OpResult | None) -> None:
        self.recorder.outcome(device, label, procedure, result)

    # --- steps ----------------------------------------------------------------------------------

    def execute_steps(self, steps: Sequence[Executable]) -> None:
        """Run steps in order; consecutive steps on one and the same device go as one program."""
        i = 0
        while i < len(steps):
            device = steps[i].single_device()
            j = i + 1
            while device is not None and j < len(steps) and steps[j].single_device() == device:
                j += 1
            if device is None or j - i == 1:
                self.execute(steps[i])
            else:
                group = steps[i:j]
                results = self.dispatch({device: [(s.label, *s.calls(self)[device]) for s in group]})[device]
                for step, result in zip(group, results, strict=True):
                    raise_failures([result])
                    step.measured(self, [result])
            i = j

    def execute(self, step: Executable) -> None:
        step.execute(self)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
