"""Watching a job for failure: streamed log lines and process exit on one channel, health probes, and the
failure-detection procedures (gpu.watch_job / wait_step / kill_job / health) against the emulated host.
"""

from __future__ import annotations

import re
import select
import socket
import statistics
import threading
import time

import paramiko
import pytest

from drivers.arrival import SO_TIMESTAMPNS, Arrivals, rx_stamped
from drivers.capabilities import JobHandle
from drivers.errors import DeviceCommandError
from drivers.gpuhost import GpuHostSsh
from drivers.transports.ssh import StreamChunk
from emulators.gpuhost.keys import new_ed25519
from testbed.families import PROCEDURES
from testbed.families.context import ProcedureContext
from testbed.families.drivers import make_driver

TRAIN = ["testbed-train", "--steps", "100000", "--step-time", "0.01"]


@pytest.fixture
def driver(settings):
    drv = make_driver("ssh", "gpu01", settings)
    yield drv
    drv.close()


@pytest.fixture
def ctx(settings):
    return ProcedureContext("gpu01", settings.address)


class Tap:
    """The driver, with an event set once its watch has reported a progress line (the watch is live)."""

    def __init__(self, drv: GpuHostSsh) -> None:
        self.drv = drv
        self.progressing = threading.Event()

    def __getattr__(self, name):
        return getattr(self.drv, name)

    def watch(self, job, **kw):
        for ev in self.drv.watch(job, **kw):
            if ev.kind == "progress":
                self.progressing.set()
            yield ev


def in_thread(fn, *args, **kw):
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kw)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def joined(t: threading.Thread, box: dict, timeout: float = 30.0):
    t.join(timeout)
    assert not t.is_alive(), "the procedure did not return"
    if "error" in box:
        raise box["error"]
    return box["value"]


# --- the emulated host's tail -F and streaming exec channels -------------------------------------------


def test_tail_follow_with_pid_of_a_gone_process_prints_the_file_and_exits_0(gpu_host):
    sh = gpu_host.shell
    (gpu_host.engine.home / "log").write_text("step 1 loss 1\nstep 2 loss 0.5\n")
    assert sh.run("tail -n 0 -s 0.05 --pid=999999 -F log") == ("", "", 0)
    assert sh.run("tail -n +1 -s 0.01 --pid=999999 -f log") == ("step 1 loss 1\nstep 2 loss 0.5\n", "", 0)
    assert sh.run("tail -n 1 -s0.01 --pid 999999 --follow=name log") == ("step 2 loss 0.5\n", "", 0)


def test_tail_follow_errors_read_like_gnu_tail(gpu_host):
    sh = gpu_host.shell
    out, err, rc = sh.run("tail -f -s 0.01 --pid=999999 missing.log")
    assert rc == 1 and "cannot open 'missing.log' for reading: No such file" in err and "no files remaining" in err
    assert sh.run("tail -s x -f f")[1:] == ("tail: invalid number of seconds: 'x'\n", 1)
    assert sh.run("tail --pid=abc -f f")[1:] == ("tail: invalid PID: 'abc'\n", 1)
    assert sh.run("tail -f /etc/passwd")[1:] == (
        "tail: cannot open '/etc/passwd' for reading: Permission denied\ntail: no files remaining\n",
        1,
    )  # outside the host's home


def test_exec_channels_stream_output_while_the_command_runs(driver, gpu_host):
    """A foreground command's lines reach the client as they are printed, not when it ends."""
    seen = []
    chunks = driver.transport.stream(" ".join(TRAIN), idle_s=0.05)
    for chunk in chunks:
        seen += chunk.data.decode().splitlines() if chunk.kind == "out" else []
        if any(line.startswith("step 3 ") for line in seen):
            break
    pid = int(re.search(r"starting pid (\d+)", seen[0]).group(1))
    assert gpu_host.engine.jobs[pid].alive  # still training: the lines came while it ran
    chunks.close()  # the reader goes away: the job's next write gets SIGPIPE, as under sshd
    assert gpu_host.engine.jobs[pid].proc.wait(10) != 0


