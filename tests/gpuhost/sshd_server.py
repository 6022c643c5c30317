"""A real OpenSSH sshd on 127.0.0.1, run by this user from a folder of its own with fresh keys: what
tests/gpuhost/test_real_sshd.py's fixtures and bench/detect_zombie.py (and through it bench/gpu_host.py) connect
the GPU-host driver to. The bench imports it from this folder (its path from bench/benchlib.py's REPO).
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from drivers.transports.ssh import SshSettings
from emulators.gpuhost.keys import new_ed25519, write_private

SSHD = "/usr/sbin/sshd"
START_S = 15  # bound on sshd's start (a loaded machine), not a timing claim


class SshdUnavailable(RuntimeError):
    """sshd is not installed, rejects the configuration, or did not start: the message says which, with its words."""


def _config(folder: Path, port: int, path_first: Path | None, extra: str) -> Path:
    config = folder / "sshd_config"
    lines = [
        "ListenAddress 127.0.0.1",
        f"Port {port}",
        f"HostKey {folder / 'host_ed25519'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}",
        f"PidFile {folder / 'sshd.pid'}",
        "StrictModes no",
        "UsePAM no",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        "MaxSessions 32",
    ]
    if path_first is not None:
        lines.append(f"SetEnv PATH={path_first}:/usr/local/bin:/usr/bin:/bin")
    config.write_text("\n".join([*lines, extra]) + "\n")
    return config


def _checked_config(folder: Path, port: int, path_first: Path | None) -> Path:
    # Newer OpenSSH penalises clients that hang up before authenticating (as the host-key tests do); an older
    # one does not know the option.
    config = _config(folder, port, path_first, "PerSourcePenalties no")
    check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0 and "PerSourcePenalties" in check.stderr:
        config = _config(folder, port, path_first, "")
        check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        raise SshdUnavailable(f"sshd rejects the configuration: {check.stderr.strip()}")
    return config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_sshd(folder: Path, wrapper: str | None = None, path_first: Path | None = None) -> Iterator[SshSettings]:
    """sshd on 127.0.0.1 serving from `folder` (under `wrapper`, a Python program given sshd's command line, if
    any; with `path_first` first on its sessions' PATH, if given) until the block ends; yields the settings a
    driver connects with (this user, the client key and known_hosts in `folder`).
    """
    if not os.path.exists(SSHD):
        raise SshdUnavailable(f"{SSHD} is not installed (Debian: apt-get install openssh-server)")
    host_key, host_private, _ = new_ed25519()
    _, client_private, client_public = new_ed25519()
    write_private(folder / "host_ed25519", host_private)
    write_private(folder / "id_ed25519", client_private)
    write_private(folder / "authorized_keys", client_public + "\n")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # what the sshd service's RuntimeDirectory does
    port = _free_port()
    config = _checked_config(folder, port, path_first)
    command = [SSHD, "-D", "-e", "-f", str(config)]
    if wrapper is not None:
        command = [sys.executable, "-c", wrapper, *command]
    log = open(folder / "sshd.log", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        while True:  # until sshd listens: polling the port is the condition itself
            if proc.poll() is not None:
                log.seek(0)
                said = log.read().strip()[-1500:]
                raise SshdUnavailable(f"sshd did not start (exit status {proc.returncode}): {said}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    log.seek(0)
                    said = log.read()[-1500:]
                    raise SshdUnavailable(
                        f"sshd did not accept connections on port {port} within {START_S} s: {said}"
                    ) from None
                time.sleep(0.02)
        known_hosts = folder / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
        user = pwd.getpwuid(os.geteuid()).pw_name
        yield SshSettings("127.0.0.1", user, port, str(folder / "id_ed25519"), str(known_hosts), timeout_s=10.0)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
