"""The SSH GpuHost driver against the emulated host: typed results, jobs, and typed errors with hints."""

from __future__ import annotations

import dataclasses
import os

import pytest

from drivers.capabilities import GpuHost, GpuInfo
from drivers.errors import DeviceCommandError, DeviceConnectionError, DeviceProtocolError
from drivers.gpuhost import GpuHostSsh
from drivers.transports.ssh import ExecResult
from testbed.families.drivers import make_driver


@pytest.fixture
def driver(settings):
    audit = []
    drv = make_driver("ssh", "gpu01", settings, audit.append)
    drv.audit_records = audit
    yield drv
    drv.close()


def test_identify_and_gpus_are_typed_records(driver):
    assert isinstance(driver, GpuHost)
    ident = driver.identify()
    assert (ident.vendor, ident.model, ident.serial, ident.firmware) == (
        "NVIDIA",
        "4x NVIDIA H100 80GB HBM3",
        "gpu01",
        "550.54.15",
    )
    gpus = driver.gpus()
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[1] == GpuInfo(
        1, "NVIDIA H100 80GB HBM3", gpus[1].uuid, "00000000:2A:00.0", 81559.0, 0.0, 0.0, gpus[1].temperature_c, 71.87
    )
    assert gpus[1].uuid.startswith("GPU-") and not any(g.lost for g in gpus)


def test_every_exec_is_audited_and_the_connection_is_reused(driver, gpu_host):
    # The server may not have noticed yet that an earlier test's client hung up: count the new ones.
    earlier = set(gpu_host.server._transports)
    driver.identify()
    driver.gpus()
    tx = [r.data for r in driver.audit_records if r.direction == "tx"]
    rx = [r.data for r in driver.audit_records if r.direction == "rx"]
    assert tx[0].startswith("hostname || echo ; nvidia-smi --query-gpu=driver_version,name")  # one exec for both
    assert rx[0].startswith("gpu01\n") and "--testbed-nvidia-smi-status-- 0\n" in rx[0], rx[0]
    assert len(tx) == len(rx) == 2
    assert len(gpu_host.server._transports - earlier) == 1


def test_the_connection_sends_without_nagle(driver):
    """SSH writes small messages back to back; with Nagle the second waits for the first's acknowledgement, which
    a host may delay 40 ms: every connect and many commands paid it (drivers/transports/ssh.py, _connect).
    """
    import socket

    driver.identify()
    sock = driver.transport._client.get_transport().sock
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_a_job_runs_in_the_background_reports_status_and_stops(driver, gpu_host):
    job = driver.run_job(["sleep", "60"], name="sleeper", gpus=[2])
    assert job.log == "testbed-jobs/sleeper/sleeper.log"
    assert driver.job_status(job).state == "running"
    assert [(p.pid, p.name) for p in driver.processes()] == [(job.pid, "sleep")]
    assert driver.processes()[0].gpu_uuid == driver.gpus()[2].uuid
    driver.signal(job.pid, "STOP")
    os.waitid(os.P_PID, job.pid, os.WSTOPPED | os.WNOWAIT)
    assert driver.job_status(job).state == "stopped"
    assert driver.stop_job(job, grace_s=10) == "terminated"  # a stopped job is continued so it sees TERM
    assert driver.job_status(job).state == "exited"
    assert driver.stop_job(job) == "not running"


def test_progress_is_read_from_the_log(driver, gpu_host):
    logdir = gpu_host.engine.home / "testbed-jobs" / "t"
    logdir.mkdir(parents=True)
    (logdir / "t.log").write_text("starting\nstep 1 loss 0.9\nstep 2 loss 0.5\n")
    job = driver.run_job(["sleep", "60"], name="t")  # the log is truncated by the job: write it after
    (logdir / "t.log").write_text("starting\nstep 1 loss 0.9\nstep 2 loss 0.5\n")
    status = driver.job_status(job, progress=r"step (\d+)")
    assert (status.progress, status.last_line) == ("2", "step 2 loss 0.5")
    assert driver.tail(job.log, 1) == "step 2 loss 0.5\n"
    driver.stop_job(job)


def test_a_program_off_the_allowlist_does_not_start(driver):
    with pytest.raises(DeviceCommandError) as err:
        driver.run_job(["python3", "-c", "print(1)"], name="evil")
    assert "command not found" in str(err.value)


def test_lost_gpu_is_reported_with_its_index_and_its_job_dies(driver, gpu_host):
    driver.gpus()  # the driver learns bus id -> index while the GPU is healthy
    job = driver.run_job(["sleep", "60"], name="victim", gpus=[3])
    gpu_host.fail_gpu(3)
    gpu_host.engine.jobs[job.pid].proc.wait(10)
    gpus = driver.gpus()
    assert [(g.index, g.lost) for g in gpus] == [(0, False), (1, False), (2, False), (3, True)]
    assert gpus[3].bus_id == "0000:5D:00.0"
    assert driver.job_status(job).state == "exited"
    assert any(": 79, " in line for line in driver.kernel_xids())


