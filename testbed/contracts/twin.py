"""The emulated twin's control as the engine and the fault kinds reach it (testbed.twin.bridge.TwinHandle is one)."""

from __future__ import annotations

from typing import Any, Protocol


class Twin(Protocol):
    """The twin's control: an operation on one emulated device (or the twin itself), now or at a set moment."""

    def call(self, device: str | None, op: str, **args: Any) -> Any:
        """Run `op` on `device` (None: the twin itself) and return its answer."""

    def fire_at(self, at_ns: int, device: str, op: str, **args: Any) -> bool:
        """Run op at CLOCK_MONOTONIC at_ns; False if the request arrived after that moment (nothing ran)."""
