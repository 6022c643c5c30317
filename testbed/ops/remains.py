"""What a run whose runner died left behind, read from its folder: the invokes it left open, the faults
its history leaves active, the ranks it never saw stop, the fabric it found (`testbed heal` acts on it).

Its files as a kill can leave them: a last line torn mid-write is set aside, any other damage is an error
naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from testbed.contracts.errors import UserError
from testbed.events import FaultRecord, InvokeLedger, Op, active_faults
from testbed.events.run_info import read_run_info

UNKNOWN = "outcome unknown: the runner died before this operation completed"
# Marks a runner writes once it has ended the run itself (teardown and read-back done, or refused early).
RUN_ENDS = (Op.RUN_END, Op.RUN_ABORTED, Op.RUN_FAILED, Op.RUN_REFUSED)


# --- what the run left -------------------------------------------------------------------------------


@dataclass
class ActiveFault:
    """A fault the history leaves possibly active, as heal heals it by its kind (FaultKind.heal_after_crash)."""

    name: str  # its key (testbed/events/faults.py), e.g. "process.hang@rank1": what fault.heal names
    kind: str
    device: str | None  # the device of the fault.inject event (the host, or the proxied device)
    data: dict  # the payload of its fault.heal events: its injection's, naming it by its key
    job: dict | None  # the rank's job handle when the history tells it
    certain: bool  # False: its injection's outcome is unknown (the runner died during it)
    # The device procedures the injection ran and their results ({"op", "device", "value"}), e.g. the pid of
    # the straggler agent gpu.straggle_start started on a lab.
    calls: list[dict] = field(default_factory=list)


@dataclass
class Findings:
    open_invokes: list[dict]
    faults: list[ActiveFault]
    jobs: list[dict]  # job handles started and never seen stopped
    unknown_jobs: list[dict]  # job starts whose outcome is unknown (no pid was ever reported)
    initial: dict[str, dict[int, int]]  # switch -> circuits before the run
    managed: dict[str, list[int] | None]  # switch -> ports the run may change (None: not recorded)
    ended: bool  # the run reached its end (`run.end`): teardown and read-back ran
    healed_before: bool

    @property
    def anything(self) -> bool:
        """Whether heal has anything to do: a run that never reached its end has its fabric restored once."""
        return bool(self.open_invokes or self.faults or self.jobs or not (self.ended or self.healed_before))


def find(events: list[dict]) -> Findings:
    """What a run's events leave behind for heal: its open invokes, its active faults, its ranks never seen stop."""
    ledger = InvokeLedger()
    jobs: dict[tuple[str | None, object], dict] = {}  # (host, pid) -> the job's handle
    start_invokes: dict[tuple[str | None, object], dict] = {}  # (host, job name) -> its gpu.start_job invoke
    for e in events:
        data = e.get("data") or {}
        ledger.add(e.get("device"), e["op"], e["type"], e)
        if e["op"] == "gpu.start_job":
            if e["type"] == "invoke":
                start_invokes[(e.get("device"), data.get("name"))] = e
            elif e["type"] == "ok" and (handle := job_handle(data.get("value"))) is not None:
                start_invokes.pop((e.get("device"), handle.get("name")), None)
                jobs[(e.get("device"), handle["pid"])] = handle
            else:
                start_invokes = {k: v for k, v in start_invokes.items() if k[0] != e.get("device")}
        elif e["op"] == "gpu.stop_job" and e["type"] == "ok" and (handle := job_handle(data.get("value"))) is not None:
            jobs.pop((e.get("device"), handle["pid"]), None)
        elif e["op"] == Op.HEAL_LAB_GONE:  # an earlier heal found the twin gone, and its jobs with it
            jobs.clear()
    initial, managed = _initial_fabric(events)
    return Findings(
        open_invokes=sorted(ledger.still_open(), key=lambda e: e["seq"]),
        faults=_active_faults(events),
        jobs=list(jobs.values()),
        unknown_jobs=[e["data"] for e in start_invokes.values()],
        initial=initial,
        managed=managed,
        ended=any(e["op"] in RUN_ENDS for e in events),
        healed_before=any(e["op"] == Op.RUN_HEALED for e in events),
    )