# --- the driver's watch and health ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["fail_gpu", "kill"])
def test_watch_reports_progress_then_exited_when_the_job_dies(driver, gpu_host, how):
    job = driver.run_job(TRAIN, name="w", gpus=[1])
    events = []
    for ev in driver.watch(job, heartbeat_s=0.05, lines=None):
        events.append(ev)
        if ev.kind == "progress" and ev.step == 3:
            assert driver.job_status(job).state == "running"  # progress streams while the job runs
            if how == "fail_gpu":
                gpu_host.fail_gpu(1)
            else:
                driver.signal(job.pid, "KILL")
    assert events[-1].kind == "exited"
    steps = [e.step for e in events if e.kind == "progress" and e.line.startswith("step ")]
    assert steps[:3] == [1, 2, 3] and steps == list(range(1, len(steps) + 1))
    assert all(e.kind in ("line", "progress", "idle", "gone", "exited") for e in events)
    # The host's loop said the process was gone (on stderr) before tail's last read and the channel's end:
    # one gone, followed by log lines at most, then the end.
    gone = [i for i, e in enumerate(events) if e.kind == "gone"]
    assert len(gone) == 1 and all(e.kind in ("line", "progress", "idle") for e in events[gone[0] + 1 : -1])
    assert events[gone[0]].monotonic_ns < events[-1].monotonic_ns
    # Lines carry their arrival time, which never goes back; an idle tick is when silence was noticed, so
    # a line that reached the host's socket just before a tick may carry the earlier time.
    for kinds in (("line", "progress", "exited"), ("idle",)):
        times = [e.monotonic_ns for e in events if e.kind in kinds]
        assert times == sorted(times)
    assert events[-1].monotonic_ns == max(e.monotonic_ns for e in events)
    assert driver.job_status(job).state == "exited"


def test_watch_of_an_already_dead_job_ends_at_once_with_its_log(driver, gpu_host):
    job = driver.run_job(["testbed-train", "--steps", "3"], name="done", gpus=[0])
    gpu_host.engine.jobs[job.pid].proc.wait(60)
    events = list(driver.watch(job, lines=None))
    assert [e.step for e in events if e.kind == "progress"][-3:] == [1, 2, 3]
    assert events[-1].kind == "exited"


def test_a_watch_the_host_cannot_run_is_a_command_error_with_a_hint():
    class Fake:
        address = "lab@fake:22"

        def stream(self, command, idle_s):
            yield StreamChunk("err", b"tail: unrecognized option '--pid=7'\n", 1)
            yield StreamChunk("exit", b"", 2, status=1)

    with pytest.raises(DeviceCommandError) as err:
        list(GpuHostSsh(Fake(), "fake").watch(JobHandle("fake", "j", 7, "j.log", ".")))
    assert "exit status 1" in str(err.value) and "--pid" in str(err.value) and "busybox" in err.value.hint


def test_health_reports_lost_gpus_xids_and_a_missing_driver(driver, gpu_host, ctx):
    healthy = PROCEDURES["gpu.health"](driver, ctx)
    assert (healthy["ok"], healthy["lost"], healthy["xids"], healthy["error"]) == (True, [], [], None)
    assert [g["index"] for g in healthy["gpus"]] == [0, 1, 2, 3]
    gpu_host.fail_gpu(2, xid=79)
    sick = PROCEDURES["gpu.health"](driver, ctx)
    assert (sick["ok"], sick["lost"], sick["xid_codes"]) == (False, [2], [79])
    assert "NVRM: Xid (PCI:0000:3A:00): 79" in sick["xids"][0]
    gpu_host.unload_driver()
    gone = PROCEDURES["gpu.health"](driver, ctx)
    assert gone["ok"] is False and "cannot reach the NVIDIA driver" in gone["error"]


# --- failure detection procedures -------------------------------------------------------------------------


def test_detection_latency_of_a_gpu_failure(driver, gpu_host, ctx):
    """fail_gpu at a recorded monotonic time -> watch_job's failure_detected mark. The distribution goes to
    the report (printed, run with -s); the test asserts only what must hold: causality and the diagnosis.
    """
    tap = Tap(driver)
    latencies = []
    for trial in range(20):
        tap.progressing.clear()
        job = PROCEDURES["gpu.start_job"](driver, ctx, command=TRAIN, name=f"lat{trial}", gpus=[1])
        t, box = in_thread(PROCEDURES["gpu.watch_job"], tap, ctx, job=job, heartbeat_s=0.05, stall_timeout_s=30)
        assert tap.progressing.wait(30), "the job never printed a step"
        injected = time.monotonic_ns()
        gpu_host.fail_gpu(1)
        result = joined(t, box)
        detected = ctx.marks["failure_detected"][0]
        assert result["detected"] == "gpu_lost", result
        assert "GPU(s) [1] lost" in result["evidence"] and ": 79, " in result["evidence"]
        assert result["health"]["lost"] == [1] and result["last_step"] >= 0
        assert ctx.marks["watching"][0] <= injected <= detected
        latencies.append((detected - injected) / 1e6)
        gpu_host.recover_gpu(1)
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    print(
        f"\ndetection latency over {len(latencies)} trials, heartbeat 50 ms (ms): p50 {q[49]:.1f} p90 {q[89]:.1f} "
        f"p99 {q[98]:.1f} max {max(latencies):.1f} min {min(latencies):.1f}; "
        f"all: {sorted(round(x, 1) for x in latencies)}"
    )


