"""heal ends what a killed runner's Ray instance left, and says "ended" only of processes that are gone."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from testbed.ops.heal import _wait_exited

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfds (Linux 5.3 or later)")


def test_the_wait_returns_once_killed_processes_have_exited_and_names_those_that_have_not():
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fds = {os.pidfd_open(killed.pid): killed.pid, os.pidfd_open(alive.pid): alive.pid}
        os.kill(killed.pid, signal.SIGKILL)
        # The live one is waited for until the deadline, then named; the killed one has exited by the return.
        assert _wait_exited(fds, timeout_s=0.5) == [alive.pid]
        assert killed.poll() == -signal.SIGKILL  # exited (a zombie until reaped here): its files are closed
        assert alive.poll() is None
        assert all(_closed(fd) for fd in fds)  # the pidfds are not leaked
    finally:
        for proc in (killed, alive):
            proc.kill()
            proc.wait()


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_heal_ends_nothing_for_a_folder_that_is_not_a_ray_session(tmp_path):
    """run.json names the folder whose processes heal ends: one changed to name another folder (/, a home, a
    link to a session) has no process ended for it, and heal says so.
    """
    import socket

    from testbed.engine.ray_session import session_folder_problem
    from testbed.ops.heal import HealReport, _end_ray_leftovers

    (tmp_path / "held").write_text("")  # the bystander holds a file in the folder: heal would end it, were it to act
    hold = "import time; f = open('held'); time.sleep(60)"
    bystander = subprocess.Popen([sys.executable, "-c", hold], cwd=tmp_path)
    try:
        session = tmp_path / "session_2026-11-26_10-00-00_000001_1"
        (session / "logs").mkdir(parents=True)
        (session / "sockets").mkdir()
        (tmp_path / "link").symlink_to(session)
        assert "not named as Ray names" in session_folder_problem("/")
        for named, why in (
            (str(tmp_path), "not named as Ray names"),
            (str(tmp_path / "link"), "a symbolic link"),
            ("relative/session_x", "not an absolute path"),
        ):
            report = HealReport()
            info = {"ray": {"session_dir": named}, "runner": {"hostname": socket.gethostname()}}
            _end_ray_leftovers(info, recorder=None, report=report, run_dir=tmp_path)
            assert bystander.poll() is None  # a process holding a file in the folder: not touched
            assert report.done == [] and why in report.problems[0], (named, report.problems)
        assert session_folder_problem(str(session)) is None  # a Ray session's folder is believed
    finally:
        bystander.kill()
        bystander.wait()


def test_a_killed_runner_is_not_running_while_it_waits_to_be_reaped():
    """heal asks whether the dead run's runner still runs: one killed and not yet reaped (a zombie: its parent,
    or PID 1, reaps it later or never) has ended, as one that is gone.
    """
    from testbed.engine.processes import start_ticks
    from testbed.engine.ray_session import runner_alive

    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = {"pid": runner.pid, "start_ticks": start_ticks(runner.pid), "hostname": socket.gethostname()}
        assert runner_alive(identity)
        os.kill(runner.pid, signal.SIGKILL)
        os.waitid(os.P_PID, runner.pid, os.WEXITED | os.WNOWAIT)  # exited, and left unreaped: a zombie
        with open(f"/proc/{runner.pid}/stat") as f:
            assert f.read().rpartition(")")[2].split()[0] == "Z"
        assert not runner_alive(identity)
    finally:
        runner.kill()
        runner.wait()
    assert not runner_alive(identity)  # reaped: gone
