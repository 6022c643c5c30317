"""Executes a plan's steps against the device actors and turns their results into events.

The coordinator only sequences: devices are driven inside their actors, and every time it records for
device I/O comes from there. Steps of a `parallel` group run at the same time; a fabric change is sent to
all of its switches at the same time.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from testbed.errors import ExperimentFailed
from testbed.plan import ApplyStep, ClearStep, ParallelStep, Plan, PlannedStep, WaitStep
from testbed.recorder import Recorder
from testbed.runner.device_actor import OpResult

SEGMENTS = (("ack", "sent", "acked"), ("light", "acked", "lit"), ("total", "sent", "lit"))


class StepFailed(ExperimentFailed):
    pass


class Coordinator:
    def __init__(self, plan: Plan, actors: dict, recorder: Recorder, ray) -> None:
        self.plan = plan
        self.actors = actors
        self.recorder = recorder
        self.ray = ray
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="step")

    # --- devices --------------------------------------------------------------------------------

    def call(self, calls: dict[str, tuple[str, dict]], step: str) -> dict[str, OpResult]:
        """Run one procedure on each of several devices at once; record invoke and completion events."""
        refs = {}
        for device, (procedure, kwargs) in calls.items():
            self.recorder.emit("invoke", procedure, device=device, step=step, data=_summarise(kwargs))
            refs[device] = self.actors[device].run.remote(procedure, kwargs)
        results = dict(zip(refs, self.ray.get(list(refs.values())), strict=True))
        for device, result in results.items():
            self.recorder.audit(result.audit)
            for name, (ns, wall) in sorted(result.marks.items(), key=lambda m: m[1][0]):
                self.recorder.emit("mark", name, mono_ns=ns, wall=wall, device=device, node=result.node, step=step)
            data = (
                {"value": result.value}
                if result.status == "ok"
                else {"error": result.error, "error_type": result.error_type}
            )
            data["duration_ms"] = (result.end[0] - result.start[0]) / 1e6
            self.recorder.emit(
                result.status,
                result.procedure,
                mono_ns=result.end[0],
                wall=result.end[1],
                device=device,
                node=result.node,
                step=step,
                data=data,
            )
        failed = [r for r in results.values() if r.status != "ok"]
        if failed:
            raise StepFailed("\n".join(r.error or f"{r.device}: {r.procedure} failed" for r in failed))
        return results

    # --- steps ----------------------------------------------------------------------------------

    def execute(self, step: PlannedStep) -> None:
        if isinstance(step, ApplyStep):
            self._apply(step)
        elif isinstance(step, ClearStep):
            self.call({sw: ("ocs.clear", {"managed": list(ports)}) for sw, ports in step.managed.items()}, step.label)
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

    def _apply(self, step: ApplyStep) -> None:
        calls = {
            sw: (
                "ocs.reconfigure",
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
        results = self.call(calls, step.label)
        if step.measure:
            self._measure(step, list(results.values()))

    def _measure(self, step: ApplyStep, results: list[OpResult]) -> None:
        """Spans over all switches of the step: from the first command sent to the last switch done."""
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

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _summarise(kwargs: dict) -> dict:
    """Keep invoke events readable: long lists become counts."""
    out = {}
    for key, value in kwargs.items():
        out[key] = f"{len(value)} items" if isinstance(value, list) and len(value) > 8 else value
    return out
