"""The emulated GPU host as a user's OpenSSH client and paramiko see it."""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import paramiko
import pytest
from privileges import may_use_realtime

from emulators.control import TriggerMissed, TwinControlError
from emulators.gpuhost.keys import new_ed25519
from emulators.gpuhost.spec import GpuHostSpec
from emulators.spec import OcsSpec, TwinSpec
from emulators.twin import GIL_SWITCH_S, TwinProcess, TwinServer
from testbed.events import read_jsonl

START_SLEEP = (
    "mkdir -p j && CUDA_VISIBLE_DEVICES=1 TESTBED_JOB=j setsid env -C j sleep 60 > j/j.log 2>&1 < /dev/null & echo $!"
)


def test_openssh_client_runs_nvidia_smi_with_strict_host_key_checking(gpu_host, openssh):
    ep = gpu_host.endpoints()
    r = openssh(ep, "nvidia-smi --query-gpu=index,name,memory.used,utilization.gpu --format=csv")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "index, name, memory.used [MiB], utilization.gpu [%]"
    assert lines[1:] == [f"{i}, NVIDIA H100 80GB HBM3, 0 MiB, 0 %" for i in range(4)]
    r = openssh(ep, "nvidia-smi --query-gpu=index,memory.total --format=csv,noheader,nounits")
    assert r.stdout.splitlines() == [f"{i}, 81559" for i in range(4)]
    assert openssh(ep, "hostname && echo ok").stdout == "gpu01\nok\n"


def test_openssh_client_refuses_a_host_missing_from_known_hosts(gpu_host, openssh, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    r = openssh(gpu_host.endpoints(), "true", known_hosts=str(empty))
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr


def test_only_the_twins_client_key_may_log_in(gpu_host):
    ep = gpu_host.endpoints()
    _, port = ep["ssh"].rsplit(":", 1)
    stranger = new_ed25519()[0]
    client = paramiko.SSHClient()
    client.load_host_keys(ep["known_hosts"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.AuthenticationException):
        client.connect("127.0.0.1", int(port), ep["user"], pkey=stranger, look_for_keys=False, allow_agent=False)
    client.close()
    with pytest.raises(paramiko.AuthenticationException):
        client.connect("127.0.0.1", int(port), ep["user"], password="x", look_for_keys=False, allow_agent=False)
    client.close()


def test_the_shell_runs_nothing_outside_its_command_set_and_home(gpu_host):
    sh = gpu_host.shell
    assert sh.run("rm -rf /") == ("", "bash: rm: command not found\n", 127)
    assert sh.run("python3 -c 1")[2] == 127
    assert sh.run("/bin/sleep 1")[2] == 127
    assert sh.run("cat /etc/passwd") == ("", "cat: /etc/passwd: Permission denied\n", 1)
    assert sh.run("cat ../../id_ed25519") == ("", "cat: ../../id_ed25519: Permission denied\n", 1)
    assert sh.run("tail -n 1 ~/../known_hosts")[2] == 1
    assert sh.run("echo hi > /tmp/x")[2] == 1
    assert sh.run("echo hello > note.txt && cat note.txt") == ("hello\n", "", 0)
    assert sh.run("kill -9 1")[1] == "bash: kill: (1) - Operation not permitted\n"
    assert sh.run("false || echo fallback; exit 3; echo never") == ("fallback\n", "", 3)


def test_jobs_are_real_processes_with_their_gpu_and_only_they_can_be_signalled(gpu_host):
    sh = gpu_host.shell
    out, err, rc = sh.run(START_SLEEP)
    assert rc == 0, err
    pid = int(out)
    os.kill(pid, 0)  # a real process
    assert os.getpgid(pid) == pid
    # Stopped first: a signal is taken on the way back to user space, so a stopped job has finished its exec. Until
    # then its environment and arguments may still read empty (Popen returns once the exec is past the point of no
    # return, before the new program's environment is set up).
    assert sh.run(f"kill -STOP {pid}")[2] == 0
    os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOWAIT)  # the signal is delivered asynchronously
    assert sh.run(f"ps -o stat= -p {pid}")[0].strip() == "Ts"
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if e)
    assert env.get(b"CUDA_VISIBLE_DEVICES") == b"1" and env.get(b"TESTBED_JOB") == b"j", env
    assert os.readlink(f"/proc/{pid}/cwd") == str(gpu_host.engine.home / "j")
    assert sh.run(f"ps -o pid=,args= -p {pid}")[0].split() == [str(pid), "sleep", "60"]
    apps = sh.run("nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_bus_id --format=csv,noheader")
    assert apps[0] == f"{pid}, sleep, 30000 MiB, 00000000:2A:00.0\n"
    assert sh.run("pgrep -f 'sleep 60'")[0] == f"{pid}\n"
    assert sh.run(f"kill -CONT {pid}")[2] == 0
    assert sh.run(f"kill -TERM -- -{pid}") == ("", "", 0)
    gpu_host.engine.jobs[pid].proc.wait(10)
    assert sh.run(f"ps -o stat= -p {pid}") == ("", "", 1)
    assert sh.run(f"kill {pid}")[1] == f"bash: kill: ({pid}) - No such process\n"


