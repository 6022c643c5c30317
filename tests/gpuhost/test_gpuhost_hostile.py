"""The GPU-host driver against a host that answers badly, over a real SSH connection (tests/gpuhost/
ssh_scripted.py): garbage, truncated and wrong-count nvidia-smi / ps output, an exec request that is never
answered, a connection that dies mid-command. Every call ends, within its timeout, in a typed DeviceError
that names what was sent and what came back; and the runner records a command whose answer was lost as
"info" (it may have run), one that was never sent as "fail".
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict

import pytest
from ssh_scripted import Answer, Drop, Hold, ScriptedSsh

from drivers.capabilities import JobHandle
from drivers.errors import DeviceCommandError, DeviceConnectionError, DeviceError, DeviceProtocolError, DeviceTimeout
from drivers.gpuhost import GpuHostSsh
from drivers.gpuhost.watch import GONE
from drivers.transports.ssh import SshTransport
from testbed.families import PROCEDURES
from testbed.families.context import ProcedureContext

TIMEOUT = 1.0
GPU_ROW = "0, NVIDIA H100 80GB HBM3, GPU-1234, 00000000:18:00.0, 81559, 0, 0, 29, 71.50"
APP_ROW = "4242, testbed-train, 30000, GPU-1234"
IDENTIFY = "hostname || echo ; nvidia-smi --query-gpu=driver_version"
STATUS = "--testbed-nvidia-smi-status--"
JOB = JobHandle(host="gpu01", name="train", pid=4242, log="testbed-jobs/train/train.log", workdir="testbed-jobs/train")


def healthy(command: str) -> Answer:
    if command.startswith("nvidia-smi --query-gpu=index"):
        return GPU_ROW + "\n", "", 0
    if command.startswith(IDENTIFY):  # the hostname, nvidia-smi's rows, its exit status
        return f"gpu01\n550.54.15, NVIDIA H100 80GB HBM3\n{STATUS} 0\n", "", 0
    if command.startswith("nvidia-smi --query-compute-apps"):
        return APP_ROW + "\n", "", 0
    if command.startswith("ps -o stat="):
        return "Ss\n--testbed-tail--\nstep 7 loss 0.1\n", "", 0
    if command == "hostname":
        return "gpu01\n", "", 0
    if command == "dmesg":
        return "[    0.000000] Linux version 6.1.0\n", "", 0
    if "setsid" in command:
        return "4242\n", "", 0
    return "", "", 0


@pytest.fixture
def host(tmp_path) -> Iterator[Callable]:
    """host(answer) -> (GpuHostSsh driver, server): a scripted host, `answer` overriding the healthy one."""
    made: list[tuple[GpuHostSsh, ScriptedSsh]] = []

    def make(answer: Callable[[str], Answer | None] = lambda c: None):
        server = ScriptedSsh(lambda c: answer(c) or healthy(c), tmp_path)
        driver = GpuHostSsh(SshTransport(server.settings(TIMEOUT), "gpu01"), "gpu01")
        made.append((driver, server))
        return driver, server

    yield make
    for driver, server in made:
        driver.close()
        server.stop()


def when(prefix: str, answer: Answer) -> Callable[[str], Answer | None]:
    return lambda command: answer if command.startswith(prefix) else None


PROTO, CMD = DeviceProtocolError, DeviceCommandError
HUGE = "9" * 5000

# (operation, the command it sends starts with, what the host answers, error class, words in the message)
CASES = [
    ("gpus", "nvidia-smi --query-gpu=index", ("\x8f\xfe garbage\n", "", 0), PROTO, "cannot parse"),
    ("gpus", "nvidia-smi --query-gpu=index", (GPU_ROW.rsplit(", ", 3)[0] + "\n", "", 0), PROTO, "expected 9 fields"),
    ("gpus", "nvidia-smi --query-gpu=index", (GPU_ROW + ", 1, 2\n", "", 0), PROTO, "expected 9 fields"),
    ("gpus", "nvidia-smi --query-gpu=index", ("x" + GPU_ROW[1:] + "\n", "", 0), PROTO, "cannot parse"),
    ("gpus", "nvidia-smi --query-gpu=index", ("²" + GPU_ROW[1:] + "\n", "", 0), PROTO, "cannot parse"),
    ("gpus", "nvidia-smi --query-gpu=index", (HUGE + GPU_ROW[1:] + "\n", "", 0), PROTO, "cannot parse"),
    ("gpus", "nvidia-smi --query-gpu=index", (GPU_ROW.replace("81559", "lots") + "\n", "", 0), PROTO, "cannot parse"),
    ("gpus", "nvidia-smi --query-gpu=index", ("", "Segmentation fault\n", 139), CMD, "exit status 139"),
    ("processes", "nvidia-smi --query-compute-apps", ("4242, testbed-train\n", "", 0), PROTO, "compute-apps row"),
    ("processes", "nvidia-smi --query-compute-apps", ("pid, name, mem, uuid\n", "", 0), PROTO, "compute-apps row"),
    ("identify", IDENTIFY, (f"gpu01\n550.54.15\n{STATUS} 0\n", "", 0), PROTO, "listed no GPU"),
    ("identify", IDENTIFY, (f"gpu01\n{STATUS} 0\n", "", 0), PROTO, "listed no GPU"),
    ("identify", IDENTIFY, ("gpu01\n550.54.15, NVIDIA H100 80GB HBM3\n", "", 0), PROTO, "lacks nvidia-smi's exit"),
    ("identify", IDENTIFY, ("", "", 0), PROTO, "lacks nvidia-smi's exit status"),
    ("identify", IDENTIFY, (f"gpu01\n{STATUS} 139\n", "Segmentation fault\n", 0), CMD, "exit status 139"),
    ("job_status", "ps -o stat=", ("Ss\nstep 7\n", "", 0), PROTO, "--testbed-tail--"),  # the marker line lost
    ("job_status", "ps -o stat=", ("PID STAT\n--testbed-tail--\n", "", 0), PROTO, "STAT code"),
    ("job_status", "ps -o stat=", ("\x8f\xfe\n--testbed-tail--\n", "", 0), PROTO, "STAT code"),
    ("job_status", "ps -o stat=", ("", "", 0), PROTO, "--testbed-tail--"),
    ("run_job", "TESTBED_JOB", ("²\n", "", 0), CMD, "did not start"),
    ("run_job", "TESTBED_JOB", (HUGE + "\n", "", 0), CMD, "did not start"),
    ("run_job", "TESTBED_JOB", ("1\n", "", 0), CMD, "did not start"),  # `kill -- -1` would hit every process
    ("run_job", "TESTBED_JOB", ("0\n", "", 0), CMD, "did not start"),
    ("run_job", "TESTBED_JOB", ("4242\n4243\n", "", 0), CMD, "did not start"),
]
OPERATIONS: dict[str, Callable[[GpuHostSsh], object]] = {
    "gpus": lambda d: d.gpus(),
    "processes": lambda d: d.processes(),
    "identify": lambda d: d.identify(),
    "job_status": lambda d: d.job_status(JOB),
    "run_job": lambda d: d.run_job(["testbed-train"], name="train"),
}


@pytest.mark.parametrize(("op", "prefix", "answer", "error", "words"), CASES)
def test_bad_output_raises_typed_errors(host, op, prefix, answer, error, words):
    driver, _ = host(when(prefix, answer))
    with pytest.raises(DeviceError) as info:
        OPERATIONS[op](driver)
    exc = info.value
    assert isinstance(exc, error), f"{type(exc).__name__}: {exc}"
    assert words in str(exc)
    assert prefix in exc.sent  # the command the bad output answered
    assert exc.device == "gpu01" and exc.received is not None and exc.hint  # what came back, what to try


def test_the_healthy_script_parses(host):
    driver, _ = host()
    assert [g.index for g in driver.gpus()] == [0]
    assert [p.pid for p in driver.processes()] == [4242]
    assert driver.identify().serial == "gpu01"
    status = driver.job_status(JOB)
    assert (status.state, status.progress) == ("running", "7")
    assert driver.run_job(["testbed-train"], name="train").pid == 4242


def test_a_step_that_is_not_an_ascii_number_is_a_line_without_a_step(host):
    driver, _ = host(when("{ while grep", ("step ² loss 1\nstep 12 loss 0.5\n", "", 0)))
    events = list(driver.watch(JOB, progress=r"step (\S+)"))
    assert [(e.kind, e.step) for e in events if e.kind != "idle"] == [
        ("progress", None),
        ("progress", 12),
        ("gone", None),  # a host whose stderr said nothing: the watch's end is the news
        ("exited", None),
    ]


def run_in_actor(settings, procedure: str):
    """The call as a run records it: the runner's DeviceActor, in-process (no Ray)."""
    from testbed.engine.device_actor import DeviceActor

    interval = sys.getswitchinterval()
    actor = DeviceActor("gpu01", "ssh", settings)
    sys.setswitchinterval(interval)  # the actor tunes the interpreter for a Ray worker, not for pytest
    try:
        return actor.run(procedure, {})
    finally:
        actor.close()


