"""A fault as a playbook names it (in fault.inject, fault.detect and failover steps). Its kinds are the
registered fault kinds (testbed.faults), so a kind added by another package is valid here too.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from annotated_types import Ge, Le
from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from testbed.config.common import Name, PortList, Strict, sweepable
from testbed.faults import FAULT_KINDS, TransportFault

if TYPE_CHECKING:  # what the validating types below hold, as a type checker can read them
    FaultKindName = str
else:
    FaultKindName = Literal[tuple(FAULT_KINDS.names())]  # the kinds registered when this module is imported
HOST_PORT = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*:[A-Za-z][A-Za-z0-9_.-]*$")
# Checked by Fault._host_ports (one message naming the value, not one per branch of the union); editors get the pattern.
HostPort = Annotated[str, WithJsonSchema({"type": "string", "pattern": HOST_PORT.pattern})]
INT64_MAX = 2**63 - 1


def _whole(value: Any) -> Any:
    """A toxic's attribute as Toxiproxy decodes it: an integer. A whole number written as a float (300.0) is
    that integer, and is sent as one; a fraction is refused here, where Toxiproxy would refuse the toxic with
    HTTP 400 in the middle of a run (docs/faults.md, "Toxiproxy's types").
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number: Toxiproxy takes a toxic's attributes as integers")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            hint = f", e.g. {round(value)}" if math.isfinite(value) else ""
            raise ValueError(
                f"{value!r} is not a whole number: Toxiproxy takes a toxic's attributes as integers (int64; ms, "
                f"bytes, KB/s, or us for slicer's delay) and refuses a fraction with HTTP 400; "
                f"give a whole number{hint}"
            )
        return int(value)
    return value


# Every attribute of every Toxiproxy toxic is an integer (a Go int64 or int); none is negative in a meaningful toxic.
ToxicAttribute = Annotated[int, Ge(0), Le(INT64_MAX), BeforeValidator(_whole)]


class Fault(Strict):
    """What to break. Every fault is healed when the step ends (and on abort).

    A list of kinds (or of devices) is a seeded random choice: one is drawn for each trial, so a chaos run
    repeats exactly for the same seed.
    """

    kind: FaultKindName | list[FaultKindName] = Field(description="a kind, or a list to draw one from for each trial")
    target: str = Field(
        "rank:random",
        pattern=r"^rank:(random|\d+)$",
        description="rank:random (drawn from the seed for each trial) or rank:N",
    )
    device: Name | list[Name] | None = Field(
        None,
        description="for transport.*: the device whose connection is faulted (a list: one drawn per trial); for "
        "link.down with `ports`: the switch whose ports are disabled",
    )
    link: HostPort | list[HostPort] | None = Field(
        None,
        description="for link.down: the host port (host:port) whose fibre's two switch ports (the ingress it "
        "transmits into, the egress it receives from) are disabled (a list: one drawn per trial)",
    )
    ports: PortList | None = Field(
        None, description="for link.down, with `device`: the switch's ports to disable, e.g. [5, 37]"
    )
    attributes: dict[str, ToxicAttribute] = Field(
        default_factory=dict,
        description="for transport.*: the toxic's attributes, whole numbers in Toxiproxy's names and units "
        "(latency: latency, jitter ms; bandwidth: rate KB/s; slow_close: delay ms; timeout and reset_peer: "
        "timeout ms; slicer: average_size, size_variation bytes, delay us; limit_data: bytes)",
    )
    stream: Literal["downstream", "upstream"] = Field(
        "downstream", description="for transport.*: device -> framework (downstream) or framework -> device"
    )
    xid: int = Field(79, description="for gpu.fail: the Xid the kernel log shows (79: fallen off the bus)")
    duty: Annotated[float | str, sweepable(0.01, 0.95)] = Field(
        0.5, description="for host.straggle: fraction of each period the rank is stopped"
    )
    period_ms: float = Field(200, gt=0, description="for host.straggle: length of one stop/run cycle")

    @field_validator("link")
    @classmethod
    def _host_ports(cls, link: str | list[str] | None) -> str | list[str] | None:
        for item in link if isinstance(link, list) else [link] if link is not None else []:
            if not HOST_PORT.match(item):
                raise ValueError(f"{item!r} is not a host port such as gpu01:p0 (host:port, as in the fibre map)")
        return link

    def kinds(self) -> list[str]:
        """The kinds the fault is drawn from (one when the playbook names one)."""
        return self.kind if isinstance(self.kind, list) else [self.kind]

    @model_validator(mode="after")
    def _connection_fields(self) -> Fault:
        kinds = self.kinds()
        if not kinds:
            raise ValueError("kind: give a fault kind, or a non-empty list to draw from")
        on_connections = [FAULT_KINDS.get(k) for k in kinds if FAULT_KINDS.get(k).target == "connection"]
        self._port_fields(kinds)
        if on_connections and self.device is None:
            raise ValueError(f"{on_connections[0].name} needs `device`: the device whose connection is faulted")
        if len(on_connections) < len(kinds) and (self.attributes or (self.device is not None and self.ports is None)):
            raise ValueError(
                "`device` and `attributes` are for transport.* faults only (and `device` with `ports` for link.down)"
            )
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

    def _port_fields(self, kinds: list[str]) -> None:
        """`link`, or `device` with `ports`, for the kinds that disable switch ports (link.down), and only for them."""
        on_ports = [k for k in kinds if FAULT_KINDS.get(k).target == "ports"]
        if not on_ports:
            if self.link is not None or self.ports is not None:
                raise ValueError("`link` and `ports` are for link.down only")
            return
        if self.link == []:
            raise ValueError("link: give a host port, or a non-empty list to draw from")
        if self.link is None and self.ports is None:
            raise ValueError(
                f"{on_ports[0]} needs `link` (the host port whose fibre goes dark, e.g. gpu01:p0) or `device` "
                "and `ports` (the switch's ports to disable)"
            )
        if self.link is not None and (self.ports is not None or self.device is not None):
            raise ValueError(f"{on_ports[0]}: give `link`, or `device` and `ports`, not both")
        if self.ports is not None:
            if len(on_ports) < len(kinds):
                raise ValueError(
                    "`device` and `ports` name link.down's switch ports: to draw link.down among other kinds, "
                    "name its `link` instead"
                )
            if not isinstance(self.device, str):
                raise ValueError(f"{on_ports[0]} with `ports` needs `device`: the one switch whose ports they are")
            if not self.ports:
                raise ValueError("ports: give at least one port")
