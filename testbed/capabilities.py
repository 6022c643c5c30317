"""What a device can do, as small typing.Protocols (in the manner of bluesky's protocols.py).

The runner and the procedures depend on these, never on a concrete driver class, so a lab can
plug in its own driver for the same kind of device.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Identity:
    """What `*IDN?` (or the device's equivalent) says about itself."""

    vendor: str
    model: str
    serial: str
    firmware: str


@runtime_checkable
class Closable(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class CircuitSwitch(Protocol):
    """An optical circuit switch: ingress ports 1..N, egress ports N+1..N+M.

    A circuit is an (ingress, egress) pair. `connect` and `disconnect` return once the switch has
    accepted the command; `wait_settled` returns once the mirrors have stopped moving (light can flow).
    With check=False they do not read the device's error queue; call `check_errors` later (a timed
    change sends its commands back to back, waits for the switch, then checks once).
    """

    def identify(self) -> Identity: ...

    def size(self) -> tuple[int, int]: ...

    def connect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None: ...

    def disconnect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None: ...

    def check_errors(self, after: str = ...) -> None: ...

    def disconnect_all(self) -> None: ...

    def wait_settled(self) -> None: ...

    def connections(self) -> dict[int, int]: ...

    def port_power(self, ports: Iterable[int]) -> dict[int, float]: ...

    def set_port_enabled(self, ports: Iterable[int], enabled: bool) -> None: ...

    def port_states(self, ports: Iterable[int]) -> Mapping[int, str]: ...
