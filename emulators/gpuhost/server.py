"""An SSH server (paramiko, thread-based) in front of one emulated host's shell.

Public-key authentication only (one user, one client key). Exec channels only: the command is recorded
in check_channel_exec_request and runs on the channel's own thread once the exec reply is on the wire
(emulators/sshserver.py, docs/protocols.md §4.1). A pty may be requested for an exec channel (OpenSSH's
`ssh -tt`, which Ansible uses for its `raw` module); the command then writes to a terminal, as under sshd:
stderr is merged into stdout and each "\n" goes out as "\r\n" (the tty's onlcr). Output is sent on the channel as the
command produces it (a `tail -F` streams), and a command learns that its client went away through the
stream's `closed()`.
`listen()` / `stop_listening()` let power_off refuse connections on the same port that power_on opens
again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import paramiko

from emulators.gpuhost.shell import Stream
from emulators.sshserver import SshInterface, SshListener

log = logging.getLogger(__name__)

Runner = Callable[[str, Stream], tuple[str, str, int]]
EXEC_WAIT_S = 30.0  # a client that opens a session but never sends exec is dropped after this


class _ExecInterface(SshInterface):
    """Exec requests, with or without a pty; public-key login only."""

    def __init__(self, user: str, client_key: paramiko.PKey) -> None:
        super().__init__(user, client_key)
        self.ptys: set[int] = set()  # channels that asked for a terminal
        self._pty_lock = threading.Lock()

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        return self.record(channel, command.decode("utf-8", errors="replace"))

    def check_channel_pty_request(self, channel: paramiko.Channel, *args) -> bool:
        with self._pty_lock:
            self.ptys.add(channel.get_id())
        return True

    def wait_command(self, chanid: int, timeout: float) -> tuple[str | None, bool]:
        """The channel's command (None if it never came) and whether the channel has a pty."""
        command = self.wait_answered(chanid, timeout)
        with self._pty_lock:
            tty = chanid in self.ptys
            self.ptys.discard(chanid)
        return command, tty


class SshServer(SshListener[_ExecInterface]):
    """The host's exec server: each channel runs its command through `run` and sends what it writes."""

    threads = "ssh"
    channel_threads = "chan"

    def __init__(self, name: str, host_key: paramiko.PKey, user: str, client_key: paramiko.PKey, run: Runner):
        super().__init__(name, host_key)
        self.user = user
        self.client_key = client_key
        self.run = run

    def interface(self) -> _ExecInterface:
        return _ExecInterface(self.user, self.client_key)

    def serve_channel(self, iface: _ExecInterface, channel: paramiko.Channel) -> None:
        try:
            command, tty = iface.wait_command(channel.get_id(), EXEC_WAIT_S)
            if command is None:
                return
            transport = channel.get_transport()

            def out(text: str) -> None:
                channel.sendall((text.replace("\n", "\r\n") if tty else text).encode())

            def err(text: str) -> None:
                if tty:  # one terminal for both streams
                    out(text)
                else:
                    channel.sendall_stderr(text.encode())

            stream = Stream(
                out=out, err=err, closed=lambda: channel.closed or transport is None or not transport.is_active()
            )
            try:
                stdout, stderr, rc = self.run(command, stream)
            except (OSError, EOFError, paramiko.SSHException):
                raise  # the client went away while the command wrote
            except Exception:  # a bug in the emulator must not look like a hung host
                log.exception("emulated host %s failed on %r", self.name, command)
                stdout, stderr, rc = "", f"emulated host {self.name}: internal error running {command!r}\n", 255
            if stdout:
                out(stdout)
            if stderr:
                err(stderr)
            channel.send_exit_status(rc)
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the client went away
