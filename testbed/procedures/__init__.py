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

# The marks (timestamped milestones) each procedure may take; events.jsonl's schema lists them per operation.
CHANGE_MARKS = ("sent", "acked", "lit", "reverted")
PROCEDURE_MARKS: dict[str, tuple[str, ...]] = {
    "ocs.identify": (),
    "ocs.reconfigure": CHANGE_MARKS,
    "ocs.clear": ("sent", "acked"),
    "ocs.connections": (),
    "mesh.identify": (),
    "mesh.calibrate": ("loaded", "sweep_started", "swept"),
    "mesh.reconfigure": CHANGE_MARKS,
    "mesh.clear": ("sent", "acked"),
    "gpu.identify": (),
    "gpu.start_job": ("job_started",),
    "gpu.job_status": ("progress_seen",),
    "gpu.stop_job": ("job_stopped",),
    "gpu.health": (),
    "gpu.kill_job": ("fault_injected", "fault_healed"),
    "gpu.resume_job": ("fault_healed",),
    "gpu.watch_job": ("watching", "failure_detected"),
    "gpu.wait_step": ("job_ready", "first_step"),
    "gpu.step_times": (),
}

__all__ = ["PROCEDURES", "PROCEDURE_MARKS", "ProcedureContext"]
