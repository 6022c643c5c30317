"""Running a timed op at its moment: the twin's fault trigger (emulators/twin.py, timed requests).

A timed fault must land at its moment: its lateness counts in the failover error against the ground truth.
`run_at` sleeps until just before the moment and waits out the rest awake. Three things can still make it
late on a busy machine, and each has its remedy here:

- the CPU: a normal thread woken on 2 cores shared with the ranks, Ray and the twin waits for the running
  thread's slice to end; at SCHED_FIFO it runs as soon as it wakes, and far fewer faults land late
  (docs/tuning.md, "The twin's timing"). Only the trigger gets it, only while it waits
  and fires: the framework's own threads, whose timing is what is measured, keep normal priority. A process
  may use SCHED_FIFO with CAP_SYS_NICE (root has it) or an RLIMIT_RTPRIO of 1 or more (`rtprio` in
  /etc/security/limits.conf); without either the trigger runs at normal priority, and the run says so next
  to its accuracy figure;
- the GIL: the last millisecond is waited out holding it (the switch interval raised), and the op's own
  lock is taken before that (see `run_at`);
- the garbage collector: no automatic collection between the request and the op.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
RT_PRIORITY = 1  # the lowest real-time priority: ahead of every normal thread, behind the kernel's own
# The thread wakes this long before its moment and waits out the rest awake, holding the GIL: a sleeping
# thread is woken late by whatever else runs on the machine, and another thread holding the GIL can be
# preempted while it does. Holding it stalls the process's other threads for this long once per timed op,
# before the op (docs/tuning.md, "The twin's timing").
WAKE_EARLY_NS = 1_000_000
HOLD_GIL_S = 0.005  # the switch interval while waiting awake: longer than the wait, so kept


@contextlib.contextmanager
def realtime_thread() -> Iterator[bool]:
    """The calling thread at SCHED_FIFO for the block, where permitted; yields whether it is. The thread's
    policy and priority from before are restored after.
    """
    if not hasattr(os, "SCHED_FIFO"):  # not Linux/BSD: nothing to ask for
        yield False
        return
    before = os.sched_getscheduler(0), os.sched_getparam(0)  # pid 0: this thread, on Linux
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
    except OSError:  # PermissionError: neither CAP_SYS_NICE nor an RLIMIT_RTPRIO; or a kernel without it
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, *before)


class SharedSetting:
    """A process-wide setting on while any thread needs it: the first to enter turns it on (`on` returns what
    `off` needs to put it back), the last to leave turns it back.
    """

    def __init__(self, on: Callable[[], Any], off: Callable[[Any], Any]) -> None:
        self._on, self._off = on, off
        self._lock = threading.Lock()
        self._users = 0
        self._before: Any = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._before = self._on()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._off(self._before)


def _raise_switch_interval() -> float:
    """HOLD_GIL_S as the switch interval; returns the one to set back. The interpreter keeps whole
    microseconds and reads them back as a float just below: set back as read, it would lose one each time.
    """
    before = round(sys.getswitchinterval(), 6)
    sys.setswitchinterval(HOLD_GIL_S)
    return before


def _pause_gc() -> bool:
    was_enabled = gc.isenabled()
    gc.disable()
    return was_enabled


def _resume_gc(was_enabled: bool) -> None:
    if was_enabled:
        gc.enable()


# One of each per process, as the settings themselves are: two timed ops at once (faults on two hosts, or two
# twins in one test process) share them, and the last to finish sets them back.
GIL_HELD = SharedSetting(_raise_switch_interval, sys.setswitchinterval)
GC_PAUSED = SharedSetting(_pause_gc, _resume_gc)


def run_at(
    at_ns: int, op: Callable[[], T], lock: contextlib.AbstractContextManager | None = None
) -> tuple[T, int, bool]:
    """Runs `op` at CLOCK_MONOTONIC at_ns, never before; returns its result, the moment it was started and
    whether the thread waited at real-time priority.

    `lock` is the one `op` will take, taken here before the last millisecond at the normal switch interval.
    Taken by `op` at the moment instead, from a thread that holds it (a host's shell command reading /proc),
    `op` would give up the GIL to that thread and wait for it back through the raised interval
    (docs/tuning.md, "The twin's timing").
    """
    # No automatic collection from now until the op has run: one starting in the last milliseconds would
    # hold the GIL through the moment.
    with GC_PAUSED(), realtime_thread() as realtime:
        while (left := at_ns - time.monotonic_ns()) > WAKE_EARLY_NS:
            time.sleep((left - WAKE_EARLY_NS) / 1e9)
        with lock or contextlib.nullcontext(), GIL_HELD():
            while (fired_ns := time.monotonic_ns()) < at_ns:
                pass
            return op(), fired_ns, realtime
