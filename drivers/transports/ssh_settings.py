"""Where and how to reach an SSH host: plain data, with nothing of paramiko, so that the controller can build a
device's settings (testbed.config) without loading the SSH stack only a device's hub uses
(drivers/transports/ssh.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


@dataclass(frozen=True)
class SshSettings:
    host: str
    user: str
    port: int = 22
    key_file: str | None = None  # None: use the SSH agent
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    timeout_s: float = 10.0

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def known_hosts_path(self) -> str:
        return os.path.expanduser(self.known_hosts or DEFAULT_KNOWN_HOSTS)

    @property
    def host_key_name(self) -> str:
        """The name the host is looked up under in known_hosts."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"
