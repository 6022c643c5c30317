"""Shared fixtures. Ray is started once per test session (it takes seconds), never per test."""

from __future__ import annotations

import os
import signal
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
# The catalogs of the runs tests make, likewise in a folder of this session's, not the user's cache.
os.environ["TESTBED_CATALOG_DIR"] = tempfile.mkdtemp(prefix="testbed-catalogs-")
# `testbed run` looks for a lab's server (testbed serve) here alone: a test's run never goes to a server of the
# machine's; the tests of testbed serve start theirs in folders of their own.
os.environ["TESTBED_SERVE_DIR"] = tempfile.mkdtemp(prefix="testbed-serve-")

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


# --- every run a test makes closes its operations and heals its faults ------------------------------------------

# What `testbed check` says of each run folder a test leaves (the other checks are the tests' own business).
HISTORY_CHECKS = ("every invoke closed", "every fault healed")
_unchecked: list[Path] = []  # the folders of tests whose runs are meant to leave something open
_checked: set[Path] = set()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "unchecked_history(reason): this test's runs are meant to leave an operation open or a fault active "
        "(a runner killed and not healed, a history damaged on purpose)",
    )


@pytest.fixture(autouse=True)
def every_run_closes_its_operations_and_heals_its_faults(request, tmp_path):
    """After the test, `testbed check`'s history checks pass on every run folder under its tmp_path: whatever ends
    a step, its faults are healed and its operations closed.
    """
    yield
    if request.node.get_closest_marker("unchecked_history"):
        _unchecked.append(tmp_path)
        return
    problems = _history_problems(tmp_path)
    assert problems == {}, f"runs that left an operation open or a fault active: {problems}"


def _history_problems(root: Path) -> dict[str, list[str]]:
    from testbed.contracts.errors import UserError
    from testbed.ops.check import check_run

    problems = {}
    for run_json in sorted(root.rglob("run.json")):
        folder = run_json.parent
        if folder in _checked or not (folder / "events.jsonl").exists():
            continue
        _checked.add(folder)
        try:
            result = check_run(folder)
        except UserError:
            continue  # not a run's folder (a test's own damaged copy): its test says what it expects
        found = [p for name in HISTORY_CHECKS for p in result.checks.get(name, [])]
        if found:
            problems[str(folder)] = found
    return problems


@pytest.fixture(scope="session", autouse=True)
def every_fixture_run_closes_its_operations_and_heals_its_faults(tmp_path_factory):
    """The runs of module and session fixtures (outside any one test's tmp_path), checked at the session's end."""
    yield
    problems = {
        folder: found
        for folder, found in _history_problems(tmp_path_factory.getbasetemp()).items()
        if not any(Path(folder).is_relative_to(excluded) for excluded in _unchecked)
    }
    assert problems == {}, f"runs that left an operation open or a fault active: {problems}"


# --- every test leaves the process's signal dispositions as it found them -----------------------------------------

# A test session started as a background job of a non-interactive shell inherits SIGINT and SIGQUIT ignored, and so
# would every command it starts: the tests that stop one with Ctrl-C, as a user does, would hang. Python's own
# handling of Ctrl-C, as in a terminal (and for the commands: the default, at exec).
for _sig, _handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGQUIT, signal.SIG_DFL)):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, _handler)

# A signal ignored here is ignored by every command a later test starts (an ignored disposition survives exec): a
# Ctrl-C would no longer stop them. And in a user's notebook, testbed leaving SIGINT ignored would be the same bug.
WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@pytest.fixture(autouse=True)
def _signal_dispositions_kept():
    before = {sig: signal.getsignal(sig) for sig in WATCHED_SIGNALS}
    yield
    changed = {sig.name: signal.getsignal(sig) for sig, handler in before.items() if signal.getsignal(sig) != handler}
    for sig, handler in before.items():
        signal.signal(sig, handler)
    assert not changed, f"the test left these signals' handlers changed: {changed}"
