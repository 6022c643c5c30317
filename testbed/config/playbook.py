"""Playbooks: an experiment as data. Steps run once per trial; setup and teardown run once per run."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from testbed.config.common import Name, Strict

LINK_PATTERN = re.compile(
    r"^\s*([A-Za-z][\w.-]*):([A-Za-z][\w.-]*)\s*(->|<->)\s*([A-Za-z][\w.-]*):([A-Za-z][\w.-]*)\s*$"
)


def _check_link(link: str) -> str:
    if not LINK_PATTERN.match(link):
        raise ValueError(f"link {link!r} is not of the form 'host:port -> host:port' (or '<->')")
    return link


Link = Annotated[str, AfterValidator(_check_link)]


class Configuration(Strict):
    """A named fabric configuration: host-to-host links and/or raw circuits per switch.

    links: "gpu01:p0 -> gpu02:p0" carries gpu01's p0 transmit to gpu02's p0 receive (one circuit);
    "<->" asks for both directions. circuits: {switch: [[ingress, egress], ...]} for anything else.
    """

    description: str = ""
    links: list[Link] = Field(default_factory=list)
    circuits: dict[Name, list[tuple[int, int]]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _not_empty(self):
        if not self.links and not self.circuits:
            raise ValueError("a configuration needs `links` or `circuits`")
        return self


PARAM_REF = re.compile(r"^\$\{[A-Za-z][A-Za-z0-9_]*\}$")


def sweepable(low: float, high: float):
    """A number in [low, high], or `${name}`: a sweep parameter the planner substitutes per sweep point."""

    def check(value):
        if isinstance(value, str):
            if not PARAM_REF.match(value):
                raise ValueError(f"expected a number or a sweep parameter like '${{delay_ms}}', got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number or a sweep parameter like '${{delay_ms}}', got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"must be between {low:g} and {high:g}, got {value!r}")
        return float(value)

    return Annotated[float | str, BeforeValidator(check)]


def param_name(ref: str) -> str:
    return ref[2:-1]


class Schedule(Strict):
    """A sequence of configurations generated from a pattern over hosts.

    all-to-all: N-1 matchings over `hosts` on `port`; in matching k each host transmits to the host k
    places further on, so over the cycle every ordered pair is connected once (PipSwitch).
    """

    kind: Literal["all-to-all"]
    hosts: list[Name] = Field(min_length=2)
    port: Name = "p0"


class _Step(Strict):
    name: str | None = Field(None, description="label shown in progress and events; default derived")


class FabricApply(_Step):
    """Set every switch to a named configuration, all switches in parallel; measure it if asked."""

    action: Literal["fabric.apply"]
    configuration: Name
    measure: Name | None = Field(None, description="span name; spans of equal name are pooled in the summary")
    verify_light: bool = True
    min_power_dbm: float = Field(-20.0, description="light is verified when every new egress reads above this")
    timeout_ms: int = Field(5000, gt=0, description="for acknowledgement and light to appear")


class FabricCycle(_Step):
    """Apply every configuration of a schedule in turn, each measured like a fabric.apply."""

    action: Literal["fabric.cycle"]
    schedule: Name
    measure: Name | None = None
    verify_light: bool = True
    min_power_dbm: float = -20.0
    timeout_ms: int = Field(5000, gt=0)
    crosstalk: bool = Field(
        False,
        description="record crosstalk per output port where the device can tell (the emulated chip's ground truth)",
    )


class DeviceCalibrate(_Step):
    """Calibrate a device (a photonic chip's heaters); the calibration file is kept in the run folder."""

    action: Literal["device.calibrate"]
    device: Name
    reuse: str | None = Field(None, description="a calibration file to load instead of sweeping")


class FabricClear(_Step):
    """Remove every circuit this playbook's configurations use (other circuits are left alone)."""

    action: Literal["fabric.clear"]


class Wait(_Step):
    action: Literal["wait"]
    ms: sweepable(0, 3_600_000)


class Parallel(_Step):
    """Run the nested steps at the same time; the step ends when all have ended."""

    action: Literal["parallel"]
    steps: list[Step] = Field(min_length=1)


Step = Annotated[
    FabricApply | FabricCycle | FabricClear | DeviceCalibrate | Wait | Parallel, Field(discriminator="action")
]
Parallel.model_rebuild()


class Playbook(Strict):
    name: Name
    description: str = ""
    trials: int = Field(10, ge=1, le=1_000_000)
    seed: int = 0
    on_failure: Literal["abort", "continue"] = Field(
        "abort", description="after a failed trial: stop the run (teardown still runs) or go on with the next"
    )
    configurations: dict[Name, Configuration] = Field(default_factory=dict)
    schedules: dict[Name, Schedule] = Field(default_factory=dict)
    sweep: dict[Name, list[Any]] = Field(
        default_factory=dict,
        description="parameters to sweep; the trials run once per combination (cartesian product)",
    )
    setup: list[Step] = Field(default_factory=list)
    steps: list[Step] = Field(min_length=1)
    teardown: list[Step] = Field(default_factory=list)
