"""A process's state as the kernel reports it (/proc/PID/stat), for the straggler tests: the processes they
look at (a local child, an emulated host's job) are processes of this machine.
"""

from __future__ import annotations

import time
from pathlib import Path


def state(pid: int) -> str | None:
    """The kernel's one-letter state of pid (R, S, T, Z, ...), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def wait_state(pid: int, wanted: set[str | None], timeout: float = 10.0) -> str | None:
    """Poll /proc until pid's state is one of `wanted` (a real condition, not a pause standing in for one);
    returns the last state seen.
    """
    deadline = time.monotonic() + timeout
    while (s := state(pid)) not in wanted and time.monotonic() < deadline:
        time.sleep(0.001)
    return s


def stopped_fraction(pid: int, seconds: float) -> tuple[float, int]:
    """Sample pid's state every ~millisecond for `seconds`: the fraction of samples in which it was stopped,
    and how many stops ended (duty cycles) meanwhile.
    """
    samples = stopped = cycles = 0
    before = "T"
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = state(pid)
        samples += 1
        stopped += now == "T"
        cycles += before == "T" and now != "T"
        before = now
        time.sleep(0.001)
    return stopped / samples, cycles
