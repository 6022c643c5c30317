"""The straggler agent's command line, its log's place and the reading of `ps` (drivers/gpuhost/straggle.py)."""

from __future__ import annotations

import pytest

from drivers.capabilities import JobHandle
from drivers.gpuhost.straggle import agent_line, living, straggle_log

JOB = JobHandle("gpu01", "train", 4242, "testbed-jobs/train/train.log", "testbed-jobs/train/")


def test_the_agent_starts_in_a_session_of_its_own_on_the_job_s_pid():
    assert agent_line(JOB, 0.5, 100) == (
        "setsid testbed-straggle --pid 4242 --duty 0.5 --period-ms 100.0 "
        "> testbed-jobs/train/straggle-4242.log 2>&1 < /dev/null & echo $!"
    )


def test_its_log_is_in_the_job_s_folder_or_the_login_directory():
    assert straggle_log(JOB) == "testbed-jobs/train/straggle-4242.log"
    assert straggle_log(JobHandle("gpu01", "j", 7, "j.log", "")) == "straggle-7.log"
    assert straggle_log(JobHandle("gpu01", "j", 7, "x", "/my jobs")) == "/my jobs/straggle-7.log"


@pytest.mark.parametrize(("duty", "period_ms"), [(0, 100), (1, 100), (0.5, 0), (0.5, float("inf")), (0.5, -1)])
def test_a_duty_cycle_that_cannot_run_is_refused(duty, period_ms):
    with pytest.raises(ValueError, match="need 0 < duty < 1 and period_ms > 0"):
        agent_line(JOB, duty, period_ms)


def test_living_agents_are_those_ps_lists_that_are_not_zombies():
    assert living("  12 S\n 11 T\n 13 Z\n 14 X\n\n") == [11, 12]
    assert living("") == []
    assert living("PID STAT\n15 S extra\n16 Ss\n") == [16]