def test_an_exec_request_never_answered_times_out_as_an_unknown_outcome(host):
    # paramiko waits for the answer to an exec request without a timeout: before the fix, this hung for ever.
    driver, server = host(when("nvidia-smi", Hold()))
    result = run_in_actor(server.settings(TIMEOUT), "gpu.health")
    assert (result.status, result.error_type) == ("info", "DeviceTimeout"), result.error  # the command went out
    assert "nvidia-smi" in result.error and "may still be running" in result.error
    # Ended by the inventory's timeout, after one attempt (a hang is the suite's timeout; no clock is read here).
    assert f"within {TIMEOUT:g} s" in result.error
    assert sum(c.startswith("nvidia-smi") for c in server.commands) == 1


def test_a_watch_whose_exec_request_is_never_answered_times_out(host):
    driver, server = host(when("{ while grep", Hold()))
    with pytest.raises(DeviceTimeout) as info:
        next(iter(driver.watch(JOB)))
    assert info.value.sent.startswith("{ while grep") and "tail -n 0 " in info.value.sent
    assert f"within {TIMEOUT:g} s" in str(info.value)  # the inventory's timeout ended it
    assert sum(c.startswith("{ while grep") for c in server.commands) == 1


def test_a_host_that_dies_mid_command_is_a_lost_connection_not_a_failed_command(host):
    # paramiko reports exit status -1 for a channel closed by the dying connection: that is not nvidia-smi
    # failing (DeviceCommandError, "fail"), the outcome is unknown ("info"), and the next call reconnects.
    alive = {"yes": False}
    driver, server = host(lambda c: None if alive["yes"] else Drop(GPU_ROW[:20]) if c.startswith("nvidia") else None)
    result = run_in_actor(server.settings(TIMEOUT), "gpu.health")
    assert (result.status, result.error_type) == ("info", "DeviceConnectionError"), result.error
    assert "the connection dropped" in result.error and "within" not in result.error  # no timer ended it
    assert sum(c.startswith("nvidia-smi") for c in server.commands) == 1
    with pytest.raises(DeviceConnectionError):
        driver.gpus()
    alive["yes"] = True
    assert [g.index for g in driver.gpus()] == [0]


