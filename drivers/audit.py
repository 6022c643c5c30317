"""Every byte exchanged with a device, timestamped where the I/O happens."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


class _AllPorts:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ALL_PORTS"

    def __reduce__(self) -> str:  # copy/pickle give back the one sentinel, so `is ALL_PORTS` holds
        return "ALL_PORTS"


# What an audit model (DriverSpec.audit_model) says a write touches when it drops every circuit, whoever's it is
# (Polatis's DISC:ALL and *RST): `testbed check` then requires every port of the switch to be the run's.
ALL_PORTS = _AllPorts()


@dataclass(frozen=True)
class AuditRecord:
    device: str
    address: str
    direction: str  # "tx" (to the device), "rx" (from the device) or "note" (what the transport did, e.g. a drain)
    data: str  # decoded text; bytes that are not UTF-8 are backslash-escaped
    mono_ns: int  # time.monotonic_ns() taken right next to the I/O call
    wall: float  # time.time() at the same moment

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "address": self.address,
            "direction": self.direction,
            "data": self.data,
            "mono_ns": self.mono_ns,
            "wall": self.wall,
        }


AuditSink = Callable[[AuditRecord], None]


def record(sink: AuditSink | None, device: str, address: str, direction: str, data: bytes | str) -> int:
    """Timestamp one exchange, hand it to the sink and return its monotonic time."""
    now = time.monotonic_ns()
    if sink is not None:
        text = data if isinstance(data, str) else data.decode("utf-8", errors="backslashreplace")
        sink(AuditRecord(device, address, direction, text, now, time.time()))
    return now
