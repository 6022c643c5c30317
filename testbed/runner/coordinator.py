"""Executes a plan's steps against the device actors and turns their results into events.

The coordinator only sequences: devices are driven inside their actors, and every time it records for
device I/O comes from there. A fabric change is sent to all of its switches at the same time; steps of a
`parallel` group run at the same time; consecutive steps that drive one and the same device go to its
actor as one program, so a trial pays one Ray round trip per device rather than one per step.

Every operation is recorded as `invoke` before it is submitted, and closed by `ok`, `fail` or `info`
when its result arrives (an operation skipped because an earlier one in its program failed is `fail`:
it certainly did not happen).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from testbed.errors import ExperimentFailed
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
from testbed.recorder import Recorder
from testbed.runner.device_actor import OpResult

SEGMENTS = (("ack", "sent", "acked"), ("light", "acked", "lit"), ("total", "sent", "lit"))

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
        # device -> power transfer matrix |T[out][in]|^2, known only to an emulated device (the twin)
        self.ground_truth = ground_truth
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="step")

    # --- devices --------------------------------------------------------------------------------

    def dispatch(self, programs: dict[str, list[Call]]) -> dict[str, list[OpResult | None]]:
        """Run each device's calls in order on its actor, all devices at once. A None result is a call
        that was not run because an earlier call of its program failed."""
        refs = {}
        for device, program in programs.items():
            for label, procedure, kwargs in program:
                self.recorder.emit("invoke", procedure, device=device, step=label, data=_summarise(kwargs))
            refs[device] = self.actors[device].run_program.remote([(p, k) for _, p, k in program])
        done = dict(zip(refs, self.ray.get(list(refs.values())), strict=True))
        out: dict[str, list[OpResult | None]] = {}
        for device, program in programs.items():
            results: list[OpResult | None] = list(done[device]) + [None] * (len(program) - len(done[device]))
            for (label, procedure, _), result in zip(program, results, strict=True):
                self._record(device, label, procedure, result)
            out[device] = results
        return out

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
        elif isinstance(
            step, JobStartStep | JobStopStep | JobMeasureStep | FaultDetectStep | FaultInjectStep | FailoverStep
        ):
            if self.jobs is None:
                raise StepFailed(f"{step.label}: the playbook has no job")
            run = {
                JobStartStep: self.jobs.start,
                JobStopStep: self.jobs.stop,
                FaultDetectStep: self.jobs.detect,
                FaultInjectStep: self.jobs.inject,
                FailoverStep: self.jobs.failover,
                JobMeasureStep: self.jobs.measure,
            }
            run[type(step)](step)
        elif isinstance(step, RailIterateStep):
            self._rail_iterate(step)
        elif isinstance(step, HealthStep):
            from testbed.runner.jobs import health_check  # jobs builds on this module

            health_check(self, step)
        elif isinstance(step, WaitStep):
            self.recorder.emit("mark", "wait", step=step.label, data={"seconds": step.seconds})
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
                "crosstalk",
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
