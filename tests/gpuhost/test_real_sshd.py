"""The SSH GpuHost driver against a real OpenSSH server (/usr/sbin/sshd) on 127.0.0.1, run by this user.

The server gets temporary keys, a known_hosts entry written by the test (never learned from the server),
and a stand-in `nvidia-smi` and `dmesg` first on the PATH of its sessions (SetEnv). It runs under a tiny
subreaper, like an init, so that a job that dies is reaped; test_zombie_real_sshd.py runs one under a subreaper
that never reaps (a container whose PID 1 does not). Skips, saying why, only when sshd is missing or does
not start. As root, sshd needs /run/sshd (its privilege-separation directory): the test creates it as the
Debian service would.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import time

import pytest
from peers import unavailable
from sshd_server import SshdUnavailable, running_sshd

from drivers.capabilities import GpuHost, GpuInfo, Identity
from drivers.errors import DeviceCommandError, DeviceConnectionError
from emulators.gpuhost.keys import new_ed25519
from testbed.families import PROCEDURES
from testbed.families.context import ProcedureContext
from testbed.families.drivers import make_driver

STEPPER = 'i=0; while :; do i=$((i+1)); echo "step $i loss 0.5"; sleep 0.02; done'

NVIDIA_SMI = r'''#!PYTHON
"""Stand-in nvidia-smi: --query-gpu / --query-compute-apps with --format=csv[,noheader][,nounits]."""
import sys

GPUS = [
    {"index": "0", "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-11111111-2222-3333-4444-555555555555",
     "pci.bus_id": "00000000:07:00.0", "memory.total": "81920 MiB", "memory.used": "3 MiB",
     "utilization.gpu": "0 %", "temperature.gpu": "31", "power.draw": "61.23 W", "driver_version": "535.104.05"},
    {"index": "1", "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-66666666-7777-8888-9999-000000000000",
     "pci.bus_id": "00000000:0F:00.0", "memory.total": "81920 MiB", "memory.used": "3 MiB",
     "utilization.gpu": "[N/A]", "temperature.gpu": "30", "power.draw": "[N/A]", "driver_version": "535.104.05"},
]
UNITS = {"memory.total": "MiB", "memory.used": "MiB", "utilization.gpu": "%", "power.draw": "W"}
args = sys.argv[1:]
opt = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if "=" in a}
fmt = opt.get("--format", "csv").split(",")
if "--query-compute-apps" in opt:
    sys.exit(0)  # no compute processes: nothing, not even a header under noheader
fields = opt.get("--query-gpu", "").split(",")
unknown = [f for f in fields if f not in GPUS[0]]
if unknown or fmt[0] != "csv":
    print(f'Field "{unknown[0] if unknown else fmt[0]}" is not a valid field to query.')
    sys.exit(2)
if "noheader" not in fmt:
    print(", ".join(f + (f" [{UNITS[f]}]" if f in UNITS else "") for f in fields))
for g in GPUS:
    cells = [g[f].split(" ")[0] if "nounits" in fmt and f in UNITS and not g[f].startswith("[") else g[f]
             for f in fields]
    print(", ".join(cells))
'''
DMESG = """#!/bin/sh
echo '[    0.000000] Linux version 6.1.0-18-amd64'
echo '[ 5107.644336] NVRM: Xid (PCI:0000:0f:00): 79, pid=1234, GPU has fallen off the bus.'
"""

REAPER = r"""
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to us
child = os.fork()
if child == 0:
    os.execv(sys.argv[1], sys.argv[1:])
signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGTERM))
code = 1
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    if pid == child:
        code = os.waitstatus_to_exitcode(status)
        break
sys.exit(code)
"""

# A subreaper that never reaps, as a container's PID 1 that is no init: a job that dies stays a zombie.
HOARDER = r"""
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to us
child = os.fork()
if child == 0:
    os.execv(sys.argv[1], sys.argv[1:])
def end(*_):
    os.kill(child, signal.SIGTERM)
    os._exit(0)
signal.signal(signal.SIGTERM, end)
while True:
    signal.pause()
