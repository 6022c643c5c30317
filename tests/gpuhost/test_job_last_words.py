"""Why a job ended, in its own words: a rank's `error: ` line wins over whatever torchrun prints after it (its
traceback ending in ChildFailedError, then its failure summary), wherever a watch of the job's log began.
"""

from __future__ import annotations

import threading
from dataclasses import asdict

import pytest

from drivers.errors import DeviceCommandError
from testbed.families import PROCEDURES
from testbed.families.context import ProcedureContext
from testbed.families.drivers import make_driver
from testbed.families.gpu_host.procedures import last_words

RANK_ERROR = (
    "error: rank 0: step 13 failed, a peer is gone or did not answer within 3 s: "
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 3000ms for recv operation to "
    "complete"
)
# A rank's last lines, as testbed-torch-train prints them under torchrun.
RANK_LINES = f"""\
ready rank 0 world 4 step 0
step 11 loss 0.693152
step 12 loss 0.693147
{RANK_ERROR}
"""
TORCHRUN_WARNING = (
    "W1127 14:02:15.011000 4211 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 4216 closing "
    "signal SIGTERM"
)
# What torchrun (PyTorch 2.x) prints once its worker exited with an error: its own log line, the traceback of
# its launcher, and the summary of the failure.
TORCHRUN_LINES = """\
E1127 14:02:15.118000 4211 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 3) local_rank: 0 \
(pid: 4215) of binary: /opt/venv/bin/python3
Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", \
line 357, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 901, in main
    run(args)
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 892, in run
    elastic_launch(
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 143, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 277, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\x20
============================================================
testbed-torch-train FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_14:02:15
  host      : gpu01
  rank      : 0 (local_rank: 0)
  exitcode  : 3 (pid: 4215)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_the_rank_s_error_line_wins_over_torchrun_s_traceback_and_summary_after_it():
    assert last_words((RANK_LINES + TORCHRUN_LINES).splitlines()) == RANK_ERROR


def test_without_a_rank_s_error_line_the_launcher_s_exception_says_why_else_the_last_line():
    assert last_words(TORCHRUN_LINES.splitlines()) == (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "
    )
    assert last_words(["step 1 loss 0.5", "done rank 0 steps 1"]) == "done rank 0 steps 1"
    assert last_words([]) is None


# A spare's log (testbed-torch-train --in-job) whose generation never formed (a link dark while it formed), killed
# as its failover ended: its own words, then what PyTorch's C++ logged from the thread still forming the group
# (the line as a run on the twin under load recorded it).
SPARE_LINES = """\
spare parked slot gpu02 waiting for generation 1
rank 1 gen 1 failed in step 1: process group of generation 1 not formed within 10 s: a member did not connect
[W1128 08:51:40.113919803 socket.cpp:469] [c10d] waitForInput: poll for socket SocketImpl(fd=3, \
addr=[ff01::b062:df4e:ff7f:0]:20191, remote=[fdff:ffff:1a7f:0:dd8:f338:1a7f:0]:535) returned 0, likely a timeout
"""


def test_without_an_error_line_the_job_s_own_last_words_win_over_a_library_s_log_lines_after_them():
    lines = SPARE_LINES.splitlines()
    for more in range(4):  # however many the library printed after them
        said = last_words(lines + lines[-1:] * more + [TORCHRUN_WARNING] * more)
        assert said == lines[1], said
    assert last_words(lines[-1:]) == lines[-1]  # a log of a library's lines alone: its last line, not nothing


class Watching:
    """The driver, with an event set once its watch has reported a line of the log (its tail follows the log)."""

    def __init__(self, drv) -> None:
        self.drv = drv
        self.saw_a_line = threading.Event()

    def __getattr__(self, name):
        return getattr(self.drv, name)

    def watch(self, job, **kw):
        for ev in self.drv.watch(job, **kw):
            if ev.kind == "line":
                self.saw_a_line.set()
            yield ev


def test_a_job_that_dies_while_its_steps_are_timed_is_reported_in_its_rank_s_words(settings, gpu_host):
    """The rank's error line was written before the watch of gpu.step_times began, torchrun's lines after it
    (the job was dying as job.measure started): the reason is still the rank's line.
    """
    drv = make_driver("ssh", "gpu01", settings)
    try:
        log = gpu_host.engine.home / "torch.log"
        log.write_text(RANK_LINES)
        # A live process for the watch to wait on; the log it follows is the one written here.
        alive = drv.run_job(["testbed-train", "--steps", "100000", "--step-time", "0.01"], name="alive", gpus=[0])
        job = {**asdict(alive), "log": "torch.log"}
        tap = Watching(drv)
        box: dict = {}

        def measure() -> None:
            try:
                PROCEDURES["gpu.step_times"](tap, ProcedureContext("gpu01", settings.address), job=job, max_s=60)
            except DeviceCommandError as exc:
                box["error"] = exc

        thread = threading.Thread(target=measure, daemon=True)
        thread.start()
        # torchrun's lines begin once the watch is following the log: its warning, written again until the watch
        # reports it (a tail opened after a write does not show it)
        for _ in range(6):
            with log.open("a") as f:
                f.write(TORCHRUN_WARNING + "\n")
            if tap.saw_a_line.wait(5):
                break
        else:
            pytest.fail("the watch reported none of the lines written after it began")
        with log.open("a") as f:
            f.write(TORCHRUN_LINES)
        drv.signal(alive.pid, "KILL")
        thread.join(60)
        assert not thread.is_alive(), "gpu.step_times did not return"
    finally:
        drv.close()
    assert "exited while its steps were timed" in str(box["error"])
    assert box["error"].received == RANK_ERROR
