"""The private local Ray instance a session starts (testbed/engine/ray_local.py): its head runs in a process of
its own, without the head processes such an instance has no use for, and the instance never outlives the session
that started it, however that session ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from testbed.contracts.errors import UserError
from testbed.engine.ray_local import LocalHead
from testbed.engine.ray_session import leftovers

GONE_WITHIN_S = 60.0  # Ray gives each of its processes a second on SIGTERM; a loaded CI machine is slower


def wait_until(condition, timeout_s: float = GONE_WITHIN_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def session_processes(session_dir: str) -> list[str]:
    return [cmdline for _, cmdline in leftovers(session_dir)]


def full_command_lines(session_dir: str) -> list[str]:
    """The whole command line of each process of the instance (leftovers() shortens them for display)."""
    lines = []
    for pid, _ in leftovers(session_dir):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                lines.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # gone meanwhile
    return lines


def test_the_instance_runs_without_the_api_server_and_the_monitors(ray_cluster):
    """The session's instance (started as `testbed run` starts one) has its GCS and raylet, and none of the head
    processes a private instance does not use: the API server, the autoscaler monitor, the log monitor.
    """
    session = ray_cluster._private.worker._global_node.get_session_dir_path()
    running = " | ".join(full_command_lines(session))
    assert "gcs_server" in running and "raylet" in running, running
    for unused in ("dashboard/dashboard.py", "autoscaler/_private/monitor.py", "log_monitor.py"):
        assert unused not in running, running

    # and it still places actors: the session's hubs run on it
    @ray_cluster.remote(num_cpus=0)
    class Echo:
        def pid(self) -> int:
            return os.getpid()

    assert ray_cluster.get(Echo.remote().pid.remote(), timeout=60) != os.getpid()


SESSION = """
import sys, time
from testbed.engine.ray_session import RayStart
start = RayStart(None, background=False)
print(start.session_dir, start._head.process.pid, flush=True)
time.sleep(600)
"""


def test_the_instance_ends_when_the_session_is_killed(tmp_path):
    """A session SIGKILLed (no shutdown runs) leaves nothing: its head sees its standard input close and stops
    the instance, every process of it.
    """
    proc = subprocess.Popen([sys.executable, "-c", SESSION], stdout=subprocess.PIPE, text=True)
    try:
        session, head_pid = proc.stdout.readline().split()
        assert session_processes(session), "the instance is up while its session lives"
    finally:
        proc.kill()
        proc.wait()
    assert wait_until(lambda: not alive(int(head_pid)) and not session_processes(session)), session_processes(session)


ORPHAN = """
import subprocess, time
from testbed.engine.ray_session import RayStart
start = RayStart(None, background=False)
ray = start.get()

@ray.remote(num_cpus=0)
def orphan() -> int:  # a process the instance started that no shutdown of Ray's ends: a session of its own
    return subprocess.Popen(["sleep", "600"], start_new_session=True).pid

print(start.session_dir, start._head.process.pid, ray.get(orphan.remote(), timeout=60), flush=True)
time.sleep(600)
"""


def test_nothing_the_instance_started_outlives_a_killed_session(tmp_path):
    """What the instance's processes started and Ray's own shutdown leaves (a raylet's agent still waiting for the
    GCS, a task's child in a session of its own) ends with the instance: the head ends every process below it.
    """
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True)
    try:
        session, head_pid, orphan_pid = proc.stdout.readline().split()
        assert alive(int(orphan_pid))
    finally:
        proc.kill()
        proc.wait()
    assert wait_until(lambda: not alive(int(head_pid)) and not alive(int(orphan_pid))), session_processes(session)
    assert not session_processes(session)


ABANDONED = """
from testbed.engine.ray_session import RayStart
start = RayStart(None)
start.abandon()
head = start._head
print(head.wait_up(), head.session_dir, head.process.pid, flush=True)
"""


def test_an_abandoned_start_stops_its_instance_by_itself(tmp_path):
    """`testbed run` begins Ray before it reads its files; when they have a mistake it lets the start go and
    exits at once. The head then stops the instance by itself as soon as it is up.
    """
    out = subprocess.run([sys.executable, "-c", ABANDONED], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    _, session, head_pid = out.stdout.split()
    assert wait_until(lambda: not alive(int(head_pid)) and not session_processes(session)), session_processes(session)


def test_a_head_that_cannot_start_says_why(tmp_path, monkeypatch):
    """A local instance that cannot start is a UserError naming Ray's reason and what to try, not a hang."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv("RAY_TMPDIR", str(not_a_folder))  # Ray's session folders go under it
    head = LocalHead()
    with pytest.raises(UserError, match=r"cannot start a local Ray instance: .*Not a directory.*\n  try: "):
        head.wait_up()
    assert head.process.poll() is not None


CTRL_C = """
import time
from testbed.engine.ray_session import RayStart
start = RayStart(None, background=False)
ray = start.get()
try:
    print(start.session_dir, start._head.process.pid, flush=True)  # in the try: the Ctrl-C may follow at once
    time.sleep(600)
except KeyboardInterrupt:  # as a run does: it ends cleanly, still driving its devices through the instance
    echo = ray.remote(num_cpus=0)(type("Echo", (), {"ping": lambda self: "pong"})).remote()
    print(ray.get(echo.ping.remote(), timeout=60), flush=True)
start.shutdown()
"""


def test_ctrl_c_is_the_sessions_to_handle_on_an_instance_still_up(tmp_path):
    """A Ctrl-C in the terminal (SIGINT to the whole foreground process group) is the session's to handle: it ends
    its run cleanly, on an instance still up (the head ignores it, as Ray's own processes do).
    """
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        session, head_pid = proc.stdout.readline().split()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.stdout.readline().strip() == "pong"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_until(lambda: not alive(int(head_pid)) and not session_processes(session))