def test_a_killed_job_is_a_process_exit_after_fault_injected(driver, gpu_host, ctx):
    job = PROCEDURES["gpu.start_job"](driver, ctx, command=TRAIN, name="k", gpus=[0])
    PROCEDURES["gpu.wait_step"](driver, ctx, job=job, min_step=2, max_s=30)
    t, box = in_thread(PROCEDURES["gpu.watch_job"], driver, ctx, job=job, stall_timeout_s=30)
    PROCEDURES["gpu.kill_job"](driver, ctx, job=job, signal="KILL")
    result = joined(t, box)
    assert result["detected"] == "process_exit" and result["last_step"] >= 2
    assert "GPUs healthy, no new Xid" in result["evidence"]
    assert ctx.marks["fault_injected"][0] <= ctx.marks["failure_detected"][0]


def test_a_stopped_job_is_detected_as_a_stall(driver, gpu_host, ctx):
    job = PROCEDURES["gpu.start_job"](driver, ctx, command=TRAIN, name="hang", gpus=[0])
    PROCEDURES["gpu.wait_step"](driver, ctx, job=job, min_step=2, max_s=30)
    driver.signal(job["pid"], "STOP")  # process.hang
    result = PROCEDURES["gpu.watch_job"](driver, ctx, job=job, stall_timeout_s=0.5, max_s=30)
    assert result["detected"] == "stall" and result["last_step"] >= 2
    assert "no progress line for 0.5 s" in result["evidence"] and "the process is stopped" in result["evidence"]
    assert "failure_detected" in ctx.marks


def test_start_up_gets_first_step_after_before_a_missing_step_is_a_stall(driver, gpu_host, ctx):
    slow = ["testbed-train", "--steps", "10", "--init-delay", "60"]
    job = PROCEDURES["gpu.start_job"](driver, ctx, command=slow, name="slow", gpus=[0])
    patient = PROCEDURES["gpu.watch_job"](driver, ctx, job=job, stall_timeout_s=0.1, first_step_after=30, max_s=0.5)
    assert (patient["detected"], patient["last_step"]) == (None, None) and "failure_detected" not in ctx.marks
    strict = PROCEDURES["gpu.watch_job"](driver, ctx, job=job, stall_timeout_s=0.3, max_s=30)
    assert strict["detected"] == "stall" and "since the watch began; the process is running" in strict["evidence"]


def test_wait_step_after_a_restart_sees_the_step_continue_from_the_checkpoint(driver, gpu_host, ctx):
    cmd = [*TRAIN, "--checkpoint-every", "5", "--checkpoint-dir", "ckpt"]
    job = PROCEDURES["gpu.start_job"](driver, ctx, command=cmd, name="ft", gpus=[0])
    assert PROCEDURES["gpu.wait_step"](driver, ctx, job=job, min_step=12, max_s=30)["step"] == 12
    t, box = in_thread(PROCEDURES["gpu.watch_job"], driver, ctx, job=job, stall_timeout_s=30)
    PROCEDURES["gpu.kill_job"](driver, ctx, job=job)
    assert joined(t, box)["detected"] == "process_exit"
    saved = driver.exec(f"ls {job['workdir']}/ckpt").stdout.split()
    checkpoint = max(int(re.search(r"step(\d+)", name).group(1)) for name in saved)
    assert checkpoint >= 10
    job = PROCEDURES["gpu.start_job"](driver, ctx, command=cmd, name="ft", gpus=[1])  # the spare
    first = PROCEDURES["gpu.wait_step"](driver, ctx, job=job, min_step=1, max_s=30)
    assert first["step"] == checkpoint + 1 and first["line"].startswith(f"step {checkpoint + 1} loss ")
    assert f"resumed from step {checkpoint}" in driver.tail(job["log"], 50)
    marks = ctx.marks
    assert marks["fault_injected"][0] <= marks["failure_detected"][0] <= marks["first_step"][0]
    driver.stop_job(JobHandle(**job))


