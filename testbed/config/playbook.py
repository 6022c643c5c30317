"""Playbooks: an experiment as data. Steps run once per trial; setup and teardown run once per run."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

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


class JobFabric(Strict):
    """How the job's ranks are connected optically: a logical topology over the hosts of the ranks, turned
    into circuits through the fibre map. A failover rewires it for the new set of hosts.

    ring: rank r's `port` -> rank r+1 (with `reverse_port`: duplex links port <-> next host's reverse_port).
    torus2d: a `dims: [rows, cols]` torus (rows * cols = the number of ranks), rings along each row on
    `port` (x) and along each column on `y_port` (y); with `reverse_port` and `y_reverse_port` every torus
    link is duplex (four ports per host). Ranks are laid out along a Hamiltonian cycle of the torus
    (boustrophedon: by rows when rows is even, else by columns, so one of them must be even), so the ring
    r -> r+1 of a ring all-reduce runs on torus links (testbed/fabric/jobfabric.py).
    """

    topology: Literal["ring", "torus2d"] = "ring"
    port: Name = Field("p0", description="the host port towards the next rank (torus2d: the next host in its row)")
    verify_light: bool = Field(True, description="check light on every new circuit before (re)launching")
    min_power_dbm: float = Field(-20.0, description="light is verified when every new egress reads above this")
    light_timeout_ms: int = Field(5000, gt=0, description="for the switches' acknowledgement and the light")
    reverse_port: Name | None = Field(
        None,
        description="the host port towards the previous rank: with it each neighbour pair gets a duplex "
        "link (port <-> next host's reverse_port), as TCP between ranks needs; without it a one-way ring on port "
        "(torus2d: towards the previous host in its row)",
    )
    dims: list[Annotated[int, Field(ge=2, le=1024)]] | None = Field(
        None,
        min_length=2,
        max_length=2,
        description="torus2d only: [rows, cols]; rows * cols must equal the number of ranks, and rows or cols "
        "must be even",
    )
    y_port: Name | None = Field(None, description="torus2d only: the host port towards the next host in its column")
    y_reverse_port: Name | None = Field(
        None,
        description="torus2d only, with reverse_port: the host port towards the previous host in its column",
    )


class Job(Strict):
    """A command started on GPU hosts, one rank per entry of `ranks` (a host may hold several ranks).

    Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, TESTBED_PEERS (host:port of every rank, rank r listening
    on port + r), TESTBED_CHECKPOINT_DIR and CUDA_VISIBLE_DEVICES in its environment.
    """

    command: list[str] = Field(
        min_length=1, description="program and arguments, e.g. [testbed-train, --steps, '100000']"
    )
    ranks: list[Name] = Field(min_length=1, description="the host of each rank, in rank order")
    # Anchored: testbed-train also prints "resumed from step N", which must not count as a training step.
    progress: str = Field(r"^step (\d+)\b", description="regex on a line of the job's output; group 1 is the step")
    checkpoint_dir: str = "checkpoints"
    env: dict[str, str] = Field(default_factory=dict)
    port: int = Field(29500, ge=1024, le=65000)
    fabric: JobFabric | None = Field(None, description="set up by job.start and rewired by failover")
    spares: list[Name] | None = Field(None, description="hosts a failover may use; default the inventory's spares")

    @field_validator("progress")
    @classmethod
    def _one_group(cls, value: str) -> str:
        try:
            groups = re.compile(value).groups
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        if groups < 1:
            raise ValueError("needs a group for the step number, e.g. 'step (\\d+)'")
        return value


# Network faults between the framework and a device, applied by the twin's fault proxy (Toxiproxy's
# toxics; `down` refuses and cuts connections). They exist only in an emulated run.
TRANSPORT_KINDS = (
    "transport.latency",
    "transport.bandwidth",
    "transport.slow_close",
    "transport.timeout",
    "transport.reset_peer",
    "transport.slicer",
    "transport.limit_data",
    "transport.down",
)
RANK_KINDS = ("gpu.fail", "process.kill", "process.hang", "host.straggle", "host.power_off")
FaultKind = Literal[RANK_KINDS + TRANSPORT_KINDS]


class Fault(Strict):
    """What to break. Every fault is healed when the step ends (and on abort).

    A list of kinds (or of devices) is a seeded random choice: one is drawn for each trial, so a chaos run
    repeats exactly for the same seed."""

    kind: FaultKind | list[FaultKind] = Field(description="a kind, or a list to draw one from for each trial")
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

    @model_validator(mode="after")
    def _transport_fields(self):
        kinds = self.kind if isinstance(self.kind, list) else [self.kind]
        if not kinds:
            raise ValueError("kind: give a fault kind, or a non-empty list to draw from")
        transport = [k for k in kinds if k.startswith("transport.")]
        if transport and self.device is None:
            raise ValueError(f"{transport[0]} needs `device`: the device whose connection is faulted")
        if len(transport) < len(kinds) and (self.device is not None or self.attributes):
            raise ValueError("`device` and `attributes` are for transport.* faults only")
        if self.device == []:
            raise ValueError("device: give a device, or a non-empty list to draw from")
        from emulators.proxy.toxics import SCHEMA  # the fault proxy's own table of toxics and attributes

        # With several kinds to draw from, each drawn kind takes the attributes it has; an attribute none of
        # them has is a mistake.
        allowed = {a for k in transport for a in SCHEMA.get(k.removeprefix("transport."), {})}
        unknown = sorted(set(self.attributes) - allowed)
        if unknown:
            raise ValueError(
                f"attributes: {' / '.join(transport)} has no attribute {unknown[0]!r} "
                f"(it has: {', '.join(sorted(allowed)) or 'none'})"
            )
        return self


class Phase(Strict):
    """One phase of a training iteration: its traffic needs `configuration` on the rails, then it computes."""

    name: Name
    configuration: Name
    compute_ms: float = Field(ge=0, le=600_000, description="compute after the phase's communication")


class Workload(Strict):
    """A workload card (as in CCL-Bench and Opus): the phases of one iteration, in order."""

    description: str = ""
    phases: list[Phase] = Field(min_length=1)


def _choice(*allowed: str):
    """One of `allowed`, or `${name}`: a sweep parameter the planner substitutes."""

    def check(value):
        if isinstance(value, str) and (value in allowed or PARAM_REF.match(value)):
            return value
        raise ValueError(f"expected one of {', '.join(allowed)} or a sweep parameter like '${{mode}}', got {value!r}")

    return Annotated[str, BeforeValidator(check)]


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


class JobStart(_Step):
    """Start every rank of the playbook's job at once, then wait for steady progress on all of them."""

    action: Literal["job.start"]
    wait_steps: int = Field(1, ge=0, description="wait until every rank has printed at least this step")
    timeout_ms: int = Field(120_000, gt=0)


