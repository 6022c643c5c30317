"""The GPU host family (kind `gpu_host`): a Linux server reached over SSH, running the job's ranks; nvidia-smi,
background jobs, signals, the watch that sees a rank fail, and its power through its BMC (Redfish).
"""

from __future__ import annotations

from drivers.capabilities import GpuHost
from testbed.contracts.jsontypes import JsonObject
from testbed.families.base import DeviceFamily, FamilyInventory, ProcedureSpec, TwinSupport
from testbed.families.gpu_host import procedures
from testbed.families.gpu_host.model import BmcConfig, GpuHostDevice, GpuHostEmulation


def _twin_spec(name: str, dev: GpuHostDevice, inventory: FamilyInventory, seed: int) -> JsonObject:
    return {
        "kind": "gpu_host",
        "name": name,
        "gpus": dev.gpus,
        "gpu_name": dev.emulation.gpu_name,
        "user": getattr(dev.transport, "user", "lab"),
        "seed": seed * 1000 + list(inventory.devices).index(name),
    }


FAMILY = DeviceFamily(
    kind="gpu_host",
    model=GpuHostDevice,
    capability=GpuHost,
    role="host",
    procedures={
        "gpu.identify": ProcedureSpec(procedures.identify),
        "gpu.start_job": ProcedureSpec(procedures.start_job, ("job_started",)),
        "gpu.job_status": ProcedureSpec(procedures.job_status, ("progress_seen",)),
        "gpu.stop_job": ProcedureSpec(procedures.stop_job, ("job_stopped",)),
        "gpu.health": ProcedureSpec(procedures.health),
        "gpu.kill_job": ProcedureSpec(procedures.kill_job, ("fault_injected", "fault_healed")),
        "gpu.resume_job": ProcedureSpec(procedures.resume_job, ("fault_healed",)),
        "gpu.straggle_start": ProcedureSpec(procedures.straggle_start, ("fault_injected",)),
        "gpu.straggle_stop": ProcedureSpec(procedures.straggle_stop, ("fault_healed",)),
        "gpu.watch_job": ProcedureSpec(procedures.watch_job, ("watching", "failure_detected")),
        "gpu.wait_step": ProcedureSpec(procedures.wait_step, ("job_ready", "first_step")),
        "gpu.step_times": ProcedureSpec(procedures.step_times),
        "gpu.job_output": ProcedureSpec(procedures.job_output),
        "gpu.power_off": ProcedureSpec(procedures.power_off, ("fault_injected",)),  # through the BMC
        "gpu.power_on": ProcedureSpec(procedures.power_on, ("fault_healed",)),
    },
    operations={"identify": "gpu.identify"},
    twin=TwinSupport(_twin_spec),
    description="a GPU server reached over SSH: nvidia-smi, jobs, signals",
)

__all__ = ["FAMILY", "BmcConfig", "GpuHostDevice", "GpuHostEmulation"]
