"""How the GPU-host driver starts, reads and signals a job (drivers/gpuhost/jobs.py), on the text alone: the
command line a job starts with, the pid it printed, its state and progress from `ps` and its log's tail.
"""

from __future__ import annotations

import subprocess

import pytest

from drivers.capabilities import JobHandle, JobStatus
from drivers.errors import DeviceProtocolError
from drivers.gpuhost.jobs import MARK, kill_command, launch, read_job_status, started_pid
from drivers.gpuhost.reply import BadReply

JOB = JobHandle("gpu01", "train", 4242, "testbed-jobs/train/train.log", "testbed-jobs/train")


def test_a_job_starts_in_its_own_session_with_its_gpus_and_environment_quoted():
    how = launch(["python", "-c", "print('a b')"], "train", [0, 1], {"NOTE": "x y", "HOME2": "$HOME"}, None)
    assert how.workdir == "testbed-jobs/train" and how.log == "testbed-jobs/train/train.log"
    assert how.line == (
        "TESTBED_JOB=train NOTE='x y' HOME2='$HOME' CUDA_VISIBLE_DEVICES=0,1 setsid env -C testbed-jobs/train "
        "python -c 'print('\"'\"'a b'\"'\"')' > testbed-jobs/train/train.log 2>&1 < /dev/null & echo $!"
    )


def test_the_start_line_runs_in_a_posix_shell_and_prints_the_job_s_pid(tmp_path):
    how = launch(["sh", "-c", 'echo "$TESTBED_JOB $NOTE $CUDA_VISIBLE_DEVICES"'], "j", [3], {"NOTE": "a b"}, None)
    (tmp_path / how.workdir).mkdir(parents=True)
    shell = subprocess.run(["sh", "-c", how.line + " ; wait"], cwd=tmp_path, capture_output=True, text=True, timeout=10)
    assert started_pid(shell.stdout) is not None
    assert (tmp_path / how.log).read_text() == "j a b 3\n"


def test_a_workdir_given_holds_the_log():
    how = launch(["sleep", "1"], "j", None, None, "/scratch/my jobs")
    assert (how.workdir, how.log) == ("/scratch/my jobs", "/scratch/my jobs/j.log")
    assert (
        "CUDA_VISIBLE_DEVICES" not in how.line
        and "env -C '/scratch/my jobs' sleep 1 > '/scratch/my jobs/j.log'" in how.line
    )


@pytest.mark.parametrize(
    ("command", "name", "env", "why"),
    [
        (["x"], "a b", None, "job name 'a b'"),
        (["x"], "x" * 65, None, "use 1-64 letters"),
        ([], "j", None, "empty job command"),
        (["x"], "j", {"1A": "x"}, "invalid environment variable name '1A'"),
        (["x"], "j", {"A;rm": "x"}, "invalid environment variable name"),
    ],
)
def test_what_a_start_line_cannot_hold_is_refused_before_anything_is_sent(command, name, env, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        launch(command, name, None, env, None)


@pytest.mark.parametrize(
    ("printed", "pid"),
    [("4242\n", 4242), ("  17 ", 17), ("1\n", None), ("0", None), ("", None), ("²", None), ("9" * 19, None)],
)
def test_only_a_pid_whose_group_can_be_signalled_counts_as_started(printed, pid):
    assert started_pid(printed) == pid


@pytest.mark.parametrize(
    ("stat", "state"),
    [
        ("Ss", "running"),
        ("R+", "running"),
        ("D", "running"),
        ("T", "stopped"),
        ("t", "stopped"),
        ("Z", "exited"),
        ("X", "exited"),
        ("", "exited"),
    ],
)
def test_the_state_is_ps_s_state_letter_and_no_process_is_exited(stat, state):
    assert read_job_status(JOB, f"{stat}\n{MARK}\n", r"step (\d+)").state == state


def test_progress_is_the_last_match_in_the_tail_and_the_last_line_is_kept():
    out = f"Ss\n{MARK}\nstep 5 loss 1.0\nstep 7 loss 0.5\nsaving checkpoint\n\n"
    assert read_job_status(JOB, out, r"step (\d+)") == JobStatus(4242, "running", "7", "saving checkpoint")


def test_a_pattern_without_a_group_reports_the_whole_match_and_none_reports_nothing():
    out = f"Ss\n{MARK}\nepoch 3 done\n"
    assert read_job_status(JOB, out, r"epoch \d").progress == "epoch 3"
    assert read_job_status(JOB, out, None).progress is None
    assert read_job_status(JOB, f"S\n{MARK}\n", r"step (\d+)") == JobStatus(4242, "running", None, None)


@pytest.mark.parametrize("out", ["Ss\n", f"not-a-stat\n{MARK}\n", f"Sq\n{MARK}\nstep 1\n"])
def test_output_that_is_not_ps_then_the_mark_is_a_protocol_error(out):
    with pytest.raises(BadReply) as err:
        read_job_status(JOB, out, r"step (\d+)")
    assert err.value.error is DeviceProtocolError
    assert err.value.message == (
        f"cannot read job 'train''s state (pid 4242): expected ps's STAT code, then the line {MARK!r}"
    )
    assert "procps" in err.value.hint


def test_signals_reach_the_group_unless_told_otherwise():
    assert kill_command(4242, "TERM", True) == "kill -TERM -- -4242"
    assert kill_command(4242, "sigstop", False) == "kill -STOP 4242"
    assert kill_command(4242, "9", True) == "kill -9 -- -4242"


def test_an_unknown_signal_is_refused():
    with pytest.raises(ValueError, match="signal 'FOO'"):
        kill_command(4242, "FOO", True)