def test_driver_gone_is_a_command_error_with_a_hint(driver, gpu_host):
    gpu_host.unload_driver()
    with pytest.raises(DeviceCommandError) as err:
        driver.gpus()
    assert "exit status 9" in str(err.value) and "driver is not loaded" in err.value.hint


def test_failed_command_carries_exit_status_and_stderr(driver):
    with pytest.raises(DeviceCommandError) as err:
        driver.tail("no/such.log")
    assert "exit status 1" in str(err.value) and "No such file or directory" in str(err.value)


def test_unparsable_nvidia_smi_is_a_protocol_error():
    class Fake:
        address = "lab@fake:22"

        def exec(self, command, **kw):
            return ExecResult(command, "0, NVIDIA H100, oops\n", "", 0)

        def close(self):
            pass

    with pytest.raises(DeviceProtocolError) as err:
        GpuHostSsh(Fake(), "fake").gpus()
    assert "cannot parse nvidia-smi's CSV row" in str(err.value)


def test_unknown_host_key_is_refused_with_the_keyscan_hint(settings, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    drv = make_driver("ssh", "gpu01", dataclasses.replace(settings, known_hosts=str(empty)))
    with pytest.raises(DeviceConnectionError) as err:
        drv.identify()
    e = err.value
    assert f"[127.0.0.1]:{settings.port}" in e.message and str(empty) in e.message
    assert f"ssh-keyscan -p {settings.port}" in e.hint and str(empty) in e.hint


def test_changed_host_key_is_refused(settings, tmp_path):
    line = open(settings.known_hosts).read().splitlines()[0]
    other = tmp_path / "known_hosts"
    from emulators.gpuhost.keys import new_ed25519

    other.write_text(f"[127.0.0.1]:{settings.port} ssh-ed25519 {new_ed25519()[0].get_base64()}\n")
    assert line.startswith("[127.0.0.1]:")
    drv = make_driver("ssh", "gpu01", dataclasses.replace(settings, known_hosts=str(other)))
    with pytest.raises(DeviceConnectionError) as err:
        drv.identify()
    assert "does not match" in err.value.message and "ssh-keygen -f" in err.value.hint


def test_a_known_hosts_file_is_read_again_once_it_changes(settings, tmp_path):
    # The driver parses a known_hosts file once for all its connections (drivers/transports/ssh.py _known_hosts); a file
    # fixed after a refusal (the key added, as the hint says) is read again, and a hashed entry
    # (`ssh-keygen -H`) still matches.
    import paramiko

    from emulators.gpuhost.keys import new_ed25519

    name = f"[127.0.0.1]:{settings.port}"
    real = paramiko.HostKeys(settings.known_hosts).lookup(name)["ssh-ed25519"]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{name} ssh-ed25519 {new_ed25519()[0].get_base64()}\n")
    drv = make_driver("ssh", "gpu01", dataclasses.replace(settings, known_hosts=str(kh)))
    with pytest.raises(DeviceConnectionError) as err:
        drv.identify()
    assert "does not match" in err.value.message
    hashed = paramiko.HostKeys.hash_host(name)
    kh.write_text(f"{hashed} ssh-ed25519 {real.get_base64()}\nother.example ssh-ed25519 {real.get_base64()}\n")
    assert drv.identify().serial == "gpu01"
    drv.close()


def test_powered_off_host_is_a_connection_error_then_the_driver_reconnects(driver, gpu_host):
    driver.identify()
    gpu_host.power_off()
    with pytest.raises(DeviceConnectionError) as err:
        driver.identify()
    assert "host is off" in err.value.hint or "dropped" in err.value.message
    gpu_host.power_on()
    assert driver.identify().serial == "gpu01"


def test_wrong_key_is_an_authentication_error(settings, tmp_path):
    from emulators.gpuhost.keys import new_ed25519, write_private

    key = tmp_path / "id"
    write_private(key, new_ed25519()[1])
    drv = make_driver("ssh", "gpu01", dataclasses.replace(settings, key_file=str(key)))
    with pytest.raises(DeviceConnectionError) as err:
        drv.identify()
    assert "authentication as 'lab' failed" in err.value.message


def test_the_reference_workload_runs_inside_the_emulated_host(driver, gpu_host):
    job = driver.run_job(["testbed-train", "--steps", "5", "--checkpoint-dir", "ckpt"], name="train", gpus=[0])
    gpu_host.engine.jobs[job.pid].proc.wait(60)
    status = driver.job_status(job)
    assert (status.state, status.progress) == ("exited", "5")
    assert "cuda_visible_devices=0" in driver.tail(job.log, 20)