def test_an_unreachable_host_is_a_failure_nothing_was_sent(host, tmp_path):
    driver, server = host()
    server.stop()
    result = run_in_actor(server.settings(TIMEOUT), "gpu.health")
    assert (result.status, result.error_type) == ("fail", "DeviceConnectionError"), result.error
    assert "Connection refused" in result.error and server.commands == []


@pytest.mark.parametrize("seen_gone", [True, False])
def test_a_host_that_goes_with_its_rank_is_lost_once_its_loop_saw_the_rank_gone(host, seen_gone):
    """host.power_off: the rank dies with its host. If the host's loop said the rank was gone before the connection
    died, the failure is detected (host_lost, at that moment); if not, the watch fails as a lost connection.
    """
    said = GONE + "\n" if seen_gone else ""
    probe = GPU_ROW + f"\n{STATUS} 0\n[    0.000000] Linux version 6.1.0\n"  # health: the GPU, its status, dmesg

    def answer(command: str) -> Answer | None:
        if command.startswith("{ while grep"):
            return Drop("step 7 loss 0.1\n", stderr=said)
        return (probe, "", 0) if STATUS in command else None

    driver, _ = host(answer)
    ctx = ProcedureContext("gpu01", "lab@127.0.0.1")
    watch = functools.partial(PROCEDURES["gpu.watch_job"], driver, ctx, job=asdict(JOB), stall_timeout_s=30, max_s=30)
    if not seen_gone:
        with pytest.raises(DeviceConnectionError):
            watch()
        assert "failure_detected" not in ctx.marks
        return
    result = watch()
    assert (result["detected"], result["last_step"]) == ("host_lost", 7)
    assert result["detected_ns"] == ctx.marks["failure_detected"][0] and "went away" in result["evidence"]
