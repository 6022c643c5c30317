"""The twin's ground truth: what the emulated lab actually did, and when, on the twin's own clock.

The framework measures a failover from the outside (a fault injected, a line seen over SSH). The twin
knows the inside: the moment it delivered a fault to a process, and the moment each rank wrote each line
of output (the twin carries a job's output from its pipe into its log file, so it sees every line before
anyone can read it). Comparing the two tells how far the framework's measurement is from the truth.

One JSON object per line, appended and flushed as it happens, so a killed run keeps what it had:

    {"t_ns": ..., "event": "fault",  "host": "gpu03", "op": "fail_gpu", "pids": [...], ...}
    {"t_ns": ..., "event": "signal", "host": "gpu03", "pid": 1234, "signal": "SIGKILL"}
    {"t_ns": ..., "event": "spawn",  "host": "gpu09", "pid": 1240, "job": "train", "argv": [...]}
    {"t_ns": ..., "event": "line",   "host": "gpu09", "pid": 1240, "job": "train", "line": "step 41 loss ..."}
    {"t_ns": ..., "event": "exit",   "host": "gpu09", "pid": 1240, "code": -9}

t_ns is time.monotonic_ns() in the twin's process. The twin always runs on the runner's machine, where
CLOCK_MONOTONIC is one clock for every process; the runner still measures the offset through the control
API (`clock` op) and records it, so the claim is checked rather than assumed.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any


class GroundTruth:
    """Appends ground-truth events to one file; safe to call from any thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in close()

    def record(self, event: str, t_ns: int | None = None, **fields: Any) -> None:
        line = json.dumps({"t_ns": time.monotonic_ns() if t_ns is None else t_ns, "event": event, **fields})
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")  # line-buffered: on disk as it happens

    def reopen(self, path: str | Path) -> None:
        """Append to another file from now on: a warm session's twin outlives its runs, each of which keeps
        its own ground truth in its own folder.
        """
        with self._lock:
            self._file.close()
            self.path = Path(path)
            self._file = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in close()

    def close(self) -> None:
        with self._lock:
            self._file.close()
