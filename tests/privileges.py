"""What this test process may do, found by asking the kernel directly, not through the code under test."""

from __future__ import annotations

import os
import threading


def may_use_realtime() -> bool:
    """Whether a thread of this process can get SCHED_FIFO. Root usually can, but not in a container that
    drops CAP_SYS_NICE; a user can with an rtprio limit. Tried on a throwaway thread, so nothing here changes.
    """
    if not hasattr(os, "SCHED_FIFO"):
        return False
    granted: list[bool] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))  # pid 0: this thread only
        except OSError:
            granted.append(False)
        else:
            granted.append(True)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return granted[0]
