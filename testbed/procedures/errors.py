"""Errors of the experiment's own checks on a device (the device answered, but the lab is not as asked)."""

from drivers.errors import DeviceError


class VerificationError(DeviceError):
    """The device accepted the change but a check after it failed (read-back or light)."""
