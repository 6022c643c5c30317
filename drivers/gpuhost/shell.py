"""The SSH session a GPU host's parts share: commands run through it, and the errors that name the host."""

from __future__ import annotations

from drivers.errors import DeviceError
from drivers.gpuhost.reply import BadReply
from drivers.transports.ssh import ExecResult, SshTransport


class HostShell:
    """One host's transport, with the device name and address every error of its driver carries."""

    def __init__(self, transport: SshTransport, device: str) -> None:
        self.transport = transport
        self.device = device
        self.address = transport.address

    def exec(self, command: str, **kwargs) -> ExecResult:
        return self.transport.exec(command, **kwargs)

    def error(self, cls: type[DeviceError], message: str, **kw) -> DeviceError:
        return cls(message, device=self.device, address=self.address, **kw)

    def rejected(self, bad: BadReply, *, sent: str, received: str) -> DeviceError:
        """The DeviceError a reader's BadReply stands for, with what was sent and what came back.

        Raise it `from bad.__cause__`: chained to what the reader could not parse (its ValueError), if
        anything, not to the BadReply, which is only the message between the reader and the driver.
        """
        return self.error(bad.error, bad.message, sent=sent, received=received, hint=bad.hint)
