"""Faults that hit a rank of the job: its GPU, its process, its host.

In the twin each is what the hardware would do (a GPU falls off the emulated bus, the host powers off), fired
as a timed trigger. On a lab, process faults are signals over SSH to the rank's process group (the midpoint
of the `kill` is the injection time, marked by the host's actor); gpu.fail kills the rank and marks its GPU
failed in the run's events, as published testbeds simulate it. Power (testbed/faults/power.py) and
stragglers (testbed/faults/straggle.py) have files of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.contracts.outcome import Outcome
from testbed.faults.base import (
    DeadFault,
    FaultEnv,
    HealLab,
    Injected,
    RankTarget,
    dead_device,
    fire_in_twin,
)


def _signal(env: FaultEnv, target: RankTarget, signal: str) -> Injected:
    result = env.call(target.host, "gpu.kill_job", {"job": target.job, "signal": signal})
    return Injected(result.marks["fault_injected"][0], marked_by_device=True)


def _resume(env_call: Callable[[str, str, dict[str, Any]], Outcome], host: str, job: dict[str, Any]) -> Outcome:
    # A detection stops the job first, so the stopped rank may be gone: continued only if still there.
    return env_call(host, "gpu.resume_job", {"job": job})


@dataclass(frozen=True)
class GpuFail:
    """The GPU falls off the bus (Xid `xid`, 79 by default); its processes die with it."""

    name: str = "gpu.fail"
    target: str = "rank"
    lab_support: str | None = None
    marks_failed_on_lab: bool = True  # on a lab the GPU is only marked failed, in the run's events

    def describe(self, params: dict[str, Any]) -> str:
        """The Xid, as `testbed plan` shows it after the kind."""
        return f", Xid {params.get('xid', 79)}"

    def inject(self, env: FaultEnv, target: RankTarget) -> Injected:
        """In the twin, the GPU fails at a timed trigger; on a lab, SIGKILL to the rank's process group."""
        if env.twin is not None:
            args = {"index": target.gpu, "xid": target.params.get("xid", 79)}
            return fire_in_twin(env.twin, self.name, target.host, "fail_gpu", args)
        return _signal(env, target, "KILL")

    def heal(self, env: FaultEnv, target: RankTarget) -> None:
        """In the twin, the GPU recovers; on a lab nothing is left to undo but the rank's job (the step stops it)."""
        if env.twin is not None:
            env.twin.call(target.host, "recover_gpu", index=target.gpu)

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        """The twin's GPU recovered, if the twin outlived the run; nothing to undo on a lab."""
        if lab.control is None:
            return "on a lab gpu.fail kills the rank and marks the GPU failed in the run only: nothing to undo"
        host = fault.data.get("host") or fault.device
        lab.control.call(host, "recover_gpu", index=fault.data.get("gpu", 0))
        return f"twin control recover_gpu on {host} {{'index': {fault.data.get('gpu', 0)}}}"


@dataclass(frozen=True)
class ProcessKill:
    """SIGKILL to the rank's process group."""

    name: str = "process.kill"
    target: str = "rank"
    lab_support: str | None = None
    marks_failed_on_lab: bool = False

    def inject(self, env: FaultEnv, target: RankTarget) -> Injected:
        """SIGKILL to the rank's process group, its midpoint marked by the host's actor."""
        return _signal(env, target, "KILL")

    def heal(self, env: FaultEnv, target: RankTarget) -> None:
        """Nothing: a killed process stays dead."""
        pass  # nothing to undo but the rank's job, which the step stops

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        """Nothing to undo but the rank's job (heal stops it)."""
        return "the rank was killed: nothing to undo but its job (stopped below)"


@dataclass(frozen=True)
class ProcessHang:
    """SIGSTOP to the rank's process group; healed by SIGCONT."""

    name: str = "process.hang"
    target: str = "rank"
    lab_support: str | None = None
    marks_failed_on_lab: bool = False

    def inject(self, env: FaultEnv, target: RankTarget) -> Injected:
        """SIGSTOP to the rank's process group, its midpoint marked by the host's actor."""
        return _signal(env, target, "STOP")

    def heal(self, env: FaultEnv, target: RankTarget) -> None:
        """SIGCONT to the rank's process group, if it is still there."""
        _resume(env.call, target.host, target.job)

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        """SIGCONT to the stopped process group the dead run's history names."""
        if fault.job is None:
            from testbed.faults.base import FaultFailed

            raise FaultFailed(f"{fault.name}: the history does not say which process was stopped")
        host = dead_device(fault, fault.job.get("host"))
        done = lab.call(host, "gpu.resume_job", {"job": fault.job}, "heal: continue the rank")
        if done["result"] == "not running":
            return f"pid {fault.job['pid']} on {host} is gone: nothing is left stopped"
        return f"SIGCONT to pid {fault.job['pid']}'s process group on {host}"


RANK_FAULTS = (GpuFail(), ProcessKill(), ProcessHang())