def test_fail_gpu_kills_its_processes_and_nvidia_smi_and_dmesg_report_it(gpu_host):
    sh = gpu_host.shell
    pid = int(sh.run(START_SLEEP)[0])
    result = gpu_host.fail_gpu(1)
    assert result["killed"] == [pid]
    assert gpu_host.engine.jobs[pid].proc.wait(10) == -signal.SIGKILL
    out, _, rc = sh.run("nvidia-smi --query-gpu=index,uuid --format=csv,noheader")
    lines = out.splitlines()
    assert rc == 15
    assert lines[1] == "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error"
    assert [line.split(", ")[0] for line in lines if not line.startswith("Unable")] == ["0", "2", "3"]
    kernel = sh.run("dmesg")[0]
    assert f"NVRM: Xid (PCI:0000:2A:00): 79, pid={pid}, GPU has fallen off the bus." in kernel
    assert "NVRM: Xid (PCI:0000:2A:00): 79" in sh.run("journalctl -k --no-pager")[0]
    # A job launched on the lost GPU dies at once, as CUDA initialisation would fail.
    pid2 = int(sh.run(START_SLEEP)[0])
    assert gpu_host.engine.jobs[pid2].proc.wait(10) == -signal.SIGKILL
    gpu_host.recover_gpu(1)
    assert sh.run("nvidia-smi -L")[2] == 0


def test_driver_gone_gives_the_real_message_and_exit_code(gpu_host):
    gpu_host.unload_driver()
    out, _, rc = gpu_host.shell.run("nvidia-smi --query-gpu=index --format=csv")
    assert rc == 9 and out.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
    gpu_host.load_driver()
    assert gpu_host.shell.run("nvidia-smi --query-gpu=index --format=csv")[2] == 0
    assert gpu_host.shell.run("nvidia-smi --query-gpu=bogus --format=csv")[:1] == (
        'Field "bogus" is not a valid field to query.\n\n',
    )


def test_power_off_refuses_ssh_and_kills_jobs_power_on_serves_the_same_port(gpu_host, openssh):
    ep = gpu_host.endpoints()
    pid = int(gpu_host.shell.run(START_SLEEP)[0])
    assert gpu_host.power_off()["killed"] == [pid]
    _, port = ep["ssh"].rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
    assert openssh(ep, "true").returncode == 255
    gpu_host.power_on()
    assert gpu_host.endpoints()["ssh"] == ep["ssh"]
    assert openssh(ep, "hostname").stdout == "gpu01\n"


def test_straggle_stops_and_continues_the_job(gpu_host):
    pid = int(gpu_host.shell.run(START_SLEEP)[0])
    assert gpu_host.straggle(job="j", duty=0.5, period_ms=50)["pids"] == [pid]
    assert gpu_host.state()["jobs"][0]["straggling"] is True
    assert gpu_host.stop_straggle(job="j")["pids"] == [pid]
    assert gpu_host.shell.run(f"ps -o stat= -p {pid}")[0].strip() in ("Ss", "Rs")
    with pytest.raises(ValueError, match="no live job"):
        gpu_host.straggle(pid=1)


def test_spec_round_trips_through_the_twin_spec_json():
    spec = TwinSpec([GpuHostSpec("h1", gpus=2, jobs=("sleep",))])
    back = TwinSpec.from_json(spec.to_json())
    assert back.devices == spec.devices
    assert json.loads(spec.to_json())["devices"][0]["kind"] == "gpu_host"


