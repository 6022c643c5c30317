"""Procedures run inside a device actor, next to the driver, so that their timestamps are taken where the
I/O happens. Each is a plain function `(driver, ctx, **kwargs) -> JSON-able value`."""

from __future__ import annotations

from collections.abc import Callable

from testbed.procedures import gpu, mesh, ocs
from testbed.procedures.context import ProcedureContext

Procedure = Callable[..., object]

PROCEDURES: dict[str, Procedure] = {
    "ocs.identify": ocs.identify,
    "ocs.reconfigure": ocs.reconfigure,
    "ocs.clear": ocs.clear,
    "ocs.connections": ocs.connections,
    "mesh.identify": mesh.identify,
    "mesh.calibrate": mesh.calibrate,
    "mesh.reconfigure": mesh.reconfigure,
    "mesh.clear": mesh.clear,
    "gpu.identify": gpu.identify,
    "gpu.start_job": gpu.start_job,
    "gpu.job_status": gpu.job_status,
    "gpu.stop_job": gpu.stop_job,
    "gpu.health": gpu.health,
    "gpu.kill_job": gpu.kill_job,
    "gpu.resume_job": gpu.resume_job,
    "gpu.watch_job": gpu.watch_job,
    "gpu.wait_step": gpu.wait_step,
    "gpu.step_times": gpu.step_times,
}

__all__ = ["PROCEDURES", "ProcedureContext"]