def _active_faults(events: list[dict]) -> list[ActiveFault]:
    """The faults the history leaves possibly active (testbed/events/faults.py), with what heal needs to heal them:
    the rank's job and the procedures their injection ran.
    """
    at = {e["seq"]: i for i, e in enumerate(events)}
    out = []
    for f in active_faults(events):
        start = at[f.inject_seq]
        end = at[f.inject_end_seq] if f.inject_end_seq is not None else len(events)
        job, calls = _job_of(events, f, start, end), _calls_in(events, f, start, end)
        out.append(ActiveFault(f.key, f.kind, f.device, f.heal_payload(), job, f.certain, calls))
    return out


def _job_of(events: list[dict], fault: FaultRecord, start: int, end: int) -> dict | None:
    """The job handle of the rank a fault hit: in the fault's data if the injector put it there, else the
    signal sent to it inside the injection (events[start:end]), else the last start of that rank on its host
    before it.
    """
    data = fault.data
    if job_handle(data.get("job")) is not None:
        return data["job"]
    for e in events[start:end]:
        if e["op"] == "gpu.kill_job" and e["type"] == "invoke" and e.get("device") == fault.device:
            return job_handle(e["data"].get("job"))
    rank = data.get("rank")
    for e in reversed(events[:start]):
        value = (e.get("data") or {}).get("value") or {}
        if (
            e["op"] == "gpu.start_job"
            and e["type"] == "ok"
            and e.get("device") == data.get("host")
            and str(value.get("name", "")).startswith(f"rank{rank}.")
        ):
            return job_handle(value)
    if job_handle({"pid": data.get("pid")}) is not None:
        return {"host": data.get("host"), "name": "", "pid": data["pid"], "log": "", "workdir": ""}
    return None


def job_handle(value) -> dict | None:
    """A job's handle as recorded (host, name, pid, ...), or None where the history holds something else: a pid that
    is no positive number names no process heal may act on (a damaged or forged history).
    """
    if not isinstance(value, dict):
        return None
    pid = value.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if not all(isinstance(value.get(k), str | None) for k in ("host", "name")):
        return None
    return value


def _calls_in(events: list[dict], fault: FaultRecord, start: int, end: int) -> list[dict]:
    """The procedures that succeeded inside an injection (events[start:end]), with their results."""
    return [
        {"op": e["op"], "device": e.get("device"), "value": (e.get("data") or {}).get("value")}
        for e in events[start:end]
        if e["type"] == "ok" and e.get("step") == fault.step and e["op"] != Op.FAULT_INJECT
    ]


def _initial_fabric(events: list[dict]) -> tuple[dict[str, dict[int, int]], dict[str, list[int] | None]]:
    mark = next((e for e in events if e["op"] == Op.FABRIC_INITIAL), None)
    if mark is not None:
        recorded = mark["data"].get("circuits")
        circuits = {sw: c for sw, c in recorded.items() if isinstance(c, dict)} if isinstance(recorded, dict) else {}
        managed = mark["data"].get("managed")
        managed = managed if isinstance(managed, dict) else {}
    else:  # a run from before the mark existed: what identify read, and no record of the ports it manages
        circuits = {
            e["device"]: e["data"]["value"]["circuits"]
            for e in events
            if e["op"] == "ocs.identify" and e["type"] == "ok" and isinstance(e["data"]["value"].get("circuits"), dict)
        }
        managed = {sw: None for sw in circuits}
    try:
        initial = {sw: {int(i): int(o) for i, o in c.items()} for sw, c in circuits.items()}
    except (TypeError, ValueError, OverflowError):
        raise UserError(
            f"the circuits the run found ({json.dumps(circuits, default=str)[:120]}) are not ingress: egress port "
            "numbers; its history is damaged or forged, and heal restores no fabric from it"
        ) from None
    return initial, {sw: managed.get(sw) for sw in initial}


# --- reading the run folder --------------------------------------------------------------------------


@dataclass
class RunFolder:
    path: Path
    info: dict
    events: list[dict]
    torn: list[str] = field(default_factory=list)  # what was set aside, for the report

    @property
    def run_id(self) -> str:
        return self.info.get("run") or self.path.name


def read_run(run_dir: Path) -> RunFolder:
    try:
        info = read_run_info(run_dir)  # a link, a FIFO, too large, too deep, a field of a wrong type: exit 2
        inventory = info["inventory"]
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{run_dir}: not a readable run folder ({exc}); pass a folder `testbed run` wrote") from None
    if not isinstance(inventory, dict) or not (run_dir / "events.jsonl").is_file():
        raise UserError(f"{run_dir}: no events.jsonl or inventory in run.json; pass a folder `testbed run` wrote")
    return RunFolder(run_dir, info, [])