def test_the_twin_process_serves_gpu_hosts_and_their_control_ops(openssh):
    spec = TwinSpec([GpuHostSpec("h1", gpus=2), GpuHostSpec("h2", gpus=2)])
    with TwinProcess(spec) as twin:
        ep = twin.endpoints.devices
        assert sorted(ep) == ["h1", "h2"] and ep["h1"]["kind"] == "gpu_host"
        assert ep["h1"]["known_hosts"] == ep["h2"]["known_hosts"]
        assert oct(os.stat(ep["h1"]["key_file"]).st_mode & 0o777) == "0o600"
        assert openssh(ep["h2"], "hostname").stdout == "h2\n"
        twin.control.call("h1", "fail_gpu", index=0)
        r = openssh(ep["h1"], "nvidia-smi -L")
        assert r.returncode == 15 and r.stdout.startswith("Unable to determine the device handle")
        assert twin.control.call("h1", "state")["gpus"][0]["lost"] is True
        twin.control.call("h1", "power_off")
        assert openssh(ep["h1"], "true").returncode == 255
        twin.control.call("h1", "power_on")
        assert openssh(ep["h1"], "true").returncode == 0
    assert not os.path.exists(ep["h1"]["key_file"])  # the twin's private dir is gone with it


def test_a_timed_fault_takes_effect_at_its_moment_and_never_before(tmp_path):
    """fault_injected of an emulated failover is the moment the twin was told to apply the fault: the twin
    must not apply it earlier (the truth log's fault time is at or after it), must answer only once it has
    applied it, and must refuse a moment that has passed (nothing applied) or an op that cannot be timed.
    """
    truth = tmp_path / "truth.jsonl"
    spec = TwinSpec([GpuHostSpec("h1", gpus=2), OcsSpec("ocs1", size=4)], truth_log=str(truth))
    with TwinProcess(spec) as twin:
        ctl = twin.control
        for _ in range(3):
            at = time.monotonic_ns() + 30_000_000
            ctl.call_at(at, "h1", "fail_gpu", index=1)
            answered = time.monotonic_ns()
            fault = [t for t in read_jsonl(truth).records if t["event"] == "fault"][-1]
            assert at <= fault["t_ns"] <= answered
            # The truth says how the fault was fired: at real-time priority wherever the twin may have it.
            trigger = [t for t in read_jsonl(truth).records if t["event"] == "trigger"][-1]
            assert (trigger["host"], trigger["op"], trigger["at_ns"]) == ("h1", "fail_gpu", at)
            assert trigger["realtime"] is may_use_realtime()
            ctl.call("h1", "recover_gpu", index=1)

        with pytest.raises(TriggerMissed, match="after its moment; nothing applied"):
            ctl.call_at(time.monotonic_ns() - 1_000_000, "h1", "fail_gpu", index=0)
        assert ctl.call("h1", "state")["gpus"][0]["lost"] is False
        with pytest.raises(TwinControlError, match="cannot be timed") as refused:
            ctl.call_at(time.monotonic_ns() + 10_000_000, "ocs1", "fail_port", port=1)
        assert not isinstance(refused.value, TriggerMissed)
        assert ctl.call("ocs1", "state")["port_states"]["1"] != "F"


def test_timed_faults_at_once_leave_the_twins_switch_interval_and_collector_as_they_were(tmp_path):
    """A timed op holds the GIL through its last millisecond by raising the process's switch interval, and
    pauses the garbage collector while it waits; two at the same moment (faults on two hosts) must not leave
    the twin with the raised interval or without its collector for good.
    """
    pytests = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_S)  # as `serve` sets it in the twin's process
    twins = sys.getswitchinterval()  # as the interpreter rounds it
    server = TwinServer(TwinSpec([GpuHostSpec("h1", gpus=1), GpuHostSpec("h2", gpus=1)]))
    try:
        at = time.monotonic_ns() + 50_000_000
        with ThreadPoolExecutor(2) as pool:
            answers = list(
                pool.map(
                    lambda host: server.dispatch_at(
                        {"device": host, "op": "fail_gpu", "args": {"index": 0}, "at_ns": at}
                    ),
                    ["h1", "h2"],
                )
            )
        assert [a["ok"] for a in answers] == [True, True], answers
        assert sys.getswitchinterval() == twins
        assert gc.isenabled()
    finally:
        sys.setswitchinterval(pytests)
        for device in server.devices.values():
            device.close_sync()
