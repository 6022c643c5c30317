"""Executes a plan's steps against the device actors and turns their results into events.

The coordinator only sequences: devices are driven inside their actors, and every time it records for
device I/O comes from there. A fabric change is sent to all of its switches at the same time; steps of a
`parallel` group run at the same time; consecutive steps that drive one and the same device go to its
actor as one program, so a trial pays one Ray round trip per device rather than one per step.

Every operation is recorded as `invoke` before it is submitted, and closed by `ok`, `fail` or `info`
when its result arrives (an operation skipped because an earlier one in its program failed is `fail`:
it certainly did not happen).

A device actor that dies while it runs a program (its worker process exits) is restarted by Ray; every
call of that program is closed by `info` (which of them ran, and what they sent, died with the worker),
a switch among them is read back at once (a `fabric.observed` mark, from which `testbed check` replays its
history again), and ActorDied is raised: the playbook's `on_actor_death` decides what the run does next.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from testbed.errors import ExperimentFailed
from testbed.events import Event, InvokeLedger, Op
from testbed.plan import (
    ApplyStep,
    CalibrateStep,
    ClearStep,
    FailoverStep,
    FaultDetectStep,
    FaultInjectStep,
    HealthStep,
    JobMeasureStep,
    JobStartStep,
    JobStopStep,
    ParallelStep,
    Plan,
    PlannedStep,
    RailIterateStep,
    WaitStep,
)
from testbed.recorder import Recorder, count_lines
from testbed.runner.device_actor import OpResult
from testbed.runner.faults import FaultBudget

SEGMENTS = (("ack", "sent", "acked"), ("light", "acked", "lit"), ("total", "sent", "lit"))
RESTART_TIMEOUT_S = 60.0  # how long to wait for Ray to bring a dead actor back (a new worker, a reconnect)

# The procedure that does a generic operation on each kind of device: a chip is driven like a switch.
PROCEDURES_BY_KIND = {
    "ocs": {"identify": "ocs.identify", "reconfigure": "ocs.reconfigure", "clear": "ocs.clear"},
    "photonic_mesh": {
        "identify": "mesh.identify",
        "reconfigure": "mesh.reconfigure",
        "clear": "mesh.clear",
        "calibrate": "mesh.calibrate",
    },
    "gpu_host": {"identify": "gpu.identify"},
}

Call = tuple[str, str, dict]  # (step label, procedure, kwargs)


class StepFailed(ExperimentFailed):
    pass


class ActorDied(ExperimentFailed):
    """A device actor died during a call: the call's outcome is unknown. Not a StepFailed, so code that
    records a step's own failure (`fail`: certainly did not happen) lets it through; the trial loop
    closes whatever such code left open with `info`."""

    def __init__(self, devices: list[str], detail: str) -> None:
        self.devices = devices
        super().__init__(f"the actor of {', '.join(devices)} died during a call ({detail}); Ray restarts it")


class OpenInvokes:
    """Observer of events: the invokes not closed yet, so those an actor's death orphaned can be closed
    with `info` (an operation that wraps device calls, such as fault.inject, stays open when one dies)."""

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
            recorder.emit(
                "info", e.op, device=e.device, step=e.step, trial=e.trial, data={"error": reason, "audit_lost": True}
            )
        return len(orphans)


class Coordinator:
    def __init__(
        self,
        plan: Plan,
        actors: dict,
        recorder: Recorder,
        ray,
        *,
        artifacts: Path | None = None,
        ground_truth: Callable[[str], list[list[float]]] | None = None,
    ) -> None:
        self.plan = plan
        self.actors = actors
        self.recorder = recorder
        self.ray = ray
        self.artifacts = artifacts  # where files a step produces are kept (the run folder)
        self.jobs = None  # a testbed.runner.jobs.JobController when the playbook has a job
        self.transport_faults = None  # a testbed.runner.faults.TransportFaults in an emulated run
        self.fault_budget = FaultBudget(plan.playbook.max_concurrent_faults)
        # Set when the run ends or aborts: faults still under way in `parallel` steps heal at once.
        self.stopping = threading.Event()
        # device -> power transfer matrix |T[out][in]|^2, known only to an emulated device (the twin)
        self.ground_truth = ground_truth
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="step")
        self.open_invokes = OpenInvokes()
        recorder.add_observer(self.open_invokes)
        self._pids: dict[str, int] = {}  # actor name -> its worker pid, as last seen

    # --- devices --------------------------------------------------------------------------------

    def dispatch(self, programs: dict[str, list[Call]], *, observe: bool = True) -> dict[str, list[OpResult | None]]:
        """Run each device's calls in order on its actor, all devices at once. A None result is a call
        that was not run because an earlier call of its program failed. Raises ActorDied once every
        result is recorded if an actor died (after reading back its switch, when `observe`)."""
        # Every invoke is on disk before the first call goes out (a crash leaves them open for `heal`), then
        # the calls go back to back: on 2 cores Ray takes ~0.4 ms to submit one, and recording between
        # submissions spread the start of a parallel step (eight switches) by a further millisecond.
        for device, program in programs.items():
            for label, procedure, kwargs in program:
                self.recorder.emit("invoke", procedure, device=device, step=label, data=_summarise(kwargs))
        refs = {
            device: self.actors[device].run_program.remote([(p, k) for _, p, k in program])
            for device, program in programs.items()
        }
        done, died = {}, {}
        for device, ref in refs.items():
            try:
                done[device] = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as exc:
                died[device] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        out: dict[str, list[OpResult | None]] = {}
        for device, program in programs.items():
            if device in died:
                for label, procedure, _ in program:
                    data = {"error": f"outcome unknown: {died[device]}", "error_type": "ActorDied", "audit_lost": True}
                    self.recorder.emit("info", procedure, device=device, step=label, data=data)
                continue
            results: list[OpResult | None] = list(done[device]) + [None] * (len(program) - len(done[device]))
            for (label, procedure, _), result in zip(program, results, strict=True):
                self._record(device, label, procedure, result)
            out[device] = results
        if died:
            # Calls made while Ray restarts an actor fail at once ("the actor is restarting"): wait for it.
            self.wait_until_alive({d: self.actors[d] for d in died})
            if observe:
                self._observe_after_death(list(died))
            raise ActorDied(list(died), next(iter(died.values())))
        return out

    def all_actors(self) -> dict[str, object]:
        """Every actor of the run: one per device, and the job's watchers."""
        watchers = getattr(self.jobs, "watchers", None) or {}
        return {**self.actors, **{f"{host} (watcher)": actor for host, actor in watchers.items()}}

    def actor_pids(self) -> dict[str, int]:
        """Each actor's worker process now; kept, to tell a restarted actor from the one before."""
        self._pids = {name: self.ray.get(actor.where.remote())["pid"] for name, actor in self.all_actors().items()}
        return dict(self._pids)

    def wait_until_alive(self, actors: dict[str, object], timeout_s: float = RESTART_TIMEOUT_S) -> None:
        """Block until every actor answers again, each restart recorded (`actor.restarted`, its new worker
        pid); gives up on an actor Ray declares dead for good, or after timeout_s (its calls then fail)."""
        exceptions = self.ray.exceptions
        deadline = time.monotonic() + timeout_s
        for name, actor in actors.items():
            while True:
                try:
                    where = self.ray.get(actor.where.remote(), timeout=max(0.1, deadline - time.monotonic()))
                except exceptions.ActorDiedError:
                    break  # dead for good (restarts used up)
                except (exceptions.RayActorError, exceptions.GetTimeoutError):
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.2)  # polling Ray until the restarted worker answers
                    continue
                if where["pid"] != self._pids.get(name):
                    data = {"actor": name, "pid": where["pid"], "was": self._pids.get(name)}
                    self.recorder.emit("mark", Op.ACTOR_RESTARTED, device=name.split(" ")[0], data=data)
                    self._pids[name] = where["pid"]
                break

    def _observe_after_death(self, devices: list[str]) -> None:
        """Read back every switch among `devices` through its restarted actor: what its lost call sent is
        not in the audit log, so `testbed check` replays the switch's history from this reading on."""
        for device in devices:
            if self.plan.inventory.devices[device].kind != "ocs" or self.artifacts is None:
                continue
            audit_line = count_lines(self.artifacts / "audit.jsonl")
            try:
                label = "read back after the actor restarted"
                (result,) = self.dispatch({device: [(label, "ocs.connections", {})]}, observe=False)[device]
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
        for name in self.actors:
            dev = self.plan.inventory.devices[name]
            kwargs = {"expected_size": dev.size} if hasattr(dev, "size") else {}
            calls[name] = (self._procedure(name, "identify"), kwargs)
        results = self.call(calls, "identify devices")
        return {name: {"node": r.node, **(r.value or {})} for name, r in results.items()}

    def read_fabric(self) -> dict[str, dict[int, int]]:
        """The circuits every switch of the run holds now."""
        switches = [d for d in self.actors if self.plan.inventory.devices[d].kind == "ocs"]
        results = self.call({d: ("ocs.connections", {}) for d in switches}, "final read-back")
        return {d: r.value for d, r in results.items()}

    def _procedure(self, device: str, operation: str) -> str:
        kind = self.plan.inventory.devices[device].kind
        try:
            return PROCEDURES_BY_KIND[kind][operation]
        except KeyError:
            raise StepFailed(f"{device}: a {kind} cannot {operation}") from None

    def call(self, calls: dict[str, tuple[str, dict]], step: str) -> dict[str, OpResult]:
        """One procedure on each of several devices at once; raises StepFailed if any did not succeed."""
        results = self.dispatch({d: [(step, p, k)] for d, (p, k) in calls.items()})
        first = {d: r[0] for d, r in results.items()}
        _raise_failures(first.values())
        return first

    def _record(self, device: str, label: str, procedure: str, result: OpResult | None) -> None:
        if result is None:
            self.recorder.emit(
                "fail",
                procedure,
                device=device,
                step=label,
                data={"error": "not run: an earlier step on this device failed"},
            )
            return
        self.recorder.audit(result.audit)
        for name, (ns, wall) in sorted(result.marks.items(), key=lambda m: m[1][0]):
            self.recorder.emit("mark", name, mono_ns=ns, wall=wall, device=device, node=result.node, step=label)
        if result.status == "ok":
            data = {"value": result.value}
        else:
            data = {"error": result.error, "error_type": result.error_type}
        data["duration_ms"] = (result.end[0] - result.start[0]) / 1e6
        self.recorder.emit(
            result.status,
            result.procedure,
            mono_ns=result.end[0],
            wall=result.end[1],
            device=device,
            node=result.node,
            step=label,
            data=data,
        )

    # --- steps ----------------------------------------------------------------------------------

    def execute_steps(self, steps: tuple[PlannedStep, ...]) -> None:
        """Run steps in order; consecutive steps on one and the same device go as one program."""
        i = 0
        while i < len(steps):
            device = _single_device(steps[i])
            j = i + 1
            while device is not None and j < len(steps) and _single_device(steps[j]) == device:
                j += 1
            if j - i == 1:
                self.execute(steps[i])
            else:
                group = steps[i:j]
                results = self.dispatch({device: [(s.label, *self._calls(s)[device]) for s in group]})[device]
                for step, result in zip(group, results, strict=True):
                    _raise_failures([result])
                    if isinstance(step, ApplyStep):
                        self._measure(step, [result])
            i = j

    def _fault(self, step: FaultInjectStep | FaultDetectStep) -> None:
        if isinstance(step, FaultInjectStep) and step.device is not None:
            if self.transport_faults is None:
                raise StepFailed(f"{step.label}: {step.kind} is applied by the twin's fault proxy; run with --emulate")
            self.transport_faults.inject(step)
            return
        if self.jobs is None:
            raise StepFailed(f"{step.label}: the playbook has no job")
        if isinstance(step, FailoverStep):
            self.jobs.failover(step)
        elif isinstance(step, FaultDetectStep):
            self.jobs.detect(step)
        else:
            self.jobs.inject(step)

    def execute(self, step: PlannedStep) -> None:
        if isinstance(step, ApplyStep | ClearStep):
            results = self.call(self._calls(step), step.label)
            if isinstance(step, ApplyStep):
                self._measure(step, list(results.values()))
        elif isinstance(step, CalibrateStep):
            path = str(self.artifacts / f"calibration-{step.device}.json") if self.artifacts else None
            self.call(
                {
                    step.device: (
                        self._procedure(step.device, "calibrate"),
                        {"path": step.reuse or path, "reuse": step.reuse is not None},
                    )
                },
                step.label,
            )
        elif isinstance(step, FaultInjectStep | FaultDetectStep):  # FailoverStep is a FaultDetectStep
            with self.fault_budget.hold(step.label):
                self._fault(step)
        elif isinstance(step, JobStartStep | JobStopStep | JobMeasureStep):
            if self.jobs is None:
                raise StepFailed(f"{step.label}: the playbook has no job")
            run = {
                JobStartStep: self.jobs.start,
                JobStopStep: self.jobs.stop,
                JobMeasureStep: self.jobs.measure,
            }
            run[type(step)](step)
        elif isinstance(step, RailIterateStep):
            self._rail_iterate(step)
        elif isinstance(step, HealthStep):
            from testbed.runner.jobs import health_check  # jobs builds on this module

            health_check(self, step)
        elif isinstance(step, WaitStep):
            self.recorder.emit("mark", Op.WAIT, step=step.label, data={"seconds": step.seconds})
            time.sleep(step.seconds)  # the experiment asks for this pause; it is not synchronisation
        elif isinstance(step, ParallelStep):
            futures = [self._pool.submit(self.execute, s) for s in step.steps]
            errors = [f.exception() for f in futures if f.exception() is not None]
            if errors:
                raise errors[0]
        else:
            raise TypeError(f"no executor for {step!r}")

    def _measure(self, step: ApplyStep, results: list[OpResult]) -> None:
        """Spans over all switches of the step: from the first command sent to the last switch done."""
        if step.crosstalk:
            self._crosstalk(step)
        if not step.measure:
            return
        for segment, start_mark, end_mark in SEGMENTS:
            if not all(start_mark in r.marks and end_mark in r.marks for r in results):
                continue
            start = min(r.marks[start_mark][0] for r in results)
            end = max(r.marks[end_mark][0] for r in results)
            wall = min(r.marks[start_mark][1] for r in results)
            self.recorder.emit(
                "measure",
                f"{step.measure}.{segment}",
                mono_ns=end,
                wall=wall,
                step=step.label,
                data={"ms": (end - start) / 1e6, "start_ns": start, "end_ns": end},
            )

    def _rail_iterate(self, step: RailIterateStep) -> None:
        """Iterations of a workload card (Opus). A phase's traffic needs its rails, then it computes (the
        compute is the workload's, modelled as a pause). A change of rails takes the switches' time plus the
        emulated OCS delay. on-demand: the change is made at the phase boundary and the job waits for it;
        provisioning: the next phase's change is requested as soon as a phase's traffic ends and runs
        behind its compute, so only what it overruns stalls the job; static: the rails never change."""
        phases = step.phases

        def change(apply: ApplyStep) -> None:
            self.execute(apply)
            time.sleep(step.delay_s)  # the emulated switching delay: part of what is measured

        change(phases[0].apply)  # the rails the first phase needs, before the first iteration (not measured)
        pending = None
        for iteration in range(-step.warmup, step.iterations):
            start = time.monotonic_ns()
            for k, phase in enumerate(phases):
                first = iteration == -step.warmup and k == 0
                if step.mode == "on-demand" and not first:
                    change(phase.apply)
                elif step.mode == "provisioning" and pending is not None:
                    pending.result()  # whatever of the change its window did not hide is a stall
                # (the phase's collective runs here, on the rails now in place)
                if step.mode == "provisioning":
                    pending = self._pool.submit(change, phases[(k + 1) % len(phases)].apply)
                time.sleep(phase.compute_s)  # the phase's compute: part of the workload being measured
            end = time.monotonic_ns()
            if iteration < 0:
                continue  # warm-up
            self.recorder.emit(
                "measure",
                f"{step.measure}.time",
                mono_ns=end,
                step=step.label,
                data={
                    "ms": (end - start) / 1e6,
                    "start_ns": start,
                    "end_ns": end,
                    "iteration": iteration,
                    "mode": step.mode,
                    "delay_ms": step.delay_s * 1000,
                },
            )
        if pending is not None:
            pending.result()

    def _crosstalk(self, step: ApplyStep) -> None:
        """Per output port of a chip: power from every other input over power from the intended one, with
        all inputs lit alike. Photodiodes alone cannot separate the two, so this needs the device's own
        transfer matrix, which only the twin has; on a real chip nothing is recorded."""
        if self.ground_truth is None:
            return
        for device, pairs in step.circuits.items():
            if self.plan.inventory.devices[device].kind != "photonic_mesh":
                continue
            t = self.ground_truth(device)
            n = len(t)
            per_port = {}
            for ingress, egress in pairs:
                row = t[egress - n - 1]
                signal = row[ingress - 1]
                leak = sum(row) - signal
                per_port[egress] = round(10 * math.log10(max(leak, 1e-30) / max(signal, 1e-30)), 2)
            self.recorder.emit(
                "mark",
                Op.CROSSTALK,
                device=device,
                step=step.label,
                data={"source": "twin ground truth", "per_port_db": per_port},
            )

    def _calls(self, step: ApplyStep | ClearStep) -> dict[str, tuple[str, dict]]:
        """The procedure each device runs for a step."""
        if isinstance(step, ApplyStep):
            return {
                sw: (
                    self._procedure(sw, "reconfigure"),
                    {
                        "circuits": list(pairs),
                        "managed": list(step.managed[sw]),
                        "verify_light": step.verify_light,
                        "min_power_dbm": step.min_power_dbm,
                        "timeout_s": step.timeout_s,
                    },
                )
                for sw, pairs in step.circuits.items()
            }
        return {sw: (self._procedure(sw, "clear"), {"managed": list(ports)}) for sw, ports in step.managed.items()}

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _single_device(step: PlannedStep) -> str | None:
    """The one device a step drives, if it can join a batch. A step that reads the device's ground truth
    after it ran cannot: the truth must be read before the next step changes the device."""
    if isinstance(step, ApplyStep) and step.crosstalk:
        return None
    if isinstance(step, ApplyStep | ClearStep):
        devices = step.circuits if isinstance(step, ApplyStep) else step.managed
        if len(devices) == 1:
            return next(iter(devices))
    return None


def _raise_failures(results) -> None:
    failed = [r for r in results if r is None or r.status != "ok"]
    if failed:
        raise StepFailed(
            "\n".join((r.error or f"{r.device}: {r.procedure} failed") if r else "not run" for r in failed)
        )


def _summarise(kwargs: dict) -> dict:
    """Keep invoke events readable: long lists become counts."""
    return {k: f"{len(v)} items" if isinstance(v, list) and len(v) > 8 else v for k, v in kwargs.items()}
