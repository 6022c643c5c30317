"""testbed-straggle, the host-side agent of host.straggle on a lab (hostside/straggle_agent.py), on local
child processes: it stops the target's process group for its duty of every period, and whichever way it ends
(SIGTERM, SIGINT, SIGHUP, the target gone) it leaves the group running; SIGKILL alone can leave it stopped,
which is why heal sends SIGCONT to the group as well (tests/gpuhost/test_straggle_lab.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from proc_state import state, stopped_fraction, wait_state

from hostside.straggle_agent import parse

AGENT = shutil.which("testbed-straggle", path=os.path.dirname(sys.executable)) or "testbed-straggle"


@pytest.fixture
def target() -> Iterator[subprocess.Popen]:
    """A rank stand-in: leader of its own process group (the agent stops the whole group)."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    with_group(proc.pid, signal.SIGKILL)
    proc.wait(10)


def with_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def start_agent(pid: int, duty: float, period_ms: float) -> subprocess.Popen:
    agent = subprocess.Popen(
        [AGENT, "--pid", str(pid), "--duty", str(duty), "--period-ms", str(period_ms)],
        start_new_session=True,  # as the driver starts it (setsid): never in the target's group
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first = agent.stdout.readline()  # printed once the group has been stopped the first time
    assert first.startswith(f"testbed-straggle {agent.pid} started: process group {pid} stopped"), first
    return agent


@pytest.mark.parametrize("duty", [0.25, 0.7])
def test_the_agent_stops_the_group_for_its_duty_of_every_period(target, duty):
    agent = start_agent(target.pid, duty, 100)
    fraction, cycles = stopped_fraction(target.pid, 1.5)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(10) == 0
    assert abs(fraction - duty) < 0.12, (fraction, duty)
    assert 11 <= cycles <= 17  # 15 periods of 100 ms in 1.5 s
    assert state(target.pid) in ("S", "R")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_an_ending_signal_leaves_the_target_running(target, sig):
    agent = start_agent(target.pid, 0.9, 2000)  # stopped 1.8 s of every 2 s: the signal comes mid-stop
    assert wait_state(target.pid, {"T"}) == "T"
    agent.send_signal(sig)
    assert agent.wait(10) == 0
    out = agent.stdout.read()
    assert f"ended ({sig.name}) after 0 cycle(s): process group {target.pid} continued" in out
    assert state(target.pid) in ("S", "R")


def test_sigkill_can_leave_the_target_stopped_so_heal_must_continue_it(target):
    agent = start_agent(target.pid, 0.9, 2000)
    assert wait_state(target.pid, {"T"}) == "T"
    agent.kill()
    assert agent.wait(10) == -signal.SIGKILL
    assert state(target.pid) == "T"  # nobody continues it: what heal's own SIGCONT is for
    os.killpg(target.pid, signal.SIGCONT)
    assert state(target.pid) in ("S", "R")


def test_the_agent_ends_by_itself_once_the_target_is_gone(target):
    agent = start_agent(target.pid, 0.5, 50)
    os.killpg(target.pid, signal.SIGKILL)
    target.wait(10)
    assert agent.wait(10) == 0
    assert "ended (gone)" in agent.stdout.read()


def test_the_agent_refuses_a_target_in_its_own_process_group():
    # sh leads a new group; the sleep it starts is in it, and the agent exec'd in sh's place is too.
    proc = subprocess.Popen(
        ["sh", "-c", f'sleep 60 & exec {AGENT} --pid "$!" --duty 0.5 --period-ms 100'],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.wait(10) == 2
    finally:
        with_group(proc.pid, signal.SIGKILL)  # the sleep, which holds the output pipe open
    assert "refused: process" in proc.stdout.read()


def test_the_agent_reports_a_target_that_does_not_exist():
    gone = subprocess.Popen(["true"])
    gone.wait()
    r = subprocess.run([AGENT, "--pid", str(gone.pid), "--duty", "0.5", "--period-ms", "100"], capture_output=True)
    assert r.returncode == 1 and f"no process {gone.pid}" in r.stdout.decode()


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--pid", "123", "--duty", "0.5"],
        ["--pid", "1", "--duty", "0.5", "--period-ms", "100"],
        ["--pid", "x", "--duty", "0.5", "--period-ms", "100"],
        ["--pid", "123", "--duty", "0", "--period-ms", "100"],
        ["--pid", "123", "--duty", "1", "--period-ms", "100"],
        ["--pid", "123", "--duty", "nan", "--period-ms", "100"],
        ["--pid", "123", "--duty", "0.5", "--period-ms", "0"],
        ["--pid", "123", "--duty", "0.5", "--period-ms", "inf"],
        ["--pid", "123", "--duty", "0.5", "--period-ms", "-5"],
    ],
)
def test_bad_arguments_are_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    assert "usage: testbed-straggle" in capsys.readouterr().err


def test_the_console_script_says_what_is_wrong_with_its_arguments():
    r = subprocess.run([AGENT, "--pid", "123", "--duty", "1.5", "--period-ms", "100"], capture_output=True, text=True)
    assert r.returncode == 2 and "'1.5' is not a fraction strictly between 0 and 1" in r.stderr


def test_the_agent_imports_nothing_of_the_framework():
    code = "import sys, hostside.straggle_agent; print(sorted(m for m in sys.modules if m.split('.')[0] in "
    code += "('testbed', 'drivers', 'pydantic', 'rich', 'ray', 'paramiko', 'yaml', 'numpy')))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
