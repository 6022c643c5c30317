"""A GPU server in the inventory: its GPUs, its optical ports (NICs cabled to the fabric), its rack, and the
BMC that powers it (Redfish, drivers/redfish/bmc.py), if the lab has one for it.
"""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from testbed.config.common import Name, Strict
from testbed.config.device import DeviceConfig
from testbed.contracts.errors import UserError
from testbed.contracts.jsontypes import JsonObject

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class GpuHostEmulation(Strict):
    """How the twin emulates the host: the name its GPUs report."""

    gpu_name: str = "NVIDIA H100 80GB HBM3"


class BmcConfig(Strict):
    """The host's baseboard management controller, reached over Redfish on HTTPS: how a lab powers the host
    off and on (fault kind host.power_off). The password is read from the environment variable
    `password_env` when a run starts, never from the inventory.
    """

    address: str = Field(description="the BMC's HTTPS address: https://HOST[:PORT] (a bare HOST means https)")
    system: str | None = Field(
        default=None, description="Id of the ComputerSystem under /redfish/v1/Systems; default: the only (or first) one"
    )
    user: str = Field(min_length=1)
    password_env: str = Field(
        pattern=ENV_NAME, description="environment variable holding the BMC password; never put the password here"
    )
    ca_file: str | None = Field(
        default=None,
        description="PEM file the BMC's certificate must chain to (its CA, or the certificate itself to pin it); "
        "default: the CA bundle requests ships (certifi)",
    )
    timeout_ms: int = Field(default=10000, gt=0, le=600_000, description="per request")
    power_wait_ms: int = Field(
        default=60000, gt=0, le=3_600_000, description="how long PowerState may take to follow a reset"
    )

    @field_validator("address")
    @classmethod
    def _https(cls, value: str) -> str:
        value = value.strip()
        if "://" not in value:
            value = f"https://{value}"
        parts = urlsplit(value)
        if parts.scheme.lower() != "https":
            raise ValueError(
                f"{value!r}: a BMC is reached over https (Redfish over plain http would send its password in "
                "the clear); write https://HOST[:PORT]"
            )
        try:
            parts.port  # noqa: B018 (parsing it is the check)
        except ValueError:
            raise ValueError(f"{value!r}: the port is not a number from 1 to 65535") from None
        if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
            raise ValueError(f"{value!r} is not https://HOST[:PORT] (no path, no user, no query)")
        return f"https://{parts.netloc}"

    def password(self, host: str) -> str:
        """The password, from the environment; a UserError that names the host and the variable if unset."""
        value = os.environ.get(self.password_env)
        if not value:
            raise UserError(
                f"{host}: the password of its BMC ({self.user}@{self.address}) is read from the environment "
                f"variable {self.password_env}, which is not set; export {self.password_env}=... in the shell "
                "that runs testbed (or change bmc.password_env in the inventory)"
            )
        return value

    def problems(self, host: str) -> list[str]:
        """What stops a run from using this BMC now: the password variable unset, the CA file missing."""
        out = []
        try:
            self.password(host)
        except UserError as exc:
            out.append(str(exc))
        if self.ca_file is not None and not os.path.isfile(os.path.expanduser(self.ca_file)):
            out.append(f"{host}: bmc.ca_file {self.ca_file} does not exist on this machine")
        return out

    def call_args(self, host: str) -> JsonObject:
        """The BMC's settings as a procedure's kwargs (drivers.redfish.RedfishSettings.from_dict): plain data,
        the password under a key the recorder masks (testbed/results/redact.py) wherever kwargs are written down.
        """
        return {
            "address": self.address,
            "user": self.user,
            "password": self.password(host),
            "password_env": self.password_env,
            "system": self.system,
            "ca_file": os.path.expanduser(self.ca_file) if self.ca_file else None,
            "timeout_s": self.timeout_ms / 1000,
            "power_wait_s": self.power_wait_ms / 1000,
        }


class GpuHostDevice(DeviceConfig):
    """A GPU server reached over SSH (kind gpu_host): its GPUs, its optical ports, its rack, its BMC."""

    kind: Literal["gpu_host"]
    gpus: int = Field(default=8, ge=0, le=64)
    ports: list[Name] = Field(default_factory=lambda: ["p0"], description="optical ports (NICs) of the host")
    rack: str | None = None
    emulation: GpuHostEmulation = GpuHostEmulation()
    bmc: BmcConfig | None = Field(default=None, description="the host's BMC (Redfish): how a lab powers it off and on")
