"""How the inventory says a device is reached: one model per transport type, registered by its `type`.

Each model knows three things, so nothing else needs an if-chain over transport types:
- `address()`: the address as a user reads it (locks, errors, the plan);
- `settings()`: the drivers' settings object its driver is built with (drivers/transports, drivers/ssh);
- `at_twin(endpoint)`: the same transport pointed at the twin's loopback endpoint for the device (--emulate).

Another package adds a transport type under the `testbed.transports` entry-point group (a TransportConfig
subclass with `type: Literal["..."]`); the registry is testbed.config.device.TRANSPORTS.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field

from testbed.config.common import Strict


class TransportConfig(Strict):
    type: str

    def address(self) -> str:
        raise NotImplementedError

    def settings(self) -> Any:
        raise NotImplementedError

    def at_twin(self, endpoint: dict) -> TransportConfig:
        """This transport pointed at the twin's endpoint for the device (its roles: visa, serial, ssh, ...)."""
        raise NotImplementedError(f"the twin has no endpoint for a {self.type} transport yet")


class VisaTransport(TransportConfig):
    type: Literal["visa"]
    resource: str = Field(
        description="VISA resource, e.g. 'TCPIP0::10.0.0.5::5025::SOCKET' or 'ASRL/dev/ttyUSB0::INSTR'"
    )
    timeout_ms: int = Field(2000, gt=0, le=600_000)
    read_termination: str = Field("\n", min_length=1, description="end of every reply (a trailing \\r is dropped)")
    write_termination: str = "\n"

    def address(self) -> str:
        return self.resource

    def settings(self):
        from drivers.transports import TransportSettings

        return TransportSettings(
            "visa",
            self.resource,
            self.timeout_ms / 1000,
            write_termination=self.write_termination,
            read_termination=self.read_termination,
        )

    def at_twin(self, endpoint: dict) -> VisaTransport:
        # Keep the wiring the lab uses: a LAN instrument stays on TCP, a serial one on the pty. A chip's SCPI
        # source is on TCP only; its pty ("qontrol") speaks the Qontrol protocol.
        on_tcp = (
            self.resource.upper().startswith("TCPIP")
            or endpoint.get("kind") == "photonic_mesh"
            or "serial" not in endpoint
        )
        return self.model_copy(update={"resource": endpoint["visa"] if on_tcp else f"ASRL{endpoint['serial']}::INSTR"})


class SerialTransport(TransportConfig):
    type: Literal["serial"]
    port: str = Field(description="device path ('/dev/ttyUSB0') or pyserial URL ('socket://10.0.0.5:5025')")
    baudrate: int = Field(38400, gt=0)
    timeout_ms: int = Field(2000, gt=0, le=600_000)
    read_termination: str = Field("\n", min_length=1, description="end of every reply (a trailing \\r is dropped)")
    write_termination: str = "\n"

    def address(self) -> str:
        return self.port

    def settings(self):
        from drivers.transports import TransportSettings

        return TransportSettings(
            "serial",
            self.port,
            self.timeout_ms / 1000,
            baudrate=self.baudrate,
            write_termination=self.write_termination,
            read_termination=self.read_termination,
        )

    def at_twin(self, endpoint: dict) -> SerialTransport:
        return self.model_copy(update={"port": endpoint["serial"] if "serial" in endpoint else endpoint["qontrol"]})


class SshTransport(TransportConfig):
    type: Literal["ssh"]
    host: str
    port: int = Field(22, ge=1, le=65535)
    user: str
    key_file: str | None = Field(None, description="private key; omit to use the SSH agent")
    known_hosts: str | None = Field(None, description="known_hosts file; default ~/.ssh/known_hosts")
    timeout_ms: int = Field(10000, gt=0, le=600_000)

    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def settings(self):
        from drivers.transports.ssh_settings import SshSettings

        return SshSettings(
            host=self.host,
            port=self.port,
            user=self.user,
            # `~/.ssh/...` as users write it; expanded where the settings are made, for the lab account
            key_file=os.path.expanduser(self.key_file) if self.key_file else None,
            known_hosts=self.known_hosts,
            timeout_s=self.timeout_ms / 1000,
        )

    def at_twin(self, endpoint: dict) -> SshTransport:
        host, _, port = endpoint["ssh"].rpartition(":")
        return self.model_copy(
            update={
                "host": host,
                "port": int(port),
                "known_hosts": endpoint["known_hosts"],
                "key_file": endpoint["key_file"],
            }
        )
