"""What the GPU-host driver raises when its readers cannot read a host's answer (drivers/gpuhost/shell.py,
`rejected`), over a real SSH connection to a scripted host (tests/gpuhost/ssh_scripted.py): the error names
the host, the exact command and what came back, and chains what could not be parsed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from ssh_scripted import ScriptedSsh

from drivers.capabilities import JobHandle
from drivers.errors import DeviceCommandError, DeviceProtocolError
from drivers.gpuhost import GpuHostSsh
from drivers.transports.ssh import SshTransport

ROW = "0, NVIDIA H100 80GB HBM3, GPU-1234, 00000000:18:00.0, lots, 0, 0, 29, 71.50"
GPUS = (
    "nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,"
    "power.draw --format=csv,noheader,nounits"
)
STATUS = "--testbed-nvidia-smi-status--"


@dataclass
class Scripted:
    """A scripted host's driver, and its answers (command -> stdout, stderr, status; others get nothing)."""

    driver: GpuHostSsh
    answers: dict[str, tuple[str, str, int]]


@pytest.fixture
def host(tmp_path) -> Iterator[Scripted]:
    answers: dict[str, tuple[str, str, int]] = {}
    server = ScriptedSsh(lambda command: answers.get(command, ("", "", 0)), tmp_path)
    scripted = Scripted(GpuHostSsh(SshTransport(server.settings(5.0), "gpu07"), "gpu07"), answers)
    yield scripted
    scripted.driver.close()
    server.stop()


def test_an_unreadable_row_names_the_host_the_command_and_the_output_and_chains_the_parse_error(host):
    host.answers[GPUS] = (ROW + "\n", "", 0)
    with pytest.raises(DeviceProtocolError) as err:
        host.driver.gpus()
    e = err.value
    assert (e.device, e.address) == ("gpu07", host.driver.address)
    assert (e.sent, e.received) == (GPUS, ROW + "\n")
    assert e.message.startswith(f"cannot parse nvidia-smi's CSV row {ROW!r}")
    assert isinstance(e.__cause__, ValueError)


def test_a_failing_nvidia_smi_is_reported_with_its_stdout_and_stderr_and_no_cause(host):
    host.answers[GPUS] = ("", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n", 9)
    with pytest.raises(DeviceCommandError) as err:
        host.driver.gpus()
    e = err.value
    assert e.sent == GPUS and e.received.startswith("NVIDIA-SMI has failed")
    assert e.__cause__ is None


def test_health_reports_a_driver_it_cannot_reach_instead_of_raising(host):
    host.answers[f"{GPUS} ; echo {STATUS} $? ; dmesg"] = (
        f"{STATUS} 9\n[ 1.0] NVRM: Xid (PCI:1): 79, x\n",
        "NVIDIA-SMI has failed\n",
        0,
    )
    health = host.driver.health()
    assert health["ok"] is False and health["gpus"] == [] and health["xid_codes"] == [79]
    assert health["error"].startswith("nvidia-smi cannot reach the NVIDIA driver (exit status 9)")


def test_an_unreadable_job_state_keeps_the_ends_of_what_came_back(host):
    job = JobHandle("gpu07", "train", 4242, "train.log", "")
    command = "ps -o stat= -p 4242 ; echo --testbed-tail-- ; tail -n 50 train.log"
    host.answers[command] = ("x" * 3000, "e" * 700, 0)
    with pytest.raises(DeviceProtocolError) as err:
        host.driver.job_status(job)
    assert err.value.sent == command and err.value.received == "x" * 2000 + "e" * 500
