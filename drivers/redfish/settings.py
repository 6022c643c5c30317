"""How to reach one host's BMC (the inventory's `bmc` entry)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RedfishSettings:
    """How to reach one host's BMC. `password` is never shown (repr) and never recorded."""

    address: str  # https://HOST[:PORT]
    user: str
    password: str | None = field(default=None, repr=False)
    password_env: str | None = None  # the variable it came from: errors say what to set
    system: str | None = None  # the ComputerSystem's Id; None: the only (or first) member of Systems
    ca_file: str | None = None
    timeout_s: float = 10.0
    power_wait_s: float = 60.0
    poll_s: float = 0.2

    @classmethod
    def from_dict(cls, data: dict) -> RedfishSettings:
        """The settings from a mapping (the inventory's bmc entry); keys it does not know are left out."""
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})
