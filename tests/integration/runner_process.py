"""`testbed` as a separate process, for the tests that kill parts of a run: start it, wait until its
events.jsonl shows a point of the run, read what it wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.events import read_jsonl

WAIT_S = 120  # bound on waiting for the run to reach a point (a slow CI machine), not a timing claim


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "testbed", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def start_run(repo: Path, args: list[str]) -> subprocess.Popen:
    # Its own session: a test may kill the runner's whole process group, as a terminal's kill would.
    return subprocess.Popen(
        [sys.executable, "-m", "testbed", "run", *args],
        cwd=repo,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def read_events(path: Path) -> list[dict]:
    """Every line of a finished run's events.jsonl. Strict: a torn last line the run should not have left
    fails the test (the framework's reader leaves it out and reports it).
    """
    events = read_jsonl(path)
    assert events.torn is None, events.torn
    return events.records


def wait_for(results: Path, proc: subprocess.Popen, condition: Callable[[dict], bool], what: str) -> Path:
    """The run folder, once its events.jsonl holds an event meeting `condition` (read as the run writes it)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for events in results.glob("*/events.jsonl"):
            lines = events.read_text().splitlines()  # the last may be half written: skipped
            if any(condition(json.loads(line)) for line in lines if line.endswith("}")):
                return events.parent
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}: {proc.stderr.read()}")
        time.sleep(0.1)  # polling the file the run writes; the condition, not the pause, synchronises
    pytest.fail(f"no {what} within {WAIT_S} s")


def wait_for_event(results: Path, proc: subprocess.Popen, op: str, type_: str) -> Path:
    return wait_for(results, proc, lambda e: e["op"] == op and e["type"] == type_, f"{type_} {op}")
