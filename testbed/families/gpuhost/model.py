"""A GPU server in the inventory: its GPUs, its optical ports (NICs cabled to the fabric), its rack."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from testbed.config.common import Name, Strict
from testbed.config.device import DeviceConfig


class GpuHostEmulation(Strict):
    gpu_name: str = "NVIDIA H100 80GB HBM3"


class GpuHostDevice(DeviceConfig):
    kind: Literal["gpu_host"]
    gpus: int = Field(8, ge=0, le=64)
    ports: list[Name] = Field(default_factory=lambda: ["p0"], description="optical ports (NICs) of the host")
    rack: str | None = None
    emulation: GpuHostEmulation = GpuHostEmulation()
