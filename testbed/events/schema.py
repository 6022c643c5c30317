"""The event vocabulary of events.jsonl: every name the framework writes, its types, and its payload.

events.jsonl is the results format users' analyses read, so its names and fields are defined here once and
used by every writer (the runner, heal) and reader (check, heal, report, plots, truth). results/README.md's
event tables are generated from it (testbed/events/docs.py,
`python -m testbed.results.event_tables --readme results/README.md`; a test keeps them equal).

Four kinds of name:
- framework events (`Op` below): run and trial boundaries, fabric snapshots, failover milestones, faults;
- device operations: a procedure's name (`ocs.reconfigure`, `gpu.start_job`, ...), as invoke then ok / fail /
  info, with the payloads DEVICE_OP_PAYLOADS gives; the procedures are the device families' (ProcedureSpec);
- device marks: milestones a procedure observes next to the I/O (`sent`, `acked`, `lit`, ...), declared by
  the procedure that takes them;
- measures: spans named `<measure>.<segment>` (a playbook chooses the measure name), payload Measure.
"""

# No `from __future__ import annotations` here: TypedDict must see NotRequired[...] as objects, not strings.
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NotRequired, TypedDict

FORMAT_VERSION = 2  # run.json's format_version; 1: runs from before this schema (no field)

OPERATION_TYPES = frozenset({"invoke", "ok", "fail", "info"})


class Op(StrEnum):
    """Every event name the framework itself writes (device operations and marks are the procedures')."""

    RUN_START = "run.start"
    RUN_END = "run.end"
    RUN_ABORTED = "run.aborted"
    RUN_FAILED = "run.failed"
    RUN_REFUSED = "run.refused"
    TRIAL_START = "trial.start"
    TRIAL_END = "trial.end"
    FABRIC_INITIAL = "fabric.initial"
    FABRIC_OBSERVED = "fabric.observed"
    FABRIC_FINAL = "fabric.final"
    ACTOR_RESTARTED = "actor.restarted"
    WAIT = "wait"
    HEALTH = "health"
    CROSSTALK = "crosstalk"
    FAULT_INJECT = "fault.inject"
    FAULT_HEAL = "fault.heal"
    FAULT_INJECTED = "fault_injected"
    FAULT_DESCRIBED = "fault_described"
    GPU_MARKED_FAILED = "gpu_marked_failed"
    FAILURE_DETECTED = "failure_detected"
    FAILURE_REATTRIBUTED = "failure_reattributed"
    SPARE_SELECTED = "spare_selected"
    FABRIC_RECONFIGURED = "fabric_reconfigured"
    LINK_VERIFIED = "link_verified"
    JOB_RELAUNCHED = "job_relaunched"
    GENERATION_PUBLISHED = "generation_published"
    GENERATION_ABORTED = "generation_aborted"
    JOB_READY = "job_ready"
    FIRST_STEP = "first_step"
    FAILOVER_RESUMED = "failover.resumed"
    HEAL_START = "heal.start"
    HEAL_LAB_GONE = "heal.lab_gone"
    RUN_HEALED = "run.healed"
    RUNNER_LEFTOVERS = "runner.leftovers"
    FABRIC_SERVICE_CONNECT = "fabric_service.connect"
    FABRIC_SERVICE_REQUEST = "fabric_service.request"
    FABRIC_SERVICE_ANSWER = "fabric_service.answer"
    FABRIC_SERVICE_DISCONNECT = "fabric_service.disconnect"
    FABRIC_SERVICE_START = "fabric_service.start"
    FABRIC_SERVICE_CHANGE = "fabric_service.change"
    FABRIC_SERVICE_STOP = "fabric_service.stop"
    RAIL_BYTES = "rail.bytes"
    FABRIC_SERVICE_UNANSWERED = "fabric_service.unanswered"
    LEASE_LAPSED = "lease.lapsed"


# --- payloads ------------------------------------------------------------------------------------------


class Empty(TypedDict):
    pass


class RunStart(TypedDict):
    trials: int
    seed: int


class RunEnd(TypedDict):
    failures: int


class Reason(TypedDict):
    reason: str


class Error(TypedDict):
    error: str


