"""How the inventory says a device is reached: one model per transport type, registered by its `type`.

Each model knows four things, so nothing else needs an if-chain over transport types:
- `address()`: the address as a user reads it (errors, the plan);
- `endpoint()`: where the device is, without who logs in to it (an `Endpoint`): what leases and locks key a
  device by, once testbed.leases.identity has made its host canonical;
- `settings()`: the drivers' settings object its driver is built with (drivers/transports);
- `at_twin(endpoint)`: the same transport pointed at the twin's loopback endpoint for the device (--emulate).

Another package adds a transport type under the `testbed.transports` entry-point group (a TransportConfig
subclass with `type: Literal["..."]`); the registry is testbed.config.device.TRANSPORTS.
"""

from __future__ import annotations

import os
from typing import Any, Literal, NamedTuple

from pydantic import Field, ValidationInfo, field_validator

from testbed.config.common import Strict


class Endpoint(NamedTuple):
    """Where a device is reached, whoever logs in: a scheme ("tcp", "ssh", "serial", "usb", ...), a host name or
    address (None for a local port), and what picks the device there (a port number, a path, a bus address).
    """

    scheme: str
    host: str | None
    where: str


class TransportConfig(Strict):
    type: str

    def address(self) -> str:
        raise NotImplementedError

    def endpoint(self) -> Endpoint:
        """Where the device is; a transport another package adds may keep this default, its address."""
        return Endpoint(self.type, None, self.address())

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
    visa_library: str = Field(
        "@py",
        description="the VISA library: '@py' (pyvisa-py), '@ivi' or 'PATH@ivi' (the vendor's VISA: NI-VISA, "
        "Keysight; GPIB, USB-TMC), or 'FILE.yaml@sim' (pyvisa-sim answering from that definition file, e.g. "
        "drivers/scpi/polatis-sim.yaml); docs/protocols.md section 6.1",
    )

    @field_validator("visa_library")
    @classmethod
    def _known_library(cls, value: str, info: ValidationInfo) -> str:
        """A library pyvisa can be given; for pyvisa-sim, a definition file that exists and defines this resource
        (else the run would fail at its first command, far from the line that is wrong).
        """
        from drivers.transports.visa_library import canonical_resource, parse_visa_library, sim_resources

        library = parse_visa_library(value)
        resource = info.data.get("resource")  # absent if it failed its own validation
        if library.backend == "sim" and resource is not None:
            defined = sim_resources(library.argument)
            if canonical_resource(resource) not in defined:
                raise ValueError(
                    f"resource {resource!r} is not defined in the pyvisa-sim file {library.argument} "
                    f"(it defines {', '.join(defined)}); set resource to one of them"
                )
        return str(library)

    def address(self) -> str:
        # The library shows where it is not the default: the plan says a vendor's VISA or a simulation is used,
        # and an emulated run refuses a transport still on one (testbed/twin/bridge.py assert_loopback).
        return self.resource if self.visa_library == "@py" else f"{self.resource} via {self.visa_library}"

    def endpoint(self) -> Endpoint:
        """The VISA resource as pyvisa parses it: `TCPIP::localhost::5025::SOCKET` and
        `TCPIP0::LOCALHOST.::5025::SOCKET` are one device, and the same as `socket://localhost:5025` on the serial
        transport.
        """
        from pyvisa import rname

        try:
            r = rname.parse_resource_name(self.resource)
        except rname.InvalidResourceName:
            return Endpoint("visa", None, self.resource.upper())
        if isinstance(r, rname.TCPIPSocket):
            return Endpoint("tcp", r.host_address, str(int(r.port)))
        if isinstance(r, rname.TCPIPInstr):
            return Endpoint("vxi11", r.host_address, r.lan_device_name.lower())
        if isinstance(r, rname.ASRLInstr):
            return Endpoint("serial", None, _serial_port(r.board))
        if isinstance(r, rname.USBInstr):
            ids = f"{int(r.manufacturer_id, 0):04x}:{int(r.model_code, 0):04x}:{r.serial_number}"
            return Endpoint("usb", None, f"{ids}:{int(r.usb_interface_number or 0)}")
        if isinstance(r, rname.GPIBInstr):
            return Endpoint("gpib", None, f"{int(r.board or 0)}:{r.primary_address}:{r.secondary_address or ''}")
        return Endpoint("visa", None, str(r).upper())

    def settings(self):
        from drivers.transports import TransportSettings

        return TransportSettings(
            "visa",
            self.resource,
            self.timeout_ms / 1000,
            write_termination=self.write_termination,
            read_termination=self.read_termination,
            visa_library=self.visa_library,
        )

    def at_twin(self, endpoint: dict) -> VisaTransport:
        # Keep the wiring the lab uses: a LAN instrument stays on TCP, a serial one on the pty. A chip's SCPI
        # source is on TCP only; its pty ("qontrol") speaks the Qontrol protocol.
        on_tcp = (
            self.resource.upper().startswith("TCPIP")
            or endpoint.get("kind") == "photonic_mesh"
            or "serial" not in endpoint
        )
        # pyvisa-py, whatever the lab uses: the twin's endpoints are TCP sockets and ptys, and neither a vendor's VISA
        # (its aliases, its own configuration) nor a pyvisa-sim file may stand between an emulated run and the twin.
        resource = endpoint["visa"] if on_tcp else f"ASRL{endpoint['serial']}::INSTR"
        return self.model_copy(update={"resource": resource, "visa_library": "@py"})


class SerialTransport(TransportConfig):
    type: Literal["serial"]
    port: str = Field(description="device path ('/dev/ttyUSB0') or pyserial URL ('socket://10.0.0.5:5025')")
    baudrate: int = Field(38400, gt=0)
    timeout_ms: int = Field(2000, gt=0, le=600_000)
    read_termination: str = Field("\n", min_length=1, description="end of every reply (a trailing \\r is dropped)")
    write_termination: str = "\n"

    def address(self) -> str:
        return self.port

    def endpoint(self) -> Endpoint:
        """A device path (its symlinks resolved: /dev/serial/by-id/... is the /dev/ttyUSBn it points at), or
        pyserial's `socket://host:port` URL, the same device as a VISA `TCPIP::host::port::SOCKET`.
        """
        scheme, sep, rest = self.port.partition("://")
        if sep and scheme.lower() in ("socket", "rfc2217"):
            host, _, port = rest.split("?")[0].rstrip("/").rpartition(":")
            if port.isdigit():
                return Endpoint("tcp" if scheme.lower() == "socket" else "rfc2217", host, str(int(port)))
        if sep:
            return Endpoint(scheme.lower(), None, rest)
        return Endpoint("serial", None, _serial_port(self.port))

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

    def endpoint(self) -> Endpoint:
        return Endpoint("ssh", self.host, str(self.port))

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


def _serial_port(port: str) -> str:
    """A local serial port by the device file it really is (a VISA `ASRL3` board number is kept as it is)."""
    return os.path.realpath(port) if port.startswith("/") else port.lower()
