"""GPU host procedures over the GpuHost capability. Jobs cross the actor boundary as plain dicts."""

from __future__ import annotations

import dataclasses
import re
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast

from drivers.capabilities import GpuHost, JobHandle
from drivers.errors import DeviceCommandError, DeviceConnectionError, DeviceTimeout
from testbed.contracts.jsontypes import JsonObject
from testbed.families.context import ProcedureContext

if TYPE_CHECKING:
    from drivers.redfish import RedfishBmc


class JobDict(TypedDict):
    """A job's handle as plain data (drivers.capabilities.JobHandle's fields): how a job crosses the actor boundary."""

    host: str
    name: str
    pid: int
    log: str
    workdir: str


class StraggleHost(GpuHost, Protocol):
    """A GpuHost that runs the duty-cycle agent (drivers.gpuhost.GpuHostSsh is one): what host.straggle drives."""

    def start_straggle(
        self, job: JobHandle, duty: float, period_ms: float, *, timeout_s: float = 30.0
    ) -> tuple[int, int, str]:
        """Start the agent on the job's process group: (its pid, when its start line arrived in ns, its log)."""

    def stop_straggle(self, job: JobHandle, agent: int | None = None) -> JsonObject:
        """End every agent on the job's process group and continue the group; what became of each."""


class Detection(TypedDict):
    """What gpu.watch_job returns: the failure it saw (None: none within max_s) and its evidence."""

    detected: str | None  # "process_exit", "gpu_lost", "xid", "host_lost", "stall"
    evidence: str
    last_step: int | None
    detected_ns: int | None
    health: JsonObject | None  # the probe taken when it was detected


class StepReached(TypedDict):
    """What gpu.wait_step returns: the step seen, its line, when it arrived, the step the job resumed from."""

    step: int
    line: str | None
    first_step_ns: int
    resumed: int | None


class StepTimes(TypedDict):
    """What gpu.step_times returns: the steps seen and when each line arrived (monotonic ns)."""

    steps: list[int]
    ns: list[int]


class JobOutput(TypedDict):
    """What gpu.job_output returns: the matching lines, each as [line, monotonic ns], and the log's last lines."""

    lines: list[list[str | int]]
    tail: list[str]


def _job(job: JobDict | JobHandle) -> JobHandle:
    return job if isinstance(job, JobHandle) else JobHandle(**job)


def identify(host: GpuHost, ctx: ProcedureContext) -> JsonObject:
    """The host's identity and its GPUs, as nvidia-smi lists them."""
    ident = host.identify()
    gpus = host.gpus()
    return {**dataclasses.asdict(ident), "gpus": [dataclasses.asdict(g) for g in gpus]}


def start_job(
    host: GpuHost,
    ctx: ProcedureContext,
    *,
    command: list[str],
    name: str,
    gpus: list[int] | None = None,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
) -> JsonObject:
    """Start a job in the background. Mark: job_started (the host returned its pid)."""
    handle = host.run_job(command, name=name, gpus=gpus, env=env, workdir=workdir)
    ctx.mark("job_started")
    cast(dict[str, JobHandle], ctx.cache.setdefault("jobs", {}))[name] = handle  # by name, for wait_step
    return dataclasses.asdict(handle)


def job_status(
    host: GpuHost,
    ctx: ProcedureContext,
    *,
    job: JobDict,
    progress: str | None = r"step (\d+)",
    tail_lines: int = 50,
) -> JsonObject:
    """The job's state and progress. Mark: progress_seen when the pattern has matched."""
    status = host.job_status(_job(job), progress=progress, tail_lines=tail_lines)
    if status.progress is not None:
        ctx.mark("progress_seen")
    return dataclasses.asdict(status)


def stop_job(host: GpuHost, ctx: ProcedureContext, *, job: JobDict, grace_s: float = 5.0) -> JsonObject:
    """Stop the job (TERM, then KILL after `grace_s`). Mark: job_stopped."""
    result = host.stop_job(_job(job), grace_s=grace_s)
    ctx.mark("job_stopped")
    return {"pid": _job(job).pid, "result": result}


