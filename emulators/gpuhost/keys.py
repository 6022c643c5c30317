"""The twin's SSH key material: one private temp dir per twin process.

It holds one Ed25519 host key per emulated host, one client key pair (the twin hands its path out as
`key_file`), a known_hosts file with a `[127.0.0.1]:PORT ssh-ed25519 ...` line per host, and each
host's private home directory. Directories are 0700 and files 0600 (OpenSSH refuses a readable key).
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import threading
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def new_ed25519() -> tuple[paramiko.Ed25519Key, str, str]:
    """A fresh key: (paramiko key, OpenSSH private key text, `ssh-ed25519 AAAA...` public line)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return paramiko.Ed25519Key.from_private_key(io.StringIO(private)), private, public.decode()


def write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


class KeyStore:
    """Shared by every emulated host of one twin; removed when the last host closes."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="testbed-gpuhosts-"))  # mkdtemp makes it 0700
        self.client_key, private, public = new_ed25519()
        self.key_file = self.root / "id_ed25519"
        write_private(self.key_file, private)
        write_private(self.root / "id_ed25519.pub", public + " testbed-twin\n")
        self.known_hosts = self.root / "known_hosts"
        write_private(self.known_hosts, "")
        self._lock = threading.Lock()
        self._users = 0

    def host_dir(self, name: str) -> Path:
        home = self.root / "hosts" / name
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(home.parent, 0o700)
        return home

    def add_known_host(self, port: int, host_key: paramiko.PKey, address: str = "127.0.0.1") -> None:
        line = f"[{address}]:{port} {host_key.get_name()} {host_key.get_base64()}\n"
        with self._lock:
            with open(self.known_hosts, "a") as f:
                f.write(line)

    def acquire(self) -> KeyStore:
        with self._lock:
            self._users += 1
        return self

    def release(self) -> None:
        global _STORE
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            with _STORE_LOCK:
                if _STORE is self:
                    _STORE = None
            shutil.rmtree(self.root, ignore_errors=True)


_STORE: KeyStore | None = None
_STORE_LOCK = threading.Lock()


def keystore() -> KeyStore:
    """The twin process's key store (created on first use); call release() once per acquire."""
    global _STORE
    with _STORE_LOCK:
        if _STORE is None:
            _STORE = KeyStore()
        return _STORE.acquire()
