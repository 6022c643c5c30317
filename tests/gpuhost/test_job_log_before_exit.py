"""A job's exit is seen only once every line it wrote is in its log (emulators/gpuhost/joblog.py): a watch that
sees the exit and reads the log a last time has the job's last lines, however far the host's copy of its output
trails, as on a lab, where the job writes its log itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

import pytest

from drivers.gpuhost.watch import ALIVE
from testbed.families.drivers import make_driver

STEPS = 1000  # about 23 kB of output: more than the stalled log below holds, less than its own pipe (64 kB)


def test_a_job_that_exited_reads_as_running_until_its_output_is_in_its_log(gpu_host):
    """The log's disk stalls (a FIFO nobody reads yet): the job exits with its last lines still in the host's
    hands. Until they are written, ps and /proc show it sleeping; once they are, it is gone.
    """
    sh = gpu_host.shell
    fifo = gpu_host.engine.home / "stalled.log"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 4096)  # the least a pipe holds: the job's output cannot fit
        out, err, rc = sh.run(f"testbed-train --steps {STEPS} > stalled.log 2>&1 < /dev/null & echo $!")
        assert (err, rc) == ("", 0)
        pid = int(out)
        with contextlib.suppress(ChildProcessError):  # already reaped: it has exited all the same
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # it has exited: all it wrote is past its own pipe
        assert sh.run(f"ps -o stat= -p {pid}") == ("Ss\n", "", 0)
        assert sh.run(f"grep -sqE '{ALIVE}' /proc/{pid}/stat")[2] == 0  # the failure watch's test: alive
        assert sh.run(f"pgrep -f 'testbed-train --steps {STEPS}'")[0] == f"{pid}\n"

        os.set_blocking(reader, True)
        log = b"".join(iter(lambda: os.read(reader, 65536), b""))  # to the end: the host has written it all
        gpu_host.engine.jobs[pid].flushed.wait()
        gpu_host.engine.jobs[pid].proc.wait()
    finally:
        os.close(reader)
    assert log.decode().splitlines()[-1] == f"done rank 0 steps {STEPS}"
    assert sh.run(f"ps -o stat= -p {pid}")[2] == 1
    assert sh.run(f"grep -sqE '{ALIVE}' /proc/{pid}/stat")[2] != 0


@pytest.mark.parametrize("trial", range(5))
def test_the_watch_of_a_job_that_prints_and_exits_has_its_last_line(settings, gpu_host, trial):
    """Through the driver's failure watch, as a step reads a job it follows to its end (gpu.job_output)."""
    drv = make_driver("ssh", "gpu01", settings)
    try:
        job = drv.run_job(["testbed-train", "--steps", str(200 + trial)], name=f"last{trial}", gpus=[0])
        lines = [ev.line for ev in drv.watch(job, heartbeat_s=0.05, lines=None) if ev.line is not None]
    finally:
        drv.close()
    assert lines[-1] == f"done rank 0 steps {200 + trial}"
    assert [line for line in lines if line.startswith("step ")][-1].startswith(f"step {200 + trial} loss ")