# --- failure detection and fault injection --------------------------------------------------------------

PROGRESS = r"^step (\d+)\b"  # testbed-train's `step N loss L`; anchored so `resumed from step N` is no step


class DetailedHealthHost(GpuHost, Protocol):
    """A GpuHost whose health probe can add the XML report's readings (drivers.gpuhost.GpuHostSsh is one)."""

    def health(self, details: bool = False) -> dict[str, Any]:
        """The host's health; with `details`, the `nvidia-smi -q -x` readings and the conditions they show."""
        ...


def health(host: DetailedHealthHost, ctx: ProcedureContext, *, details: bool = False) -> JsonObject:
    """One health probe: GPUs (lost ones too) and the kernel's Xid lines; with `details`, each GPU's readings from
    `nvidia-smi -q -x` (ECC, retired pages, remapped rows, clocks event reasons, ...) and the conditions they show,
    named (pending retired pages, remapped rows pending or failed, uncorrected ECC errors, a hardware slowdown or
    power brake); ok is false if there is any. The report is tens of kB per GPU and seconds on a real 8-GPU host,
    so a fan-out over many hosts, or a slow management link, asks for it only when it needs it.
    """
    return host.health(details=details)


def kill_job(host: GpuHost, ctx: ProcedureContext, *, job: JobDict, signal: str = "KILL") -> JsonObject:
    """Send a signal to the job's process group, the way a lab injects process.kill (KILL), process.hang
    (STOP) or gpu.fail's effect on the job. Mark: fault_injected at the midpoint of the `kill` exec (the
    signal is delivered somewhere inside it; the midpoint is off by at most half the call); for CONT,
    which heals a hang, fault_healed instead.
    """
    handle = _job(job)
    healing = signal.upper().removeprefix("SIG") == "CONT"
    t0 = time.monotonic_ns()
    host.signal(handle.pid, signal, group=True)
    ns = ctx.mark_at("fault_healed" if healing else "fault_injected", (t0 + time.monotonic_ns()) // 2)
    return {"pid": handle.pid, "signal": signal, ("fault_healed_ns" if healing else "fault_injected_ns"): ns}


def resume_job(host: GpuHost, ctx: ProcedureContext, *, job: JobDict) -> JsonObject:
    """Heal process.hang: SIGCONT to the job's process group if it is still there (a run that detected the
    hang has stopped the job by then, and `testbed heal` may find it gone). Mark: fault_healed.
    """
    handle = _job(job)
    if host.job_status(handle, progress=None, tail_lines=1).state == "exited":
        return {"pid": handle.pid, "result": "not running"}
    try:
        host.signal(handle.pid, "CONT", group=True)
    except DeviceCommandError:
        if host.job_status(handle, progress=None, tail_lines=1).state != "exited":
            raise
        return {"pid": handle.pid, "result": "not running"}  # it exited between the look and the signal
    ctx.mark("fault_healed")
    return {"pid": handle.pid, "result": "continued"}


def straggle_start(
    host: StraggleHost,
    ctx: ProcedureContext,
    *,
    job: JobDict,
    duty: float,
    period_ms: float,
    timeout_s: float = 30.0,
) -> JsonObject:
    """Inject host.straggle on a lab: start the host's duty-cycle agent (testbed-straggle), which stops the
    job's process group for `duty` of every `period_ms`. Mark: fault_injected when the agent's start line
    arrived (it prints it once it has stopped the group the first time). The agent's pid is in the result,
    so a dead run's history names it for `testbed heal`.
    """
    handle = _job(job)
    agent, arrived_ns, log = host.start_straggle(handle, duty, period_ms, timeout_s=timeout_s)
    ns = ctx.mark_at("fault_injected", arrived_ns)
    return {"pid": handle.pid, "agent": agent, "log": log, "duty": duty, "period_ms": period_ms, "injected_ns": ns}


def straggle_stop(host: StraggleHost, ctx: ProcedureContext, *, job: JobDict, agent: int | None = None) -> JsonObject:
    """Heal host.straggle on a lab: end the job's duty-cycle agents (SIGTERM; each continues the group as it
    ends) and SIGCONT the group once they are gone, in case one was killed outright. Mark: fault_healed.
    """
    handle = _job(job)
    done = host.stop_straggle(handle, agent)
    ctx.mark("fault_healed")
    return {"pid": handle.pid, **done}


def watch_job(
    host: GpuHost,
    ctx: ProcedureContext,
    *,
    job: JobDict,
    heartbeat_s: float = 0.05,
    stall_timeout_s: float = 5.0,
    progress: str = PROGRESS,
    max_s: float = 120.0,
    first_step_after: float | None = None,
    health_every_s: float | None = 1.0,
) -> Detection:
    """Block until the job fails, then say how. Marks: watching, once the watch channel reports (its first
    event: a log line or a heartbeat of silence; inject faults after it), and failure_detected, the moment
    the failure is detected.

    The job's log is followed on one channel (host.watch); detected kinds:
    - "process_exit": the job's process is gone (reported within heartbeat_s of its death);
    - "gpu_lost" / "xid": the same, and a health probe taken right after it shows a GPU lost / a new Xid
      line since the watch began (the probe's findings are the evidence);
    - "host_lost": the same, and the host no longer answers the probe (it lost power with its process);
    - "stall": no progress line for stall_timeout_s (before the first progress line: for first_step_after
      seconds, if given, to allow for start-up, e.g. loading a checkpoint).
    Returns {"detected": kind or None after max_s, "evidence", "last_step", "detected_ns", "health"}.
    """
    handle = _job(job)
    baseline = host.health()  # also teaches the driver which bus id is which GPU index
    start = time.monotonic_ns()
    last_step: int | None = None
    last_progress = start
    last_probe = start
    recent: list[str] = []

    def result(kind: str | None, evidence: str, ns: int | None, probe: JsonObject | None = None) -> Detection:
        return {"detected": kind, "evidence": evidence, "last_step": last_step, "detected_ns": ns, "health": probe}

    watching = False
    gone_ns: int | None = None
    try:
        for ev in host.watch(handle, heartbeat_s=heartbeat_s, progress=progress, lines=10):
            if not watching:
                watching = True
                ctx.mark("watching")
            if ev.kind == "gone":
                # The host saw the process end: detected now, at once (a failover starts on this mark); the log's last
                # lines and the watch's end follow, then the evidence is taken.
                gone_ns = ctx.mark_at("failure_detected", ev.monotonic_ns)
                continue
            if ev.kind == "exited":
                ns = gone_ns if gone_ns is not None else ctx.mark_at("failure_detected", ev.monotonic_ns)
                try:
                    probe = host.health()
                except (DeviceConnectionError, DeviceTimeout) as exc:  # the host went with its process (power lost)
                    why = str(exc).splitlines()[0]
                    return result("host_lost", f"process {handle.pid} exited and its host does not answer: {why}", ns)
                lost = sorted(set(probe["lost"]) - set(baseline["lost"]))
                xids = [x for x in probe["xids"] if x not in baseline["xids"]]
                tail = f"; last output: {recent[-1]!r}" if recent else ""
                if lost or probe["error"]:
                    what = f"GPU(s) {lost} lost" if lost else f"nvidia-smi fails: {probe['error']}"
                    return result(
                        "gpu_lost", f"process {handle.pid} exited; {what}; " + " | ".join(xids) + tail, ns, probe
                    )
                if xids:
                    return result("xid", f"process {handle.pid} exited; " + " | ".join(xids) + tail, ns, probe)
                return result(
                    "process_exit", f"process {handle.pid} exited (GPUs healthy, no new Xid){tail}", ns, probe
                )
            if ev.kind == "progress":
                last_step = ev.step if ev.step is not None else last_step
                last_progress = ev.monotonic_ns
            elif ev.kind == "line" and ev.line:
                recent = [*recent[-4:], ev.line]
            if gone_ns is not None:
                continue  # the process is gone: only its last lines and the watch's end are still to come
            if health_every_s is not None and (ev.monotonic_ns - last_probe) / 1e9 >= health_every_s:
                # A GPU can fail while its rank lives on (an Xid the application survives, a lost device the
                # rank has not touched yet): probe nvidia-smi and the kernel log now and then, not only at exit.
                last_probe = ev.monotonic_ns
                probe = host.health()
                lost = sorted(set(probe["lost"]) - set(baseline["lost"]))
                xids = [x for x in probe["xids"] if x not in baseline["xids"]]
                if lost or probe["error"] or xids:
                    ns = ctx.mark("failure_detected")
                    kind = "gpu_lost" if lost or probe["error"] else "xid"
                    what = f"GPU(s) {lost} lost" if lost else (probe["error"] or "new Xid line(s)")
                    return result(kind, f"process {handle.pid} still running; {what}; " + " | ".join(xids), ns, probe)
            limit = stall_timeout_s if (last_step is not None or first_step_after is None) else first_step_after
            if (ev.monotonic_ns - last_progress) / 1e9 >= limit:
                ns = ctx.mark("failure_detected")
                state = host.job_status(handle, progress=None).state
                since = "the watch began" if last_step is None else f"step {last_step}"
                return result("stall", f"no progress line for {limit:g} s since {since}; the process is {state}", ns)
            if (ev.monotonic_ns - start) / 1e9 >= max_s:
                return result(None, f"no failure within {max_s:g} s", None)
    except (DeviceConnectionError, DeviceTimeout) as exc:
        if gone_ns is None:
            raise  # the watch itself failed, before the process was seen gone
        # The process died and the host went with it (power lost) before the watch could end: as at an exit whose
        # probe finds the host gone.
        why = str(exc).splitlines()[0]
        return result("host_lost", f"process {handle.pid} exited and its host went away: {why}", gone_ns)
    raise AssertionError("unreachable: a watch ends with an exited event")


LAST_WORDS = 60  # lines of a job's output kept for its own error when it exits (torchrun's summary after it: ~25)
# Lines that say why a job ended, best first: "error: ..." (the hostside programs' form: the rank's own words), then
# an exception's "SomeError: ..." line (a launcher's: torchrun's ChildFailedError comes after its worker's error).
_WHY = (re.compile(r"^\s*error: "), re.compile(r"^\s*[\w.]*(Error|Exception): "))
# A library's log line, not the job's own words: glog's form, which PyTorch's C++ (`[W1128 08:51:40.113919803
# socket.cpp:469] [c10d] ...`) and torchrun's Python logger (`W1127 14:02:15.011000 4211 torch/...`) both print,
# and go on printing from their threads after a rank has said why it stopped.
_LIBRARY_LOG = re.compile(r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ ")


def last_words(lines: Sequence[str]) -> str | None:
    """What a job that ended said of why: its last "error: " line wherever it is (a launcher such as torchrun
    prints its worker's error and then a traceback and a summary of its own), else its last exception line, else
    its last line of its own (a rank killed after saying why it stopped, say, while a half-formed process group's
    thread still logged timeouts), else its last line.
    """
    for why in _WHY:
        for line in reversed(lines):
            if why.search(line):
                return line
    own = [line for line in lines if line.strip() and not _LIBRARY_LOG.match(line)]
    return own[-1] if own else lines[-1] if lines else None


def _reason_at_exit(host: GpuHost, handle: JobHandle, heartbeat_s: float) -> str | None:
    """Why a job that has exited ended, from the end of its log read after the exit. Not from the lines a watch
    saw: a watch that began while the job was dying has missed the rank's own error line (printed just before it
    began) and seen only what torchrun printed after it.
    """
    return last_words(_log_tail(host, handle, heartbeat_s))


def _log_tail(host: GpuHost, handle: JobHandle, heartbeat_s: float) -> list[str]:
    """The last LAST_WORDS lines of the log of a job that has exited."""
    tail = []
    for ev in host.watch(handle, heartbeat_s=heartbeat_s, progress=None, lines=LAST_WORDS):
        if ev.line:
            tail.append(ev.line)
        if ev.kind == "exited":
            break
    return tail


def wait_step(
    host: GpuHost,
    ctx: ProcedureContext,
    *,
    job: JobDict | str,
    progress: str = PROGRESS,
    min_step: int,
    max_s: float = 120.0,
    heartbeat_s: float = 0.05,
    mark: str = "first_step",
    ready: str | None = None,
) -> StepReached:
    """Block until the job's log shows a step >= min_step (the log is read from its start). Mark:
    first_step, when that line is received. Raises DeviceCommandError if the job exits first and
    DeviceTimeout after max_s. Returns {"step", "line", "first_step_ns"}.

    With `ready` (a regex whose group 1 is the step the job resumed from): first wait for that line and
    mark job_ready, then, on the same watch, for a step after the resumed one. One watch, live before the
    job can print its first step, so first_step is the moment the line arrived and not the moment a
    second watch got round to reading it (the twin's ground truth showed the difference: ~90 ms).
    """
    # A name: a job this actor started earlier in the same program (its handle is in the cache).
    handle = cast(dict[str, JobHandle], ctx.cache["jobs"])[job] if isinstance(job, str) else _job(job)
    start = time.monotonic_ns()
    recent: deque[str] = deque(maxlen=LAST_WORDS)
    ready_rx = re.compile(ready) if ready else None
    resumed: int | None = None
    for ev in host.watch(handle, heartbeat_s=heartbeat_s, progress=progress, lines=None):
        if ready_rx is not None and resumed is None:
            m = ready_rx.search(ev.line) if ev.line else None
            if m:
                ctx.mark_at("job_ready", ev.monotonic_ns)  # when the line arrived
                resumed = int(m.group(1))
                min_step = max(min_step, resumed + 1)
        elif ev.kind == "progress" and ev.step is not None and ev.step >= min_step:
            # first_step, or another milestone (job_ready: the job's "ready" line), when the line arrived
            ns = ctx.mark_at(mark, ev.monotonic_ns)
            return {"step": ev.step, "line": ev.line, "first_step_ns": ns, "resumed": resumed}
        if ev.line:
            recent.append(ev.line)
        if ev.kind == "exited":
            raise DeviceCommandError(
                f"job {handle.name!r} (pid {handle.pid}) exited before step {min_step}",
                device=ctx.device,
                address=ctx.address,
                received=last_words(recent),
                hint=f"read the job's log {handle.log} on the host",
            )
        if (ev.monotonic_ns - start) / 1e9 >= max_s:
            raise DeviceTimeout(
                f"job {handle.name!r} (pid {handle.pid}) did not reach step {min_step} within {max_s:g} s",
                device=ctx.device,
                address=ctx.address,
                received=last_words(recent),
                hint="raise max_s, or check the progress pattern against the job's log",
            )
    raise AssertionError("unreachable: a watch ends with an exited event")


def step_times(
    host: GpuHost,
    ctx: ProcedureContext,
    *,
    job: JobDict,
    progress: str = PROGRESS,
    count: int = 10,
    max_s: float = 120.0,
    heartbeat_s: float = 0.05,
) -> StepTimes:
    """Follow the job's log from now on and return the receive time (monotonic ns) of its next `count`
    progress lines: the job's own iteration times, as the host sees them.
    """
    handle = _job(job)
    start = time.monotonic_ns()
    steps: list[tuple[int, int]] = []
    for ev in host.watch(handle, heartbeat_s=heartbeat_s, progress=progress, lines=0):
        if ev.kind == "progress" and ev.step is not None:
            steps.append((ev.step, ev.monotonic_ns))
            if len(steps) >= count:
                break
        if ev.kind == "exited":
            raise DeviceCommandError(
                f"job {handle.name!r} (pid {handle.pid}) exited while its steps were timed",
                device=ctx.device,
                address=ctx.address,
                received=_reason_at_exit(host, handle, heartbeat_s),
                hint=f"read {handle.log} on the host",
            )
        if (ev.monotonic_ns - start) / 1e9 >= max_s:
            raise DeviceTimeout(
                f"job {handle.name!r} printed {len(steps)} of {count} steps within {max_s:g} s",
                device=ctx.device,
                address=ctx.address,
                hint="raise max_s, or check the progress pattern against the job's log",
            )
    return {"steps": [s for s, _ in steps], "ns": [ns for _, ns in steps]}


def job_output(
    host: GpuHost,
    ctx: ProcedureContext,
    *,
    job: JobDict,
    pattern: str,
    max_s: float = 300.0,
    heartbeat_s: float = 0.05,
) -> JobOutput:
    """Follow the job's log from its start until the job exits; returns the lines matching `pattern`, each with
    its receive time (monotonic ns), and the log's last lines. Raises DeviceTimeout after max_s.
    """
    handle = _job(job)
    rx = re.compile(pattern)
    start = time.monotonic_ns()
    lines: list[list[str | int]] = []
    tail: list[str] = []
    for ev in host.watch(handle, heartbeat_s=heartbeat_s, progress=None, lines=None):
        if ev.line is not None:
            tail = [*tail[-19:], ev.line]
            if rx.search(ev.line):
                lines.append([ev.line, ev.monotonic_ns])
        if ev.kind == "exited":
            return {"lines": lines, "tail": tail}
        if (ev.monotonic_ns - start) / 1e9 >= max_s:
            raise DeviceTimeout(
                f"job {handle.name!r} (pid {handle.pid}) still runs after {max_s:g} s",
                device=ctx.device,
                address=ctx.address,
                received=tail[-1] if tail else None,
                hint=f"raise the step's timeout_ms, or read {handle.log} on the host",
            )
    raise AssertionError("unreachable: a watch ends with an exited event")


# --- host power through its BMC (host.power_off on a lab) -------------------------------------------------


def _bmc(host: GpuHost, ctx: ProcedureContext, bmc: JsonObject) -> RedfishBmc:
    """The host's BMC driver (drivers/redfish/bmc.py), its traffic in the host's audit log. Made for each call and
    logged out at its end: a BMC has a handful of session slots, and a session held between a run's calls
    would keep one for as long as the hub lives.
    """
    from drivers.redfish import RedfishBmc, RedfishSettings

    audit = getattr(getattr(host, "transport", None), "audit", None)
    return RedfishBmc(RedfishSettings.from_dict(bmc), ctx.device, audit)


def power_off(host: GpuHost, ctx: ProcedureContext, *, bmc: JsonObject) -> JsonObject:
    """Inject host.power_off on a lab: ComputerSystem.Reset ForceOff through the host's BMC (Redfish), then
    PowerState read back until it is Off. Mark: fault_injected at the midpoint of the reset request (the BMC
    cut the power somewhere inside it). `bmc`: BmcConfig.call_args (the inventory's bmc: and its password).
    """
    with _bmc(host, ctx, bmc) as b:
        done = b.power_off()
    if not done["changed"]:
        raise DeviceCommandError(
            "the host is already off: its BMC reads PowerState Off before any reset",
            device=ctx.device,
            address=bmc.get("address", "?"),
            received="PowerState 'Off'",
            hint="power the host on (and start its job) before injecting host.power_off",
        )
    ns = ctx.mark_at("fault_injected", done["reset_ns"])
    return {**done, "fault_injected_ns": ns}


def power_on(host: GpuHost, ctx: ProcedureContext, *, bmc: JsonObject) -> JsonObject:
    """Heal host.power_off on a lab: ComputerSystem.Reset On through the host's BMC, then PowerState read back
    until it is On (nothing is sent when it already is). The operating system boots after that: the host's
    SSH comes back when it has. Mark: fault_healed once PowerState reads On.
    """
    with _bmc(host, ctx, bmc) as b:
        done = b.power_on()
    ctx.mark("fault_healed")
    return done
