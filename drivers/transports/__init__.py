"""Transports own framing, timeouts and reconnection; drivers only speak the device's grammar."""

from __future__ import annotations

from drivers.audit import AuditSink
from drivers.transports.base import MessageTransport, TransportSettings

__all__ = ["MessageTransport", "TransportSettings", "open_transport"]


def open_transport(settings: TransportSettings, device: str, audit: AuditSink | None = None) -> MessageTransport:
    """The transport for `settings.type`. Nothing is opened yet: transports connect on first use.

    The transport modules are imported here, not at the top, so that a lab with only serial devices
    never needs pyvisa importable, and vice versa.
    """
    if settings.type == "visa":
        from drivers.transports.visa import VisaTransport

        return VisaTransport(settings, device, audit)
    if settings.type == "serial":
        from drivers.transports.serial import SerialTransport

        return SerialTransport(settings, device, audit)
    raise ValueError(
        f"{device}: unknown transport type {settings.type!r}; use 'visa' (a VISA resource string such "
        "as 'TCPIP0::host::5025::SOCKET') or 'serial' (a device path or a pyserial URL)"
    )
