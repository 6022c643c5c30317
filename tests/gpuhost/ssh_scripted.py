"""A real SSH server (paramiko) with scripted answers, for the GPU-host driver's hostile-input tests.

`answer(command)` decides what each exec request gets:
    (stdout, stderr, status)  sent, then the exit status, then the channel is closed
    Hold()                    the exec request is never answered (a host that stalls once the channel is
                              open); every Hold is released by stop()
    Drop(stdout)              part of the output is sent, then the TCP connection is closed without an
                              exit status (the host died mid-command)
The host key is a fresh Ed25519 key listed in a known_hosts file under the server's port, so the driver
connects with host key checking on, as it does in the lab. Any client key is accepted.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paramiko

from drivers.transports.ssh import SshSettings
from emulators.gpuhost.keys import new_ed25519, write_private


@dataclass
class Hold:
    pass


@dataclass
class Drop:
    stdout: str = ""
    stderr: str = ""


Answer = tuple[str, str, int] | Hold | Drop


def _key(channel: paramiko.Channel) -> tuple[int, int]:
    """Channel ids restart at 0 on every connection."""
    return id(channel.get_transport()), channel.get_id()


class _Interface(paramiko.ServerInterface):
    def __init__(self, server: ScriptedSsh) -> None:
        self.server = server

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        text = command.decode("utf-8", errors="replace")
        self.server.commands.append(text)
        answer = self.server.answer(text)
        if isinstance(answer, Hold):
            # Runs on the connection's transport thread: nothing is answered on it until released.
            self.server.released.wait(30)
            return False
        # Answered by the channel's own thread, already waiting (as in emulators/gpuhost/server.py): a thread
        # started here would run first and could close the channel before paramiko accepts the request.
        with self.server.answers_ready:
            self.server.answers[_key(channel)] = answer
            self.server.answers_ready.notify_all()
        return True


class ScriptedSsh:
    def __init__(self, answer: Callable[[str], Answer], tmp: Path) -> None:
        self.answer = answer
        self.commands: list[str] = []
        self.released = threading.Event()
        self.answers: dict[tuple[int, int], Answer] = {}  # _key(channel) -> its answer, until its thread takes it
        self.answers_ready = threading.Condition()
        self._host_key, _, _ = new_ed25519()
        self._transports: list[paramiko.Transport] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.key_file = tmp / "id_ed25519"
        write_private(self.key_file, new_ed25519()[1])
        self.known_hosts = tmp / "known_hosts"
        self.known_hosts.write_text(
            f"[127.0.0.1]:{self.port} {self._host_key.get_name()} {self._host_key.get_base64()}\n"
        )
        threading.Thread(target=self._accept, daemon=True).start()

    def settings(self, timeout_s: float) -> SshSettings:
        return SshSettings("127.0.0.1", "lab", self.port, str(self.key_file), str(self.known_hosts), timeout_s)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed by stop()
            transport = paramiko.Transport(conn)
            transport.add_server_key(self._host_key)
            self._transports.append(transport)
            try:
                transport.start_server(server=_Interface(self))
            except (paramiko.SSHException, EOFError, OSError):
                continue
            threading.Thread(target=self._channels, args=(transport,), daemon=True).start()

    def _channels(self, transport: paramiko.Transport) -> None:
        while transport.is_active():
            channel = transport.accept(timeout=0.5)
            if channel is not None:
                threading.Thread(target=self._reply, args=(channel,), daemon=True).start()

    def _reply(self, channel: paramiko.Channel) -> None:
        with self.answers_ready:
            if not self.answers_ready.wait_for(lambda: _key(channel) in self.answers, 30):
                return
            answer = self.answers.pop(_key(channel))
        try:
            if isinstance(answer, Drop):
                channel.sendall(answer.stdout.encode())
                channel.sendall_stderr(answer.stderr.encode())
                channel.get_transport().close()  # no exit status: the connection just ends
                return
            out, err, status = answer
            channel.sendall(out.encode())
            channel.sendall_stderr(err.encode())
            channel.send_exit_status(status)
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the client went away

    def stop(self) -> None:
        self.released.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        except OSError:
            pass
        self._listener.close()
        for transport in self._transports:
            transport.close()