class TrialStart(TypedDict):
    sweep: dict


class TrialEnd(TypedDict):
    status: str
    error: NotRequired[str]
    actor_died: NotRequired[str]


class FabricInitial(TypedDict):
    circuits: dict
    managed: dict


class FabricObserved(TypedDict):
    circuits: dict
    audit_line: int
    why: str


class FabricFinal(TypedDict):
    circuits: dict
    lab_gone: NotRequired[str]
    healed: NotRequired[bool]


class ActorRestarted(TypedDict):
    actor: str
    pid: int
    was: int | None


class Wait(TypedDict):
    seconds: float


class Health(TypedDict):
    ok: bool
    gpus: list
    lost: list
    xids: list
    xid_codes: list
    error: str | None
    kernel_log_error: str | None
    # gpu.health's details (nvidia-smi -q -x); a detection's probe, and a run before them, have none
    readings: NotRequired[list]
    conditions: NotRequired[list]
    readings_error: NotRequired[str | None]


class Crosstalk(TypedDict):
    source: str
    per_port_db: dict


class Fault(TypedDict):
    """What a fault is and where it hit; the same payload on its inject, heal and marks."""

    fault: str
    kind: str
    rank: NotRequired[int]
    host: NotRequired[str]
    gpu: NotRequired[int]
    pid: NotRequired[int | None]
    duration_s: NotRequired[float]
    device: NotRequired[str]
    toxic: NotRequired[str]
    stream: NotRequired[str]
    attributes: NotRequired[dict]
    ports: NotRequired[list]
    link: NotRequired[str]
    watching: NotRequired[bool]
    injected_ns: NotRequired[int]
    job: NotRequired[dict]
    how: NotRequired[str]
    error: NotRequired[str]
    audit_lost: NotRequired[bool]  # an outcome recorded for an invoke whose caller died (events/ledger.py)
    invoke_seq: NotRequired[int]


class FailureReattributed(TypedDict):
    first_seen: int
    failed: int
    evidence: Any


class SpareSelected(TypedDict):
    failed: str
    spare: str
    rank: int


class JobReady(TypedDict):
    ranks: NotRequired[int]


class GenerationPublished(TypedDict):
    generation: int
    slot: str
    spare: str
    rank: int


class GenerationAborted(TypedDict):
    generation: int
    rank: int
    slot: str


class FailoverResumed(TypedDict):
    resumed_from: int
    step: int
    rank: int


class HealStart(TypedDict):
    by: dict
    runner: dict
    torn: list
    open_invokes: int
    faults: list
    jobs: list


class HealLabGone(TypedDict):
    why: str
    faults: list
    jobs: list


class RunHealed(TypedDict):
    ok: bool
    problems: list
    done: list


class RunnerLeftovers(TypedDict):
    ray_session: str
    ended: list
    still: list


class FabricServiceConnect(TypedDict):
    conn: int
    peer: str


class FabricServiceRequest(TypedDict):
    """A line a rank sent (`invalid`: why it is not a request); `t_server_ns` on the service's monotonic clock,
    `t_job_ns` on the rank's. `rank` is the connection's (None before its hello).
    """

    conn: int
    rank: int | None
    op: str | None
    t_server_ns: int
    hello_rank: NotRequired[int]
    config: NotRequired[str]
    id: NotRequired[Any]
    t_job_ns: NotRequired[int | None]
    invalid: NotRequired[str]


class FabricServiceAnswer(TypedDict):
    """The answer to a line, recorded before it is sent (`kind`: refused, unauthorised, invalid, failed)."""

    conn: int
    rank: int | None
    op: str | None
    id: Any
    ok: bool
    hello_rank: NotRequired[int]
    config: NotRequired[str]
    t_job_ns: NotRequired[int | None]
    t_received_ns: NotRequired[int]
    t_answered_ns: NotRequired[int]
    error: NotRequired[str]
    kind: NotRequired[str]


class FabricServiceDisconnect(TypedDict):
    conn: int
    rank: int | None
    reason: str


class FabricServiceStart(TypedDict):
    configurations: dict[str, dict[str, list[list[int]]]]  # name -> switch -> [ingress, egress] circuits
    ranks: int
    delay_ms: float