def test_wait_step_fails_loudly_when_the_job_exits_first(driver, gpu_host, ctx):
    job = PROCEDURES["gpu.start_job"](driver, ctx, command=["testbed-train", "--steps", "3"], name="short", gpus=[0])
    with pytest.raises(DeviceCommandError) as err:
        PROCEDURES["gpu.wait_step"](driver, ctx, job=job, min_step=10, max_s=30)
    assert "exited before step 10" in str(err.value) and "done rank 0 steps 3" in str(err.value)
    assert "first_step" not in ctx.marks


def test_an_xid_on_a_running_rank_is_detected_by_the_periodic_health_probe(driver, gpu_host, ctx):
    job = PROCEDURES["gpu.start_job"](driver, ctx, command=TRAIN, name="x", gpus=[0])
    PROCEDURES["gpu.wait_step"](driver, ctx, job=job, min_step=2, max_s=30)
    t, box = in_thread(
        PROCEDURES["gpu.watch_job"], driver, ctx, job=job, stall_timeout_s=30, health_every_s=0.2, max_s=30
    )
    deadline = time.monotonic() + 30
    while "watching" not in ctx.marks and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the procedure's own milestone
    gpu_host.raise_xid(0, xid=63)  # row remapping: the GPU and its rank carry on
    result = joined(t, box)
    assert result["detected"] == "xid"
    assert "still running" in result["evidence"] and ": 63," in result["evidence"]
    assert driver.job_status(JobHandle(**job), progress=None).state == "running"


class _AcceptAll(paramiko.ServerInterface):
    def get_allowed_auths(self, username):
        return "none"

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        return True


@pytest.fixture
def channel_pair():
    """A real SSH session over a socket pair: (the client's channel, the server's)."""
    a, b = socket.socketpair()
    server, client = paramiko.Transport(a), paramiko.Transport(b)
    server.add_server_key(new_ed25519()[0])
    server.start_server(event=threading.Event(), server=_AcceptAll())
    client.connect()
    client.auth_none("lab")
    ours = client.open_session()
    ours.exec_command("tail -F train.log")
    theirs = server.accept(5)
    yield ours, theirs
    client.close()
    server.close()


def test_a_line_is_timed_when_it_arrived_not_when_it_was_read(channel_pair):
    """A step line ends a measured failover: its time must be when its packet reached us, even if the
    reading thread wakes late (on a busy machine, a millisecond or more). Each packet keeps its own time.
    """
    ours, theirs = channel_pair
    arrivals = Arrivals(ours)
    theirs.sendall(b"step 41\n")
    assert select.select([ours], [], [], 5)[0], "the first line never arrived"
    between = time.monotonic_ns()
    theirs.sendall(b"step 42\n")
    deadline = time.monotonic() + 5
    while len(ours.in_buffer) < 16 and time.monotonic() < deadline:
        select.select([], [], [], 0.001)  # the second packet is on its way: poll the buffer for it
    after = time.monotonic_ns()
    data = ours.recv(100)
    assert data == b"step 41\nstep 42\n"
    chunk = StreamChunk("out", data, time.monotonic_ns(), arrived=arrivals.take(len(data)))
    (end1, first), (end2, second) = chunk.arrived
    assert (end1, end2) == (8, 16)
    assert first <= between <= second <= after < chunk.mono_ns
    assert [chunk.arrival_ns(i) for i in (0, 7, 8, 15)] == [first, first, second, second]
    assert chunk.arrival_ns(16) == chunk.mono_ns  # past the data: when it was read


@pytest.mark.skipif(SO_TIMESTAMPNS is None, reason="kernel receive stamps are read on Linux x86_64 / aarch64")
def test_the_kernel_stamps_when_a_segment_arrived_whoever_reads_it_later():
    """On Linux the SSH socket hands over the kernel's receive stamp of each segment, on CLOCK_MONOTONIC:
    a step line is timed when it reached the machine, before any thread was scheduled to read it.
    """
    with socket.create_server(("127.0.0.1", 0)) as server:
        ours = rx_stamped(socket.create_connection(server.getsockname(), timeout=5))
        theirs, _ = server.accept()
        with ours, theirs:
            assert ours.start_stamping()
            stamps = []
            for step in range(5000):  # the kernel leaves the first segments unstamped while it turns stamping on
                if len(stamps) == 3:
                    break
                sent = time.monotonic_ns()
                theirs.sendall(b"step %d\n" % step)
                assert select.select([ours], [], [], 5)[0], "the line never arrived"
                seen = time.monotonic_ns()
                assert ours.recv(100) == b"step %d\n" % step
                if ours.last_rx_ns is not None:
                    assert sent <= ours.last_rx_ns <= seen
                    stamps.append(ours.last_rx_ns)
            assert len(stamps) >= 3 and stamps == sorted(stamps)
