"""OpenStack's sushy-emulator (PyPI sushy-tools, the BMC emulator Ironic's CI runs), unmodified, as a lab BMC:
its fake systems driver, over TLS with a certificate made at test time (a CA-issued leaf, served with its
chain), HTTP Basic from an htpasswd file (bcrypt, the only digest it reads), on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from certs import Issued, ca_issued

USER, PASSWORD = "lab-admin", "sushy-peer-password"
SYSTEM_UUID = "6a1c3e4f-2b7d-4c8e-9f10-112233445566"
READY_S = 30.0


@dataclass
class SushyEmulator:
    url: str
    tls: Issued
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command() -> list[str]:
    """The emulator's own entry point, `sushy-emulator`, from the environment the tests run in."""
    beside = Path(sys.executable).with_name("sushy-emulator")
    program = str(beside) if beside.exists() else shutil.which("sushy-emulator")
    return [program] if program else [sys.executable, "-m", "sushy_tools.emulator.main"]


def start(directory: Path, power_state: str = "On") -> SushyEmulator:
    """Start sushy-emulator and return once its service root answers over verified TLS."""
    import bcrypt  # sushy-tools' own dependency: its auth file holds bcrypt digests

    tls = ca_issued(directory, prefix="sushy-")
    htpasswd = directory / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    port = _free_port()
    config = directory / "emulator.conf"
    # The emulator's configuration is a Python file of its settings (Flask's from_pyfile).
    config.write_text(
        "\n".join(
            [
                "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'",
                f"SUSHY_EMULATOR_LISTEN_PORT = {port}",
                f"SUSHY_EMULATOR_SSL_CERT = {str(tls.chain)!r}",
                f"SUSHY_EMULATOR_SSL_KEY = {str(tls.key)!r}",
                f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}",
                "SUSHY_EMULATOR_FAKE_DRIVER = True",
                f"SUSHY_EMULATOR_STATE_DIR = {str(directory / 'state')!r}",  # not the shared default under /tmp
                "SUSHY_EMULATOR_FAKE_SYSTEMS = ["
                f"{{'uuid': {SYSTEM_UUID!r}, 'name': 'gpu01', 'power_state': {power_state!r}, 'nics': []}}]",
                "",
            ]
        )
    )
    log = directory / "emulator.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*_command(), "--config", str(config)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    emulator = SushyEmulator(f"https://127.0.0.1:{port}", tls, process, log)
    deadline = time.monotonic() + READY_S
    while True:  # polling the endpoint until it answers: the emulator says nowhere else when it is ready
        if process.poll() is not None:
            raise RuntimeError(f"sushy-emulator exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if requests.get(f"{emulator.url}/redfish/v1/", verify=str(tls.ca), timeout=2).status_code == 200:
                return emulator
        except requests.exceptions.ConnectionError:
            pass
        if time.monotonic() > deadline:
            emulator.stop()
            raise RuntimeError(f"sushy-emulator did not answer within {READY_S:g} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
