"""Processes of this machine as Linux's /proc shows them: a process told from a later one given the same pid (its
start time), the processes below one, and ending those that outlive what should have ended them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

POLL_S = 0.02


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces): state [0], ppid [1], utime [11],
    stime [12], start time [19]; None if the process is gone.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot, /proc/PID/stat field 22); None if it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every process below `root`: pid -> its start ticks."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat_fields(int(entry))):
            children.setdefault(int(fields[1]), []).append(int(entry))
            started[int(entry)] = int(fields[19])
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = started[pid]
        todo.extend(children.get(pid, []))
    return found


def kill_survivors(processes: dict[int, int], timeout_s: float) -> None:
    """SIGKILL those of `processes` (pid -> start ticks) still running, and wait up to `timeout_s` until they are
    gone (a zombie is gone: its parent, not this process, reaps it).
    """

    def running(pid: int, started: int) -> bool:
        fields = stat_fields(pid)
        return fields is not None and int(fields[19]) == started and fields[0] != "Z"

    left = {pid: started for pid, started in processes.items() if running(pid, started)}
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = {pid: started for pid, started in left.items() if running(pid, started)}
