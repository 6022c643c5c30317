"""An emulated GPU host served in this process (its SSH server runs in threads), reset between tests."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from drivers.transports.ssh import SshSettings
from emulators.gpuhost.device import GpuHostAdapter
from emulators.gpuhost.spec import GpuHostSpec


@pytest.fixture(scope="module")
def host():
    adapter = GpuHostAdapter(GpuHostSpec("gpu01", gpus=4, seed=7))
    adapter.start_sync()
    yield adapter
    adapter.close_sync()


@pytest.fixture
def gpu_host(host):
    host.reset()
    yield host
    host.reset()


@pytest.fixture
def settings(gpu_host) -> SshSettings:
    ep = gpu_host.endpoints()
    addr, port = ep["ssh"].rsplit(":", 1)
    return SshSettings(addr, ep["user"], int(port), ep["key_file"], ep["known_hosts"], timeout_s=10.0)


@pytest.fixture(scope="session")
def openssh():
    """run(endpoints, command, known_hosts=None): `command` through the OpenSSH client, host keys strict."""
    if shutil.which("ssh") is None:
        pytest.skip("the OpenSSH client (ssh) is not installed")
    return _openssh


def _openssh(endpoints: dict, command: str, known_hosts: str | None = None) -> subprocess.CompletedProcess:
    _, port = endpoints["ssh"].rsplit(":", 1)
    return subprocess.run(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-p",
            port,
            "-i",
            endpoints["key_file"],
            "-o",
            f"UserKnownHostsFile={known_hosts or endpoints['known_hosts']}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            f"{endpoints['user']}@127.0.0.1",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
