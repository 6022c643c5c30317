"""What every line-oriented transport is configured with and offers (the transports import this, never the
package, so the package can choose among them without a cycle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True)
class TransportSettings:
    """How to reach a message-based (line-oriented) instrument."""

    type: Literal["visa", "serial"]
    # VISA: a resource string such as "TCPIP0::10.0.0.5::5025::SOCKET" or "ASRL/dev/ttyUSB0::INSTR".
    # serial: a device path ("/dev/ttyUSB0") or a pyserial URL ("socket://10.0.0.5:5025").
    address: str
    timeout_s: float = 2.0
    baudrate: int = 38400
    write_termination: str = "\n"
    read_termination: str = "\n"  # a trailing "\r" is stripped from every reply as well
    # VISA only: the library pyvisa opens the resource with, "@py", "@ivi", "PATH@ivi" or "FILE.yaml@sim"
    # (drivers/transports/visa_library.py)
    visa_library: str = "@py"

    def __post_init__(self) -> None:
        if not self.read_termination:
            # Without one a reply has no end: every query would wait for the whole timeout.
            raise ValueError(f"{self.address}: read_termination must not be empty (e.g. '\\n')")


class MessageTransport(Protocol):
    """A line-oriented conversation with one instrument. Raises drivers.errors.DeviceError subclasses only."""

    address: str

    def write(self, message: str) -> None: ...

    def query(self, message: str) -> str: ...

    def close(self) -> None: ...