class JobMeasure(_Step):
    """Time the job's next `steps` iterations from its own progress lines (on `rank`'s host); the
    span is their mean (one value per window, as Opus reports iteration time)."""

    action: Literal["job.measure"]
    steps: int = Field(10, ge=2, le=100_000)
    rank: int = Field(0, ge=0)
    measure: Name = "iteration"
    timeout_ms: int = Field(120_000, gt=0)


class JobStop(_Step):
    action: Literal["job.stop"]


class FaultDetect(_Step):
    """Watch every rank, inject the fault, and measure fault_injected -> failure_detected; then heal the
    fault and stop the job."""

    action: Literal["fault.detect"]
    fault: Fault
    heartbeat_ms: float = Field(50, gt=0, le=60_000)
    stall_timeout_ms: float = Field(5000, gt=0)
    timeout_ms: int = Field(60_000, gt=0, description="give up waiting for a detection after this long")
    measure: Name | None = "detect"


class FaultInject(_Step):
    """Inject a fault, keep it for `duration_ms`, then heal it (a step of its own: the trial goes on after)."""

    action: Literal["fault.inject"]
    fault: Fault
    when_ms: float = Field(0, ge=0, description="wait this long after the step starts")
    duration_ms: float = Field(1000, ge=0)


class Failover(_Step):
    """Fail a rank, detect it, choose a spare, rewire the fabric, relaunch from the last checkpoint and wait
    for the first step on the spare; every milestone is recorded and `<measure>.<segment>` spans measured."""

    action: Literal["failover"]
    fault: Fault
    heartbeat_ms: float = Field(50, gt=0, le=60_000)
    stall_timeout_ms: float = Field(5000, gt=0)
    timeout_ms: int = Field(120_000, gt=0, description="for each stage: detection, relaunch, first step")
    measure: Name = "failover"


class RailIterate(_Step):
    """Run iterations of a workload card with the rails reconfigured per phase (Opus). Modes: static (the
    rails never change), on-demand (each phase waits for its reconfiguration), provisioning (the next
    configuration is requested as soon as a phase's traffic ends, hidden behind its compute). Each change
    takes the switch's own time plus `delay_ms` (the OCS delay emulated as a sleep per change, as Opus's
    testbed does, so a real fast switch can stand in for slower ones)."""

    action: Literal["rail.iterate"]
    workload: Name
    mode: _choice("static", "on-demand", "provisioning")
    delay_ms: sweepable(0, 600_000) = 0
    iterations: int = Field(10, ge=1, le=100_000)
    warmup: int = Field(
        1,
        ge=0,
        le=1000,
        description="iterations run first and not measured (Opus measures the "
        "later steps only): the first one starts with its rails already in place",
    )
    measure: Name = "iteration"
    verify_light: bool = Field(
        False, description="check light on every new circuit of each change (part of the iteration time)"
    )
    min_power_dbm: float = Field(-20.0, description="with verify_light: every new egress must read above this")
    timeout_ms: int = Field(5000, gt=0, description="for each change's acknowledgement (and light)")


class HostsHealth(_Step):
    """Identify and health-check hosts in parallel (every GPU host of the inventory unless `hosts`)."""

    action: Literal["hosts.health"]
    hosts: list[Name] | None = None


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
    FabricApply
    | FabricCycle
    | FabricClear
    | DeviceCalibrate
    | JobStart
    | JobStop
    | JobMeasure
    | Failover
    | RailIterate
    | FaultDetect
    | FaultInject
    | HostsHealth
    | Wait
    | Parallel,
    Field(discriminator="action"),
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
    max_concurrent_faults: int = Field(
        1,
        ge=1,
        le=64,
        description="interlock: at most this many faults active at once (faults in `parallel` steps add up)",
    )
    on_actor_death: Literal["restart", "stop"] = Field(
        "restart",
        description="when a device actor's process dies mid-run, Ray restarts it (its driver reconnects) and "
        "the call it was running is recorded as info (outcome unknown); that trial fails, then restart: go on "
        "with the next trial; stop: end the run there (teardown and the final read-back still run)",
    )
    configurations: dict[Name, Configuration] = Field(default_factory=dict)
    schedules: dict[Name, Schedule] = Field(default_factory=dict)
    workloads: dict[Name, Workload] = Field(default_factory=dict)
    job: Job | None = None
    sweep: dict[Name, list[Any]] = Field(
        default_factory=dict,
        description="parameters to sweep; the trials run once per combination (cartesian product)",
    )
    setup: list[Step] = Field(default_factory=list)
    steps: list[Step] = Field(min_length=1)
    teardown: list[Step] = Field(default_factory=list)
