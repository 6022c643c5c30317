"""The straggler agent's commands on a real OpenSSH server and a real bash (tests/gpuhost/test_real_sshd.py's
sshd, with testbed-straggle on its sessions' PATH as `pip install testbed` puts it on a lab host's): the same
start, pgrep, kill and ps lines the emulated host runs do the same there.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest
from proc_state import state, stopped_fraction, wait_state
from test_real_sshd import real, real_sshd  # noqa: F401 - the real sshd and a driver connected to it


@pytest.fixture
def lab_host(real, real_sshd):  # noqa: F811
    """The real sshd's host with testbed installed: testbed-straggle on its PATH."""
    _, d = real_sshd
    link = d / "bin" / "testbed-straggle"
    if not link.exists():
        link.symlink_to(shutil.which("testbed-straggle", path=os.path.dirname(sys.executable)))
    return real


def rank_of(drv, name: str):
    job = drv.run_job(["sleep", "60"], name=name, workdir=str(drv.jobdir / name))
    drv.started.append(job.pid)
    return job


def test_the_agent_runs_and_stops_through_real_sshd(lab_host):
    rank = rank_of(lab_host, "straggled")
    agent, _, log = lab_host.start_straggle(rank, 0.5, 100)
    lab_host.started.append(agent)
    assert log == f"{rank.workdir}/straggle-{rank.pid}.log"
    assert lab_host.straggle_agents(rank.pid) == [agent]  # pgrep -f sees it, and not the shell running pgrep
    fraction, cycles = stopped_fraction(rank.pid, 1.0)
    assert abs(fraction - 0.5) < 0.12 and 7 <= cycles <= 12
    done = lab_host.stop_straggle(rank, agent)
    assert done == {
        "agents": [{"pid": agent, "result": "terminated"}],
        "agent": "terminated",
        "left_stopped": False,
        "rank": "continued",
    }
    assert lab_host.straggle_agents(rank.pid) == [] and state(rank.pid) in ("S", "R")
    assert f"testbed-straggle {agent} ended (SIGTERM)" in lab_host.tail(log)
    lab_host.stop_job(rank)


def test_stop_continues_a_rank_a_killed_agent_left_stopped_through_real_sshd(lab_host):
    rank = rank_of(lab_host, "left")
    agent, _, _ = lab_host.start_straggle(rank, 0.9, 2000)
    lab_host.started.append(agent)
    assert wait_state(rank.pid, {"T"}) == "T"
    lab_host.signal(agent, "KILL", group=False)
    assert wait_state(agent, {"Z", None}) in ("Z", None)  # kill returns before the agent has died
    assert state(rank.pid) == "T"
    done = lab_host.stop_straggle(rank, agent)
    assert done == {"agents": [], "agent": "not running", "left_stopped": True, "rank": "continued"}
    assert state(rank.pid) in ("S", "R")
    lab_host.stop_job(rank)
