"""What one emulated GPU host is: plain data, JSON-serialisable (the twin runs in its own process)."""

from __future__ import annotations

from dataclasses import dataclass

# The project's own job programs (hostside/; testbed-torch-train needs PyTorch, docs/jobs.md) and sleep.
DEFAULT_JOBS = ("testbed-train", "testbed-torch-train", "testbed-torchft-train", "sleep")


@dataclass
class GpuHostSpec:
    """A Linux GPU server reached over SSH.

    `jobs` is the allowlist of programs the host will start (by bare name, looked up on the twin's PATH
    with the Python environment's bin directory first); nothing else ever runs on the machine.
    """

    name: str
    gpus: int = 8
    gpu_name: str = "NVIDIA H100 80GB HBM3"
    user: str = "lab"
    seed: int = 0
    jobs: tuple[str, ...] = DEFAULT_JOBS
    driver_version: str = "550.54.15"
    memory_mib: int = 81559
    kind: str = "gpu_host"

    @classmethod
    def from_dict(cls, d: dict) -> GpuHostSpec:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"gpu_host spec {d.get('name')!r}: unknown keys {unknown}")
        d = dict(d)
        if "jobs" in d:
            d["jobs"] = tuple(d["jobs"])
        return cls(**d)
