"""The twin's fault trigger at real-time priority: taken only where permitted, and always given back."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import threading

import pytest
from privileges import may_use_realtime

from emulators.realtime import realtime_thread

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_FIFO"), reason="no POSIX real-time scheduling here")


def in_a_thread(nice: int) -> dict:
    """realtime_thread() on a fresh thread whose nice value is `nice`: what it yielded, and the thread's
    policy and nice inside and after.
    """
    seen: dict = {}

    def body() -> None:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, nice)  # raising one's own nice needs no right
        with realtime_thread() as realtime:
            seen.update(realtime=realtime, inside=os.sched_getscheduler(0))
        seen.update(after=os.sched_getscheduler(0), nice_after=os.getpriority(os.PRIO_PROCESS, tid))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return seen


@pytest.mark.skipif(not may_use_realtime(), reason="needs CAP_SYS_NICE or an rtprio limit")
def test_where_permitted_the_trigger_waits_at_fifo_and_then_is_normal_again():
    seen = in_a_thread(nice=3)
    assert seen["realtime"] is True and seen["inside"] == os.SCHED_FIFO
    assert seen["after"] == os.SCHED_OTHER and seen["nice_after"] == 3  # as it was: nice kept


NO_RIGHT = (
    "from emulators.realtime import realtime_thread; import os\n"
    "with realtime_thread() as rt: print(rt, os.sched_getscheduler(0) == os.SCHED_OTHER)"
)


def test_without_the_right_the_trigger_runs_at_normal_priority():
    """A user without CAP_SYS_NICE or an rtprio limit: no error, just normal priority (and the run says so)."""
    if not may_use_realtime():
        assert in_a_thread(nice=0) == {
            "realtime": False,
            "inside": os.SCHED_OTHER,
            "after": os.SCHED_OTHER,
            "nice_after": 0,
        }
        return
    if shutil.which("setpriv") is None:
        pytest.skip("root, and no setpriv to drop CAP_SYS_NICE with")
    # Root without CAP_SYS_NICE (and with the default rtprio limit of 0) is refused SCHED_FIFO like any user.
    out = subprocess.run(
        ["setpriv", "--bounding-set", "-sys_nice", "--inh-caps", "-sys_nice", sys.executable, "-c", NO_RIGHT],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0)),  # whatever this machine grants
    )
    assert out.stdout.split() == ["False", "True"]
