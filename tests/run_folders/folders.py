"""Run folders for the tests of untrusted run folders: one that `testbed heal` has something to do for (an
operation its runner left open, its twin gone), written by the Recorder as a run writes its own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from testbed.events import FORMAT_VERSION
from testbed.results.recorder import Recorder

REPO = Path(__file__).resolve().parent.parent.parent


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped): no process has it now."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def healable_run(path: Path, twin_pid: int | None = None, measures: int = 0) -> Path:
    """A run whose runner died with an operation open, on a twin that died with it (twin_pid: a pid no process
    has): heal closes the operation, records the lab gone, and rewrites run.json and writes summary.json and
    trials.csv. With `measures`, that many reconfig.total spans, each a trial (what a report draws a CDF of).
    """
    path.mkdir(parents=True, exist_ok=True)
    pid = twin_pid if twin_pid is not None else dead_pid()
    info = {
        "run": path.name,
        "format_version": FORMAT_VERSION,
        "status": "running",
        "playbook": {"name": "forged"},
        "inventory": {"name": "lab", "devices": {}},
        "emulate": True,
        "twin_pid": pid,
        "trials": 1,
        "runner": {"pid": None, "hostname": socket.gethostname()},
    }
    (path / "run.json").write_text(json.dumps(info), encoding="utf-8")
    recorder = Recorder(path, path.name)
    recorder.emit("mark", "run.start", data={"seed": 0, "trials": 1})
    for trial in range(measures):
        recorder.emit("mark", "trial.start", trial=trial, data={"sweep": {}})
        recorder.emit("measure", "reconfig.total", trial=trial, data={"ms": 20.0 + trial, "start_ns": 0, "end_ns": 1})
        recorder.emit("mark", "trial.end", trial=trial, data={"status": "ok"})
    recorder.emit("invoke", "ocs.reconfigure", device="ocs1", step="apply", data={"circuits": []})
    recorder.close()
    return path


def summarised(run: Path) -> Path:
    """The run with the summary.json a report reads (as heal would write it)."""
    summary = {"run": run.name, "playbook": "forged", "status": "aborted", "trials": {"planned": 1}, "spans": {}}
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return run


def victim(folder: Path, text: str = "root's own file\nits last line") -> Path:
    """A file outside the run folder that a planted link points at; its bytes must never change."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "victim"
    path.write_text(text, encoding="utf-8")
    os.chmod(path, 0o600)
    return path


def run_testbed(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m testbed ARGS` as a user runs it; the timeout is a deadline only (a hang fails the test)."""
    return subprocess.run(
        [sys.executable, "-m", "testbed", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