class FabricServiceChange(TypedDict):
    config: str
    trigger: str
    rank: int | None
    t_received_ns: int | None
    t_sent_ns: int | None
    t_verified_ns: int | None
    t_ready_ns: int | None
    delay_ms: float
    command_ms: NotRequired[float]
    error: NotRequired[str]


class FabricServiceStop(TypedDict):
    changes: int
    over_limit: NotRequired[int]  # connections closed at once: as many were open as the service takes
    untraced_unauthorised: NotRequired[int]  # connections without a valid hello, beyond the few recorded


class FabricServiceUnanswered(TypedDict):
    conn: int
    rank: int | None
    op: str | None
    config: str | None
    id: Any
    why: str


class RailBytes(TypedDict):
    phase: str
    config: str
    job_bytes: int
    plane_bytes: NotRequired[int]


class Measure(TypedDict):
    """A span: `ms` = (end_ns - start_ns) / 1e6, both on the clock of the machine that took them."""

    ms: float
    start_ns: int
    end_ns: int
    iteration: NotRequired[int]
    mode: NotRequired[str]
    delay_ms: NotRequired[float]
    rank: NotRequired[int]
    intervals_ms: NotRequired[list]
    hosts: NotRequired[int]
    detected_on_rank: NotRequired[int]
    kind: NotRequired[str | None]
    evidence: NotRequired[Any]
    config: NotRequired[str]
    case: NotRequired[str]
    algorithm: NotRequired[str]
    fabric: NotRequired[str]
    size_bytes: NotRequired[int]
    repetition: NotRequired[int]
    reconfig_ms: NotRequired[float]


class OperationOk(TypedDict):
    value: Any
    duration_ms: NotRequired[float]


class OperationFailed(TypedDict):
    error: str
    error_type: NotRequired[str | None]
    duration_ms: NotRequired[float]
    audit_lost: NotRequired[bool]
    invoke_seq: NotRequired[int]


# A device operation's payloads. An invoke carries the procedure's arguments (long lists as counts).
DEVICE_OP_PAYLOADS: dict[str, type | None] = {
    "invoke": None,
    "ok": OperationOk,
    "fail": OperationFailed,
    "info": OperationFailed,
}


@dataclass(frozen=True)
class EventSpec:
    name: str
    types: frozenset[str]
    payload: type
    doc: str
    device: bool | None = None  # True: always names a device; False: never; None: either


def _spec(op: Op, types: str, payload: type, doc: str, device: bool | None = None) -> EventSpec:
    return EventSpec(str(op), frozenset(types.split()), payload, doc, device)