"""


@pytest.fixture(scope="module")
def real_sshd(tmp_path_factory):
    yield from serve_sshd(tmp_path_factory, REAPER)


@pytest.fixture(scope="module")
def hoarding_sshd(tmp_path_factory):
    """sshd under a subreaper that never reaps: (its settings, its folder)."""
    yield from serve_sshd(tmp_path_factory, HOARDER)


def serve_sshd(tmp_path_factory, wrapper: str):
    """Run sshd under `wrapper` (a Python program given sshd's command line) until the generator is closed, with
    the stand-in nvidia-smi and dmesg first on its sessions' PATH.
    """
    d = tmp_path_factory.mktemp("sshd")
    os.chmod(d, 0o700)
    (d / "bin").mkdir()
    for name, text in (("nvidia-smi", NVIDIA_SMI.replace("PYTHON", sys.executable)), ("dmesg", DMESG)):
        (d / "bin" / name).write_text(text)
        os.chmod(d / "bin" / name, 0o755)
    try:
        with running_sshd(d, wrapper, path_first=d / "bin") as settings:
            yield settings, d
    except SshdUnavailable as missing:
        unavailable(str(missing))


@pytest.fixture
def real(real_sshd):
    yield from connected(real_sshd)


def connected(sshd):
    """A driver connected to the sshd; the jobs a test records in its `started` are killed after it."""
    settings, d = sshd
    drv = make_driver("ssh", "real", settings)
    drv.jobdir = d / "jobs"
    drv.started = []
    yield drv
    for pid in drv.started:  # a job a failing test left behind
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    drv.close()


def start(drv, name: str, script: str = STEPPER):
    job = drv.run_job(["sh", "-c", script], name=name, workdir=str(drv.jobdir / name))
    drv.started.append(job.pid)
    return job


def test_identify_gpus_and_health_through_real_sshd(real):
    assert isinstance(real, GpuHost)
    assert real.identify() == Identity("NVIDIA", "2x NVIDIA A100-SXM4-80GB", socket.gethostname(), "535.104.05")
    gpus = real.gpus()
    assert gpus[0] == GpuInfo(
        0, "NVIDIA A100-SXM4-80GB", "GPU-11111111-2222-3333-4444-555555555555", "00000000:07:00.0",
        81920.0, 3.0, 0.0, 31.0, 61.23,
    )  # fmt: skip
    assert (gpus[1].index, gpus[1].utilization_pct, gpus[1].power_w) == (1, None, None)
    assert real.processes() == []
    h = real.health()
    assert (h["ok"], h["lost"], h["xid_codes"], h["error"]) == (False, [], [79], None)


def test_a_job_runs_reports_progress_and_stops_through_real_sshd(real):
    job = start(real, "stepper")
    assert job.log == f"{real.jobdir}/stepper/stepper.log"
    for ev in real.watch(job, lines=None):  # GNU tail -F --pid on the real host
        if ev.kind == "progress" and ev.step >= 3:
            break
    status = real.job_status(job)
    assert status.state == "running" and int(status.progress) >= 3
    assert status.last_line.startswith("step ")
    assert real.stop_job(job, grace_s=10) == "terminated"
    assert real.job_status(job).state == "exited"
    assert real.stop_job(job) == "not running"


def test_watch_reports_the_exit_of_a_killed_job_through_real_sshd(real):
    job = start(real, "victim")
    events, killed_at = [], None
    for ev in real.watch(job, heartbeat_s=0.05):  # -n 0: only lines written after the watch began
        events.append(ev)
        if ev.kind == "progress" and killed_at is None:
            killed_at = ev.step
            real.signal(job.pid, "KILL")
    assert events[-1].kind == "exited"
    assert killed_at is not None and [e.step for e in events if e.kind == "progress"][-1] >= killed_at
    assert real.job_status(job).state == "exited"


def test_signal_stop_and_continue_through_real_sshd(real):
    job = start(real, "pausable")
    real.signal(job.pid, "STOP")
    deadline = time.monotonic() + 20
    while real.job_status(job).state != "stopped":  # the kernel stops the group asynchronously
        assert time.monotonic() < deadline, "the job never showed as stopped"
    real.signal(job.pid, "CONT")
    while real.job_status(job).state != "running":  # the continue is delivered asynchronously too
        assert time.monotonic() < deadline, "the job never showed as running again"
    real.stop_job(job)


def test_detection_procedures_through_real_sshd(real, real_sshd):
    settings, _ = real_sshd
    ctx = ProcedureContext("real", settings.address)
    job = PROCEDURES["gpu.start_job"](real, ctx, command=["sh", "-c", STEPPER], name="ft", workdir=str(real.jobdir))
    real.started.append(job["pid"])
    assert PROCEDURES["gpu.wait_step"](real, ctx, job=job, min_step=3, max_s=30)["step"] == 3
    real.signal(job["pid"], "STOP")
    stall = PROCEDURES["gpu.watch_job"](real, ctx, job=job, stall_timeout_s=0.5, max_s=30)
    assert stall["detected"] == "stall" and "the process is stopped" in stall["evidence"]
    real.signal(job["pid"], "CONT")
    PROCEDURES["gpu.kill_job"](real, ctx, job=job)
    gone = PROCEDURES["gpu.watch_job"](real, ctx, job=job, stall_timeout_s=30, max_s=30)
    assert gone["detected"] == "process_exit"  # the stand-in dmesg's Xid is old: no new one
    assert ctx.marks["fault_injected"][0] <= ctx.marks["failure_detected"][0]


def test_a_failing_command_is_a_command_error_with_its_exit_status_through_real_sshd(real):
    with pytest.raises(DeviceCommandError) as err:
        real.exec("echo oops >&2; exit 3")
    assert "exit status 3" in str(err.value) and "oops" in str(err.value)
    with pytest.raises(DeviceCommandError) as err:
        real.tail("no/such.log")
    assert "exit status 1" in str(err.value) and "No such file or directory" in str(err.value)


def test_real_sshd_with_an_unknown_host_key_is_refused_never_learned(real_sshd, tmp_path):
    settings, _ = real_sshd
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    drv = make_driver("ssh", "real", dataclasses.replace(settings, known_hosts=str(empty)))
    with pytest.raises(DeviceConnectionError) as err:
        drv.identify()
    assert f"[127.0.0.1]:{settings.port}" in err.value.message and "refusing" in err.value.message
    assert f"ssh-keyscan -p {settings.port}" in err.value.hint and "never accepted automatically" in err.value.hint
    assert empty.read_text() == ""  # not auto-accepted: nothing was written
    with pytest.raises(DeviceConnectionError):
        drv.identify()  # and the next try is refused too


def test_real_sshd_with_a_changed_host_key_is_refused(real_sshd, tmp_path):
    settings, _ = real_sshd
    other = tmp_path / "known_hosts"
    other.write_text(f"[127.0.0.1]:{settings.port} ssh-ed25519 {new_ed25519()[0].get_base64()}\n")
    drv = make_driver("ssh", "real", dataclasses.replace(settings, known_hosts=str(other)))
    with pytest.raises(DeviceConnectionError) as err:
        drv.identify()
    assert "does not match" in err.value.message and "ssh-keygen -f" in err.value.hint
