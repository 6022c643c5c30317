"""heal ends what a killed runner's Ray instance left, and says "ended" only of processes that are gone."""

from __future__ import annotations

import os
import signal
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