SCHEMA: dict[str, EventSpec] = {
    s.name: s
    for s in (
        _spec(Op.RUN_START, "mark", RunStart, "the run's first event, after its devices were identified", False),
        _spec(Op.RUN_END, "mark", RunEnd, "the runner ended the run itself (teardown and read-back done)", False),
        _spec(Op.RUN_ABORTED, "mark", Reason, "Ctrl-C or SIGTERM: the fault under way was healed, teardown ran", False),
        _spec(Op.RUN_FAILED, "mark", Error, "the experiment failed (the error says why)", False),
        _spec(Op.RUN_REFUSED, "mark", Error, "refused before the experiment began (a lock, a pin)", False),
        _spec(
            Op.LEASE_LAPSED,
            "mark",
            Error,
            "the run's leases lapsed or could not be renewed in time (a suspend, a pause, the store unreachable): "
            "it sent no command after this (docs/leases.md)",
            False,
        ),
        _spec(Op.TRIAL_START, "mark", TrialStart, "a trial starts, at its sweep point", False),
        _spec(Op.TRIAL_END, "mark", TrialEnd, "a trial ends: ok, or failed with the error", False),
        _spec(
            Op.FABRIC_INITIAL,
            "mark",
            FabricInitial,
            "the circuits each switch held when the run found it, and the ports the run may change: what "
            "`testbed heal` restores",
            False,
        ),
        _spec(
            Op.FABRIC_OBSERVED,
            "mark",
            FabricObserved,
            "a switch read back mid-history (its actor restarted, or by heal); `check` replays on from here",
            True,
        ),
        _spec(Op.FABRIC_FINAL, "mark", FabricFinal, "every switch read back at the end of the run (or of heal)", False),
        _spec(
            Op.ACTOR_RESTARTED, "mark", ActorRestarted, "Ray restarted a device's actor (a new worker process)", True
        ),
        _spec(Op.WAIT, "mark", Wait, "a `wait` step pauses", False),
        _spec(Op.HEALTH, "mark", Health, "a host's answer to a health check", True),
        _spec(Op.CROSSTALK, "mark", Crosstalk, "crosstalk per output port of a chip (the twin's ground truth)", True),
        _spec(
            Op.FAULT_INJECT,
            "invoke ok fail info",
            Fault,
            "a fault is injected (ok: applied; info: outcome unknown; fail: certainly not applied)",
            True,
        ),
        _spec(
            Op.FAULT_HEAL,
            "invoke ok fail info",
            Fault,
            "a fault is healed (`how`: what heal did; info: outcome unknown, the fault counts as active)",
            None,
        ),
        _spec(
            Op.FAULT_INJECTED,
            "mark",
            Fault,
            "failover milestone: the moment the fault took effect (a timed trigger in the twin; on a lab, "
            "marked by the device's procedure: the midpoint of the signal's call (gpu.kill_job), of the BMC's "
            "reset or the switch's port disable, the straggler agent's start line (docs/faults.md))",
            True,
        ),
        _spec(Op.FAULT_DESCRIBED, "mark", Fault, "the fault a device mark `fault_injected` belongs to", True),
        _spec(
            Op.GPU_MARKED_FAILED,
            "mark",
            Fault,
            "on a lab gpu.fail kills the rank; its GPU is failed in the run only",
            True,
        ),
        _spec(
            Op.FAILURE_DETECTED, "mark", Empty, "failover milestone: a watcher saw the failure (gpu.watch_job)", True
        ),
        _spec(
            Op.FAILURE_REATTRIBUTED,
            "mark",
            FailureReattributed,
            "a watcher saw a peer of the rank the fault hit fail first (its ring broke): the rank the fault hit "
            "is the one failed over",
            False,
        ),
        _spec(Op.SPARE_SELECTED, "mark", SpareSelected, "failover milestone: the spare is chosen", False),
        _spec(
            Op.FABRIC_RECONFIGURED, "mark", Empty, "failover milestone: every switch acknowledged the rewiring", False
        ),
        _spec(Op.LINK_VERIFIED, "mark", Empty, "failover milestone: light on every new circuit", False),
        _spec(Op.JOB_RELAUNCHED, "mark", Empty, "failover milestone: every rank's relaunch returned its pid", False),
        _spec(
            Op.GENERATION_PUBLISHED,
            "mark",
            GenerationPublished,
            "failover milestone (recovery: in-job): the next generation published, the spare in the failed slot",
            False,
        ),
        _spec(
            Op.GENERATION_ABORTED,
            "mark",
            GenerationAborted,
            "recovery: in-job: the job's generation marked aborted as the failure was seen (its members leave it)",
            False,
        ),
        _spec(
            Op.JOB_READY,
            "mark",
            JobReady,
            "the job is up: every rank printed its ready line (a device mark of gpu.wait_step), or job.start's end",
            None,
        ),
        _spec(
            Op.FIRST_STEP, "mark", Empty, "failover milestone: the spare's first training step (gpu.wait_step)", True
        ),
        _spec(Op.FAILOVER_RESUMED, "mark", FailoverResumed, "the job resumed on the spare from its checkpoint", True),
        _spec(Op.HEAL_START, "mark", HealStart, "`testbed heal` starts on a dead run: what it found", False),
        _spec(
            Op.HEAL_LAB_GONE, "mark", HealLabGone, "the run's twin went with its runner: nothing left to heal", False
        ),
        _spec(Op.RUN_HEALED, "mark", RunHealed, "`testbed heal` is done", False),
        _spec(
            Op.FABRIC_SERVICE_CONNECT,
            "mark",
            FabricServiceConnect,
            "a rank connected to the job's fabric service",
            False,
        ),
        _spec(
            Op.FABRIC_SERVICE_REQUEST,
            "mark",
            FabricServiceRequest,
            "a rank asked the fabric service (hello, setup, prepare, release), or sent a line it could not read",
            False,
        ),
        _spec(
            Op.FABRIC_SERVICE_ANSWER,
            "mark",
            FabricServiceAnswer,
            "the fabric service's answer to a rank, recorded before it is sent (a setup's once the fabric is set)",
            False,
        ),
        _spec(
            Op.FABRIC_SERVICE_DISCONNECT,
            "mark",
            FabricServiceDisconnect,
            "a rank's connection to the fabric service ended, and why",
            False,
        ),
        _spec(
            Op.FABRIC_SERVICE_START,
            "mark",
            FabricServiceStart,
            "the job's fabric service is up: the configurations it may set, with their circuits",
            False,
        ),
        _spec(
            Op.FABRIC_SERVICE_CHANGE,
            "mark",
            FabricServiceChange,
            "the fabric service changed the fabric: its request, switch command and ready times",
            False,
        ),
        _spec(Op.FABRIC_SERVICE_STOP, "mark", FabricServiceStop, "the job's fabric service is closed", False),
        _spec(
            Op.FABRIC_SERVICE_UNANSWERED,
            "mark",
            FabricServiceUnanswered,
            "testbed heal: a request the job's fabric service never answered (it died with the run)",
            False,
        ),
        _spec(
            Op.RAIL_BYTES,
            "mark",
            RailBytes,
            "rail.train: a phase's bytes as the job sent them and as the twin's data plane carried them",
            False,
        ),
        _spec(Op.RUNNER_LEFTOVERS, "mark", RunnerLeftovers, "heal ended what the dead runner's Ray left behind", False),
    )
}


