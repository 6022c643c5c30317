"""A host whose PID 1 never reaps (a container whose init is no init), through a real OpenSSH server and bash:
a rank started with setsid that is SIGKILLed stays a zombie there for as long as the host runs. sshd runs under
a subreaper that never calls wait() (test_real_sshd.py's HOARDER), so every job it orphans comes to it and a
dead one stays a zombie for the whole test: the watch must report the exit, and the liveness checks (the job's
state, the straggler agents heal ends and the stop that continues their rank) must count it as not running.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest
from proc_state import state, wait_state
from test_real_sshd import STEPPER, connected, hoarding_sshd  # noqa: F401 - the sshd fixture, used by name

# The watch is given up as failed after this many silent heartbeats past the kill (the old watch, GNU tail
# --pid on the rank, never ends on a zombie): a count of the watch's own ticks, not a clock.
IDLES_AFTER_KILL = 200


@pytest.fixture
def hoard(hoarding_sshd):  # noqa: F811
    """A driver on the host that never reaps, with testbed installed (testbed-straggle on its PATH)."""
    _, d = hoarding_sshd
    link = d / "bin" / "testbed-straggle"
    if not link.exists():
        link.symlink_to(shutil.which("testbed-straggle", path=os.path.dirname(sys.executable)))
    yield from connected(hoarding_sshd)


def test_the_watch_reports_a_killed_rank_that_stays_a_zombie_through_real_sshd(hoard):
    job = hoard.run_job(["sh", "-c", STEPPER], name="zombie", workdir=str(hoard.jobdir / "zombie"))
    hoard.started.append(job.pid)
    events, killed, idles = [], False, 0
    for ev in hoard.watch(job, heartbeat_s=0.05):
        events.append(ev)
        if ev.kind == "progress" and not killed:
            hoard.signal(job.pid, "KILL")
            killed = True
        elif killed and ev.kind == "idle":
            idles += 1
            assert idles < IDLES_AFTER_KILL, "the watch did not see the rank's exit: it waits for a reaper"
    assert events[-1].kind == "exited"
    assert state(job.pid) == "Z"  # nobody reaped it: the watch saw a zombie as gone
    assert hoard.job_status(job).state == "exited"


def test_a_killed_agent_that_stays_a_zombie_is_not_running_and_its_rank_is_continued_through_real_sshd(hoard):
    rank = hoard.run_job(["sleep", "60"], name="left", workdir=str(hoard.jobdir / "left"))
    hoard.started.append(rank.pid)
    agent, _, _ = hoard.start_straggle(rank, 0.9, 2000)
    hoard.started.append(agent)
    assert wait_state(rank.pid, {"T"}) == "T"
    hoard.signal(agent, "KILL", group=False)
    assert wait_state(agent, {"Z"}) == "Z"  # and a zombie it stays: its reaper never reaps
    assert hoard.straggle_agents(rank.pid) == []
    done = hoard.stop_straggle(rank, agent)
    assert done == {"agents": [], "agent": "not running", "left_stopped": True, "rank": "continued"}
    assert state(rank.pid) in ("S", "R") and state(agent) == "Z"
    assert hoard.job_status(rank).state == "running"
    hoard.signal(rank.pid, "KILL", group=True)
    assert wait_state(rank.pid, {"Z"}) == "Z"
    assert hoard.job_status(rank).state == "exited"
