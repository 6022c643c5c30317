"""Real-time priority for the twin's fault trigger, where this machine lets the twin have it.

A timed fault (emulators/twin.py) must land at its moment: its lateness counts in the failover error
against the ground truth. The trigger's thread sleeps until just before the moment, and a normal thread
woken on a busy machine waits for a CPU until the running thread's slice ends: on 2 cores shared with the
ranks, Ray and the twin, 100 faults landed up to 1.8 ms late, 13 of 150 more than 0.3 ms. At SCHED_FIFO
it runs as soon as it wakes (here: at most 0.5 ms late, 1 of 100 more than 0.3 ms).

Only the trigger gets it, only while it waits and fires: the framework's own threads, whose timing is what
is measured, keep normal priority. A process may use SCHED_FIFO with CAP_SYS_NICE (root has it) or an
RLIMIT_RTPRIO of 1 or more (`rtprio` in /etc/security/limits.conf); without either the trigger runs at
normal priority, and the run says so next to its accuracy figure.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

RT_PRIORITY = 1  # the lowest real-time priority: ahead of every normal thread, behind the kernel's own


@contextlib.contextmanager
def realtime_thread() -> Iterator[bool]:
    """The calling thread at SCHED_FIFO for the block, where permitted; yields whether it is. The thread's
    policy and priority from before are restored after."""
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
