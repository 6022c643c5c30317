"""Jobs on GPU hosts, faults, and failure detection, as the coordinator executes them.

Ranks are started and stopped through each host's actor. Detection runs on a second actor per host (its
own SSH connection, two threads) so that watching never blocks the host's actor: every rank is watched
from before the fault is injected until the failure is seen. Faults go through the twin's control API when
emulated (a GPU really falls off the emulated bus) and through the host otherwise (the rank is killed and
the GPU marked failed in the run, as published testbeds simulate it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from testbed.config.playbook import Job
from testbed.plan import FaultDetectStep, FaultInjectStep, HealthStep, JobStartStep, JobStopStep
from testbed.runner.coordinator import Coordinator, StepFailed, _raise_failures

WATCH_READY_TIMEOUT_S = 20.0


@dataclass
class Rank:
    index: int
    host: str
    local: int  # index among the ranks of its host: its GPU


# Faults only the twin can apply: a lab needs a BMC (power) or a duty-cycle agent (straggle) for them.
TWIN_ONLY_FAULTS = {"host.power_off", "host.straggle"}


class FaultInjector:
    """Injects and heals one fault; returns the monotonic time of injection when it takes it itself."""

    def __init__(self, coordinator: Coordinator, twin_control=None) -> None:
        self.coordinator = coordinator
        self.twin = twin_control  # None on a real lab

    def inject(
        self, kind: str, rank: Rank, job: dict, label: str, xid: int, duty: float = 0.5, period_s: float = 0.2
    ) -> int:
        if kind in TWIN_ONLY_FAULTS and self.twin is None:
            raise StepFailed(f"{kind} is not supported on a real lab yet (it needs a BMC / a duty-cycle agent)")
        if self.twin is not None and kind in ("gpu.fail", "host.power_off", "host.straggle"):
            ns = time.monotonic_ns()
            if kind == "gpu.fail":
                self.twin.call(rank.host, "fail_gpu", index=rank.local, xid=xid)
            elif kind == "host.power_off":
                self.twin.call(rank.host, "power_off")
            else:
                self.twin.call(rank.host, "straggle", pid=job.get("pid"), duty=duty, period_ms=period_s * 1000)
            return ns
        # On a real lab gpu.fail kills the rank (its GPU is marked failed in the run's events); process.kill
        # and process.hang are signals on any lab.
        signal = {"gpu.fail": "KILL", "process.kill": "KILL", "process.hang": "STOP"}[kind]
        result = self.coordinator.call({rank.host: ("gpu.kill_job", {"job": job, "signal": signal})}, label)
        return result[rank.host].marks["fault_injected"][0]

    def heal(self, kind: str, rank: Rank, job: dict, label: str) -> None:
        if kind == "gpu.fail" and self.twin is not None:
            self.twin.call(rank.host, "recover_gpu", index=rank.local)
        elif kind == "host.power_off" and self.twin is not None:
            self.twin.call(rank.host, "power_on")
        elif kind == "host.straggle" and self.twin is not None:
            self.twin.call(rank.host, "stop_straggle", pid=job.get("pid"))
        elif kind == "process.hang":
            self.coordinator.call({rank.host: ("gpu.kill_job", {"job": job, "signal": "CONT"})}, label)


class JobController:
    def __init__(
        self,
        coordinator: Coordinator,
        job: Job,
        watchers: dict,
        address_of: Callable[[str], str],
        faults: FaultInjector,
    ) -> None:
        self.c = coordinator
        self.job = job
        self.watchers = watchers  # host -> watcher actor
        self.address_of = address_of  # host -> the address its ranks are reached at (data plane)
        self.faults = faults
        seen: dict[str, int] = {}
        self.ranks = []
        for index, host in enumerate(job.ranks):
            self.ranks.append(Rank(index, host, seen.get(host, 0)))
            seen[host] = seen.get(host, 0) + 1
        self.handles: dict[int, dict] = {}  # rank -> job handle (pid, log) while running

    # --- start / stop ---------------------------------------------------------------------------

    def start(self, step: JobStartStep) -> None:
        if self.handles:
            raise StepFailed("job.start: the job is already running; add a job.stop step before starting it again")
        peers = ",".join(f"{self.address_of(r.host)}:{self.job.port + r.index}" for r in self.ranks)
        programs: dict[str, list] = {}
        for r in self.ranks:
            env = {
                **self.job.env,
                "RANK": str(r.index),
                "WORLD_SIZE": str(len(self.ranks)),
                "LOCAL_RANK": str(r.local),
                "TESTBED_PEERS": peers,
                "TESTBED_CHECKPOINT_DIR": self.job.checkpoint_dir,
            }
            programs.setdefault(r.host, []).append(
                (
                    step.label,
                    "gpu.start_job",
                    {"command": list(self.job.command), "name": f"rank{r.index}", "gpus": [r.local], "env": env},
                )
            )
        started = self.c.dispatch(programs)
        for host, results in started.items():
            _raise_failures(results)
            for r, result in zip([r for r in self.ranks if r.host == host], results, strict=True):
                self.handles[r.index] = result.value
        if step.wait_steps > 0:
            self._wait_steps(step.label, step.wait_steps, step.timeout_s)
        self.c.recorder.emit("mark", "job_ready", step=step.label, data={"ranks": len(self.ranks)})

    def _wait_steps(self, label: str, min_step: int, timeout_s: float) -> None:
        programs: dict[str, list] = {}
        for r in self.ranks:
            programs.setdefault(r.host, []).append(
                (
                    label,
                    "gpu.wait_step",
                    {
                        "job": self.handles[r.index],
                        "progress": self.job.progress,
                        "min_step": min_step,
                        "max_s": timeout_s,
                    },
                )
            )
        for results in self.c.dispatch(programs).values():
            _raise_failures(results)

    def stop(self, step: JobStopStep | None = None, label: str = "stop job") -> None:
        if not self.handles:
            return
        programs: dict[str, list] = {}
        for r in self.ranks:
            if r.index in self.handles:
                programs.setdefault(r.host, []).append(
                    (step.label if step else label, "gpu.stop_job", {"job": self.handles[r.index]})
                )
        self.handles.clear()
        for results in self.c.dispatch(programs).values():
            _raise_failures(results)

    # --- faults and detection ---------------------------------------------------------------------

    def detect(self, step: FaultDetectStep) -> None:
        if len(self.handles) != len(self.ranks):
            raise StepFailed("fault.detect: the job is not running; add a job.start step before it")
        target = self.ranks[step.rank]
        refs = {}
        for r in self.ranks:
            kwargs = {
                "job": self.handles[r.index],
                "heartbeat_s": step.heartbeat_s,
                "stall_timeout_s": step.stall_timeout_s,
                "progress": self.job.progress,
                "max_s": step.timeout_s,
            }
            self.c.recorder.emit("invoke", "gpu.watch_job", device=r.host, step=step.label, data={"rank": r.index})
            refs[r.index] = self.watchers[r.host].run_program.remote([("gpu.watch_job", kwargs)])
        ready = self.c.ray.get(
            [self.watchers[r.host].wait_mark.remote("watching", WATCH_READY_TIMEOUT_S) for r in self.ranks]
        )
        data = {
            "fault": f"{step.kind}@rank{target.index}",
            "kind": step.kind,
            "rank": target.index,
            "host": target.host,
            "gpu": target.local,
        }
        self.c.recorder.emit("invoke", "fault.inject", device=target.host, step=step.label, data=data)
        try:
            injected = self.faults.inject(step.kind, target, self.handles[target.index], step.label, step.xid)
        except StepFailed:
            self.c.recorder.emit("fail", "fault.inject", device=target.host, step=step.label, data=data)
            raise
        self.c.recorder.emit("ok", "fault.inject", device=target.host, step=step.label, data=data)
        self._mark_injected(step, target, injected, {**data, "watching": all(ready)})
        if step.kind == "gpu.fail" and self.faults.twin is None:
            self.c.recorder.emit("mark", "gpu_marked_failed", device=target.host, step=step.label, data=data)
        job = self.handles[target.index]
        try:
            first = self._first_detection(refs, step)
        finally:
            self.c.recorder.emit("invoke", "fault.heal", device=target.host, step=step.label, data=data)
            self.faults.heal(step.kind, target, job, step.label)
            self.c.recorder.emit("ok", "fault.heal", device=target.host, step=step.label, data=data)
        if first is None:
            raise StepFailed(
                f"{step.kind} on rank {target.index} ({target.host}) was not detected within {step.timeout_s:g} s"
            )
        rank, detected_ns, value = first
        if step.measure:
            self.c.recorder.emit(
                "measure",
                f"{step.measure}.latency",
                mono_ns=detected_ns,
                wall=time.time(),
                step=step.label,
                data={
                    "ms": (detected_ns - injected) / 1e6,
                    "start_ns": injected,
                    "end_ns": detected_ns,
                    "detected_on_rank": rank,
                    "kind": value.get("detected"),
                    "evidence": value.get("evidence"),
                },
            )

    def _first_detection(self, refs: dict, step: FaultDetectStep):
        """Wait for the first watcher to see a failure, stop the job (so every other watch ends), then
        record every watcher's outcome. Returns (rank, detection time, its value) or None."""
        ray = self.c.ray
        by_ref = {ref: rank for rank, ref in refs.items()}
        ray.wait(list(refs.values()), num_returns=1, timeout=step.timeout_s + WATCH_READY_TIMEOUT_S)
        self.stop(label=step.label)
        first = None
        for ref, results in zip(refs.values(), ray.get(list(refs.values())), strict=True):
            rank = by_ref[ref]
            result = results[0]
            self.c._record(self.ranks[rank].host, step.label, "gpu.watch_job", result)
            mark = result.marks.get("failure_detected") if result.status == "ok" else None
            if mark and (result.value or {}).get("detected") and (first is None or mark[0] < first[1]):
                first = (rank, mark[0], result.value)
        return first

    def inject(self, step: FaultInjectStep) -> None:
        """A fault kept for a while and then healed; the job's own reaction is what the playbook measures."""
        if len(self.handles) != len(self.ranks):
            raise StepFailed("fault.inject: the job is not running; add a job.start step before it")
        target = self.ranks[step.rank]
        data = {
            "fault": f"{step.kind}@rank{target.index}",
            "kind": step.kind,
            "rank": target.index,
            "host": target.host,
            "gpu": target.local,
            "duration_s": step.duration_s,
        }
        if step.when_s:
            time.sleep(step.when_s)  # the playbook's schedule for the fault, not synchronisation
        self.c.recorder.emit("invoke", "fault.inject", device=target.host, step=step.label, data=data)
        job = self.handles[target.index]
        try:
            injected = self.faults.inject(step.kind, target, job, step.label, step.xid, step.duty, step.period_s)
        except StepFailed:
            self.c.recorder.emit("fail", "fault.inject", device=target.host, step=step.label, data=data)
            raise
        self.c.recorder.emit("ok", "fault.inject", device=target.host, step=step.label, data=data)
        self._mark_injected(step, target, injected, data)
        try:
            time.sleep(step.duration_s)  # how long the playbook keeps the fault: part of the experiment
        finally:
            self.c.recorder.emit("invoke", "fault.heal", device=target.host, step=step.label, data=data)
            self.faults.heal(step.kind, target, job, step.label)
            self.c.recorder.emit("ok", "fault.heal", device=target.host, step=step.label, data=data)

    def _mark_injected(self, step, target: Rank, injected: int, data: dict) -> None:
        """One fault_injected event per fault: taken here for a twin fault; taken by the host's actor
        otherwise (its mark is recorded with its result), so only the fault's description is added."""
        if self.faults.twin is not None and step.kind in ("gpu.fail", "host.power_off", "host.straggle"):
            self.c.recorder.emit(
                "mark",
                "fault_injected",
                mono_ns=injected,
                wall=time.time(),
                device=target.host,
                step=step.label,
                data=data,
            )
        else:
            self.c.recorder.emit(
                "mark", "fault_described", device=target.host, step=step.label, data={**data, "injected_ns": injected}
            )

    # --- health ---------------------------------------------------------------------------------

    def health(self, step: HealthStep) -> None:
        health_check(self.c, step)


def health_check(c: Coordinator, step: HealthStep) -> None:
    """Identify and health-check every host at once; the results go to the summary as a table, and the
    wall time of the whole check (as the coordinator sees it, Ray included) is measured as health.wall."""
    start = time.monotonic_ns()
    results = c.dispatch({h: [(step.label, "gpu.health", {})] for h in step.hosts})
    end = time.monotonic_ns()
    c.recorder.emit(
        "measure",
        "health.wall",
        mono_ns=end,
        wall=time.time(),
        step=step.label,
        data={"ms": (end - start) / 1e6, "start_ns": start, "end_ns": end, "hosts": len(step.hosts)},
    )
    for host, (result,) in results.items():
        if result is not None and result.status == "ok":
            c.recorder.emit("mark", "health", device=host, step=step.label, data=result.value)
    _raise_failures([r for (r,) in results.values()])
