"""`testbed heal` of a run whose twin is gone ends the emulated ranks it left (processes of this machine), and
counts one that has exited as gone, a zombie included: a rank SIGKILLed whose parent has not reaped it yet.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from proc_state import wait_state

from testbed.engine.run_marks import process_record
from testbed.ops.heal import _end_twin_rank

RUN = "20261127T180141.123Z-a1b2c3_gpu-failover"


def rank(name: str) -> subprocess.Popen:
    """A process with the twin's rank's environment, once it runs (its environment is in /proc only once its
    program has started: not yet when Popen returns).
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        env={**os.environ, "TESTBED_JOB": name},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout.readline() == b"up\n"
    return proc


def test_a_rank_left_running_is_killed_and_a_zombie_one_is_gone():
    alive, dead = rank("rank0.1"), rank("rank1.1")
    try:
        dead.send_signal(signal.SIGKILL)
        assert wait_state(dead.pid, {"Z"}) == "Z"  # this test is its parent and has not reaped it
        # The records the run took as it started them (testbed.engine.run_marks.ProcessLedger).
        records = {(host, p.pid): process_record(p.pid, RUN) for host, p in (("gpu01", alive), ("gpu02", dead))}
        assert _end_twin_rank({"host": "gpu02", "pid": dead.pid, "name": "rank1.1"}, records, RUN) == {
            "host": "gpu02",
            "pid": dead.pid,
            "name": "rank1.1",
            "result": "gone",
        }
        ended = _end_twin_rank({"host": "gpu01", "pid": alive.pid, "name": "rank0.1"}, records, RUN)
        assert ended["result"] == "killed"
        assert alive.wait(10) == -signal.SIGKILL
    finally:
        for p in (alive, dead):
            p.kill()
            p.wait()
            p.stdout.close()
