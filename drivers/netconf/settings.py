"""How to reach a switch's NETCONF server: SSH (port 830), a user, a key or a password (from the
environment, never a file), and the known_hosts file its host key is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NetconfSettings:
    host: str
    port: int = 830
    user: str = "admin"
    key_file: str | None = None
    password: str | None = field(default=None, repr=False)  # never printed, never recorded
    password_env: str | None = None
    known_hosts: str | None = None  # default ~/.ssh/known_hosts
    timeout_s: float = 10.0

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"