class SchemaError(ValueError):
    """An event that does not fit the schema (a framework bug: the results format would change silently)."""


def check_event(
    type_: str, op: str, data: dict, *, device: str | None, procedures: Mapping[str, tuple[str, ...]]
) -> None:
    """Raise SchemaError unless the event fits the schema. `procedures`: procedure name -> its device marks."""
    if type_ == "measure":
        _check_payload(op, Measure, data)
        return
    if type_ in OPERATION_TYPES and op in procedures:
        payload = DEVICE_OP_PAYLOADS[type_]
        if payload is not None:
            _check_payload(op, payload, data)
        return
    if type_ == "mark" and device is not None and not data and _is_device_mark(op, procedures):
        return  # a device mark, as its procedure took it (a milestone such as fault_injected may be both)
    spec = SCHEMA.get(op)
    if spec is None:
        raise SchemaError(f"event {type_} {op!r} is not in testbed/events/schema.py (nor a procedure or its mark)")
    if type_ not in spec.types:
        raise SchemaError(f"event {op!r} is a {'/'.join(sorted(spec.types))}, not a {type_}")
    if spec.device is not None and (device is not None) != spec.device:
        raise SchemaError(f"event {op!r} {'needs' if spec.device else 'takes no'} device")
    _check_payload(op, spec.payload, data)


def _is_device_mark(op: str, procedures: Mapping[str, tuple[str, ...]]) -> bool:
    marks = getattr(procedures, "device_marks", None)  # a snapshot keeps the union of every procedure's marks
    return op in marks if marks is not None else any(op in m for m in procedures.values())


def payload_keys(payload: type) -> tuple[frozenset[str], frozenset[str]]:
    """(required, optional) keys of a payload, a TypedDict class."""
    # A TypedDict class has both at run time; mypy has no type for such a class that says so.
    return payload.__required_keys__, payload.__optional_keys__  # type: ignore[attr-defined]


def _check_payload(op: str, payload: type, data: dict) -> None:
    keys = set(data)
    required, optional = payload_keys(payload)
    missing = required - keys
    extra = keys - required - optional
    if missing or extra:
        raise SchemaError(
            f"event {op!r}: payload {payload.__name__} "
            + (f"misses {sorted(missing)}" if missing else "")
            + (" and " if missing and extra else "")
            + (f"has no field {sorted(extra)}" if extra else "")
        )
