"""A fault as a playbook names it (in fault.inject, fault.detect and failover steps). Its kinds are the
registered fault kinds (testbed.faults), so a kind added by another package is valid here too."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from testbed.config.common import Name, Strict, sweepable
from testbed.faults import FAULT_KINDS, TransportFault

FaultKindName = Literal[tuple(FAULT_KINDS.names())]


class Fault(Strict):
    """What to break. Every fault is healed when the step ends (and on abort).

    A list of kinds (or of devices) is a seeded random choice: one is drawn for each trial, so a chaos run
    repeats exactly for the same seed."""

    kind: FaultKindName | list[FaultKindName] = Field(description="a kind, or a list to draw one from for each trial")
    target: str = Field(
        "rank:random",
        pattern=r"^rank:(random|\d+)$",
        description="rank:random (drawn from the seed for each trial) or rank:N",
    )
    device: Name | list[Name] | None = Field(
        None, description="for transport.*: the device whose connection is faulted (a list: one drawn per trial)"
    )
    attributes: dict[str, float] = Field(
        default_factory=dict,
        description="for transport.*: the toxic's attributes, in Toxiproxy's names and units "
        "(latency: latency, jitter ms; bandwidth: rate KB/s; slow_close: delay ms; timeout and reset_peer: "
        "timeout ms; slicer: average_size, size_variation bytes, delay us; limit_data: bytes)",
    )
    stream: Literal["downstream", "upstream"] = Field(
        "downstream", description="for transport.*: device -> framework (downstream) or framework -> device"
    )
    xid: int = Field(79, description="for gpu.fail: the Xid the kernel log shows (79: fallen off the bus)")
    duty: sweepable(0.01, 0.95) = Field(
        0.5, description="for host.straggle: fraction of each period the rank is stopped"
    )
    period_ms: float = Field(200, gt=0, description="for host.straggle: length of one stop/run cycle")

    def kinds(self) -> list[str]:
        return self.kind if isinstance(self.kind, list) else [self.kind]

    @model_validator(mode="after")
    def _connection_fields(self):
        kinds = self.kinds()
        if not kinds:
            raise ValueError("kind: give a fault kind, or a non-empty list to draw from")
        on_connections = [FAULT_KINDS.get(k) for k in kinds if FAULT_KINDS.get(k).target == "connection"]
        if on_connections and self.device is None:
            raise ValueError(f"{on_connections[0].name} needs `device`: the device whose connection is faulted")
        if len(on_connections) < len(kinds) and (self.device is not None or self.attributes):
            raise ValueError("`device` and `attributes` are for transport.* faults only")
        if self.device == []:
            raise ValueError("device: give a device, or a non-empty list to draw from")
        # With several kinds to draw from, each drawn kind takes the attributes it has; an attribute none of
        # them has is a mistake.
        allowed = {a for k in on_connections if isinstance(k, TransportFault) for a in k.attributes}
        unknown = sorted(set(self.attributes) - allowed)
        if unknown:
            raise ValueError(
                f"attributes: {' / '.join(k.name for k in on_connections)} has no attribute {unknown[0]!r} "
                f"(it has: {', '.join(sorted(allowed)) or 'none'})"
            )
        return self
