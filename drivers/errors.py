"""Typed device errors.

Every error names the device, its address, what was sent, what came back and what to change, in
the manner of Netmiko's messages: the user should know what to try next without a traceback.
"""

from __future__ import annotations

from collections.abc import Callable


class DeviceError(Exception):
    """A device did not do what was asked. Base class of all driver errors."""

    def __init__(
        self,
        message: str,
        *,
        device: str = "?",
        address: str = "?",
        sent: str | None = None,
        received: str | bytes | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.device = device
        self.address = address
        self.sent = sent
        self.received = received
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [f"{self.device} ({self.address}): {self.message}"]
        if self.sent is not None:
            parts.append(f"  sent:     {_clip(repr(self.sent))}")
        if self.received is not None:
            parts.append(f"  received: {_clip(repr(self.received))}")
        if self.hint:
            parts.append(f"  try:      {self.hint}")
        return "\n".join(parts)

    def __reduce__(self):
        # Errors cross process boundaries (Ray actors); keep every field through pickling.
        return (
            _rebuild,
            (type(self), self.message, self.device, self.address, self.sent, self.received, self.hint),
        )


SHOWN = 600  # characters of what was sent / received shown in a message; the attributes keep it all


def _clip(text: str) -> str:
    """A garbled reply can be kilobytes long: show its start and its end, and how much was left out."""
    if len(text) <= SHOWN:
        return text
    half = SHOWN // 2
    return f"{text[:half]} ... ({len(text) - 2 * half} characters) ... {text[-half:]}"


def _rebuild(cls, message, device, address, sent, received, hint):
    return cls(message, device=device, address=address, sent=sent, received=received, hint=hint)


class DeviceConnectionError(DeviceError):
    """The device could not be reached, or the connection dropped."""


class DeviceTimeout(DeviceError):
    """No (complete) reply within the timeout. The outcome of a write may be unknown."""


class DeviceProtocolError(DeviceError):
    """The device answered, but not in the grammar the driver expects."""


class DeviceCommandError(DeviceError):
    """The device understood the transport but refused the command (e.g. its SCPI error queue)."""


class InterlockError(DeviceError):
    """The operation would touch a port or device the inventory does not allow."""


def switch_ports_hint(size: tuple[int, int] | None, ask: Callable[[], tuple[int, int]]) -> str | None:
    """What to change when a circuit switch refused a port: the ports it has. `size` is (ingress, egress) if
    the driver knows it already, else `ask()` asks the switch once; None when the switch cannot say.
    """
    if size is None:
        try:
            size = ask()
        except DeviceError:
            return None
    n, m = size
    return (
        f"ports must be ingress 1..{n} and egress {n + 1}..{n + m} on this {n}x{m} switch "
        "(and allowed in the inventory)"
    )
