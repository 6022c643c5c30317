"""Shared fixtures. Ray is started once per test session (it takes seconds), never per test."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

# Single-machine mode binds every Ray server to 127.0.0.1; Ray reads this at import time.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# An event outside testbed/events/schema.py fails the run under test (a lab run only warns); subprocesses inherit it.
os.environ["TESTBED_STRICT_EVENTS"] = "1"
# The lab's leases of every run on a lab under test (and of the Ray clusters tests start) in a folder of this
# session's, never the machine's shared /var/tmp.
os.environ["TESTBED_LEASE_DIR"] = tempfile.mkdtemp(prefix="testbed-leases-")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_INVENTORY = REPO / "playbooks" / "inventory" / "emulated-rack.yaml"


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def ray_cluster():
    """The test session's private Ray instance, started the way `testbed run` starts one."""
    from testbed.engine.ray_session import ray_session

    with ray_session(None) as ray:
        yield ray


@pytest.fixture(scope="session")
def testbed_run(repo) -> Callable[..., Path]:
    """`python -m testbed run ARGS...` in the repository, as a user starts it: asserts it succeeded and
    returns the run folder it printed last.
    """

    def run(*args: str) -> Path:
        proc = subprocess.run(
            [sys.executable, "-m", "testbed", "run", *args], cwd=repo, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))

    return run
