"""What this test process may do, decided independently of the code under test."""

from __future__ import annotations

import os
import resource


def may_use_realtime() -> bool:
    """SCHED_FIFO is open to root (CAP_SYS_NICE) or to a process with an rtprio limit above 0."""
    if not hasattr(os, "SCHED_FIFO"):
        return False
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_RTPRIO)[0] > 0
