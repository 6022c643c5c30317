"""How to reach a switch's TL1 agent: TCP, a user and a password (from the environment, never a file)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tl1Settings:
    host: str
    port: int = 3082
    user: str = "admin"
    password: str | None = field(default=None, repr=False)  # never printed, never recorded
    password_env: str | None = None  # where it came from, for the error that says what to set
    timeout_s: float = 5.0

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"
