"""What a run leaves so that `testbed heal` can tell its own processes, Ray session and network namespaces from
anyone else's, when all heal has is a run folder (which anyone who can write it may have forged, or copied):

- a process record: pid, start time (/proc/PID/stat field 22), owner and run id, taken when the run started the
  process; heal signals a process only if all four still hold (`process_problem`);
- a mark: a file the run creates itself (never one that exists: O_EXCL, no link followed) where only its own
  account can write, naming the run's id and its folder; heal acts on a Ray session folder or a namespace tag only
  if the mark of this very run, in this very folder, is there (`mark_problem`). A copy of a run folder is another
  folder: it names no mark, so healing a colleague's copied run never touches their run's leftovers.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from testbed.engine.processes import start_ticks, stat_fields

# Root's own folder of the marks of --netns runs (namespaces are root's); /run is emptied at boot, as namespaces are.
NETNS_MARKS = Path("/run/testbed-runs")
MARK_MAX_BYTES = 4096
MAX_PROCESSES_BYTES = 16 << 20  # a record per rank the run started: far more than any run starts


def process_record(pid: int, run_id: str) -> dict:
    """What identifies a process the run started, read at its start: its start ticks are None if it is gone."""
    try:
        uid: int | None = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        uid = None
    return {"pid": pid, "start_ticks": start_ticks(pid), "uid": uid, "run": run_id}


def process_problem(record: object, run_id: str) -> str | None:
    """Why the process `record` names may not be signalled for the run `run_id` (None: it is that very process, of
    this account, started by that run). Every field is checked: a record is input like the rest of the folder.
    """
    if not isinstance(record, dict):
        return "no record of it was taken when the run started it"
    pid, ticks, uid = record.get("pid"), record.get("start_ticks"), record.get("uid")
    if not (isinstance(pid, int) and pid > 1 and isinstance(ticks, int) and isinstance(uid, int)):
        return "its record is incomplete"
    if record.get("run") != run_id:
        return f"its record names another run ({str(record.get('run'))[:80]})"
    if uid != os.geteuid():
        return f"the run recorded it as uid {uid}'s, not yours"
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):  # a zombie has ended, reaped or not
        return "it is gone"
    if int(fields[19]) != ticks:
        return "its pid is another process now (another start time)"
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return "it is gone"
    if owner != uid:
        return f"it is uid {owner}'s, not the run's"
    return None


def run_key(run_id: str, run_dir: Path) -> str:
    """The run and the folder it wrote, as one name: a copy of the folder is another key."""
    return hashlib.sha256(f"{run_id}\0{os.path.realpath(run_dir)}".encode()).hexdigest()[:24]


def write_mark(folder: Path, name: str, run_id: str, run_dir: Path) -> None:
    """The run's mark `name` in `folder` (a folder of this account); created by this call or not at all (OSError).
    The folder may be one others can write (Ray makes its session folders so): a file only this account can have
    made is the mark, whoever could add files beside it.
    """
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{folder} is not a folder of this account")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(folder / name, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"run": run_id, "folder": os.path.realpath(run_dir)}, f)


def mark_problem(folder: Path, name: str, run_id: str, run_dir: Path) -> str | None:
    """Why `folder` does not carry this run's mark `name` (None when it does: created by this account, naming this
    run and this folder).
    """
    path = folder / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"it carries no mark of this run ({path}: {exc.strerror})"
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return f"its mark {path} is not a file of yours alone"
        try:
            mark = json.loads(f.read(MARK_MAX_BYTES))
        except ValueError:
            return f"its mark {path} is not one a run wrote"
    if not isinstance(mark, dict) or mark.get("run") != run_id or mark.get("folder") != os.path.realpath(run_dir):
        return f"its mark {path} names another run or folder"
    return None


def ray_mark_name(run_id: str, run_dir: Path) -> str:
    return f"testbed-run-{run_key(run_id, run_dir)}"


def netns_mark_name(tag: str, run_id: str, run_dir: Path) -> str:
    return f"netns-{tag}-{run_key(run_id, run_dir)}"


def mark_netns(tag: str, run_id: str, run_dir: Path) -> str | None:
    """Mark the --netns tag as this run's; a note saying why not, when it cannot be (heal then leaves them).
    The namespaces outlive the run in a warm session (testbed.Lab), so a mark stays until heal removes them or a
    later run finds them gone (the marks of tags with nothing left are removed here).
    """
    try:
        NETNS_MARKS.mkdir(mode=0o755, exist_ok=True)
        _forget_gone_netns()
        write_mark(NETNS_MARKS, netns_mark_name(tag, run_id, run_dir), run_id, run_dir)
    except OSError as exc:
        return f"the run's network namespaces could not be marked as its own ({exc}): heal would not remove them"
    return None


def _forget_gone_netns() -> None:
    from testbed.twin.netns import leftovers

    for mark in NETNS_MARKS.glob("netns-*-*"):
        tag = mark.name.split("-")[1]
        if tag.isalnum() and not any(leftovers(tag).values()):
            mark.unlink(missing_ok=True)


def unmark_netns(tag: str, run_id: str, run_dir: Path) -> None:
    try:
        os.unlink(NETNS_MARKS / netns_mark_name(tag, run_id, run_dir))
    except OSError:
        pass  # never made, or removed already


def mark_ray_session(session_dir: str, run_id: str, run_dir: Path) -> str | None:
    """Mark the local Ray instance's folder as this run's; a note saying why not, when it cannot be."""
    try:
        write_mark(Path(session_dir), ray_mark_name(run_id, run_dir), run_id, run_dir)
    except FileExistsError:
        return None
    except OSError as exc:
        return f"the run's Ray session could not be marked as its own ({exc}): heal would not end its processes"
    return None


PROCESSES_FILE = "processes.jsonl"


class ProcessLedger:
    """An observer of an emulated run's events: for each rank the twin started on this machine (`gpu.start_job` ok),
    its process record, one line of processes.jsonl, written as the start is recorded (a kill loses none before).
    heal ends a rank the dead twin left only if its record still holds.
    """

    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.run_id = run_id
        self._file = open(run_dir / PROCESSES_FILE, "a", encoding="utf-8")  # noqa: SIM115 - closed with the run

    def on_event(self, event) -> None:
        if event.op != "gpu.start_job" or event.type != "ok" or not isinstance(event.data.get("value"), dict):
            return
        handle = event.data["value"]
        if not isinstance(handle.get("pid"), int):
            return
        record = {"host": event.device, "name": handle.get("name"), **process_record(handle["pid"], self.run_id)}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_process_records(run_dir: Path) -> dict[tuple[str | None, int], dict]:
    """processes.jsonl as (host, pid) -> its record; lines that are no record are left out (heal then ends nothing
    for them).
    """
    records: dict[tuple[str | None, int], dict] = {}
    try:
        fd = os.open(run_dir / PROCESSES_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return records
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return records
        for line in f.read(MAX_PROCESSES_BYTES).splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("pid"), int):
                records[(record.get("host"), record["pid"])] = record
    return records
